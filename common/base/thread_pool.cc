#include "common/base/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace vc {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until done() or `spin_us` passed; true if done() held.
template <class Done>
bool SpinFor(int spin_us, const Done& done) {
  if (spin_us <= 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads, ThreadPoolOptions options)
    : num_threads_(std::max(1, num_threads)), options_(options) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunPieces(const std::function<void(int64_t, int64_t)>& fn, int64_t n,
                           int64_t chunk, int64_t pieces) {
  for (;;) {
    const int64_t piece = next_piece_.fetch_add(1, std::memory_order_relaxed);
    if (piece >= pieces) return;
    fn(piece * chunk, std::min(n, (piece + 1) * chunk));
    pieces_done_.fetch_add(1, std::memory_order_acq_rel);
  }
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
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_pieces_ = pieces;
    next_piece_.store(0, std::memory_order_relaxed);
    pieces_done_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) work_cv_.notify_all();
  RunPieces(fn, n, chunk, pieces);  // the caller works too
  auto finished = [&] {
    return pieces_done_.load(std::memory_order_acquire) == pieces &&
           active_.load(std::memory_order_acquire) == 0;
  };
  SpinFor(options_.spin_us, finished);
  std::unique_lock<std::mutex> lock(mu_);
  if (!finished()) {
    caller_sleeping_ = true;
    done_cv_.wait(lock, finished);
    caller_sleeping_ = false;
  }
  job_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  auto has_news = [&] {
    return stop_.load(std::memory_order_acquire) ||
           generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    SpinFor(options_.spin_us, has_news);
    std::unique_lock<std::mutex> lock(mu_);
    if (!has_news()) {
      ++sleepers_;
      work_cv_.wait(lock, has_news);
      --sleepers_;
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = generation_.load(std::memory_order_relaxed);
    if (job_ == nullptr) continue;  // that job is over already
    const auto* fn = job_;
    const int64_t n = job_n_, chunk = job_chunk_, pieces = job_pieces_;
    active_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    RunPieces(*fn, n, chunk, pieces);
    lock.lock();
    active_.fetch_sub(1, std::memory_order_release);
    if (caller_sleeping_) done_cv_.notify_one();
  }
}

}  // namespace vc
