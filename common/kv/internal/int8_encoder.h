// Private to common/kv: the loops of the INT8 row encoder (row_codec.cc's
// per-token symmetric 8-bit codes), compiled once per SIMD level so that the
// widest one this CPU has does the work, and so that tests can compare them.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace vc::kv_internal {

struct Int8Encoder {
  // The largest |x[c]| over c < n, NaNs left out, +0 if none (what the
  // sequential amax = std::max(amax, std::fabs(x[c])) from 0.0f computes).
  float (*abs_max)(const float* x, int n);
  // out[c] = nearbyint(x[c] / scale) clamped to [-half, half] (a NaN
  // quotient to 0), plus half; all codes `half` when scale is not > 0.
  void (*encode)(const float* x, int n, float scale, int half, uint8_t* out);
};

// The encoder compiled for `level`, or null where this CPU lacks it. Every
// level gives the same results: each lane does the same IEEE operations.
const Int8Encoder* Int8EncoderFor(kernels::SimdLevel level);

}  // namespace vc::kv_internal
