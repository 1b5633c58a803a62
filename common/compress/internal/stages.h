// The two stages a compressor is made of: a token dropper (which positions
// each KV head keeps) and a quantiser (the row formats of what is kept). A
// pure method has one stage, a composite "<dropper>+<quantiser>" both.
// Private to vc_compress.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compress/attention_stats.h"
#include "common/compress/compressor.h"
#include "common/compress/internal/selection.h"
#include "common/kv/row_codec.h"
#include "common/model/model.h"

namespace vc::compress_internal {

class Dropper {
 public:
  virtual ~Dropper() = default;
  // Kept positions of [0, prefix_len) per layer and KV head (the same count
  // for every head of a layer). prefix_len >= 1 is checked by the caller.
  virtual absl::StatusOr<KeptPositions> Select(const ModelConfig& config, int32_t prefix_len,
                                               const AttentionStats& stats) const = 0;
  // Name and effective parameters, e.g. "snapkv(ratio=0.25,window=16,pool_kernel=7)".
  virtual std::string Describe() const = 0;

  // The online rule. SelectOnline returns the positions to keep among
  // `candidates` (increasing: the current prefix's kept positions of this
  // head, then every position from its end up to total_len) for a sequence
  // of total_len tokens; the same count for every head of a layer. Methods
  // without an online rule keep every candidate (generated tokens exact).
  virtual bool has_online_rule() const { return false; }
  virtual bool online_needs_stats() const { return false; }
  virtual absl::StatusOr<std::vector<int32_t>> SelectOnline(
      const ModelConfig& /*config*/, int /*layer*/, int /*kv_head*/,
      const std::vector<int32_t>& candidates, int32_t /*total_len*/,
      const DecodeAttentionStats* /*stats*/) const {
    return candidates;
  }
};

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  virtual RowCodecSpec KeySpec(const ModelConfig& config) const = 0;
  virtual RowCodecSpec ValueSpec(const ModelConfig& config) const = 0;
  virtual std::string Describe() const = 0;
  // Online: settled tokens to collect outside the prefix before a fold (the
  // formats' residual windows keep the newest rows f32 in any case).
  virtual int32_t online_interval() const = 0;
};

// The compressor table: one row per stage, in listing order. A row holds
// everything the registry and `vericache compressors` know about a method
// (name, family, description, parameters, online kind and rule) and its
// factory; composites "<dropper>+<quantiser>" are made from two rows. Adding
// a method is adding a row.
template <typename Stage>
struct StageEntry {
  CompressorInfo info;
  // Builds the stage from the options (options.name is not read).
  // InvalidArgument on bad parameters; messages start with `label` (the full
  // method name, e.g. "snapkv+kivi").
  absl::StatusOr<std::unique_ptr<Stage>> (*make)(const CompressorOptions& options,
                                                 const std::string& label);
};
const std::vector<StageEntry<Dropper>>& DropperTable();
const std::vector<StageEntry<Quantizer>>& QuantizerTable();

// Compressor::Update for a staged compressor (either stage may be null, not
// both): the dropper's online rule picks the kept positions, then the rows
// are re-encoded in the quantiser's formats (RowStore::Rebuild).
absl::StatusOr<std::shared_ptr<const CompressedPrefix>> UpdateStaged(
    const std::string& label, const Dropper* dropper, const Quantizer* quantizer,
    const ModelConfig& config, const CompressedPrefix& current, const PagedKvCache& tail,
    int32_t fold_upto, const DecodeAttentionStats* stats);

// Shortest text that reads back as the same double ("0.25", "0.1"), so
// Describe() strings are stable and distinguish every distinct ratio.
std::string FormatDouble(double value);

}  // namespace vc::compress_internal
