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

// An insecure channel to `address` whose send/receive limits are
// `max_message_bytes` (the same bound the servers use).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int max_message_bytes);

// Health of a daemon through grpc.health.v1 (overall service ""): OK when
// SERVING, Unavailable otherwise or when it does not answer within `timeout`.
absl::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                         std::chrono::milliseconds timeout);

}  // namespace vc::rpc
