#include "common/compress/attention_stats.h"

#include <cmath>

namespace vc {
namespace {
constexpr double kFixedOne = 1099511627776.0;  // 2^40
}

AttentionStats::AttentionStats(const ModelConfig& config, int32_t prompt_len, int32_t window)
    : kv_heads_(config.n_kv_heads), prompt_len_(prompt_len), window_(window) {
  const int64_t n = int64_t{config.n_layers} * kv_heads_ * prompt_len;
  acc_.reset(new std::atomic<uint64_t>[n]());
  win_.reset(new std::atomic<uint64_t>[n]());
  last_.reset(new std::atomic<uint64_t>[n]());
}

void AttentionStats::Observe(int layer, int /*head*/, int kv_head, int32_t query_pos,
                             SequenceKv::KeyRange range, const float* probs) {
  if (query_pos >= prompt_len_) return;
  const bool in_window = query_pos >= prompt_len_ - window_;
  const bool is_last = query_pos == prompt_len_ - 1;
  for (int64_t j = 0; j < range.count; ++j) {
    const int64_t pos = range.first + j;  // a prefill from 0: stored index == position
    if (pos >= prompt_len_) break;
    const uint64_t fixed = static_cast<uint64_t>(std::llround(double{probs[j]} * kFixedOne));
    const int64_t i = Index(layer, kv_head, static_cast<int32_t>(pos));
    acc_[i].fetch_add(fixed, std::memory_order_relaxed);
    if (in_window) win_[i].fetch_add(fixed, std::memory_order_relaxed);
    if (is_last) last_[i].fetch_add(fixed, std::memory_order_relaxed);
  }
}

double AttentionStats::Get(const Table& t, int layer, int kv_head, int32_t pos) const {
  return static_cast<double>(t[Index(layer, kv_head, pos)].load(std::memory_order_relaxed)) /
         kFixedOne;
}

void AttentionStats::SetForTest(Which which, int layer, int kv_head, int32_t pos, double value) {
  Table& t = which == Which::kAccumulated ? acc_ : which == Which::kWindow ? win_ : last_;
  t[Index(layer, kv_head, pos)].store(static_cast<uint64_t>(std::llround(value * kFixedOne)));
}

}  // namespace vc
