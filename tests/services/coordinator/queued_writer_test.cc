// QueuedWriteReactor (services/coordinator/queued_writer.h) on a real
// in-process gRPC server: messages written from the service's own threads
// arrive whole and in order, then the status; a failed or cancelled call
// makes Write answer false and calls the cancel hook; the queue's bound
// holds a writer up while the client does not read, and one that awaits
// room (WhenWritable) is told of it, or of a Break; and thousands of calls
// finished from another thread right after (or without) their last write
// all end cleanly (the path of Generate's call that once touched its freed
// mutex; the sanitised runs check the memory).
#include "services/coordinator/queued_writer.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/loopback_server.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc::coordinator {
namespace {

namespace pb = ::vericache::v1;

// What the writers did, across calls.
struct Tally {
  std::atomic<int> writes_started{0};
  std::atomic<int> writes_ended{0};
  std::atomic<int> cancels{0};
  std::atomic<int> accepted_writes{0};  // Write answered true
  std::atomic<int> refused_writes{0};   // Write answered false
  // Writers that await room (WhenWritable) before each Write:
  std::atomic<int> told_room{0};          // a WhenWritable wait ended
  std::atomic<int> told_without_room{0};  // ... and Writable was still false
};

class TestWriter final : public QueuedWriteReactor<pb::GenerateResponse> {
 public:
  TestWriter(grpc::CallbackServerContext* ctx, size_t max_queued, Tally* tally)
      : QueuedWriteReactor(max_queued), ctx_(ctx), tally_(tally) {}

  // As the coordinator's call abandons a stalled reader.
  void Abandon() {
    Break();
    ctx_->TryCancel();
  }

 private:
  void WriteStarted() override { tally_->writes_started.fetch_add(1); }
  void WriteEnded() override { tally_->writes_ended.fetch_add(1); }
  void Cancelled() override { tally_->cancels.fetch_add(1); }

