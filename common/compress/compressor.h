// KV compressors behind one interface, selected by name.
//
// Offline compression runs once when a prefix is stored (or right after the
// prompt's prefill): Compress(full KV of the prefix, attention statistics of
// its prefill) -> CompressedPrefix. Online compression runs while a request
// decodes: Update(current compressed view, the drafter's exact tail, fold_upto,
// decode-time attention statistics) -> a new CompressedPrefix covering
// [0, fold_upto), built by the method's published online rule (sliding
// recency window, KIVI's sliding residual, H2O/TOVA eviction), so that the
// drafter's view stays near the method's budget instead of growing by a full
// f32 row per generated token. Methods whose published rule compresses once
// (SnapKV, PyramidKV) have no online rule: their generated tokens stay exact.
// The draft/verify engine and the scheduler never know which method is in
// use; they ask online_policy() when to fold and FoldIntoView does it.
//
// The knob for token dropping is the compression ratio
//   c = bytes of the compressed prefix KV (codes, scales, zero points and
//       kept-position indices) / bytes of the full prefix KV in f32,
// quantisers take `bits`, composites (drop, then quantise) take both: the
// ratio then sizes the dropping stage as if it stored f32, and the
// quantiser shrinks what is kept further. The achieved c is always exact:
// CompressedPrefix::ratio().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compress/attention_stats.h"
#include "common/engine/kv_cache.h"
#include "common/kv/compressed_kv.h"
#include "common/model/model.h"

namespace vc {

struct CompressorOptions {
  std::string name;      // registry name, e.g. "snapkv", "kivi", "snapkv+kivi"
  double ratio = 0.0;    // token dropping: target c in (0, 1]; 0 = not given
  int bits = 0;          // quantisers: 2, 4 or 8; 0 = the method's default
  // Method parameters (ignored by methods that do not use them).
  int sink_tokens = 4;       // StreamingLLM: attention sinks always kept
  int window = 16;           // SnapKV/PyramidKV: observation window; recent tokens always kept
  int pool_kernel = 7;       // SnapKV/PyramidKV: max-pool width over scores (odd)
  int quant_group = 32;      // KIVI: tokens per key group and channels per value group
  int residual = 32;         // KIVI: most recent tokens kept in full precision
  double pyramid_beta = 0.5; // PyramidKV: top layer keeps (1 - beta) x, bottom (1 + beta) x the mean
};

// When the caller should fold settled tokens into the compressed view.
struct OnlinePolicy {
  enum class Kind {
    kNone,       // no online rule: Update fails, generated tokens stay exact
    kEveryToken, // fold whenever a settled token is outside the prefix
    kPerGroup,   // fold once `interval` settled tokens are outside the prefix
  };
  Kind kind = Kind::kNone;
  int32_t interval = 0;  // tokens; 1 for kEveryToken, 0 for kNone
  // Update ranks tokens by decode-time attention (DecodeAttentionStats).
  bool needs_decode_stats = false;
};
const char* OnlinePolicyKindName(OnlinePolicy::Kind kind);  // "none", "every-token", "per-group"

struct CompressorParamInfo {
  std::string name;  // as a CLI flag, e.g. "--ratio"
  std::string default_value;
  std::string description;
};

struct CompressorInfo {
  std::string name;
  std::string family;  // "token-dropping", "quantization" or "composite"
  std::string description;
  bool takes_ratio = false;
  bool takes_bits = false;
  bool needs_attention_stats = false;
  std::vector<CompressorParamInfo> params;
  // The online rule (Compressor::Update): its kind and a sentence saying it.
  OnlinePolicy::Kind online = OnlinePolicy::Kind::kNone;
  std::string online_rule;
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual const CompressorInfo& info() const = 0;
  // Compresses positions [0, prefix_len) of `full`. `stats` holds the
  // prefill's attention statistics (methods that need none ignore it). With
  // a `pool` (idle: never from inside a ParallelFor on it), the encoding runs
  // on it; the result is the same either way.
  virtual absl::StatusOr<std::shared_ptr<const CompressedPrefix>> Compress(
      const ModelConfig& config, const PagedKvCache& full, int32_t prefix_len,
      const AttentionStats& stats, ThreadPool* pool) const = 0;
  absl::StatusOr<std::shared_ptr<const CompressedPrefix>> Compress(
      const ModelConfig& config, const PagedKvCache& full, int32_t prefix_len,
      const AttentionStats& stats) const {
    return Compress(config, full, prefix_len, stats, nullptr);
  }
  // A short stable text naming the method and its effective parameters (part
  // of the compressed variant's key).
  virtual std::string Describe() const = 0;

  // Online compression: a new prefix covering [0, fold_upto) made of
  // `current` and the tail rows [current.prefix_len(), fold_upto) by the
  // method's online rule (info().online_rule); composites apply the
  // dropper's rule, then the quantiser's. `tail` holds the exact rows from
  // current.prefix_len() on (CompressedSequenceKv::tail()). `decode_stats`
  // is required when online_policy().needs_decode_stats. `current` is not
  // changed (it may be shared). InvalidArgument for fold_upto outside
  // [current.prefix_len(), tail.next_position()] or a mismatched tail,
  // FailedPrecondition for a method without an online rule. The caller must
  // only fold settled positions (see FoldIntoView).
  virtual absl::StatusOr<std::shared_ptr<const CompressedPrefix>> Update(
      const ModelConfig& config, const CompressedPrefix& current, const PagedKvCache& tail,
      int32_t fold_upto, const DecodeAttentionStats* decode_stats) const = 0;
  // When to call Update, with this instance's parameters.
  virtual OnlinePolicy online_policy() const = 0;
};

// True when `view` holds enough settled tokens outside its prefix for
// `policy` to fold (never for kNone).
bool ShouldFold(const OnlinePolicy& policy, const CompressedSequenceKv& view);

// Folds the settled tokens [prefix_len, fold_upto) of the drafter's view into
// its compressed prefix: checks fold_upto against the settled length
// (FailedPrecondition: rows past it may still be rolled back or refreshed),
// runs compressor.Update, charges the new prefix's bytes to `arena` (if
// given; *prefix_reservation then holds them and the old prefix's bytes are
// released) and rebases the view. On error nothing changes.
absl::Status FoldIntoView(const Compressor& compressor, const ModelConfig& config,
                          int32_t fold_upto, const DecodeAttentionStats* decode_stats,
                          CompressedSequenceKv* view, KvArena* arena,
                          KvArena::Reservation* prefix_reservation);

// InvalidArgument for unknown names, ratios outside (0, 1], bits on a method
// that takes none, ratio on a pure quantiser, and bad parameters.
absl::StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const CompressorOptions& options);
// Every registered method, in a stable order.
std::vector<CompressorInfo> ListCompressors();

}  // namespace vc
