// Compressed KV of a prompt prefix, and the drafter's KV view built on it.
//
// CompressedPrefix holds, per layer and KV head, the kept token positions
// (the same count for every head of a layer; keys keep their original RoPE
// positions) and their K and V rows in a RowStore format (f32 for pure token
// dropping, quantised for KIVI/INT8, both for composites). It is immutable
// and shared by every request over the same prefix.
//
// CompressedSequenceKv is a SequenceKv made of that prefix plus an exact,
// full-precision tail for the tokens after it (drafted tokens, and accepted
// tokens whose exact K/V the verifier refreshed). Attention reads the prefix
// rows directly from their stored format: on a CPU backend quantised rows go
// to the fused kernels of kernels/quantized_kv.h, which read the codes in
// place and give bit for bit what decoding the rows and running the
// backend's f32 kernels gives (the path taken otherwise).
//
// Online compression (a compressor's Update, common/compress/compressor.h)
// folds the oldest tail rows into a new, larger prefix and Rebase swaps it
// in. Only settled rows may be folded: positions the protocol has accepted
// and whose K/V will never be written again (with KV refresh: after the
// verifier's exact rows were copied in). Rejected drafts are rolled back by
// Truncate and accepted rows are overwritten by the refresh, and neither is
// possible once a row lives in the immutable prefix. The protocol reports
// the settled length with Settle; Truncate lowers it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/kv_cache.h"
#include "common/kv/row_codec.h"
#include "common/model/model.h"

namespace vc {

class ThreadPool;

class CompressedPrefix {
 public:
  struct Head {
    std::vector<int32_t> positions;  // kept positions, strictly increasing
    std::unique_ptr<RowStore> keys;
    std::unique_ptr<RowStore> values;
  };
  struct Layer {
    std::vector<Head> heads;  // [kv_heads]
  };

  // Builds from the per-layer, per-head kept positions (each sorted, the same
  // count per head within a layer) of `full`, whose positions [0,
  // prefix_len) must be present. `key_spec`/`value_spec` choose the formats.
  // With a `pool`, the (layer, KV head) units are encoded in parallel on it
  // (the result is the same); never from inside a ParallelFor on that pool.
  static absl::StatusOr<std::shared_ptr<const CompressedPrefix>> Build(
      const ModelConfig& config, const PagedKvCache& full, int32_t prefix_len,
      const std::vector<std::vector<std::vector<int32_t>>>& kept,  // [layer][kv_head][i]
      const RowCodecSpec& key_spec, const RowCodecSpec& value_spec, std::string description,
      ThreadPool* pool = nullptr);

  // Reassembles a prefix from its stored parts (the reader of a serialised
  // variant, common/kvstore/variant_codec.h): `layers` as layer() returns
  // them. Checks what Build guarantees (every layer and KV head present, the
  // same count per head within a layer, increasing positions inside [0,
  // prefix_len), key and value stores of one row per kept position and
  // head_dim columns) and accounts bytes() and full_bytes() as Build does.
  // InvalidArgument otherwise.
  static absl::StatusOr<std::shared_ptr<const CompressedPrefix>> FromParts(
      const ModelConfig& config, int32_t prefix_len, std::vector<Layer> layers,
      std::string description);

  int32_t prefix_len() const { return prefix_len_; }
  const Layer& layer(int l) const { return layers_[l]; }
  int n_layers() const { return static_cast<int>(layers_.size()); }
  // Exact bytes: K/V codes, scales, zero points, and the kept-position
  // indices (4 bytes each) when tokens were dropped.
  int64_t bytes() const { return bytes_; }
  // Bytes of the same prefix as full f32 KV.
  int64_t full_bytes() const { return full_bytes_; }
  double ratio() const { return full_bytes_ > 0 ? static_cast<double>(bytes_) / full_bytes_ : 1.0; }
  // Kept tokens per head in layer l.
  int64_t kept(int l) const { return static_cast<int64_t>(layers_[l].heads[0].positions.size()); }
  const std::string& description() const { return description_; }

 private:
  CompressedPrefix() = default;
  int32_t prefix_len_ = 0;
  std::vector<Layer> layers_;
  int64_t bytes_ = 0;
  int64_t full_bytes_ = 0;
  std::string description_;
};

class CompressedSequenceKv final : public SequenceKv {
 public:
  // The tail's blocks are charged to `arena` if given (the prefix is shared
  // and charged by its owner).
  CompressedSequenceKv(const ModelConfig& config, std::shared_ptr<const CompressedPrefix> prefix,
                       int32_t max_tokens = 0, KvArena* arena = nullptr);

  int32_t next_position() const override { return tail_->next_position(); }
  absl::Status Append(int32_t count) override { return tail_->Append(count); }
  void Truncate(int32_t length) override {
    tail_->Truncate(length);
    settled_ = std::min(settled_, tail_->next_position());
  }
  void Write(int layer, int32_t pos, const float* k, const float* v) override {
    tail_->Write(layer, pos, k, v);
  }
  KeyRange Keys(int layer, int kv_head, int32_t min_pos, int32_t max_pos) const override;
  void Scores(const kernels::KernelBackend& backend, int layer, int kv_head, KeyRange range,
              const float* q, float scale, float* scores) const override;
  void MixValues(const kernels::KernelBackend& backend, int layer, int kv_head, KeyRange range,
                 const float* p, float* out) const override;

  // False: decode quantised rows into an f32 buffer and run the backend's
  // f32 kernels even on a CPU backend (the path before the fused kernels;
  // the results are the same bits). For benchmarks and tests that compare
  // the two. Default true.
  void set_fused_attention(bool fused) { fused_ = fused; }

  const CompressedPrefix& prefix() const { return *prefix_; }
  // The exact tail (positions >= prefix_len).
  // Rebase replaces the tail object: do not keep references across it.
  PagedKvCache& tail() { return *tail_; }
  const PagedKvCache& tail() const { return *tail_; }
  // Bytes held: the prefix plus this sequence's tail.
  int64_t bytes() const { return prefix_->bytes() + tail_->bytes(); }

  // Positions [0, settled_length()) are settled (see the top comment); starts
  // at the prefix length. Settle: InvalidArgument unless
  // prefix_len <= length <= next_position(). Lowering it is allowed.
  int32_t settled_length() const { return settled_; }
  absl::Status Settle(int32_t length);
  // OK if a new prefix covering [0, fold_upto) may replace the current one:
  // InvalidArgument if fold_upto is below the current prefix length,
  // FailedPrecondition if it reaches past the settled length.
  absl::Status CheckFold(int32_t fold_upto) const;
  // Swaps in `next` (a prefix of the same model covering [0, L), built from
  // this view's prefix and settled tail rows, CheckFold(L) OK) and drops the
  // tail rows below L: the tail is rebuilt from L with the same capacity end
  // and arena, so its bytes charged to the arena shrink. On error nothing
  // changes (the new tail's blocks are charged before the old are freed).
  absl::Status Rebase(std::shared_ptr<const CompressedPrefix> next);

 private:
  static PagedKvCache::Options TailOptions(int32_t capacity_end, int32_t first, KvArena* arena) {
    return {.block_tokens = 16,
            .max_tokens = capacity_end - first,
            .first_position = first,
            .arena = arena};
  }

  ModelConfig config_;
  int head_dim_;
  int32_t capacity_end_;  // one past the last position the view may hold
  KvArena* arena_;
  std::shared_ptr<const CompressedPrefix> prefix_;
  std::unique_ptr<PagedKvCache> tail_;
  int32_t settled_;
  bool fused_ = true;
};

}  // namespace vc
