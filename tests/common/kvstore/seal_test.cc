// Seals on stored KV entries: a sealed entry opens only under its own store
// key, model id and numerics version, with a trusted key; any changed byte,
// a missing seal, an untrusted signer, a transplant to another key, a seal
// over a checksum that does not match the bytes, and a version-1 seal are
// refused with Unauthenticated. Keys rotate (several trusted at once). Seals
// already verified are remembered (bounded): remembering never lets a
// changed byte through, and a forgotten seal verifies again.
#include "common/kvstore/seal.h"

#include <string>

#include "common/kvstore/internal/sha256.h"
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

// `body` followed by its SHA-256, as the chunk and variant codecs end.
std::string WithChecksum(const std::string& body) {
  internal::Sha256 h;
  h.UpdateRaw(body.data(), body.size());
  const auto d = h.Finish();
  return body + std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

std::string Sealed(const SealSigner& signer, const std::string& key, const SealContext& ctx,
                   std::string entry) {
  const absl::Status s = signer.Seal(key, ctx, &entry);
  EXPECT_TRUE(s.ok()) << s;
  return entry;
}

const std::string kKey(32, 'k');
const std::string kPayload = WithChecksum(std::string(4096, 'p') + "end");

TEST(SealTest, SealedEntryOpensUnderItsKeyAndContext) {
  auto signer = NewSigner();
  std::string entry = kPayload;
  entry.reserve(entry.size() + kSealTrailerMaxBytes);
  const char* data = entry.data();
  ASSERT_TRUE(signer->Seal(kKey, Ctx(7), &entry).ok());
  EXPECT_EQ(entry.data(), data) << "sealing into reserved room must not reallocate (copy)";
  const std::string* sealed = &entry;
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
  const std::string sealed = Sealed(*signer, kKey, Ctx(7), WithChecksum("short payload"));
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
  const std::string sealed = Sealed(*signer, kKey, Ctx(7), kPayload);
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

// More seals than the trust remembers (8,192): the oldest are forgotten and
// verified again when they come back, and a changed signature is refused
// whatever is remembered.
TEST(SealTest, ForgottenSealsVerifyAgainAndForgedOnesNever) {
  auto signer = NewSigner();
  const SealTrust trust = TrustOf(*signer);
  const std::string payload = WithChecksum("small");
  auto key_of = [](int i) { return std::string(24, 'k') + std::to_string(100000 + i); };
  constexpr int kSeals = 8192 + 100;
  std::string first, last;
  for (int i = 0; i < kSeals; ++i) {
    const std::string sealed = Sealed(*signer, key_of(i), Ctx(7), payload);
    ASSERT_TRUE(trust.OpenFor(key_of(i), Ctx(7), sealed).ok()) << i;
    if (i == 0) first = sealed;
    if (i == kSeals - 1) last = sealed;
  }
  EXPECT_TRUE(trust.OpenFor(key_of(0), Ctx(7), first).ok());
  EXPECT_TRUE(trust.OpenFor(key_of(kSeals - 1), Ctx(7), last).ok());
  // The signature sits right before the trailer's last 4 bytes (its size).
  std::string forged = last;
  forged[forged.size() - 5] = static_cast<char>(forged[forged.size() - 5] ^ 0x40);
  EXPECT_EQ(trust.OpenFor(key_of(kSeals - 1), Ctx(7), forged).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(SealTest, TransplantToAnotherKeyIsRefused) {
  auto signer = NewSigner();
  const std::string sealed = Sealed(*signer, kKey, Ctx(7), kPayload);
  const SealTrust trust = TrustOf(*signer);
  auto moved = trust.Open(std::string(32, 'x'), sealed);
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(moved.status().message()).find("another key"), std::string::npos);
}

TEST(SealTest, AnotherModelOrNumericsVersionIsRefused) {
  auto signer = NewSigner();
  const std::string sealed = Sealed(*signer, kKey, Ctx(7, 1), kPayload);
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
  auto by_other = trust.Open(kKey, Sealed(*other, kKey, Ctx(7), kPayload));
  EXPECT_EQ(by_other.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(by_other.status().message()).find("untrusted"), std::string::npos);
  // A writer that sets the key id of a trusted key but signs with its own.
  std::string forged = Sealed(*other, kKey, Ctx(7), kPayload);
  const size_t id_at = forged.size() - 4 - kSealSignatureBytes - other->key_id().size();
  forged.replace(id_at, signer->key_id().size(), signer->key_id());
  EXPECT_EQ(trust.Open(kKey, forged).status().code(), absl::StatusCode::kUnauthenticated);
}

// The signer signs the checksum the entry carries, without rehashing; every
// opener recomputes it. So bytes changed before sealing (or a checksum that
// never matched) are refused even under a valid signature by a trusted key.
TEST(SealTest, ASealOverAChecksumThatDoesNotMatchIsRefused) {
  auto signer = NewSigner();
  const SealTrust trust = TrustOf(*signer);
  std::string stale = kPayload;
  stale[100] = static_cast<char>(stale[100] ^ 0x40);  // the checksum is now stale
  auto opened = trust.Open(kKey, Sealed(*signer, kKey, Ctx(7), stale));
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(opened.status().message()).find("checksum does not match"),
            std::string::npos)
      << opened.status();
  // Shorter than a checksum: nothing to sign, nothing to open.
  std::string tiny = "short";
  EXPECT_EQ(signer->Seal(kKey, Ctx(7), &tiny).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(signer->Seal("", Ctx(7), &tiny).code(), absl::StatusCode::kInvalidArgument);
}

// Version 1 signed another statement (a second SHA-256 of the payload); an
// entry carrying it is refused with an error that says so, never misread.
TEST(SealTest, AVersionOneSealIsRefusedByName) {
  auto signer = NewSigner();
  std::string sealed = Sealed(*signer, kKey, Ctx(7), kPayload);
  const SealTrust trust = TrustOf(*signer);
  const size_t trailer = sealed.size() - kPayload.size();
  sealed[sealed.size() - trailer + 4] = 1;  // u32 version, little-endian
  auto opened = trust.Open(kKey, sealed);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(opened.status().message()).find("version 1"), std::string::npos)
      << opened.status();
  EXPECT_NE(std::string(opened.status().message()).find("ingested again"), std::string::npos);
}

// The store's rule: KV (chunk, variant, encrypted entry) must be sealed for
// its key; other entries (manifests) pass unsealed.
TEST(SealTest, TheStoreRequiresSealsOnKvEntriesOnly) {
  auto signer = NewSigner();
  const SealTrust trust = TrustOf(*signer);
  for (const char* magic : {"VCKC", "VCKV", "VCKE"}) {
    const std::string entry = WithChecksum(std::string(magic) + std::string(100, 'b'));
    EXPECT_EQ(CheckStoredEntry(trust, kKey, entry).code(), absl::StatusCode::kUnauthenticated)
        << magic;
    EXPECT_TRUE(CheckStoredEntry(trust, kKey, Sealed(*signer, kKey, Ctx(1), entry)).ok()) << magic;
    EXPECT_EQ(
        CheckStoredEntry(trust, std::string(32, 'x'), Sealed(*signer, kKey, Ctx(1), entry)).code(),
        absl::StatusCode::kUnauthenticated)
        << magic;
  }
  EXPECT_TRUE(CheckStoredEntry(trust, kKey, "manifest: token ids").ok());
}

TEST(SealTest, RotationTrustsSeveralKeys) {
  auto old_key = NewSigner();
  auto new_key = NewSigner();
  auto trust = SealTrust::Parse("# rotation\n" + old_key->PublicKeyHex() + "\n\n" +
                                new_key->PublicKeyHex() + "  # new\n");
  ASSERT_TRUE(trust.ok()) << trust.status();
  EXPECT_EQ(trust->size(), 2u);
  EXPECT_TRUE(trust->Open(kKey, Sealed(*old_key, kKey, Ctx(1), kPayload)).ok());
  EXPECT_TRUE(trust->Open(kKey, Sealed(*new_key, kKey, Ctx(1), kPayload)).ok());
}

TEST(SealTest, PemRoundTripKeepsTheKeyId) {
  auto signer = NewSigner();
  auto pem = signer->PrivateKeyPem();
  ASSERT_TRUE(pem.ok()) << pem.status();
  EXPECT_NE(pem->find("BEGIN PRIVATE KEY"), std::string::npos);
  auto again = SealSigner::FromPem(*pem);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->key_id(), signer->key_id());
  EXPECT_TRUE(TrustOf(*signer).Open(kKey, Sealed(*(*again), kKey, Ctx(1), kPayload)).ok());
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
