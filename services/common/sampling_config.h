// The wire's SamplingConfig (proto/vericache/v1/worker.proto) as the
// sessions' SessionSampling: one conversion and one validation for every
// daemon that accepts it (the coordinator checks a request with it before any
// session opens; the workers check what the coordinator sends).
#pragma once

#include "absl/status/statusor.h"
#include "common/cluster/remote_session.h"
#include "vericache/v1/worker.pb.h"

namespace vc::daemon {

// Greedy, seeded or rejection; InvalidArgument for an unknown mode or bad
// parameters (top_p 0 on the wire means 1: no nucleus filter).
absl::StatusOr<cluster::SessionSampling> ToSessionSampling(const vericache::v1::SamplingConfig& s);

}  // namespace vc::daemon
