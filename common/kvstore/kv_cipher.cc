#include "common/kvstore/kv_cipher.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/kvstore/internal/little_endian.h"
#include "common/kvstore/seal.h"

namespace vc::kvstore {
namespace {

constexpr char kMagic[4] = {'V', 'C', 'K', 'E'};
constexpr char kHkdfSalt[] = "vericache kv at rest v1";
constexpr char kAadDomain[] = "vericache-kv-at-rest-v1";
constexpr size_t kHeaderBytes = 4 + 4 + 12;  // magic, version, nonce
constexpr size_t kTagBytes = 16;
constexpr size_t kChecksumBytes = 32;

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

using internal::GetU32;
using internal::PutU32;

std::array<uint8_t, 32> Sha256(const char* data, size_t size) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_Digest(data, size, out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

// The GCM additional data: a domain string and the store key, length-prefixed.
std::string Aad(absl::string_view store_key) {
  std::string aad(kAadDomain);
  PutU32(aad, static_cast<uint32_t>(store_key.size()));
  aad.append(store_key.data(), store_key.size());
  return aad;
}

// Runs one GCM pass (encrypt or decrypt) of `in` into `out` (same size);
// false on any OpenSSL failure (for decryption: the tag did not verify).
bool Gcm(bool encrypt, const TenantKey& key, const unsigned char* nonce, absl::string_view aad,
         const unsigned char* in, size_t size, unsigned char* out, unsigned char* tag) {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr || size > static_cast<size_t>(INT_MAX)) return false;
  int len = 0;
  auto init = encrypt ? EVP_EncryptInit_ex : EVP_DecryptInit_ex;
  auto update = encrypt ? EVP_EncryptUpdate : EVP_DecryptUpdate;
  if (init(ctx.get(), EVP_aes_256_gcm(), nullptr, key.bytes.data(), nonce) != 1 ||
      update(ctx.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
             static_cast<int>(aad.size())) != 1 ||
      update(ctx.get(), out, &len, in, static_cast<int>(size)) != 1) {
    return false;
  }
  if (encrypt) {
    return EVP_EncryptFinal_ex(ctx.get(), out + len, &len) == 1 &&
           EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1;
  }
  return EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1 &&
         EVP_DecryptFinal_ex(ctx.get(), out + len, &len) == 1;
}

}  // namespace

absl::StatusOr<KvKeyring> KvKeyring::FromSecret(std::string secret) {
  if (secret.size() < kKvSecretMinBytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV encryption secret: ", secret.size(),
                                                   " bytes, at least ", kKvSecretMinBytes,
                                                   " are required"));
  }
  return KvKeyring(std::move(secret));
}

absl::StatusOr<KvKeyring> KvKeyring::FromFile(const std::string& path) {
  // A secret is a few dozen bytes; a bound keeps a wrong path (a device, a
  // huge file) from being read whole.
  constexpr size_t kMaxSecretFileBytes = 4096;
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == EACCES) return absl::PermissionDeniedError(absl::StrCat("cannot read ", path));
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  std::string secret(kMaxSecretFileBytes + 1, '\0');
  in.read(secret.data(), static_cast<std::streamsize>(secret.size()));
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  secret.resize(static_cast<size_t>(in.gcount()));
  if (secret.size() > kMaxSecretFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": more than ", kMaxSecretFileBytes, " bytes, not a KV secret"));
  }
  absl::StatusOr<KvKeyring> ring = FromSecret(std::move(secret));
  if (!ring.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", ring.status().message()));
  }
  return ring;
}

