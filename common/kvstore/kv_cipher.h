// Optional encryption of KV entries at rest (docs/security.md "Encryption of
// KV at rest"): AES-256-GCM under a per-tenant key, so the store (and anyone
// reading its disk) holds only ciphertext, and one tenant's key opens none of
// another tenant's entries.
//
// Keys: HKDF-SHA256 with a cluster KV secret as input key material (held by
// the workers that write and read KV, never by the store), the fixed salt
// "vericache kv at rest v1", and the tenant's salt as info. The tenant salt
// is the coordinator's keyed derivation of the authenticated tenant (it is
// already in every chunk key), so neither a tenant name nor a client-chosen
// value picks a key.
//
// An encrypted entry (little-endian):
//   magic "VCKE" | u32 version (1) | nonce (12, random) | ciphertext |
//   GCM tag (16) | SHA-256 over everything before it (32)
// It ends in its own checksum like every KV entry, so it is sealed (seal.h)
// exactly as a plain chunk or variant is. The GCM additional data binds the
// store key, so a ciphertext moved to another key does not decrypt.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/kvstore/seal.h"

namespace vc::kvstore {

inline constexpr uint32_t kEncryptedEntryVersion = 1;
inline constexpr size_t kKvSecretMinBytes = 32;
// Bytes an encrypted entry adds to its plaintext.
inline constexpr size_t kEncryptionOverheadBytes = 4 + 4 + 12 + 16 + 32;

// One tenant's AES-256 key.
struct TenantKey {
  std::array<uint8_t, 32> bytes{};
};

// The cluster KV secret, from which tenant keys are derived. Immutable.
class KvKeyring {
 public:
  // InvalidArgument if `secret` is shorter than kKvSecretMinBytes.
  static absl::StatusOr<KvKeyring> FromSecret(std::string secret);
  // FromSecret of a file's bytes (read as is, no trimming; at most 4 KiB):
  // NotFound / PermissionDenied naming the path, InvalidArgument if short.
  static absl::StatusOr<KvKeyring> FromFile(const std::string& path);
  // The key of the tenant whose salt is `tenant_salt` (InvalidArgument if
  // empty: an unauthenticated cluster has no tenants to keep apart).
  absl::StatusOr<TenantKey> KeyFor(absl::string_view tenant_salt) const;

 private:
  explicit KvKeyring(std::string secret) : secret_(std::move(secret)) {}
  std::string secret_;
};

// True if `entry` starts like an encrypted entry (says nothing of validity).
bool LooksEncrypted(absl::string_view entry);

// `plain` (a chunk or variant as its codec wrote it) encrypted for
// `store_key` under `key`, with room reserved for a seal.
absl::StatusOr<std::string> EncryptEntry(const TenantKey& key, absl::string_view store_key,
                                         absl::string_view plain);

// The plaintext of an encrypted entry stored under `store_key` (trailer of a
// seal already removed). Unauthenticated when the tag does not verify: a
// wrong tenant key, another store key, or any changed byte; DataLoss when the
// trailing checksum does not match; InvalidArgument for something that is not
// an encrypted entry of a known version. kAlreadyRecomputed skips the
// trailing checksum: only when the caller has just recomputed and compared
// it (SealTrust::Open does), so that each fetched byte is hashed once.
absl::StatusOr<std::string> DecryptEntry(const TenantKey& key, absl::string_view store_key,
                                         absl::string_view entry,
                                         ChecksumCheck check = ChecksumCheck::kRecompute);

}  // namespace vc::kvstore
