// An independent float64 Llama forward pass, the oracle for exactness tests.
//
// Written loop by loop in double precision from the model's f32 weights (each
// widened exactly), sharing nothing with the engine or the kernels beyond
// vc::Model (configuration + weight pointers). It honours everything the
// engine must: RMSNorm eps, q/k/v biases, RoPE (theta, interleaved or
// half-split pairs, no/linear/Llama 3.1 scaling), grouped-query attention,
// sliding-window causal attention, SwiGLU and an untied classifier.
//
// For a bf16/f16 model it rounds K (after RoPE) and V to the model's dtype
// before attention (docs/numerics.md, "Model dtype").
//
// It is incremental (its own KV cache), so teacher-forcing a whole 512-token
// context of a tiny model takes well under a second.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/model/model.h"

namespace vc::reference {

class ReferenceLlama {
 public:
  // `model` must outlive this object.
  explicit ReferenceLlama(const Model& model);

  // Runs `token` at position position() and returns its logits [vocab];
  // position() then advances by one.
  std::vector<double> Step(int32_t token);

  // The next position Step() will compute.
  int32_t position() const { return length_; }

  // Forgets positions >= length (rollback).
  void Truncate(int32_t length);

 private:
  void MatVec(const WeightMatrix& w, const float* bias, const double* x, int in, int out,
              double* y) const;
  void RmsNorm(const double* x, const float* g, double* out) const;
  void Rope(double* head, int32_t pos) const;

  const Model& model_;
  const ModelConfig& cfg_;
  std::vector<double> inv_freq_;  // [head_dim / 2], after any scaling
  double position_scale_ = 1.0;   // 1 / factor for linear scaling
  // k_[layer][pos * kv_dim + i], v_ likewise (K already rotated).
  std::vector<std::vector<double>> k_, v_;
  int32_t length_ = 0;
};

// x rounded to nearest even at the precision of `dtype` (identity for f32),
// computed from the formats' definitions in double (not common/base/dtype.h).
double RoundToSignificand(double x, Dtype dtype);

// Logits of every position of `tokens`, teacher-forced from position 0.
std::vector<std::vector<double>> ReferenceLogits(const Model& model,
                                                 std::span<const int32_t> tokens);

struct GreedyRun {
  std::vector<int32_t> tokens;              // the prompt, then greedy tokens
  std::vector<std::vector<double>> logits;  // one row per entry of `tokens`
};

// Feeds `prompt` (non-empty) and then its own greedy choice at every step
// until the sequence holds `total_length` tokens (>= prompt.size()). Returns
// the full sequence and the logits computed at each of its positions (the
// last row predicts the token after the sequence).
GreedyRun ReferenceGreedy(const Model& model, std::span<const int32_t> prompt,
                          int32_t total_length);

struct TopTwo {
  int32_t top1 = -1;    // argmax; the lowest index on exact ties
  double margin = 0.0;  // logit[top1] - the best other logit (0 on a tie)
};
TopTwo TopTwoOf(std::span<const double> logits);

}  // namespace vc::reference
