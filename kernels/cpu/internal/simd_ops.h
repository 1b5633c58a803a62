// Private to kernels/cpu: one table of the canonical primitives per SIMD
// level. Each level lives in its own translation unit compiled with that
// level's -m flags; nothing else is compiled with them.
#pragma once

#include <cstdint>

namespace vc::kernels::cpu {

struct SimdOps {
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[t*ldy + o] = (bias? bias[o] : 0) + dot(x + t*ldx, w + o*in, in) for t
  // in [0, tokens), o in [o_begin, o_end); ldx >= in.
  void (*matmul_rows)(const float* x, int64_t ldx, int64_t tokens, const float* w,
                      const float* bias, int64_t in, int64_t o_begin, int64_t o_end, int64_t ldy,
                      float* y);
  // out[d] = fma(p[j], v[j*dim + d], out[d]), j in order.
  void (*accumulate)(const float* p, const float* v, int64_t n, int64_t dim, float* out);
  // scores[j] = dot(q, k + j*dim, dim) * scale, j < n (one call per head
  // instead of one indirect call per key).
  void (*scores)(const float* q, const float* k, int64_t n, int64_t dim, float scale,
                 float* scores);
  // x[i] = kernels::Exp(x[i]) bit for bit (same operations, vectorised).
  void (*exp_inplace)(float* x, int64_t n);
  // *max = the max of x[0, n) (n >= 1) and true, or false when x holds a
  // NaN; null where a level has none.
  bool (*max_no_nan)(const float* x, int64_t n, float* max);
  // accumulate for nq weight rows over the same values (row t at
  // p + t * ldp, into out + t * dim), each output exactly accumulate's
  // (several rows' FMA chains side by side hide the FMA latency); null where
  // a level has none.
  // `ahead` (ahead_rows rows of dim floats, or null) is what the caller
  // reads next: a level may stream it into L2 while it works (a hint, never
  // a value; see KernelBackend::RowsAhead).
  void (*accumulate_multi)(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t n,
                           int64_t dim, float* out, const float* ahead, int64_t ahead_rows);
  // scores[t * ld + j] = dot(q + t * dim, k + j * dim, dim) * scale for
  // t < nq, j < n, bit for bit; false (nothing written) for a shape the
  // level has no kernel for. Null where a level has none. `ahead` as in
  // accumulate_multi.
  bool (*scores_multi)(const float* q, int64_t nq, const float* k, int64_t n, int64_t dim,
                       float scale, float* scores, int64_t ld, const float* ahead,
                       int64_t ahead_rows);
  // x[i] = kernels::Exp(x[i] - m) bit for bit, in one pass; null where a
  // level has none.
  void (*shift_exp)(float* x, int64_t n, float m);
  // gate[i] = gate[i] / (1 + kernels::Exp(-gate[i])) * up[i] (SiLU(gate) *
  // up) bit for bit: the scalar expression's negation, Exp, add, divide and
  // multiply, in its order, a vector at a time. Null where a level has none.
  void (*swiglu)(float* gate, const float* up, int64_t n);
  // x[i] *= s, a vector at a time (the softmax's normalising multiply; the
  // tree is built for baseline x86-64, where the loop gets 4 lanes). Null
  // where a level has none.
  void (*scale_inplace)(float* x, int64_t n, float s);
};

// The constants of kernels::Exp (Cephes expf), shared by every level.
inline constexpr float kExpHi = 88.72283f;
inline constexpr float kExpLo = -103.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;
// Inputs in [kExpFastLo, kExpFastHi] give n = nearbyint(x * log2(e)) in
// [-126, 127]: Exp is y * 2^n there, with no range case to select.
inline constexpr float kExpFastLo = -87.0f;
inline constexpr float kExpFastHi = 88.0f;

// Defines the `scores_multi` entry of a SIMD table from that translation
// unit's own ScoresRows<C> template (keys of dim 16 * C): heads whose dim is
// a multiple of 16 and at most 128 (every real head); false for any other,
// whose scores the caller computes on the general path.
#define VC_DEFINE_SCORES_MULTI(ROWS)                                                              \
  bool ScoresMulti(const float* q, int64_t nq, const float* k, int64_t n, int64_t dim,            \
                   float scale, float* scores, int64_t ld, const float* ahead,                    \
                   int64_t ahead_rows) {                                                          \
    using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, float, float*, int64_t, \
                            const float*, int64_t);                                               \
    static constexpr RowsFn kRows[9] = {nullptr, ROWS<1>, ROWS<2>, ROWS<3>, ROWS<4>,              \
                                        ROWS<5>, ROWS<6>, ROWS<7>, ROWS<8>};                      \
    if (dim % 16 != 0 || dim > 128 || dim == 0) return false;                                     \
    kRows[dim / 16](q, nq, k, n, scale, scores, ld, ahead, ahead != nullptr ? ahead_rows : 0);    \
    return true;                                                                                  \
  }

