// Wire/storage format of one full-KV chunk: every layer's K and V rows for a
// run of consecutive positions of a PagedKvCache, with a header and a
// checksum that the reader verifies before touching the cache.
//
// Layout (all integers little-endian):
//   header (36 bytes): magic "VCKC", u32 format version (1), u32 layers,
//     u32 kv_heads, u32 head_dim, u32 tokens, u32 dtype (vc::Dtype: 0 = f32,
//     1 = bf16, 2 = f16; the model's KV dtype), i32 first_position,
//     u32 reserved (0)
//   payload: for each layer, K then V, each [kv_heads][tokens][head_dim] in
//     the dtype (bf16/f16 rows are the model's rounded values, bit-exact)
//   checksum (32 bytes): SHA-256 over header + payload. SHA-256 rather than
//     CRC32C: it detects every corruption we can produce in practice and is
//     already a dependency (chunk keys); its cost is small next to the copy.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/kv_cache.h"
#include "common/kvstore/seal.h"

namespace vc::kvstore {

inline constexpr uint32_t kChunkFormatVersion = 1;
inline constexpr uint32_t kChunkDtypeF32 = 0;
inline constexpr size_t kChunkHeaderBytes = 36;
inline constexpr size_t kChunkChecksumBytes = 32;

struct ChunkHeader {
  uint32_t format_version = kChunkFormatVersion;
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens = 0;
  uint32_t dtype = kChunkDtypeF32;
  int32_t first_position = 0;  // absolute position of the chunk's first token
};

// Serialises positions [first_position, first_position + tokens) of `cache`
// (all of them stored), with room reserved for a seal (seal.h) to be
// appended without a copy. InvalidArgument if the range is not stored or
// empty.
absl::StatusOr<std::string> EncodeChunk(const PagedKvCache& cache, int32_t first_position,
                                        int32_t tokens);

// Parses and verifies `bytes` (size, magic, version, dtype, shape, and the
// checksum unless `checksum` says the caller has just recomputed it, as
// SealTrust::Open does). The dtype must be a known one; DecodeChunkInto also
// requires it to equal the cache's.
// DataLoss for a checksum mismatch or truncation, InvalidArgument for a
// malformed header.
absl::StatusOr<ChunkHeader> VerifyChunk(const std::string& bytes,
                                        ChecksumCheck checksum = ChecksumCheck::kRecompute);

// Verifies `bytes` (as VerifyChunk), then appends its tokens to `cache` and
// writes their rows. The cache must have the chunk's shape (layers,
// kv_heads, head_dim) and its next_position() must equal the chunk's
// first_position (InvalidArgument otherwise). On any error the cache is
// unchanged.
absl::Status DecodeChunkInto(const std::string& bytes, PagedKvCache& cache,
                             ChecksumCheck checksum = ChecksumCheck::kRecompute);

// Calls `row` for every (layer, position) of a chunk `h` describes (`h` from
// VerifyChunk of the same `bytes`), with that row's K and V for every KV
// head ([kv_heads][head_dim]) widened to f32 from the chunk's dtype: the one
// reader of the payload, for a caller that writes the rows elsewhere (a
// drafter's refresh overwriting its own rows).
void ForEachChunkRow(
    const std::string& bytes, const ChunkHeader& h,
    const std::function<void(int layer, int32_t position, const float* k, const float* v)>& row);

}  // namespace vc::kvstore
