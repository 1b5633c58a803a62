#include "services/coordinator/worker_client.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>

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
  // Only when asked: unset, the channel's default (fail fast) applies.
  if (o.wait_for_ready) ctx->set_wait_for_ready(true);
  return ctx;
}

// `s` as an absl::Status (code and message unchanged).
absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      s.error_message());
}

// One unary call on `stub`.
template <typename Stub, typename Req, typename Resp>
absl::Status Call(Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                  const WorkerCallOptions& o, const Req& req, Resp* resp) {
  auto ctx = ContextFor(o);
  return FromGrpc((stub.*method)(ctx.get(), req, resp));
}

// One unary call on gRPC's callback API (`stub.async()->*method`, as Call
// makes `stub.*method`); the context lives until the call has ended, and is
// gone before `done` hears how.
template <typename Stub, typename Req, typename Resp>
void StartCall(Stub& stub,
               void (Stub::StubInterface::async_interface::*method)(
                   grpc::ClientContext*, const Req*, Resp*, std::function<void(grpc::Status)>),
               const WorkerCallOptions& o, const Req& req, Resp* resp, CallDone done) {
  std::shared_ptr<grpc::ClientContext> ctx = ContextFor(o);
  grpc::ClientContext* raw = ctx.get();
  (stub.async()->*method)(
      raw, &req, resp,
      [ctx = std::move(ctx), done = std::move(done)](const grpc::Status& s) mutable {
        ctx.reset();
        done(FromGrpc(s));
      });
}

// What both kinds of worker answer, over `Service`'s stub.
template <typename Client, typename Service>
class GrpcWorker : public Client {
 public:
  GrpcWorker(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), stub_(Service::NewStub(channel)) {}
  const std::string& address() const override { return address_; }
  absl::Status Info(const WorkerCallOptions& o, const pb::WorkerInfoRequest& req,
                    pb::WorkerInfoResponse* resp) override {
    return Call(*stub_, &Service::Stub::Info, o, req, resp);
  }
  absl::Status Release(const WorkerCallOptions& o, const pb::ReleaseRequest& req,
                       pb::ReleaseResponse* resp) override {
    return Call(*stub_, &Service::Stub::Release, o, req, resp);
  }
  void StartInfo(const WorkerCallOptions& o, const pb::WorkerInfoRequest& req,
                 pb::WorkerInfoResponse* resp, CallDone done) override {
    StartCall(*stub_, &Async::Info, o, req, resp, std::move(done));
  }
  void StartRelease(const WorkerCallOptions& o, const pb::ReleaseRequest& req,
                    pb::ReleaseResponse* resp, CallDone done) override {
    StartCall(*stub_, &Async::Release, o, req, resp, std::move(done));
  }

 protected:
  using Async = typename Service::StubInterface::async_interface;
  typename Service::Stub& WorkerStub() { return *stub_; }

 private:
  std::string address_;
  std::unique_ptr<typename Service::Stub> stub_;
};