  grpc::CallbackServerContext* const ctx_;
  Tally* const tally_;
};

// Runs jobs on two threads of its own (the service's "runners").
class Runners {
 public:
  Runners() {
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~Runners() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Generate streams max_new_tokens messages (message i holds token i; with a
// request id starting "big", 1 KiB of padding too), then finishes OK, or
// INVALID_ARGUMENT when the request id is "fail". The writes and the finish
// happen on a runner thread. With a request id ending "await", the runner
// awaits room before each Write (Writable, else WhenWritable), as the
// coordinator's coroutines do, instead of letting Write wait; with one
// ending "abandon", the first time there is no room it registers a
// WhenWritable waiter and then abandons the reader (Break and TryCancel),
// as a Cancel of a stalled request does.
class StreamingService final : public pb::Coordinator::CallbackService {
 public:
  StreamingService(size_t max_queued, Tally* tally) : max_queued_(max_queued), tally_(tally) {}

  grpc::ServerWriteReactor<pb::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const pb::GenerateRequest* req) override {
    auto* w = new TestWriter(ctx, max_queued_, tally_);
    const int n = req->max_new_tokens();
    const std::string& id = req->request_id();
    const bool fail = id == "fail", big = id.rfind("big", 0) == 0;
    auto ends_with = [&](const std::string& tail) {
      return id.size() >= tail.size() &&
             id.compare(id.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool await_room = ends_with("await"), abandon = ends_with("abandon");
    runners_.Post([w, n, fail, big, await_room, abandon, tally = tally_] {
      for (int i = 0; i < n; ++i) {
        pb::GenerateResponse msg;
        msg.add_tokens(i);
        if (big) msg.set_request_id(std::string(1024, 'x'));
        if (abandon && !w->Writable()) {
          auto told = std::make_shared<std::promise<void>>();
          std::future<void> room = told->get_future();
          w->WhenWritable([told] { told->set_value(); });
          w->Abandon();
          // Told by the break, long before the 60 s in which the client
          // reads nothing.
          if (room.wait_for(std::chrono::seconds(30)) == std::future_status::ready) {
            tally->told_room.fetch_add(1);
          }
        }
        if (await_room && !w->Writable()) {
          auto told = std::make_shared<std::promise<void>>();
          std::future<void> room = told->get_future();
          w->WhenWritable([told] { told->set_value(); });
          room.wait();
          tally->told_room.fetch_add(1);
          if (!w->Writable()) tally->told_without_room.fetch_add(1);
        }
        if (!w->Write(msg)) {
          tally->refused_writes.fetch_add(1);
          break;
        }
        tally->accepted_writes.fetch_add(1);
      }
      w->FinishWhenWritten(fail ? grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "nope")
                                : grpc::Status::OK);
    });
    return w;
  }

 private:
  const size_t max_queued_;
  Tally* const tally_;
  Runners runners_;  // joined before the service goes
};

class QueuedWriterTest : public ::testing::Test {
 protected:
  void Start(size_t max_queued) {
    service_ = std::make_unique<StreamingService>(max_queued, &tally_);
    test_support::LoopbackServer served = test_support::ServeOnLoopback(service_.get());
    server_ = std::move(served.server);
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(served.port, 0);
    stub_ = pb::Coordinator::NewStub(
        grpc::CreateChannel(served.address, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_.reset();
    service_.reset();
  }

  // One call: the tokens received, in order, and the status.
  grpc::Status Call(int n, const std::string& id, std::vector<int>* tokens) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pb::GenerateRequest req;
    req.set_max_new_tokens(n);
    req.set_request_id(id);
    auto reader = stub_->Generate(&ctx, req);
    pb::GenerateResponse msg;
    while (reader->Read(&msg)) {
      for (int32_t t : msg.tokens()) tokens->push_back(t);
    }
    return reader->Finish();
  }

  Tally tally_;
  std::unique_ptr<StreamingService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

TEST_F(QueuedWriterTest, EveryMessageArrivesInOrderThenTheStatus) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_queued=*/4));
  for (int n : {0, 1, 3, 40}) {
    for (const std::string id : {"ok", "fail"}) {
      std::vector<int> tokens;
      const grpc::Status s = Call(n, id, &tokens);
      std::vector<int> want(n);
      std::iota(want.begin(), want.end(), 0);
      EXPECT_EQ(tokens, want) << n << " " << id;
      if (id == "fail") {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << n;
        EXPECT_EQ(s.error_message(), "nope");
      } else {
        EXPECT_TRUE(s.ok()) << n << ": " << s.error_message();
      }
    }
  }
  EXPECT_EQ(tally_.writes_started.load(), 2 * (0 + 1 + 3 + 40));
  EXPECT_EQ(tally_.writes_ended.load(), tally_.writes_started.load());
  EXPECT_EQ(tally_.refused_writes.load(), 0);
}

// A client that reads nothing holds its writer at the queue's bound: once
// the transport takes no more, the writer has at most max_queued messages
// queued beyond the writes gRPC started, and waits; the client's cancel
// then fails the blocked Write and calls the hook.
TEST_F(QueuedWriterTest, AReaderThatStopsHoldsTheWriterUpAndItsCancelReleasesIt) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_queued=*/2));
  constexpr int kMessages = 50000;  // 50 MiB: far more than the transport buffers
  grpc::ClientContext ctx;
  pb::GenerateRequest req;
  req.set_max_new_tokens(kMessages);
  req.set_request_id("big");
  auto reader = stub_->Generate(&ctx, req);
  pb::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));  // the stream is under way
  // Give the writer time to fill what it can; it must stop well short.
  int before = -1;
  for (int i = 0; i < 100 && tally_.writes_started.load() != before; ++i) {
    before = tally_.writes_started.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LT(tally_.writes_started.load(), kMessages / 2);
  EXPECT_LE(tally_.accepted_writes.load(), tally_.writes_started.load() + 2);
  EXPECT_EQ(tally_.refused_writes.load(), 0);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The blocked Write wakes under the queue's lock; the hook runs after
  // OnCancel lets it go, so the two are seen in either order.
  for (int i = 0; i < 1000 && (tally_.refused_writes.load() == 0 || tally_.cancels.load() == 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(tally_.refused_writes.load(), 1);  // the blocked Write answered false
  EXPECT_EQ(tally_.cancels.load(), 1);
}

// A writer that awaits room instead of waiting in Write: behind a client
// that stops reading it is told of room only when there is room (a write
// ended), and every message still arrives, in order; a cancel tells a
// writer that is waiting, and its Write then fails.
TEST_F(QueuedWriterTest, AWriterAwaitingRoomIsToldWhenThereIsRoomOrTheCallEnds) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_queued=*/2));
  constexpr int kMessages = 20000;  // 20 MiB: more than the transport buffers
  for (const bool cancel : {false, true}) {
    tally_.told_room = 0;
    tally_.refused_writes = 0;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    pb::GenerateRequest req;
    req.set_max_new_tokens(kMessages);
    req.set_request_id("big-await");
    auto reader = stub_->Generate(&ctx, req);
    pb::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    // Until the writer has had to wait for room at least once.
    for (int i = 0; i < 2000 && tally_.told_room.load() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!cancel && i % 20 == 19) {
        ASSERT_TRUE(reader->Read(&msg));  // a slow reader
      }
    }
    if (cancel) {
      // The writer is (or soon will be) waiting again: the cancel tells it.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ctx.TryCancel();
      while (reader->Read(&msg)) {
      }
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
      for (int i = 0; i < 1000 && tally_.refused_writes.load() == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_EQ(tally_.refused_writes.load(), 1) << "the writer told by the cancel";
      continue;
    }
    EXPECT_GT(tally_.told_room.load(), 0) << "the writer never had to wait for room";
    int next = msg.tokens(0) + 1;
    int out_of_order = 0;
    while (reader->Read(&msg)) {
      if (msg.tokens(0) != next) ++out_of_order;
      next = msg.tokens(0) + 1;
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(next, kMessages);
    EXPECT_EQ(out_of_order, 0);
    EXPECT_EQ(tally_.refused_writes.load(), 0);
  }
  EXPECT_EQ(tally_.told_without_room.load(), 0);
}

