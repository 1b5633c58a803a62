// Private to kernels/: one table of the quantised-weight products per SIMD
// level (kernels/quantized.h states their numerics). Like simd_ops.h, each
// level is its own translation unit compiled with that level's -m flags.
#pragma once

#include <cstdint>

namespace vc::kernels::cpu {

// Output rows [o_begin, o_end) for `tokens` tokens: token t's input at
// x + t * ldx, padded_in floats (already zero-padded); y[t * ldy + o].
struct QuantOps {
  void (*int8_rows)(const float* x, int64_t tokens, int64_t ldx, const int8_t* q,
                    const float* scales, const float* bias, int64_t padded_in, int64_t o_begin,
                    int64_t o_end, int64_t ldy, float* y);
  // scales is [out][groups]; group is a multiple of 16.
  void (*int4_rows)(const float* x, int64_t tokens, int64_t ldx, const uint8_t* q,
                    const float* scales, int64_t groups, int group, const float* bias,
                    int64_t padded_in, int64_t o_begin, int64_t o_end, int64_t ldy, float* y);
};

const QuantOps& QuantScalarOps();
const QuantOps* QuantAvx2Ops();    // null when not compiled in
const QuantOps* QuantAvx512Ops();  // null when not compiled in

}  // namespace vc::kernels::cpu
