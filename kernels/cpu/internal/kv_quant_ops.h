// Private to kernels/: the fused attention kernels over quantised K/V rows
// (kernels/quantized_kv.h states their numerics), one table per SIMD level.
// The algorithm is written once, in KvQuantKernels below, over a 16-lane
// vector type that each level's translation unit supplies (compiled with that
// level's -m flags, like simd_ops.h and quant_ops.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/quantized_kv.h"

namespace vc::kernels::cpu {

struct KvQuantOps {
  void (*scores)(const float* q, const QuantizedKvRows& k, int64_t first, int64_t n, float scale,
                 float* scores);
  void (*accumulate)(const float* p, const QuantizedKvRows& v, int64_t first, int64_t n,
                     float* out);
};

const KvQuantOps& KvQuantScalarOps();
const KvQuantOps* KvQuantAvx2Ops();    // null when not compiled in
const KvQuantOps* KvQuantAvx512Ops();  // null when not compiled in

// The per-block helpers are forced inline: out of line, GCC keeps Block (a
// function returning a vector) as a call per block, which costs more than
// the block's arithmetic.
#define VC_KVQ_INLINE [[gnu::always_inline]] inline

// The kernels over a vector type V of 16 f32 lanes (F) and 16 i32 lanes (I):
//   F Zero(); F Set1(float); F Load(const float* p, int m)  (lanes >= m zero)
//   void Store(float* p, F v, int m)  (lanes < m only)
//   F Mul(F, F); F Add(F, F); F Fma(F a, F b, F c) (a * b + c, one rounding)
//   F KeepFirst(F, int m)  (lanes >= m set to +0)
//   I Unpack<bits>(const uint8_t* p)  (codes 0..15 from 16 * bits / 8 bytes)
//   I SubConst(I, int); F ToFloat(I) (exact); float Reduce(F) (the fixed tree)
// Members of a template over the level's own V (a type private to its
// translation unit), so no kernel compiled for one level is shared with
// another at link time.
template <class V>
struct KvQuantKernels {
  using F = typename V::F;
  using I = typename V::I;
  using Layout = QuantizedKvRows::Layout;

  // A 16-lane block of channels [c0, c0 + m) (m <= 16) of every row, and
  // where its per-token scales come from: `group` is the group (within a
  // row) of all of its lanes, or -1 when its lanes span several groups.
  // Fixed for a call, so the divisions are done once.
  struct BlockPlan {
    int c0 = 0, m = 0, group = -1;
  };
  VC_KVQ_INLINE static BlockPlan Plan(const QuantizedKvRows& x, int c0) {
    BlockPlan b;
    b.c0 = c0;
    b.m = std::min(16, x.dim - c0);
    if (x.layout != Layout::kPerChannelAsymmetric && c0 / x.group == (c0 + b.m - 1) / x.group) {
      b.group = c0 / x.group;
    }
    return b;
  }

  // Where a row's scales start (per-token: [row][groups_per_row]; per-channel:
  // [row / group][dim]), advanced row by row without dividing.
  template <Layout L>
  struct RowCursor {
    int64_t row, base, step, in_group;
    RowCursor(const QuantizedKvRows& x, int64_t first) : row(first) {
      if constexpr (L == Layout::kPerChannelAsymmetric) {
        base = (first / x.group) * x.dim;
        step = x.dim;
        in_group = first % x.group;
      } else {
        step = (x.dim + x.group - 1) / x.group;
        base = first * step;
        in_group = 0;
      }
    }
    void Next(const QuantizedKvRows& x) {
      ++row;
      if constexpr (L != Layout::kPerChannelAsymmetric) {
        base += step;
      } else if (++in_group == x.group) {
        in_group = 0;
        base += step;
      }
    }
  };

  // Codes of block b of row r (lanes >= b.m unspecified). A block that starts
  // on a byte boundary is unpacked from the stored bytes in registers; near
  // the end of the codes (where a whole-block load would read past them) from
  // a zero-filled copy of just its own bytes. Otherwise code by code.
  template <int kBits>
  VC_KVQ_INLINE static I Codes(const QuantizedKvRows& x, int64_t code_bytes, int64_t r,
                               const BlockPlan& b) {
    constexpr int64_t kBlockBytes = 16 * kBits / 8;
    const int64_t index = r * x.dim + b.c0;
    const int64_t bit = index * kBits;
    if (bit % 8 == 0) {
      const uint8_t* p = x.codes + bit / 8;
      if (bit / 8 + kBlockBytes <= code_bytes) return V::template Unpack<kBits>(p);
      alignas(16) uint8_t buf[16] = {};
      std::memcpy(buf, p, static_cast<size_t>((b.m * kBits + 7) / 8));
      return V::template Unpack<kBits>(buf);
    }
    constexpr unsigned kMask = (1u << kBits) - 1u;
    alignas(16) uint8_t buf[16] = {};
    for (int l = 0; l < b.m; ++l) {
      const int64_t at = (index + l) * kBits;
      buf[l] = static_cast<uint8_t>((x.codes[at / 8] >> (at % 8)) & kMask);
    }
    return V::template Unpack<8>(buf);
  }

