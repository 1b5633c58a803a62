#include "common/kvstore/seal.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/kvstore/internal/little_endian.h"

namespace vc::kvstore {
namespace {

constexpr char kMagic[4] = {'V', 'C', 'S', 'L'};
constexpr char kDomain[] = "vericache-seal-v2";
// magic + version + numerics + model id + key id length + signature + trailer length
constexpr size_t kFixedTrailerBytes = 4 + 4 + 4 + 32 + 1 + kSealSignatureBytes + 4;
static_assert(kFixedTrailerBytes + kMaxSealKeyIdBytes == kSealTrailerMaxBytes);
constexpr size_t kRawPublicKeyBytes = 32;

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};

using internal::GetU32;
using internal::PutU32;

void Field(std::string& out, absl::string_view bytes) {
  PutU32(out, static_cast<uint32_t>(bytes.size()));
  out.append(bytes.data(), bytes.size());
}

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  // EVP: OpenSSL picks the SHA extensions where the CPU has them.
  EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

// What the signature covers: a statement of constant size but for the store
// key. `checksum` is the entry's SHA-256 (over all its bytes before it).
std::string SignedMessage(absl::string_view store_key, const SealContext& context,
                          absl::string_view key_id, absl::string_view checksum) {
  std::string m;
  m.reserve(160 + store_key.size());
  Field(m, kDomain);
  Field(m, store_key);
  Field(m, absl::string_view(reinterpret_cast<const char*>(context.model_id.bytes.data()), 32));
  PutU32(m, context.numerics_version);
  Field(m, key_id);
  Field(m, checksum);
  return m;
}

std::string KeyIdOf(const uint8_t* raw_public, size_t n) {
  const auto d = Sha256(absl::string_view(reinterpret_cast<const char*>(raw_public), n));
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d.data()), 8));
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::NotFoundError(msg);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

struct SealSigner::Key {
  Pkey pkey;
  std::array<uint8_t, kRawPublicKeyBytes> public_raw{};
};

SealSigner::SealSigner(std::unique_ptr<Key> key) : key_(std::move(key)) {
  key_id_ = KeyIdOf(key_->public_raw.data(), key_->public_raw.size());
}
SealSigner::~SealSigner() = default;

namespace {
absl::StatusOr<std::array<uint8_t, kRawPublicKeyBytes>> RawPublic(EVP_PKEY* pkey) {
  std::array<uint8_t, kRawPublicKeyBytes> raw{};
  size_t len = raw.size();
  if (EVP_PKEY_get_raw_public_key(pkey, raw.data(), &len) != 1 || len != raw.size()) {
    return absl::InternalError("cannot read the Ed25519 public key");
  }
  return raw;
}
}  // namespace

absl::StatusOr<std::unique_ptr<SealSigner>> SealSigner::FromPem(const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
  Pkey pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError("seal key: not a PEM private key");
  }
  if (EVP_PKEY_get_id(pkey.get()) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(
        "seal key: not an Ed25519 key (make one with `openssl genpkey -algorithm ed25519`)");
  }
  auto key = std::make_unique<Key>();
  auto raw = RawPublic(pkey.get());
  if (!raw.ok()) return raw.status();
  key->public_raw = *raw;
  key->pkey = std::move(pkey);
  return std::unique_ptr<SealSigner>(new SealSigner(std::move(key)));
}

absl::StatusOr<std::unique_ptr<SealSigner>> SealSigner::FromPemFile(const std::string& path) {
  auto text = ReadFile(path, "seal key");
  if (!text.ok()) return text.status();
  auto signer = FromPem(*text);
  if (!signer.ok()) {
    return absl::Status(signer.status().code(),
                        absl::StrCat(path, ": ", signer.status().message()));
  }
  return signer;
}

absl::StatusOr<std::unique_ptr<SealSigner>> SealSigner::Generate() {
  Pkey pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (pkey == nullptr) return absl::InternalError("Ed25519 key generation failed");
  auto key = std::make_unique<Key>();
  auto raw = RawPublic(pkey.get());
  if (!raw.ok()) return raw.status();
  key->public_raw = *raw;
  key->pkey = std::move(pkey);
  return std::unique_ptr<SealSigner>(new SealSigner(std::move(key)));
}

std::string SealSigner::PublicKeyHex() const {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(key_->public_raw.data()), key_->public_raw.size()));
}

