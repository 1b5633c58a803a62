// AVX-512 path of the canonical primitives: one zmm register holds the 16
// logical lanes of a dot product. Compiled with -mavx512f; only called after
// DetectSimdLevel() saw AVX-512F.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/internal/avx512_lanes.h"
#include "kernels/cpu/internal/simd_ops.h"

namespace vc::kernels::cpu {
namespace {

inline __mmask16 TailMask(int64_t rem) { return static_cast<__mmask16>((1u << rem) - 1u); }

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

// y[t * ldy + o0 + r] = Reduce(acc[r][t]) (+ bias[o0 + r]) for tokens t >=
// t_begin, one output at a time.
template <int R, int T>
inline void StoreEach(const __m512 (&acc)[R][T], const float* bias, int64_t o0, int64_t ldy,
                      float* y, int t_begin) {
  for (int r = 0; r < R; ++r) {
    for (int t = t_begin; t < T; ++t) {
      float v = Reduce(acc[r][t]);
      if (bias != nullptr) v += bias[o0 + r];
      y[t * ldy + o0 + r] = v;
    }
  }
}

// y[t * ldy + o0 + r] = Reduce(acc[r][t]) (+ bias[o0 + r]). Groups of 4 or 8
// outputs that are contiguous in y are reduced and stored together.
template <int R, int T>
inline void Store(const __m512 (&acc)[R][T], const float* bias, int64_t o0, int64_t ldy, float* y) {
  if constexpr (R == 8 && T == 1) {
    __m256 v = Reduce8(acc[0][0], acc[1][0], acc[2][0], acc[3][0], acc[4][0], acc[5][0], acc[6][0],
                       acc[7][0]);
    if (bias != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + o0));
    _mm256_storeu_ps(y + o0, v);
  } else if constexpr (R == 4) {
    __m128 b4 = _mm_setzero_ps();
    if (bias != nullptr) b4 = _mm_loadu_ps(bias + o0);
    int t = 0;
    for (; t + 2 <= T; t += 2) {  // two tokens' 4 outputs at once
      __m256 v = Reduce8(acc[0][t], acc[1][t], acc[2][t], acc[3][t], acc[0][t + 1], acc[1][t + 1],
                         acc[2][t + 1], acc[3][t + 1]);
      if (bias != nullptr) v = _mm256_add_ps(v, _mm256_set_m128(b4, b4));
      _mm_storeu_ps(y + t * ldy + o0, _mm256_castps256_ps128(v));
      _mm_storeu_ps(y + (t + 1) * ldy + o0, _mm256_extractf128_ps(v, 1));
    }
    if (t < T) {
      __m128 v = Reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
      if (bias != nullptr) v = _mm_add_ps(v, b4);
      _mm_storeu_ps(y + t * ldy + o0, v);
    }
  } else if constexpr (R == 2) {
    __m256 b8 = _mm256_setzero_ps();
    if (bias != nullptr) {
      b8 = _mm256_setr_ps(bias[o0], bias[o0 + 1], bias[o0], bias[o0 + 1], bias[o0], bias[o0 + 1],
                          bias[o0], bias[o0 + 1]);
    }
    int t = 0;
    for (; t + 4 <= T; t += 4) {  // four tokens' 2 outputs at once
      __m256 v = Reduce8(acc[0][t], acc[1][t], acc[0][t + 1], acc[1][t + 1], acc[0][t + 2],
                         acc[1][t + 2], acc[0][t + 3], acc[1][t + 3]);
      if (bias != nullptr) v = _mm256_add_ps(v, b8);
      const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
      _mm_storel_pi(reinterpret_cast<__m64*>(y + t * ldy + o0), lo);
      _mm_storeh_pi(reinterpret_cast<__m64*>(y + (t + 1) * ldy + o0), lo);
      _mm_storel_pi(reinterpret_cast<__m64*>(y + (t + 2) * ldy + o0), hi);
      _mm_storeh_pi(reinterpret_cast<__m64*>(y + (t + 3) * ldy + o0), hi);
    }
    StoreEach<R, T>(acc, bias, o0, ldy, y, t);
  } else {
    StoreEach<R, T>(acc, bias, o0, ldy, y, 0);
  }
}

inline void PrefetchL2(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
}
inline void PrefetchL1(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// How far ahead (in elements) along its own weight rows a 1-token tile
// asks for the lines it will load: 768 bytes, 12 cache lines per row. With
// weights from DRAM, 128..320 took about a tenth off both 1-token and 9-token
// products against the hardware prefetchers alone, 512 less
// (docs/results.md section 8); rows shorter than this (attention heads) are
// not prefetched. A multi-token tile, whose next rows already come into L1
// (below), looks only 256 bytes ahead: 768 left a 9- and a 33-token layer
// about 5% slower.
constexpr int64_t kL1Ahead = 192;
constexpr int64_t kL1AheadMulti = 64;

// R weight rows x T tokens, one accumulator per output element (token t's
// row at x + t * ldx). It also prefetches `pf_rows` (0..R) weight rows
// starting at pf (rows of the next row group), one cache line per row per
// step, and its own rows ahead into L1, so the weight stream from memory
// overlaps the FMAs. A 1-token tile asks for the next rows into L2. A
// multi-token tile, whose FMAs take long enough for them to arrive, asks
// into L1 on AMD (on Zen 5 prefetcht1 left those tiles waiting on L2: a 9-
// and a 33-token layer 5-10% slower, vc_matmul_bench) and into L2 on Intel
// (on a Xeon, whose L1 has few fill buffers for a stream, a 9-token layer
// 1.29-1.38x a 1-token one with L1, 1.20-1.33x with L2; docs/results.md
// section 8). Prefetches never change a value.
inline bool MultiTokenNextRowsToL2() {
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
}

template <int R, int T>
void Tile(const float* x, int64_t ldx, const float* w, const float* bias, int64_t in, int64_t o0,
          int64_t ldy, float* y, const float* pf, int pf_rows) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const float* wr = w + o0 * in;
  constexpr int64_t kAhead = T == 1 ? kL1Ahead : kL1AheadMulti;
  // Ahead of this, the L1 prefetch would leave the row (and, for the last
  // row, the matrix); the next rows' starts are in the next-rows prefetch's
  // care.
  const int64_t l1_end = in - kAhead;
  const bool next_to_l2 = T == 1 || MultiTokenNextRowsToL2();
  auto next_rows = [&](const float* p) {
    if (next_to_l2) {
      PrefetchL2(p);
    } else {
      PrefetchL1(p);
    }
  };
  auto step = [&](int64_t i) {
    __m512 wv[R];
    if (i < l1_end) {
      for (int r = 0; r < R; ++r) PrefetchL1(wr + r * in + i + kAhead);
    }
    for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(wr + r * in + i);
    for (int t = 0; t < T; ++t) {
      __m512 xv = _mm512_loadu_ps(x + t * ldx + i);
      // One load per token and step: without this GCC 12 folds the load
      // into each of the R FMAs (R loads), and a 9-token layer of the 110M
      // shape took 1.85-2.09 instead of 1.27-1.29 ms in the 2-row tiles.
      asm("" : "+v"(xv));
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  };
  int64_t i = 0;
  if (pf_rows == R) {
    for (; i + 16 <= in; i += 16) {
      for (int r = 0; r < R; ++r) next_rows(pf + r * in + i);
      step(i);
    }
  } else if (pf_rows > 0) {
    for (; i + 16 <= in; i += 16) {
      for (int r = 0; r < pf_rows; ++r) next_rows(pf + r * in + i);
      step(i);
    }
  } else {
    for (; i + 16 <= in; i += 16) step(i);
  }
  if (i < in) {
    const __mmask16 m = TailMask(in - i);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(m, wr + r * in + i);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  Store<R, T>(acc, bias, o0, ldy, y);
}

using TileFn = void (*)(const float*, int64_t, const float*, const float*, int64_t, int64_t,
                        int64_t, float*, const float*, int);
constexpr int kRows = 4;
constexpr int kTokens = 6;
template <int R>
constexpr TileFn kTilesForRows[kTokens + 1] = {nullptr,    Tile<R, 1>, Tile<R, 2>, Tile<R, 3>,
                                               Tile<R, 4>, Tile<R, 5>, Tile<R, 6>};
constexpr const TileFn* kTiles[kRows + 1] = {nullptr, kTilesForRows<1>, kTilesForRows<2>,
                                             kTilesForRows<3>, kTilesForRows<4>};
// Tokens are processed in spans of at most this many, each span's x rows
// staying in L2 while every row group passes over them.
constexpr int64_t kSpanTokens = int64_t{8} * kTokens;

// Spans of at most kWideTokens tokens whose rows fit in kResidentXBytes are
// done in 2-row tiles over every token of the span instead: x then stays in
// L1 for the whole product and each weight row is used once, as it streams
// in, where the 4-row tiles' token tiles evicted each other's x (and the
// group's weights) from L1 between row groups. A 9-token 1024-wide product
// took 12-20% less (one thread, weights from DRAM); with 2816-wide rows
// (a 9-token x of 99 KiB) the 2-row tiles were 20% slower.
constexpr int kWideTokens = 12;
constexpr int64_t kResidentXBytes = int64_t{40} << 10;
// ... and only over rows this long: over the short rows of the row-parallel
// products' column blocks (128 and 352 wide on the 110M shape) the 4-row
// tiles' loads feed more FMAs each (4 weight and 5 x loads per 20 FMAs
// against 2 and 9 per 18). MatmulBlocks over 8 blocks of 1024 such rows, 9
// tokens, 2 threads, weights from DRAM: 128 wide 220-227 -> 183-192 us, 352
// wide 330-352 -> 296-309 us (a harness calling the backend, three
// alternations; 1-token products 93-112 and 188-212 us).
constexpr int64_t kWideMinIn = 512;
template <int R>
constexpr TileFn kWideTiles[kWideTokens + 1] = {
    nullptr,    Tile<R, 1>, Tile<R, 2>, Tile<R, 3>,  Tile<R, 4>,  Tile<R, 5>, Tile<R, 6>,
    Tile<R, 7>, Tile<R, 8>, Tile<R, 9>, Tile<R, 10>, Tile<R, 11>, Tile<R, 12>};

// Only the order in which output elements are visited and the prefetches
// are chosen here (the backend has already put x's rows where they load
// best, kernels/cpu/cpu_backend.cc); each element is still one Tile
// accumulator over the whole row, i.e. the canonical dot product.
void MatmulRows(const float* x, int64_t ldx, int64_t tokens, const float* w, const float* bias,
                int64_t in, int64_t o_begin, int64_t o_end, int64_t ldy, float* y) {
  int64_t o = o_begin;
  // Row groups ahead whose rows the tiles prefetch: over short rows (the
  // row-parallel products' column blocks, 128 and 352 wide on the 110M
  // shape) a group is 2-11 KiB, too little lead for a line from DRAM, so
  // they look two groups ahead. vc_matmul_bench --tokens 9 --shapes
  // 1024x1024/8,2816x1024/8, five alternations: 9 tokens 0.145-0.176 against
  // 0.161-0.196 ms and 0.284-0.331 against 0.317-0.358 ms; 1 token within
  // the noise. Three or more groups were no better.
  const int64_t groups_ahead = in < kWideMinIn ? 2 : 1;
  if (tokens == 1) {
    // Matrix-vector: 8 rows per pass keep more loads in flight; the 8 rows
    // groups_ahead groups on (inside this range) are prefetched meanwhile.
    for (; o + 8 <= o_end; o += 8) {
      const bool next = o + 8 + 8 * groups_ahead <= o_end;
      Tile<8, 1>(x, ldx, w, bias, in, o, ldy, y, next ? w + (o + 8 * groups_ahead) * in : nullptr,
                 next ? 8 : 0);
    }
    if (o == o_end) return;
  }
  const int64_t o_first = o;
  for (int64_t ts = 0; ts < tokens; ts += kSpanTokens) {
    const int64_t span = std::min(tokens - ts, kSpanTokens);
    const float* xs = x + ts * ldx;
    if (span <= kWideTokens && in >= kWideMinIn &&
        span * ldx * static_cast<int64_t>(sizeof(float)) <= kResidentXBytes) {
      for (o = o_first; o + 2 <= o_end; o += 2) {
        const bool next = o + 4 <= o_end;
        kWideTiles<2>[span](xs, ldx, w, bias, in, o, ldy, y + ts * ldy,
                            next ? w + (o + 2) * in : nullptr, next ? 2 : 0);
      }
      if (o < o_end) kWideTiles<1>[span](xs, ldx, w, bias, in, o, ldy, y + ts * ldy, nullptr, 0);
      continue;
    }
    // Near-equal token tiles of at most kTokens (32 tokens: 6+6+5+5+5+5, not
    // 6*5+2). A row group's weights stay in L1 while every tile of the span
    // passes over them; meanwhile the tiles prefetch the next group's rows,
    // spread evenly over them (tile k takes rows [k*R/n, (k+1)*R/n)).
    const int64_t ntiles = (span + kTokens - 1) / kTokens;
    for (o = o_first; o < o_end; o += kRows) {
      const int r = static_cast<int>(o_end - o < kRows ? o_end - o : kRows);
      const bool next = o + kRows + kRows * groups_ahead <= o_end;
      for (int64_t k = 0, t = 0; k < ntiles; ++k) {
        const int64_t t1 = span * (k + 1) / ntiles;
        const int64_t p0 = k * kRows / ntiles, p1 = (k + 1) * kRows / ntiles;
        kTiles[r][t1 - t](xs + t * ldx, ldx, w, bias, in, o, ldy, y + (ts + t) * ldy,
                          next ? w + (o + kRows * groups_ahead + p0) * in : nullptr,
                          next ? static_cast<int>(p1 - p0) : 0);
        t = t1;
      }
    }
  }
}

// Keys ahead (in the same run of rows) whose value rows a pass asks for
// while it works on the current one: a multi-query pass's FMAs are long
// enough that the hardware prefetchers alone left its loads waiting on
// memory (a 9-query pass over 3000 keys of 64-dim heads: 6.6 -> 5.4 ms,
// vc_kv_attention_bench; 8 and 32 keys were no better). None past the run's
// end: in a paged cache the rows there are another head's, read (if at all)
// long after this pass, so those lines only added an eighth to the pass's
// traffic over 128-key blocks.
constexpr int64_t kValuesAhead = 16;

// C 16-lane chunks of out[q][0, 16 * C) for Q weight rows p[q] over the
// same values (the last chunk masked by `last`): per row and chunk the same
// FMAs in the same key order as one chunk of one row at a time, but C * Q
// independent chains keep the FMA unit busy instead of waiting on one chain's
// latency, and each value chunk is loaded once for all Q rows. Row j of
// `ahead` (the same chunks of the rows read next, ahead_rows of them) is
// asked into L2 with value row j: the next block streams in while this one's
// FMAs run.
template <int Q, int C>
void AccumulateChunks(const float* const* p, const float* v, int64_t n, int64_t dim,
                      float* const* out, __mmask16 last, const float* ahead, int64_t ahead_rows) {
  // One flat array, every index a constant once the loops are unrolled: with
  // acc[Q][C], GCC 12 also stored every accumulator to the stack on every
  // key, dead stores that took a 9-token pass's value sums over 3000 tokens
  // of the 110M synthetic shape from 15 to 19 ms (vc_kv_attention_bench, one
  // thread).
  __m512 acc[Q * C];
#pragma GCC unroll 32
  for (int k = 0; k < Q * C; ++k) {
    const int q = k / C, c = k % C;
    acc[k] = _mm512_maskz_loadu_ps(c == C - 1 ? last : kAllLanes, out[q] + int64_t{16} * c);
  }
  const int64_t prefetched = n - kValuesAhead;
  const int64_t streamed = std::min(n, ahead_rows);
  for (int64_t j = 0; j < n; ++j) {
    __m512 pj[Q];
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) pj[q] = _mm512_set1_ps(p[q][j]);
    const float* vj = v + j * dim;
    if (j < prefetched) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) PrefetchL1(vj + kValuesAhead * dim + int64_t{16} * c);
    }
    if (j < streamed) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) PrefetchL2(ahead + j * dim + int64_t{16} * c);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512 vv = c == C - 1 ? _mm512_maskz_loadu_ps(last, vj + int64_t{16} * c)
                                   : _mm512_loadu_ps(vj + int64_t{16} * c);
#pragma GCC unroll 8
      for (int q = 0; q < Q; ++q) acc[q * C + c] = _mm512_fmadd_ps(pj[q], vv, acc[q * C + c]);
    }
  }
