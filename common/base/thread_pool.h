// A fixed-size worker pool for data-parallel loops in the forward pass.
//
// ParallelFor splits an index range into contiguous pieces. Work is split only
// over independent output elements, never inside a reduction, so the thread
// count can change which thread computes an element but never its value.
//
// A forward pass issues dozens of short ParallelFors back to back, so both
// sides spin briefly before they block: a worker keeps looking for the next
// job for `spin_us` after its last one, and the caller for the last pieces
// to finish, and neither makes a futex call while the other is awake. A
// worker that found nothing blocks on a condition variable and is woken only
// then; so an idle pool costs nothing after spin_us.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vc {

struct ThreadPoolOptions {
  // How long a thread spins for new work (a worker) or for the pieces still
  // running (the caller) before it blocks; 0: block at once. A wake-up
  // through the kernel costs tens of microseconds on a VM, against pieces
  // of a few to a few hundred.
  int spin_us = 50;
};

class ThreadPool {
 public:
  // `num_threads` >= 1 counts the calling thread: a pool of 1 runs inline.
  explicit ThreadPool(int num_threads, ThreadPoolOptions options = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint pieces covering [0, n), each at least
  // `min_grain` long (except the last), and returns when all are done. Not
  // reentrant: fn must not call ParallelFor on the same pool.
  void ParallelFor(int64_t n, int64_t min_grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  // Claims and runs pieces of the current job until none is left.
  void RunPieces(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int64_t chunk,
                 int64_t pieces);

  const int num_threads_;
  const ThreadPoolOptions options_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // The job, published under mu_ with a new generation_; a worker enters it
  // (active_ + 1) only under mu_ while job_ is set, and the caller clears
  // job_ only once no worker is inside, so no piece outlives ParallelFor.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t job_pieces_ = 0;
  std::atomic<int64_t> next_piece_{0};
  std::atomic<int64_t> pieces_done_{0};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  int sleepers_ = 0;              // workers blocked on work_cv_ (under mu_)
  bool caller_sleeping_ = false;  // the caller blocked on done_cv_ (under mu_)
  std::atomic<bool> stop_{false};
};

}  // namespace vc
