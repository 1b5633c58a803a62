// Long-context decoding on one node (DESIGN.md sections 1 and 6): many
// concurrent requests, continuously batched on one Engine, under a device
// memory budget.
//
// VeriCache mode: each request's compressed KV stays resident in the device
// KvArena (budgeted); its full KV lives in a host-tier KvArena. Before each
// verify, the copy engine (a worker thread with a bounded queue, paced to the
// host-to-device link's bandwidth) copies the request's full KV into the
// device arena and StageVerifyKv hands the copy to the request, whose verify
// pass then reads only that copy (RequestOptions.staged_verify); accepted
// rows are written back to the host copy and the device copy is freed.
// A RingScheduler decides when each reload starts and in which iteration the
// verify runs: staggered (the default: reloads spread so each hides behind
// other requests' drafting) or lock-step (the ablation: every request drafts
// and verifies on the same rounds; reloads pile up on the link). Admission
// respects the scheduler's memory ring, and every reload is also checked
// against the device budget before it is issued, so the device arena never
// refuses a reservation.
//
// One iteration (Step) = one slot of the scheduler: admit and prefill new
// requests, book rounds, start the reloads whose span begins now, collect
// landed copies, then ONE Engine::Forward with every drafting request's next
// step plus the verifies whose copy has landed (a request whose copy has not
// landed stalls; its waiting time is counted), re-admit the requests whose
// verify finished, and slide the window. T_slot is calibrated from measured
// iteration times (EWMA). Only this thread calls Engine::Forward; the copy
// thread only copies memory.
//
// Baselines in the same runtime: kFull (full-KV decoding: the full KV is
// resident in the device arena, so only as many requests run at once as
// their full KV fits; the others wait) and kLossy (compressed KV only, no
// verification: NOT lossless, a benchmark baseline).
//
// Prefill (and the compression right after it) is timed separately and is
// not part of decode_seconds in any mode.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/kv/kv_arena.h"
#include "common/longctx/copy_engine.h"
#include "common/scheduler/ring_scheduler.h"
#include "common/speculative/draft_verify.h"

namespace vc {

struct LongContextOptions {
  enum class Schedule { kStaggered, kLockStep };
  DecodeMode mode = DecodeMode::kVeriCache;
  Schedule schedule = Schedule::kStaggered;
  // Template for every request: max_new_tokens, ignore_eos, sampling,
  // compressor, draft options. The runtime sets mode, staged_verify and the
  // arenas, and disables fallback to full decoding (which would decode
  // against the host-tier KV).
  RequestOptions request;
  int64_t device_budget_bytes = 0;     // the device arena; <= 0: unlimited
  int64_t host_budget_bytes = 0;       // the host tier; <= 0: unlimited
  CopyEngineOptions copy;              // link pacing (default: unlimited) and queue depth
  int window_slots = 256;              // the scheduler's lookahead W
  double initial_slot_seconds = 0.01;  // T_slot until iterations have been measured
  double slot_ewma_weight = 0.2;       // weight of the newest iteration time
  // Reloads not started yet are booked again when T_slot has drifted by more
  // than this fraction since they were booked (<= 0: never).
  double rebook_drift = 0.25;
  int max_active = 0;         // cap on requests decoding at once; 0: budget decides
  bool record_trace = false;  // keep one IterationRecord per iteration

