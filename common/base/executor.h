// A pool of threads that runs posted work: the threads coroutines continue
// on (common/base/task.h) when what they waited for has come. It starts one
// thread and adds one whenever work is posted while every thread is busy,
// up to max_threads (work posted beyond that waits its turn), so work that
// blocks (a synchronous RPC) delays the rest only once max_threads are
// blocked. A thread idle for idle_timeout ends (one always stays), so a
// burst's threads are given back.
//
// The queue has no bound of its own: its users bound it (the coordinator
// posts at most one continuation per admitted request at a time).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vc {

struct ExecutorOptions {
  int max_threads = 64;
  // How long an idle thread waits for work before it ends (one always
  // stays); zero or less: threads stay until the executor is destroyed.
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(30);
};

class Executor {
 public:
  explicit Executor(ExecutorOptions options = {});
  // Runs what was posted before (and what that posts), then joins.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Post(std::function<void()> work);
  // Threads running now (started and not ended idle).
  int threads() const;

 private:
  void StartThread();  // mu_ held
  void Loop(uint64_t id);
  void JoinEnded();  // mu_ held

  const ExecutorOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::map<uint64_t, std::thread> threads_;  // running, by a number of their own
  std::vector<std::thread> ended_;           // ended idle, not yet joined
  uint64_t next_id_ = 0;
  int idle_ = 0;
  bool stopping_ = false;
};

}  // namespace vc
