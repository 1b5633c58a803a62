// Discrete-event simulator of a VeriCache deployment with a virtual clock.
// It runs the coordinator's scheduling policy (the RingScheduler and the
// PrefixPolicy of common/scheduler, unchanged) over simulated GPUs and links,
// so the policy can be studied at cluster scale on a machine without GPUs.
//
// Topologies:
//  * long-context: `gpus` GPUs, each drafting and verifying its own requests;
//    compressed KV resident in HBM, full KV swapped in over the GPU's own
//    host link (PCIe) for each verify.
//  * remote-prefix: `drafters` GPUs behind slow links receive only the
//    compressed KV and draft; `verifiers` GPUs on the fast link load the full
//    KV just in time for each verify. The fast link is the store's shared
//    NIC by default (one ring), or one link per verifier.
// Modes: vericache (draft/verify under the ring scheduler, staggered or
// lock-step) and full (the full-KV decoding baseline on the same hardware).
//
// What is simulated, per GPU iteration: one forward pass over every drafting
// request's next token plus every verify that is ready, taking
//   max(bytes read / HBM bandwidth, 2 * params * tokens / FLOP/s) + overhead
// where bytes = weights + each drafter's compressed KV + each verify's full
// KV (full mode: each request's full KV). Links are FIFO servers that move
// one transfer at a time at their bandwidth. The scheduler books each round's
// reload; reloads are issued at the start of their first booked slot, and a
// verify runs in the first iteration after its drafts are done and its full
// KV has landed (the time in between, when the KV lands late, is verify
// stall). Slot ticks are fixed-duration (like the coordinator's --slot-ms).
// Admission (first come, first served) puts a request on the least-loaded
// GPU whose memory holds every admitted request's KV at its largest plus, in
// long-context mode, the full-KV copies in flight: ceil(B*(S+1)/(x+1)), at
// least one (reserving a single copy lets admission starve the reloads).
// Prefix sharing (workload.shared_prefixes > 0): each request's prompt is one
// of that many stored prefixes, and the coordinator's prefix rules apply, run
// by the same PrefixPolicy (common/scheduler/prefix_policy.h): requests over
// a prefix are placed on its verifier (remote-prefix), and with
// prefix_sharing a GPU keeps one resident copy of a prefix's KV (compressed
// on drafters, full in full mode) however many of its requests use it, and a
// staggered round joins its prefix's latest booking on the same verifier when
// that verify is still ahead and no later than the round wants or than a
// booking of its own would get (one reload of the prefix for the pass; each
// joiner moves only its own generated rows, unbooked, and the copy stays until
// the last joiner's verify). A resident copy lowers the memory the GPU's ring
// may book, and admission counts it once.
// KV refresh (remote-prefix, kv_refresh): each round's accepted rows cross
// the drafter's slow link back, booked on that link's ring as the
// coordinator books them (RingScheduler::BookTransfer at their exact size,
// sent at the booking's first slot, released when they land, a started
// transfer keeping its booked time). The drafter commits, and so starts the
// next round, when they land; continuation drafting goes on meanwhile. A
// round that ends its request still sends its rows (as a peer round does)
// but the request does not wait for them.
// Startup fetch (remote-prefix, startup_transfer): what a request on a GPU
// behind a slow link fetches when it starts (a vericache drafter's compressed
// KV; in full mode a drafter's full KV, as full_remote's Open fetches it) is
// booked on the same slow-link ring as the coordinator books the drafter's
// Open (BookedDrafterOpen: BookTransfer at its size, the fetch started at the
// booking's first slot, released when it has landed), so new requests queue
// behind one another and behind the refreshes instead of oversubscribing the
// link. A load over a fast link (a full-mode verifier's, as full_local's
// verifier Open) and a long-context GPU's over its host link are not booked,
// as the coordinator books neither. A prefix already resident on the drafter
// fetches nothing and books nothing (the coordinator, which does not track
// the drafters' caches, books it anyway).
// Not modelled: prefill (the prompt KV is precomputed, as in the paper's
// pipelines), failures; attention still reads a shared prefix once per
// request (no shared-prefix kernel).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::sim {

// A distribution of token counts.
struct Distribution {
  enum class Kind { kFixed, kUniform, kNormal };
  Kind kind = Kind::kFixed;
  double value = 0;  // kFixed
  double min = 0;    // kUniform: inclusive bounds; kNormal: clamp bounds
  double max = 0;
  double mean = 0;  // kNormal
  double stddev = 0;

  static Distribution Fixed(double v) { return {Kind::kFixed, v, v, v, v, 0}; }
  absl::Status Validate(const char* what) const;
  double Mean() const;
  int64_t Sample(std::mt19937_64& rng) const;
};

