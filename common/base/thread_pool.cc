#include "common/base/thread_pool.h"

#include <algorithm>

namespace vc {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_grain = std::max<int64_t>(1, min_grain);
  // A few pieces per thread so that uneven pieces balance out.
  int64_t pieces = std::min<int64_t>((n + min_grain - 1) / min_grain, int64_t{num_threads_} * 4);
  if (num_threads_ == 1 || pieces <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + pieces - 1) / pieces;
  pieces = (n + chunk - 1) / chunk;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_pieces_ = pieces;
    next_piece_ = 0;
    pieces_done_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  // The caller works too.
  int64_t mine_done = 0;
  for (;;) {
    int64_t piece;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_piece_ >= job_pieces_) break;
      piece = next_piece_++;
    }
    fn(piece * chunk, std::min(n, (piece + 1) * chunk));
    ++mine_done;
  }
  std::unique_lock<std::mutex> lock(mu_);
  pieces_done_ += mine_done;
  done_cv_.wait(lock, [&] { return pieces_done_ == job_pieces_; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int /*index*/) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_piece_ < job_pieces_) {
      const int64_t piece = next_piece_++;
      const auto* fn = job_;
      const int64_t n = job_n_, chunk = job_chunk_;
      lock.unlock();
      (*fn)(piece * chunk, std::min(n, (piece + 1) * chunk));
      lock.lock();
      if (++pieces_done_ == job_pieces_) done_cv_.notify_all();
    }
  }
}

}  // namespace vc
