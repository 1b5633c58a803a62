// The protocol's rules in one place (DESIGN.md section 3), used by the
// single-process engine (SpeculativeRequest), the split sessions
// (VerifySession) and the coordinator:
//   - AcceptDrafts: how a verify pass's logit rows judge the drafts;
//   - FallbackPolicy: when a request gives up drafting for full-KV decoding.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "common/sampling/sampler.h"

namespace vc {

// One verify pass over [p, d1..dx]: x + 1 rows of `vocab` logits, row r
// predicting the token at `first_position + r`.
struct AcceptInputs {
  std::span<const float> rows;
  int64_t vocab = 0;
  std::span<const int32_t> drafts;  // d1..dx
  int64_t first_position = 0;
  // The target's own choice at a row (greedy argmax or seeded keyed noise);
  // also picks the bonus token when every draft is kept.
  std::function<int32_t(std::span<const float> row, int64_t position)> choose;
  // Rejection sampling: each draft is kept with probability min(1, p/q) and
  // a rejected one is replaced from the residual, so the output is
  // distributed as the target's. draft_probs[i] is q of drafts[i].
  bool rejection = false;
  SamplingParams rejection_params;
  std::span<const std::vector<double>> draft_probs;
};

struct AcceptDecision {
  int accepted = 0;   // d1..d_accepted are kept
  int32_t next = -1;  // the verifier's token after them: the new pending p
};

// Greedy and seeded: drafts are kept while they equal the target's choice,
// so the output equals full-KV decoding token for token. The caller checks
// that rows holds drafts.size() + 1 rows (and draft_probs one per draft).
AcceptDecision AcceptDrafts(const AcceptInputs& in);

struct FallbackOptions {
  // Fall back when the mean accepted drafts per round over the last `window`
  // rounds drops below `min_accepted` (< 0 disables). Test seam:
  // after_rounds >= 0 forces it once that many rounds were verified.
  int window = 16;
  double min_accepted = 0.05;
  int after_rounds = -1;
};

// Whether drafting still pays for a request, from the accepted counts of its
// verify rounds. Keeps only the last `window` counts (bounded).
class FallbackPolicy {
 public:
  explicit FallbackPolicy(FallbackOptions options) : options_(options) {}
  void RecordRound(int accepted);
  bool ShouldFallBack() const;
  int64_t rounds() const { return rounds_; }

 private:
  FallbackOptions options_;
  std::deque<int> recent_;
  int64_t recent_sum_ = 0;
  int64_t rounds_ = 0;
};

}  // namespace vc
