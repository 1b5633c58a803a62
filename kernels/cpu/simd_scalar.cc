// Portable reference path of the canonical primitives (kernels/kernels.h).
#include <cmath>

#include "kernels/cpu/internal/simd_ops.h"
#include "kernels/kernels.h"

namespace vc::kernels::cpu {
namespace {

float DotScalar(const float* a, const float* b, int64_t n) {
  float lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) lane[l] = std::fma(a[i + l], b[i + l], lane[l]);
  }
  if (i < n) {  // zero-padded last group, as the vector paths load it
    for (int l = 0; l < 16; ++l) {
      const bool in = i + l < n;
      lane[l] = std::fma(in ? a[i + l] : 0.0f, in ? b[i + l] : 0.0f, lane[l]);
    }
  }
  return ReduceLanes16(lane);
}

void MatmulRowsScalar(const float* x, int64_t ldx, int64_t tokens, const float* w,
                      const float* bias, int64_t in, int64_t o_begin, int64_t o_end, int64_t ldy,
                      float* y) {
  // Weight row outermost: each row is read from memory once and stays in
  // cache while every token uses it.
  for (int64_t o = o_begin; o < o_end; ++o) {
    for (int64_t t = 0; t < tokens; ++t) {
      float v = DotScalar(x + t * ldx, w + o * in, in);
      if (bias != nullptr) v += bias[o];
      y[t * ldy + o] = v;
    }
  }
}

void AccumulateScalar(const float* p, const float* v, int64_t n, int64_t dim, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* vj = v + j * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = std::fma(pj, vj[d], out[d]);
  }
}

VC_DEFINE_SCORES(DotScalar)

void ExpInplaceScalar(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Exp(x[i]);
}

}  // namespace

const SimdOps& ScalarOps() {
  static const SimdOps ops{.dot = DotScalar,
                           .matmul_rows = MatmulRowsScalar,
                           .accumulate = AccumulateScalar,
                           .scores = Scores,
                           .exp_inplace = ExpInplaceScalar,
                           .max_no_nan = nullptr,
                           .accumulate_multi = nullptr,
                           .scores_multi = nullptr,
                           .shift_exp = nullptr,
                           .swiglu = nullptr,
                           .scale_inplace = nullptr};
  return ops;
}

}  // namespace vc::kernels::cpu
