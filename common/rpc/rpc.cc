#include "common/rpc/rpc.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
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

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // Reconnect quickly after a peer restarts (the default backoff grows to
  // minutes, far longer than any request's deadline).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
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