absl::StatusOr<std::string> SealSigner::PrivateKeyPem() const {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key_->pkey.get(), nullptr, nullptr, 0, nullptr,
                               nullptr) != 1) {
    return absl::InternalError("cannot write the seal key as PEM");
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::Status SealSigner::Seal(absl::string_view store_key, const SealContext& context,
                              std::string* entry) const {
  if (store_key.empty()) return absl::InvalidArgumentError("Seal: empty store key");
  if (entry->size() < kSealedChecksumBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Seal: a ", entry->size(), "-byte entry cannot end in a checksum"));
  }
  // The encoder's checksum as it stands: the signer reads no payload byte.
  // Were it wrong, every opener (which recomputes it) refuses the entry.
  const absl::string_view checksum(entry->data() + entry->size() - kSealedChecksumBytes,
                                   kSealedChecksumBytes);
  const std::string message = SignedMessage(store_key, context, key_id_, checksum);
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  std::array<uint8_t, kSealSignatureBytes> sig{};
  size_t sig_len = sig.size();
  if (ctx == nullptr ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key_->pkey.get()) != 1 ||
      EVP_DigestSign(ctx.get(), sig.data(), &sig_len,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      sig_len != sig.size()) {
    return absl::InternalError("Ed25519 signing failed");
  }
  const size_t trailer = kFixedTrailerBytes + key_id_.size();
  // In place: the codecs reserve kSealTrailerMaxBytes, so no reallocation.
  entry->reserve(entry->size() + trailer);
  entry->append(kMagic, 4);
  PutU32(*entry, kSealVersion);
  PutU32(*entry, context.numerics_version);
  entry->append(reinterpret_cast<const char*>(context.model_id.bytes.data()), 32);
  entry->push_back(static_cast<char>(key_id_.size()));
  entry->append(key_id_);
  entry->append(reinterpret_cast<const char*>(sig.data()), sig.size());
  PutU32(*entry, static_cast<uint32_t>(trailer));
  return absl::OkStatus();
}

struct SealTrust::Keys {
  std::map<std::string, Pkey> by_id;
  // Pairs (signed message, signature) that verified, as SHA-256 digests:
  // at most kVerifiedCacheEntries, the oldest replaced first. A verifier
  // reloads the same prefix chunks round after round; Ed25519 verification
  // is a pure function of (public key, message, signature) and the message
  // holds the key id and the entry's checksum, so a pair seen valid once is
  // valid again (a forged pair would need a SHA-256 collision with a valid
  // one): the checksum is still recomputed from the bytes every time, only
  // the ~100 us signature check is skipped. Every byte of the cache is
  // allocated up front: a cache of whole pairs grew the workers' RSS for
  // the hour it took to fill (the soak's slope, docs/results.md).
  static constexpr size_t kVerifiedCacheEntries = 8192;
  using Digest = std::array<uint8_t, 32>;
  std::mutex mu;
  absl::flat_hash_set<Digest> verified;
  std::vector<Digest> ring;  // insertion order; ring[next] is replaced next
  size_t next = 0;

  Keys() {
    verified.reserve(kVerifiedCacheEntries);
    ring.reserve(kVerifiedCacheEntries);
  }
  bool Seen(const Digest& pair) {
    std::lock_guard<std::mutex> lock(mu);
    return verified.contains(pair);
  }
  void Remember(const Digest& pair) {
    std::lock_guard<std::mutex> lock(mu);
    if (!verified.insert(pair).second) return;
    if (ring.size() < kVerifiedCacheEntries) {
      ring.push_back(pair);
      return;
    }
    verified.erase(ring[next]);
    ring[next] = pair;
    next = (next + 1) % kVerifiedCacheEntries;
  }
};

SealTrust::SealTrust() : keys_(std::make_unique<Keys>()) {}
SealTrust::SealTrust(SealTrust&&) noexcept = default;
SealTrust& SealTrust::operator=(SealTrust&&) noexcept = default;
SealTrust::~SealTrust() = default;

bool SealTrust::empty() const { return keys_->by_id.empty(); }
size_t SealTrust::size() const { return keys_->by_id.size(); }

absl::StatusOr<std::string> SealTrust::Add(const std::string& public_key_hex) {
  const std::string hex(absl::StripAsciiWhitespace(public_key_hex));
  if (hex.size() != 2 * kRawPublicKeyBytes ||
      hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return absl::InvalidArgumentError(
        "seal trust: a public key is 64 hex digits (SealSigner::PublicKeyHex)");
  }
  const std::string raw = absl::HexStringToBytes(hex);
  Pkey pkey(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                        reinterpret_cast<const unsigned char*>(raw.data()),
                                        raw.size()));
  if (pkey == nullptr) return absl::InvalidArgumentError("seal trust: not an Ed25519 public key");
  std::string id = KeyIdOf(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
  keys_->by_id[id] = std::move(pkey);
  return id;
}

absl::StatusOr<SealTrust> SealTrust::Parse(const std::string& text) {
  SealTrust trust;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto id = trust.Add(std::string(line));
    if (!id.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("seal trust line ", line_no, ": ", id.status().message()));
    }
  }
  return trust;
}

