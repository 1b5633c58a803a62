// gRPC glue shared by the daemons and their clients: status conversion in
// both directions, per-call deadlines, HOST:PORT parsing, and channels with
// the project's message-size bounds.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace vc::rpc {

// absl -> gRPC status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);
// gRPC -> absl status with the same code; the message is prefixed with
// `what` (e.g. "verifier 127.0.0.1:7410 Verify") so errors name their peer.
absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what);

// A client context whose deadline is `timeout` from now. Every internal call
// gets one: a peer that stops answering fails the call instead of hanging it.
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(std::chrono::milliseconds timeout);

// Splits "host:port" at the last ':'; InvalidArgument naming `flag` unless
// the port is 0..65535 and the host non-empty.
absl::Status SplitHostPort(const std::string& flag, const std::string& value, std::string* host,
                           int* port);

// TLS material of one process, as PEM file paths (--tls-cert, --tls-key,
// --tls-ca). All empty: plaintext (the --insecure setup). Files are watched
// and re-read by gRPC (about every kTlsRefreshSeconds), so certificates
// rotate without a restart; replace cert and key together (e.g. a renamed
// directory or symlink swap, as Kubernetes Secrets do).
struct TlsFiles {
  std::string cert;  // this process's certificate chain
  std::string key;   // its private key
  std::string ca;    // the CA bundle peers' certificates must chain to
  // Clients: the name the server's certificate must carry, when it is not
  // the host being dialled (e.g. through a port-forward). Empty: the host.
  std::string server_name;
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
  bool has_identity() const { return !cert.empty() && !key.empty(); }
};
inline constexpr unsigned kTlsRefreshSeconds = 10;

// InvalidArgument naming the flag unless the set is usable: --tls-ca is
// needed whenever TLS is on, --tls-cert and --tls-key go together, and
// `need_identity` (servers, and mTLS clients) requires them. Files must be
// readable.
[[nodiscard]] absl::Status ValidateTlsFiles(const TlsFiles& tls, bool need_identity);

// Whether a TLS server asks its clients for a certificate. kRequire: mutual
// TLS, the client's certificate must chain to --tls-ca (internal ports);
// kRequest: a client may present one (it must then chain to --tls-ca) or
// none (the coordinator's public port: API keys, or a client certificate
// naming the tenant); kNone: server-only TLS.
enum class ClientCerts { kRequire, kRequest, kNone };

// Server credentials for `tls` (insecure when !tls.enabled()).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsFiles& tls, ClientCerts client);

// Channel credentials for `tls`: TLS verifying the server against tls.ca and
// the target's host name/IP, presenting tls.cert when set; insecure when
// !tls.enabled(). One set per distinct TlsFiles per process (each watches
// its files with a thread).
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsFiles& tls);

// The arguments of every channel MakeChannel makes: send/receive limits of
// `max_message_bytes`, tls.server_name, and a short reconnect backoff (first
// retry after kInitialReconnectBackoffMs, then growing to at most
// kMaxReconnectBackoffMs; each connection attempt bounded by
// kConnectAttemptTimeoutMs), so a peer restarted on the same address is
// reached again within a fraction of a second.
inline constexpr int kInitialReconnectBackoffMs = 100;
inline constexpr int kMaxReconnectBackoffMs = 250;
inline constexpr int kConnectAttemptTimeoutMs = 5000;
grpc::ChannelArguments ChannelArgs(int max_message_bytes, const TlsFiles& tls);

// A channel to `address` whose send/receive limits are `max_message_bytes`
// (the same bound the servers use), TLS per `tls` (plaintext by default).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int max_message_bytes,
                                           const TlsFiles& tls = {});

// How a client reaches a daemon: its address, the TLS files (the CA only
// for the coordinator's public port; a certificate too for internal ports)
// and the API key the coordinator wants. A bare address converts to a
// plaintext client without a key.
struct ClientConfig {
  std::string address;
  TlsFiles tls;
  std::string api_key;  // sent as "authorization: Bearer KEY" when set
  ClientConfig() = default;
  ClientConfig(std::string a) : address(std::move(a)) {}  // NOLINT: implicit on purpose
  ClientConfig(const char* a) : address(a) {}             // NOLINT
};
// Over TLS the channel itself carries the API key on every call (call
// credentials), so any context works on it; gRPC sends no call credentials
// over plaintext, where ContextWithTimeout(client, ...) adds the key.
std::shared_ptr<grpc::Channel> MakeChannel(const ClientConfig& client, int max_message_bytes);
// ContextWithTimeout carrying the client's API key when the channel does not
// (plaintext).
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(const ClientConfig& client,
                                                        std::chrono::milliseconds timeout);

// Health of a daemon through grpc.health.v1 (overall service ""): OK when
// SERVING, Unavailable otherwise or when it does not answer within `timeout`.
absl::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                         std::chrono::milliseconds timeout);

}  // namespace vc::rpc
