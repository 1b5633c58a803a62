#include "common/transport/internal/link_pacer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace vc::transport::internal {

void StopSignal::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

bool StopSignal::stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

bool StopSignal::SleepUntil(TimePoint t) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, t, [&] { return stopped_; });
  return !stopped_;
}

SlotCounters::SlotCounters(double slot_seconds, int max_slots)
    : slot_seconds_(slot_seconds), max_slots_(std::max(1, max_slots)) {}

void SlotCounters::Add(double seconds, int64_t bytes) {
  const int64_t slot = static_cast<int64_t>(std::floor(std::max(0.0, seconds) / slot_seconds_));
  if (bytes_.empty()) first_slot_ = std::max<int64_t>(0, slot - max_slots_ + 1);
  if (slot < first_slot_) return;  // older than the history kept
  const int64_t last = first_slot_ + static_cast<int64_t>(bytes_.size()) - 1;
  if (slot > last) {
    const int64_t grow = slot - last;
    if (grow >= max_slots_) {
      bytes_.assign(static_cast<size_t>(max_slots_), 0);
      first_slot_ = slot - max_slots_ + 1;
    } else {
      bytes_.insert(bytes_.end(), static_cast<size_t>(grow), 0);
      while (static_cast<int64_t>(bytes_.size()) > max_slots_) {
        bytes_.pop_front();
        ++first_slot_;
      }
    }
  }
  bytes_[static_cast<size_t>(slot - first_slot_)] += bytes;
}

LinkSlotCounters SlotCounters::Snapshot() const {
  LinkSlotCounters out;
  out.slot_seconds = slot_seconds_;
  out.first_slot = first_slot_;
  out.bytes_per_slot.assign(bytes_.begin(), bytes_.end());
  return out;
}

LinkPacer::LinkPacer(const LinkPacing& pacing, TimePoint epoch, double slot_seconds, int max_slots)
    : pacing_(pacing), epoch_(epoch), next_free_(epoch), counters_(slot_seconds, max_slots) {}

absl::Status LinkPacer::Acquire(int64_t bytes, TimePoint deadline, const StopSignal& stop,
                                Flow flow) {
  const int64_t inbound = flow == Flow::kIn ? bytes : 0;
  if (!paced()) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.Add(std::chrono::duration<double>(Clock::now() - epoch_).count(), bytes);
    bytes_total_ += bytes;
    bytes_received_ += inbound;
    return absl::OkStatus();
  }
  const double transmit_seconds = static_cast<double>(bytes) / pacing_.bytes_per_second;
  TimePoint release;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TimePoint start = std::max(Clock::now(), next_free_);
    release = start + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(transmit_seconds));
    if (release > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the paced ", pacing_.bytes_per_second, " B/s link cannot ",
                       flow == Flow::kIn ? "take the upload" : "send the response",
                       " before the client's deadline"));
    }
    next_free_ = release;
  }
  if (!stop.SleepUntil(release)) return absl::CancelledError("data plane server is stopping");
  std::lock_guard<std::mutex> lock(mu_);
  counters_.Add(std::chrono::duration<double>(release - epoch_).count(), bytes);
  bytes_total_ += bytes;
  bytes_received_ += inbound;
  busy_seconds_ += transmit_seconds;
  return absl::OkStatus();
}

void LinkPacer::BeginResponse(Exchange kind) {
  std::lock_guard<std::mutex> lock(mu_);
  // Counted before any byte of the answer goes out, so a client that has
  // its answer always finds it counted.
  ++(kind == Exchange::kFetch ? fetches_ : stages_);
  if (active_responses_++ == 0) busy_since_ = Clock::now();
}

void LinkPacer::EndResponse() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--active_responses_ == 0 && !paced()) {
    busy_seconds_ += std::chrono::duration<double>(Clock::now() - busy_since_).count();
  }
}

LinkStats LinkPacer::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LinkStats s;
  s.bytes_total = bytes_total_;
  s.bytes_received = bytes_received_;
  s.fetches = fetches_;
  s.stages = stages_;
  s.busy_seconds = busy_seconds_;
  s.capacity_bytes_per_second = pacing_.bytes_per_second;
  s.slots = counters_.Snapshot();
  return s;
}

}  // namespace vc::transport::internal
