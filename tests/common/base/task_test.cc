// Task, Spawn, BlockOn and Suspend (common/base/task.h) over the Executor
// (common/base/executor.h).
#include "common/base/task.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/executor.h"
#include "gtest/gtest.h"

namespace vc {
namespace {

Task<int> Constant(int v) { co_return v; }

Task<int> SumOfConstants(int n) {
  int sum = 0;
  for (int i = 1; i <= n; ++i) sum += co_await Constant(i);
  co_return sum;
}

Task<absl::StatusOr<std::string>> Fails() { co_return absl::NotFoundError("no such thing"); }

Task<int> Depth(int n) {
  if (n == 0) co_return 0;
  co_return 1 + co_await Depth(n - 1);
}

TEST(TaskTest, AwaitsChainsAndReturnsTheirValues) {
  EXPECT_EQ(BlockOn(SumOfConstants(100)), 5050);
  EXPECT_EQ(BlockOn(Fails()).status().code(), absl::StatusCode::kNotFound);
}

TEST(TaskTest, AwaitsInALoopEachReturnTheirOwnValue) {
  EXPECT_EQ(BlockOn(SumOfConstants(1000)), 500500);
}

TEST(TaskTest, RecursiveAwaitsReturnThroughEveryLevel) { EXPECT_EQ(BlockOn(Depth(500)), 500); }

// Waits for `resume` to be called from another thread, then reports the
// thread it continued on.
Task<std::thread::id> ContinueAfterAnotherThread(Executor* ex, std::thread::id* resumer) {
  co_await Suspend(ex, [resumer](auto resume) {
    std::thread t([resume, resumer] {
      *resumer = std::this_thread::get_id();
      resume();
    });
    t.detach();
  });
  co_return std::this_thread::get_id();
}

TEST(TaskTest, SuspendContinuesOnTheExecutorNotOnTheResumingThread) {
  Executor ex;
  std::thread::id resumer;
  const std::thread::id ran_on = BlockOn(ContinueAfterAnotherThread(&ex, &resumer));
  EXPECT_NE(ran_on, resumer);
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

Task<int> ResumedInsideStart(Executor* ex) {
  co_await Suspend(ex, [](auto resume) { resume(); });
  co_return 7;
}

TEST(TaskTest, SuspendAcceptsAResumeFromInsideStart) {
  Executor ex;
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(BlockOn(ResumedInsideStart(&ex)), 7);
}

TEST(TaskTest, SpawnCallsDoneWithTheResult) {
  std::atomic<int> got{0};
  Spawn(Constant(42), [&](int v) { got = v; });
  EXPECT_EQ(got.load(), 42);  // nothing suspended: done ran inline
}

TEST(ExecutorTest, AddsThreadsWhileEveryThreadIsBlocked) {
  Executor ex(ExecutorOptions{.max_threads = 4});
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  // Each waits until all four run at once: only four threads finish them.
  for (int i = 0; i < 4; ++i) {
    ex.Post([&] {
      ++started;
      while (started.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++finished;
    });
  }
  while (finished.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(ex.threads(), 4);
}

TEST(ExecutorTest, NeverRunsMoreThanMaxThreadsAndRunsEverythingPosted) {
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::atomic<int> done{0};
  {
    Executor ex(ExecutorOptions{.max_threads = 2});
    for (int i = 0; i < 50; ++i) {
      ex.Post([&] {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        --running;
        ++done;
      });
    }
    EXPECT_LE(ex.threads(), 2);
  }  // the destructor runs what is queued
  EXPECT_EQ(done.load(), 50);
  EXPECT_LE(most.load(), 2);
}

// Runs `n` posts at once on `ex` (each waits for all to start), so the
// executor has n threads when it returns.
void RunAtOnce(Executor& ex, int n) {
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  for (int i = 0; i < n; ++i) {
    ex.Post([&] {
      ++started;
      while (started.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++finished;
    });
  }
  while (finished.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A burst's threads end once idle for idle_timeout, all but one; the
// executor then grows again for the next burst and runs everything.
TEST(ExecutorTest, IdleThreadsEndAfterTheIdleTimeout) {
  Executor ex(ExecutorOptions{.max_threads = 4, .idle_timeout = std::chrono::milliseconds(50)});
  for (int round = 0; round < 3; ++round) {
    RunAtOnce(ex, 4);
    EXPECT_EQ(ex.threads(), 4) << round;
    for (int i = 0; i < 2000 && ex.threads() > 1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(ex.threads(), 1) << round;
  }
  std::atomic<int> done{0};
  for (int i = 0; i < 100; ++i) ex.Post([&] { ++done; });
  for (int i = 0; i < 2000 && done.load() < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(done.load(), 100);
}

TEST(ExecutorTest, WithoutAnIdleTimeoutThreadsStay) {
  Executor ex(ExecutorOptions{.max_threads = 3, .idle_timeout = std::chrono::milliseconds(0)});
  RunAtOnce(ex, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(ex.threads(), 3);
}

TEST(ExecutorTest, WorkPostedByWorkRunsBeforeTheDestructorReturns) {
  std::atomic<int> done{0};
  {
    Executor ex(ExecutorOptions{.max_threads = 1});
    ex.Post([&] { ex.Post([&] { ++done; }); });
  }
  EXPECT_EQ(done.load(), 1);
}

}  // namespace
}  // namespace vc
