// Who is calling vc-coordinator's public API (issue 11 item 1, DESIGN.md
// section 7 "Trust boundaries"): API keys sent as gRPC metadata
// `authorization: Bearer KEY`, mapped to tenants by a keys file, and the
// tenant's KV key salt derived from the tenant by the server.
//
// The keys file is either lines `TENANT KEY` ('#' starts a comment) or a JSON
// object {"TENANT": "KEY"} / {"TENANT": ["KEY1", "KEY2"]}. A tenant may have
// several keys at once (rotation: add the new key, move clients, remove the
// old one). Keys are kept only as SHA-256 hashes and compared in constant
// time; the file is re-read when its mtime, size or inode changes (checked at
// most once per reload_interval), so rotation needs no restart; a file that
// no longer parses keeps the previous keys. Failed authentications are
// rate-limited per peer address. Nothing here logs a key or a tenant name.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vc::coordinator {

struct TenantAuthOptions {
  // Keys file; "" turns authentication off (every caller is the anonymous
  // tenant "" and the request's tenant_salt is used as before).
  std::string api_keys_file;
  // Cluster secret (>= 16 bytes, trailing newline ignored) keying the salt
  // derivation; required when api_keys_file is set.
  std::string cluster_secret_file;
  // How often the keys file's metadata is checked for a change; default 1 s.
  std::chrono::milliseconds reload_interval{1000};
  // Failed authentications per peer address: a bucket of `failure_burst`
  // refilled at `failures_per_second`; an empty bucket refuses the peer
  // (RESOURCE_EXHAUSTED) until it refills. Defaults 20 and 5/s.
  int failure_burst = 20;
  double failures_per_second = 5;
  // Peers tracked by the limiter (oldest forgotten first); default 4096.
  int max_tracked_peers = 4096;
};

struct Identity {
  std::string tenant;  // "" when authentication is off
  // The KV key salt: HMAC-SHA256(cluster secret, tenant) when authentication
  // is on; never the tenant name itself.
  std::string salt;
};

class TenantAuth {
 public:
  // InvalidArgument naming the flag when a file is missing or malformed.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TenantAuth>> Create(const TenantAuthOptions& options);
  ~TenantAuth();

  bool enabled() const;

  // `authorization`: the metadata value ("" when absent); `peer`: the gRPC
  // peer string (ipv4:HOST:PORT), used only for rate limiting;
  // `certificate_cn`: the subject CN of the caller's verified TLS client
  // certificate ("" when it presented none). Without a key, a certificate
  // whose CN is a tenant of the keys file (one with at least one key) is
  // that tenant; with a key too, a certificate naming a tenant must name
  // the key's (one whose CN is no tenant is ignored). So the keys
  // file decides which certificate names are tenants: a daemon's
  // certificate, from the same CA, is not one unless listed.
  // Unauthenticated when neither identifies a tenant, the key is unknown or
  // the two disagree; ResourceExhausted when the peer failed too often.
  // With authentication off: the anonymous identity (salt left empty for
  // the caller to fill).
  [[nodiscard]] absl::StatusOr<Identity> Authenticate(absl::string_view authorization,
                                                      absl::string_view peer,
                                                      absl::string_view certificate_cn = "");

  // Number of keys currently accepted (tests, startup line).
  int key_count() const;

 private:
  TenantAuth() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// HMAC-SHA256(secret, domain || tenant): the tenant's KV salt. Exposed for
// tests that check salts differ per tenant and never equal the name.
std::string DeriveTenantSalt(absl::string_view cluster_secret, absl::string_view tenant);

}  // namespace vc::coordinator
