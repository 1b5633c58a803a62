#include "common/kv/compressed_kv.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "kernels/quantized_kv.h"

namespace vc {

absl::StatusOr<std::shared_ptr<const CompressedPrefix>> CompressedPrefix::Build(
    const ModelConfig& config, const PagedKvCache& full, int32_t prefix_len,
    const std::vector<std::vector<std::vector<int32_t>>>& kept, const RowCodecSpec& key_spec,
    const RowCodecSpec& value_spec, std::string description, ThreadPool* pool) {
  if (prefix_len < 1 || full.first_position() != 0 || full.next_position() < prefix_len) {
    return absl::InvalidArgumentError(absl::StrCat("compressed prefix of ", prefix_len,
                                                   " tokens needs a full KV holding them (has ",
                                                   full.next_position(), ")"));
  }
  if (static_cast<int>(kept.size()) != config.n_layers) {
    return absl::InvalidArgumentError("kept positions must list every layer");
  }
  // Every unit's positions are checked before any is encoded.
  for (int l = 0; l < config.n_layers; ++l) {
    if (static_cast<int>(kept[l].size()) != config.n_kv_heads) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": kept positions for ",
                                                     kept[l].size(), " heads, model has ",
                                                     config.n_kv_heads));
    }
    const size_t count = kept[l][0].size();
    for (int h = 0; h < config.n_kv_heads; ++h) {
      const std::vector<int32_t>& pos = kept[l][h];
      if (pos.size() != count) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", l, ": heads keep different counts (", count, " vs ",
                         pos.size(), "); a layer keeps the same count per head"));
      }
      for (size_t i = 0; i < pos.size(); ++i) {
        if (pos[i] < 0 || pos[i] >= prefix_len || (i > 0 && pos[i] <= pos[i - 1])) {
          return absl::InvalidArgumentError(absl::StrCat(
              "layer ", l, " head ", h, ": kept positions must be increasing and inside [0, ",
              prefix_len, ")"));
        }
      }
    }
  }
  const int hd = config.head_dim;
  std::shared_ptr<CompressedPrefix> out(new CompressedPrefix());
  out->prefix_len_ = prefix_len;
  out->description_ = std::move(description);
  out->full_bytes_ = int64_t{prefix_len} * config.kv_bytes_per_token();
  out->layers_.resize(config.n_layers);
  for (Layer& layer : out->layers_) layer.heads.resize(config.n_kv_heads);
  // One unit per (layer, KV head), each encoded on its own (a store's codes
  // do not depend on any other), so a pool may take them in any order.
  const int64_t units = int64_t{config.n_layers} * config.n_kv_heads;
  std::vector<absl::Status> failed(static_cast<size_t>(units));
  auto encode = [&](int64_t u0, int64_t u1) {
    std::vector<float> k_rows, v_rows;
    for (int64_t u = u0; u < u1; ++u) {
      const int l = static_cast<int>(u / config.n_kv_heads);
      const int h = static_cast<int>(u % config.n_kv_heads);
      const std::vector<int32_t>& pos = kept[l][h];
      k_rows.resize(pos.size() * hd);
      v_rows.resize(pos.size() * hd);
      // Runs of kept positions whose rows are adjacent in the cache (a
      // head's rows within one block) are copied at once, not row by row (a
      // quantiser keeps every position: compressing a 3000-token prompt of
      // the 110M shape to INT8 took 36-38 ms on one thread instead of
      // 39-41).
      for (size_t i = 0; i < pos.size();) {
        const float* k0 = full.KeyAt(l, h, pos[i]);
        const float* v0 = full.ValueAt(l, h, pos[i]);
        size_t e = i + 1;
        while (e < pos.size() && pos[e] == pos[e - 1] + 1 &&
               full.KeyAt(l, h, pos[e]) == k0 + (e - i) * hd &&
               full.ValueAt(l, h, pos[e]) == v0 + (e - i) * hd) {
          ++e;
        }
        std::copy_n(k0, (e - i) * hd, &k_rows[i * hd]);
        std::copy_n(v0, (e - i) * hd, &v_rows[i * hd]);
        i = e;
      }
      Head& head = out->layers_[l].heads[h];
      head.positions = pos;
      auto keys = RowStore::Encode(key_spec, k_rows.data(), pos.size(), hd);
      auto values = RowStore::Encode(value_spec, v_rows.data(), pos.size(), hd);
      if (!keys.ok() || !values.ok()) {
        failed[static_cast<size_t>(u)] = keys.ok() ? values.status() : keys.status();
        continue;
      }
      head.keys = std::move(*keys);
      head.values = std::move(*values);
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(units, 1, encode);
  } else {
    encode(0, units);
  }
  for (const absl::Status& s : failed) VC_RETURN_IF_ERROR(s);
  for (int l = 0; l < config.n_layers; ++l) {
    for (const Head& head : out->layers_[l].heads) {
      out->bytes_ += head.keys->bytes() + head.values->bytes();
      if (static_cast<int32_t>(head.positions.size()) < prefix_len) {
        out->bytes_ += static_cast<int64_t>(head.positions.size() * sizeof(int32_t));
      }
    }
  }
  return std::shared_ptr<const CompressedPrefix>(std::move(out));
}

