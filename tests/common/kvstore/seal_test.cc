// Seals on stored KV entries: a sealed entry opens only under its own store
// key, model id and numerics version, with a trusted key; any changed byte,
// a missing seal, an untrusted signer or a transplant to another key is
// refused with Unauthenticated. Keys rotate (several trusted at once).
#include "common/kvstore/seal.h"

#include <string>

#include "gtest/gtest.h"

namespace vc::kvstore {
namespace {

SealContext Ctx(uint8_t model_byte, uint32_t numerics = 1) {
  SealContext c;
  c.model_id.bytes.fill(model_byte);
  c.numerics_version = numerics;
  return c;
}

std::unique_ptr<SealSigner> NewSigner() {
  auto s = SealSigner::Generate();
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

SealTrust TrustOf(const SealSigner& signer) {
  SealTrust trust;
  EXPECT_TRUE(trust.Add(signer.PublicKeyHex()).ok());
  return trust;
}

const std::string kKey(32, 'k');
const std::string kPayload = std::string(4096, 'p') + "end";

TEST(SealTest, SealedEntryOpensUnderItsKeyAndContext) {
  auto signer = NewSigner();
  auto sealed = signer->Seal(kKey, Ctx(7), kPayload);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_TRUE(LooksSealed(*sealed));
  const SealTrust trust = TrustOf(*signer);
  auto opened = trust.Open(kKey, *sealed);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->payload, kPayload);
  EXPECT_EQ(opened->context, Ctx(7));
  EXPECT_EQ(opened->key_id, signer->key_id());
  auto payload = trust.OpenFor(kKey, Ctx(7), *sealed);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(*payload, kPayload);
}

TEST(SealTest, EveryFlippedByteIsRefused) {
  auto signer = NewSigner();
  const std::string sealed = *signer->Seal(kKey, Ctx(7), "short payload");
  const SealTrust trust = TrustOf(*signer);
  // Opened once first: the trust remembers seals that verified, and that
  // must not let any changed byte through afterwards.
  ASSERT_TRUE(trust.OpenFor(kKey, Ctx(7), sealed).ok());
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string bad = sealed;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    auto opened = trust.OpenFor(kKey, Ctx(7), bad);
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kUnauthenticated) << "byte " << i;
  }
}

TEST(SealTest, RememberedSealsStillBindKeyAndContext) {
  auto signer = NewSigner();
  const std::string sealed = *signer->Seal(kKey, Ctx(7), kPayload);
  const SealTrust trust = TrustOf(*signer);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(trust.OpenFor(kKey, Ctx(7), sealed).ok());
  EXPECT_EQ(trust.Open(std::string(32, 'x'), sealed).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(trust.OpenFor(kKey, Ctx(8), sealed).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Another trust set without the signer's key refuses it, whatever this
  // one remembers.
  auto other = NewSigner();
  EXPECT_EQ(TrustOf(*other).Open(kKey, sealed).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(SealTest, TransplantToAnotherKeyIsRefused) {
  auto signer = NewSigner();
  const std::string sealed = *signer->Seal(kKey, Ctx(7), kPayload);
  const SealTrust trust = TrustOf(*signer);
  auto moved = trust.Open(std::string(32, 'x'), sealed);
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(moved.status().message()).find("another key"), std::string::npos);
}

TEST(SealTest, AnotherModelOrNumericsVersionIsRefused) {
  auto signer = NewSigner();
  const std::string sealed = *signer->Seal(kKey, Ctx(7, 1), kPayload);
  const SealTrust trust = TrustOf(*signer);
  EXPECT_EQ(trust.OpenFor(kKey, Ctx(8, 1), sealed).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(trust.OpenFor(kKey, Ctx(7, 2), sealed).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(SealTest, UnsealedAndUntrustedEntriesAreRefused) {
  auto signer = NewSigner();
  auto other = NewSigner();
  const SealTrust trust = TrustOf(*signer);
  EXPECT_EQ(trust.Open(kKey, kPayload).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(trust.Open(kKey, "").status().code(), absl::StatusCode::kUnauthenticated);
  auto by_other = trust.Open(kKey, *other->Seal(kKey, Ctx(7), kPayload));
  EXPECT_EQ(by_other.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(by_other.status().message()).find("untrusted"), std::string::npos);
  // A writer that sets the key id of a trusted key but signs with its own.
  std::string forged = *other->Seal(kKey, Ctx(7), kPayload);
  const size_t id_at = forged.size() - 4 - kSealSignatureBytes - other->key_id().size();
  forged.replace(id_at, signer->key_id().size(), signer->key_id());
  EXPECT_EQ(trust.Open(kKey, forged).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(SealTest, RotationTrustsSeveralKeys) {
  auto old_key = NewSigner();
  auto new_key = NewSigner();
  auto trust = SealTrust::Parse("# rotation\n" + old_key->PublicKeyHex() + "\n\n" +
                                new_key->PublicKeyHex() + "  # new\n");
  ASSERT_TRUE(trust.ok()) << trust.status();
  EXPECT_EQ(trust->size(), 2u);
  EXPECT_TRUE(trust->Open(kKey, *old_key->Seal(kKey, Ctx(1), kPayload)).ok());
  EXPECT_TRUE(trust->Open(kKey, *new_key->Seal(kKey, Ctx(1), kPayload)).ok());
}

TEST(SealTest, PemRoundTripKeepsTheKeyId) {
  auto signer = NewSigner();
  auto pem = signer->PrivateKeyPem();
  ASSERT_TRUE(pem.ok()) << pem.status();
  EXPECT_NE(pem->find("BEGIN PRIVATE KEY"), std::string::npos);
  auto again = SealSigner::FromPem(*pem);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->key_id(), signer->key_id());
  EXPECT_TRUE(TrustOf(*signer).Open(kKey, *(*again)->Seal(kKey, Ctx(1), kPayload)).ok());
}

TEST(SealTest, BadKeyMaterialIsAClearError) {
  EXPECT_EQ(SealSigner::FromPem("not a key").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SealSigner::FromPemFile("/nonexistent/seal.pem").status().code(),
            absl::StatusCode::kNotFound);
  auto bad = SealTrust::Parse("abcd\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("line 1"), std::string::npos);
  EXPECT_EQ(SealTrust::FromFile("/nonexistent/trust").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vc::kvstore
