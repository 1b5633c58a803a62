// The asynchronous host-to-device copy engine of the single-node
// long-context runtime: one worker thread that copies a request's full KV
// (a host-tier PagedKvCache) into a new PagedKvCache charged to the device
// KvArena, paced to a configured link bandwidth by a token bucket, so that
// reloads overlap with the forward passes of other requests.
//
// The worker only copies memory: it never touches the Engine (which is not
// thread-safe) and never reads a cache through attention, so the host KV's
// bytes_read() counter is not moved by a copy. Jobs wait in a bounded FIFO
// queue; Submit fails with ResourceExhausted when it is full. Destroying the
// engine (or Shutdown) cancels queued jobs, interrupts a paced copy and
// joins the worker without waiting for the link.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/kv_cache.h"
#include "common/kv/kv_arena.h"
#include "common/model/model.h"

namespace vc {

// A token bucket on an explicit clock (seconds), so it can be tested without
// sleeping: tokens (bytes) refill at `rate` up to `burst`.
class TokenBucket {
 public:
  // rate <= 0: unlimited.
  TokenBucket(double rate, double burst);
  // Takes up to `want` tokens at time `now`; returns how many were taken.
  double Take(double want, double now);
  // Seconds from `now` until min(want, burst) tokens are available.
  double WaitTime(double want, double now) const;
  double rate() const { return rate_; }
  double burst() const { return burst_; }

 private:
  void Refill(double now);
  double rate_, burst_;
  double tokens_;
  double last_ = -1;
};

struct CopyEngineOptions {
  double bytes_per_second = 0;      // link bandwidth; <= 0: unlimited
  int64_t burst_bytes = 64 * 1024;  // token bucket depth
  int queue_depth = 8;              // jobs waiting behind the one in progress
  int block_tokens = 16;            // block size of the device copies
};

struct CopyJob {
  int64_t id = 0;
  // Must stay alive and unmodified until this job's result is collected (or
  // the engine is destroyed).
  const PagedKvCache* source = nullptr;
  // Where the copy is charged (the device arena); must outlive the engine.
  KvArena* arena = nullptr;
  const ModelConfig* config = nullptr;
};

struct CopyResult {
  int64_t id = 0;
  absl::StatusOr<std::unique_ptr<PagedKvCache>> copy;
  int64_t bytes = 0;
  double submit_time = 0;  // seconds since the engine started
  double start_time = 0;   // the worker picked it up
  double done_time = 0;    // landed (the link has delivered every byte)
};

struct CopyEngineStats {
  int64_t submitted = 0;
  int64_t rejected = 0;   // Submit calls refused because the queue was full
  int64_t completed = 0;  // successful copies
  int64_t failed = 0;     // e.g. the device arena was full
  int64_t bytes = 0;
  double busy_seconds = 0;  // start..done summed over jobs (the link's busy time)
  int max_queued = 0;
};

class CopyEngine {
 public:
  explicit CopyEngine(const CopyEngineOptions& options);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Queues a copy. ResourceExhausted when queue_depth jobs are already
  // waiting; FailedPrecondition after Shutdown; InvalidArgument for a job
  // without source, arena or config.
  absl::Status Submit(const CopyJob& job);
  // Results that have landed, in completion order (non-blocking).
  std::vector<CopyResult> Poll();
  // Blocks until at least one result has landed, `timeout_seconds` passed
  // or the engine shuts down; returns what landed.
  std::vector<CopyResult> WaitForAny(double timeout_seconds);
  // Jobs submitted whose results have not landed yet (queued or in progress).
  int in_flight() const;
  // Cancels queued jobs, interrupts the one in progress and joins the
  // worker. Idempotent.
  void Shutdown();

  CopyEngineStats stats() const;
  const CopyEngineOptions& options() const { return options_; }
  double Now() const;  // seconds since the engine started

 private:
  void WorkerLoop();

  const CopyEngineOptions options_;
  const std::chrono::steady_clock::time_point epoch_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;               // worker: a job or stop
  std::condition_variable done_cv_;               // callers: a result or stop
  std::deque<std::pair<CopyJob, double>> queue_;  // job, submit time
  std::vector<CopyResult> done_;
  int in_progress_ = 0;
  bool stop_ = false;
  CopyEngineStats stats_;
  TokenBucket bucket_;  // used by the worker only
  std::thread worker_;
};

}  // namespace vc
