// Portable reference path of the quantised-weight products
// (kernels/quantized.h): the definition written out element by element.
#include <cmath>

#include "kernels/cpu/internal/quant_ops.h"
#include "kernels/cpu/internal/simd_ops.h"

namespace vc::kernels::cpu {
namespace {

void Int8Rows(const float* x, int64_t tokens, int64_t ldx, const int8_t* q, const float* scales,
              const float* bias, int64_t padded_in, int64_t o_begin, int64_t o_end, int64_t ldy,
              float* y) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const int8_t* row = q + o * padded_in;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = x + t * ldx;
      float lane[16] = {};
      for (int64_t i = 0; i < padded_in; ++i) {
        lane[i % 16] = std::fma(xt[i], static_cast<float>(row[i]), lane[i % 16]);
      }
      float v = scales[o] * ReduceLanes16(lane);
      if (bias != nullptr) v += bias[o];
      y[t * ldy + o] = v;
    }
  }
}

void Int4Rows(const float* x, int64_t tokens, int64_t ldx, const uint8_t* q, const float* scales,
              int64_t groups, int group, const float* bias, int64_t padded_in, int64_t o_begin,
              int64_t o_end, int64_t ldy, float* y) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* row = q + o * (padded_in / 2);
    const float* s = scales + o * groups;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = x + t * ldx;
      float lane[16] = {};
      for (int64_t i = 0; i < padded_in; ++i) {
        const int64_t b = i / 16, j = i % 16;
        const uint8_t byte = row[b * 8 + j % 8];
        const int nibble = j < 8 ? (byte & 0x0F) : (byte >> 4);
        const float w = static_cast<float>(nibble - 8) * s[i / group];
        lane[j] = std::fma(xt[i], w, lane[j]);
      }
      float v = ReduceLanes16(lane);
      if (bias != nullptr) v += bias[o];
      y[t * ldy + o] = v;
    }
  }
}

}  // namespace

const QuantOps& QuantScalarOps() {
  static const QuantOps ops{Int8Rows, Int4Rows};
  return ops;
}

}  // namespace vc::kernels::cpu