// The gRPC Lease stream on the callback API: the runner's thread sends and
// waits on a condition variable; gRPC's threads run the reactions.
class GrpcLeaseStream final : public LeaseStream,
                              public grpc::ClientBidiReactor<pb::LeaseGrant, pb::LeaseProgress> {
 public:
  GrpcLeaseStream(pb::Verifier::Stub& stub, const WorkerCallOptions& o) : ctx_(ContextFor(o)) {
    stub.async()->Lease(ctx_.get(), this);
    // Held until Close or the destructor: Send starts writes from the
    // runner's thread, outside any reaction, so OnDone must wait for it.
    AddHold();
    StartRead(&incoming_);
    StartCall();
  }

  ~GrpcLeaseStream() override {
    ctx_->TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    DropHold(lock);
    lock.lock();
    cv_.wait(lock, [&] { return done_; });
  }

  bool Send(const pb::LeaseGrant& grant) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || closing_ || ended_) return false;
    sending_.push_back(grant);
    if (sending_.size() == 1) StartWrite(&sending_.front());
    return true;
  }

  absl::StatusOr<bool> Next(std::chrono::steady_clock::time_point deadline, pb::LeaseProgress* out,
                            std::chrono::steady_clock::time_point* received) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !received_.empty() || done_; })) {
      return absl::DeadlineExceededError("no answer to a lease grant in time");
    }
    if (!received_.empty()) {
      *out = std::move(received_.front().first);
      if (received != nullptr) *received = received_.front().second;
      received_.pop_front();
      return true;
    }
    if (status_.ok()) return false;
    return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(status_.error_code())),
                        status_.error_message());
  }

  void Close() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (closing_) return;
    closing_ = true;
    if (sending_.empty() && !ended_) StartWritesDone();
    DropHold(lock);
  }

  void OnReady(std::function<void()> ready) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (received_.empty() && !done_) {
      ready_ = std::move(ready);
      return;
    }
    ready_ = nullptr;
    lock.unlock();
    ready();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    sending_.pop_front();
    if (!ok) {
      sending_.clear();  // the stream is over; Next reports how
      return;
    }
    if (!sending_.empty()) {
      StartWrite(&sending_.front());
    } else if (closing_ && !ended_) {
      StartWritesDone();
    }
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ok) {
      // The stream is over (the verifier finished it, or it was cancelled):
      // no more grants can matter, and OnDone, which brings the status,
      // waits for the hold.
      ended_ = true;
      DropHold(lock);
      return;
    }
    received_.emplace_back(std::move(incoming_), std::chrono::steady_clock::now());
    incoming_.Clear();
    StartRead(&incoming_);
    cv_.notify_all();
    if (std::function<void()> ready = TakeReady(lock)) ready();
  }

  void OnDone(const grpc::Status& s) override {
    std::unique_lock<std::mutex> lock(mu_);
    done_ = true;
    status_ = s;
    cv_.notify_all();
    if (std::function<void()> ready = TakeReady(lock)) ready();
  }

 private:
  // Removes the hold taken at the start, once; `lock` (held) is released,
  // since OnDone may follow at once.
  void DropHold(std::unique_lock<std::mutex>& lock) {
    const bool held = !hold_removed_;
    hold_removed_ = true;
    lock.unlock();
    if (held) RemoveHold();
  }

  // The OnReady callback waiting (empty if none), taken under `lock`,
  // which is released: the caller makes it outside the lock.
  std::function<void()> TakeReady(std::unique_lock<std::mutex>& lock) {
    std::function<void()> ready = std::move(ready_);
    ready_ = nullptr;
    lock.unlock();
    return ready;
  }

  std::unique_ptr<grpc::ClientContext> ctx_;
  std::mutex mu_;
  std::condition_variable cv_;   // a message or OnDone (Next, the destructor)
  std::function<void()> ready_;  // OnReady's, while nothing is ready
  pb::LeaseProgress incoming_;
  std::deque<pb::LeaseGrant> sending_;  // the front is being written
  std::deque<std::pair<pb::LeaseProgress, std::chrono::steady_clock::time_point>> received_;
  bool closing_ = false;  // Close: half-closed
  bool ended_ = false;    // the read side ended: the stream is over
  bool hold_removed_ = false;
  bool done_ = false;
  grpc::Status status_;
};

