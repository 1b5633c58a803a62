// AVX2+FMA path of the canonical primitives: the 16 logical lanes of a dot
// product live in two ymm registers (lanes 0-7 and 8-15). Compiled with
// -mavx2 -mfma; only called after DetectSimdLevel() saw both.
#include <immintrin.h>

#include <cmath>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/internal/simd_ops.h"

namespace vc::kernels::cpu {
namespace {

// maskload mask with the first `k` (0..8) lanes set.
inline __m256i PrefixMask(int64_t k) {
  alignas(32) static const int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - k));
}

// The canonical tree (ReduceLanes16) done in registers: every step adds the
// same pairs of lanes as the scalar tree, lower lane first, so the result is
// bit-identical.
inline float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);  // l[k] + l[k+8]
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));    // s4[k] + s4[k+2]
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));  // s2[0] + s2[1]
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
    hi =
        _mm256_fmadd_ps(_mm256_maskload_ps(a + i + 8, mhi), _mm256_maskload_ps(b + i + 8, mhi), hi);
  }
  return Reduce(lo, hi);
}

// One 8-lane half of a step: w row r at wr + r * in + i, token t at
// x + t * ldx + i; Load is a plain or a masked load.
template <int R, int T, typename Load>
inline void Step(const float* x, int64_t ldx, const float* wr, int64_t in, int64_t i, Load load,
                 __m256 (&acc)[R][T]) {
  __m256 wv[R];
  for (int r = 0; r < R; ++r) wv[r] = load(wr + r * in + i);
  for (int t = 0; t < T; ++t) {
    const __m256 xv = load(x + t * ldx + i);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
  }
}

inline void PrefetchL2(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
}