// A writer that gives up on a reader that stopped reading (Break, and the
// call cancelled): its waiter is told at once, its next Write answers false
// without waiting, the write in flight ends, and the client sees the stream
// cancelled.
TEST_F(QueuedWriterTest, ABreakReleasesAWriterWhoseReaderStopped) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_queued=*/2));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  pb::GenerateRequest req;
  req.set_max_new_tokens(50000);  // 50 MiB: far more than the transport buffers
  req.set_request_id("big-abandon");
  auto reader = stub_->Generate(&ctx, req);
  pb::GenerateResponse msg;
  // The client reads nothing until the writer has given up (which may be
  // before its first message arrives: with a queue of 2 the writer finds no
  // room at once).
  for (int i = 0; i < 6000 && tally_.refused_writes.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(tally_.told_room.load(), 1) << "the waiter was not told by the break";
  EXPECT_EQ(tally_.refused_writes.load(), 1) << "the Write after the break did not fail";
  EXPECT_LT(tally_.accepted_writes.load(), 50000 / 2);
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  for (int i = 0; i < 1000 && tally_.writes_ended.load() != tally_.writes_started.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(tally_.writes_ended.load(), tally_.writes_started.load());
}

// Many calls finished by the runner thread at once (nothing queued) or
// right after their only write: every one ends with its status, and every
// call object is deleted by gRPC while its runner may still be returning
// from FinishWhenWritten.
TEST_F(QueuedWriterTest, CallsFinishedFromAnotherThreadAllEndCleanly) {
  ASSERT_NO_FATAL_FAILURE(Start(/*max_queued=*/16));
  constexpr int kClients = 4, kCallsEach = 400;
  std::atomic<int> bad{0};
  std::vector<std::thread> clients;
  clients.reserve(kClients);
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kCallsEach; ++i) {
        const int n = (i + c) % 2;
        const bool fail = i % 3 == 0;
        std::vector<int> tokens;
        const grpc::Status s = Call(n, fail ? "fail" : "ok", &tokens);
        const bool right = static_cast<int>(tokens.size()) == n &&
                           (fail ? s.error_code() == grpc::StatusCode::INVALID_ARGUMENT : s.ok());
        if (!right) bad.fetch_add(1);
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(tally_.writes_ended.load(), tally_.writes_started.load());
  EXPECT_EQ(tally_.cancels.load(), 0);
}

}  // namespace
}  // namespace vc::coordinator
