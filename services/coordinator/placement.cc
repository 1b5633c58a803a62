#include "services/coordinator/placement.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/scheduler/prefix_policy.h"

namespace vc::coordinator {

Placement::Placement(const WorkerHealth* health, std::vector<std::string> verifiers,
                     std::vector<std::string> drafters)
    : health_(health), verifiers_(std::move(verifiers)), drafters_(std::move(drafters)) {}

absl::StatusOr<int> Placement::Verifier(const std::string& prefix_key, uint64_t session) const {
  const std::optional<int> i =
      health_->PickByKey(WorkerPool::kVerifier, PlacementKey(prefix_key, session));
  if (i) return *i;
  std::vector<std::string> down;
  for (size_t v = 0; v < verifiers_.size(); ++v) {
    down.push_back(absl::StrCat(
        verifiers_[v], " (", health_->DownReason(WorkerPool::kVerifier, static_cast<int>(v)), ")"));
  }
  return absl::UnavailableError(absl::StrCat("no live verifier: ", absl::StrJoin(down, ", ")));
}

absl::StatusOr<int> Placement::Drafter(const std::vector<int>& loads) const {
  const std::optional<int> i = health_->PickLeastLoaded(WorkerPool::kDrafter, loads);
  if (i) return *i;
  if (drafters_.empty()) return absl::UnavailableError("no drafter configured");
  return absl::UnavailableError(absl::StrCat("no live drafter: ", drafters_[0], " (",
                                             health_->DownReason(WorkerPool::kDrafter, 0), ")",
                                             drafters_.size() > 1 ? " and the others" : ""));
}

}  // namespace vc::coordinator
