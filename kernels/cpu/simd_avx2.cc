// AVX2+FMA path of the canonical primitives: the 16 logical lanes of a dot
// product live in two ymm registers (lanes 0-7 and 8-15). Compiled with
// -mavx2 -mfma; only called after DetectSimdLevel() saw both.
#include <immintrin.h>

#include "kernels/cpu/internal/simd_ops.h"

namespace vc::kernels::cpu {
namespace {

// maskload mask with the first `k` (0..8) lanes set.
inline __m256i PrefixMask(int64_t k) {
  alignas(32) static const int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - k));
}

inline float Reduce(__m256 lo, __m256 hi) {
  alignas(32) float lane[16];
  _mm256_store_ps(lane, lo);
  _mm256_store_ps(lane + 8, hi);
  return ReduceLanes16(lane);
}

float Dot(const float* a, const float* b, int64_t n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
  }
  if (i < n) {
    const int64_t rem = n - i;
    const __m256i mlo = PrefixMask(rem < 8 ? rem : 8), mhi = PrefixMask(rem > 8 ? rem - 8 : 0);
    lo = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, mlo), _mm256_maskload_ps(b + i, mlo), lo);
    hi = _mm256_fmadd_ps(_mm256_maskload_ps(a + i + 8, mhi), _mm256_maskload_ps(b + i + 8, mhi),
                         hi);
  }
  return Reduce(lo, hi);
}

template <int R, int T>
inline void Step(const float* x, const float* w, int64_t in, int64_t o0, int64_t i, __m256i mask,
                 __m256 (&acc)[R][T]) {
  __m256 wv[R];
  for (int r = 0; r < R; ++r) wv[r] = _mm256_maskload_ps(w + (o0 + r) * in + i, mask);
  for (int t = 0; t < T; ++t) {
    const __m256 xv = _mm256_maskload_ps(x + t * in + i, mask);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
  }
}

template <int R, int T>
void Tile(const float* x, const float* w, const float* bias, int64_t in, int64_t o0, int64_t ldy,
          float* y) {
  __m256 lo[R][T], hi[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  const __m256i all = PrefixMask(8);
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    Step<R, T>(x, w, in, o0, i, all, lo);
    Step<R, T>(x, w, in, o0, i + 8, all, hi);
  }
  if (i < in) {
    const int64_t rem = in - i;
    Step<R, T>(x, w, in, o0, i, PrefixMask(rem < 8 ? rem : 8), lo);
    Step<R, T>(x, w, in, o0, i + 8, PrefixMask(rem > 8 ? rem - 8 : 0), hi);
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float v = Reduce(lo[r][t], hi[r][t]);
      if (bias != nullptr) v += bias[o0 + r];
      y[t * ldy + o0 + r] = v;
    }
  }
}

using TileFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                        float*);
constexpr int kRows = 2;
constexpr int kTokens = 3;
template <int R>
constexpr TileFn kTilesForRows[kTokens + 1] = {nullptr, Tile<R, 1>, Tile<R, 2>, Tile<R, 3>};
constexpr const TileFn* kTiles[kRows + 1] = {nullptr, kTilesForRows<1>, kTilesForRows<2>};

void MatmulRows(const float* x, int64_t tokens, const float* w, const float* bias, int64_t in,
                int64_t o_begin, int64_t o_end, int64_t ldy, float* y) {
  int64_t o = o_begin;
  if (tokens == 1) {
    for (; o + 4 <= o_end; o += 4) Tile<4, 1>(x, w, bias, in, o, ldy, y);
  }
  for (; o < o_end; o += kRows) {
    const int r = static_cast<int>(o_end - o < kRows ? o_end - o : kRows);
    for (int64_t t = 0; t < tokens; t += kTokens) {
      const int nt = static_cast<int>(tokens - t < kTokens ? tokens - t : kTokens);
      kTiles[r][nt](x + t * in, w, bias, in, o, ldy, y + t * ldy);
    }
  }
}

void Accumulate(const float* p, const float* v, int64_t n, int64_t dim, float* out) {
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256i m = PrefixMask(dim - d >= 8 ? 8 : dim - d);
    __m256 acc = _mm256_maskload_ps(out + d, m);
    for (int64_t j = 0; j < n; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_maskload_ps(v + j * dim + d, m), acc);
    }
    _mm256_maskstore_ps(out + d, m, acc);
  }
}

}  // namespace

const SimdOps* Avx2Ops() {
  static const SimdOps ops{Dot, MatmulRows, Accumulate};
  return &ops;
}

}  // namespace vc::kernels::cpu
