#include "common/engine/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace vc {

void SequenceKv::ScoresBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                             const QueryBatch& b, float scale) const {
  for (int64_t t = 0; t < b.count; ++t) {
    if (b.ranges[t].count == 0) continue;
    Scores(backend, layer, kv_head, b.ranges[t], b.q + t * b.head_dim, scale,
           b.scores + t * b.ld + (b.ranges[t].first - b.base));
  }
}

void SequenceKv::MixValuesBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                                const QueryBatch& b, float* out) const {
  for (int64_t t = 0; t < b.count; ++t) {
    if (b.ranges[t].count == 0) continue;
    MixValues(backend, layer, kv_head, b.ranges[t],
              b.scores + t * b.ld + (b.ranges[t].first - b.base), out + t * b.head_dim);
  }
}

namespace {

// The union [lo, hi) of the batch's non-empty ranges (lo == hi when all are
// empty).
std::pair<int64_t, int64_t> RangeUnion(const SequenceKv::QueryBatch& b) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
  for (int64_t t = 0; t < b.count; ++t) {
    if (b.ranges[t].count == 0) continue;
    lo = std::min(lo, b.ranges[t].first);
    hi = std::max(hi, b.ranges[t].first + b.ranges[t].count);
  }
  return lo < hi ? std::pair{lo, hi} : std::pair<int64_t, int64_t>{0, 0};
}

// Reads one byte of every 4 KiB page of `rows` (of head_dim floats): the address
// translations of a block's pages are then done, side by side, before the
// kernels' loads need them. A head's rows in the next block are a whole
// block further on, where neither the hardware prefetchers nor the
// kernels' software prefetches (which do not wait for a page walk) reach;
// under this VM's nested paging each new page stalled the first loads of
// its rows (see docs/results.md section 8).
void TouchPages(kernels::RowsAhead rows, int64_t head_dim) {
  const auto* bytes = reinterpret_cast<const volatile char*>(rows.rows);
  for (int64_t b = 0; b < rows.count * head_dim * int64_t{sizeof(float)}; b += 4096) {
    (void)bytes[b];
  }
}

}  // namespace

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
      slabs_(config.n_layers),
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
  // The new blocks of a layer share one allocation, in order: a head's rows
  // in consecutive blocks are then a fixed stride apart in one mapping, not
  // runs in a mapping per block (a block of 16 tokens was 128 KB, so glibc
  // mapped each on its own), which took one token's attention over 3000
  // tokens of the 110M synthetic model's shape from about 21 to 12 ms
  // (vc_kv_attention_bench, one thread, blocks of 16 tokens). Zeroed, so
  // that unused rows never hold garbage, and on a cache line: glibc's large
  // blocks start 16 bytes past a page, and then every 64-byte load of a row
  // spans two lines.
  for (int l = 0; l < n_layers_; ++l) {
    const size_t have = blocks_[l].size();
    if (have >= blocks_needed) continue;
    float* slab = slabs_[l]
                      .emplace_back(static_cast<size_t>((blocks_needed - have) * 2 * block_floats_))
                      .data();
    for (size_t b = have; b < blocks_needed; ++b) {
      blocks_[l].push_back(slab + (b - have) * 2 * block_floats_);
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
  float* block = blocks_[layer][pos / block_tokens_];
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

kernels::RowsAhead PagedKvCache::BlockAhead(int layer, bool value, int kv_head, int64_t first,
                                            int64_t end) const {
  if (first >= end) return {};
  return {.rows = Row(layer, value, kv_head, static_cast<int32_t>(first) + first_position_),
          .count = std::min<int64_t>(end - first, block_tokens_ - first % block_tokens_)};
}

void PagedKvCache::ScoresBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                               const QueryBatch& b, float scale) const {
  const auto [lo, hi] = RangeUnion(b);
  for (int64_t i = lo; i < hi;) {
    const int64_t n = std::min<int64_t>(hi - i, block_tokens_ - i % block_tokens_);
    // The queries whose range meets this block, as one contiguous run: the
    // ones in between that miss it (none in a causal pass, some with a
    // sliding window) get scratch scores outside their range.
    int64_t t0 = b.count, t1 = 0;
    for (int64_t t = 0; t < b.count; ++t) {
      const KeyRange& r = b.ranges[t];
      if (r.count > 0 && r.first < i + n && i < r.first + r.count) {
        t0 = std::min(t0, t);
        t1 = t + 1;
      }
    }
    const kernels::RowsAhead next_keys = BlockAhead(layer, false, kv_head, i + n, hi);
    TouchPages(next_keys, head_dim_);
    if (t0 < t1) {
      // The kernel streams the next key block into L2 while it works on
      // this one, and after the last key block the first value block, which
      // MixValuesBatch reads next.
      const kernels::RowsAhead ahead =
          next_keys.rows != nullptr ? next_keys : BlockAhead(layer, true, kv_head, lo, hi);
      backend.AttentionScoresMulti(
          b.q + t0 * b.head_dim, t1 - t0,
          Row(layer, false, kv_head, static_cast<int32_t>(i) + first_position_), n, head_dim_,
          scale, b.scores + t0 * b.ld + (i - b.base), b.ld, ahead);
    }
    i += n;
  }
  bytes_read_.fetch_add((hi - lo) * head_dim_ * int64_t{sizeof(float)}, std::memory_order_relaxed);
}

void PagedKvCache::MixValuesBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                                  const QueryBatch& b, float* out) const {
  // Blocks in increasing order, so every query's FMA chain runs over its
  // keys in stored order, as MixValues does.
  const auto [lo, hi] = RangeUnion(b);
  for (int64_t i = lo; i < hi;) {
    const int64_t n = std::min<int64_t>(hi - i, block_tokens_ - i % block_tokens_);
    const float* v = Row(layer, true, kv_head, static_cast<int32_t>(i) + first_position_);
    // The first whole-block call streams the next block into L2.
    kernels::RowsAhead ahead = BlockAhead(layer, true, kv_head, i + n, hi);
    TouchPages(ahead, head_dim_);
    // Runs of consecutive queries that cover the whole block share one call.
    for (int64_t t = 0; t < b.count;) {
      const KeyRange& r = b.ranges[t];
      const int64_t a = std::max(i, r.first), e = std::min(i + n, r.first + r.count);
      if (a >= e) {
        ++t;
        continue;
      }
      if (a == i && e == i + n) {
        int64_t u = t + 1;
        while (u < b.count && b.ranges[u].first <= i &&
               b.ranges[u].first + b.ranges[u].count >= i + n)
          ++u;
        backend.AccumulateValuesMulti(b.scores + t * b.ld + (i - b.base), b.ld, u - t, v, n,
                                      head_dim_, out + t * b.head_dim, ahead);
        ahead = {};
        t = u;
        continue;
      }
      backend.AccumulateValues(b.scores + t * b.ld + (a - b.base), v + (a - i) * head_dim_, e - a,
                               head_dim_, out + t * b.head_dim);
      ++t;
    }
    i += n;
  }
  bytes_read_.fetch_add((hi - lo) * head_dim_ * int64_t{sizeof(float)}, std::memory_order_relaxed);
}

}  // namespace vc
