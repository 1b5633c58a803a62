// Pearson's chi-square goodness-of-fit for the distribution-identity tests of
// rejection sampling: observed counts of n draws against exact cell
// probabilities. Cells expected to hold fewer than 5 draws are pooled into
// one cell, as the test's approximation requires.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace vc::testing {

struct ChiSquare {
  double statistic = 0;
  int dof = 0;
  // The 99.9% quantile of chi-square with `dof` degrees of freedom
  // (Wilson-Hilferty approximation): a correct sampler exceeds it once in a
  // thousand seeds.
  double limit = 0;
};

template <typename Cell>
ChiSquare PooledChiSquare(const std::map<Cell, double>& probability,
                          const std::map<Cell, int>& counts, int n) {
  ChiSquare out;
  double pooled_expected = 0, pooled_observed = 0;
  int cells = 0;
  for (const auto& [cell, p] : probability) {
    const double expected = p * n;
    const auto it = counts.find(cell);
    const double observed = it == counts.end() ? 0 : it->second;
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += observed;
      continue;
    }
    out.statistic += (observed - expected) * (observed - expected) / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    out.statistic += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) /
                     pooled_expected;
    ++cells;
  }
  out.dof = cells - 1;
  const double z = 3.09, k = out.dof;
  out.limit = k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
  return out;
}

// The exact distribution of (t2, t3) when three tokens t1 t2 t3 are sampled
// after `prompt`, marginalised over t1: what generating three tokens by
// plain sampling from the full-KV model produces. `next` maps a sequence to
// the distribution of its next token (vocab entries).
inline std::map<std::pair<int, int>, double> ExactSecondAndThirdTokens(
    const std::function<std::vector<double>(const std::vector<int32_t>&)>& next,
    const std::vector<int32_t>& prompt, int vocab) {
  std::map<std::pair<int, int>, double> exact;
  const std::vector<double> p1 = next(prompt);
  for (int t1 = 0; t1 < vocab; ++t1) {
    std::vector<int32_t> s1 = prompt;
    s1.push_back(t1);
    const std::vector<double> p2 = next(s1);
    for (int t2 = 0; t2 < vocab; ++t2) {
      std::vector<int32_t> s2 = s1;
      s2.push_back(t2);
      const std::vector<double> p3 = next(s2);
      for (int t3 = 0; t3 < vocab; ++t3) exact[{t2, t3}] += p1[t1] * p2[t2] * p3[t3];
    }
  }
  return exact;
}

}  // namespace vc::testing
