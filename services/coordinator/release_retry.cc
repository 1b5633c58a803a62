#include "services/coordinator/release_retry.h"

#include <algorithm>
#include <map>
#include <utility>

namespace vc::coordinator {

const char* ReleaseRetry::OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kQueued:
      return "queued";
    case Outcome::kReleased:
      return "released";
    case Outcome::kGaveUp:
      return "gave_up";
    case Outcome::kDropped:
      return "dropped";
  }
  return "?";
}

ReleaseRetry::ReleaseRetry(Release release, ReleaseRetryOptions options, Listener listener)
    : release_(std::move(release)), options_(options), listener_(std::move(listener)) {}

void ReleaseRetry::Count(Outcome o) {
  switch (o) {
    case Outcome::kQueued:
      ++stats_.queued;
      break;
    case Outcome::kReleased:
      ++stats_.released;
      break;
    case Outcome::kGaveUp:
      ++stats_.gave_up;
      break;
    case Outcome::kDropped:
      ++stats_.dropped;
      break;
  }
  if (listener_) listener_(o);
}

ReleaseRetry::~ReleaseRetry() { Stop(); }

void ReleaseRetry::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (entries_.empty()) {
        cv_.wait(lock, [this] { return stopping_ || !entries_.empty(); });
        continue;
      }
      Clock::time_point next = entries_.front().due;
      for (const Entry& e : entries_) next = std::min(next, e.due);
      // An Add may bring an earlier due time: wake for it and look again.
      const int64_t seen = stats_.queued;
      if (cv_.wait_until(lock, next, [&] { return stopping_ || stats_.queued != seen; })) continue;
      lock.unlock();
      RunDue();
      lock.lock();
    }
  });
}

void ReleaseRetry::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

bool ReleaseRetry::Add(WorkerPool pool, int index, uint64_t session) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (options_.max_attempts <= 0) {  // retries are off
      Count(Outcome::kGaveUp);
      return false;
    }
    if (stopping_ || entries_.size() + in_pass_ >= options_.max_pending) {
      Count(Outcome::kDropped);
      return false;
    }
    Entry e;
    e.pool = pool;
    e.index = index;
    e.session = session;
    e.due = Clock::now() + Backoff(0);
    entries_.push_back(e);
    Count(Outcome::kQueued);
  }
  cv_.notify_all();
  return true;
}

std::chrono::milliseconds ReleaseRetry::Backoff(int attempts) const {
  std::chrono::milliseconds b = options_.first_backoff;
  for (int i = 0; i < attempts && b < options_.max_backoff; ++i) b *= 2;
  return std::min(b, options_.max_backoff);
}

void ReleaseRetry::RunDue() {
  // Due entries by worker, in the order they were added.
  std::map<std::pair<int, int>, std::vector<Entry>> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    auto keep = std::stable_partition(entries_.begin(), entries_.end(),
                                      [&](const Entry& e) { return e.due > now; });
    for (auto it = keep; it != entries_.end(); ++it) {
      due[{static_cast<int>(it->pool), it->index}].push_back(*it);
      ++in_pass_;
    }
    entries_.erase(keep, entries_.end());
  }
  for (auto& [worker, list] : due) {
    size_t i = 0;
    bool failed = false;
    for (; i < list.size(); ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
      }
      if (!release_(list[i].pool, list[i].index, list[i].session).ok()) {
        failed = true;
        break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      Count(Outcome::kReleased);
      --in_pass_;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t j = i; j < list.size(); ++j) {
      --in_pass_;
      if (stopping_) continue;
      Entry e = list[j];
      if (failed) ++e.attempts;
      if (e.attempts >= options_.max_attempts) {
        Count(Outcome::kGaveUp);
        continue;
      }
      e.due = Clock::now() + Backoff(e.attempts);
      entries_.push_back(e);
    }
  }
}

size_t ReleaseRetry::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size() + in_pass_;
}

ReleaseRetry::Stats ReleaseRetry::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace vc::coordinator
