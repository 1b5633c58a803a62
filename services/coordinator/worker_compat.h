// What every worker of one coordinator must share with the first one it met:
// the model (its weights' id), the numerics definition (docs/numerics.md),
// the end-of-sequence ids and the separate draft model (--draft-model; the
// drafters draft with it, the verifiers make its variants at ingest). A
// worker that differs in any of them would make KV, logits or the stopping
// point depend on placement, so the coordinator refuses it at start and does
// not take it back after a restart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vericache/v1/worker.pb.h"

namespace vc::coordinator {

struct WorkerModel {
  std::string model_id;  // raw bytes, as the worker reports them
  uint32_t numerics_version = 0;
  std::vector<int32_t> eos_ids;
  std::string draft_model_id;  // raw; empty: the drafters run the target
  // The shape the coordinator takes from the first worker and computes
  // with (request bounds, KV byte budgets): checked against bounds, since
  // it comes from a peer, and the same for every worker.
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  int64_t kv_bytes_per_token = 0;
};

// The most KV bytes per token a worker may report: 1 GiB, thousands of times
// a 405B-parameter model's, and small enough that any count of tokens in a
// context (an int32) times it fits an int64.
inline constexpr int64_t kMaxWorkerKvBytesPerToken = int64_t{1} << 30;

// From a worker's Info answer (eos_ids, or {eos_id} from a worker that
// predates the list).
WorkerModel WorkerModelOf(const ::vericache::v1::WorkerInfoResponse& info);

// OK if `worker` may serve beside `expected`; otherwise FailedPrecondition
// naming `address` and what is wrong: a shape out of bounds (vocabulary and
// context of at least one token, 1..kMaxWorkerKvBytesPerToken bytes of KV
// per token), or the first difference (model, numerics, shape, stop ids,
// draft model). A drafter of another draft model would fetch variants made
// for it that do not exist, or KV of a model it does not run.
absl::Status CheckSameModel(const WorkerModel& expected, const WorkerModel& worker,
                            const std::string& address);

}  // namespace vc::coordinator
