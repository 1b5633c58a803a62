// Wire/storage format of one compressed variant of a prefix (a
// CompressedPrefix: token-dropped, quantised, or both), stored next to the
// prefix's full-KV chunks under CompressedVariantKey (chunk_key.h) and fetched
// by drafters. The reader verifies the checksum before parsing anything else.
//
// Layout (all integers little-endian, floats as their f32 bit patterns):
//   header (32 bytes): magic "VCKV", u32 format version (2), u32 layers,
//     u32 kv_heads, u32 head_dim, i32 prefix_len, u32 description bytes,
//     u32 reserved (0)
//   description (Compressor::Describe(), at most kMaxVariantDescriptionBytes)
//   per layer: u32 kept count; per KV head: kept positions (count x i32),
//     key RowStore, value RowStore (RowStore::AppendSerialized: spec, shape,
//     packed codes, scales, zero points, full-precision rows in the
//     narrowest exact dtype: a bf16/f16 model's kept rows in its dtype)
//   checksum (32 bytes): SHA-256 over everything before it (as for chunks).
// Decoding reproduces the stored rows exactly: the decoded prefix has the
// same bytes(), ratio(), kept positions and bit-identical attention.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/kv/compressed_kv.h"
#include "common/kvstore/seal.h"
#include "common/model/model.h"

namespace vc::kvstore {

// 2: full-precision rows carry their dtype (1 had f32 rows only; a version-1
// entry, e.g. in a store persisted before, is refused as unsupported).
inline constexpr uint32_t kVariantFormatVersion = 2;
inline constexpr size_t kVariantHeaderBytes = 32;
inline constexpr size_t kVariantChecksumBytes = 32;
inline constexpr size_t kMaxVariantDescriptionBytes = 4096;

struct VariantHeader {
  uint32_t format_version = kVariantFormatVersion;
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  int32_t prefix_len = 0;
  std::string description;
};

// Serialises `prefix` (deterministic: the same prefix gives the same bytes),
// with room reserved for a seal (seal.h) to be appended without a copy.
std::string EncodeCompressedPrefix(const CompressedPrefix& prefix);

// Checks size and checksum (unless `checksum` says the caller has just
// recomputed it, as SealTrust::Open does), then the header (magic, version,
// shape). DataLoss for truncation or a checksum mismatch (any changed byte),
// InvalidArgument for a well-formed blob that is not a supported variant
// (e.g. a full-KV chunk, another format version).
absl::StatusOr<VariantHeader> VerifyVariant(const std::string& bytes,
                                            ChecksumCheck checksum = ChecksumCheck::kRecompute);

// Verifies `bytes` and rebuilds the prefix for a model of shape `config`.
// DataLoss as VerifyVariant; InvalidArgument for a malformed header or body,
// or a shape (layers, kv_heads, head_dim, prefix_len beyond max_seq_len) that
// does not match `config`.
absl::StatusOr<std::shared_ptr<const CompressedPrefix>> DecodeCompressedPrefix(
    const ModelConfig& config, const std::string& bytes,
    ChecksumCheck checksum = ChecksumCheck::kRecompute);

}  // namespace vc::kvstore
