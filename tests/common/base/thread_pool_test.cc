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

TEST(ThreadPoolTest, ZeroOrNegativeThreadsMeansInline) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int64_t covered = 0;
  pool.ParallelFor(10, 1, [&](int64_t b, int64_t e) { covered += e - b; });
  EXPECT_EQ(covered, 10);
}

}  // namespace
}  // namespace vc
