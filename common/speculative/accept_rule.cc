#include "common/speculative/accept_rule.h"

namespace vc {

AcceptDecision AcceptDrafts(const AcceptInputs& in) {
  const int x = static_cast<int>(in.drafts.size());
  auto row = [&](int r) {
    return in.rows.subspan(static_cast<size_t>(r) * static_cast<size_t>(in.vocab),
                           static_cast<size_t>(in.vocab));
  };
  AcceptDecision out;
  for (; out.accepted < x; ++out.accepted) {
    const int r = out.accepted;
    const int64_t position = in.first_position + r;
    if (in.rejection) {
      bool kept = false;
      const int32_t t = JudgeRejectionDraft(row(r), in.draft_probs[static_cast<size_t>(r)],
                                            in.drafts[static_cast<size_t>(r)], in.rejection_params,
                                            position, &kept);
      if (kept) continue;
      out.next = t;
      return out;
    }
    const int32_t target = in.choose(row(r), position);
    if (target != in.drafts[static_cast<size_t>(r)]) {
      out.next = target;
      return out;
    }
  }
  // Every draft kept: the bonus token comes from the target alone.
  out.next = in.choose(row(x), in.first_position + x);
  return out;
}

void FallbackPolicy::RecordRound(int accepted) {
  ++rounds_;
  if (options_.window <= 0) return;
  recent_.push_back(accepted);
  recent_sum_ += accepted;
  if (static_cast<int>(recent_.size()) > options_.window) {
    recent_sum_ -= recent_.front();
    recent_.pop_front();
  }
}

bool FallbackPolicy::ShouldFallBack() const {
  if (options_.after_rounds >= 0 && rounds_ >= options_.after_rounds) return true;
  if (options_.min_accepted < 0 || options_.window <= 0 ||
      static_cast<int>(recent_.size()) < options_.window) {
    return false;
  }
  return static_cast<double>(recent_sum_) / options_.window < options_.min_accepted;
}

}  // namespace vc
