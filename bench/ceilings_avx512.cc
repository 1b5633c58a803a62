// AVX-512 ceilings; compiled with -mavx512f, only called when the CPU has it.
#include <immintrin.h>

#include "bench/ceilings.h"

namespace vc::bench {
namespace {

// (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized, so sum by hand.)
float Horizontal(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  float s = 0;
  for (float x : l) s += x;
  return s;
}

}  // namespace

float ReadSumAvx512(const float* p, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
    a4 = _mm512_add_ps(a4, _mm512_loadu_ps(p + i + 64));
    a5 = _mm512_add_ps(a5, _mm512_loadu_ps(p + i + 80));
    a6 = _mm512_add_ps(a6, _mm512_loadu_ps(p + i + 96));
    a7 = _mm512_add_ps(a7, _mm512_loadu_ps(p + i + 112));
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  return Horizontal(s);
}

namespace {
constexpr int kAcc = 16;  // 16 of the 32 zmm registers: covers latency x throughput
}

float FmaLoopAvx512(int64_t iters) {
  // Named variables (not an array) so that every accumulator stays in a
  // register; the empty asm keeps the compiler from folding the loop.
  // clang-format off
#define VC_ACC(k) __m512 a##k = _mm512_set1_ps(0.001f * (k));
  VC_ACC(0) VC_ACC(1) VC_ACC(2) VC_ACC(3) VC_ACC(4) VC_ACC(5) VC_ACC(6) VC_ACC(7)
  VC_ACC(8) VC_ACC(9) VC_ACC(10) VC_ACC(11) VC_ACC(12) VC_ACC(13) VC_ACC(14) VC_ACC(15)
#undef VC_ACC
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
#define VC_FMA(k) a##k = _mm512_fmadd_ps(a##k, m, c);
    VC_FMA(0) VC_FMA(1) VC_FMA(2) VC_FMA(3) VC_FMA(4) VC_FMA(5) VC_FMA(6) VC_FMA(7)
    VC_FMA(8) VC_FMA(9) VC_FMA(10) VC_FMA(11) VC_FMA(12) VC_FMA(13) VC_FMA(14) VC_FMA(15)
#undef VC_FMA
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                     "+v"(a7));
    __asm__ volatile("" : "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11), "+v"(a12), "+v"(a13),
                     "+v"(a14), "+v"(a15));
  }
  // clang-format on
  const __m512 s0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                  _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  const __m512 s1 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                  _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15)));
  return Horizontal(_mm512_add_ps(s0, s1));
}

int64_t FmaFlopsPerIterAvx512() { return int64_t{kAcc} * 16 * 2; }

}  // namespace vc::bench
