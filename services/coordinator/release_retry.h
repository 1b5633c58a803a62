// Retries of the coordinator's Release calls that failed. A request's
// sessions are released at its end with a short deadline; a worker that is
// paused or briefly unreachable then misses it and would hold the session
// (and its KV) until its --session-idle-seconds backstop (120 s by default).
// Failed releases are queued here (bounded) and retried off the request path
// by one background thread, with a growing backoff and a bounded number of
// attempts, so the session is freed soon after the worker answers again.
// Release is idempotent on the workers (an unknown session is OK), so a
// retry after a restart or a late first call is harmless. The release call
// is a seam: the coordinator calls the worker's Release RPC, tests a fake.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "services/coordinator/worker_health.h"

namespace vc::coordinator {

struct ReleaseRetryOptions {
  // Sessions waiting for a retry at most; beyond, new ones are dropped (the
  // worker's idle timeout still frees them). A few KB per thousand.
  size_t max_pending = 4096;
  // Retries of one session before it is given up (left to the idle timeout);
  // 0: none (Add gives up at once).
  int max_attempts = 6;
  // Delay before the first retry; doubles after each failed one, up to
  // max_backoff (defaults: retries 0.5, 1.5, 3.5, 7.5, 15.5, 23.5 s after
  // the failure, well inside the workers' default 120 s idle timeout).
  std::chrono::milliseconds first_backoff{500};
  std::chrono::milliseconds max_backoff{8000};
};

class ReleaseRetry {
 public:
  // Releases `session` on worker `index` of `pool`; must bound itself (a
  // deadline). OK = released (or unknown to the worker).
  using Release = std::function<absl::Status(WorkerPool pool, int index, uint64_t session)>;

  struct Stats {
    int64_t queued = 0;    // accepted by Add
    int64_t released = 0;  // a retry succeeded
    int64_t gave_up = 0;   // max_attempts retries failed
    int64_t dropped = 0;   // refused by Add: the queue was full
  };

  enum class Outcome { kQueued, kReleased, kGaveUp, kDropped };
  static const char* OutcomeName(Outcome o);  // "queued", "released", ...
  // Told every outcome (e.g. for a counter), with the queue's lock held: it
  // must not call back into this object.
  using Listener = std::function<void(Outcome)>;

  ReleaseRetry(Release release, ReleaseRetryOptions options = {}, Listener listener = nullptr);
  ~ReleaseRetry();  // Stop()
  ReleaseRetry(const ReleaseRetry&) = delete;
  ReleaseRetry& operator=(const ReleaseRetry&) = delete;

  // Retries due entries on a background thread until Stop().
  void Start();
  // Stops the thread (waiting for a retry in flight); pending entries are
  // dropped (the workers' idle timeouts free them).
  void Stop();

  // A Release of `session` on the worker failed: retry it later. Returns
  // false (and counts it dropped) when max_pending entries are waiting, or
  // (counted gave_up) when max_attempts is 0.
  bool Add(WorkerPool pool, int index, uint64_t session);

  // One pass over the entries that are due now (what the thread does):
  // per worker, entries are tried in order until one fails; then that
  // failure counts as an attempt for every due entry of the worker (one
  // unreachable worker costs one deadline per pass, not one per session).
  void RunDue();

  size_t pending() const;
  Stats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    WorkerPool pool = WorkerPool::kVerifier;
    int index = 0;
    uint64_t session = 0;
    int attempts = 0;  // retries made so far
    Clock::time_point due;
  };
  std::chrono::milliseconds Backoff(int attempts) const;
  void Count(Outcome o);  // mu_ held

  Release release_;
  ReleaseRetryOptions options_;
  Listener listener_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> entries_;  // waiting (not in a pass)
  size_t in_pass_ = 0;          // taken by the pass in progress
  Stats stats_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace vc::coordinator
