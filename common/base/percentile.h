// Percentiles of measured samples, one definition for every report that
// compares them (the cluster bench's and the simulator's TTFT and per-round
// overheads): the nearest rank, the smallest sample with at least q of all
// samples at or below it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace vc {

// `sorted` ascending and not empty; q in [0, 1] (0 gives the smallest).
// The rank is rounded up after taking off a hair, so that a q*n the
// floating point lands just above a whole number (0.9 * 10) keeps its rank.
template <typename T>
T NearestRank(const std::vector<T>& sorted, double q) {
  const double exact = q * static_cast<double>(sorted.size());
  const auto rank = static_cast<size_t>(std::max(0.0, std::ceil(exact - 1e-9)));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace vc