  // Per-token scales (and zeros) lane by lane, for a block whose lanes span
  // several groups (groups narrower than 16 channels: rare, kept out of line).
  template <Layout L>
  [[gnu::noinline]] static void LaneScales(const QuantizedKvRows& x, int64_t base,
                                           const BlockPlan& b, F* s, F* z) {
    alignas(64) float sb[16] = {}, zb[16] = {};
    for (int l = 0; l < b.m; ++l) {
      const int64_t g = base + (b.c0 + l) / x.group;
      sb[l] = x.scales[g];
      if constexpr (L == Layout::kPerTokenAsymmetric) zb[l] = x.zeros[g];
    }
    *s = V::Load(sb, 16);
    *z = V::Load(zb, 16);
  }

  // The element definition (quantized_kv.h) for 16 codes u with their
  // scales s and zero points z (z unused by the symmetric layout).
  template <Layout L, int kBits>
  VC_KVQ_INLINE static F Decode(I u, F s, F z) {
    if constexpr (L == Layout::kPerTokenSymmetric) {
      return V::Mul(V::ToFloat(V::SubConst(u, (1 << (kBits - 1)) - 1)), s);
    } else {
      return V::Add(V::Mul(V::ToFloat(u), s), z);
    }
  }

  // The dequantised block: x(r, c0 + l) in lane l < m, +0 in the others (as
  // the f32 kernels' zero padding).
  template <Layout L, int kBits>
  VC_KVQ_INLINE static F Block(const QuantizedKvRows& x, int64_t code_bytes,
                               const RowCursor<L>& row, const BlockPlan& b) {
    const I u = Codes<kBits>(x, code_bytes, row.row, b);
    F s, z;
    if constexpr (L == Layout::kPerChannelAsymmetric) {
      s = V::Load(x.scales + row.base + b.c0, b.m);
      z = V::Load(x.zeros + row.base + b.c0, b.m);
    } else if (b.group >= 0) {
      s = V::Set1(x.scales[row.base + b.group]);
      z = L == Layout::kPerTokenAsymmetric ? V::Set1(x.zeros[row.base + b.group]) : V::Zero();
    } else {  // groups narrower than a block: one scale per lane
      LaneScales<L>(x, row.base, b, &s, &z);
    }
    const F v = Decode<L, kBits>(u, s, z);
    return b.m == 16 ? v : V::KeepFirst(v, b.m);
  }

  // The shape of nearly every real head: rows of whole 16-lane blocks (so
  // every block starts on a byte and its codes end inside the row), each
  // block inside one per-token group. For such rows the kernels below
  // decode a block with no per-block plan, bounds check or mask, which more
  // than halved the drafter's attention time over INT8 KV; the values are
  // the same ones Block gives. Returns the blocks per row, or 0 for rows of
  // any other shape (they take the general kernels).
  static int WholeBlocks(const QuantizedKvRows& x) {
    if (x.dim <= 0 || x.dim % 16 != 0) return 0;
    if (x.layout != Layout::kPerChannelAsymmetric && x.group % 16 != 0 && x.group < x.dim) {
      return 0;
    }
    return x.dim / 16;
  }

  // Block `blk` of a row of whole blocks whose codes start at `codes`; for
  // per-token layouts `group` is the block's group within the row (its
  // BlockPlan's, never -1 for rows WholeBlocks accepts; unused per channel).
  template <Layout L, int kBits>
  VC_KVQ_INLINE static F WholeBlock(const QuantizedKvRows& x, const uint8_t* codes,
                                    const RowCursor<L>& row, int blk, int group) {
    const I u = V::template Unpack<kBits>(codes + blk * 2 * kBits);  // 16 * kBits / 8 bytes
    if constexpr (L == Layout::kPerChannelAsymmetric) {
      return Decode<L, kBits>(u, V::Load(x.scales + row.base + 16 * blk, 16),
                              V::Load(x.zeros + row.base + 16 * blk, 16));
    } else if constexpr (L == Layout::kPerTokenAsymmetric) {
      return Decode<L, kBits>(u, V::Set1(x.scales[row.base + group]),
                              V::Set1(x.zeros[row.base + group]));
    } else {
      return Decode<L, kBits>(u, V::Set1(x.scales[row.base + group]), V::Zero());
    }
  }