absl::StatusOr<std::shared_ptr<const CompressedPrefix>> CompressedPrefix::FromParts(
    const ModelConfig& config, int32_t prefix_len, std::vector<Layer> layers,
    std::string description) {
  if (prefix_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed prefix must hold >= 1 token, got ", prefix_len));
  }
  if (config.n_kv_heads < 1 || config.head_dim < 1) {
    return absl::InvalidArgumentError("compressed prefix: bad model shape");
  }
  if (static_cast<int>(layers.size()) != config.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("compressed prefix has ", layers.size(),
                                                   " layers, model has ", config.n_layers));
  }
  std::shared_ptr<CompressedPrefix> out(new CompressedPrefix());
  out->prefix_len_ = prefix_len;
  out->description_ = std::move(description);
  out->full_bytes_ = int64_t{prefix_len} * config.kv_bytes_per_token();
  for (int l = 0; l < config.n_layers; ++l) {
    const std::vector<Head>& heads = layers[l].heads;
    if (static_cast<int>(heads.size()) != config.n_kv_heads) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": ", heads.size(),
                                                     " KV heads, model has ", config.n_kv_heads));
    }
    const size_t count = heads[0].positions.size();
    for (int h = 0; h < config.n_kv_heads; ++h) {
      const Head& head = heads[h];
      const std::vector<int32_t>& pos = head.positions;
      if (pos.size() != count) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", l, ": heads keep different counts (", count, " vs ",
                         pos.size(), "); a layer keeps the same count per head"));
      }
      for (size_t i = 0; i < pos.size(); ++i) {
        if (pos[i] < 0 || pos[i] >= prefix_len || (i > 0 && pos[i] <= pos[i - 1])) {
          return absl::InvalidArgumentError(absl::StrCat(
              "layer ", l, " head ", h, ": kept positions must be increasing and inside [0, ",
              prefix_len, ")"));
        }
      }
      for (const RowStore* store : {head.keys.get(), head.values.get()}) {
        if (store == nullptr || store->rows() != static_cast<int64_t>(pos.size()) ||
            store->dim() != config.head_dim) {
          return absl::InvalidArgumentError(absl::StrCat(
              "layer ", l, " head ", h, ": key/value rows must be ", pos.size(), " x ",
              config.head_dim, (store == nullptr ? " (missing)" : "")));
        }
      }
      // The same accounting as Build.
      out->bytes_ += head.keys->bytes() + head.values->bytes();
      if (static_cast<int32_t>(pos.size()) < prefix_len) {
        out->bytes_ += static_cast<int64_t>(pos.size() * sizeof(int32_t));
      }
    }
  }
  out->layers_ = std::move(layers);
  return std::shared_ptr<const CompressedPrefix>(std::move(out));
}

CompressedSequenceKv::CompressedSequenceKv(const ModelConfig& config,
                                           std::shared_ptr<const CompressedPrefix> prefix,
                                           int32_t max_tokens, KvArena* arena)
    : config_(config),
      head_dim_(config.head_dim),
      capacity_end_(max_tokens > 0 ? max_tokens : config.max_seq_len),
      arena_(arena),
      prefix_(std::move(prefix)),
      tail_(std::make_unique<PagedKvCache>(
          config, TailOptions(capacity_end_, prefix_->prefix_len(), arena))),
      settled_(prefix_->prefix_len()) {}

