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

}  // namespace vc
