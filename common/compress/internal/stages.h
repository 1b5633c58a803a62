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
};

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  virtual RowCodecSpec KeySpec(const ModelConfig& config) const = 0;
  virtual RowCodecSpec ValueSpec(const ModelConfig& config) const = 0;
  virtual std::string Describe() const = 0;
};

// Registry names of the stages, in listing order.
const std::vector<std::string>& DropperNames();
const std::vector<std::string>& QuantizerNames();

// Info (family, description, parameters) of a pure method; `name` must be in
// DropperNames() or QuantizerNames().
CompressorInfo DropperInfo(const std::string& name);
CompressorInfo QuantizerInfo(const std::string& name);

// Build a stage from the options (options.name is not read). InvalidArgument
// on bad parameters; the messages start with `label` (the full method name).
absl::StatusOr<std::unique_ptr<Dropper>> MakeDropper(const std::string& name,
                                                     const CompressorOptions& options,
                                                     const std::string& label);
absl::StatusOr<std::unique_ptr<Quantizer>> MakeQuantizer(const std::string& name,
                                                         const CompressorOptions& options,
                                                         const std::string& label);

// Shortest text that reads back as the same double ("0.25", "0.1"), so
// Describe() strings are stable and distinguish every distinct ratio.
std::string FormatDouble(double value);

}  // namespace vc::compress_internal
