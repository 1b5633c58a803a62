// AVX-512 path of the quantised-weight products (kernels/quantized.h): one
// zmm register holds the 16 logical lanes; a block of 16 weights is widened
// to f32 exactly (int4: then scaled by one rounded multiply, as the
// definition says). Compiled with -mavx512f; only called after
// DetectSimdLevel() saw AVX-512F.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/internal/avx512_lanes.h"
#include "kernels/cpu/internal/quant_ops.h"

namespace vc::kernels::cpu {
namespace {

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports falsely once inlined (see simd_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

struct Int8Src {
  const int8_t* q;
  const float* scales;
  int64_t padded_in;
  static constexpr bool kGrouped = false;
  using Group = int;  // no per-group state
  Group GroupOf(int64_t /*o*/, int64_t /*g*/) const { return 0; }
  __m512 Load(int64_t o, int64_t i, Group /*group*/) const {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + o * padded_in + i));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  float Finish(int64_t o, float sum) const { return scales[o] * sum; }
  const char* Addr(int64_t o, int64_t i) const {  // element i of row o
    return reinterpret_cast<const char*>(q + o * padded_in + i);
  }
};

struct Int4Src {
  const uint8_t* q;
  const float* scales;
  int64_t groups;
  int group;
  int64_t padded_in;
  static constexpr bool kGrouped = true;
  int BlocksPerGroup() const { return group / 16; }
  // Every weight of group g of row o is one of 16 values, (c - 8) * s for
  // code c: they are computed once per group (one multiply, each lane
  // rounded as the definition's product), and each block picks its lanes
  // from them with a permute instead of converting and scaling every code:
  // a 1-token product over int4 weights took 0.45-0.49x the f32 one, more
  // than int8's 0.28-0.35x, and now 0.32-0.36x (vc_matmul_bench --quantized,
  // docs/results.md section 8).
  using Group = __m512;
  Group GroupOf(int64_t o, int64_t g) const {
    const __m512 codes = _mm512_setr_ps(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f,
                                        2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
    return _mm512_mul_ps(codes, _mm512_set1_ps(scales[o * groups + g]));
  }
  __m512 Load(int64_t o, int64_t i, Group values) const {
    const __m128i b =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + o * (padded_in / 2) + i / 2));
    // Elements 0..7 from the low nibbles, 8..15 from the high ones: the
    // permute reads only the low 4 bits of each index, so the other nibble
    // of each byte may stay.
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(b, _mm_srli_epi16(b, 4)));
    return _mm512_permutexvar_ps(idx, values);
  }
  float Finish(int64_t, float sum) const { return sum; }
  const char* Addr(int64_t o, int64_t i) const {
    return reinterpret_cast<const char*>(q + o * (padded_in / 2) + i / 2);
  }
};

// R weight rows x T tokens: each row block is decoded once for all T tokens.
// With `pf_next`, the tile also asks for the next R rows (into L2) as it
// walks its own, one request per row and 64 elements: a drafter's
// matrix-vector products read rows of only 1-3 KB, too short for the
// hardware prefetchers to follow, and this took about a seventh off the
// 111M model's int8 drafter step (docs/results.md section 8). Further
// prefetches along the tile's own rows into L1 made no difference. A
// prefetch never changes a value.
template <int R, int T, class Src>
void Tile(const Src& src, const float* x, int64_t ldx, const float* bias, int64_t o0, int64_t ldy,
          float* y, bool pf_next) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  GroupCursor<R, Src> group(src, o0);  // int4: each row's 16 values
  for (int64_t i = 0; i < src.padded_in; i += 16) {
    if (pf_next && i % 64 == 0) {
      for (int r = 0; r < R; ++r) _mm_prefetch(src.Addr(o0 + R + r, i), _MM_HINT_T1);
    }
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = src.Load(o0 + r, i, group[r]);
    group.Advance(i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(xv, wv[r], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float v = src.Finish(o0 + r, Reduce(acc[r][t]));
      if (bias != nullptr) v += bias[o0 + r];
      y[t * ldy + o0 + r] = v;
    }
  }
}

constexpr int kRows = 4;
constexpr int kTokens = 4;

template <class Src>
using TileFn = void (*)(const Src&, const float*, int64_t, const float*, int64_t, int64_t, float*,
                        bool);

template <class Src, int R>
constexpr TileFn<Src> kTilesForRows[kTokens + 1] = {nullptr, Tile<R, 1, Src>, Tile<R, 2, Src>,
                                                    Tile<R, 3, Src>, Tile<R, 4, Src>};

// Rows outer, token spans inner: a group of rows stays in L1 while every
// span of tokens passes over it, so the weights stream from memory once.
template <class Src>
void Rows(const Src& src, const float* x, int64_t tokens, int64_t ldx, const float* bias,
          int64_t o_begin, int64_t o_end, int64_t ldy, float* y) {
  static constexpr const TileFn<Src>* kTiles[kRows + 1] = {
      nullptr, kTilesForRows<Src, 1>, kTilesForRows<Src, 2>, kTilesForRows<Src, 3>,
      kTilesForRows<Src, 4>};
  int64_t o = o_begin;
  if (tokens == 1) {
    // The next 8 rows are prefetched while they lie inside this range.
    for (; o + 8 <= o_end; o += 8) Tile<8, 1, Src>(src, x, ldx, bias, o, ldy, y, o + 16 <= o_end);
  }
  for (; o < o_end; o += kRows) {
    const int r = static_cast<int>(std::min<int64_t>(kRows, o_end - o));
    for (int64_t t = 0; t < tokens; t += kTokens) {
      const int n = static_cast<int>(std::min<int64_t>(kTokens, tokens - t));
      kTiles[r][n](src, x + t * ldx, ldx, bias, o, ldy, y + t * ldy, false);
    }
  }
}

void Int8Rows(const float* x, int64_t tokens, int64_t ldx, const int8_t* q, const float* scales,
              const float* bias, int64_t padded_in, int64_t o_begin, int64_t o_end, int64_t ldy,
              float* y) {
  Rows(Int8Src{q, scales, padded_in}, x, tokens, ldx, bias, o_begin, o_end, ldy, y);
}

void Int4Rows(const float* x, int64_t tokens, int64_t ldx, const uint8_t* q, const float* scales,
              int64_t groups, int group, const float* bias, int64_t padded_in, int64_t o_begin,
              int64_t o_end, int64_t ldy, float* y) {
  Rows(Int4Src{q, scales, groups, group, padded_in}, x, tokens, ldx, bias, o_begin, o_end, ldy,
       y);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

const QuantOps* QuantAvx512Ops() {
  static const QuantOps ops{Int8Rows, Int4Rows};
  return &ops;
}

}  // namespace vc::kernels::cpu