  // out[r] = Reduce(acc[r]) * scale for 8 rows, batched where the level can
  // (the same tree per row, so the same bits).
  VC_KVQ_INLINE static void ReduceScaled8(const F (&acc)[8], float scale, float* out) {
    if constexpr (requires { V::ReduceScaled8(acc, scale, out); }) {
      V::ReduceScaled8(acc, scale, out);
    } else {
      for (int r = 0; r < 8; ++r) out[r] = V::Reduce(acc[r]) * scale;
    }
  }

  // Scores over rows of B whole blocks: q held in registers, 8 rows' dot
  // products in flight and reduced together.
  template <Layout L, int kBits, int B>
  static void ScoresWhole(const float* q, const QuantizedKvRows& k, int64_t first, int64_t n,
                          float scale, float* scores) {
    F qv[B];
    int group[B];
    for (int b = 0; b < B; ++b) {
      qv[b] = V::Load(q + 16 * b, 16);
      group[b] = Plan(k, 16 * b).group;
    }
    const int64_t row_bytes = int64_t{k.dim} * kBits / 8;
    const uint8_t* codes = k.codes + first * row_bytes;
    RowCursor<L> row(k, first);
    auto dot = [&]() {
      F acc = V::Zero();
      for (int b = 0; b < B; ++b) {
        acc = V::Fma(qv[b], WholeBlock<L, kBits>(k, codes, row, b, group[b]), acc);
      }
      codes += row_bytes;
      row.Next(k);
      return acc;
    };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      F acc[8];
      for (F& a : acc) a = dot();
      ReduceScaled8(acc, scale, scores + j);
    }
    for (; j < n; ++j) scores[j] = V::Reduce(dot()) * scale;
  }

  // Value sums over rows of whole blocks: C 16-lane chunks of out from
  // channel d0, each one FMA chain in key order (as AccumulateChunks).
  template <Layout L, int kBits, int C>
  static void AccumulateWhole(const float* p, const QuantizedKvRows& v, int64_t first, int64_t n,
                              int d0, float* out) {
    F acc[C];
    int group[C];
    for (int c = 0; c < C; ++c) {
      acc[c] = V::Load(out + d0 + 16 * c, 16);
      group[c] = Plan(v, d0 + 16 * c).group;
    }
    const int64_t row_bytes = int64_t{v.dim} * kBits / 8;
    // WholeBlock takes block numbers within the row: start at d0's block.
    const int blk0 = d0 / 16;
    const uint8_t* codes = v.codes + first * row_bytes;
    RowCursor<L> row(v, first);
    for (int64_t j = 0; j < n; ++j, codes += row_bytes, row.Next(v)) {
      const F pj = V::Set1(p[j]);
      for (int c = 0; c < C; ++c) {
        acc[c] = V::Fma(pj, WholeBlock<L, kBits>(v, codes, row, blk0 + c, group[c]), acc[c]);
      }
    }
    for (int c = 0; c < C; ++c) V::Store(out + d0 + 16 * c, acc[c], 16);
  }

  static int64_t CodeBytes(const QuantizedKvRows& x) { return (x.rows * x.dim * x.bits + 7) / 8; }

  template <Layout L, int kBits>
  static void Scores(const float* q, const QuantizedKvRows& k, int64_t first, int64_t n,
                     float scale, float* scores) {
    using WholeFn = void (*)(const float*, const QuantizedKvRows&, int64_t, int64_t, float, float*);
    static constexpr WholeFn kWhole[] = {nullptr,
                                         ScoresWhole<L, kBits, 1>,
                                         ScoresWhole<L, kBits, 2>,
                                         ScoresWhole<L, kBits, 3>,
                                         ScoresWhole<L, kBits, 4>,
                                         ScoresWhole<L, kBits, 5>,
                                         ScoresWhole<L, kBits, 6>,
                                         ScoresWhole<L, kBits, 7>,
                                         ScoresWhole<L, kBits, 8>};
    // Head dims that are not whole blocks, or over 128, take the loop below.
    if (const int blocks = WholeBlocks(k); blocks > 0 && blocks <= 8) {
      return kWhole[blocks](q, k, first, n, scale, scores);
    }
    constexpr int kPlanned = 32;  // head dims up to 512 planned once per call
    BlockPlan plans[kPlanned];
    const int blocks = (k.dim + 15) / 16;
    for (int i = 0; i < std::min(blocks, kPlanned); ++i) plans[i] = Plan(k, 16 * i);
    const int64_t code_bytes = CodeBytes(k);
    RowCursor<L> row(k, first);
    if (blocks == 1) {  // head dims up to 16: q stays in a register
      const BlockPlan b = plans[0];
      const F qv = V::Load(q, b.m);
      for (int64_t j = 0; j < n; ++j, row.Next(k)) {
        scores[j] =
            V::Reduce(V::Fma(qv, Block<L, kBits>(k, code_bytes, row, b), V::Zero())) * scale;
      }
      return;
    }
    for (int64_t j = 0; j < n; ++j, row.Next(k)) {
      F acc = V::Zero();
      for (int i = 0; i < blocks; ++i) {
        const BlockPlan b = i < kPlanned ? plans[i] : Plan(k, 16 * i);
        acc = V::Fma(V::Load(q + b.c0, b.m), Block<L, kBits>(k, code_bytes, row, b), acc);
      }
      scores[j] = V::Reduce(acc) * scale;
    }
  }

