// Model loading: a Llama-family decoder's configuration and f32 weights, from
// a llama2.c checkpoint, a Hugging Face checkpoint directory (config.json +
// safetensors), or random weights for tests and benchmarks.
//
// Weight matrices are row-major [out, in] in the checkpoint's dtype
// (WeightMatrix): f32 tensors are used in place from the memory-mapped file,
// f16/bf16 matrices are kept 2 bytes wide and widened by the kernels as they
// read them (LoadOptions::widen_weights widens them once at load instead; the
// results are bit-identical). Norm weights and biases are always f32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/model/weight_matrix.h"

namespace vc {

// How the two halves of a rotary pair are laid out inside a head.
enum class RopeLayout {
  kInterleaved,  // pairs (2i, 2i+1): llama2.c checkpoints
  kHalfSplit,    // pairs (i, i + head_dim/2): Hugging Face "rotate_half"
};

struct RopeConfig {
  double theta = 10000.0;
  RopeLayout layout = RopeLayout::kInterleaved;
  enum class Scaling { kNone, kLinear, kLlama3 };
  Scaling scaling = Scaling::kNone;
  double factor = 1.0;            // linear and llama3
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int original_max_position = 8192;  // llama3
};

struct ModelConfig {
  std::string architecture = "llama2c";  // or the HF architectures name
  int dim = 0;
  int hidden_dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // usually dim / n_heads
  int vocab_size = 0;
  int max_seq_len = 0;  // context length the model was trained for
  float rms_norm_eps = 1e-5f;
  RopeConfig rope;
  int sliding_window = 0;     // 0: attend to the whole context
  bool qkv_bias = false;      // Qwen2, or Llama with attention_bias
  bool tied_embeddings = true;
  // The model's dtype: its KV rows are rounded to it when written
  // (docs/numerics.md, "Model dtype"). A checkpoint whose weight matrices
  // are all bf16 (or all f16) has that dtype; anything else is f32.
  Dtype dtype = Dtype::kF32;
  int bos_id = 1;
  int eos_id = 2;  // the model's end-of-sequence token
  // Every id that ends generation (eos_id among them when non-empty): a
  // Hugging Face checkpoint may list several (Llama 3's <|eot_id|> and
  // <|end_of_text|>), from generation_config.json or else config.json.
  // Empty means {eos_id}, as for llama2.c checkpoints.
  std::vector<int32_t> eos_ids;
  static constexpr size_t kMaxEosIds = 256;  // far above any real model's handful

  // Whether generation stops at `token` (unless the request ignores EOS).
  bool IsEos(int32_t token) const;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Bytes of full KV (in the model's dtype) for one token across all layers
  // (K and V).
  int64_t kv_bytes_per_token() const { return int64_t{2} * n_layers * kv_dim() * DtypeBytes(dtype); }
  int64_t num_parameters() const;
  // Returns InvalidArgument if the shape is inconsistent.
  absl::Status Validate() const;
};

// Pointers into the model's weight storage; row-major, matrices in their
// checkpoint's dtype, vectors f32.
struct LayerWeights {
  const float* rms_att = nullptr;  // [dim]
  WeightMatrix wq;                 // [q_dim, dim]
  WeightMatrix wk;                 // [kv_dim, dim]
  WeightMatrix wv;                 // [kv_dim, dim]
  const float* bq = nullptr;       // [q_dim] or null
  const float* bk = nullptr;       // [kv_dim] or null
  const float* bv = nullptr;       // [kv_dim] or null
  WeightMatrix wo;                 // [dim, q_dim]
  const float* rms_ffn = nullptr;  // [dim]
  WeightMatrix w1;                 // gate [hidden, dim]
  WeightMatrix w2;                 // down [dim, hidden]
  WeightMatrix w3;                 // up   [hidden, dim]
};

struct ModelWeights {
  WeightMatrix token_embedding;       // [vocab, dim]
  std::vector<LayerWeights> layers;
  const float* rms_final = nullptr;   // [dim]
  WeightMatrix classifier;            // [vocab, dim]; == token_embedding when tied
};

struct LoadOptions {
  // Widen bf16/f16 weight matrices to f32 once at load (twice the memory;
  // bit-identical results). The model's dtype, and so its KV, is unchanged.
  bool widen_weights = false;
};

class Model {
 public:
  // Loads a llama2.c checkpoint file or a Hugging Face checkpoint directory.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     const LoadOptions& options = {});
  static absl::StatusOr<std::unique_ptr<Model>> LoadLlama2c(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Model>> LoadHuggingFace(const std::string& dir,
                                                                const LoadOptions& options = {});
  // Weights drawn uniformly from [-scale, scale] (norm weights around 1), a
  // pure function of (config, seed).
  static absl::StatusOr<std::unique_ptr<Model>> CreateRandom(const ModelConfig& config,
                                                             uint64_t seed);

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& source() const { return source_; }

  // Storage the weights point into; the loaders fill these.
  struct Storage;

 private:
  Model();
  ModelConfig config_;
  ModelWeights weights_;
  std::string source_;
  std::unique_ptr<Storage> storage_;

  friend class ModelBuilder;
};

}  // namespace vc
