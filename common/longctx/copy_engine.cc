#include "common/longctx/copy_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace vc {

TokenBucket::TokenBucket(double rate, double burst)
    : rate_(rate), burst_(std::max(1.0, burst)), tokens_(std::max(1.0, burst)) {}

void TokenBucket::Refill(double now) {
  if (last_ >= 0 && now > last_) tokens_ = std::min(burst_, tokens_ + (now - last_) * rate_);
  if (now > last_) last_ = now;
}

double TokenBucket::Take(double want, double now) {
  if (rate_ <= 0) return want;
  Refill(now);
  const double taken = std::clamp(want, 0.0, tokens_);
  tokens_ -= taken;
  return taken;
}

double TokenBucket::WaitTime(double want, double now) const {
  if (rate_ <= 0) return 0;
  double tokens = tokens_;
  if (last_ >= 0 && now > last_) tokens = std::min(burst_, tokens + (now - last_) * rate_);
  const double need = std::min(want, burst_) - tokens;
  return need <= 0 ? 0 : need / rate_;
}

CopyEngine::CopyEngine(const CopyEngineOptions& options)
    : options_(options),
      epoch_(std::chrono::steady_clock::now()),
      bucket_(options.bytes_per_second, static_cast<double>(options.burst_bytes)) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

CopyEngine::~CopyEngine() { Shutdown(); }

double CopyEngine::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

void CopyEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Landed copies not collected are dropped here (their arena bytes return).
  std::lock_guard<std::mutex> lock(mu_);
  done_.clear();
}

absl::Status CopyEngine::Submit(const CopyJob& job) {
  if (job.source == nullptr || job.arena == nullptr || job.config == nullptr) {
    return absl::InvalidArgumentError("copy job needs a source, an arena and a model config");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::FailedPreconditionError("copy engine is shut down");
    if (static_cast<int>(queue_.size()) >= std::max(0, options_.queue_depth)) {
      ++stats_.rejected;
      return absl::ResourceExhaustedError("copy engine queue is full");
    }
    queue_.emplace_back(job, Now());
    ++stats_.submitted;
    stats_.max_queued = std::max(stats_.max_queued, static_cast<int>(queue_.size()));
  }
  work_cv_.notify_one();
  return absl::OkStatus();
}

std::vector<CopyResult> CopyEngine::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(done_, {});
}

std::vector<CopyResult> CopyEngine::WaitForAny(double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_seconds)),
                    [this] { return !done_.empty() || stop_; });
  return std::exchange(done_, {});
}

int CopyEngine::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size()) + in_progress_;
}

CopyEngineStats CopyEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CopyEngine::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    auto [job, submit_time] = queue_.front();
    queue_.pop_front();
    ++in_progress_;
    lock.unlock();

    CopyResult result;
    result.id = job.id;
    result.submit_time = submit_time;
    result.start_time = Now();
    // The copy itself: device blocks are reserved up front (as a DMA target
    // would be), then filled from the host cache.
    auto copy = std::make_unique<PagedKvCache>(
        *job.config, PagedKvCache::Options{.block_tokens = options_.block_tokens,
                                           .first_position = job.source->first_position(),
                                           .arena = job.arena});
    absl::StatusOr<int64_t> bytes = copy->CopyFrom(*job.source);
    bool cancelled = false;
    if (bytes.ok()) {
      // Pace: the copy lands when the link has delivered all its bytes.
      double remaining = static_cast<double>(*bytes);
      lock.lock();
      while (remaining > 0 && !stop_) {
        remaining -= bucket_.Take(remaining, Now());
        if (remaining <= 0) break;
        const double wait = bucket_.WaitTime(remaining, Now());
        work_cv_.wait_for(lock, std::chrono::duration<double>(std::max(wait, 1e-6)),
                          [this] { return stop_; });
      }
      cancelled = stop_;
      lock.unlock();
      result.bytes = *bytes;
      result.copy = std::move(copy);
    } else {
      result.copy = bytes.status();
    }
    result.done_time = Now();

    lock.lock();
    --in_progress_;
    if (cancelled) return;  // dropped: the caller is shutting down
    if (result.copy.ok()) {
      ++stats_.completed;
      stats_.bytes += result.bytes;
      stats_.busy_seconds += result.done_time - result.start_time;
    } else {
      ++stats_.failed;
    }
    done_.push_back(std::move(result));
    done_cv_.notify_all();
  }
}

}  // namespace vc
