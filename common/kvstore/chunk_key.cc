#include "common/kvstore/chunk_key.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/engine/engine.h"
#include "common/kvstore/internal/sha256.h"

namespace vc::kvstore {
namespace {

using internal::Sha256;

// Domain strings keep the kinds of keys apart.
constexpr char kFullChunkDomain[] = "vericache.kv.full_chunk.v1";
constexpr char kVariantDomain[] = "vericache.kv.compressed_variant.v1";
constexpr char kDraftVariantDomain[] = "vericache.kv.draft_model_variant.v1";
constexpr char kManifestDomain[] = "vericache.kv.prefix_manifest.v1";
constexpr char kTenantLedgerDomain[] = "vericache.coordinator.tenant_ledger.v1";
constexpr char kModelDomain[] = "vericache.model_id.v1";
constexpr char kDraftModelDomain[] = "vericache.draft_model_id.v1";

ChunkKey ToKey(const std::array<uint8_t, 32>& d) {
  ChunkKey k;
  k.bytes = d;
  return k;
}

void FieldInt(Sha256& h, int64_t v) { h.FieldU64(static_cast<uint64_t>(v)); }
void FieldDouble(Sha256& h, double v) { h.FieldU64(std::bit_cast<uint64_t>(v)); }

}  // namespace

std::string ChunkKey::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

absl::StatusOr<ChunkKey> ChunkKey::FromRaw(const std::string& raw) {
  if (raw.size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat("chunk key must be 32 bytes, got ", raw.size()));
  }
  ChunkKey k;
  std::memcpy(k.bytes.data(), raw.data(), 32);
  return k;
}

ChunkKey FullChunkKey(const ChunkKeyOptions& options, const ModelId& model,
                      const ChunkKey* previous, absl::Span<const int32_t> tokens) {
  Sha256 h;
  h.Field(std::string(kFullChunkDomain));
  h.Field(options.tenant_salt);
  h.Field(model.bytes.data(), model.bytes.size());
  h.FieldU64(options.numerics_version);
  h.FieldU64(options.kv_layout_version);
  if (previous != nullptr) {
    h.Field(previous->bytes.data(), previous->bytes.size());
  } else {
    h.Field(nullptr, 0);
  }
  h.U64(tokens.size() * 4);
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    const uint8_t b[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8),
                          static_cast<uint8_t>(u >> 16), static_cast<uint8_t>(u >> 24)};
    h.UpdateRaw(b, 4);
  }
  return ToKey(h.Finish());
}

absl::StatusOr<std::vector<ChunkKey>> ChunkKeysForTokens(const ChunkKeyOptions& options,
                                                         const ModelId& model,
                                                         absl::Span<const int32_t> tokens) {
  if (options.chunk_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_tokens must be positive, got ", options.chunk_tokens));
  }
  const size_t n = static_cast<size_t>(options.chunk_tokens);
  std::vector<ChunkKey> keys;
  keys.reserve(tokens.size() / n);
  for (size_t start = 0; start + n <= tokens.size(); start += n) {
    const ChunkKey* prev = keys.empty() ? nullptr : &keys.back();
    ChunkKey k = FullChunkKey(options, model, prev, tokens.subspan(start, n));
    keys.push_back(k);
  }
  return keys;
}

ChunkKey PrefixManifestKey(const ChunkKeyOptions& options, const ModelId& model,
                           absl::Span<const int32_t> tokens) {
  Sha256 h;
  h.Field(std::string(kManifestDomain));
  h.Field(options.tenant_salt);
  h.Field(model.bytes.data(), model.bytes.size());
  h.FieldU64(options.numerics_version);
  h.FieldU64(options.kv_layout_version);
  h.FieldU64(static_cast<uint64_t>(options.chunk_tokens));
  h.U64(tokens.size() * 4);
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    const uint8_t b[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8),
                          static_cast<uint8_t>(u >> 16), static_cast<uint8_t>(u >> 24)};
    h.UpdateRaw(b, 4);
  }
  return ToKey(h.Finish());
}

ChunkKey TenantLedgerKey(const ModelId& model, const std::string& tenant) {
  Sha256 h;
  h.Field(std::string(kTenantLedgerDomain));
  h.Field(model.bytes.data(), model.bytes.size());
  h.Field(tenant);
  return ToKey(h.Finish());
}

ChunkKey CompressedVariantKey(const ChunkKey& last_full_chunk,
                              const std::string& compressor_description, double ratio,
                              const ModelId* draft_model) {
  Sha256 h;
  h.Field(std::string(draft_model != nullptr ? kDraftVariantDomain : kVariantDomain));
  h.Field(last_full_chunk.bytes.data(), last_full_chunk.bytes.size());
  if (draft_model != nullptr) h.Field(draft_model->bytes.data(), draft_model->bytes.size());
  h.Field(compressor_description);
  FieldDouble(h, ratio);
  return ToKey(h.Finish());
}

