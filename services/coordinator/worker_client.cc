#include "services/coordinator/worker_client.h"

#include "absl/strings/str_cat.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc::coordinator {

namespace pb = ::vericache::v1;

WorkerCallOptions CallWithin(std::chrono::milliseconds timeout) {
  WorkerCallOptions o;
  o.deadline = std::chrono::steady_clock::now() + timeout;
  return o;
}

absl::Status WithCallName(const absl::Status& s, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

namespace {

std::unique_ptr<grpc::ClientContext> ContextFor(const WorkerCallOptions& o) {
  std::unique_ptr<grpc::ClientContext> ctx = o.parent != nullptr
                                                 ? grpc::ClientContext::FromServerContext(*o.parent)
                                                 : std::make_unique<grpc::ClientContext>();
  // A child's deadline is the earlier of this and its parent's.
  const auto left = o.deadline - std::chrono::steady_clock::now();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
  ctx->set_wait_for_ready(o.wait_for_ready);
  return ctx;
}

// One unary call on `stub`, its grpc::Status as an absl::Status (code and
// message unchanged).
template <typename Stub, typename Req, typename Resp>
absl::Status Call(Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                  const WorkerCallOptions& o, const Req& req, Resp* resp) {
  auto ctx = ContextFor(o);
  const grpc::Status s = (stub.*method)(ctx.get(), req, resp);
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      s.error_message());
}

class GrpcVerifierClient final : public VerifierClient {
 public:
  GrpcVerifierClient(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), stub_(pb::Verifier::NewStub(channel)) {}
  const std::string& address() const override { return address_; }
  absl::Status Info(const WorkerCallOptions& o, const pb::WorkerInfoRequest& req,
                    pb::WorkerInfoResponse* resp) override {
    return Call(*stub_, &pb::Verifier::Stub::Info, o, req, resp);
  }
  absl::Status Release(const WorkerCallOptions& o, const pb::ReleaseRequest& req,
                       pb::ReleaseResponse* resp) override {
    return Call(*stub_, &pb::Verifier::Stub::Release, o, req, resp);
  }
  absl::Status Open(const WorkerCallOptions& o, const pb::VerifierOpenRequest& req,
                    pb::VerifierOpenResponse* resp) override {
    return Call(*stub_, &pb::Verifier::Stub::Open, o, req, resp);
  }
  absl::Status Load(const WorkerCallOptions& o, const pb::LoadRequest& req,
                    pb::LoadResponse* resp) override {
    return Call(*stub_, &pb::Verifier::Stub::Load, o, req, resp);
  }
  absl::Status Verify(const WorkerCallOptions& o, const pb::VerifyRequest& req,
                      pb::VerifyResponse* resp) override {
    return Call(*stub_, &pb::Verifier::Stub::Verify, o, req, resp);
  }
  absl::Status Ingest(const WorkerCallOptions& o, const pb::IngestRequest& req,
                      pb::IngestResponse* resp) override {
    return Call(*stub_, &pb::Verifier::Stub::Ingest, o, req, resp);
  }

 private:
  std::string address_;
  std::unique_ptr<pb::Verifier::Stub> stub_;
};

class GrpcDrafterClient final : public DrafterClient {
 public:
  GrpcDrafterClient(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), stub_(pb::Drafter::NewStub(channel)) {}
  const std::string& address() const override { return address_; }
  absl::Status Info(const WorkerCallOptions& o, const pb::WorkerInfoRequest& req,
                    pb::WorkerInfoResponse* resp) override {
    return Call(*stub_, &pb::Drafter::Stub::Info, o, req, resp);
  }
  absl::Status Release(const WorkerCallOptions& o, const pb::ReleaseRequest& req,
                       pb::ReleaseResponse* resp) override {
    return Call(*stub_, &pb::Drafter::Stub::Release, o, req, resp);
  }
  absl::Status Open(const WorkerCallOptions& o, const pb::DrafterOpenRequest& req,
                    pb::DrafterOpenResponse* resp) override {
    return Call(*stub_, &pb::Drafter::Stub::Open, o, req, resp);
  }
  absl::Status Draft(const WorkerCallOptions& o, const pb::DraftRequest& req,
                     pb::DraftResponse* resp) override {
    return Call(*stub_, &pb::Drafter::Stub::Draft, o, req, resp);
  }
  absl::Status Commit(const WorkerCallOptions& o, const pb::CommitRequest& req,
                      pb::CommitResponse* resp) override {
    return Call(*stub_, &pb::Drafter::Stub::Commit, o, req, resp);
  }

 private:
  std::string address_;
  std::unique_ptr<pb::Drafter::Stub> stub_;
};

}  // namespace

std::unique_ptr<VerifierClient> MakeGrpcVerifierClient(const std::string& address,
                                                       int max_message_bytes,
                                                       const rpc::TlsFiles& tls) {
  return std::make_unique<GrpcVerifierClient>(address,
                                              rpc::MakeChannel(address, max_message_bytes, tls));
}

std::unique_ptr<DrafterClient> MakeGrpcDrafterClient(const std::string& address,
                                                     int max_message_bytes,
                                                     const rpc::TlsFiles& tls) {
  return std::make_unique<GrpcDrafterClient>(address,
                                             rpc::MakeChannel(address, max_message_bytes, tls));
}

}  // namespace vc::coordinator
