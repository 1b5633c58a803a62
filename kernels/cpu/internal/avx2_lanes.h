// Private to kernels/cpu: the canonical lane tree (ReduceLanes16 in
// simd_ops.h) on ymm registers, where the 16 logical lanes of a dot product
// live in two of them (lanes 0-7 and 8-15), for the translation units
// compiled with -mavx2 -mfma (and only those: never include this from code
// that runs on a CPU without AVX2). The functions are static so that each
// such unit keeps its own copy, as avx512_lanes.h's do.
#pragma once

#include <immintrin.h>

namespace vc::kernels::cpu {

// The canonical tree done in registers: every step adds the same pairs of
// lanes as the scalar tree, lower lane first, so the result is
// bit-identical.
static inline float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);  // l[k] + l[k+8]
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));    // s4[k] + s4[k+2]
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));  // s2[0] + s2[1]
}

// The canonical tree of 4 outputs at once, each given as its level-1 sums
// s[k] = lo[k] + hi[k] (k < 8): lane i of the result is output i's
// ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])) in the
// scalar tree's pairing, exactly Reduce(lo, hi) for each.
static inline __m128 Reduce4Level1(__m256 a, __m256 b, __m256 c, __m256 d) {
  // Level 2 (x[k] + x[k+4]): [a' | b'] and [c' | d'], 4 lanes each.
  const __m256 ab =
      _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd =
      _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  // Level 3 (x[k] + x[k+2]): per 128-bit lane [a'0+a'2, a'1+a'3, c'0+c'2,
  // c'1+c'3 | the same for b', d'].
  const __m256 l3 = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // Level 4 (x[0] + x[1]): [a, c, a, c | b, d, b, d].
  const __m256 l4 = _mm256_add_ps(_mm256_shuffle_ps(l3, l3, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm256_shuffle_ps(l3, l3, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m256 abcd = _mm256_permutevar8x32_ps(l4, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
  return _mm256_castps256_ps128(abcd);
}

// Lane i of the result is Reduce(lo[i], hi[i]), for 4 outputs.
static inline __m128 Reduce4(const __m256 (&lo)[4], const __m256 (&hi)[4]) {
  return Reduce4Level1(_mm256_add_ps(lo[0], hi[0]), _mm256_add_ps(lo[1], hi[1]),
                       _mm256_add_ps(lo[2], hi[2]), _mm256_add_ps(lo[3], hi[3]));
}

}  // namespace vc::kernels::cpu
