#include "common/compress/internal/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace vc::compress_internal {

int64_t DroppedHeadBytes(const ModelConfig& config, int32_t prefix_len, int64_t kept) {
  const int64_t row_bytes = int64_t{config.head_dim} * static_cast<int64_t>(sizeof(float));
  const int64_t index_bytes = kept < prefix_len ? kept * static_cast<int64_t>(sizeof(int32_t)) : 0;
  return kept * 2 * row_bytes + index_bytes;
}

int32_t TokenBudget(const ModelConfig& config, int32_t prefix_len, double ratio) {
  if (prefix_len <= 1 || ratio >= 1.0) return std::max(prefix_len, 1);
  // The same double division as CompressedPrefix::ratio(); the totals over
  // layers and heads are these numbers times L * kv_heads, and both quotients
  // are the correctly rounded value of one real number, so they agree.
  const double full = static_cast<double>(DroppedHeadBytes(config, prefix_len, prefix_len));
  auto fits = [&](int64_t k) {
    return static_cast<double>(DroppedHeadBytes(config, prefix_len, k)) / full <= ratio;
  };
  const int64_t per_token = DroppedHeadBytes(config, prefix_len, 1);
  // A close first guess, then exact steps (keeping every token costs less
  // than keeping all but one, so k = prefix_len is only for ratio 1).
  int64_t k = static_cast<int64_t>(std::floor(ratio * full / static_cast<double>(per_token)));
  k = std::clamp<int64_t>(k, 0, prefix_len - 1);
  while (k + 1 < prefix_len && fits(k + 1)) ++k;
  while (k > 0 && !fits(k)) --k;
  return static_cast<int32_t>(std::max<int64_t>(k, 1));
}

std::vector<int32_t> PyramidBudgets(int32_t mean, int n_layers, double beta, int32_t prefix_len) {
  if (n_layers <= 1) return std::vector<int32_t>(std::max(n_layers, 0), mean);
  std::vector<double> weight(n_layers);
  for (int l = 0; l < n_layers; ++l) {
    weight[l] = 1.0 + beta - 2.0 * beta * static_cast<double>(l) / (n_layers - 1);
  }
  const int64_t total = int64_t{mean} * n_layers;
  // Water filling: layers whose share falls outside [1, prefix_len] are fixed
  // at the bound and the rest is shared again among the free layers.
  std::vector<double> target(n_layers, 0.0);
  std::vector<bool> fixed(n_layers, false);
  for (;;) {
    double remaining = static_cast<double>(total), free_weight = 0.0;
    int free_count = 0;
    for (int l = 0; l < n_layers; ++l) {
      if (fixed[l]) {
        remaining -= target[l];
      } else {
        free_weight += weight[l];
        ++free_count;
      }
    }
    if (free_count == 0) break;
    bool changed = false;
    for (int l = 0; l < n_layers; ++l) {
      if (fixed[l]) continue;
      // All-zero weights (beta = 1 leaves only the top layer): equal shares.
      target[l] = free_weight > 0.0 ? remaining * weight[l] / free_weight : remaining / free_count;
    }
    for (int l = 0; l < n_layers; ++l) {
      if (fixed[l]) continue;
      if (target[l] > prefix_len || target[l] < 1.0) {
        target[l] = std::clamp(target[l], 1.0, static_cast<double>(prefix_len));
        fixed[l] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  // Floor, then hand the leftover tokens to the largest fractional parts.
  std::vector<int32_t> budget(n_layers);
  int64_t assigned = 0;
  for (int l = 0; l < n_layers; ++l) {
    budget[l] = static_cast<int32_t>(std::floor(target[l]));
    assigned += budget[l];
  }
  std::vector<int> order(n_layers);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return target[a] - std::floor(target[a]) > target[b] - std::floor(target[b]);
  });
  for (int i = 0; i < n_layers && assigned < total; ++i) {
    const int l = order[i];
    if (budget[l] < prefix_len && target[l] > budget[l]) {
      ++budget[l];
      ++assigned;
    }
  }
  return budget;
}

std::vector<int32_t> TopK(const std::vector<double>& scores, int32_t first, int32_t last,
                          int32_t k) {
  std::vector<int32_t> pos(std::max(0, last - first));
  std::iota(pos.begin(), pos.end(), first);
  k = std::clamp<int32_t>(k, 0, static_cast<int32_t>(pos.size()));
  std::partial_sort(pos.begin(), pos.begin() + k, pos.end(), [&](int32_t a, int32_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a > b;
  });
  pos.resize(k);
  std::sort(pos.begin(), pos.end());
  return pos;
}

std::vector<double> MaxPool(const std::vector<double>& scores, int32_t n, int kernel) {
  const int32_t radius = kernel / 2;
  std::vector<double> out(std::max(n, 0));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t lo = std::max(0, i - radius), hi = std::min(n - 1, i + radius);
    out[i] = *std::max_element(scores.begin() + lo, scores.begin() + hi + 1);
  }
  return out;
}

}  // namespace vc::compress_internal