// R weight rows x T tokens (token t's row at x + t * ldx); each output
// element has its 16 lanes in lo (0-7) and hi (8-15). With a non-null `pf` it
// also prefetches the R rows starting at pf (the next row group's weights)
// into L2, one cache line per row per step.
template <int R, int T>
void Tile(const float* x, int64_t ldx, const float* w, const float* bias, int64_t in, int64_t o0,
          int64_t ldy, float* y, const float* pf) {
  __m256 lo[R][T], hi[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  const float* wr = w + o0 * in;
  auto plain = [](const float* p) { return _mm256_loadu_ps(p); };
  int64_t i = 0;
  if (pf != nullptr) {
    for (; i + 16 <= in; i += 16) {
      for (int r = 0; r < R; ++r) PrefetchL2(pf + r * in + i);
      Step<R, T>(x, ldx, wr, in, i, plain, lo);
      Step<R, T>(x, ldx, wr, in, i + 8, plain, hi);
    }
  } else {
    for (; i + 16 <= in; i += 16) {
      Step<R, T>(x, ldx, wr, in, i, plain, lo);
      Step<R, T>(x, ldx, wr, in, i + 8, plain, hi);
    }
  }
  if (i < in) {  // zero-padded last group
    const int64_t rem = in - i;
    const __m256i mlo = PrefixMask(rem < 8 ? rem : 8), mhi = PrefixMask(rem > 8 ? rem - 8 : 0);
    Step<R, T>(
        x, ldx, wr, in, i, [mlo](const float* p) { return _mm256_maskload_ps(p, mlo); }, lo);
    Step<R, T>(
        x, ldx, wr, in, i + 8, [mhi](const float* p) { return _mm256_maskload_ps(p, mhi); }, hi);
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float v = Reduce(lo[r][t], hi[r][t]);
      if (bias != nullptr) v += bias[o0 + r];
      y[t * ldy + o0 + r] = v;
    }
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, const float*, int64_t, int64_t,
                        int64_t, float*, const float*);
constexpr int kRows = 2;
constexpr int kTokens = 3;
template <int R>
constexpr TileFn kTilesForRows[kTokens + 1] = {nullptr, Tile<R, 1>, Tile<R, 2>, Tile<R, 3>};
constexpr const TileFn* kTiles[kRows + 1] = {nullptr, kTilesForRows<1>, kTilesForRows<2>};
// Tokens are processed in spans of at most this many (which bounds the copy
// of x below).
constexpr int64_t kSpanTokens = 48;

// As in simd_avx512.cc: only the visiting order of output elements, where x
// is read from and the prefetches are chosen here; every element is still
// one Tile accumulator pair over the whole row.
void MatmulRows(const float* x, int64_t tokens, const float* w, const float* bias, int64_t in,
                int64_t o_begin, int64_t o_end, int64_t ldy, float* y) {
  int64_t o = o_begin;
  if (tokens == 1) {
    for (; o + 4 <= o_end; o += 4) {
      const float* pf = o + 8 <= o_end ? w + (o + 4) * in : nullptr;
      Tile<4, 1>(x, in, w, bias, in, o, ldy, y, pf);
    }
    if (o == o_end) return;
  }
  const int64_t o_first = o;
  // x rows with a stride that is a multiple of 2 KiB alias in L1 (see
  // simd_avx512.cc); they are copied (exactly) into 64-byte longer rows.
  const bool pack = in % 512 == 0;
  thread_local std::vector<float> packed;
  for (int64_t ts = 0; ts < tokens; ts += kSpanTokens) {
    const int64_t span = std::min(tokens - ts, kSpanTokens);
    const float* xs = x + ts * in;
    int64_t ldx = in;
    if (pack) {
      ldx = in + 16;
      packed.resize(static_cast<size_t>(span * ldx + 16));
      float* buf = packed.data();
      buf += (16 - (reinterpret_cast<uintptr_t>(buf) / 4) % 16) % 16;  // 64-byte aligned
      for (int64_t t = 0; t < span; ++t) std::copy_n(xs + t * in, in, buf + t * ldx);
      xs = buf;
    }
    // Near-equal token tiles of at most kTokens; the first tile of a row
    // group prefetches the next group's weights.
    const int64_t ntiles = (span + kTokens - 1) / kTokens;
    for (o = o_first; o < o_end; o += kRows) {
      const int r = static_cast<int>(o_end - o < kRows ? o_end - o : kRows);
      const float* pf = o + int64_t{2} * kRows <= o_end ? w + (o + kRows) * in : nullptr;
      for (int64_t k = 0, t = 0; k < ntiles; ++k) {
        const int64_t t1 = span * (k + 1) / ntiles;
        kTiles[r][t1 - t](xs + t * ldx, ldx, w, bias, in, o, ldy, y + (ts + t) * ldy,
                          k == 0 ? pf : nullptr);
        t = t1;
      }
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

VC_DEFINE_SCORES(Dot)

// kernels::Exp, 8 lanes at a time, with the same IEEE operations in the same
// order; the scalar branches become lane blends.
inline __m256 Pow2(__m256i e) {  // 2^e for e in [-126, 127]
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}

inline __m256 Exp8(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(kExpP0);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpP1));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpP2));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpP3));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpP4));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpP5));
  const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
                                 _mm256_set1_ps(1.0f));
  const __m256 n_clamped = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-1000.f)),
                                         _mm256_set1_ps(1000.f));
  const __m256i e = _mm256_cvtps_epi32(n_clamped);
  const __m256i lo = _mm256_set1_epi32(-126), hi = _mm256_set1_epi32(127);
  const __m256 mid = _mm256_mul_ps(y, Pow2(_mm256_min_epi32(_mm256_max_epi32(e, lo), hi)));
  const __m256 big = _mm256_mul_ps(
      _mm256_mul_ps(y, Pow2(_mm256_min_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), hi))),
      _mm256_set1_ps(2.0f));
  const __m256 small = _mm256_mul_ps(
      _mm256_mul_ps(y, Pow2(_mm256_max_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(64)), lo))),
      _mm256_set1_ps(0x1p-64f));
  __m256 out = mid;
  out = _mm256_blendv_ps(out, big, _mm256_castsi256_ps(_mm256_cmpgt_epi32(e, hi)));
  out = _mm256_blendv_ps(out, small, _mm256_castsi256_ps(_mm256_cmpgt_epi32(lo, e)));
  out = _mm256_blendv_ps(out, _mm256_setzero_ps(),
                         _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_LT_OQ));
  out = _mm256_blendv_ps(out, _mm256_set1_ps(INFINITY),
                         _mm256_cmp_ps(x, _mm256_set1_ps(kExpHi), _CMP_GT_OQ));
  out = _mm256_blendv_ps(out, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return out;
}

void ExpInplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, Exp8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = PrefixMask(n - i);
    _mm256_maskstore_ps(x + i, m, Exp8(_mm256_maskload_ps(x + i, m)));
  }
}

bool MaxNoNan(const float* x, int64_t n, float* max) {
  const __m256 lowest = _mm256_set1_ps(-INFINITY);
  __m256 m = lowest;
  int nan = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, v);
  }
  if (i < n) {
    const __m256i tail = PrefixMask(n - i);
    const __m256 v =
        _mm256_blendv_ps(lowest, _mm256_maskload_ps(x + i, tail), _mm256_castsi256_ps(tail));
    nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, v);
  }
  if (nan != 0) return false;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  *max = MaxOfLanes(lanes, 8);
  return true;
}

}  // namespace

const SimdOps* Avx2Ops() {
  static const SimdOps ops{.dot = Dot,
                           .matmul_rows = MatmulRows,
                           .accumulate = Accumulate,
                           .scores = Scores,
                           .exp_inplace = ExpInplace,
                           .max_no_nan = MaxNoNan,
                           .accumulate_multi = nullptr,
                           .scores_multi = nullptr};
  return &ops;
}

}  // namespace vc::kernels::cpu