  absl::Status Validate() const;
};

// Device bytes a request needs: the compressed KV kept resident while it
// decodes (compressed prompt + exact tail of generated tokens, in whole
// blocks) and its full KV at the end of generation (in whole blocks).
struct KvFootprint {
  int64_t compressed_resident_bytes = 0;
  int64_t full_kv_bytes = 0;
  int64_t compressed_prefix_bytes = 0;
  double compression_ratio = 1.0;
};
// Measures it by prefilling and compressing `prompt` once (uses the engine).
absl::StatusOr<KvFootprint> MeasureKvFootprint(Engine& engine, const std::vector<int32_t>& prompt,
                                               const RequestOptions& request);

struct LongContextStats {
  int64_t submitted = 0;
  int64_t finished = 0;
  int64_t generated_tokens = 0;
  int64_t iterations = 0;       // Steps that ran a forward pass
  int64_t idle_iterations = 0;  // Steps with nothing to run (waiting for copies)
  int64_t forward_calls = 0;
  int64_t verifies = 0;
  int64_t late_verifies = 0;      // verifies that ran after their booked slot
  int64_t late_verify_slots = 0;  // by how many slots, summed
  int64_t rebooks = 0;            // iterations that re-booked reloads after T_slot drifted
  int64_t reloads = 0;            // full-KV copies issued
  int64_t reload_bytes = 0;
  int64_t copy_queue_full = 0;    // Submit refused by the bounded queue (retried)
  int64_t memory_deferred = 0;    // reload starts held back by the device budget check
  int64_t admissions_queued = 0;  // scheduler answered "queued" (retried next slot)
  int max_active = 0;
  double prefill_seconds = 0;  // prefill passes + compression (not in decode_seconds)
  double decode_seconds = 0;   // wall time of all Steps minus prefill
  double forward_seconds = 0;  // inside Engine::Forward (decode only)
  // Copy stalls: the loop waited with nothing to run (engine idle), and the
  // sum over requests of the time they were ready to verify but their full
  // KV had not landed.
  double engine_idle_seconds = 0;
  double request_stall_seconds = 0;
  double barrier_seconds = 0;  // lock-step: request time waiting for the others' verifies
  double slot_seconds = 0;     // T_slot now
  // Attention reads of the host-tier full KV during decoding, summed over
  // requests: must stay 0 in VeriCache mode (verify reads the arena copy).
  int64_t host_kv_bytes_read_in_decode = 0;
  int64_t device_budget = 0;
  int64_t device_high_water = 0;
  double link_overrun_seconds = 0;  // scheduler: booked beyond the link's slot (lock-step)
};

// One decode iteration, for plots.
struct IterationRecord {
  int64_t slot = 0;
  double start = 0;    // seconds since the runtime was created
  double seconds = 0;  // wall time of the iteration (a forward pass or an idle wait)
  int drafting = 0;    // requests in the pass: draft or decode steps
  int verifying = 0;   // verifies in the pass
  int stalled = 0;     // ready to verify, full KV not landed
  int copies_in_flight = 0;
  int64_t device_in_use = 0;
};

class LongContextRuntime {
 public:
  // `engine` must outlive the runtime, and nothing else may call
  // engine.Forward while Step/Run runs.
  static absl::StatusOr<std::unique_ptr<LongContextRuntime>> Create(
      Engine& engine, const LongContextOptions& options);
  // Cancels copies in flight (without waiting for the link) and frees
  // everything; safe mid-run.
  ~LongContextRuntime();
  LongContextRuntime(const LongContextRuntime&) = delete;
  LongContextRuntime& operator=(const LongContextRuntime&) = delete;

  // Queues a request; returns its id (0, 1, ...). It is admitted when the
  // device budget allows.
  absl::StatusOr<int> Submit(std::vector<int32_t> prompt);

  // One iteration (see the header comment).
  absl::Status Step();
  // Steps until every submitted request has finished, or Stop() was called
  // (then Cancelled).
  absl::Status Run();
  // Thread-safe; Run returns at the next iteration boundary.
  void Stop() { stop_.store(true); }
  bool done() const;

  int num_requests() const { return static_cast<int>(entries_.size()); }
  const SpeculativeRequest& request(int id) const;
  const std::vector<int32_t>& output(int id) const { return request(id).output(); }

  LongContextStats stats() const;
  CopyEngineStats copy_stats() const;
  const std::vector<IterationRecord>& trace() const { return trace_; }
  const KvArena& device_arena() const { return *device_; }
  const KvArena& host_arena() const { return *host_; }
  // The ring scheduler (VeriCache mode only; null for the baselines).
  const RingScheduler* scheduler() const { return scheduler_.get(); }
  const LongContextOptions& options() const { return options_; }

 private:
  struct Entry;
  LongContextRuntime(Engine& engine, const LongContextOptions& options);
  double Now() const;
  bool vericache() const { return options_.mode == DecodeMode::kVeriCache; }
  int64_t BlockBytes() const;
  int64_t Blocks(int64_t tokens) const;
  int64_t UpperResident(const Entry& e) const;
  int64_t FullKvMax(const Entry& e) const;
  absl::Status AdmitWaiting(double* prefill_seconds);
  absl::Status Prefill(const std::vector<Entry*>& batch);
  void StartRound(Entry& e);
  void ReleaseBarrierIfComplete();
  absl::Status BookRounds(bool after_forward);
  absl::Status RebookOnDrift();
  void IssueReloads();
  absl::Status CollectCopies(std::vector<CopyResult> results);
  absl::Status Finish(Entry& e);
  absl::Status UpdateMemoryRing();

  Engine& engine_;
  const LongContextOptions options_;
  const std::chrono::steady_clock::time_point epoch_;
  std::unique_ptr<KvArena> device_;
  std::unique_ptr<KvArena> host_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::deque<Entry*> waiting_;  // submitted, not admitted yet (FIFO)
  std::deque<Entry*> to_book_;  // rounds waiting for a booking (FIFO)
  std::unique_ptr<RingScheduler> scheduler_;
  std::unique_ptr<CopyEngine> copy_;  // destroyed first: its jobs point into entries_
  std::map<int64_t, int64_t>
      prefix_bytes_by_len_;      // compressed prefix bytes seen per prompt length
  int64_t resident_total_ = 0;   // device bytes committed to resident KV
  int64_t transient_total_ = 0;  // device bytes committed to issued reloads
  int active_ = 0;
  double slot_seconds_;
  std::atomic<bool> stop_{false};
  LongContextStats stats_;
  std::vector<IterationRecord> trace_;
  std::vector<float> logits_;
};

}  // namespace vc
