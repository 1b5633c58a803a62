// The exact forward pass: a batch of sequences, each contributing any number
// of new tokens at consecutive absolute positions (prefill, 1-token decode,
// multi-token verify), against each sequence's own KV state.
//
// Batch invariance (docs/numerics.md): every row is computed by the same
// canonical kernels, element by element, so a token's logits are bit-identical
// whatever else shares the batch, however many tokens its sequence brings,
// and whatever the thread count or SIMD level.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "kernels/kernels.h"

namespace vc {

// The version of the engine's numerics definition (docs/numerics.md); it goes
// into KV chunk keys and worker info so that KV computed under one definition
// is never consumed under another. 1: plain canonical dot products; 2:
// o_proj/down_proj reduce over B fixed blocks combined by a pairwise tree
// (tensor-parallel invariant). Does not depend on the tensor-parallel degree.
inline constexpr uint32_t kNumericsVersion = 2;

// The numerics version of a model: kNumericsVersion + 256 * its dtype
// (f32 0, bf16 1, f16 2), because a bf16/f16 model's KV is rounded to its
// dtype (docs/numerics.md, "Model dtype"). f32 models: kNumericsVersion.
uint32_t NumericsVersionFor(const ModelConfig& config);

// Sees the attention probabilities of a pass, e.g. to gather the statistics
// that token-dropping compressors rank keys by. Observe is called
// concurrently for different (row, head) pairs, never twice for one pair.
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  // probs[j] is the weight query head `head` (at `query_pos`) gave the stored
  // key range.first + j of KV head `kv_head` in `layer`.
  virtual void Observe(int layer, int head, int kv_head, int32_t query_pos,
                       SequenceKv::KeyRange range, const float* probs) = 0;
};

struct SequenceInput {
  SequenceKv* kv = nullptr;         // extended by tokens.size() positions
  std::span<const int32_t> tokens;  // at positions kv->next_position() + i
  // Logits are returned for tokens[i], i >= first_logit (tokens.size() for
  // none, tokens.size() - 1 for the last only, 0 for all).
  int64_t first_logit = 0;
  AttentionObserver* observer = nullptr;  // optional
};

struct EngineOptions {
  kernels::BackendOptions backend;
  // Tensor-parallel degree T: T ranks (threads here, one collective group)
  // each hold a slice of every layer (docs/numerics.md, "Tensor
  // parallelism"). T must divide the model's reduction block count B and
  // n_kv_heads; logits are bit-identical for every valid T. backend.threads
  // is shared among the ranks.
  int tensor_parallel = 1;
  std::string collective = "cpu";  // collective backend registry name
  // Upper bound on the new tokens of one Forward call (scratch is sized for
  // it once); larger batches are rejected with InvalidArgument.
  int64_t max_batch_tokens = 4096;
  // A drafter's engine: the projections and the classifier run on these
  // weight-quantised copies of the model's (which must outlive the engine)
  // instead of the f32 weights. Its logits are only for drafting: they are
  // still batch-, thread- and SIMD-invariant, but not the model's exact
  // numerics. Needs the cpu backend and tensor_parallel 1. Null: f32.
  const QuantizedWeights* quantized = nullptr;
  // Create runs one throwaway pass of this many tokens (at most
  // max_batch_tokens) on a KV of its own, so that a fresh process's first
  // real passes do not pay for first touches: the activation buffers, the
  // workers' attention scratch, the packed weights and the code all get
  // touched once here (docs/results.md section 8). 0: no warm-up pass.
  // Logits never depend on it (every row's arithmetic is fixed).
  int64_t warmup_tokens = 1;
};

// Wall time of a forward pass's stages, summed over the passes run while it
// is set (Engine::set_stage_times), as rank 0 saw them: where a verify pass's
// time goes against a decode step's (vc_single_node_bench --stages). Each
// stage's time runs from the end of the stage before, so the stages add up
// to the pass but for its validation and the wait for the other ranks.
struct StageTimes {
  enum Stage {
    kEmbedding,    // token rows of x
    kNorms,        // RMSNorm before attention and before the FFN
    kQkv,          // the q, k and v projections
    kRopeKvWrite,  // RoPE, rounding to the KV dtype, writing the KV rows
    kAttention,    // scores, softmax and value sums over the KV
    kOutProj,      // o_proj (row-parallel) and the residual add
    kGateUp,       // the FFN's gate and up projections
    kSwiGlu,       // SwiGLU's elementwise step
    kDownProj,     // down_proj (row-parallel) and the residual add
    kClassifier,   // final RMSNorm and the classifier
    kCount
  };
  static const char* Name(int stage);
  double seconds[kCount] = {};
  int64_t passes = 0;
};

// The number of fixed reduction blocks B of the model's row-parallel products
// (o_proj over q_dim, down_proj over hidden_dim): the largest of 8, 4, 2, 1
// dividing both. Part of the numerics definition, independent of the degree.
int ReductionBlocks(const ModelConfig& config);
// OK iff `degree` is a valid tensor-parallel degree for the model: >= 1,
// dividing ReductionBlocks(config) and n_kv_heads.
[[nodiscard]] absl::Status CheckTensorParallel(const ModelConfig& config, int degree);

class Engine {
 public:
  // `model` must outlive the engine. Runs the warm-up pass
  // (EngineOptions::warmup_tokens), and the first call in a process sets
  // glibc's mmap and trim thresholds so that freed KV and buffers are reused
  // rather than returned to the OS and faulted in again.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const Model& model,
                                                        const EngineOptions& options);
  ~Engine();

  // Runs one pass. `logits` is resized to [rows][vocab], rows being the
  // requested logit rows of the batch entries in order. Token ids outside the
  // vocabulary, or positions past a KV's capacity, fail with InvalidArgument /
  // ResourceExhausted before any KV is modified.
  absl::Status Forward(std::span<const SequenceInput> batch, std::vector<float>* logits);

  const Model& model() const { return model_; }
  const ModelConfig& config() const { return model_.config(); }
  int64_t max_batch_tokens() const { return options_.max_batch_tokens; }
  int tensor_parallel() const { return options_.tensor_parallel; }
  // Rank 0's backend.
  kernels::KernelBackend& backend();
  // While set (not null), every Forward adds its stages' wall times to
  // `times` (which must outlive that). Costs two clock reads per stage and
  // layer; not to be changed while a Forward runs.
  void set_stage_times(StageTimes* times) { stage_times_ = times; }

 private:
  struct Scratch;
  struct Rank;
  struct Pass;
  Engine(const Model& model, const EngineOptions& options);
  absl::Status RankForward(int rank, const Pass& pass);

  const Model& model_;
  EngineOptions options_;
  kernels::SimdLevel quant_level_ = kernels::SimdLevel::kScalar;  // with options_.quantized
  std::vector<Rank> ranks_;
  std::unique_ptr<Scratch> scratch_;  // shared per-row inputs of a pass
  StageTimes* stage_times_ = nullptr;
};

}  // namespace vc
