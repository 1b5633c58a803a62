// A weight-quantised copy of a model's projection matrices (Q/K/V/O, gate,
// up, down and the classifier), made once at load, for a drafter that runs a
// cheaper copy of the target: drafting never has to be exact, only
// verification does, and that always runs the f32 model. Token embeddings
// and norm weights stay f32 (one row is read per token; they are small).
// Formats: kernels/quantized.h and docs/numerics.md.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "kernels/quantized.h"

namespace vc {

struct QuantizedLayerWeights {
  kernels::QuantizedMatrix wq, wk, wv, wo, w1, w2, w3;
};

struct QuantizeOptions {
  kernels::WeightFormat format = kernels::WeightFormat::kInt8;  // int8 or int4
  int int4_group = kernels::kDefaultInt4Group;  // inputs per int4 scale (multiple of 16)
};

class QuantizedWeights {
 public:
  // Quantises every projection of `model` (which the result does not keep).
  static absl::StatusOr<std::unique_ptr<QuantizedWeights>> Create(const Model& model,
                                                                  const QuantizeOptions& options);

  kernels::WeightFormat format() const { return options_.format; }
  const ModelConfig& config() const { return config_; }
  const std::vector<QuantizedLayerWeights>& layers() const { return layers_; }
  const kernels::QuantizedMatrix& classifier() const { return classifier_; }
  // Bytes of codes and scales (what a drafter streams per step).
  int64_t bytes() const;

 private:
  QuantizedWeights() = default;
  QuantizeOptions options_;
  ModelConfig config_;
  std::vector<QuantizedLayerWeights> layers_;
  kernels::QuantizedMatrix classifier_;
};

}  // namespace vc
