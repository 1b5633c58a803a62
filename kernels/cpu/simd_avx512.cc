// AVX-512 path of the canonical primitives: one zmm register holds the 16
// logical lanes of a dot product. Compiled with -mavx512f; only called after
// DetectSimdLevel() saw AVX-512F.
#include <immintrin.h>

#include "kernels/cpu/internal/simd_ops.h"

namespace vc::kernels::cpu {
namespace {

inline __mmask16 TailMask(int64_t rem) { return static_cast<__mmask16>((1u << rem) - 1u); }

inline float Reduce(__m512 v) {
  alignas(64) float lane[16];
  _mm512_store_ps(lane, v);
  return ReduceLanes16(lane);
}

float Dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return Reduce(acc);
}

// R weight rows x T tokens, one accumulator per output element.
template <int R, int T>
void Tile(const float* x, const float* w, const float* bias, int64_t in, int64_t o0, int64_t ldy,
          float* y) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(w + (o0 + r) * in + i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * in + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (i < in) {
    const __mmask16 m = TailMask(in - i);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(m, w + (o0 + r) * in + i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * in + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float v = Reduce(acc[r][t]);
      if (bias != nullptr) v += bias[o0 + r];
      y[t * ldy + o0 + r] = v;
    }
  }
}

using TileFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                        float*);
constexpr int kRows = 4;
constexpr int kTokens = 6;
template <int R>
constexpr TileFn kTilesForRows[kTokens + 1] = {nullptr,      Tile<R, 1>, Tile<R, 2>, Tile<R, 3>,
                                               Tile<R, 4>, Tile<R, 5>, Tile<R, 6>};
constexpr const TileFn* kTiles[kRows + 1] = {nullptr, kTilesForRows<1>, kTilesForRows<2>,
                                             kTilesForRows<3>, kTilesForRows<4>};

void MatmulRows(const float* x, int64_t tokens, const float* w, const float* bias, int64_t in,
                int64_t o_begin, int64_t o_end, int64_t ldy, float* y) {
  int64_t o = o_begin;
  if (tokens == 1) {
    // Matrix-vector: more rows per pass keeps more loads in flight.
    for (; o + 8 <= o_end; o += 8) Tile<8, 1>(x, w, bias, in, o, ldy, y);
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
  for (int64_t d = 0; d < dim; d += 16) {
    const __mmask16 m = dim - d >= 16 ? static_cast<__mmask16>(0xFFFF) : TailMask(dim - d);
    __m512 acc = _mm512_maskz_loadu_ps(m, out + d);
    for (int64_t j = 0; j < n; ++j) {
      acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(m, v + j * dim + d), acc);
    }
    _mm512_mask_storeu_ps(out + d, m, acc);
  }
}

}  // namespace

const SimdOps* Avx512Ops() {
  static const SimdOps ops{Dot, MatmulRows, Accumulate};
  return &ops;
}

}  // namespace vc::kernels::cpu
