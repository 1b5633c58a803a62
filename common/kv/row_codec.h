// Storage formats for rows of K or V (one row = one token of one KV head,
// head_dim floats): full precision, or quantised. A compressed KV view keeps
// its rows in one of these; attention reads quantised rows in place (the
// fused kernels of kernels/quantized_kv.h, through QuantizedRows) or decodes
// a short run of rows at a time, so no full-precision copy of a compressed
// cache is ever materialised.
//
// Formats:
//  * f32: rows as they are.
//  * per-token (INT8, KIVI values): each row split into groups of `group`
//    channels; a group stores codes plus its own scale (and zero point when
//    asymmetric).
//  * per-channel (KIVI keys): rows grouped `group` tokens at a time; each
//    channel of a token group stores its own scale and zero point. Rows that
//    do not fill a whole token group stay full precision (KIVI's residual).
// A `residual` count of trailing rows can be kept full precision in any format
// (KIVI's window of recent tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/quantized_kv.h"

namespace vc {

struct RowCodecSpec {
  enum class Kind { kF32, kPerTokenSymmetric, kPerTokenAsymmetric, kPerChannelAsymmetric };
  Kind kind = Kind::kF32;
  int bits = 32;      // 2, 4 or 8 for the quantised kinds
  int group = 0;      // channels per group (per-token) or tokens per group (per-channel); 0 = whole row
  int residual = 0;   // trailing rows kept in f32

  static RowCodecSpec F32() { return {}; }
  // InvalidArgument for unsupported bits / groups.
  absl::Status Validate(int dim) const;
  std::string DebugString() const;
};

// Immutable rows of one (layer, KV head) in one format.
class RowStore {
 public:
  // Encodes `n` rows of `dim` floats (row-major) in `spec`'s format.
  static absl::StatusOr<std::unique_ptr<RowStore>> Encode(const RowCodecSpec& spec,
                                                         const float* rows, int64_t n, int dim);
  virtual ~RowStore() = default;

  virtual int64_t rows() const = 0;
  virtual int dim() const = 0;
  // Writes row i (dequantised) to out[dim]. Deterministic: plain f32 ops.
  virtual void Decode(int64_t i, float* out) const = 0;
  // Rows [first, first + n) to out[n * dim], each exactly as Decode writes
  // it (one call for a run of rows: attention's hot path).
  virtual void DecodeRows(int64_t first, int64_t n, float* out) const = 0;
  // Row i in place if it is stored as f32, else null (fast path). Rows
  // stored as f32 are contiguous: RowIfF32(i + 1) == RowIfF32(i) + dim()
  // whenever both are non-null.
  virtual const float* RowIfF32(int64_t i) const = 0;
  // The quantised rows [0, view.rows) in place, for the fused attention
  // kernels (their element is exactly what Decode writes); every row from
  // view.rows on is f32 (RowIfF32). view.rows is 0 for an f32 store. The
  // view points into this store: valid while it lives.
  virtual kernels::QuantizedKvRows QuantizedRows() const = 0;
  // Exact bytes held: codes, scales and zero points (not container slack).
  virtual int64_t bytes() const = 0;

  // Online re-encoding (compressors' Update, common/compress/compressor.h):
  // a store of rows keep[0..) of `src` (strictly increasing indices) followed
  // by `m` new f32 rows, in `spec`'s format with spec.residual trailing rows
  // left f32 where possible. Rows already quantised in `src` keep their
  // codes, scales and zero points bit-for-bit whenever the format allows it:
  // every kept row of a per-token format, and for per-channel keys each whole
  // token group from row 0 up to the first group that lost a row (a group
  // shares its scales, so a group that lost a row is re-formed from its
  // survivors' decoded values). Quantised rows are never turned back into
  // f32, so fewer than spec.residual rows may stay f32 after heavy dropping.
  // Keeping every row and appending m rows gives exactly the store that
  // Encode(spec, all rows) builds. InvalidArgument for bad indices or spec.
  static absl::StatusOr<std::unique_ptr<RowStore>> Rebuild(const RowStore& src,
                                                          std::span<const int64_t> keep,
                                                          const float* new_rows, int64_t m,
                                                          const RowCodecSpec& spec);

  // Serialisation (for storing compressed variants, common/kvstore/
  // variant_codec.h). Appends the store exactly as held: its spec, shape,
  // packed codes, scales, zero points and full-precision rows
  // (little-endian), so that Deserialize rebuilds a store whose Decode() is
  // bit-identical, with the same bytes() and the same f32 rows. The
  // full-precision rows are written as a u32 dtype and the values in the
  // narrowest of bf16, f16, f32 that holds every one of them exactly: a
  // bf16/f16 model's rows (already rounded to its dtype) take 2 bytes a
  // value, losslessly. No checksum: the container has one.
  virtual void AppendSerialized(std::string* out) const = 0;
  // Parses one store written by AppendSerialized from bytes[*offset, ...)
  // and advances *offset past it. InvalidArgument for a bad spec, shape or
  // rows dtype (unknown, or not the one AppendSerialized picks for those
  // values) or too few bytes; sizes are checked against the input before
  // allocating.
  static absl::StatusOr<std::unique_ptr<RowStore>> Deserialize(std::string_view bytes,
                                                               size_t* offset);
};

}  // namespace vc
