// A weight matrix as the model holds it: row-major [rows, cols] in its
// checkpoint's dtype (f32, bf16 or f16). Kernels widen bf16/f16 elements to
// f32 as they read them (kernels::KernelBackend::MatmulTyped), so a narrow
// checkpoint takes half the memory and the results equal widening the whole
// matrix at load (docs/numerics.md, "Model dtype").
#pragma once

#include <cstdint>

#include "common/base/dtype.h"

namespace vc {

struct WeightMatrix {
  const void* data = nullptr;
  Dtype dtype = Dtype::kF32;

  WeightMatrix() = default;
  // f32 storage (what the llama2.c loader and random models produce).
  WeightMatrix(const float* p) : data(p), dtype(Dtype::kF32) {}  // NOLINT: implicit on purpose
  WeightMatrix(const uint16_t* p, Dtype d) : data(p), dtype(d) {}

  explicit operator bool() const { return data != nullptr; }
  bool operator==(const WeightMatrix& o) const { return data == o.data && dtype == o.dtype; }

  // The f32 elements; null unless dtype is f32.
  const float* f32() const {
    return dtype == Dtype::kF32 ? static_cast<const float*>(data) : nullptr;
  }
  // Start of row `row` of a matrix with `cols` columns (for row slices).
  const void* Row(int64_t row, int64_t cols) const {
    return static_cast<const char*>(data) + row * cols * DtypeBytes(dtype);
  }
  // Element i, widened (exact).
  float At(int64_t i) const {
    if (dtype == Dtype::kF32) return static_cast<const float*>(data)[i];
    return WidenBits(static_cast<const uint16_t*>(data)[i], dtype);
  }
};

}  // namespace vc
