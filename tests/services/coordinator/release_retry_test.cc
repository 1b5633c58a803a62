// ReleaseRetry with a fake release call: a failed release is retried until
// the worker answers, one unreachable worker costs one call per pass (not
// one per session), retries stop after max_attempts (none at 0), the queue is bounded,
// and the background thread frees a session once its worker is back.
#include "services/coordinator/release_retry.h"

#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace vc::coordinator {
namespace {

using std::chrono::milliseconds;

// Workers that are down (by pool and index) fail every release; the others
// release. Records every call.
struct FakeWorkers {
  std::mutex mu;
  std::map<std::pair<int, int>, bool> down;
  std::vector<std::pair<int, uint64_t>> calls;  // (index, session)
  std::vector<uint64_t> released;
  void SetDown(WorkerPool pool, int i, bool d) {
    std::lock_guard<std::mutex> lock(mu);
    down[{static_cast<int>(pool), i}] = d;
  }
  absl::Status operator()(WorkerPool pool, int i, uint64_t session) {
    std::lock_guard<std::mutex> lock(mu);
    calls.emplace_back(i, session);
    if (down[{static_cast<int>(pool), i}]) return absl::DeadlineExceededError("paused");
    released.push_back(session);
    return absl::OkStatus();
  }
  size_t Calls() {
    std::lock_guard<std::mutex> lock(mu);
    return calls.size();
  }
};

ReleaseRetryOptions Immediate() {
  ReleaseRetryOptions o;
  o.first_backoff = milliseconds(0);  // every entry is due at once: RunDue drives the test
  o.max_backoff = milliseconds(0);
  return o;
}

TEST(ReleaseRetryTest, RetriesUntilTheWorkerAnswers) {
  FakeWorkers fake;
  ReleaseRetry retry([&](WorkerPool p, int i, uint64_t s) { return fake(p, i, s); }, Immediate());
  fake.SetDown(WorkerPool::kDrafter, 1, true);
  ASSERT_TRUE(retry.Add(WorkerPool::kDrafter, 1, 7));
  retry.RunDue();
  retry.RunDue();
  EXPECT_EQ(retry.pending(), 1u);
  EXPECT_TRUE(fake.released.empty());
  fake.SetDown(WorkerPool::kDrafter, 1, false);
  retry.RunDue();
  EXPECT_EQ(retry.pending(), 0u);
  EXPECT_EQ(fake.released, std::vector<uint64_t>{7});
  const ReleaseRetry::Stats st = retry.stats();
  EXPECT_EQ(st.queued, 1);
  EXPECT_EQ(st.released, 1);
  EXPECT_EQ(st.gave_up, 0);
}

TEST(ReleaseRetryTest, OneCallPerPassForAnUnreachableWorker) {
  FakeWorkers fake;
  ReleaseRetry retry([&](WorkerPool p, int i, uint64_t s) { return fake(p, i, s); }, Immediate());
  fake.SetDown(WorkerPool::kVerifier, 0, true);
  for (uint64_t s = 1; s <= 5; ++s) ASSERT_TRUE(retry.Add(WorkerPool::kVerifier, 0, s));
  ASSERT_TRUE(retry.Add(WorkerPool::kVerifier, 1, 100));  // another worker, up
  retry.RunDue();
  // One failed call to worker 0 (its other sessions wait), one to worker 1.
  EXPECT_EQ(fake.Calls(), 2u);
  EXPECT_EQ(fake.released, std::vector<uint64_t>{100});
  EXPECT_EQ(retry.pending(), 5u);
  fake.SetDown(WorkerPool::kVerifier, 0, false);
  retry.RunDue();
  EXPECT_EQ(retry.pending(), 0u);
  EXPECT_EQ(fake.released.size(), 6u);
}

TEST(ReleaseRetryTest, GivesUpAfterMaxAttempts) {
  FakeWorkers fake;
  ReleaseRetryOptions o = Immediate();
  o.max_attempts = 3;
  std::map<std::string, int> outcomes;
  ReleaseRetry retry(
      [&](WorkerPool p, int i, uint64_t s) { return fake(p, i, s); }, o,
      [&](ReleaseRetry::Outcome out) { ++outcomes[ReleaseRetry::OutcomeName(out)]; });
  fake.SetDown(WorkerPool::kDrafter, 0, true);
  ASSERT_TRUE(retry.Add(WorkerPool::kDrafter, 0, 1));
  for (int pass = 0; pass < 10; ++pass) retry.RunDue();
  EXPECT_EQ(fake.Calls(), 3u);
  EXPECT_EQ(retry.pending(), 0u);
  EXPECT_EQ(retry.stats().gave_up, 1);
  EXPECT_EQ(outcomes["queued"], 1);
  EXPECT_EQ(outcomes["gave_up"], 1);
  EXPECT_EQ(outcomes["released"], 0);
}

// --release-retry-attempts 0: nothing is queued or retried.
TEST(ReleaseRetryTest, ZeroAttemptsTurnsRetriesOff) {
  FakeWorkers fake;
  ReleaseRetryOptions o = Immediate();
  o.max_attempts = 0;
  ReleaseRetry retry([&](WorkerPool p, int i, uint64_t s) { return fake(p, i, s); }, o);
  EXPECT_FALSE(retry.Add(WorkerPool::kDrafter, 0, 1));
  retry.RunDue();
  EXPECT_EQ(fake.Calls(), 0u);
  EXPECT_EQ(retry.pending(), 0u);
  EXPECT_EQ(retry.stats().queued, 0);
  EXPECT_EQ(retry.stats().gave_up, 1);
}

TEST(ReleaseRetryTest, TheQueueIsBounded) {
  FakeWorkers fake;
  ReleaseRetryOptions o = Immediate();
  o.max_pending = 3;
  ReleaseRetry retry([&](WorkerPool p, int i, uint64_t s) { return fake(p, i, s); }, o);
  for (uint64_t s = 0; s < 3; ++s) EXPECT_TRUE(retry.Add(WorkerPool::kDrafter, 0, s));
  EXPECT_FALSE(retry.Add(WorkerPool::kDrafter, 0, 3));
  EXPECT_EQ(retry.pending(), 3u);
  EXPECT_EQ(retry.stats().dropped, 1);
  retry.RunDue();
  EXPECT_TRUE(retry.Add(WorkerPool::kDrafter, 0, 4));  // room again
}

TEST(ReleaseRetryTest, WaitsForTheBackoffBeforeRetrying) {
  FakeWorkers fake;
  ReleaseRetryOptions o;
  o.first_backoff = std::chrono::hours(1);
  o.max_backoff = std::chrono::hours(1);
  ReleaseRetry retry([&](WorkerPool p, int i, uint64_t s) { return fake(p, i, s); }, o);
  ASSERT_TRUE(retry.Add(WorkerPool::kVerifier, 0, 1));
  retry.RunDue();
  EXPECT_EQ(fake.Calls(), 0u);  // not due for an hour
  EXPECT_EQ(retry.pending(), 1u);
}

TEST(ReleaseRetryTest, TheThreadReleasesOnceTheWorkerIsBack) {
  FakeWorkers fake;
  ReleaseRetryOptions o;
  o.first_backoff = milliseconds(10);
  o.max_backoff = milliseconds(20);
  o.max_attempts = 1000000;  // never gives up while the test waits
  ReleaseRetry retry([&](WorkerPool p, int i, uint64_t s) { return fake(p, i, s); }, o);
  retry.Start();
  fake.SetDown(WorkerPool::kDrafter, 0, true);
  ASSERT_TRUE(retry.Add(WorkerPool::kDrafter, 0, 42));
  // It keeps trying while the worker is down...
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (fake.Calls() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_GE(fake.Calls(), 3u);
  EXPECT_EQ(retry.stats().released, 0);
  // ...and frees the session once it answers.
  fake.SetDown(WorkerPool::kDrafter, 0, false);
  while (retry.pending() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(retry.pending(), 0u);
  EXPECT_EQ(retry.stats().released, 1);
  retry.Stop();
  EXPECT_FALSE(retry.Add(WorkerPool::kDrafter, 0, 43));  // stopped: refused
}

}  // namespace
}  // namespace vc::coordinator
