#include "common/compress/attention_stats.h"

#include <algorithm>
#include <cmath>

#include "common/base/status_macros.h"

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

DecodeAttentionStats::DecodeAttentionStats(const ModelConfig& config, int32_t max_len,
                                           const AttentionStats* prefill)
    : n_layers_(config.n_layers), kv_heads_(config.n_kv_heads), max_len_(max_len) {
  const int64_t n = int64_t{n_layers_} * kv_heads_ * max_len_;
  acc_.reset(new std::atomic<uint64_t>[n]());
  last_.reset(new std::atomic<uint64_t>[n]());
  if (prefill == nullptr) return;
  const int32_t p = std::min(prefill->prompt_len(), max_len_);
  for (int l = 0; l < n_layers_; ++l) {
    for (int h = 0; h < kv_heads_; ++h) {
      for (int32_t pos = 0; pos < p; ++pos) {
        // Exact: the doubles are conversions of the same fixed-point sums.
        acc_[Index(l, h, pos)].store(
            static_cast<uint64_t>(std::llround(prefill->accumulated(l, h, pos) * kFixedOne)));
        last_[Index(l, h, pos)].store(
            static_cast<uint64_t>(std::llround(prefill->last(l, h, pos) * kFixedOne)));
      }
    }
  }
  last_query_pos_ = prefill->prompt_len() - 1;
}

void DecodeAttentionStats::BeginPass(int32_t last_query_pos) {
  const int64_t n = int64_t{n_layers_} * kv_heads_ * max_len_;
  for (int64_t i = 0; i < n; ++i) last_[i].store(0, std::memory_order_relaxed);
  last_query_pos_ = last_query_pos;
}

void DecodeAttentionStats::DiscardFrom(int32_t pos) {
  for (int l = 0; l < n_layers_; ++l) {
    for (int h = 0; h < kv_heads_; ++h) {
      for (int32_t p = std::max(pos, 0); p < max_len_; ++p) {
        acc_[Index(l, h, p)].store(0, std::memory_order_relaxed);
        last_[Index(l, h, p)].store(0, std::memory_order_relaxed);
      }
    }
  }
}

void DecodeAttentionStats::Observe(int layer, int /*head*/, int kv_head, int32_t query_pos,
                                   SequenceKv::KeyRange range, const float* probs) {
  VC_CHECK(view_ != nullptr, "DecodeAttentionStats observed a pass before SetView");
  // Stored order of the view: the prefix's kept positions, then the tail.
  const std::vector<int32_t>& kept = view_->prefix().layer(layer).heads[kv_head].positions;
  const int64_t n_kept = static_cast<int64_t>(kept.size());
  const int32_t prefix_len = view_->prefix().prefix_len();
  const bool is_last = query_pos == last_query_pos_;
  for (int64_t j = 0; j < range.count; ++j) {
    const int64_t s = range.first + j;
    const int64_t pos = s < n_kept ? kept[s] : prefix_len + (s - n_kept);
    if (pos >= max_len_) break;
    const uint64_t fixed = static_cast<uint64_t>(std::llround(double{probs[j]} * kFixedOne));
    const int64_t i = Index(layer, kv_head, static_cast<int32_t>(pos));
    acc_[i].fetch_add(fixed, std::memory_order_relaxed);
    if (is_last) last_[i].fetch_add(fixed, std::memory_order_relaxed);
  }
}

double DecodeAttentionStats::accumulated(int layer, int kv_head, int32_t pos) const {
  return static_cast<double>(acc_[Index(layer, kv_head, pos)].load(std::memory_order_relaxed)) /
         kFixedOne;
}

double DecodeAttentionStats::last(int layer, int kv_head, int32_t pos) const {
  return static_cast<double>(last_[Index(layer, kv_head, pos)].load(std::memory_order_relaxed)) /
         kFixedOne;
}

void DecodeAttentionStats::SetForTest(AttentionStats::Which which, int layer, int kv_head,
                                      int32_t pos, double value) {
  Table& t = which == AttentionStats::Which::kLast ? last_ : acc_;
  t[Index(layer, kv_head, pos)].store(static_cast<uint64_t>(std::llround(value * kFixedOne)));
}

}  // namespace vc
