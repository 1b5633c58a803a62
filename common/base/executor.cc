#include "common/base/executor.h"

#include <algorithm>
#include <utility>

namespace vc {

Executor::Executor(ExecutorOptions options) : options_(options) {
  std::lock_guard<std::mutex> lock(mu_);
  threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // Threads are only added under the lock while not stopping: the list is
  // final now.
  for (std::thread& t : threads_) t.join();
}

void Executor::Post(std::function<void()> work) {
  // Everything under the lock, the notification too: once the work is
  // queued it may run and let the executor's owner destroy it, and nothing
  // of this call may touch it after the lock is released.
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(work));
  // A thread for this work: an idle one, or a new one while below the
  // limit (every thread is busy, perhaps blocked).
  if (idle_ < static_cast<int>(queue_.size()) && !stopping_ &&
      static_cast<int>(threads_.size()) < std::max(1, options_.max_threads)) {
    threads_.emplace_back([this] { Loop(); });
    return;
  }
  cv_.notify_one();
}

int Executor::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(threads_.size());
}

void Executor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
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
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
  }
}

}  // namespace vc
