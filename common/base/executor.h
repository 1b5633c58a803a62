// A pool of threads that runs posted work: the threads coroutines continue
// on (common/base/task.h) when what they waited for has come. It starts one
// thread and adds one whenever work is posted while every thread is busy,
// up to max_threads (work posted beyond that waits its turn), so work that
// blocks (a synchronous RPC) delays the rest only once max_threads are
// blocked. Threads stay until the executor is destroyed.
//
// The queue has no bound of its own: its users bound it (the coordinator
// posts at most one continuation per admitted request at a time).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vc {

struct ExecutorOptions {
  int max_threads = 64;
};

class Executor {
 public:
  explicit Executor(ExecutorOptions options = {});
  // Runs what was posted before (and what that posts), then joins.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Post(std::function<void()> work);
  // Threads started so far.
  int threads() const;

 private:
  void Loop();

  const ExecutorOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stopping_ = false;
};

}  // namespace vc
