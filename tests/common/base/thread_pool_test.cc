#include "common/base/thread_pool.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace vc {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LE(0, b);
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
      }
    }
  }
}

TEST(ThreadPoolTest, ManyBackToBackJobsDoNotLoseWork) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 2000; ++job) {
    pool.ParallelFor(37, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  }
  EXPECT_EQ(total.load(), 2000 * 37);
}

TEST(ThreadPoolTest, UsesMoreThanOneThreadWhenAsked) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.num_threads(), 2);
  // Each piece waits (bounded) until pieces are running on two different
  // threads at once; with a pool that never hands work to its worker, the
  // wait runs out and the test fails.
  std::mutex mu;
  std::set<std::thread::id> inside;
  bool saw_two = false;
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      inside.insert(std::this_thread::get_id());
      if (inside.size() >= 2) saw_two = true;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::lock_guard<std::mutex> lock(mu);
      if (saw_two) break;
    }
  });
  EXPECT_TRUE(saw_two);
}

// Plain (non-atomic) writes made by any piece are visible to the caller once
// ParallelFor returns, job after job, whether the threads spin, block at
// once or spin long enough never to block (TSan checks the happens-before).
TEST(ThreadPoolTest, EveryPiecesWritesAreVisibleWhenParallelForReturns) {
  for (const int spin_us : {0, 50, 100000}) {
    ThreadPool pool(3, ThreadPoolOptions{.spin_us = spin_us});
    std::vector<int64_t> out(257);
    for (int job = 0; job < 300; ++job) {
      pool.ParallelFor(static_cast<int64_t>(out.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = int64_t{job} * 1000 + i;
      });
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], int64_t{job} * 1000 + static_cast<int64_t>(i)) << "spin " << spin_us;
      }
    }
  }
}

// A pool whose workers have gone to sleep (after their spin) still takes
// the next job, and one destroyed while its workers spin ends promptly.
TEST(ThreadPoolTest, SleepingWorkersWakeForTheNextJobAndSpinningOnesStop) {
  ThreadPool pool(2, ThreadPoolOptions{.spin_us = 1});
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 20; ++job) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the worker sleeps
    pool.ParallelFor(64, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  }
  EXPECT_EQ(total.load(), 20 * 64);
  for (int i = 0; i < 20; ++i) {
    ThreadPool spinning(4, ThreadPoolOptions{.spin_us = 1000000});
    spinning.ParallelFor(16, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  }  // each destructor must not wait out the second of spinning
  EXPECT_EQ(total.load(), 20 * 64 + 20 * 16);
}

TEST(ThreadPoolTest, ZeroOrNegativeThreadsMeansInline) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int64_t covered = 0;
  pool.ParallelFor(10, 1, [&](int64_t b, int64_t e) { covered += e - b; });
  EXPECT_EQ(covered, 10);
}

}  // namespace
}  // namespace vc
