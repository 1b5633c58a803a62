#include "services/openai/coordinator_client.h"

#include <utility>

#include "common/rpc/rpc.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc::openai {
namespace {

namespace pb = ::vericache::v1;

// The coordinator's own message, as is: it goes back to the HTTP caller,
// who has no use for (and should not learn) the cluster's internal address.
absl::Status FromCoordinator(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

std::unique_ptr<grpc::ClientContext> MakeContext(const CallOptions& o) {
  auto ctx = rpc::ContextWithTimeout(o.timeout);
  if (!o.authorization.empty()) ctx->AddMetadata("authorization", o.authorization);
  return ctx;
}

class GrpcGenerateStream final : public GenerateStream {
 public:
  GrpcGenerateStream(pb::Coordinator::Stub* stub, const pb::GenerateRequest& req,
                     const CallOptions& o)
      : ctx_(MakeContext(o)), reader_(stub->Generate(ctx_.get(), req)) {}

  bool Read(pb::GenerateResponse* msg) override { return reader_->Read(msg); }
  absl::Status Finish() override {
    return FromCoordinator(reader_->Finish());
  }
  void Cancel() override { ctx_->TryCancel(); }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader_;
};

rpc::TlsFiles TlsOf(const GrpcCoordinatorClientOptions& o) {
  rpc::TlsFiles tls;
  tls.ca = o.tls_ca;
  tls.server_name = o.tls_server_name;
  return tls;
}

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(const GrpcCoordinatorClientOptions& o)
      : channel_(rpc::MakeChannel(o.address, o.max_message_bytes, TlsOf(o))),
        stub_(pb::Coordinator::NewStub(channel_)) {}

  std::unique_ptr<GenerateStream> Generate(const pb::GenerateRequest& req,
                                           const CallOptions& o) override {
    return std::make_unique<GrpcGenerateStream>(stub_.get(), req, o);
  }

  absl::StatusOr<pb::ClusterStatusResponse> ClusterStatus(const CallOptions& o) override {
    auto ctx = MakeContext(o);
    pb::ClusterStatusResponse resp;
    const grpc::Status s = stub_->ClusterStatus(ctx.get(), pb::ClusterStatusRequest(), &resp);
    if (!s.ok()) return FromCoordinator(s);
    return resp;
  }

  absl::Status Health(std::chrono::milliseconds timeout) override {
    return rpc::CheckHealth(channel_, timeout);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

}  // namespace

std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const GrpcCoordinatorClientOptions& o) {
  return std::make_unique<GrpcCoordinatorClient>(o);
}

}  // namespace vc::openai
