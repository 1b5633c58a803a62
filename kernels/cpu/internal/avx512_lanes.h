// Private to kernels/cpu: the canonical lane tree (ReduceLanes16 in
// simd_ops.h) on zmm registers, for the translation units compiled with
// -mavx512f (and only those: never include this from code that runs on a CPU
// without AVX-512). The functions are static so that each such unit keeps its
// own copy, as simd_ops.h's helpers do.
#pragma once

#include <immintrin.h>

namespace vc::kernels::cpu {

// GCC 12 implements the unmasked AVX-512 shuffles, extracts and casts from a
// zmm with _mm512_undefined_ps(), which trips -Wuninitialized; the maskz_
// forms with a full mask are the same instructions, and the halves of a
// register are taken with __builtin_shufflevector.
constexpr __mmask16 kAllLanes = 0xFFFF;
static inline __m256 Lo256(__m512 v) {
  return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
}
static inline __m256 Hi256(__m512 v) {
  return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
}
static inline __m128 Lo128(__m512 v) { return __builtin_shufflevector(v, v, 0, 1, 2, 3); }

// The canonical tree done in registers. Every step adds the same pairs of
// lanes as the scalar tree, lower lane first, so the results are
// bit-identical; only the lanes' positions in the registers differ.
static inline float Reduce(__m512 v) {
  const __m256 s8 = _mm256_add_ps(Lo256(v), Hi256(v));  // l[k] + l[k+8]
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));    // s4[k] + s4[k+2]
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));  // s2[0] + s2[1]
}

// Level 1 of the tree for two registers: [a[k] + a[k+8] | b[k] + b[k+8]], k < 8.
static inline __m512 Fold8(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAllLanes, a, b, 0x44),
                       _mm512_maskz_shuffle_f32x4(kAllLanes, a, b, 0xEE));
}

// Level 2 for two level-1 results ab = [A | B], cd = [C | D] (8 lanes each):
// quarter j of the result is X[k] + X[k+4], k < 4, for X = A, B, C, D.
static inline __m512 Fold4(__m512 ab, __m512 cd) {
  return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAllLanes, ab, cd, 0x88),
                       _mm512_maskz_shuffle_f32x4(kAllLanes, ab, cd, 0xDD));
}

// Lane i of the result is Reduce(v_i), for 4 registers.
static inline __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 u = Fold4(Fold8(a, b), Fold8(c, d));
  const __m512 v = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0xEE));  // [k] + [k+2] per quarter
  const __m512 z = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0x55));  // [0] + [1] per quarter
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return Lo128(_mm512_maskz_permutexvar_ps(kAllLanes, idx, z));
}

// Lane i of the result is Reduce(v_i), for 8 registers.
static inline __m256 Reduce8(__m512 a, __m512 b, __m512 c, __m512 d, __m512 e, __m512 f, __m512 g,
                             __m512 h) {
  const __m512 u1 = Fold4(Fold8(a, b), Fold8(c, d));  // quarters: a b c d
  const __m512 u2 = Fold4(Fold8(e, f), Fold8(g, h));  // quarters: e f g h
  // Per quarter j: [X[0]+X[2], X[1]+X[3], Y[0]+Y[2], Y[1]+Y[3]], X from u1, Y from u2.
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u1, u2, 0x44), _mm512_shuffle_ps(u1, u2, 0xEE));
  // Per quarter j: [X, Y, X, Y], the finished sums of outputs j and j + 4.
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(v, v, 0x88), _mm512_shuffle_ps(v, v, 0xDD));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return Lo256(_mm512_maskz_permutexvar_ps(kAllLanes, idx, z));
}

}  // namespace vc::kernels::cpu
