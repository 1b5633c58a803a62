#include "common/base/executor.h"

#include <algorithm>
#include <utility>

namespace vc {

Executor::Executor(ExecutorOptions options) : options_(options) {
  std::lock_guard<std::mutex> lock(mu_);
  StartThread();
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // Threads are only added under the lock while not stopping, and none ends
  // idle once stopping (Loop returns only with the queue empty, after the
  // thread has left threads_ or with it still there): the lists are final
  // once every thread has seen stopping_.
  std::map<uint64_t, std::thread> running;
  std::vector<std::thread> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running.swap(threads_);
    ended.swap(ended_);
  }
  for (auto& [id, t] : running) t.join();
  for (std::thread& t : ended) t.join();
}

void Executor::StartThread() {
  const uint64_t id = next_id_++;
  threads_.emplace(id, std::thread([this, id] { Loop(id); }));
}

void Executor::JoinEnded() {
  // Each has left Loop (it moved itself here as its last step under the
  // lock), so the joins wait only for the thread's exit.
  for (std::thread& t : ended_) t.join();
  ended_.clear();
}

void Executor::Post(std::function<void()> work) {
  // Everything under the lock, the notification too: once the work is
  // queued it may run and let the executor's owner destroy it, and nothing
  // of this call may touch it after the lock is released.
  std::lock_guard<std::mutex> lock(mu_);
  JoinEnded();
  queue_.push_back(std::move(work));
  // A thread for this work: an idle one, or a new one while below the
  // limit (every thread is busy, perhaps blocked).
  if (idle_ < static_cast<int>(queue_.size()) && !stopping_ &&
      static_cast<int>(threads_.size()) < std::max(1, options_.max_threads)) {
    StartThread();
    return;
  }
  cv_.notify_one();
}

int Executor::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(threads_.size());
}

void Executor::Loop(uint64_t id) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool reaps = options_.idle_timeout.count() > 0;
  while (true) {
    if (!queue_.empty()) {
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      work();
      lock.lock();
      continue;
    }
    if (stopping_) return;
    ++idle_;
    auto ready = [&] { return stopping_ || !queue_.empty(); };
    bool woken = true;
    if (reaps) {
      woken = cv_.wait_for(lock, options_.idle_timeout, ready);
    } else {
      cv_.wait(lock, ready);
    }
    --idle_;
    if (!woken && threads_.size() > 1) {
      // Idle for idle_timeout with others left to take work: this thread
      // ends, and the next Post (or the destructor) joins it. While it was
      // counted idle no Post started a thread for work it could have
      // taken, and none is queued now.
      auto self = threads_.find(id);
      ended_.push_back(std::move(self->second));
      threads_.erase(self);
      return;
    }
  }
}

}  // namespace vc
