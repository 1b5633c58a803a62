#include "services/coordinator/worker_health.h"

#include <algorithm>
#include <cstdint>

#include "common/scheduler/prefix_policy.h"

namespace vc::coordinator {

const char* WorkerPoolName(WorkerPool pool) {
  return pool == WorkerPool::kVerifier ? "verifier" : "drafter";
}

bool IsWorkerLost(const absl::Status& s) { return s.code() == absl::StatusCode::kUnavailable; }

WorkerHealth::WorkerHealth(int verifiers, int drafters, Probe probe, WorkerHealthOptions options,
                           Listener listener)
    : probe_(std::move(probe)),
      options_(options),
      listener_(std::move(listener)),
      verifiers_(static_cast<size_t>(std::max(0, verifiers))),
      drafters_(static_cast<size_t>(std::max(0, drafters))) {}

WorkerHealth::~WorkerHealth() { Stop(); }

void WorkerHealth::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (cv_.wait_for(lock, options_.interval, [this] { return stopping_; })) break;
      lock.unlock();
      ProbeAll();
      lock.lock();
    }
  });
}

void WorkerHealth::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkerHealth::ProbeAll() {
  for (WorkerPool pool : {WorkerPool::kVerifier, WorkerPool::kDrafter}) {
    const int n = static_cast<int>(pool_state(pool).size());  // fixed after construction
    for (int i = 0; i < n; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      const absl::Status s = probe_(pool, i);
      Set(pool, i, s.ok(), s);
    }
  }
}

bool WorkerHealth::ReportFailure(WorkerPool pool, int index, const absl::Status& s) {
  if (IsWorkerLost(s)) Set(pool, index, false, s);
  return !Up(pool, index);
}

void WorkerHealth::MarkUp(WorkerPool pool, int index) { Set(pool, index, true, absl::OkStatus()); }

void WorkerHealth::MarkDown(WorkerPool pool, int index, const absl::Status& why) {
  Set(pool, index, false, why);
}

void WorkerHealth::Set(WorkerPool pool, int index, bool up, const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<State>& states = pool_state(pool);
    if (index < 0 || index >= static_cast<int>(states.size())) return;
    State& st = states[static_cast<size_t>(index)];
    if (!up) st.reason = std::string(why.message());
    if (st.up == up) return;
    st.up = up;
    if (up) st.reason.clear();
  }
  if (listener_) listener_(pool, index, up, why);
}

bool WorkerHealth::Up(WorkerPool pool, int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<State>& states = pool_state(pool);
  return index >= 0 && index < static_cast<int>(states.size()) && states[static_cast<size_t>(index)].up;
}

int WorkerHealth::LiveCount(WorkerPool pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const State& st : pool_state(pool)) n += st.up ? 1 : 0;
  return n;
}

std::string WorkerHealth::DownReason(WorkerPool pool, int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<State>& states = pool_state(pool);
  if (index < 0 || index >= static_cast<int>(states.size())) return "";
  const State& st = states[static_cast<size_t>(index)];
  return st.up ? "" : st.reason;
}

std::optional<int> WorkerHealth::PickByKey(WorkerPool pool, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> live;
  for (const State& s : pool_state(pool)) live.push_back(s.up);
  return PlaceByKey(key, live);
}

std::optional<int> WorkerHealth::PickLeastLoaded(WorkerPool pool, const std::vector<int>& loads) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<State>& states = pool_state(pool);
  std::optional<int> best;
  for (int i = 0; i < static_cast<int>(states.size()) && i < static_cast<int>(loads.size()); ++i) {
    if (!states[static_cast<size_t>(i)].up) continue;
    if (!best || loads[static_cast<size_t>(i)] < loads[static_cast<size_t>(*best)]) best = i;
  }
  return best;
}

}  // namespace vc::coordinator