class GrpcVerifierClient final : public GrpcWorker<VerifierClient, pb::Verifier> {
 public:
  using GrpcWorker::GrpcWorker;
  absl::Status Open(const WorkerCallOptions& o, const pb::VerifierOpenRequest& req,
                    pb::VerifierOpenResponse* resp) override {
    return Call(WorkerStub(), &pb::Verifier::Stub::Open, o, req, resp);
  }
  absl::Status Load(const WorkerCallOptions& o, const pb::LoadRequest& req,
                    pb::LoadResponse* resp) override {
    return Call(WorkerStub(), &pb::Verifier::Stub::Load, o, req, resp);
  }
  absl::Status Verify(const WorkerCallOptions& o, const pb::VerifyRequest& req,
                      pb::VerifyResponse* resp) override {
    return Call(WorkerStub(), &pb::Verifier::Stub::Verify, o, req, resp);
  }
  absl::Status Round(const WorkerCallOptions& o, const pb::RoundRequest& req,
                     pb::RoundResponse* resp) override {
    return Call(WorkerStub(), &pb::Verifier::Stub::Round, o, req, resp);
  }
  absl::Status Ingest(const WorkerCallOptions& o, const pb::IngestRequest& req,
                      pb::IngestResponse* resp) override {
    return Call(WorkerStub(), &pb::Verifier::Stub::Ingest, o, req, resp);
  }
  absl::StatusOr<std::unique_ptr<LeaseStream>> OpenLease(const WorkerCallOptions& o) override {
    return std::make_unique<GrpcLeaseStream>(WorkerStub(), o);
  }
  void StartOpen(const WorkerCallOptions& o, const pb::VerifierOpenRequest& req,
                 pb::VerifierOpenResponse* resp, CallDone done) override {
    StartCall(WorkerStub(), &Async::Open, o, req, resp, std::move(done));
  }
  void StartLoad(const WorkerCallOptions& o, const pb::LoadRequest& req, pb::LoadResponse* resp,
                 CallDone done) override {
    StartCall(WorkerStub(), &Async::Load, o, req, resp, std::move(done));
  }
  void StartVerify(const WorkerCallOptions& o, const pb::VerifyRequest& req,
                   pb::VerifyResponse* resp, CallDone done) override {
    StartCall(WorkerStub(), &Async::Verify, o, req, resp, std::move(done));
  }
  void StartRound(const WorkerCallOptions& o, const pb::RoundRequest& req, pb::RoundResponse* resp,
                  CallDone done) override {
    StartCall(WorkerStub(), &Async::Round, o, req, resp, std::move(done));
  }
  void StartIngest(const WorkerCallOptions& o, const pb::IngestRequest& req,
                   pb::IngestResponse* resp, CallDone done) override {
    StartCall(WorkerStub(), &Async::Ingest, o, req, resp, std::move(done));
  }
};

class GrpcDrafterClient final : public GrpcWorker<DrafterClient, pb::Drafter> {
 public:
  using GrpcWorker::GrpcWorker;
  absl::Status Open(const WorkerCallOptions& o, const pb::DrafterOpenRequest& req,
                    pb::DrafterOpenResponse* resp) override {
    return Call(WorkerStub(), &pb::Drafter::Stub::Open, o, req, resp);
  }
  absl::Status Draft(const WorkerCallOptions& o, const pb::DraftRequest& req,
                     pb::DraftResponse* resp) override {
    return Call(WorkerStub(), &pb::Drafter::Stub::Draft, o, req, resp);
  }
  absl::Status Commit(const WorkerCallOptions& o, const pb::CommitRequest& req,
                      pb::CommitResponse* resp) override {
    return Call(WorkerStub(), &pb::Drafter::Stub::Commit, o, req, resp);
  }
  void StartOpen(const WorkerCallOptions& o, const pb::DrafterOpenRequest& req,
                 pb::DrafterOpenResponse* resp, CallDone done) override {
    StartCall(WorkerStub(), &Async::Open, o, req, resp, std::move(done));
  }
  void StartDraft(const WorkerCallOptions& o, const pb::DraftRequest& req, pb::DraftResponse* resp,
                  CallDone done) override {
    StartCall(WorkerStub(), &Async::Draft, o, req, resp, std::move(done));
  }
  void StartCommit(const WorkerCallOptions& o, const pb::CommitRequest& req,
                   pb::CommitResponse* resp, CallDone done) override {
    StartCall(WorkerStub(), &Async::Commit, o, req, resp, std::move(done));
  }
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