#pragma GCC unroll 32
  for (int k = 0; k < Q * C; ++k) {
    const int q = k / C, c = k % C;
    _mm512_mask_storeu_ps(out[q] + int64_t{16} * c, c == C - 1 ? last : kAllLanes, acc[k]);
  }
}

// At most this many accumulators per pass over the keys: with the Q
// broadcast weights and one value chunk they fill the 32 zmm registers.
constexpr int kMaxAccumulators = 24;
constexpr int kMaxRowsPerPass = 6;

// Chunks of 16 d's per pass for Q rows: at most kMaxAccumulators / Q, and 8.
template <int Q>
constexpr int kChunksPerPass = kMaxAccumulators / Q < 8 ? kMaxAccumulators / Q : 8;

using ChunksFn = void (*)(const float* const*, const float*, int64_t, int64_t, float* const*,
                          __mmask16, const float*, int64_t);
// AccumulateChunks<Q, C>, or null for more chunks than Q rows take per pass.
template <int Q, int C>
constexpr ChunksFn ChunksKernel() {
  if constexpr (C <= kChunksPerPass<Q>) {
    return AccumulateChunks<Q, C>;
  } else {
    return nullptr;
  }
}

// out[q][d] = fma(p[q][j], v[j * dim + d], out[q][d]) for j = 0..n-1 in
// order, for every d < dim and q < Q, kChunksPerPass<Q> chunks of 16 d's per
// pass over the keys.
template <int Q>
void AccumulateRows(const float* const* p, const float* v, int64_t n, int64_t dim,
                    float* const* out, const float* ahead, int64_t ahead_rows) {
  static constexpr ChunksFn kChunksFns[9] = {nullptr,
                                             ChunksKernel<Q, 1>(),
                                             ChunksKernel<Q, 2>(),
                                             ChunksKernel<Q, 3>(),
                                             ChunksKernel<Q, 4>(),
                                             ChunksKernel<Q, 5>(),
                                             ChunksKernel<Q, 6>(),
                                             ChunksKernel<Q, 7>(),
                                             ChunksKernel<Q, 8>()};
  constexpr int64_t kPassDims = int64_t{16} * kChunksPerPass<Q>;
  for (int64_t d = 0; d < dim; d += kPassDims) {
    const int64_t rem = dim - d < kPassDims ? dim - d : kPassDims;
    const int chunks = static_cast<int>((rem + 15) / 16);
    const __mmask16 last = rem % 16 == 0 ? kAllLanes : TailMask(rem % 16);
    float* o[Q];
    for (int q = 0; q < Q; ++q) o[q] = out[q] + d;
    kChunksFns[chunks](p, v + d, n, dim, o, last, ahead != nullptr ? ahead + d : nullptr,
                       ahead_rows);
  }
}

