// Per-sequence KV state read by attention and extended by the forward pass.
//
// SequenceKv is the seam between the forward pass and a KV representation:
// full-precision paged KV (here), and the compressed views (token-dropped,
// quantised) that drafters attend over. Each representation scores keys and
// mixes values in its own stored order; the forward pass only sees scores.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/base/cache_line_allocator.h"
#include "common/kv/kv_arena.h"
#include "common/model/model.h"
#include "kernels/kernels.h"

namespace vc {

class SequenceKv {
 public:
  virtual ~SequenceKv() = default;

  // The next absolute position this sequence will write (one past the last
  // stored position).
  virtual int32_t next_position() const = 0;

  // Makes room for `count` new tokens at positions next_position()... and
  // advances next_position() by `count`. Fails (ResourceExhausted) if a
  // budget would be exceeded; nothing changes then.
  virtual absl::Status Append(int32_t count) = 0;

  // Drops every position >= length (rollback of rejected drafts or of a
  // failed batch). length <= next_position().
  virtual void Truncate(int32_t length) = 0;

  // Writes the K and V ([kv_heads * head_dim] each, already RoPE'd) of the
  // token at absolute position `pos` (appended earlier) in `layer`.
  virtual void Write(int layer, int32_t pos, const float* k, const float* v) = 0;

  // Number of stored keys of (layer, kv_head) whose position is in
  // [min_pos, max_pos]; they are the stored keys [first, first + count).
  struct KeyRange {
    int64_t first = 0;
    int64_t count = 0;
  };
  virtual KeyRange Keys(int layer, int kv_head, int32_t min_pos, int32_t max_pos) const = 0;

  // scores[j] = scale * <q, key(first + j)>, j < range.count.
  virtual void Scores(const kernels::KernelBackend& backend, int layer, int kv_head,
                      KeyRange range, const float* q, float scale, float* scores) const = 0;

  // out += sum_j p[j] * value(first + j), in stored order.
  virtual void MixValues(const kernels::KernelBackend& backend, int layer, int kv_head,
                         KeyRange range, const float* p, float* out) const = 0;

  // Several queries of one (layer, kv_head) at once: the rows of a
  // multi-token pass and the query heads that share the KV head. Query t is
  // q + t*head_dim and attends ranges[t]; its score of stored key i lives at
  // scores[t*ld + i - base] (base <= every non-empty range's first, ld >= every
  // non-empty range's end - base; entries outside a query's own range are
  // scratch).
  struct QueryBatch {
    const float* q = nullptr;
    const KeyRange* ranges = nullptr;
    int64_t count = 0;
    int64_t head_dim = 0;
    int64_t base = 0;
    float* scores = nullptr;
    int64_t ld = 0;
  };
  // Each query's scores equal Scores() for it alone. The default calls
  // Scores per query; a representation may instead read each key once for
  // all the queries, which is what keeps a verify pass near one step's cost.
  virtual void ScoresBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                           const QueryBatch& batch, float scale) const;
  // Query t's output out + t*head_dim gets exactly MixValues() with its
  // (softmaxed) scores row.
  virtual void MixValuesBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                              const QueryBatch& batch, float* out) const;
};

// Full-precision f32 KV of one sequence in fixed-size blocks of tokens, so it
// grows without copying and truncates (rollback) in O(1).
//
// Block layout, per layer: K and V each [kv_heads][block_tokens][head_dim].
class PagedKvCache final : public SequenceKv {
 public:
  struct Options {
    // Tokens per block. Attention makes one kernel call per block (and query
    // run), so short blocks pay that call's set-up again and again: on the
    // 110M synthetic model's shape over 3000 tokens a 9-token pass's
    // attention cost 29, 25, 23 and 20 ms at 16, 64, 128 and 256 tokens
    // (vc_kv_attention_bench, one thread); 128 keeps most of that while a
    // sequence's last block wastes at most 127 tokens' rows.
    int block_tokens = 128;
    int32_t max_tokens = 0;  // 0: the model's context length
    // Absolute position of the first stored token: a cache can hold only a
    // suffix of a sequence (e.g. the exact tail behind a compressed prefix).
    int32_t first_position = 0;
    // Blocks are charged to this arena (not owned; must outlive the cache);
    // Append fails with ResourceExhausted when the arena is full.
    KvArena* arena = nullptr;
  };
  PagedKvCache(const ModelConfig& config, const Options& options);
  explicit PagedKvCache(const ModelConfig& config) : PagedKvCache(config, Options()) {}

  int32_t next_position() const override { return first_position_ + length_; }
  absl::Status Append(int32_t count) override;
  void Write(int layer, int32_t pos, const float* k, const float* v) override;
  KeyRange Keys(int layer, int kv_head, int32_t min_pos, int32_t max_pos) const override;
  void Scores(const kernels::KernelBackend& backend, int layer, int kv_head, KeyRange range,
              const float* q, float scale, float* scores) const override;
  void MixValues(const kernels::KernelBackend& backend, int layer, int kv_head, KeyRange range,
                 const float* p, float* out) const override;
  // One pass over the keys (values) of the queries' union, a block of
  // block_tokens rows at a time, each block applied to every query.
  void ScoresBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                   const QueryBatch& batch, float scale) const override;
  void MixValuesBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                      const QueryBatch& batch, float* out) const override;

  void Truncate(int32_t length) override;
  // Copies every stored row of `src` (same model, same first_position) into
  // this cache, which must be empty. Returns the bytes copied.
  absl::StatusOr<int64_t> CopyFrom(const PagedKvCache& src);
  // Pointers to the stored K / V row of (layer, kv_head, pos): head_dim floats.
  const float* KeyAt(int layer, int kv_head, int32_t pos) const;
  const float* ValueAt(int layer, int kv_head, int32_t pos) const;
  // Bytes of K and V held for the stored tokens (not counting block slack).
  int64_t bytes() const { return int64_t{length_} * bytes_per_token_; }
  int32_t max_tokens() const { return max_tokens_; }
  int32_t first_position() const { return first_position_; }
  int n_layers() const { return n_layers_; }
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  // The model's KV dtype: every stored value is exactly representable in it
  // (the engine rounds K/V before writing), so encoders may send the rows
  // in this dtype without loss.
  Dtype dtype() const { return dtype_; }
  // Bytes of K and V that attention has read from this cache so far (lets
  // tests prove which cache a pass read; relaxed atomic, cheap).
  int64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  float* Row(int layer, bool value, int kv_head, int32_t pos) const;
  // The head's K (or V) rows of the block from stored index `first` up to
  // `end`, which the batch walks touch (TouchPages) and hand the attention
  // kernels as their next rows; empty if first >= end.
  kernels::RowsAhead BlockAhead(int layer, bool value, int kv_head, int64_t first,
                                int64_t end) const;

  int n_layers_, kv_heads_, head_dim_, block_tokens_;
  Dtype dtype_;
  int32_t max_tokens_;
  int32_t first_position_;
  int32_t length_ = 0;
  mutable std::atomic<int64_t> bytes_read_{0};
  int64_t bytes_per_token_;
  int64_t block_floats_;  // floats per K (or V) block of one layer
  // blocks_[layer][b]: K block followed by V block, inside one of the
  // layer's slabs_ (each Append allocates one slab per layer for all the
  // blocks it adds, so a prompt's blocks lie back to back).
  std::vector<std::vector<float*>> blocks_;
  std::vector<std::vector<CacheLineVector<float>>> slabs_;
  KvArena* arena_;
  std::vector<KvArena::Reservation> reservations_;  // one per block index
};

}  // namespace vc
