// Pearson's chi-square goodness-of-fit for the distribution-identity tests of
// rejection sampling: observed counts of n draws against exact cell
// probabilities. Cells expected to hold fewer than 5 draws are pooled into
// one cell, as the test's approximation requires.
#pragma once

#include <cmath>
#include <map>

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

}  // namespace vc::testing