// Accepted drafts per verify round.
struct AcceptanceModel {
  enum class Kind { kPerToken, kEmpirical };
  Kind kind = Kind::kPerToken;
  // kPerToken: each draft is accepted with probability p, independently,
  // until the first rejection.
  double per_token = 0.98;
  // kEmpirical: accepted drafts observed per round at draft length
  // `empirical_draft_len` (e.g. from `vericache generate --json`). A longer
  // draft resamples for the part past `empirical_draft_len` when a sample
  // accepted all of it; a shorter one truncates.
  std::vector<int> empirical;
  int empirical_draft_len = 0;

  absl::Status Validate() const;
  // Accepted drafts for a round of `drafted` drafts, in [0, drafted].
  int Sample(int drafted, std::mt19937_64& rng) const;
  // Probability that the verifier's bonus token equals the drafter's own next
  // token (what a speculative continuation needs to survive).
  double BonusMatch() const;
  // Mean fraction of `draft_len` drafts accepted.
  double MeanFraction(int draft_len) const;
};

// Reads an acceptance CSV: a header line with an "accepted" column, one row
// per verify round; optional "count" (the row stands for that many rounds)
// and "draft_len" (must be the same on every row) columns.
absl::StatusOr<AcceptanceModel> LoadEmpiricalAcceptance(const std::string& path,
                                                        int draft_len_if_absent);

struct SimConfig {
  enum class Topology { kLongContext, kRemotePrefix };
  enum class Mode { kVeriCache, kFull };
  enum class Schedule { kStaggered, kLockStep };
  enum class Arrival { kPoisson, kClosed };

  Topology topology = Topology::kLongContext;
  Mode mode = Mode::kVeriCache;
  Schedule schedule = Schedule::kStaggered;

  // Hardware, per GPU.
  double hbm_bytes = 0;  // capacity; 0 = unlimited
  double hbm_bytes_per_second = 1e12;
  double flops = 0;                           // 0 = compute is free
  double iteration_overhead_s = 0;            // fixed cost of every forward pass
  double host_link_bytes_per_second = 64e9;   // long-context, per GPU; 0 = unlimited
  double fast_link_bytes_per_second = 40e9;   // remote-prefix; 0 = unlimited
  double slow_link_bytes_per_second = 1.2e9;  // remote-prefix, per drafter; 0 = unlimited
  bool fast_link_shared = true;               // the store's NIC (one ring) vs one link per verifier
  bool slow_link_shared = false;              // one store NIC for all drafters vs one link each
  double rtt_s = 0;                           // drafter <-> verifier round trip (remote-prefix)

  // Model.
  double weight_bytes = 0;
  double params = 0;  // for the FLOP term
  double kv_bytes_per_token = 0;

  // Cluster.
  int gpus = 1;       // long-context
  int drafters = 4;   // remote-prefix
  int verifiers = 1;  // remote-prefix

  // Workload.
  int64_t requests = 100;
  Arrival arrival = Arrival::kClosed;
  double arrival_rate = 1.0;  // requests per second (kPoisson)
  int concurrency = 8;        // requests in the system (kClosed)
  Distribution prompt_tokens = Distribution::Fixed(4096);
  Distribution output_tokens = Distribution::Fixed(256);
  // Generated tokens add to both KV caches (off: KV sizes stay at the prompt's).
  bool grow_kv = true;
  // A new request first loads its KV (compressed in vericache mode, full in
  // full mode) over its link before decoding.
  bool startup_transfer = true;
  int max_batch = 0;  // requests decoding at once per GPU (drafter); 0 = memory decides
  // Prompts drawn from this many stored prefixes (uniformly, each prefix's
  // length drawn once from prompt_tokens); 0 = every request its own prompt.
  int shared_prefixes = 0;
  // With shared_prefixes: requests over one prefix share its resident copy
  // and its reloads (off: the same workload with a copy and a reload each).
  bool prefix_sharing = true;

  // VeriCache.
  double ratio = 0.2;  // compression ratio c
  int draft_len = 25;  // x
  bool continuation = false;
  bool kv_refresh = false;  // remote-prefix: accepted tokens' exact KV back over the slow link
  AcceptanceModel acceptance;

  // Scheduler.
  // 0 = automatic: the booked link's reload time cut into whole slots no
  // longer than the estimated drafting iteration (so even without packing no
  // link time is wasted for reloads of the mean size).
  double slot_seconds = 0;
  int window_slots = 64;
  bool pack_reloads = true;  // RingSchedulerOptions::pack_reloads

