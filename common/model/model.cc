#include "common/model/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/model/internal/storage.h"

namespace vc {

Model::Model() = default;
Model::~Model() = default;

std::unique_ptr<Model> ModelBuilder::Make(ModelConfig config, ModelWeights weights,
                                          std::string source,
                                          std::unique_ptr<Model::Storage> storage) {
  std::unique_ptr<Model> m(new Model());
  m->config_ = std::move(config);
  m->weights_ = std::move(weights);
  m->source_ = std::move(source);
  m->storage_ = std::move(storage);
  return m;
}

int64_t ModelConfig::num_parameters() const {
  const int64_t d = dim, h = hidden_dim, q = q_dim(), kv = kv_dim();
  int64_t per_layer = 2 * d + d * q + 2 * kv * d + q * d + 3 * h * d;
  if (qkv_bias) per_layer += q + 2 * kv;
  int64_t n = int64_t{vocab_size} * d + n_layers * per_layer + d;
  if (!tied_embeddings) n += int64_t{vocab_size} * d;
  return n;
}

bool ModelConfig::IsEos(int32_t token) const {
  if (eos_ids.empty()) return token == eos_id;
  return std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
}

absl::Status ModelConfig::Validate() const {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("model config (", architecture, "): ", what));
  };
  if (dim <= 0 || hidden_dim <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 ||
      head_dim <= 0 || vocab_size <= 0 || max_seq_len <= 0) {
    return bad(absl::StrCat("sizes must be positive (dim=", dim, " hidden_dim=", hidden_dim,
                            " n_layers=", n_layers, " n_heads=", n_heads, " n_kv_heads=",
                            n_kv_heads, " head_dim=", head_dim, " vocab_size=", vocab_size,
                            " max_seq_len=", max_seq_len, ")"));
  }
  if (n_heads % n_kv_heads != 0) {
    return bad(absl::StrCat("n_heads=", n_heads, " is not a multiple of n_kv_heads=", n_kv_heads));
  }
  if (head_dim % 2 != 0) return bad(absl::StrCat("head_dim=", head_dim, " must be even for RoPE"));
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps must be positive");
  if (!(rope.theta > 0)) return bad("rope theta must be positive");
  if (sliding_window < 0) return bad("sliding_window must be >= 0");
  if (bos_id < 0 || bos_id >= vocab_size || eos_id < 0 || eos_id >= vocab_size) {
    return bad(absl::StrCat("bos_id=", bos_id, "/eos_id=", eos_id, " outside vocab ", vocab_size));
  }
  if (eos_ids.size() > kMaxEosIds) {
    return bad(absl::StrCat(eos_ids.size(), " end-of-sequence ids (at most ", kMaxEosIds, ")"));
  }
  for (const int32_t id : eos_ids) {
    if (id < 0 || id >= vocab_size) {
      return bad(absl::StrCat("end-of-sequence id ", id, " outside vocab ", vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const LoadOptions& options) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  if (S_ISDIR(st.st_mode)) return LoadHuggingFace(path, options);
  return LoadLlama2c(path);
}

absl::StatusOr<std::unique_ptr<Model>> Model::CreateRandom(const ModelConfig& config,
                                                           uint64_t seed) {
  if (auto s = config.Validate(); !s.ok()) return s;
  auto storage = std::make_unique<Storage>();
  std::mt19937_64 rng(seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(config.dim));
  auto tensor = [&](int64_t n, float center, float spread) -> const float* {
    std::uniform_real_distribution<float> u(center - spread, center + spread);
    auto& v = storage->owned.emplace_back(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng);
    return v.data();
  };
  const int64_t d = config.dim, h = config.hidden_dim, q = config.q_dim(), kv = config.kv_dim();
  ModelWeights w;
  w.token_embedding = tensor(config.vocab_size * d, 0.f, 1.0f);
  for (int l = 0; l < config.n_layers; ++l) {
    LayerWeights lw;
    lw.rms_att = tensor(d, 1.f, 0.1f);
    lw.wq = tensor(q * d, 0.f, scale);
    lw.wk = tensor(kv * d, 0.f, scale);
    lw.wv = tensor(kv * d, 0.f, scale);
    if (config.qkv_bias) {
      lw.bq = tensor(q, 0.f, 0.1f);
      lw.bk = tensor(kv, 0.f, 0.1f);
      lw.bv = tensor(kv, 0.f, 0.1f);
    }
    lw.wo = tensor(d * q, 0.f, scale);
    lw.rms_ffn = tensor(d, 1.f, 0.1f);
    lw.w1 = tensor(h * d, 0.f, scale);
    lw.w2 = tensor(d * h, 0.f, 1.0f / std::sqrt(static_cast<float>(h)));
    lw.w3 = tensor(h * d, 0.f, scale);
    w.layers.push_back(lw);
  }
  w.rms_final = tensor(d, 1.f, 0.1f);
  w.classifier = config.tied_embeddings ? w.token_embedding : tensor(config.vocab_size * d, 0.f, scale);
  return ModelBuilder::Make(config, std::move(w), absl::StrCat("random:", seed), std::move(storage));
}

}  // namespace vc
