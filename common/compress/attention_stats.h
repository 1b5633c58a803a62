// Attention statistics of a prompt's prefill, gathered through the engine's
// AttentionObserver, that token-dropping compressors rank keys by:
//  * accumulated: per (layer, KV head, key position), the attention summed
//    over every query of the prompt and every query head of the group (H2O);
//  * window: the same sum over only the last `window` queries (SnapKV,
//    PyramidKV's observation window);
//  * last: the attention of the last query alone (TOVA).
// Sums are kept in 2^-40 fixed point with atomic integer adds, so they are
// exact and independent of which thread added what in which order: the same
// prompt always yields the same ranking.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/engine/engine.h"
#include "common/kv/compressed_kv.h"
#include "common/model/model.h"

namespace vc {

class AttentionStats final : public AttentionObserver {
 public:
  // For a prefill of positions [0, prompt_len) from an empty cache.
  AttentionStats(const ModelConfig& config, int32_t prompt_len, int32_t window);

  void Observe(int layer, int head, int kv_head, int32_t query_pos, SequenceKv::KeyRange range,
               const float* probs) override;

  int32_t prompt_len() const { return prompt_len_; }
  int32_t window() const { return window_; }
  // Sums as doubles (exact conversions of the fixed-point totals).
  double accumulated(int layer, int kv_head, int32_t pos) const { return Get(acc_, layer, kv_head, pos); }
  double windowed(int layer, int kv_head, int32_t pos) const { return Get(win_, layer, kv_head, pos); }
  double last(int layer, int kv_head, int32_t pos) const { return Get(last_, layer, kv_head, pos); }
  // Test seam: sets one entry directly (value >= 0).
  enum class Which { kAccumulated, kWindow, kLast };
  void SetForTest(Which which, int layer, int kv_head, int32_t pos, double value);

 private:
  using Table = std::unique_ptr<std::atomic<uint64_t>[]>;
  double Get(const Table& t, int layer, int kv_head, int32_t pos) const;
  int64_t Index(int layer, int kv_head, int32_t pos) const {
    return (int64_t{layer} * kv_heads_ + kv_head) * prompt_len_ + pos;
  }

  int kv_heads_;
  int32_t prompt_len_;
  int32_t window_;
  Table acc_, win_, last_;
};

// Attention statistics of a request's decoding, for the online rules of H2O
// and TOVA (Compressor::Update): observes the drafter's passes over its
// CompressedSequenceKv view and keys every sum by absolute key position, so
// they survive the view's rebases.
//  * accumulated: per (layer, KV head, key position), the attention summed
//    over every query the drafter ran (and, seeded from the prefill, every
//    prompt query) and every query head of the group. Queries of drafts that
//    were later rejected count too: they ran and attended. Keys that are
//    rolled back lose their sums (DiscardFrom).
//  * last: the attention the most recent query (the last row of the latest
//    pass, see BeginPass) gave each key; keys after that query's position
//    were not seen by it (last_query_pos()).
// Same 2^-40 fixed point and atomic adds as AttentionStats, so the sums do
// not depend on thread count or batch composition. Observing only reads the
// probabilities: the drafter's numerics are unchanged.
class DecodeAttentionStats final : public AttentionObserver {
 public:
  // Key positions [0, max_len). `prefill` (may be null) seeds accumulated and
  // last for the prompt positions it covers; last_query_pos() starts at its
  // last prompt position.
  DecodeAttentionStats(const ModelConfig& config, int32_t max_len, const AttentionStats* prefill);

  // The view whose stored key order the observed ranges index. Must be set
  // (and outlive the passes) before any pass is observed.
  void SetView(const CompressedSequenceKv* view) { view_ = view; }
  // Call before each observed pass with the position of its last input row:
  // `last` is reset and then filled by that row's query only.
  void BeginPass(int32_t last_query_pos);
  // Rollback: keys at positions >= pos were truncated; their sums restart.
  void DiscardFrom(int32_t pos);

  void Observe(int layer, int head, int kv_head, int32_t query_pos, SequenceKv::KeyRange range,
               const float* probs) override;

  int32_t max_len() const { return max_len_; }
  int32_t last_query_pos() const { return last_query_pos_; }
  double accumulated(int layer, int kv_head, int32_t pos) const;
  double last(int layer, int kv_head, int32_t pos) const;
  // Test seam (value >= 0).
  void SetForTest(AttentionStats::Which which, int layer, int kv_head, int32_t pos, double value);
  void SetLastQueryPosForTest(int32_t pos) { last_query_pos_ = pos; }

 private:
  using Table = std::unique_ptr<std::atomic<uint64_t>[]>;
  int64_t Index(int layer, int kv_head, int32_t pos) const {
    return (int64_t{layer} * kv_heads_ + kv_head) * max_len_ + pos;
  }

  int n_layers_, kv_heads_;
  int32_t max_len_;
  int32_t last_query_pos_ = -1;
  const CompressedSequenceKv* view_ = nullptr;
  Table acc_, last_;
};

}  // namespace vc
