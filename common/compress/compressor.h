// KV compressors behind one interface, selected by name.
//
// Offline compressors run once when a prefix is stored (or right after the
// prompt's prefill): Compress(full KV of the prefix, attention statistics of
// its prefill) -> CompressedPrefix. The draft/verify engine and the
// scheduler never know which method is in use. (Online refinement while a
// request decodes — evicting from the drafter's view as tokens are accepted —
// is not implemented yet: every method here is offline, and the drafter's
// tail of generated tokens stays exact.)
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
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual const CompressorInfo& info() const = 0;
  // Compresses positions [0, prefix_len) of `full`. `stats` holds the
  // prefill's attention statistics (methods that need none ignore it).
  virtual absl::StatusOr<std::shared_ptr<const CompressedPrefix>> Compress(
      const ModelConfig& config, const PagedKvCache& full, int32_t prefix_len,
      const AttentionStats& stats) const = 0;
  // A short stable text naming the method and its effective parameters (part
  // of the compressed variant's key).
  virtual std::string Describe() const = 0;
};

// InvalidArgument for unknown names, ratios outside (0, 1], bits on a method
// that takes none, ratio on a pure quantiser, and bad parameters.
absl::StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const CompressorOptions& options);
// Every registered method, in a stable order.
std::vector<CompressorInfo> ListCompressors();

}  // namespace vc