void Accumulate(const float* p, const float* v, int64_t n, int64_t dim, float* out) {
  AccumulateRows<1>(&p, v, n, dim, &out, nullptr, 0);
}

// accumulate for nq weight rows (row t at p + t * ldp, into out + t * dim)
// over the same values, in near-equal groups of at most kMaxRowsPerPass
// rows: a 9-token pass's value sums over 64-dim heads are 5 + 4 rows per
// pass over the keys, instead of four pairs and a single row, whose 8 (or 4)
// FMA chains left the FMA unit waiting on their latency.
void AccumulateMulti(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t n,
                     int64_t dim, float* out, const float* ahead, int64_t ahead_rows) {
  static constexpr AccumulateRowsFn kRows[kMaxRowsPerPass + 1] = {
      nullptr,           AccumulateRows<1>, AccumulateRows<2>, AccumulateRows<3>,
      AccumulateRows<4>, AccumulateRows<5>, AccumulateRows<6>};
  AccumulateInGroups<kMaxRowsPerPass>(kRows, p, ldp, nq, v, n, dim, out, ahead, ahead_rows);
}

// scores[t * ld + r] = Dot(q_t, k_r) * scale for 8 key rows r and Q
// queries t, the rows' dim = 16 * C. Per output the FMAs of Dot in its order
// (lane l: chunk 0, 1, ... of the row) and then the canonical tree; the 8
// keys' trees are done together (Reduce8) and stored as one vector. Each key
// chunk is loaded once for the Q queries: one query at a time loaded every
// key chunk once per query (9 loads per 8 FMAs), and a 9-query pass's scores
// over 3000 keys of the 110M shape took 6.3 instead of 4.9 ms
// (vc_kv_attention_bench, one thread).
template <int C, int Q>
inline void ScoresQueries(const float* q, const float* k, float scale, float* scores, int64_t ld) {
  constexpr int64_t kDim = int64_t{16} * C;
  const __m512 zero = _mm512_setzero_ps();
  __m512 acc[Q][8];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    __m512 qc[Q];
#pragma GCC unroll 4
    for (int t = 0; t < Q; ++t) qc[t] = _mm512_loadu_ps(q + t * kDim + int64_t{16} * c);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      __m512 kv = _mm512_loadu_ps(k + r * kDim + int64_t{16} * c);
      if constexpr (Q > 1) asm("" : "+v"(kv));  // one load for the Q FMAs, not one each
#pragma GCC unroll 4
      for (int t = 0; t < Q; ++t) acc[t][r] = _mm512_fmadd_ps(qc[t], kv, c == 0 ? zero : acc[t][r]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < Q; ++t) {
    const __m256 s = Reduce8(acc[t][0], acc[t][1], acc[t][2], acc[t][3], acc[t][4], acc[t][5],
                             acc[t][6], acc[t][7]);
    _mm256_storeu_ps(scores + t * ld, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
  }
}

// ScoresQueries over every query t < nq, three at a time.
template <int C>
void ScoresTile8(const float* q, int64_t nq, const float* k, float scale, float* scores,
                 int64_t ld) {
  constexpr int64_t kDim = int64_t{16} * C;
  int64_t t = 0;
  for (; t + 3 <= nq; t += 3) ScoresQueries<C, 3>(q + t * kDim, k, scale, scores + t * ld, ld);
  if (nq - t == 2) {
    ScoresQueries<C, 2>(q + t * kDim, k, scale, scores + t * ld, ld);
  } else if (nq - t == 1) {
    ScoresQueries<C, 1>(q + t * kDim, k, scale, scores + t * ld, ld);
  }
}

// Dot(q_t, k_j) * scale for nq queries and n keys of dim 16 * C: 8 keys at
// a time, all queries against them while they are in L1 (a remainder of
// keys one Dot each). Each 8-key tile is 8 independent FMA chains per query
// and one batched lane tree, where the matmul tiles spent as much on
// per-output reductions and on set-up as on the products of such short
// rows. Rows [j, j + 8) of `ahead` (the keys read next) go into L2 with
// tile j, so a block's start no longer waits on memory (docs/results.md
// section 8, "The next KV block into L2").
constexpr int64_t kScoresAhead = 16;  // keys

template <int C>
void ScoresRows(const float* q, int64_t nq, const float* k, int64_t n, float scale, float* scores,
                int64_t ld, const float* ahead, int64_t ahead_rows) {
  constexpr int64_t kDim = int64_t{16} * C;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    if (j + 8 <= ahead_rows) {
      for (int64_t f = 0; f < 8 * kDim; f += 16) PrefetchL2(ahead + j * kDim + f);
    }
    // The tile two ahead, into L1: a tile's queries are long enough work
    // that the hardware prefetcher alone left its first loads waiting.
    if (j + kScoresAhead + 8 <= n) {
      const float* pf = k + (j + kScoresAhead) * kDim;
      for (int64_t f = 0; f < 8 * kDim; f += 16) PrefetchL1(pf + f);
    }
    ScoresTile8<C>(q, nq, k + j * kDim, scale, scores + j, ld);
  }
  for (; j < n; ++j) {
    for (int64_t t = 0; t < nq; ++t)
      scores[t * ld + j] = Dot(q + t * kDim, k + j * kDim, kDim) * scale;
  }
}

