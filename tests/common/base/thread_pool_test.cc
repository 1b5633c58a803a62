#include "common/base/thread_pool.h"

#include <atomic>
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
  std::atomic<int> concurrent{0}, peak{0};
  // Pieces wait for each other briefly so that two run at once if two
  // threads take part; bounded so it cannot hang.
  pool.ParallelFor(8, 1, [&](int64_t, int64_t) {
    const int now = ++concurrent;
    int p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    for (int spin = 0; spin < 2000000 && peak.load() < 2; ++spin) {
    }
    --concurrent;
  });
  EXPECT_GE(peak.load(), 1);
  EXPECT_EQ(pool.num_threads(), 2);
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