// Defines the `scores` entry of a SIMD table from that translation unit's
// own (inlinable) Dot.
#define VC_DEFINE_SCORES(DOT)                                                          \
  void Scores(const float* q, const float* k, int64_t n, int64_t dim, float scale,     \
              float* scores) {                                                         \
    for (int64_t j = 0; j < n; ++j) scores[j] = DOT(q, k + j * dim, dim) * scale;      \
  }

const SimdOps& ScalarOps();
const SimdOps* Avx2Ops();    // null when not compiled in
const SimdOps* Avx512Ops();  // null when not compiled in

// The max of a vector max's lanes (no NaN among them; any order).
static inline float MaxOfLanes(const float* lanes, int n) {
  float r = lanes[0];
  for (int l = 1; l < n; ++l) r = r < lanes[l] ? lanes[l] : r;
  return r;
}

// The fixed pairwise tree over 16 lanes. static: each SIMD translation unit
// gets its own copy, so no AVX-512 code can be linked into the scalar path.
static inline float ReduceLanes16(const float* l) {
  float s8[8], s4[4], s2[2];
  for (int k = 0; k < 8; ++k) s8[k] = l[k] + l[k + 8];
  for (int k = 0; k < 4; ++k) s4[k] = s8[k] + s8[k + 4];
  for (int k = 0; k < 2; ++k) s2[k] = s4[k] + s4[k + 2];
  return s2[0] + s2[1];
}

// accumulate_multi over a level's own AccumulateRows<Q> (Q = 1..kMaxRows
// weight rows per pass over the values, rows[Q]): nq rows in near-equal
// groups of at most kMaxRows (9 rows, at most 6: 5 + 4). The first group,
// the one that reads the values from memory, streams `ahead` into L2.
// static, as above.
using AccumulateRowsFn = void (*)(const float* const* p, const float* v, int64_t n, int64_t dim,
                                  float* const* out, const float* ahead, int64_t ahead_rows);
template <int kMaxRows>
static inline void AccumulateInGroups(const AccumulateRowsFn (&rows)[kMaxRows + 1], const float* p,
                                      int64_t ldp, int64_t nq, const float* v, int64_t n,
                                      int64_t dim, float* out, const float* ahead,
                                      int64_t ahead_rows) {
  const int64_t groups = (nq + kMaxRows - 1) / kMaxRows;
  for (int64_t g = 0, t = 0; g < groups; ++g) {
    const int64_t t1 = nq * (g + 1) / groups;
    const float* pr[kMaxRows];
    float* o[kMaxRows];
    for (int64_t i = t; i < t1; ++i) {
      pr[i - t] = p + i * ldp;
      o[i - t] = out + i * dim;
    }
    rows[t1 - t](pr, v, n, dim, o, g == 0 ? ahead : nullptr,
                 g == 0 && ahead != nullptr ? ahead_rows : 0);
    t = t1;
  }
}

}  // namespace vc::kernels::cpu
