// Drives a running cluster's coordinator with a set of Generate requests,
// a bounded number in flight, and collects per-request results (tokens,
// TTFT, rounds, acceptance). Shared by `vericache demo`, the cluster
// benchmark and tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/rpc/rpc.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc::local {

struct WorkloadResult {
  std::vector<int32_t> tokens;
  double seconds = 0;  // client-side, Generate to its end
  double ttft_ms = 0;  // coordinator-side (to the first verified token)
  double client_ttft_ms = 0;
  int64_t verify_rounds = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t fallbacks = 0;
  int64_t shared_rounds = 0;              // rounds whose prefix load was shared
  vericache::v1::RoundTimes round_times;  // mode vericache
  std::string error;                      // empty on success
};

// The vericache rounds' wall time and its parts (vericache::v1::RoundTimes)
// summed over the requests that succeeded, and percentiles of the per-round
// control overhead.
struct RoundTimeSummary {
  int64_t rounds = 0;
  double wall_seconds = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  double transfer_seconds = 0;
  double commit_seconds = 0;
  double p50_overhead_ms = 0;
  double p90_overhead_ms = 0;
  // Of the overhead: the coordinator's slot waits, and per round what is
  // left without them (RPCs, hand-offs).
  double slot_wait_seconds = 0;
  double p50_rpc_overhead_ms = 0;

  // The wall time no worker reported as compute or transfer.
  double control_seconds() const {
    return wall_seconds - draft_seconds - verify_seconds - transfer_seconds - commit_seconds;
  }
};

struct WorkloadSummary {
  double wall_seconds = 0;
  int64_t tokens = 0;
  int ok = 0;
  int errors = 0;
  double tokens_per_s = 0;
  double mean_ttft_ms = 0;
  double p50_ttft_ms = 0;
  double p90_ttft_ms = 0;
  double acceptance_rate = 0;   // accepted / drafted
  double tokens_per_round = 0;  // vericache: tokens / verify rounds
  int64_t verify_rounds = 0;
  int64_t shared_rounds = 0;
  RoundTimeSummary round_times;
  std::string first_error;
};

// Runs every request (at most `concurrency` at once) against `coordinator`
// (address, TLS CA and API key: LocalCluster::client()) and fills `results`
// (same order). Each call has `timeout`.
WorkloadSummary RunWorkload(const rpc::ClientConfig& coordinator,
                            const std::vector<vericache::v1::GenerateRequest>& requests,
                            int concurrency, std::vector<WorkloadResult>* results,
                            std::chrono::seconds timeout = std::chrono::seconds(300));

// A prompt of `tokens` tokens the model finds likely (like a shared system
// prompt or document): BOS, a seed token picked by `index`, then the model's
// own greedy continuation.
absl::StatusOr<std::vector<int32_t>> ModelTextPrompt(Engine& engine, int index, int tokens);

// Registers a prefix; returns its id (or the error).
std::string RegisterPrefix(const rpc::ClientConfig& coordinator, const std::vector<int32_t>& tokens,
                           std::string* error);

}  // namespace vc::local
