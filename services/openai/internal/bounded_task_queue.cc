#include "services/openai/internal/bounded_task_queue.h"

#include <utility>

namespace vc::openai::internal {

BoundedTaskQueue::BoundedTaskQueue(size_t threads, size_t max_queued)
    : max_queued_(max_queued > 0 ? max_queued : 1) {
  if (threads == 0) threads = 1;
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

BoundedTaskQueue::~BoundedTaskQueue() { shutdown(); }

void BoundedTaskQueue::enqueue(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  has_room_.wait(lock, [&] { return shutdown_ || queue_.size() < max_queued_; });
  // After shutdown httplib's accept loop has ended; run what it hands over
  // so the connection it owns is still closed.
  queue_.push_back(std::move(fn));
  has_work_.notify_one();
}

void BoundedTaskQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_ && threads_.empty()) return;
    shutdown_ = true;
  }
  has_work_.notify_all();
  has_room_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void BoundedTaskQueue::Work() {
  while (true) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      has_work_.wait(lock, [&] { return shutdown_ || !queue_.empty(); });
      // Drain what was accepted before stopping: each task closes its socket.
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    has_room_.notify_one();
    fn();
  }
}

}  // namespace vc::openai::internal