VC_DEFINE_SCORES_MULTI(ScoresRows)

VC_DEFINE_SCORES(Dot)

// kernels::Exp, 16 lanes at a time, with the same IEEE operations in the
// same order; the scalar branches become lane selects.
inline __m512 Pow2(__m512i e) {  // 2^e for e in [-126, 127]
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which
// -Wmaybe-uninitialized reports falsely once they are inlined here.
// (A GCC-only warning: clang, which builds the fuzz targets, has no such
// group and would reject the pragma.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
inline __m512 Exp16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Hi)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Lo)));
  __m512 p = _mm512_set1_ps(kExpP0);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpP1));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpP2));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpP3));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpP4));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpP5));
  const __m512 y =
      _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  // Every lane in [-87, 88] (an ordered compare: a NaN is not) has n in
  // [-126, 127], where the result is y * 2^n and none of the selects below
  // applies: the common case in a softmax (x = s - max <= 0) and in SiLU.
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpFastLo), _CMP_GE_OQ) &
                             _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpFastHi), _CMP_LE_OQ);
  if (in_range == kAllLanes) return _mm512_mul_ps(y, Pow2(_mm512_cvtps_epi32(n)));
  // n is integral and within int range for every lane that survives the
  // range selects below; other lanes' values are discarded.
  const __m512 n_clamped =
      _mm512_min_ps(_mm512_max_ps(n, _mm512_set1_ps(-1000.f)), _mm512_set1_ps(1000.f));
  const __m512i e = _mm512_cvtps_epi32(n_clamped);
  const __m512i lo = _mm512_set1_epi32(-126), hi = _mm512_set1_epi32(127);
  const __m512 mid = _mm512_mul_ps(y, Pow2(_mm512_min_epi32(_mm512_max_epi32(e, lo), hi)));
  const __m512 big = _mm512_mul_ps(
      _mm512_mul_ps(y, Pow2(_mm512_min_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), hi))),
      _mm512_set1_ps(2.0f));
  const __m512 small = _mm512_mul_ps(
      _mm512_mul_ps(y, Pow2(_mm512_max_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(64)), lo))),
      _mm512_set1_ps(0x1p-64f));
  __m512 out = mid;
  out = _mm512_mask_mov_ps(out, _mm512_cmpgt_epi32_mask(e, hi), big);
  out = _mm512_mask_mov_ps(out, _mm512_cmplt_epi32_mask(e, lo), small);
  out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLo), _CMP_LT_OQ),
                           _mm512_setzero_ps());
  out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpHi), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
  out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
  return out;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

void ExpInplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, Exp16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m, Exp16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

void ShiftExp(float* x, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(x + i, Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv)));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, k, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv)));
  }
}

inline __m512 SwiGlu16(__m512 g, __m512 u) {
  // -g flips the sign bit, as the scalar negation does (a NaN's too).
  const __m512 neg =
      _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN)));
  const __m512 e = Exp16(neg);
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(gate + i, SwiGlu16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(
        gate + i, m,
        SwiGlu16(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void ScaleInplace(float* x, int64_t n, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), sv));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv));
  }
}

bool MaxNoNan(const float* x, int64_t n, float* max) {
  const __m512 lowest = _mm512_set1_ps(-INFINITY);
  __m512 m = lowest;
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_maskz_max_ps(kAllLanes, m, v);  // see avx512_lanes.h on maskz_
  }
  if (i < n) {
    const __mmask16 tail = TailMask(n - i);
    const __m512 v = _mm512_mask_loadu_ps(lowest, tail, x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_maskz_max_ps(kAllLanes, m, v);  // see avx512_lanes.h on maskz_
  }
  if (nan != 0) return false;
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  *max = MaxOfLanes(lanes, 16);
  return true;
}

}  // namespace

const SimdOps* Avx512Ops() {
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
