// NearestRank against the definition, counted in whole numbers: for q =
// k/100, the smallest sample x with at least k*n/100 samples at or below it.
#include "common/base/percentile.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace vc {
namespace {

double ByCounting(const std::vector<double>& sorted, int k) {
  const size_t n = sorted.size();
  for (double x : sorted) {
    const auto at_or_below =
        static_cast<size_t>(std::upper_bound(sorted.begin(), sorted.end(), x) - sorted.begin());
    if (at_or_below * 100 >= static_cast<size_t>(k) * n) return x;
  }
  return sorted.back();
}

TEST(PercentileTest, NearestRankIsTheSmallestSampleWithQOfAllAtOrBelowIt) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<double> v(n);
    // Few distinct values, so ties are common.
    for (double& x : v) x = static_cast<double>(rng() % 12);
    std::sort(v.begin(), v.end());
    for (int k = 0; k <= 100; ++k) {
      EXPECT_EQ(NearestRank(v, k / 100.0), ByCounting(v, k)) << "n " << n << " q " << k;
    }
  }
}

TEST(PercentileTest, TheMedianOfAnEvenCountIsTheLowerMiddle) {
  const std::vector<int> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(NearestRank(v, 0.5), 5);
  EXPECT_EQ(NearestRank(v, 0.9), 9);
  EXPECT_EQ(NearestRank(v, 1.0), 10);
  EXPECT_EQ(NearestRank(v, 0.0), 1);
}

}  // namespace
}  // namespace vc
