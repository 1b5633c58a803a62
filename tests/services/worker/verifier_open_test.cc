// VerifierService::Open against a caller that goes away: the service in
// this process behind a real gRPC server, the stories260K model, and no
// store (an Open without a stored prefix never reaches it). The options'
// before_open_kept seam holds an Open after its session is built until the
// caller has seen DEADLINE_EXCEEDED and the cancellation has reached the
// server; such an Open must not keep its session (its caller will never use
// or release it; only the idle timeout, 10 minutes here, would free it).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/kvstore/chunk_key.h"
#include "common/metrics/metrics.h"
#include "common/model/model.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/common/store_client.h"
#include "services/worker/verifier_service.h"
#include "tests/loopback_server.h"
#include "tests/services/cluster/cluster_test_text.h"
#include "tests/services/worker/worker_test_util.h"

namespace vc::worker {
namespace {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

class VerifierOpenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(clustertest::StoriesModelPath()).good())
      GTEST_SKIP() << "test model not found: " << clustertest::StoriesModelPath();
    auto model = Model::Load(clustertest::StoriesModelPath());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto engine = testing::OneThreadEngine(*model_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    // These Opens never fetch.
    auto store = testing::NowhereStore();
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    VerifierOptions vo;
    vo.session_idle = std::chrono::seconds(600);
    vo.before_open_kept = [this](grpc::CallbackServerContext* ctx) { Gate(ctx); };
    service_ = std::make_unique<VerifierService>(engine_.get(), kvstore::ComputeModelId(*model_),
                                                 store_.get(), &registry_, vo);
    test_support::LoopbackServer served = test_support::ServeOnLoopback(service_.get());
    server_ = std::move(served.server);
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(served.port, 0);
    stub_ = pb::Verifier::NewStub(
        grpc::CreateChannel(served.address, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    OpenGate();  // never leave a handler held
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (service_) service_->Shutdown();
  }

  // Holds an Open (while `held_` is set) until the test opens the gate,
  // then until the server sees the caller's cancellation (bounded: a stuck
  // handler would hold the test).
  void Gate(grpc::CallbackServerContext* ctx) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!hold_) return;
    entered_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return !hold_; });
    lock.unlock();
    const auto limit = Clock::now() + std::chrono::seconds(30);
    while (!ctx->IsCancelled() && Clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    saw_cancel_ = ctx->IsCancelled();
    gate_done_ = true;
  }

  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }

  grpc::Status CallOpen(uint64_t session_id, std::chrono::milliseconds timeout) {
    pb::VerifierOpenRequest req;
    req.set_session_id(session_id);
    for (int32_t t : {1, 2, 3, 4}) req.add_prompt(t);  // no stored prefix
    pb::VerifierOpenResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    return stub_->Open(&ctx, req, &resp);
  }

  int64_t Sessions() {
    pb::WorkerInfoRequest req;
    pb::WorkerInfoResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status s = stub_->Info(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() ? resp.sessions() : -1;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<daemon::StoreClient> store_;
  metrics::Registry registry_;
  std::unique_ptr<VerifierService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Verifier::Stub> stub_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  bool entered_ = false;
  std::atomic<bool> saw_cancel_{false};
  std::atomic<bool> gate_done_{false};
};

TEST_F(VerifierOpenTest, OpenInTimeKeepsItsSession) {
  const grpc::Status s = CallOpen(1, std::chrono::seconds(30));
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Sessions(), 1);
}

TEST_F(VerifierOpenTest, DropsAnOpenWhoseCallerGaveUp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  // The caller gives up after 1 s while its Open is held in the verifier.
  grpc::Status status;
  std::thread caller([&] { status = CallOpen(7, std::chrono::milliseconds(1000)); });
  {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60), [&] { return entered_; }))
        << "the Open never reached the verifier";
  }
  caller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  OpenGate();
  const auto limit = Clock::now() + std::chrono::seconds(60);
  while (!gate_done_.load() && Clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(gate_done_.load()) << "the held Open never went on";
  ASSERT_TRUE(saw_cancel_.load()) << "the server never saw the caller's cancellation";
  // The handler keeps or drops the session right after the gate; Info
  // waits for the same lock.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Sessions(), 0) << "a session from an Open whose caller gave up";
}

}  // namespace
}  // namespace vc::worker