  // C 16-lane chunks of out starting at channel d0 (up to 64 channels per
  // pass): C independent FMA chains per key, each in key order.
  template <Layout L, int kBits, int C>
  static void AccumulateChunks(const float* p, const QuantizedKvRows& v, int64_t first, int64_t n,
                               int d0, float* out) {
    F acc[C];
    BlockPlan plans[C];
    for (int c = 0; c < C; ++c) {
      plans[c] = Plan(v, d0 + 16 * c);
      acc[c] = V::Load(out + plans[c].c0, plans[c].m);
    }
    const int64_t code_bytes = CodeBytes(v);
    RowCursor<L> row(v, first);
    for (int64_t j = 0; j < n; ++j, row.Next(v)) {
      const F pj = V::Set1(p[j]);
      for (int c = 0; c < C; ++c) {
        acc[c] = V::Fma(pj, Block<L, kBits>(v, code_bytes, row, plans[c]), acc[c]);
      }
    }
    for (int c = 0; c < C; ++c) V::Store(out + plans[c].c0, acc[c], plans[c].m);
  }

  template <Layout L, int kBits>
  static void Accumulate(const float* p, const QuantizedKvRows& v, int64_t first, int64_t n,
                         float* out) {
    using ChunksFn = void (*)(const float*, const QuantizedKvRows&, int64_t, int64_t, int, float*);
    static constexpr ChunksFn kWhole[] = {
        nullptr, AccumulateWhole<L, kBits, 1>, AccumulateWhole<L, kBits, 2>,
        AccumulateWhole<L, kBits, 3>, AccumulateWhole<L, kBits, 4>};
    static constexpr ChunksFn kGeneral[] = {
        nullptr, AccumulateChunks<L, kBits, 1>, AccumulateChunks<L, kBits, 2>,
        AccumulateChunks<L, kBits, 3>, AccumulateChunks<L, kBits, 4>};
    const ChunksFn* chunks = WholeBlocks(v) > 0 ? kWhole : kGeneral;
    for (int d0 = 0; d0 < v.dim; d0 += 64) {
      chunks[(std::min(64, v.dim - d0) + 15) / 16](p, v, first, n, d0, out);
    }
  }

  // One instantiation per (layout, bits), chosen once per call.
  template <template <Layout, int> class Op, class... Args>
  static void Dispatch(const QuantizedKvRows& x, Args... args) {
    auto bits = [&]<Layout L>() {
      switch (x.bits) {
        case 2:
          Op<L, 2>::Run(args...);
          break;
        case 4:
          Op<L, 4>::Run(args...);
          break;
        default:
          Op<L, 8>::Run(args...);
          break;
      }
    };
    switch (x.layout) {
      case Layout::kPerTokenSymmetric:
        bits.template operator()<Layout::kPerTokenSymmetric>();
        break;
      case Layout::kPerTokenAsymmetric:
        bits.template operator()<Layout::kPerTokenAsymmetric>();
        break;
      case Layout::kPerChannelAsymmetric:
        bits.template operator()<Layout::kPerChannelAsymmetric>();
        break;
    }
  }

  template <Layout L, int kBits>
  struct ScoresOp {
    static void Run(const float* q, const QuantizedKvRows* k, int64_t first, int64_t n, float scale,
                    float* scores) {
      Scores<L, kBits>(q, *k, first, n, scale, scores);
    }
  };
  template <Layout L, int kBits>
  struct AccumulateOp {
    static void Run(const float* p, const QuantizedKvRows* v, int64_t first, int64_t n,
                    float* out) {
      Accumulate<L, kBits>(p, *v, first, n, out);
    }
  };

  static void ScoresEntry(const float* q, const QuantizedKvRows& k, int64_t first, int64_t n,
                          float scale, float* scores) {
    Dispatch<ScoresOp>(k, q, &k, first, n, scale, scores);
  }
  static void AccumulateEntry(const float* p, const QuantizedKvRows& v, int64_t first, int64_t n,
                              float* out) {
    Dispatch<AccumulateOp>(v, p, &v, first, n, out);
  }
  static KvQuantOps Ops() { return {ScoresEntry, AccumulateEntry}; }
};

#undef VC_KVQ_INLINE

}  // namespace vc::kernels::cpu