absl::StatusOr<SealTrust> SealTrust::FromFile(const std::string& path) {
  auto text = ReadFile(path, "seal trust file");
  if (!text.ok()) return text.status();
  auto trust = Parse(*text);
  if (!trust.ok()) {
    return absl::Status(trust.status().code(), absl::StrCat(path, ": ", trust.status().message()));
  }
  if (trust->empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no public keys"));
  return trust;
}

bool LooksSealed(absl::string_view bytes) {
  if (bytes.size() < kFixedTrailerBytes + 1) return false;
  const uint32_t trailer = GetU32(bytes.data() + bytes.size() - 4);
  if (trailer < kFixedTrailerBytes + 1 || trailer > kFixedTrailerBytes + kMaxSealKeyIdBytes ||
      trailer > bytes.size()) {
    return false;
  }
  return std::memcmp(bytes.data() + bytes.size() - trailer, kMagic, 4) == 0;
}

absl::StatusOr<OpenedEntry> SealTrust::Open(absl::string_view store_key,
                                            absl::string_view sealed) const {
  if (!LooksSealed(sealed)) return absl::UnauthenticatedError("entry carries no seal");
  const uint32_t trailer = GetU32(sealed.data() + sealed.size() - 4);
  const char* t = sealed.data() + sealed.size() - trailer;
  const uint32_t version = GetU32(t + 4);
  if (version == 1) {
    return absl::UnauthenticatedError(
        "entry's seal is version 1 (signed over a second SHA-256 of the payload), this reader "
        "accepts version 2 (signed over the entry's checksum) only: the entry must be ingested "
        "again");
  }
  if (version != kSealVersion) {
    return absl::UnauthenticatedError(absl::StrCat("entry's seal has unsupported version ", version,
                                                   " (this reader accepts ", kSealVersion, ")"));
  }
  OpenedEntry out;
  out.context.numerics_version = GetU32(t + 8);
  std::memcpy(out.context.model_id.bytes.data(), t + 12, 32);
  const size_t id_len = static_cast<uint8_t>(t[44]);
  if (id_len == 0 || id_len > kMaxSealKeyIdBytes || kFixedTrailerBytes + id_len != trailer) {
    return absl::UnauthenticatedError("entry's seal is malformed (key id length)");
  }
  out.key_id.assign(t + 45, id_len);
  const unsigned char* sig = reinterpret_cast<const unsigned char*>(t + 45 + id_len);
  out.payload = sealed.substr(0, sealed.size() - trailer);
  auto key = keys_->by_id.find(out.key_id);
  if (key == keys_->by_id.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat("entry is sealed by untrusted key id ", absl::CEscape(out.key_id)));
  }
  if (out.payload.size() < kSealedChecksumBytes) {
    return absl::UnauthenticatedError("sealed entry is too short to carry its checksum");
  }
  // Recomputed from the bytes, never taken from the entry: the seal then
  // binds every byte, and callers may skip the codec's own check of it.
  const size_t body = out.payload.size() - kSealedChecksumBytes;
  const auto digest = Sha256(out.payload.substr(0, body));
  if (CRYPTO_memcmp(digest.data(), out.payload.data() + body, kSealedChecksumBytes) != 0) {
    return absl::UnauthenticatedError(
        "sealed entry's checksum does not match its bytes (corrupted or altered)");
  }
  const std::string message =
      SignedMessage(store_key, out.context, out.key_id,
                    absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
  std::string signed_pair = message;
  signed_pair.append(reinterpret_cast<const char*>(sig), kSealSignatureBytes);
  const Keys::Digest pair = Sha256(signed_pair);
  if (keys_->Seen(pair)) return out;
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (ctx == nullptr ||
      EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key->second.get()) != 1) {
    return absl::InternalError("Ed25519 verify init failed");
  }
  if (EVP_DigestVerify(ctx.get(), sig, kSealSignatureBytes,
                       reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) != 1) {
    return absl::UnauthenticatedError(
        "entry's seal does not verify (forged, corrupted, or stored under another key)");
  }
  keys_->Remember(pair);
  return out;
}

absl::Status CheckStoredEntry(const SealTrust& trust, absl::string_view store_key,
                              absl::string_view value) {
  // Full chunks, variants, and entries encrypted at rest (kv_cipher.h).
  const absl::string_view magic = value.substr(0, 4);
  const bool kv = magic == "VCKC" || magic == "VCKV" || magic == "VCKE";
  if (!kv && !LooksSealed(value)) return absl::OkStatus();
  return trust.Open(store_key, value).status();
}

absl::StatusOr<absl::string_view> SealTrust::OpenFor(absl::string_view store_key,
                                                    const SealContext& expected,
                                                    absl::string_view sealed) const {
  auto opened = Open(store_key, sealed);
  if (!opened.ok()) return opened.status();
  if (!(opened->context == expected)) {
    return absl::UnauthenticatedError(
        "entry is sealed for another model or numerics version than this reader's");
  }
  return opened->payload;
}

}  // namespace vc::kvstore