absl::StatusOr<TenantKey> KvKeyring::KeyFor(absl::string_view tenant_salt) const {
  if (tenant_salt.empty()) {
    return absl::InvalidArgumentError("KV encryption needs a tenant salt (authentication on)");
  }
  std::unique_ptr<EVP_KDF, decltype(&EVP_KDF_free)> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr),
                                                        &EVP_KDF_free);
  if (kdf == nullptr) return absl::InternalError("HKDF unavailable in OpenSSL");
  std::unique_ptr<EVP_KDF_CTX, decltype(&EVP_KDF_CTX_free)> ctx(EVP_KDF_CTX_new(kdf.get()),
                                                                &EVP_KDF_CTX_free);
  if (ctx == nullptr) return absl::InternalError("EVP_KDF_CTX_new failed");
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, const_cast<char*>("SHA256"), 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(secret_.data()),
                                        secret_.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(kHkdfSalt),
                                        sizeof(kHkdfSalt) - 1),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(tenant_salt.data()),
                                        tenant_salt.size()),
      OSSL_PARAM_construct_end()};
  TenantKey key;
  if (EVP_KDF_derive(ctx.get(), key.bytes.data(), key.bytes.size(), params) != 1) {
    return absl::InternalError("HKDF-SHA256 derivation failed");
  }
  return key;
}

bool LooksEncrypted(absl::string_view entry) {
  return entry.size() >= 4 && std::memcmp(entry.data(), kMagic, 4) == 0;
}

absl::StatusOr<std::string> EncryptEntry(const TenantKey& key, absl::string_view store_key,
                                         absl::string_view plain) {
  if (store_key.empty()) return absl::InvalidArgumentError("EncryptEntry: empty store key");
  std::string out;
  out.reserve(plain.size() + kEncryptionOverheadBytes + kSealTrailerMaxBytes);
  out.append(kMagic, 4);
  PutU32(out, kEncryptedEntryVersion);
  unsigned char nonce[12];
  if (RAND_bytes(nonce, sizeof(nonce)) != 1) return absl::InternalError("RAND_bytes failed");
  out.append(reinterpret_cast<const char*>(nonce), sizeof(nonce));
  out.resize(kHeaderBytes + plain.size() + kTagBytes);
  auto* body = reinterpret_cast<unsigned char*>(out.data() + kHeaderBytes);
  if (!Gcm(true, key, nonce, Aad(store_key), reinterpret_cast<const unsigned char*>(plain.data()),
           plain.size(), body, body + plain.size())) {
    return absl::InternalError("AES-256-GCM encryption failed");
  }
  const auto sum = Sha256(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  return out;
}

absl::StatusOr<std::string> DecryptEntry(const TenantKey& key, absl::string_view store_key,
                                         absl::string_view entry, ChecksumCheck check) {
  if (!LooksEncrypted(entry)) {
    return absl::InvalidArgumentError("KV entry is not encrypted (no VCKE magic)");
  }
  if (entry.size() < kEncryptionOverheadBytes) {
    return absl::DataLossError("encrypted KV entry truncated");
  }
  const size_t body_end = entry.size() - kChecksumBytes;
  if (check == ChecksumCheck::kRecompute) {
    const auto sum = Sha256(entry.data(), body_end);
    if (CRYPTO_memcmp(sum.data(), entry.data() + body_end, kChecksumBytes) != 0) {
      return absl::DataLossError("encrypted KV entry: checksum mismatch (corrupt data)");
    }
  }
  const uint32_t version = GetU32(entry.data() + 4);
  if (version != kEncryptedEntryVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("encrypted KV entry: unsupported version ", version));
  }
  const auto* nonce = reinterpret_cast<const unsigned char*>(entry.data() + 8);
  const size_t size = body_end - kHeaderBytes - kTagBytes;
  std::string plain(size, '\0');
  // OpenSSL takes a non-const tag for decryption; copy it out of the entry.
  unsigned char tag[kTagBytes];
  std::memcpy(tag, entry.data() + kHeaderBytes + size, kTagBytes);
  if (!Gcm(false, key, nonce, Aad(store_key),
           reinterpret_cast<const unsigned char*>(entry.data() + kHeaderBytes), size,
           reinterpret_cast<unsigned char*>(plain.data()), tag)) {
    return absl::UnauthenticatedError(
        "encrypted KV entry does not decrypt: another tenant's key, another store key, or "
        "altered");
  }
  return plain;
}

}  // namespace vc::kvstore
