// How vc-openai reaches the cluster: the coordinator's public gRPC API
// (vericache.v1.Coordinator) behind a small interface, so the gateway's HTTP
// and text logic can be tested against a fake cluster. The real client
// forwards the caller's `Authorization: Bearer KEY` as gRPC metadata
// `authorization`, gives every call a deadline, and can cancel a running
// Generate from another thread (a client that hung up), which makes the
// coordinator drop the request and free its KV.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vericache/v1/coordinator.pb.h"

namespace vc::openai {

struct CallOptions {
  // The caller's credentials as sent ("Bearer KEY"); "" sends none.
  std::string authorization;
  std::chrono::milliseconds timeout{600000};
};

// One running Generate: read its messages, then Finish for the status.
class GenerateStream {
 public:
  virtual ~GenerateStream() = default;
  // The next message; false when the stream ended (then call Finish).
  virtual bool Read(vericache::v1::GenerateResponse* msg) = 0;
  // The call's status (the coordinator's error, or OK).
  [[nodiscard]] virtual absl::Status Finish() = 0;
  // Safe from any thread, any number of times: the call ends with
  // CANCELLED and the coordinator releases the request.
  virtual void Cancel() = 0;
};

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual std::unique_ptr<GenerateStream> Generate(const vericache::v1::GenerateRequest& req,
                                                   const CallOptions& options) = 0;
  [[nodiscard]] virtual absl::StatusOr<vericache::v1::ClusterStatusResponse> ClusterStatus(
      const CallOptions& options) = 0;
  // grpc.health.v1 of the coordinator.
  [[nodiscard]] virtual absl::Status Health(std::chrono::milliseconds timeout) = 0;
};

struct GrpcCoordinatorClientOptions {
  std::string address;                    // HOST:PORT
  int max_message_bytes = 64 << 20;
  // The coordinator's public port: TLS verified against this CA bundle (no
  // client certificate: callers authenticate with their API keys, which
  // every call carries). Empty: plaintext.
  std::string tls_ca;
  // The name in the coordinator's certificate when it is not the dialled
  // host (empty: the host of `address`).
  std::string tls_server_name;
};

// The real client.
std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(
    const GrpcCoordinatorClientOptions& options);

}  // namespace vc::openai
