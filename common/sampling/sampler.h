// Token selection from one row of logits: greedy, or seeded sampling whose
// randomness is a pure function of (seed, absolute position, token id).
//
// Seeded sampling is Gumbel-max over the filtered logits: token t wins if it
// maximises logit[t] / T + g(seed, pos, t), with g Gumbel noise from a
// counter-based hash. Two code paths that see the same logits at the same
// position therefore pick the same token, which is what lets a drafter and a
// verifier (or full-KV decoding) agree bit for bit under sampling.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace vc {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: no top-k filter
  float top_p = 1.0f;        // 1: no nucleus filter
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
  // InvalidArgument for negative temperature, top_k < 0, top_p outside (0, 1].
  absl::Status Validate() const;
};

// Index of the largest logit; ties go to the lowest id.
int32_t Argmax(std::span<const float> logits);

// Greedy when params.greedy(); otherwise Gumbel-max with keyed noise over
// the tokens that survive top-k, then top-p (both by logit order, ties to the
// lower id).
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params,
                    int64_t position);

// The distribution SampleToken draws from: softmax(logits / T) over the
// tokens that survive top-k and top-p, zero elsewhere (one-hot when greedy).
// Used by rejection sampling, which needs probabilities, not just a draw.
std::vector<double> FilteredDistribution(std::span<const float> logits,
                                         const SamplingParams& params);

// A draw from `probs` (non-negative, need not sum to 1) by Gumbel-max with
// noise keyed by (seed, position, token).
int32_t SampleFromDistribution(std::span<const double> probs, uint64_t seed, int64_t position);

// A uniform in (0, 1) keyed by (seed, position).
double KeyedUniform(uint64_t seed, int64_t position);

// One step of speculative (rejection) sampling (Leviathan et al., Chen et
// al.): draft `d` was drawn from q; accept it with probability
// min(1, p[d] / q[d]) using the uniform `u`; otherwise draw from the residual
// max(0, p - q) (renormalised; p itself if the residual is empty) with noise
// keyed by (residual_seed, position). Returns the kept or replacement token
// and sets *accepted. The result is distributed exactly as p.
int32_t SpeculativeAccept(std::span<const double> p, std::span<const double> q, int32_t d,
                          double u, uint64_t residual_seed, int64_t position, bool* accepted);

// Speculative (rejection) sampling as both sides of a draft/verify split run
// it. Each side keys its randomness by the absolute position and one of three
// independent streams derived from params.seed (draft draw, accept uniform,
// residual draw), so a drafter and a verifier in different processes make
// the same decisions as one process would.
//
// The drafter's side: draws a draft from the filtered distribution q of its
// own logits at `position` and returns it; *q receives the distribution (the
// verifier needs it to judge the draft).
int32_t DrawRejectionDraft(std::span<const float> draft_logits, const SamplingParams& params,
                           int64_t position, std::vector<double>* q);
// The verifier's side: judges draft `d` (drawn from `q`) against the target
// logits at `position`. Returns d with *accepted = true, or a replacement
// drawn from the residual with *accepted = false; distributed exactly as the
// target's filtered distribution.
int32_t JudgeRejectionDraft(std::span<const float> target_logits, std::span<const double> q,
                            int32_t d, const SamplingParams& params, int64_t position,
                            bool* accepted);

// The noise itself, exposed for tests: a standard Gumbel variate that is a
// pure function of its arguments.
double GumbelNoise(uint64_t seed, int64_t position, int32_t token);

}  // namespace vc
