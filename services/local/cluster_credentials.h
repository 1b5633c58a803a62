// Throwaway credentials for a local cluster (`vericache local`, the cluster
// tests and bench; issue 11 item 6): a CA, one certificate for the daemons
// and one for local clients (both with SANs IP:127.0.0.1 and DNS:localhost,
// usable as server and client certificates, signed by the CA), a cluster
// secret and two demo tenants with random API keys and a client certificate
// each (subject CN = the tenant: an alternative to the key on the public
// port). Made with OpenSSL in a
// directory the caller owns; every file mode 0600. The CA's private key
// never leaves memory (nothing signs with it later). Not for production:
// one certificate serves every daemon, and it lives for 30 days.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/rpc.h"

namespace vc::local {

struct ClusterCredentials {
  std::string ca;                   // PEM CA certificate (the endpoints file's tls_ca)
  rpc::TlsFiles daemon;             // what every daemon runs with (mTLS)
  rpc::TlsFiles client;             // a client certificate for internal ports (tests, tools)
  std::string api_keys_file;        // "TENANT KEY" lines
  std::string cluster_secret_file;  // keys the tenant salts
  std::map<std::string, std::string> api_keys;  // "tenant-a"/"tenant-b" -> key
  std::map<std::string, rpc::TlsFiles> tenant_certs;  // "tenant-a"/"tenant-b" -> CN=tenant
};

// Writes the files into `dir` (which must exist). Internal on an OpenSSL
// failure, with OpenSSL's reason.
[[nodiscard]] absl::StatusOr<ClusterCredentials> MakeClusterCredentials(const std::string& dir);

}  // namespace vc::local
