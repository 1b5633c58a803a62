// Token budgets and ranking helpers shared by the token-dropping compressors.
// Private to vc_compress (and its tests).
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/model.h"

namespace vc::compress_internal {

// Kept positions, [layer][kv_head][i], each list strictly increasing.
using KeptPositions = std::vector<std::vector<std::vector<int32_t>>>;

// Bytes one KV head of one layer spends on `kept` of `prefix_len` tokens
// stored as f32: a K and a V row per token, plus a 4-byte position index per
// token unless every token is kept (CompressedPrefix::bytes() accounting).
int64_t DroppedHeadBytes(const ModelConfig& config, int32_t prefix_len, int64_t kept);

// The per-head token budget for ratio c in (0, 1]: the largest k whose
// achieved ratio DroppedHeadBytes(k) / (full f32 bytes of the head), computed
// in double exactly as CompressedPrefix::ratio() computes it, is <= c; c = 1
// keeps every token. Clamped to [1, prefix_len], so a ratio too small for
// even one token still keeps one (and then exceeds c).
int32_t TokenBudget(const ModelConfig& config, int32_t prefix_len, double ratio);

// PyramidKV's per-layer budgets around a uniform budget `mean` (tokens per
// head): layer l targets mean * (1 + beta - 2 * beta * l / (L - 1)), so the
// bottom layer gets (1 + beta) x and the top (1 - beta) x. The budgets sum to
// exactly L * mean, so the layers together spend exactly the bytes a uniform
// method spends at the same ratio. Targets outside [1, prefix_len] are
// clamped and the difference is spread over the other layers by their
// weights; the real-valued targets are then floored and the leftover tokens
// go to the layers with the largest fractional parts (the lower layer on
// ties).
std::vector<int32_t> PyramidBudgets(int32_t mean, int n_layers, double beta, int32_t prefix_len);

// Positions of the `k` highest scores among scores[first..last) (absolute
// positions; scores is indexed by position). Ties prefer the more recent
// position. Returned in increasing order.
std::vector<int32_t> TopK(const std::vector<double>& scores, int32_t first, int32_t last,
                          int32_t k);

// 1-D max pooling with stride 1 and an odd `kernel` centred on each position,
// over scores[0..n) only (outside counts as -infinity, like max_pool1d's
// padding): out[i] = max of scores[j], |j - i| <= kernel / 2, 0 <= j < n.
std::vector<double> MaxPool(const std::vector<double>& scores, int32_t n, int kernel);

}  // namespace vc::compress_internal
