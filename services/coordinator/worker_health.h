// Which of the coordinator's workers (verifiers, drafters) are up, and where
// a request goes among the live ones. A worker is marked down at once when a
// call to it fails with a transport-class error (UNAVAILABLE: connection
// refused, socket closed) or a periodic probe fails; it is taken back when a
// probe succeeds again (a supervisor restarted it on the same address).
// Placement by key is rendezvous hashing over the live workers: the same
// prefix keeps going to the same verifier while that one is up, and only the
// keys of a dead worker move. The probe is a seam: the coordinator probes
// with the workers' Info RPC, unit tests with a fake.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace vc::coordinator {

enum class WorkerPool { kVerifier = 0, kDrafter = 1 };
const char* WorkerPoolName(WorkerPool pool);

struct WorkerHealthOptions {
  // Time between two probe rounds of the background thread (Start()).
  std::chrono::milliseconds interval{1000};
};

// True for the errors that say the worker itself is gone (not a bad request).
bool IsWorkerLost(const absl::Status& s);

class WorkerHealth {
 public:
  // Probes one worker; must bound itself (a deadline). OK = healthy.
  using Probe = std::function<absl::Status(WorkerPool pool, int index)>;
  // Called on every up/down transition (outside the lock), e.g. for a gauge.
  using Listener = std::function<void(WorkerPool pool, int index, bool up, const absl::Status& why)>;

  WorkerHealth(int verifiers, int drafters, Probe probe, WorkerHealthOptions options = {},
               Listener listener = nullptr);
  ~WorkerHealth();  // Stop()
  WorkerHealth(const WorkerHealth&) = delete;
  WorkerHealth& operator=(const WorkerHealth&) = delete;

  // Probes every worker each `interval` on a background thread until Stop().
  void Start();
  void Stop();
  // One probe round over every worker (what the thread does each interval).
  void ProbeAll();

  // A call to the worker failed with `s`: marks it down when IsWorkerLost(s).
  // Returns whether the worker is now down.
  bool ReportFailure(WorkerPool pool, int index, const absl::Status& s);
  void MarkUp(WorkerPool pool, int index);
  void MarkDown(WorkerPool pool, int index, const absl::Status& why);

  bool Up(WorkerPool pool, int index) const;
  int LiveCount(WorkerPool pool) const;
  // Why the worker is down ("" when up).
  std::string DownReason(WorkerPool pool, int index) const;

  // The live worker for `key` (PlaceByKey of common/scheduler/prefix_policy.h:
  // rendezvous hashing, deterministic across processes); nullopt when none
  // is up.
  std::optional<int> PickByKey(WorkerPool pool, const std::string& key) const;
  // The live worker with the smallest load (lowest index on ties); `loads`
  // has one entry per worker of the pool.
  std::optional<int> PickLeastLoaded(WorkerPool pool, const std::vector<int>& loads) const;

 private:
  struct State {
    bool up = true;
    std::string reason;
  };
  std::vector<State>& pool_state(WorkerPool pool) { return pool == WorkerPool::kVerifier ? verifiers_ : drafters_; }
  const std::vector<State>& pool_state(WorkerPool pool) const {
    return pool == WorkerPool::kVerifier ? verifiers_ : drafters_;
  }
  void Set(WorkerPool pool, int index, bool up, const absl::Status& why);

  Probe probe_;
  WorkerHealthOptions options_;
  Listener listener_;
  mutable std::mutex mu_;
  std::vector<State> verifiers_;
  std::vector<State> drafters_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace vc::coordinator