absl::Status CompressedSequenceKv::Settle(int32_t length) {
  if (length < prefix_->prefix_len() || length > next_position()) {
    return absl::InvalidArgumentError(
        absl::StrCat("settled length ", length, " outside [", prefix_->prefix_len(), ", ",
                     next_position(), "] (compressed prefix length, next position)"));
  }
  settled_ = length;
  return absl::OkStatus();
}

absl::Status CompressedSequenceKv::CheckFold(int32_t fold_upto) const {
  if (fold_upto < prefix_->prefix_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fold_upto ", fold_upto, " is below the compressed prefix length ",
                     prefix_->prefix_len(), "; folding only moves forward"));
  }
  if (fold_upto > settled_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fold_upto ", fold_upto, " is beyond the settled length ", settled_,
        ": only accepted tokens whose K/V is final (refreshed with the verifier's exact rows) "
        "may be folded into the compressed prefix; later rows may still be rolled back or "
        "overwritten"));
  }
  return absl::OkStatus();
}

absl::Status CompressedSequenceKv::Rebase(std::shared_ptr<const CompressedPrefix> next) {
  if (next == nullptr) return absl::InvalidArgumentError("Rebase: no prefix");
  if (next->n_layers() != config_.n_layers ||
      static_cast<int>(next->layer(0).heads.size()) != config_.n_kv_heads) {
    return absl::InvalidArgumentError("Rebase: the new prefix has another model's shape");
  }
  const int32_t from = next->prefix_len();
  VC_RETURN_IF_ERROR(CheckFold(from));
  if (from == prefix_->prefix_len()) {
    prefix_ = std::move(next);
    return absl::OkStatus();
  }
  // Rows [from, next_position()) move to a tail that starts at `from`.
  const int32_t end = next_position();
  const int hd = config_.head_dim, heads = config_.n_kv_heads;
  auto fresh =
      std::make_unique<PagedKvCache>(config_, TailOptions(capacity_end_, from, arena_));
  VC_RETURN_IF_ERROR(fresh->Append(end - from));
  std::vector<float> k(static_cast<size_t>(heads) * hd), v(k.size());
  for (int32_t pos = from; pos < end; ++pos) {
    for (int l = 0; l < config_.n_layers; ++l) {
      for (int h = 0; h < heads; ++h) {
        std::copy_n(tail_->KeyAt(l, h, pos), hd, &k[h * hd]);
        std::copy_n(tail_->ValueAt(l, h, pos), hd, &v[h * hd]);
      }
      fresh->Write(l, pos, k.data(), v.data());
    }
  }
  tail_ = std::move(fresh);
  prefix_ = std::move(next);
  return absl::OkStatus();
}

// Stored order: the prefix's kept keys (by position), then the tail.
SequenceKv::KeyRange CompressedSequenceKv::Keys(int layer, int kv_head, int32_t min_pos,
                                                int32_t max_pos) const {
  const std::vector<int32_t>& pos = prefix_->layer(layer).heads[kv_head].positions;
  const int64_t kept = static_cast<int64_t>(pos.size());
  const int64_t p0 = std::lower_bound(pos.begin(), pos.end(), min_pos) - pos.begin();
  const int64_t p1 = std::upper_bound(pos.begin(), pos.end(), max_pos) - pos.begin();
  const KeyRange tail = tail_->Keys(layer, kv_head, min_pos, max_pos);
  if (tail.count == 0) return {p0, std::max<int64_t>(0, p1 - p0)};
  if (p1 - p0 <= 0) return {kept + tail.first, tail.count};
  // Sorted overall, so the visible keys are contiguous across the seam.
  return {p0, (kept - p0) + tail.count};
}