  uint64_t seed = 1;
  double max_sim_seconds = 1e7;  // guard against a configuration that never finishes
  int timeseries_max_points = 2000;

  absl::Status Validate() const;
};

// Parses the JSON configuration documented in bench/sim/README.md. Relative
// CSV paths are resolved against `base_dir`.
absl::StatusOr<SimConfig> ParseSimConfig(const std::string& json_text, const std::string& base_dir);

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct LinkReport {
  std::string name;
  double bytes_per_second = 0;
  double bytes = 0;
  double busy_s = 0;
  double utilisation = 0;  // busy_s / makespan
  int64_t transfers = 0;
  double booked_peak_slot_s = 0;  // scheduler: peak seconds booked in one slot (0 if not booked)
  double overrun_s = 0;           // scheduler: seconds booked beyond the slot duration
  double unbooked_s = 0;          // busy seconds of transfers no scheduler ring booked
};

struct GpuReport {
  std::string name;
  std::string role;  // "long-context", "drafter", "verifier", "full"
  int64_t iterations = 0;
  double busy_s = 0;
  double mean_iteration_s = 0;
  double peak_hbm_bytes = 0;        // weights + resident + transient, largest seen
  double peak_transient_bytes = 0;  // full KV of verifies in flight, largest seen
  double peak_resident_bytes = 0;
  double idle_with_work_s = 0;  // requests assigned but nothing runnable
};

struct TimeSample {
  double t = 0;
  int active = 0;                       // requests admitted and not finished
  int waiting = 0;                      // arrived, not admitted yet
  std::vector<double> link_busy;        // per link: fraction of the interval transferring
  std::vector<double> link_booked;      // per scheduler link: booked seconds / slot seconds
  std::vector<double> memory_booked;    // per scheduler GPU: booked bytes / transient capacity
  std::vector<double> hbm_used;         // per GPU: bytes in use / capacity (0 if unlimited)
  std::vector<double> transient_bytes;  // per GPU: full-KV copies resident (bytes)
};

struct SimResult {
  double makespan_s = 0;
  int64_t requests = 0;
  int64_t output_tokens = 0;
  double tokens_per_s = 0;
  double requests_per_s = 0;
  Percentiles ttft_s, tpot_s, latency_s;
  // Request-seconds spent with all drafts done but the full KV not landed,
  // and with a round waiting for the scheduler to book it.
  double verify_stall_s = 0;
  double booking_wait_s = 0;
  int64_t verifies = 0;
  double mean_accepted = 0;     // accepted drafts per round
  double tokens_per_round = 0;  // accepted + 1 (before the output-length cap)
  int64_t drafted_tokens = 0;
  int64_t wasted_drafts = 0;
  int64_t continuation_kept = 0;  // continuation drafts that survived
  double mean_iteration_s = 0;    // over the drafting (or decoding) GPUs
  double slot_seconds = 0;
  // Lock-step: rounds (barrier releases) and link seconds moved per round.
  int64_t lock_step_rounds = 0;
  double link_seconds_per_round = 0;
  // Scheduler.
  int64_t admitted = 0;
  int64_t queued = 0;
  int64_t beyond_window = 0;
  int64_t max_offset = 0;
  int64_t memory_deferred = 0;  // reload starts held back because the GPU's memory was full
  int64_t peak_memory_booked_bytes = 0;  // largest bytes the ring booked on one GPU in one slot
  // Bytes moved: startup loads of admitted requests, and the reloads of the
  // verifies (a joined round moves only its own rows).
  double startup_bytes = 0;
  double reload_bytes = 0;
  // KV refresh: bytes sent back to the drafters, and request-seconds from a
  // round's result to its rows landing (the booked slot's wait included).
  double refresh_bytes = 0;
  double refresh_wait_s = 0;
  // Startup fetches booked on a slow-link ring: request-seconds from
  // admission to the booking's first slot, when the fetch is sent.
  double startup_wait_s = 0;
  // Prefix sharing: rounds that joined another's booking, and admissions that
  // found their prefix already resident on their GPU.
  int64_t shared_joins = 0;
  int64_t shared_resident = 0;
  std::vector<LinkReport> links;
  std::vector<GpuReport> gpus;
  std::vector<TimeSample> timeseries;
  std::vector<std::string> scheduler_links;  // names, index = TimeSample::link_booked
  std::vector<std::string> scheduler_gpus;   // names, index = TimeSample::memory_booked
};

absl::StatusOr<SimResult> Simulate(const SimConfig& config);

// One JSON object (without the time series), and the time series as CSV.
std::string ResultToJson(const SimConfig& config, const SimResult& result);
std::string TimeseriesCsv(const SimResult& result);

}  // namespace vc::sim
