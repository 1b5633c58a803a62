// Content-addressed keys for KV chunks (DESIGN.md section 4).
//
// A full-KV chunk key is SHA-256 over a length-prefixed encoding of (tenant
// salt, model id, numerics version, KV dtype/layout version, previous chunk
// key or empty, the chunk's token ids), so a key names one exact prefix of
// one exact model. A compressed variant depends on the whole prefix and is
// keyed by (the prefix's last full-chunk key, the compressor's Describe()
// string with its parameters, ratio).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/model.h"

namespace vc::kvstore {

// A 32-byte SHA-256 digest.
struct ChunkKey {
  std::array<uint8_t, 32> bytes{};

  // 64 lower-case hex digits.
  std::string Hex() const;
  // The 32 raw bytes as a string (e.g. a storage key).
  std::string Raw() const { return std::string(bytes.begin(), bytes.end()); }
  static absl::StatusOr<ChunkKey> FromRaw(const std::string& raw);

  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  friend auto operator<=>(const ChunkKey&, const ChunkKey&) = default;
};

// Identifies a model: hash of the config fields that change the math and of
// every weight byte.
using ModelId = ChunkKey;

struct ChunkKeyOptions {
  // Tokens per full-KV chunk; default 256. Only whole chunks are keyed.
  int chunk_tokens = 256;
  // Per-tenant salt; default empty (shared). Derived from the caller's
  // identity once authentication exists, never trusted from a request.
  std::string tenant_salt;
  // Version of the numerics contract (kernels' exactness); default the
  // engine's current one for f32 models, vc::kNumericsVersion (2:
  // row-parallel products over B fixed blocks, docs/numerics.md; kept equal
  // by a test). bf16/f16 models use vc::NumericsVersionFor(config) (258,
  // 514: KV rounded to the model dtype), which the workers and the
  // coordinator set here.
  uint32_t numerics_version = 2;
  // Version of the KV layout ([kv_heads][tokens][head_dim]; the dtype is the
  // model's, named by the numerics version and the model id); default 1.
  uint32_t kv_layout_version = 1;
};

// The key of one full-KV chunk. `previous` is null for the first chunk.
ChunkKey FullChunkKey(const ChunkKeyOptions& options, const ModelId& model,
                      const ChunkKey* previous, absl::Span<const int32_t> tokens);

// Keys of the whole chunks of `tokens` (a trailing partial chunk gets none),
// each chained on the one before. InvalidArgument if chunk_tokens <= 0.
absl::StatusOr<std::vector<ChunkKey>> ChunkKeysForTokens(const ChunkKeyOptions& options,
                                                         const ModelId& model,
                                                         absl::Span<const int32_t> tokens);

// The key of a compressed variant of the prefix that ends at `last_full_chunk`.
// `compressor_description` is Compressor::Describe() (it includes the
// parameters); `ratio` is the target ratio (hashed by its exact bits).
// `draft_model`: the variant is a separate draft model's prefix KV (made
// from that model's prefill, not the target's): its id is hashed in under
// another domain, so a drafter of one draft model never receives KV of
// another (or the target's). Null: the target's own variant.
ChunkKey CompressedVariantKey(const ChunkKey& last_full_chunk,
                              const std::string& compressor_description, double ratio,
                              const ModelId* draft_model = nullptr);

// The id of a separate draft model (--draft-model in the cluster): SHA-256
// over ComputeModelId(draft) and its numerics version (its KV is consumed
// only under the version it was made with). What draft variant keys hash and
// what workers report in Info.draft_model_id.
ModelId DraftModelId(const Model& draft);

// A model id's first 16 hex digits (logs, Info answers, totals).
std::string ShortModelId(const ModelId& id);

// The key of the coordinator's ledger of what `tenant`'s ingests stored for
// `model` (the --max-stored-bytes-per-tenant count, which a restarted
// coordinator reads back). In a domain of its own: it never equals a chunk,
// variant or manifest key, whatever the tenant is called.
ChunkKey TenantLedgerKey(const ModelId& model, const std::string& tenant);

// The key of a registered prefix's manifest (its whole token list, which may
// end in a partial chunk): a registered prefix is named by this key's hex.
ChunkKey PrefixManifestKey(const ChunkKeyOptions& options, const ModelId& model,
                           absl::Span<const int32_t> tokens);

// Hash of the fields of `config` that change the math (not bos/eos or
// max_seq_len) and of the weight tensors, in order, each length-prefixed.
ModelId ComputeModelId(const ModelConfig& config,
                       absl::Span<const absl::Span<const float>> tensors);
// The same for a loaded model, streaming every weight tensor (embedding, per
// layer rms_att wq wk wv [bq bk bv] wo rms_ffn w1 w2 w3, rms_final, and the
// classifier when not tied).
ModelId ComputeModelId(const Model& model);

}  // namespace vc::kvstore
