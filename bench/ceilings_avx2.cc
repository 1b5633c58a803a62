// AVX2+FMA ceilings; compiled with -mavx2 -mfma, only called when the CPU has
// both.
#include <immintrin.h>

#include "bench/ceilings.h"

namespace vc::bench {
namespace {

float Horizontal(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

constexpr int kAcc = 12;  // of the 16 ymm registers

}  // namespace

float ReadSumAvx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    a4 = _mm256_add_ps(a4, _mm256_loadu_ps(p + i + 32));
    a5 = _mm256_add_ps(a5, _mm256_loadu_ps(p + i + 40));
    a6 = _mm256_add_ps(a6, _mm256_loadu_ps(p + i + 48));
    a7 = _mm256_add_ps(a7, _mm256_loadu_ps(p + i + 56));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  return Horizontal(s);
}

float FmaLoopAvx2(int64_t iters) {
  // Named variables (not an array) so that every accumulator stays in a
  // register; the empty asm keeps the compiler from folding the loop.
  // clang-format off
#define VC_ACC(k) __m256 a##k = _mm256_set1_ps(0.001f * (k));
  VC_ACC(0) VC_ACC(1) VC_ACC(2) VC_ACC(3) VC_ACC(4) VC_ACC(5)
  VC_ACC(6) VC_ACC(7) VC_ACC(8) VC_ACC(9) VC_ACC(10) VC_ACC(11)
#undef VC_ACC
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
#define VC_FMA(k) a##k = _mm256_fmadd_ps(a##k, m, c);
    VC_FMA(0) VC_FMA(1) VC_FMA(2) VC_FMA(3) VC_FMA(4) VC_FMA(5)
    VC_FMA(6) VC_FMA(7) VC_FMA(8) VC_FMA(9) VC_FMA(10) VC_FMA(11)
#undef VC_FMA
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    __asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  // clang-format on
  const __m256 s0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                  _mm256_add_ps(a4, a5));
  const __m256 s1 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a6, a7), _mm256_add_ps(a8, a9)),
                                  _mm256_add_ps(a10, a11));
  return Horizontal(_mm256_add_ps(s0, s1));
}

int64_t FmaFlopsPerIterAvx2() { return int64_t{kAcc} * 8 * 2; }

}  // namespace vc::bench
