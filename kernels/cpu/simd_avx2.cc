// AVX2+FMA path of the canonical primitives: the 16 logical lanes of a dot
// product live in two ymm registers (lanes 0-7 and 8-15). Compiled with
// -mavx2 -mfma; only called after DetectSimdLevel() saw both.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

#include "kernels/cpu/internal/avx2_lanes.h"
#include "kernels/cpu/internal/simd_ops.h"

namespace vc::kernels::cpu {
namespace {

// maskload mask with the first `k` (0..8) lanes set.
inline __m256i PrefixMask(int64_t k) {
  alignas(32) static const int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - k));
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
inline void PrefetchL1(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
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
// Tokens are processed in spans of at most this many, each span's x rows
// staying in L2 while every row group passes over them.
constexpr int64_t kSpanTokens = 48;

// As in simd_avx512.cc: only the visiting order of output elements and the
// prefetches are chosen here; every element is still one Tile accumulator
// pair over the whole row.
void MatmulRows(const float* x, int64_t ldx, int64_t tokens, const float* w, const float* bias,
                int64_t in, int64_t o_begin, int64_t o_end, int64_t ldy, float* y) {
  int64_t o = o_begin;
  // Over short rows (the row-parallel column blocks) the tiles prefetch the
  // row group two groups ahead, as the AVX-512 level does: vc_matmul_bench
  // --simd avx2 --tokens 9 --shapes 1024x1024/8,2816x1024/8, three
  // alternations, 2816x1024/8 9 tokens 0.467-0.523 against 0.553-0.566 ms, 1
  // token 0.230-0.269 against 0.282-0.300; 1024x1024/8 within the noise.
  const int64_t groups_ahead = in < 512 ? 2 : 1;
  if (tokens == 1) {
    for (; o + 4 <= o_end; o += 4) {
      const float* pf =
          o + 4 + 4 * groups_ahead <= o_end ? w + (o + 4 * groups_ahead) * in : nullptr;
      Tile<4, 1>(x, ldx, w, bias, in, o, ldy, y, pf);
    }
    if (o == o_end) return;
  }
  const int64_t o_first = o;
  for (int64_t ts = 0; ts < tokens; ts += kSpanTokens) {
    const int64_t span = std::min(tokens - ts, kSpanTokens);
    const float* xs = x + ts * ldx;
    // Near-equal token tiles of at most kTokens; the first tile of a row
    // group prefetches the next group's weights.
    const int64_t ntiles = (span + kTokens - 1) / kTokens;
    for (o = o_first; o < o_end; o += kRows) {
      const int r = static_cast<int>(o_end - o < kRows ? o_end - o : kRows);
      const float* pf =
          o + kRows + kRows * groups_ahead <= o_end ? w + (o + kRows * groups_ahead) * in : nullptr;
      for (int64_t k = 0, t = 0; k < ntiles; ++k) {
        const int64_t t1 = span * (k + 1) / ntiles;
        kTiles[r][t1 - t](xs + t * ldx, ldx, w, bias, in, o, ldy, y + (ts + t) * ldy,
                          k == 0 ? pf : nullptr);
        t = t1;
      }
    }
  }
}

// Value rows are asked for this many keys ahead, one prefetch per cache
// line of the pass's dims (as the AVX-512 level does; a 9-query pass's value
// sums over 3000 keys of 64-dim heads: 14.1-14.8 -> 11.5-11.6 ms,
// vc_kv_attention_bench --simd avx2).
constexpr int64_t kValuesAhead = 16;

// C 8-lane chunks [d0, d0 + 8 * C) of out[q] for Q weight rows p[q] over
// the same values (with kMasked, the last chunk's lanes masked by `last`):
// per lane the FMAs of one row at a time (out[d] = fma(p[j], v[j * dim + d],
// out[d]), j in order), but Q * C independent chains keep both FMA units
// busy instead of waiting on one chain's latency, and each value chunk is
// loaded once for the Q rows. Q * C <= 12 leaves registers for the Q weights
// and a value chunk (AVX2 has 16). Masked loads and stores only where a
// chunk is partial (on AMD cores a masked store is microcoded). The
// last chunk's lane count comes as an integer, not as a mask vector: GCC
// leaves out the vzeroupper at the return of a function with a 256-bit
// parameter, and the SSE code that runs next (every file built without
// -mavx) then pays for the dirty upper halves (a decoded block's value sums
// cost 5x more).
template <int Q, int C, bool kMasked>
void AccumulateChunks(const float* const* p, const float* v, int64_t n, int64_t dim, int64_t d0,
                      float* const* out, int64_t last_lanes, const float* ahead,
                      int64_t ahead_rows) {
  const __m256i last = PrefixMask(last_lanes);
  auto load = [last](const float* a, int c) {
    return kMasked && c == C - 1 ? _mm256_maskload_ps(a, last) : _mm256_loadu_ps(a);
  };
  __m256 acc[Q * C];
  for (int k = 0; k < Q * C; ++k) {
    const int q = k / C, c = k % C;
    acc[k] = load(out[q] + d0 + int64_t{8} * c, c);
  }
  const float* vj = v + d0;
  const int64_t prefetched = n - kValuesAhead;
  // Row j of `ahead` (the rows read next) into L2 with value row j, as on
  // the AVX-512 level.
  const int64_t streamed = std::min(n, ahead_rows);
  for (int64_t j = 0; j < n; ++j, vj += dim) {
    __m256 pj[Q];
    for (int q = 0; q < Q; ++q) pj[q] = _mm256_broadcast_ss(p[q] + j);
    if (j < prefetched) {
      for (int c = 0; c < C; c += 2) PrefetchL1(vj + kValuesAhead * dim + int64_t{8} * c);
    }
    if (j < streamed) {
      for (int c = 0; c < C; c += 2) PrefetchL2(ahead + j * dim + d0 + int64_t{8} * c);
    }
    for (int c = 0; c < C; ++c) {
      const __m256 vv = load(vj + int64_t{8} * c, c);
      for (int q = 0; q < Q; ++q) acc[q * C + c] = _mm256_fmadd_ps(pj[q], vv, acc[q * C + c]);
    }
  }
  for (int k = 0; k < Q * C; ++k) {
    const int q = k / C, c = k % C;
    float* o = out[q] + d0 + int64_t{8} * c;
    if (kMasked && c == C - 1) {
      _mm256_maskstore_ps(o, last, acc[k]);
    } else {
      _mm256_storeu_ps(o, acc[k]);
    }
  }
}

// Chunks of 8 d's per pass for Q rows: at most 12 accumulators, and 8.
template <int Q>
constexpr int kChunksPerPass = std::min(8, 12 / Q);

using ChunksFn = void (*)(const float* const*, const float*, int64_t, int64_t, int64_t,
                          float* const*, int64_t, const float*, int64_t);
// AccumulateChunks<Q, c, kMasked> for c = 0..8: null for none, and for more
// chunks than Q rows take per pass.
template <int Q, bool kMasked, int... kC>
constexpr std::array<ChunksFn, 9> ChunksKernels(std::integer_sequence<int, kC...>) {
  return {nullptr, [] {
            if constexpr (kC + 1 <= kChunksPerPass<Q>) {
              return AccumulateChunks<Q, kC + 1, kMasked>;
            } else {
              return ChunksFn{nullptr};
            }
          }()...};
}

// Q rows' accumulate over a head of any dim: its 8-lane chunks in near-equal
// groups of at most kChunksPerPass<Q> (dim 64: 8 chunks in one group for one
// row, 4 + 4 for two or three).
template <int Q>
void AccumulateRows(const float* const* p, const float* v, int64_t n, int64_t dim,
                    float* const* out, const float* ahead, int64_t ahead_rows) {
  // [masked][chunks]
  static constexpr std::array<ChunksFn, 9> kChunks[2] = {
      ChunksKernels<Q, false>(std::make_integer_sequence<int, 8>()),
      ChunksKernels<Q, true>(std::make_integer_sequence<int, 8>())};
  constexpr int kMax = kChunksPerPass<Q>;
  if (n == 0) return;  // nothing to add, and v may be null
  const int64_t chunks = (dim + 7) / 8;
  const int64_t groups = (chunks + kMax - 1) / kMax;
  for (int64_t g = 0, c0 = 0; g < groups; ++g) {
    const int64_t c1 = chunks * (g + 1) / groups;
    const int64_t lanes_in_last = std::min<int64_t>(8, dim - (c1 - 1) * 8);
    kChunks[lanes_in_last < 8][c1 - c0](p, v, n, dim, c0 * 8, out, lanes_in_last, ahead,
                                        ahead_rows);
    c0 = c1;
  }
}

void Accumulate(const float* p, const float* v, int64_t n, int64_t dim, float* out) {
  AccumulateRows<1>(&p, v, n, dim, &out, nullptr, 0);
}

// accumulate for nq weight rows (row t at p + t * ldp, into out + t * dim)
// over the same values, in near-equal groups of at most 3 rows per pass over
// the keys (a 9-token pass: 3 + 3 + 3).
void AccumulateMulti(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t n,
                     int64_t dim, float* out, const float* ahead, int64_t ahead_rows) {
  static constexpr AccumulateRowsFn kRows[4] = {nullptr, AccumulateRows<1>, AccumulateRows<2>,
                                                AccumulateRows<3>};
  AccumulateInGroups<3>(kRows, p, ldp, nq, v, n, dim, out, ahead, ahead_rows);
}

VC_DEFINE_SCORES(Dot)

// scores[t * ld + r] = Dot(q_t, k_r) * scale for 4 key rows r and every
// query t < nq, the rows' dim = 16 * C: per output the FMAs of Dot in its
// order (lanes 0-7 and 8-15 of each 16-float chunk, chunk by chunk) and the
// canonical tree, the 4 keys' trees together.
template <int C>
void ScoresTile4(const float* q, int64_t nq, const float* k, float scale, float* scores,
                 int64_t ld) {
  constexpr int64_t kDim = int64_t{16} * C;
  const __m128 vscale = _mm_set1_ps(scale);
  for (int64_t t = 0; t < nq; ++t) {
    const float* qt = q + t * kDim;
    __m256 lo[4], hi[4];
    for (int r = 0; r < 4; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int c = 0; c < C; ++c) {
      const __m256 qlo = _mm256_loadu_ps(qt + int64_t{16} * c);
      const __m256 qhi = _mm256_loadu_ps(qt + int64_t{16} * c + 8);
      for (int r = 0; r < 4; ++r) {
        const float* kr = k + r * kDim + int64_t{16} * c;
        lo[r] = _mm256_fmadd_ps(qlo, _mm256_loadu_ps(kr), lo[r]);
        hi[r] = _mm256_fmadd_ps(qhi, _mm256_loadu_ps(kr + 8), hi[r]);
      }
    }
    const __m128 s = Reduce4(lo, hi);
    _mm_storeu_ps(scores + t * ld, _mm_mul_ps(s, vscale));
  }
}

// Dot(q_t, k_j) * scale for nq queries and n keys of dim 16 * C: 4 keys at a
// time, all queries against them while they are in L1 (a remainder of keys
// one Dot each); rows [j, j + 4) of `ahead` into L2 with tile j.
template <int C>
void ScoresRows(const float* q, int64_t nq, const float* k, int64_t n, float scale, float* scores,
                int64_t ld, const float* ahead, int64_t ahead_rows) {
  constexpr int64_t kDim = int64_t{16} * C;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    if (j + 4 <= ahead_rows) {
      for (int64_t f = 0; f < 4 * kDim; f += 16) PrefetchL2(ahead + j * kDim + f);
    }
    ScoresTile4<C>(q, nq, k + j * kDim, scale, scores + j, ld);
  }
  for (; j < n; ++j) {
    for (int64_t t = 0; t < nq; ++t)
      scores[t * ld + j] = Dot(q + t * kDim, k + j * kDim, kDim) * scale;
  }
}

VC_DEFINE_SCORES_MULTI(ScoresRows)

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
  // Lanes in [-87, 88] need none of the selects below (see the AVX-512 Exp16).
  const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(kExpFastLo), _CMP_GE_OQ),
                                        _mm256_cmp_ps(x, _mm256_set1_ps(kExpFastHi), _CMP_LE_OQ));
  if (_mm256_movemask_ps(in_range) == 0xFF) return _mm256_mul_ps(y, Pow2(_mm256_cvtps_epi32(n)));
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

void ShiftExp(float* x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
  }
  if (i < n) {
    const __m256i k = PrefixMask(n - i);
    _mm256_maskstore_ps(x + i, k, Exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), mv)));
  }
}

void ExpInplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, Exp8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = PrefixMask(n - i);
    _mm256_maskstore_ps(x + i, m, Exp8(_mm256_maskload_ps(x + i, m)));
  }
}

inline __m256 SwiGlu8(__m256 g, __m256 u) {
  // -g flips the sign bit, as the scalar negation does (a NaN's too).
  const __m256 e = Exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(gate + i, SwiGlu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    const __m256i m = PrefixMask(n - i);
    _mm256_maskstore_ps(gate + i, m,
                        SwiGlu8(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
  }
}

void ScaleInplace(float* x, int64_t n, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
  for (; i < n; ++i) x[i] *= s;
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
                           .accumulate_multi = AccumulateMulti,
                           .scores_multi = ScoresMulti,
                           .shift_exp = ShiftExp,
                           .swiglu = SwiGlu,
                           .scale_inplace = ScaleInplace};
  return &ops;
}

}  // namespace vc::kernels::cpu
