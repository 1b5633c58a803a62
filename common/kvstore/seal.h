// Seals on stored KV entries (DESIGN.md section 4; docs/security.md "Sealed
// KV"): the worker that produces a full-KV chunk or a compressed variant signs
// it, with an Ed25519 key the store never holds, over (store key, model id,
// numerics version, the entry's checksum). The store checks the seal on
// commit and every reader checks it before decoding, so a forged,
// transplanted (another key) or corrupted entry is refused even if the store
// host is compromised. A checksum alone proves nothing against a writer who
// recomputes it; signed, it binds every byte.
//
// What can be sealed: an entry that ends in SHA-256 of everything before it
// (32 bytes), as full-KV chunks (chunk_codec.h) and compressed variants
// (variant_codec.h) do. A sealed entry is that entry followed by a trailer
// (little-endian):
//   magic "VCSL" | u32 version (2) | u32 numerics version | model id (32) |
//   u8 key id length (1..64) | key id | Ed25519 signature (64) |
//   u32 trailer bytes (this whole trailer, this field included)
// The signature covers a small statement, a length-prefixed encoding of: the
// domain string "vericache-seal-v2", the store key, the model id, the
// numerics version, the key id and the entry's checksum. Sealing reads no
// payload byte (the encoder just hashed them all) and appends in place;
// opening recomputes the checksum from the bytes — never trusting the one
// stored — and then checks the signature over it, so a reader hashes each
// byte once and the codec need not hash again (ChecksumCheck below).
// Version 1 signed a second SHA-256 of the payload; its entries are refused
// with an error saying so (re-ingested on demand, like any refused entry).
//
// Key ids are derived from the public key (the first 16 hex digits of
// SHA-256 of its 32 raw bytes), so a trust set is just a list of public keys
// and a rotation is "add the new key to every trust set, switch the writers,
// drop the old key once its entries are gone".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/kvstore/chunk_key.h"

namespace vc::kvstore {

inline constexpr uint32_t kSealVersion = 2;
inline constexpr size_t kSealSignatureBytes = 64;
inline constexpr size_t kMaxSealKeyIdBytes = 64;
// The checksum a sealable entry ends with (SHA-256 of the bytes before it).
inline constexpr size_t kSealedChecksumBytes = 32;
// The largest trailer Seal appends. Encoders reserve this much room past
// their checksum so sealing appends without reallocating (copying) the entry.
inline constexpr size_t kSealTrailerMaxBytes =
    4 + 4 + 4 + 32 + 1 + kMaxSealKeyIdBytes + kSealSignatureBytes + 4;

// Whether a codec recomputes an entry's trailing checksum. kAlreadyRecomputed
// only for bytes whose checksum the caller has itself just recomputed from
// those bytes and compared: SealTrust::Open does, before it checks the seal
// over it (StoreClient::fetched_checksum says which applies to a fetch).
enum class ChecksumCheck { kRecompute, kAlreadyRecomputed };

// What a seal binds besides the store key and the payload.
struct SealContext {
  ModelId model_id;
  uint32_t numerics_version = 1;
  friend bool operator==(const SealContext&, const SealContext&) = default;
};

// A worker's signing key (Ed25519). Thread-safe (Seal is const).
class SealSigner {
 public:
  // From a PEM private key (PKCS#8, e.g. `openssl genpkey -algorithm
  // ed25519`). InvalidArgument if it is not an Ed25519 private key.
  static absl::StatusOr<std::unique_ptr<SealSigner>> FromPem(const std::string& pem);
  // FromPem of a file's contents; NotFound / PermissionDenied naming the path.
  static absl::StatusOr<std::unique_ptr<SealSigner>> FromPemFile(const std::string& path);
  // A fresh random key (tests, `vericache local`'s throwaway key).
  static absl::StatusOr<std::unique_ptr<SealSigner>> Generate();
  ~SealSigner();

  const std::string& key_id() const { return key_id_; }
  // The public half as 64 hex digits (a line of a trust file).
  std::string PublicKeyHex() const;
  // The private key as PEM (PKCS#8), to write a key file.
  absl::StatusOr<std::string> PrivateKeyPem() const;

  // Appends the seal to `entry` in place. The entry must end in its own
  // checksum (chunk or variant codec output); Seal signs that checksum as is
  // and reads no other byte — an entry whose checksum is wrong is refused by
  // the store and every reader, which recompute it. InvalidArgument for an
  // empty key or an entry shorter than a checksum.
  absl::Status Seal(absl::string_view store_key, const SealContext& context,
                    std::string* entry) const;

 private:
  struct Key;
  explicit SealSigner(std::unique_ptr<Key> key);
  std::unique_ptr<Key> key_;
  std::string key_id_;
};

// What a valid seal says.
struct OpenedEntry {
  // The entry without the trailer, pointing into the sealed bytes; its
  // checksum has been recomputed and matched (ChecksumCheck::kAlreadyRecomputed).
  absl::string_view payload;
  SealContext context;
  std::string key_id;
};

// The public keys a reader or the store trusts, by key id. Immutable once
// built; thread-safe.
class SealTrust {
 public:
  SealTrust();
  SealTrust(SealTrust&&) noexcept;
  SealTrust& operator=(SealTrust&&) noexcept;
  ~SealTrust();

  // A trust file: one Ed25519 public key per line as 64 hex digits (what
  // SealSigner::PublicKeyHex prints); blank lines and '#' comments ignored.
  // Several keys are allowed (rotation). InvalidArgument naming the line.
  static absl::StatusOr<SealTrust> Parse(const std::string& text);
  static absl::StatusOr<SealTrust> FromFile(const std::string& path);
  // Adds one public key (64 hex digits); its key id.
  absl::StatusOr<std::string> Add(const std::string& public_key_hex);

  bool empty() const;
  size_t size() const;

  // Checks the seal of `sealed`, stored under `store_key`: the trailer is
  // well formed and of version 2, its key id is trusted, the entry's
  // checksum matches its bytes (recomputed here: one SHA-256 pass), and the
  // signature verifies over (store_key, model id, numerics version, key id,
  // that checksum). Unauthenticated naming what failed (no seal, an old
  // seal version, unknown key id, checksum mismatch, bad signature); never
  // decodes anything else.
  absl::StatusOr<OpenedEntry> Open(absl::string_view store_key, absl::string_view sealed) const;
  // Open, and the seal's context must equal `expected` (another model's or
  // numerics version's entry is refused the same way).
  absl::StatusOr<absl::string_view> OpenFor(absl::string_view store_key, const SealContext& expected,
                                           absl::string_view sealed) const;

 private:
  struct Keys;
  std::unique_ptr<Keys> keys_;
};

// True if `bytes` ends in something shaped like a seal trailer (magic and
// length plausible); says nothing about validity.
bool LooksSealed(absl::string_view bytes);

// The store's rule on commit and on disk reads: an entry that is KV (it
// starts with the full-chunk, the variant or the encrypted-entry magic,
// "VCKC" / "VCKV" / "VCKE") or that carries a seal must carry a valid seal
// by a trusted key for `store_key` (Unauthenticated otherwise); other
// entries (the coordinator's prefix manifests, which no worker produces)
// pass.
absl::Status CheckStoredEntry(const SealTrust& trust, absl::string_view store_key,
                              absl::string_view value);

}  // namespace vc::kvstore
