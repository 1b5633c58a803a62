// cpp-httplib's task queue with a bound: `threads` workers and at most
// `max_queued` accepted connections waiting for one. httplib's own
// ThreadPool queues without limit; here, when the queue is full, enqueue
// blocks the accept loop instead, so further clients wait in the kernel's
// listen backlog (and time out there) rather than in our memory.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/http/httplib.h"

namespace vc::openai::internal {

class BoundedTaskQueue final : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(size_t threads, size_t max_queued);
  ~BoundedTaskQueue() override;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

 private:
  void Work();
  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable has_work_;
  std::condition_variable has_room_;
  std::deque<std::function<void()>> queue_;
  bool shutdown_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace vc::openai::internal
