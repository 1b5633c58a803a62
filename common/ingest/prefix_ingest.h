// Prefix ingest (DESIGN.md section 4): prefill a shared prompt prefix once on
// a worker and turn it into the entries the KV store keeps — its full-KV
// chunks (chunk_codec.h, chained keys) and its compressed variants
// (variant_codec.h, keyed by the last chunk key, the compressor's Describe()
// and the target ratio) — and the inverse for a verifier: rebuild the full
// prefix KV from its chunks. Everything is exact: the reloaded rows equal a
// fresh prefill's, and a variant equals compressing that prefill directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compress/compressor.h"
#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/kvstore/chunk_key.h"
#include "common/kvstore/seal.h"
#include "common/model/model.h"

namespace vc::ingest {

// A compressed variant to produce at ingest (the other CompressorOptions
// fields keep their defaults unless a caller sets them).
struct VariantSpec {
  CompressorOptions compressor;
};

// Parses a comma-separated list such as
//   "snapkv:0.25,kivi:4,snapkv+kivi:0.5:4,streamingllm:0.3,int8"
// Each entry is name[:number[:number]]: a token dropper's number is its
// ratio (required), a pure quantiser's is its bits (optional), a composite
// takes ratio then bits (ratio required). Whitespace around entries and
// numbers is ignored; an empty or all-blank text is an empty list.
// InvalidArgument naming the entry for an unknown name, a bad or extra
// number, an empty entry, parameters CreateCompressor rejects, or two
// entries that make the same variant (same Describe() and ratio).
absl::StatusOr<std::vector<VariantSpec>> ParseVariantList(const std::string& text);

struct StoredVariant {
  kvstore::ChunkKey key;      // CompressedVariantKey(last chunk key, description, target_ratio)
  std::string description;    // Compressor::Describe()
  double target_ratio = 0;    // the spec's ratio (0 for pure quantisers)
  double achieved_ratio = 0;  // CompressedPrefix::ratio()
  int64_t bytes = 0;          // size of the encoded entry (what is stored and sent)
  int64_t kv_bytes = 0;       // CompressedPrefix::bytes() (what a drafter holds)
};

// A separate draft model whose prefix KV the variants are made from (the
// cluster's --draft-model): the chunks stay the target's, the variants are
// compressions of the draft model's own prefill, keyed with its id.
struct DraftModelIngest {
  Engine* engine = nullptr;     // runs the draft model (same vocabulary)
  kvstore::ModelId model_id{};  // kvstore::DraftModelId of it
};

struct PrefixEntries {
  std::vector<kvstore::ChunkKey> chunk_keys;  // full chunks, in order
  // (raw key, value) to stage in the store: the chunks in order, then the
  // variants in the order they were asked for.
  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<StoredVariant> variants;  // in the order they were asked for
  int32_t prefix_tokens = 0;            // chunk_keys.size() * chunk_tokens
};

// Prefills `tokens` once on `engine` from an empty cache (in pieces of at
// most engine.max_batch_tokens(); the engine is batch-invariant, so the KV
// and statistics do not depend on the split) while gathering AttentionStats
// for the variants that need them (one set per distinct --window, since the
// window-based methods require their own window), encodes every chunk with
// kvstore::EncodeChunk, and compresses the whole prefix with each variant.
// `tokens` must be a whole number (> 0) of key_options.chunk_tokens and fit
// the model's context; `model_id` must identify the engine's model
// (kvstore::ComputeModelId; not recomputed here). InvalidArgument for bad
// input or variants; the engine's errors pass through. `cancelled`, if set,
// is asked before each prefill piece, each chunk and each variant: once it
// answers true the work stops with Cancelled (an ingest whose caller went
// away does not run on for nobody). With `draft`, the variants come from a
// second prefill on the draft engine (the target's prefill then gathers no
// statistics) and are keyed with the draft model's id.
absl::StatusOr<PrefixEntries> BuildPrefixEntries(Engine& engine, std::span<const int32_t> tokens,
                                                 const kvstore::ChunkKeyOptions& key_options,
                                                 const kvstore::ModelId& model_id,
                                                 const std::vector<VariantSpec>& variants,
                                                 const std::function<bool()>& cancelled = {},
                                                 const DraftModelIngest* draft = nullptr);

// Verifies and decodes full chunks (in order) into a fresh PagedKvCache
// holding positions [0, sum of their tokens). `options.first_position` must
// be 0; `options.max_tokens` / `arena` bound it as usual (ResourceExhausted).
// DataLoss for a corrupt chunk; InvalidArgument for no chunks, a chunk of
// another shape, a chunk not starting where the previous one ended, or
// chunks of unequal size. `checksum`: kAlreadyRecomputed for chunks whose
// seals were just opened (StoreClient::fetched_checksum), so each byte is
// hashed once.
absl::StatusOr<std::unique_ptr<PagedKvCache>> LoadFullPrefix(
    const ModelConfig& config, const std::vector<std::string>& chunk_bytes,
    const PagedKvCache::Options& options,
    kvstore::ChecksumCheck checksum = kvstore::ChecksumCheck::kRecompute);

// The key under which BuildPrefixEntries stores `spec`'s variant of the
// prefix whose last full chunk key is `last` (what a drafter fetches);
// `draft_model`: the variant made from that draft model's prefill.
// InvalidArgument if CreateCompressor rejects the spec.
absl::StatusOr<kvstore::ChunkKey> VariantKeyFor(const kvstore::ChunkKey& last,
                                                const VariantSpec& spec,
                                                const kvstore::ModelId* draft_model = nullptr);

// Tokens of a prompt that are stored as its prefix: the largest whole-chunk
// prefix of prompt[0, prompt_len - 1). The last prompt token is never stored,
// so a request always has at least one suffix token whose logits start
// decoding. 0 when prompt_len < 2 or chunk_tokens < 1.
int32_t StoredPrefixTokens(int32_t prompt_len, int chunk_tokens);

}  // namespace vc::ingest
