// Encryption of KV at rest: an entry round-trips under its tenant's key and
// store key; another tenant's key, another store key, a changed byte or a
// too-short secret are refused with a clear error; keys are a deterministic
// function of (secret, tenant salt) and differ between tenants; an encrypted
// entry can be sealed and opened like any KV entry.
#include "common/kvstore/kv_cipher.h"

#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/kvstore/seal.h"
#include "gtest/gtest.h"
#include "tests/scratch_dir.h"

namespace vc::kvstore {
namespace {

std::string Secret() { return std::string(32, 's'); }
// A store key (32 bytes, as chunk keys are).
std::string StoreKey() { return std::string(32, 'k'); }

KvKeyring Keyring(const std::string& secret = Secret()) {
  auto k = KvKeyring::FromSecret(secret);
  EXPECT_TRUE(k.ok()) << k.status();
  return *k;
}

TenantKey KeyOf(const KvKeyring& ring, const std::string& salt) {
  auto k = ring.KeyFor(salt);
  EXPECT_TRUE(k.ok()) << k.status();
  return *k;
}

std::string Plain() {
  std::string p;
  for (int i = 0; i < 5000; ++i) p.push_back(static_cast<char>(i * 7));
  return p;
}

TEST(KvCipherTest, RoundTripsUnderItsTenantAndStoreKey) {
  const TenantKey a = KeyOf(Keyring(), "salt-of-tenant-a");
  for (const std::string& plain : {Plain(), std::string()}) {
    auto enc = EncryptEntry(a, StoreKey(), plain);
    ASSERT_TRUE(enc.ok()) << enc.status();
    EXPECT_TRUE(LooksEncrypted(*enc));
    EXPECT_EQ(enc->size(), plain.size() + kEncryptionOverheadBytes);
    if (!plain.empty()) {
      EXPECT_EQ(enc->find(plain.substr(0, 64)), std::string::npos);
    }
    auto dec = DecryptEntry(a, StoreKey(), *enc);
    ASSERT_TRUE(dec.ok()) << dec.status();
    EXPECT_EQ(*dec, plain);
  }
  // Fresh nonces: the same plaintext twice gives two ciphertexts.
  EXPECT_NE(*EncryptEntry(a, StoreKey(), Plain()), *EncryptEntry(a, StoreKey(), Plain()));
}

TEST(KvCipherTest, AnotherTenantsKeyIsRefused) {
  const KvKeyring ring = Keyring();
  const TenantKey a = KeyOf(ring, "salt-of-tenant-a");
  const TenantKey b = KeyOf(ring, "salt-of-tenant-b");
  EXPECT_NE(a.bytes, b.bytes);
  EXPECT_EQ(KeyOf(Keyring(), "salt-of-tenant-a").bytes, a.bytes) << "derivation is deterministic";
  EXPECT_NE(KeyOf(Keyring(std::string(32, 't')), "salt-of-tenant-a").bytes, a.bytes)
      << "another cluster secret, another key";
  const std::string enc = *EncryptEntry(a, StoreKey(), Plain());
  auto wrong = DecryptEntry(b, StoreKey(), enc);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(wrong.status().message()).find("another tenant's key"), std::string::npos);
}

TEST(KvCipherTest, AnotherStoreKeyOrAChangedByteIsRefused) {
  const TenantKey a = KeyOf(Keyring(), "salt-of-tenant-a");
  const std::string enc = *EncryptEntry(a, StoreKey(), Plain());
  EXPECT_EQ(DecryptEntry(a, std::string(32, 'x'), enc).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Any byte before the checksum, with the checksum recomputed by whoever
  // changed it: the GCM tag still refuses (a checksum proves nothing).
  for (size_t i = 8; i < enc.size() - 32; i += 97) {
    std::string bad = enc.substr(0, enc.size() - 32);
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    unsigned char sum[32];
    unsigned int len = 0;
    ASSERT_EQ(EVP_Digest(bad.data(), bad.size(), sum, &len, EVP_sha256(), nullptr), 1);
    bad.append(reinterpret_cast<const char*>(sum), sizeof(sum));
    EXPECT_EQ(DecryptEntry(a, StoreKey(), bad).status().code(), absl::StatusCode::kUnauthenticated)
        << "byte " << i;
  }
  // Without a recomputed checksum: DataLoss, before any decryption.
  std::string flipped = enc;
  flipped[40] = static_cast<char>(flipped[40] ^ 0x01);
  EXPECT_EQ(DecryptEntry(a, StoreKey(), flipped).status().code(), absl::StatusCode::kDataLoss);
  std::string truncated = enc.substr(0, 30);
  EXPECT_EQ(DecryptEntry(a, StoreKey(), truncated).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecryptEntry(a, StoreKey(), Plain()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvCipherTest, BadSecretsAndSaltsAreClearErrors) {
  auto short_secret = KvKeyring::FromSecret(std::string(31, 's'));
  EXPECT_EQ(short_secret.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(short_secret.status().message()).find("at least 32"), std::string::npos);
  EXPECT_EQ(Keyring().KeyFor("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncryptEntry(TenantKey{}, "", Plain()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvCipherTest, AnEncryptedEntryIsSealedLikeAnyOther) {
  const TenantKey a = KeyOf(Keyring(), "salt-of-tenant-a");
  std::string entry = *EncryptEntry(a, StoreKey(), Plain());
  const size_t size = entry.size();
  auto signer = SealSigner::Generate();
  ASSERT_TRUE(signer.ok());
  ASSERT_TRUE((*signer)->Seal(StoreKey(), SealContext{}, &entry).ok());
  SealTrust trust;
  ASSERT_TRUE(trust.Add((*signer)->PublicKeyHex()).ok());
  auto opened = trust.OpenFor(StoreKey(), SealContext{}, entry);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->size(), size);
  // The seal just recomputed the checksum: decryption need not hash again.
  auto dec = DecryptEntry(a, StoreKey(), *opened, ChecksumCheck::kAlreadyRecomputed);
  ASSERT_TRUE(dec.ok()) << dec.status();
  EXPECT_EQ(*dec, Plain());
}

TEST(KvCipherTest, SkippingTheChecksumStillAuthenticatesEveryByte) {
  const TenantKey a = KeyOf(Keyring(), "salt-of-tenant-a");
  const std::string enc = *EncryptEntry(a, StoreKey(), Plain());
  for (size_t i = 8; i < enc.size() - 32; i += 97) {
    std::string bad = enc;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    EXPECT_EQ(DecryptEntry(a, StoreKey(), bad, ChecksumCheck::kAlreadyRecomputed).status().code(),
              absl::StatusCode::kUnauthenticated)
        << "byte " << i;
  }
}

TEST(KvCipherTest, SecretFilesAreReadWithClearErrors) {
  const test_support::ScratchDir scratch("kv_cipher_test_");
  const std::string& dir = scratch.path();
  const std::string good = dir + "/kv_cipher_test_secret";
  const std::string short_file = dir + "/kv_cipher_test_short";
  {
    std::ofstream(good, std::ios::binary) << Secret();
    std::ofstream(short_file, std::ios::binary) << "short";
  }
  auto ring = KvKeyring::FromFile(good);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(KeyOf(*ring, "salt-of-tenant-a").bytes, KeyOf(Keyring(), "salt-of-tenant-a").bytes);
  auto missing = KvKeyring::FromFile(dir + "/no-such-secret");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.status().message()).find("no-such-secret"), std::string::npos);
  auto too_short = KvKeyring::FromFile(short_file);
  EXPECT_EQ(too_short.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_short.status().message()).find("at least 32"), std::string::npos);
  std::remove(good.c_str());
  std::remove(short_file.c_str());
}

}  // namespace
}  // namespace vc::kvstore