namespace {

// Calls fn(offset, rows, n) over rows [first, first + count) of `store` in
// order, in chunks: runs of f32 rows in place, quantised rows decoded a block
// at a time. Attention results do not depend on the chunking (each score is
// its own dot product; value sums continue one FMA chain per lane).
template <typename Fn>
void ForEachChunk(const RowStore& store, int64_t first, int64_t count, int head_dim, Fn fn) {
  constexpr int64_t kDecodeRows = 32;
  thread_local std::vector<float> buffer;
  int64_t j = 0;
  while (j < count) {
    const float* in_place = store.RowIfF32(first + j);
    int64_t n = 1;
    if (in_place != nullptr) {
      while (j + n < count && store.RowIfF32(first + j + n) != nullptr) ++n;
      fn(j, in_place, n);
    } else {
      while (j + n < count && n < kDecodeRows && store.RowIfF32(first + j + n) == nullptr) ++n;
      buffer.resize(static_cast<size_t>(kDecodeRows) * head_dim);
      store.DecodeRows(first + j, n, buffer.data());
      fn(j, buffer.data(), n);
    }
    j += n;
  }
}

// Rows [first, first + count) of `store`, in order. With `fused` on a CPU
// backend: quantised(level, rows, j, n) over the quantised rows (the fused
// kernels read them in place), then f32(j, rows, n) over the f32 rows after
// them (in place too). Otherwise every row goes through f32, decoded in
// chunks by ForEachChunk. Both give the same bits (kernels/quantized_kv.h).
template <typename Quantised, typename F32>
void ForEachRun(const RowStore& store, const kernels::KernelBackend& backend, bool fused,
                int64_t first, int64_t count, int head_dim, Quantised quantised, F32 f32) {
  const std::optional<kernels::SimdLevel> level = backend.cpu_simd_level();
  if (!fused || !level.has_value()) {
    ForEachChunk(store, first, count, head_dim, f32);
    return;
  }
  const kernels::QuantizedKvRows rows = store.QuantizedRows();
  const int64_t q = std::clamp<int64_t>(rows.rows - first, 0, count);
  if (q > 0) quantised(*level, rows, int64_t{0}, q);
  if (q < count) f32(q, store.RowIfF32(first + q), count - q);
}

}  // namespace

void CompressedSequenceKv::Scores(const kernels::KernelBackend& backend, int layer, int kv_head,
                                  KeyRange range, const float* q, float scale,
                                  float* scores) const {
  const CompressedPrefix::Head& head = prefix_->layer(layer).heads[kv_head];
  const int64_t kept = static_cast<int64_t>(head.positions.size());
  const int64_t in_prefix = std::clamp<int64_t>(kept - range.first, 0, range.count);
  ForEachRun(
      *head.keys, backend, fused_, range.first, in_prefix, head_dim_,
      [&](kernels::SimdLevel level, const kernels::QuantizedKvRows& rows, int64_t j, int64_t n) {
        kernels::QuantizedScores(level, q, rows, range.first + j, n, scale, scores + j);
      },
      [&](int64_t j, const float* rows, int64_t n) {
        backend.AttentionScores(q, rows, n, head_dim_, scale, scores + j);
      });
  if (in_prefix < range.count) {
    tail_->Scores(backend, layer, kv_head,
                 {range.first + in_prefix - kept, range.count - in_prefix}, q, scale,
                 scores + in_prefix);
  }
}

void CompressedSequenceKv::MixValues(const kernels::KernelBackend& backend, int layer, int kv_head,
                                     KeyRange range, const float* p, float* out) const {
  const CompressedPrefix::Head& head = prefix_->layer(layer).heads[kv_head];
  const int64_t kept = static_cast<int64_t>(head.positions.size());
  const int64_t in_prefix = std::clamp<int64_t>(kept - range.first, 0, range.count);
  ForEachRun(
      *head.values, backend, fused_, range.first, in_prefix, head_dim_,
      [&](kernels::SimdLevel level, const kernels::QuantizedKvRows& rows, int64_t j, int64_t n) {
        kernels::QuantizedAccumulate(level, p + j, rows, range.first + j, n, out);
      },
      [&](int64_t j, const float* rows, int64_t n) {
        backend.AccumulateValues(p + j, rows, n, head_dim_, out);
      });
  if (in_prefix < range.count) {
    tail_->MixValues(backend, layer, kv_head,
                    {range.first + in_prefix - kept, range.count - in_prefix}, p + in_prefix, out);
  }
}

}  // namespace vc
