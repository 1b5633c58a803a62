// Where a request runs: the one placement rule of the coordinator, used for
// a Generate's workers, for the ingest of its prefix and for RegisterPrefix,
// so a prefix is ingested on the verifier its requests will meet on. The
// verifier is picked by the request's prefix (rendezvous hashing over the
// live verifiers, common/scheduler/prefix_policy.h; a prompt without a stored
// prefix by its session), the drafter as the least loaded live one. Workers
// marked down (worker_health.h) are skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/coordinator/worker_health.h"

namespace vc::coordinator {

class Placement {
 public:
  // `health` must outlive this; the address lists name the pools' workers
  // in index order (for the errors).
  Placement(const WorkerHealth* health, std::vector<std::string> verifiers,
            std::vector<std::string> drafters);

  // The verifier for a prefix (its last chunk key in hex; "" for a prompt
  // without a stored prefix, then `session` decides). UNAVAILABLE, naming
  // every verifier and why it is down, when none is live.
  absl::StatusOr<int> Verifier(const std::string& prefix_key, uint64_t session = 0) const;
  // The live drafter with the smallest of `loads` (one per drafter, lowest
  // index on ties); UNAVAILABLE when none is live.
  absl::StatusOr<int> Drafter(const std::vector<int>& loads) const;

 private:
  const WorkerHealth* health_;
  std::vector<std::string> verifiers_;
  std::vector<std::string> drafters_;
};

}  // namespace vc::coordinator
