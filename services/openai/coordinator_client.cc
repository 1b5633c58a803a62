#include "services/openai/coordinator_client.h"

#include <utility>

#include "common/rpc/rpc.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc::openai {
namespace {

namespace pb = ::vericache::v1;

std::unique_ptr<grpc::ClientContext> MakeContext(const CallOptions& o) {
  auto ctx = rpc::ContextWithTimeout(o.timeout);
  if (!o.authorization.empty()) ctx->AddMetadata("authorization", o.authorization);
  return ctx;
}

class GrpcGenerateStream final : public GenerateStream {
 public:
  GrpcGenerateStream(pb::Coordinator::Stub* stub, const pb::GenerateRequest& req,
                     const CallOptions& o, std::string address)
      : ctx_(MakeContext(o)), reader_(stub->Generate(ctx_.get(), req)), address_(std::move(address)) {}

  bool Read(pb::GenerateResponse* msg) override { return reader_->Read(msg); }
  absl::Status Finish() override {
    return rpc::FromGrpcStatus(reader_->Finish(), "coordinator " + address_);
  }
  void Cancel() override { ctx_->TryCancel(); }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader_;
  std::string address_;
};

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(const GrpcCoordinatorClientOptions& o)
      : address_(o.address),
        channel_(rpc::MakeChannel(o.address, o.max_message_bytes)),
        stub_(pb::Coordinator::NewStub(channel_)) {}

  std::unique_ptr<GenerateStream> Generate(const pb::GenerateRequest& req,
                                           const CallOptions& o) override {
    return std::make_unique<GrpcGenerateStream>(stub_.get(), req, o, address_);
  }

  absl::StatusOr<pb::ClusterStatusResponse> ClusterStatus(const CallOptions& o) override {
    auto ctx = MakeContext(o);
    pb::ClusterStatusResponse resp;
    const grpc::Status s = stub_->ClusterStatus(ctx.get(), pb::ClusterStatusRequest(), &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s, "coordinator " + address_);
    return resp;
  }

  absl::Status Health(std::chrono::milliseconds timeout) override {
    return rpc::CheckHealth(channel_, timeout);
  }

 private:
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

}  // namespace

std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const GrpcCoordinatorClientOptions& o) {
  return std::make_unique<GrpcCoordinatorClient>(o);
}

}  // namespace vc::openai
