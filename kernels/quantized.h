// Matrix products over weight-quantised matrices, for drafters that run a
// cheap copy of the target model (drafting never has to be exact; only
// verification does, and that always runs the f32 target).
//
// Formats (docs/numerics.md, "Quantised weights"). A row of `in` weights is
// padded with zero weights to padded_in = in rounded up to 16.
//  * int8: per output row o one f32 scale s[o] and int8 q in [-127, 127];
//    data is [out][padded_in] int8.
//  * int4: per output row and group of `group` (a multiple of 16) inputs one
//    f32 scale; q in [-8, 7] stored as the nibble q + 8. Each 16-element block
//    b of a row is 8 bytes: byte j holds element 16b + j in its low nibble
//    and element 16b + j + 8 in its high nibble. data is [out][padded_in / 2];
//    scales are [out][groups], groups = ceil(in / group), the last group
//    partial when group does not divide in.
//
// Numerics, the same on every SIMD level, thread count and batch shape:
// output (t, o) uses the 16 logical lanes of kernels.h over padded_in
// elements (x padded with zeros), element i into lane i % 16 by one FMA in
// increasing i, then the fixed lane tree, with
//  * int8: lane = fma(x[i], float(q[i]), lane); y = s[o] * tree (+ bias[o]);
//  * int4: lane = fma(x[i], float(q[i]) * s[o][i / group], lane) (the product
//    rounded to f32 first); y = tree (+ bias[o]).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace vc {
class ThreadPool;
}

namespace vc::kernels {

enum class WeightFormat { kF32, kInt8, kInt4 };

// "f32", "int8", "int4"; anything else is InvalidArgument.
absl::StatusOr<WeightFormat> ParseWeightFormat(std::string_view name);
std::string_view WeightFormatName(WeightFormat format);

inline constexpr int kDefaultInt4Group = 32;

struct QuantizedMatrix {
  WeightFormat format = WeightFormat::kInt8;
  int64_t out = 0;
  int64_t in = 0;
  int64_t padded_in = 0;
  int group = 0;       // int4: inputs per scale
  int64_t groups = 0;  // int4: scales per row (1 for int8)
  std::vector<uint8_t> data;
  std::vector<float> scales;

  int64_t bytes() const {
    return static_cast<int64_t>(data.size() + scales.size() * sizeof(float));
  }
};

// Quantises a row-major f32 [out, in] matrix: symmetric, scale = max |w| of
// the row (int8) or group (int4) / 127 or / 7, q = round-to-nearest(w / s).
// `group` (int4 only) must be a positive multiple of 16.
absl::StatusOr<QuantizedMatrix> Quantize(const float* w, int64_t out, int64_t in,
                                         WeightFormat format, int group = kDefaultInt4Group);

// y[t * w.out + o] = output (t, o) above for t < tokens, o < w.out; x is
// [tokens, w.in] row-major, bias [w.out] or null. Work is split over output
// rows on `pool` (null: the calling thread only); never from inside a
// ParallelFor on the same pool.
void QuantizedMatmul(SimdLevel level, ThreadPool* pool, const float* x, int64_t tokens,
                     const QuantizedMatrix& w, const float* bias, float* y);

}  // namespace vc::kernels
