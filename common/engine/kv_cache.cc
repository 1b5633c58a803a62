#include "common/engine/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace vc {

PagedKvCache::PagedKvCache(const ModelConfig& config, const Options& options)
    : n_layers_(config.n_layers),
      kv_heads_(config.n_kv_heads),
      head_dim_(config.head_dim),
      block_tokens_(std::max(1, options.block_tokens)),
      dtype_(config.dtype),
      max_tokens_(options.max_tokens > 0 ? options.max_tokens : config.max_seq_len),
      first_position_(options.first_position),
      // Held as f32 in memory (see dtype()), so memory is counted at 4 bytes.
      bytes_per_token_(int64_t{2} * config.n_layers * config.kv_dim() * int64_t{sizeof(float)}),
      block_floats_(int64_t{config.n_kv_heads} * std::max(1, options.block_tokens) *
                    config.head_dim),
      blocks_(config.n_layers),
      arena_(options.arena) {}

absl::Status PagedKvCache::Append(int32_t count) {
  if (count < 0) return absl::InvalidArgumentError("Append: negative count");
  if (int64_t{length_} + count > max_tokens_) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", length_, " + ", count,
                                                     " tokens exceeds capacity ", max_tokens_));
  }
  if (int64_t{first_position_} + length_ + count > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError("KV positions overflow int32");
  }
  const int32_t new_length = length_ + count;
  const size_t blocks_needed = static_cast<size_t>((new_length + block_tokens_ - 1) / block_tokens_);
  if (arena_ != nullptr) {
    // One reservation per block index covers that block in every layer.
    const int64_t block_bytes = int64_t{2} * block_floats_ * n_layers_ * int64_t{sizeof(float)};
    const size_t before = reservations_.size();
    while (reservations_.size() < blocks_needed) {
      auto r = arena_->Reserve(block_bytes);
      if (!r.ok()) {
        reservations_.resize(before);
        return r.status();
      }
      reservations_.push_back(std::move(r).value());
    }
  }
  for (auto& layer_blocks : blocks_) {
    while (layer_blocks.size() < blocks_needed) {
      // K block then V block; zeroed so that unused rows never hold garbage.
      layer_blocks.emplace_back(new float[2 * block_floats_]());
    }
  }
  length_ = new_length;
  return absl::OkStatus();
}

void PagedKvCache::Truncate(int32_t length) {
  VC_CHECK(length >= first_position_ && length <= next_position(), "Truncate past the end");
  length_ = length - first_position_;
  // Blocks are kept for reuse by the next Append; the cache's capacity is
  // bounded by max_tokens anyway.
}

absl::StatusOr<int64_t> PagedKvCache::CopyFrom(const PagedKvCache& src) {
  if (length_ != 0 || src.first_position_ != first_position_ || src.n_layers_ != n_layers_ ||
      src.kv_heads_ != kv_heads_ || src.head_dim_ != head_dim_ || src.dtype_ != dtype_) {
    return absl::InvalidArgumentError("CopyFrom needs an empty cache of the same shape");
  }
  VC_RETURN_IF_ERROR(Append(src.length_));
  for (int l = 0; l < n_layers_; ++l) {
    for (int h = 0; h < kv_heads_; ++h) {
      for (int32_t pos = first_position_; pos < next_position(); ++pos) {
        std::memcpy(Row(l, false, h, pos), src.Row(l, false, h, pos), head_dim_ * sizeof(float));
        std::memcpy(Row(l, true, h, pos), src.Row(l, true, h, pos), head_dim_ * sizeof(float));
      }
    }
  }
  return bytes();
}

float* PagedKvCache::Row(int layer, bool value, int kv_head, int32_t pos) const {
  pos -= first_position_;
  float* block = blocks_[layer][pos / block_tokens_].get();
  return block + (value ? block_floats_ : 0) +
         (int64_t{kv_head} * block_tokens_ + pos % block_tokens_) * head_dim_;
}

const float* PagedKvCache::KeyAt(int layer, int kv_head, int32_t pos) const {
  return Row(layer, false, kv_head, pos);
}
const float* PagedKvCache::ValueAt(int layer, int kv_head, int32_t pos) const {
  return Row(layer, true, kv_head, pos);
}

void PagedKvCache::Write(int layer, int32_t pos, const float* k, const float* v) {
  VC_CHECK(pos >= first_position_ && pos < next_position(), "Write outside appended positions");
  for (int h = 0; h < kv_heads_; ++h) {
    std::memcpy(Row(layer, false, h, pos), k + int64_t{h} * head_dim_, head_dim_ * sizeof(float));
    std::memcpy(Row(layer, true, h, pos), v + int64_t{h} * head_dim_, head_dim_ * sizeof(float));
  }
}

SequenceKv::KeyRange PagedKvCache::Keys(int /*layer*/, int /*kv_head*/, int32_t min_pos,
                                        int32_t max_pos) const {
  // Stored index = position - first_position_.
  const int32_t first = std::max(first_position_, min_pos);
  const int32_t last = std::min(max_pos, next_position() - 1);
  return {first - first_position_, std::max(0, last - first + 1)};
}

void PagedKvCache::Scores(const kernels::KernelBackend& backend, int layer, int kv_head,
                          KeyRange range, const float* q, float scale, float* scores) const {
  int64_t j = 0;
  while (j < range.count) {
    const int32_t index = static_cast<int32_t>(range.first + j);
    const int64_t n = std::min<int64_t>(range.count - j, block_tokens_ - index % block_tokens_);
    backend.AttentionScores(q, Row(layer, false, kv_head, index + first_position_), n, head_dim_,
                            scale, scores + j);
    j += n;
  }
  bytes_read_.fetch_add(range.count * head_dim_ * int64_t{sizeof(float)}, std::memory_order_relaxed);
}

void PagedKvCache::MixValues(const kernels::KernelBackend& backend, int layer, int kv_head,
                             KeyRange range, const float* p, float* out) const {
  // Consecutive calls continue the same per-lane FMA chain, so splitting at
  // block boundaries does not change the result.
  int64_t j = 0;
  while (j < range.count) {
    const int32_t index = static_cast<int32_t>(range.first + j);
    const int64_t n = std::min<int64_t>(range.count - j, block_tokens_ - index % block_tokens_);
    backend.AccumulateValues(p + j, Row(layer, true, kv_head, index + first_position_), n,
                             head_dim_, out);
    j += n;
  }
  bytes_read_.fetch_add(range.count * head_dim_ * int64_t{sizeof(float)}, std::memory_order_relaxed);
}

}  // namespace vc
