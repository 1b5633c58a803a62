// A fixed-size worker pool for data-parallel loops in the forward pass.
//
// ParallelFor splits an index range into contiguous pieces. Work is split only
// over independent output elements, never inside a reduction, so the thread
// count can change which thread computes an element but never its value.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vc {

class ThreadPool {
 public:
  // `num_threads` >= 1 counts the calling thread: a pool of 1 runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint pieces covering [0, n), each at least
  // `min_grain` long (except the last), and returns when all are done. Not
  // reentrant: fn must not call ParallelFor on the same pool.
  void ParallelFor(int64_t n, int64_t min_grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t job_pieces_ = 0;
  int64_t next_piece_ = 0;
  int64_t pieces_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace vc
