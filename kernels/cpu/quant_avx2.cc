// AVX2+FMA path of the quantised-weight products (kernels/quantized.h): the
// 16 logical lanes live in two ymm registers (lanes 0-7 and 8-15); a block of
// 16 weights is widened to f32 exactly (int4: then scaled by one rounded
// multiply). Compiled with -mavx2 -mfma; only called after DetectSimdLevel()
// saw both.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/internal/avx2_lanes.h"
#include "kernels/cpu/internal/quant_ops.h"

namespace vc::kernels::cpu {
namespace {

struct Half2 {
  __m256 lo, hi;
};

struct Int8Src {
  const int8_t* q;
  const float* scales;
  int64_t padded_in;
  static constexpr bool kGrouped = false;
  using Group = int;  // no per-group state
  Group GroupOf(int64_t /*o*/, int64_t /*g*/) const { return 0; }
  Half2 Load(int64_t o, int64_t i, Group /*group*/) const {
    const int8_t* p = q + o * padded_in + i;
    const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))};
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
  // The scale of group g of row o, taken once per group (not looked up, with
  // a division of i by the group, for every block).
  using Group = __m256;
  Group GroupOf(int64_t o, int64_t g) const { return _mm256_set1_ps(scales[o * groups + g]); }
  Half2 Load(int64_t o, int64_t i, Group s) const {
    const __m128i b =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + o * (padded_in / 2) + i / 2));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m256i eight = _mm256_set1_epi32(8);
    const __m256i lo = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_and_si128(b, m)), eight);
    const __m256i hi =
        _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m)), eight);
    return {_mm256_mul_ps(_mm256_cvtepi32_ps(lo), s), _mm256_mul_ps(_mm256_cvtepi32_ps(hi), s)};
  }
  float Finish(int64_t, float sum) const { return sum; }
  const char* Addr(int64_t o, int64_t i) const {
    return reinterpret_cast<const char*>(q + o * (padded_in / 2) + i / 2);
  }
};

// R weight rows x T tokens: each row block is decoded once for all T tokens.
// With pf_next, the next R rows are asked for into L2 meanwhile, one
// prefetch per 64 elements of each row.
template <int R, int T, class Src>
void Tile(const Src& src, const float* x, int64_t ldx, const float* bias, int64_t o0, int64_t ldy,
          float* y, bool pf_next) {
  __m256 lo[R][T], hi[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  GroupCursor<R, Src> group(src, o0);  // int4: each row's scale
  for (int64_t i = 0; i < src.padded_in; i += 16) {
    if (pf_next && i % 64 == 0) {
      for (int r = 0; r < R; ++r) _mm_prefetch(src.Addr(o0 + R + r, i), _MM_HINT_T1);
    }
    Half2 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = src.Load(o0 + r, i, group[r]);
    group.Advance(i);
    for (int t = 0; t < T; ++t) {
      const __m256 xl = _mm256_loadu_ps(x + t * ldx + i);
      const __m256 xh = _mm256_loadu_ps(x + t * ldx + i + 8);
      for (int r = 0; r < R; ++r) {
        lo[r][t] = _mm256_fmadd_ps(xl, wv[r].lo, lo[r][t]);
        hi[r][t] = _mm256_fmadd_ps(xh, wv[r].hi, hi[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float v = src.Finish(o0 + r, Reduce(lo[r][t], hi[r][t]));
      if (bias != nullptr) v += bias[o0 + r];
      y[t * ldy + o0 + r] = v;
    }
  }
}

constexpr int kRows = 2;
constexpr int kTokens = 2;

template <class Src>
using TileFn = void (*)(const Src&, const float*, int64_t, const float*, int64_t, int64_t, float*,
                        bool);

// Rows outer, token spans inner: a pair of rows stays in L1 while every span
// of tokens passes over it, so the weights stream from memory once.
template <class Src>
void Rows(const Src& src, const float* x, int64_t tokens, int64_t ldx, const float* bias,
          int64_t o_begin, int64_t o_end, int64_t ldy, float* y) {
  static constexpr TileFn<Src> kTiles[kRows + 1][kTokens + 1] = {
      {nullptr, nullptr, nullptr},
      {nullptr, Tile<1, 1, Src>, Tile<1, 2, Src>},
      {nullptr, Tile<2, 1, Src>, Tile<2, 2, Src>}};
  int64_t o = o_begin;
  if (tokens == 1) {
    // The next 4 rows are prefetched while they lie inside this range.
    for (; o + 4 <= o_end; o += 4) Tile<4, 1, Src>(src, x, ldx, bias, o, ldy, y, o + 8 <= o_end);
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

}  // namespace

const QuantOps* QuantAvx2Ops() {
  static const QuantOps ops{Int8Rows, Int4Rows};
  return &ops;
}

}  // namespace vc::kernels::cpu
