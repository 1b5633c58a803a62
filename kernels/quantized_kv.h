// Attention over quantised K/V rows read in place: the drafter's scores and
// value sums over INT8 and KIVI-2/4 compressed KV (common/kv/row_codec.h owns
// the formats), without dequantising rows into an f32 buffer first.
//
// Layout of a block of rows (memory as the row codec stores it):
//  * codes: row r, channel c has code u = bits [b, b + bits) of the byte
//    string, b = (r * dim + c) * bits, least significant bits first (bits is
//    2, 4 or 8, so no code straddles a byte).
//  * per-token layouts: a row is split into ceil(dim / group) groups of
//    `group` channels (the last may be partial); scales (and zeros) are
//    [rows][groups_per_row].
//  * per-channel layout: rows are grouped `group` tokens at a time; scales
//    and zeros are [rows / group][dim].
//
// Numerics (docs/numerics.md, "Fused attention over compressed KV"), the
// same on every SIMD level:
//  * element (r, c) is the f32 value x of the codec's decoder:
//      symmetric:  x = float(int(u) - (2^(bits-1) - 1)) * s
//      asymmetric: x = float(u) * s + z   (product rounded, then the sum)
//    with s, z the scale and zero point of the element's group;
//  * scores[j] = Dot(q, x(first + j, .)) * scale with Dot the 16-lane
//    canonical dot product of kernels.h (a partial last block padded with
//    zeros in both operands);
//  * out[d] = fma(p[j], x(first + j, d), out[d]) for j = 0..n-1 in order.
// That is exactly what KernelBackend::AttentionScores / AccumulateValues
// compute on the decoded rows, so the fused path is bit-identical to
// decoding first and calling the f32 kernels (and so nothing downstream of
// the drafter changes).
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace vc::kernels {

// A read-only view of quantised rows [0, rows); the memory stays owned by the
// caller (a RowStore).
struct QuantizedKvRows {
  enum class Layout { kPerTokenSymmetric, kPerTokenAsymmetric, kPerChannelAsymmetric };
  Layout layout = Layout::kPerTokenSymmetric;
  int bits = 8;      // 2, 4 or 8
  int dim = 0;       // channels per row (head_dim)
  int group = 1;     // >= 1: channels per group (per-token), tokens per group (per-channel)
  int64_t rows = 0;  // quantised rows in the view
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const float* zeros = nullptr;  // null for the symmetric layout
};

// scores[j] for j < n over rows [first, first + n) of `k` (see the top).
// first + n <= k.rows.
void QuantizedScores(SimdLevel level, const float* q, const QuantizedKvRows& k, int64_t first,
                     int64_t n, float scale, float* scores);

// out[d] for d < v.dim over rows [first, first + n) of `v` (see the top).
void QuantizedAccumulate(SimdLevel level, const float* p, const QuantizedKvRows& v, int64_t first,
                         int64_t n, float* out);

}  // namespace vc::kernels
