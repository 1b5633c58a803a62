// Cluster chaos and soak runs (issue 13, items 3 and 4): start a LocalCluster,
// drive it with a mixed workload while a seeded fault schedule kill -9s,
// restarts and pauses its daemons, check every completed request against
// single-process full-KV decoding, every failure for a clean status, and that
// every daemon's sessions and KV bytes return to zero afterwards. The soak
// runs a fixed request rate instead and reports RSS slopes, per-window
// TTFT/throughput and cancel-to-freed latency. Used by `vericache chaos` and
// `vericache soak`; the library is here so tests can call it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"

namespace vc::chaos {

// Options both runs share: the cluster and the workload mix.
struct ClusterSetup {
  std::string model;    // required: llama2.c .bin or HF dir
  std::string bin_dir;  // daemon binaries ("" = beside the running executable)
  bool insecure = false;
  int verifiers = 2;
  int drafters = 2;
  std::string log_dir;  // daemon stderr; "" = a temporary dir, kept on failure
  int concurrency = 8;  // requests in flight at most
  int max_new_tokens = 32;
  double cancel_fraction = 0.1;  // share of requests the client cancels
  // Wait for requests to drain and daemons to report idle after the run.
  double drain_seconds = 60;
  // Workers' --session-idle-seconds: the backstop that frees a session whose
  // Release never arrived (the coordinator's Release is best effort, 2 s; a
  // worker paused longer keeps the session until this). Below
  // drain_seconds, so the idle check covers it.
  int session_idle_seconds = 20;
  // The store's --put-lease-seconds, for the same reason: a put whose writer
  // was killed mid-ingest stays open (staged bytes held) until its lease
  // ends, 120 s by default.
  int put_lease_seconds = 20;
  int64_t request_timeout_seconds = 120;  // gRPC deadline of each Generate
  // A cancel that landed mid-request must end its stream within this; a
  // slower one is a violation (a hang, not a fault: a paused worker holds
  // a call for at most the coordinator's --rpc-timeout-ms, 10 s).
  double max_cancel_seconds = 30;
};

// Client cancels and where they landed. Each is sent at a point drawn
// inside the request's expected life (after a share of its expected tokens
// streamed); it landed mid-request when the request then ended CANCELLED,
// after the end when the request had completed first (OK), and "other"
// when it ended with another status (a fault).
struct CancelTally {
  int64_t sent = 0;
  int64_t mid_request = 0;
  int64_t after_end = 0;
  int64_t other = 0;
  // Mid-request cancels whose stream took longer than the bound to end.
  int64_t slow = 0;
  std::vector<double> to_end_ms;  // cancel sent -> stream ended (mid-request)
  void Add(grpc::StatusCode code, double cancel_to_end_ms, double bound_ms);
};
// "cancels=N (mid-request M, after the end A, other O, slow S)
// p50/p99/max_cancel_to_end_ms=a/b/c".
std::string CancelSummary(const CancelTally& t);

struct ChaosOptions {
  ClusterSetup setup;
  uint64_t seed = 0;       // 0: drawn from the clock (printed either way)
  double duration_s = 90;  // how long faults and requests run
  int max_faults = 100;    // bounds: the run stops at duration or either bound
  int max_requests = 2000;
  double mean_fault_gap_s = 2.5;  // mean pause between two faults
  // A run that injected fewer faults or finished fewer requests than these
  // fails (so a smoke that silently stopped faulting cannot pass).
  int min_faults = 0;
  int min_requests = 0;
  // Also cut and throttle the links of the store and the workers
  // (internal/link_faults.h: the run gets a network namespace of its own;
  // needs root, ip and tc). Off: the schedule of a seed is the same as
  // before link faults existed.
  bool link_faults = false;
  std::string throttle_rate = "1mbit";  // tc rate of a throttled link
};

// kCutLink / kThrottleLink only with ChaosOptions::link_faults.
enum class FaultType { kKillDrafter, kKillVerifier, kKillStore, kPause, kCutLink, kThrottleLink };
const char* FaultName(FaultType t);

struct Fault {
  double at_s = 0;  // start, seconds after the workload starts
  FaultType type = FaultType::kPause;
  std::string target;  // daemon name ("drafter-1", "kvstore", ...)
  double down_s = 0;   // how long it stays dead, paused or cut
};

// The schedule is a pure function of (seed, options, daemon names): the same
// seed replays the same faults. Faults are sequential (one at a time).
std::vector<Fault> DrawFaultSchedule(uint64_t seed, const ChaosOptions& options,
                                     const std::vector<std::string>& daemons);

// Whether a failed request failed cleanly: a code that a valid request may
// legitimately get under faults (never UNKNOWN, never an input error such as
// INVALID_ARGUMENT for a request that was valid) and a non-empty message.
bool IsCleanFailure(const grpc::Status& status);

struct ChaosReport {
  uint64_t seed = 0;
  int64_t requests = 0;
  int64_t completed = 0;      // OK, tokens compared
  int64_t exact_checked = 0;  // of completed: compared token for token
  int64_t failed = 0;         // non-OK, not cancelled by us
  CancelTally cancels;        // cancelled by the client
  int64_t wrong_tokens = 0;   // requests whose tokens (or streamed prefix) differ
  int64_t unclean_failures = 0;
  std::map<std::string, int64_t> failures_by_code;
  std::map<std::string, int64_t> faults_by_type;
  int64_t faults = 0;
  // Failed requests that started at least 3 s after the last fault ended
  // (restart done), with no fault active: a healthy cluster should serve
  // them all. Reported, not (yet) a violation: the coordinator's worker
  // health tracking is what makes it zero.
  int64_t after_recovery = 0;  // requests that qualified (any outcome)
  int64_t failed_after_recovery = 0;
  int64_t fault_errors = 0;  // a fault that could not be applied or undone (a restart failed)
  std::string leaks;         // "" = every daemon idle after the drain
  // Crash reports in the daemons' logs (internal::CrashReports), whatever
  // the requests saw.
  std::vector<std::string> crashes;
  std::vector<std::string> problems;  // first few examples of each violation
  double wall_seconds = 0;
  bool below_minimum = false;  // fewer faults or requests than asked for
  bool ok() const {
    return wrong_tokens == 0 && unclean_failures == 0 && fault_errors == 0 && leaks.empty() &&
           crashes.empty() && !below_minimum && cancels.slow == 0;
  }
};
std::string SummaryLine(const ChaosReport& r);

namespace internal {
class LinkFaults;
}

// The network namespace of a --link-faults run, its loopback shaped with tc.
// unshare moves only the calling thread (threads it starts later follow it;
// threads started before stay outside), so it is entered while the process
// runs one thread: `vericache chaos` enters it before it starts its
// stop-signal thread and lends it to RunChaos.
class LinkFaultNamespace {
 public:
  // FailedPrecondition without root, ip or tc, or once a second thread runs.
  static absl::StatusOr<std::unique_ptr<LinkFaultNamespace>> Enter();
  ~LinkFaultNamespace();
  LinkFaultNamespace(const LinkFaultNamespace&) = delete;
  LinkFaultNamespace& operator=(const LinkFaultNamespace&) = delete;