std::string ShortModelId(const ModelId& id) { return id.Hex().substr(0, 16); }

namespace {

// A weight tensor of n elements in its stored dtype.
struct TensorView {
  const void* data;
  Dtype dtype;
  size_t n;
};

// Every tensor is hashed as its f32 values, so a bf16 checkpoint loaded
// narrow or widened has one id; narrow ones are widened in bounded chunks.
ModelId HashModel(const ModelConfig& c, absl::Span<const TensorView> tensors) {

  Sha256 h;
  h.Field(std::string(kModelDomain));
  h.Field(c.architecture);
  FieldInt(h, c.dim);
  FieldInt(h, c.hidden_dim);
  FieldInt(h, c.n_layers);
  FieldInt(h, c.n_heads);
  FieldInt(h, c.n_kv_heads);
  FieldInt(h, c.head_dim);
  FieldInt(h, c.vocab_size);
  FieldDouble(h, static_cast<double>(c.rms_norm_eps));
  FieldDouble(h, c.rope.theta);
  FieldInt(h, static_cast<int64_t>(c.rope.layout));
  FieldInt(h, static_cast<int64_t>(c.rope.scaling));
  FieldDouble(h, c.rope.factor);
  FieldDouble(h, c.rope.low_freq_factor);
  FieldDouble(h, c.rope.high_freq_factor);
  FieldInt(h, c.rope.original_max_position);
  FieldInt(h, c.sliding_window);
  FieldInt(h, c.qkv_bias ? 1 : 0);
  FieldInt(h, c.tied_embeddings ? 1 : 0);
  // The model's dtype rounds KV (and so changes the math); f32 adds no field
  // so that f32 models keep their ids.
  if (c.dtype != Dtype::kF32) FieldInt(h, 1000 + static_cast<int64_t>(c.dtype));
  h.U64(tensors.size());
  std::vector<float> wide;
  for (const TensorView& t : tensors) {
    // f32 bytes (little-endian hosts only, like the loaders).
    if (t.dtype == Dtype::kF32) {
      h.Field(t.data, t.n * sizeof(float));
      continue;
    }
    h.U64(t.n * sizeof(float));
    const auto* src = static_cast<const uint16_t*>(t.data);
    constexpr size_t kChunk = 1 << 14;
    for (size_t i = 0; i < t.n; i += kChunk) {
      const size_t m = std::min(kChunk, t.n - i);
      wide.resize(m);
      for (size_t j = 0; j < m; ++j) wide[j] = WidenBits(src[i + j], t.dtype);
      h.UpdateRaw(wide.data(), m * sizeof(float));
    }
  }
  return ToKey(h.Finish());
}

}  // namespace

ModelId ComputeModelId(const ModelConfig& c, absl::Span<const absl::Span<const float>> tensors) {
  std::vector<TensorView> views;
  for (const auto& t : tensors) views.push_back({t.data(), Dtype::kF32, t.size()});
  return HashModel(c, views);
}

ModelId ComputeModelId(const Model& model) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const size_t dim = static_cast<size_t>(c.dim);
  const size_t hidden = static_cast<size_t>(c.hidden_dim);
  const size_t q = static_cast<size_t>(c.q_dim());
  const size_t kv = static_cast<size_t>(c.kv_dim());
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  std::vector<TensorView> t;
  auto add = [&t](WeightMatrix m, size_t n) {
    if (m) t.push_back({m.data, m.dtype, n});
  };
  add(w.token_embedding, vocab * dim);
  for (const LayerWeights& l : w.layers) {
    add(l.rms_att, dim);
    add(l.wq, q * dim);
    add(l.wk, kv * dim);
    add(l.wv, kv * dim);
    add(l.bq, q);
    add(l.bk, kv);
    add(l.bv, kv);
    add(l.wo, dim * q);
    add(l.rms_ffn, dim);
    add(l.w1, hidden * dim);
    add(l.w2, dim * hidden);
    add(l.w3, hidden * dim);
  }
  add(w.rms_final, dim);
  if (w.classifier != w.token_embedding) add(w.classifier, vocab * dim);
  return HashModel(c, t);
}

ModelId DraftModelId(const Model& draft) {
  const ModelId weights = ComputeModelId(draft);
  Sha256 h;
  h.Field(std::string(kDraftModelDomain));
  h.Field(weights.bytes.data(), weights.bytes.size());
  h.FieldU64(NumericsVersionFor(draft.config()));
  return ToKey(h.Finish());
}

}  // namespace vc::kvstore
