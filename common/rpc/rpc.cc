#include "common/rpc/rpc.h"

#include <fstream>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace vc::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(status.error_code())),
                      absl::StrCat(what, ": ", status.error_message()));
}

std::unique_ptr<grpc::ClientContext> ContextWithTimeout(std::chrono::milliseconds timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

absl::Status SplitHostPort(const std::string& flag, const std::string& value, std::string* host,
                           int* port) {
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": expected HOST:PORT, got '", value, "'"));
  }
  int p = -1;
  if (!absl::SimpleAtoi(value.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": bad port in '", value, "'"));
  }
  *host = value.substr(0, colon);
  *port = p;
  return absl::OkStatus();
}

absl::Status ValidateTlsFiles(const TlsFiles& tls, bool need_identity) {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.ca.empty()) {
    return absl::InvalidArgumentError("--tls-ca is required with --tls-cert/--tls-key");
  }
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (need_identity && !tls.has_identity()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key are required with --tls-ca");
  }
  for (const auto& [flag, path] : {std::pair<const char*, const std::string*>{"--tls-ca", &tls.ca},
                                   {"--tls-cert", &tls.cert},
                                   {"--tls-key", &tls.key}}) {
    if (path->empty()) continue;
    std::ifstream in(*path);
    if (!in.good()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", *path, ": cannot read"));
    }
  }
  return absl::OkStatus();
}

namespace {
std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(const TlsFiles& tls) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key, tls.cert, tls.ca, kTlsRefreshSeconds);
}
}  // namespace

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsFiles& tls,
                                                           ClientCerts client) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions opts(Provider(tls));
  opts.watch_root_certs();
  opts.watch_identity_key_cert_pairs();
  opts.set_cert_request_type(
      client == ClientCerts::kRequire   ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
      : client == ClientCerts::kRequest ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                                        : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  return grpc::experimental::TlsServerCredentials(opts);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  // Shared while some channel uses them (each set's provider watches its
  // files with a thread); gone with the last channel, so a process that
  // starts and stops clusters does not keep watching deleted files.
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::weak_ptr<grpc::ChannelCredentials>>();
  const std::string key = absl::StrCat(tls.cert, "\n", tls.key, "\n", tls.ca);
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = cache->begin(); it != cache->end();) {
    it = it->second.expired() ? cache->erase(it) : std::next(it);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = (*cache)[key].lock();
  if (creds == nullptr) {
    grpc::experimental::TlsChannelCredentialsOptions opts;
    opts.set_certificate_provider(
        tls.has_identity()
            ? Provider(tls)
            : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                  tls.ca, kTlsRefreshSeconds));
    opts.watch_root_certs();
    if (tls.has_identity()) opts.watch_identity_key_cert_pairs();
    opts.set_verify_server_certs(true);
    creds = grpc::experimental::TlsCredentials(opts);
    (*cache)[key] = creds;
  }
  return creds;
}

grpc::ChannelArguments ChannelArgs(int max_message_bytes, const TlsFiles& tls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // Reconnect quickly after a peer restarts. gRPC's defaults (1 s first
  // backoff, growing to 2 min) kept calls failing with "failed to connect"
  // for 1-2 s after a restarted store was healthy again (docs/results.md,
  // "Cluster chaos"); a reconnect attempt to a dead peer costs one refused
  // connect, so trying every few hundred ms is cheap.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kInitialReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  // Despite its name, gRPC uses this as the deadline of one connection
  // attempt (TCP connect plus the TLS handshake), 20 s by default. Shorter,
  // so an attempt stuck behind a cut link gives way to a fresh one soon
  // after the link is back; long enough for a handshake on a loaded host.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectAttemptTimeoutMs);
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return args;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int max_message_bytes,
                                           const TlsFiles& tls) {
  return grpc::CreateCustomChannel(address, ChannelCredentials(tls),
                                   ChannelArgs(max_message_bytes, tls));
}

namespace {
class ApiKeyPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit ApiKeyPlugin(std::string key) : value_("Bearer " + std::move(key)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
                           const grpc::AuthContext& /*channel_auth_context*/,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({"authorization", value_});
    return grpc::Status::OK;
  }

 private:
  std::string value_;
};
}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const ClientConfig& client, int max_message_bytes) {
  if (!client.tls.enabled() || client.api_key.empty()) {
    return MakeChannel(client.address, max_message_bytes, client.tls);
  }
  auto creds = grpc::CompositeChannelCredentials(
      ChannelCredentials(client.tls),
      grpc::MetadataCredentialsFromPlugin(std::make_unique<ApiKeyPlugin>(client.api_key)));
  return grpc::CreateCustomChannel(client.address, creds,
                                   ChannelArgs(max_message_bytes, client.tls));
}

std::unique_ptr<grpc::ClientContext> ContextWithTimeout(const ClientConfig& client,
                                                        std::chrono::milliseconds timeout) {
  auto ctx = ContextWithTimeout(timeout);
  if (!client.api_key.empty() && !client.tls.enabled()) {
    ctx->AddMetadata("authorization", "Bearer " + client.api_key);
  }
  return ctx;
}

absl::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                         std::chrono::milliseconds timeout) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = ContextWithTimeout(timeout);
  const grpc::Status s = stub->Check(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s, "health check");
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError("health check: not serving");
  }
  return absl::OkStatus();
}

}  // namespace vc::rpc
