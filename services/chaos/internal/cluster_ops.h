// What chaos and soak share: killing, restarting and pausing a LocalCluster's
// daemons, the idle check after a run, RSS sampling, and the mixed workload
// with its full-KV reference.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/model/model.h"
#include "services/chaos/chaos.h"
#include "services/local/local_cluster.h"
#include "vericache/v1/coordinator.grpc.pb.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc::chaos::internal {

// Kill -9, restart on the same addresses (LocalCluster::Kill / Restart),
// SIGSTOP/SIGCONT; resumes whatever it paused when destroyed.
class DaemonControl {
 public:
  explicit DaemonControl(local::LocalCluster* cluster);
  ~DaemonControl();

  pid_t Pid(const std::string& name) const;
  absl::Status Kill(const std::string& name);
  absl::Status Restart(const std::string& name);
  absl::Status Pause(const std::string& name);
  absl::Status Resume(const std::string& name);

 private:
  local::LocalCluster* cluster_;
  mutable std::mutex mu_;
  std::map<std::string, pid_t> paused_;
};

// Every daemon's in-flight state after a run: worker sessions and KV bytes
// (Info RPC and /metrics), store open puts and staged bytes (Stat), the
// coordinator's active and queued requests (ClusterStatus and /metrics).
struct IdleState {
  bool idle = false;
  std::string detail;  // what is still held, by whom; or the RPC error
};
IdleState CheckIdle(const local::LocalCluster& cluster);
// Polls CheckIdle until idle or `timeout`; returns the last state.
IdleState WaitIdle(const local::LocalCluster& cluster, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds poll = std::chrono::milliseconds(100));
// Worker sessions and KV bytes only (Info RPC on channels kept open, so a
// poll costs no handshake): the cancel probes' "freed".
class WorkerProbe {
 public:
  explicit WorkerProbe(const local::LocalCluster& cluster);
  bool Idle();

 private:
  std::vector<std::unique_ptr<vericache::v1::Verifier::Stub>> verifiers_;
  std::vector<std::unique_ptr<vericache::v1::Drafter::Stub>> drafters_;
  std::vector<rpc::ClientConfig> verifier_cfg_, drafter_cfg_;
};

// VmRSS of `pid` in MiB, and its threads, from /proc/<pid>/status.
absl::StatusOr<double> RssMiB(pid_t pid);
absl::StatusOr<int> ThreadCount(pid_t pid);

// One request of the mix and how to check it.
struct RequestSpec {
  vericache::v1::GenerateRequest request;
  std::vector<int32_t> prompt;  // the effective prompt (prefix + suffix)
  bool exact = true;            // token-identical to full KV (not rejection in vericache)
  bool cancel = false;
  bool cancel_by_rpc = false;  // Coordinator.Cancel (else the client drops the stream)
  // Where in the request's life the client cancels: once this share of its
  // expected tokens (MixedWorkload::ExpectedTokens) has streamed, so the
  // cancel lands while the request runs, not after it ended. A point below
  // the first token cancels cancel_after_ms after the stream opened.
  double cancel_point = 0;  // [0, 1)
  int cancel_after_ms = 0;
  std::string shape;  // prompt, length, sampling: the reference cache key
};

struct Outcome {
  grpc::Status status;
  std::vector<int32_t> streamed;  // tokens streamed before the end
  std::vector<int32_t> tokens;    // final totals (OK only)
  double client_ttft_ms = -1;     // to the first streamed token
  double seconds = 0;
  bool cancelled = false;            // the client cancelled it (before the stream ended)
  int64_t cancel_after_tokens = -1;  // tokens streamed when the cancel was sent
  double cancel_to_end_ms = -1;
  std::chrono::steady_clock::time_point cancel_at{};  // when the cancel was sent
};

// The mix: modes vericache / full_remote / full_local, compressors int8,
// kivi, snapkv, streamingllm, greedy / seeded / rejection sampling, shared
// prefixes (registered, or the same leading tokens) and distinct prompts,
// client cancels. Request i is a function of (seed, i) only.
class MixedWorkload {
 public:
  static absl::StatusOr<std::unique_ptr<MixedWorkload>> Create(const ClusterSetup& setup,
                                                               uint64_t seed);
  // Registers the shared prefixes with the cluster (after it started).
  absl::Status RegisterPrefixes(const local::LocalCluster& cluster);
  RequestSpec Draw(int64_t index) const;
  // Runs one request against the coordinator (cancelling it if the spec says).
  Outcome Run(const RequestSpec& spec, const rpc::ClientConfig& coordinator,
              vericache::v1::Coordinator::Stub* stub);
  // How many tokens the request should stream: the length of its full-KV
  // reference (for rejection sampling in vericache mode, of seeded sampling
  // with its seed: a guess, its length may differ).
  int64_t ExpectedTokens(const RequestSpec& spec);
  // "" if the outcome's tokens agree with full-KV decoding (the streamed
  // prefix for failed or cancelled requests), else what differs.
  std::string Check(const RequestSpec& spec, const Outcome& outcome);
  // Ingest variants the cluster should make (matches the compressors drawn).
  static const char* IngestVariants();
  const ClusterSetup& setup() const { return setup_; }

 private:
  MixedWorkload() = default;
  // Full-KV decoding of the spec's prompt and sampling (cached by shape).
  absl::StatusOr<std::vector<int32_t>> Reference(const RequestSpec& spec);
  ClusterSetup setup_;
  uint64_t seed_ = 0;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::mutex engine_mu_;
  std::map<std::string, std::vector<int32_t>> references_;  // shape -> tokens
  std::vector<std::vector<int32_t>> prefixes_;
  std::vector<std::string> prefix_ids_;  // "" until registered
};

// `seed`, or a fresh one when 0.
uint64_t PickSeed(uint64_t seed);
// Starts the cluster the mix needs (32-token chunks, its ingest variants);
// fills *log_dir with a temporary dir when empty.
absl::StatusOr<std::unique_ptr<local::LocalCluster>> StartCluster(const ClusterSetup& setup,
                                                                  std::string* log_dir,
                                                                  std::ostream& log);

// What the daemons' logs in `log_dir` (one <name>.log per daemon, kept
// across restarts) say about crashes: one "<file>: <line>" per report of a
// fatal signal (the daemons' crash reporter), a sanitizer (ASan, UBSan,
// TSan), a failed assertion or std::terminate. A kill -9 of the fault
// schedule leaves no such line; a daemon that crashed on its own does, even
// when its supervisor restarted it and every request still came out right.
// At most 100.
std::vector<std::string> CrashReports(const std::string& log_dir);

std::string CodeName(grpc::StatusCode code);
double Percentile(std::vector<double> v, double p);

}  // namespace vc::chaos::internal