  internal::LinkFaults& links() { return *links_; }

 private:
  explicit LinkFaultNamespace(std::unique_ptr<internal::LinkFaults> links);
  std::unique_ptr<internal::LinkFaults> links_;
};

// Runs the whole thing; progress lines go to `log`. An error status only for
// setup problems (no model, a daemon that never started); violations are in
// the report. With options.link_faults the cluster runs in `links`, which
// the caller entered first and keeps until RunChaos returns
// (FailedPrecondition without it).
absl::StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, std::ostream& log,
                                     LinkFaultNamespace* links = nullptr);

struct SoakOptions {
  ClusterSetup setup;
  uint64_t seed = 0;
  double duration_s = 60;
  double rate = 4;            // requests started per second (open loop)
  double window_s = 10;       // TTFT and tokens/s reported per window
  double rss_interval_s = 2;  // RSS sampling period
  double warmup_s = 10;       // RSS samples before this are not in the slope
  int64_t cancels = 100;      // random cancels spread over the run
  int cancel_probes = 20;     // serial cancel-to-freed measurements after the run
  // Fail when a daemon's RSS slope exceeds this (MiB per 10 min; 0 = no
  // limit). Not applied to the store, whose DRAM tier fills up to its
  // budget by design as prompts are ingested.
  double max_rss_slope = 0;
};

struct SoakWindow {
  double start_s = 0;
  int64_t requests = 0;
  double p50_ttft_ms = 0;
  double p99_ttft_ms = 0;
  double tokens_per_s = 0;
};

struct SoakReport {
  uint64_t seed = 0;
  double duration_s = 0;
  int64_t requests = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  CancelTally cancels;
  int64_t wrong_tokens = 0;
  int64_t dropped = 0;  // ticks skipped because `concurrency` were in flight
  std::vector<SoakWindow> windows;
  // MiB per 10 minutes, least squares over the samples after the warm-up.
  std::map<std::string, double> rss_slope_mib_per_10min;
  std::map<std::string, double> rss_last_mib;
  // The most threads each daemon had in one sample (a daemon whose threads
  // grow with its load or its age shows here).
  std::map<std::string, int> threads_max;
  double p50_cancel_to_freed_ms = 0;  // probes: Cancel -> every worker idle
  double p99_cancel_to_freed_ms = 0;
  int cancel_probes = 0;
  std::string leaks;
  std::vector<std::string> crashes;  // as ChaosReport's
  std::vector<std::string> problems;
  bool ok() const {
    return wrong_tokens == 0 && leaks.empty() && crashes.empty() && problems.empty() &&
           cancels.slow == 0;
  }
};
std::string SummaryLine(const SoakReport& r);

absl::StatusOr<SoakReport> RunSoak(const SoakOptions& options, std::ostream& log);

// Least-squares slope of y over x (0 with fewer than two distinct x).
double LeastSquaresSlope(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace vc::chaos
