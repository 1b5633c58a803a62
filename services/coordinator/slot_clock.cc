#include "services/coordinator/slot_clock.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace vc::coordinator {

absl::StatusOr<std::unique_ptr<SlotClock>> SlotClock::Create(const RingSchedulerOptions& options) {
  absl::StatusOr<RingScheduler> scheduler = RingScheduler::Create(options);
  if (!scheduler.ok()) return scheduler.status();
  auto clock = std::unique_ptr<SlotClock>(new SlotClock(std::move(*scheduler)));
  clock->thread_ = std::thread([c = clock.get()] { c->Run(); });
  return clock;
}

SlotClock::SlotClock(RingScheduler scheduler)
    : scheduler_(std::move(scheduler)),
      slot_seconds_(scheduler_.slot_seconds()),
      slot_start_(std::chrono::steady_clock::now()),
      lock_step_(scheduler_.lock_step()),
      prefixes_(PrefixPolicy::ForScheduler(scheduler_)) {}

SlotClock::~SlotClock() { Stop(); }

void SlotClock::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  run_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Notifications added after the thread's last look.
  std::unique_lock<std::mutex> lock(mu_);
  MakeDueNotifications(lock);
}

void SlotClock::Run() {
  // Slot boundaries follow one another without drift: a late wake-up
  // advances every slot that has ended (the slot may be recalibrated, so the
  // timeline restarts from the last boundary). The first slot began when the
  // clock was made, not when this thread started: a booking made in between
  // measured how much of the slot had run from then, and restarting the slot
  // here would offer that part again (booking the slot beyond its length).
  std::unique_lock<std::mutex> lock(mu_);
  auto boundary = slot_start_;
  while (!stopping_) {
    const auto slot = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(slot_seconds_));
    notifies_changed_ = false;
    run_cv_.wait_until(lock, std::min(boundary + slot, NextNotifyTime()),
                       [&] { return stopping_ || notifies_changed_; });
    if (stopping_) break;
    const int64_t due = (std::chrono::steady_clock::now() - boundary) / slot;
    if (due > 0) {
      boundary += slot * due;
      slot_start_ = boundary;
      scheduler_.Advance(due);
      prefixes_.ExpireShared(scheduler_.now());
      cv_.notify_all();
    }
    MakeDueNotifications(lock);
  }
  cv_.notify_all();
  MakeDueNotifications(lock);
}

std::optional<bool> SlotClock::NotifyDue(const Notify& n,
                                         std::chrono::steady_clock::time_point now) const {
  if (stopping_) return false;
  const int64_t current = scheduler_.now();
  if (current > n.slot) return true;
  if (current == n.slot) {
    const auto issue_at =
        slot_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(std::max(0.0, n.offset_seconds)));
    if (now >= issue_at && issue_at <= n.deadline) return true;
  }
  if (now >= n.deadline) return false;
  return std::nullopt;
}

std::chrono::steady_clock::time_point SlotClock::NextNotifyTime() const {
  auto next = std::chrono::steady_clock::time_point::max();
  const int64_t current = scheduler_.now();
  for (const auto& [id, n] : notifies_) {
    next = std::min(next, n.deadline);
    if (current == n.slot) {
      next = std::min(
          next, slot_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(std::max(0.0, n.offset_seconds))));
    }
  }
  return next;
}

void SlotClock::MakeDueNotifications(std::unique_lock<std::mutex>& lock) {
  std::vector<std::pair<std::function<void(bool)>, bool>> due;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = notifies_.begin(); it != notifies_.end();) {
    if (std::optional<bool> answer = NotifyDue(it->second, now)) {
      due.emplace_back(std::move(it->second.ready), *answer);
      it = notifies_.erase(it);
    } else {
      ++it;
    }
  }
  if (due.empty()) return;
  lock.unlock();
  for (auto& [ready, answer] : due) ready(answer);
  lock.lock();
}

SlotClock::NotifyId SlotClock::NotifyAtSlot(int64_t slot, double offset_seconds,
                                            std::chrono::steady_clock::time_point deadline,
                                            std::function<void(bool)> ready) {
  Notify n{.slot = slot,
           .offset_seconds = offset_seconds,
           .deadline = deadline,
           .ready = std::move(ready)};
  std::unique_lock<std::mutex> lock(mu_);
  const NotifyId id = next_notify_++;
  if (std::optional<bool> answer = NotifyDue(n, std::chrono::steady_clock::now())) {
    lock.unlock();
    n.ready(*answer);
    return id;
  }
  notifies_.emplace(id, std::move(n));
  notifies_changed_ = true;
  lock.unlock();
  run_cv_.notify_all();
  return id;
}

SlotClock::NotifyId SlotClock::NotifyAt(std::chrono::steady_clock::time_point when,
                                        std::function<void(bool)> ready) {
  return NotifyAtSlot(std::numeric_limits<int64_t>::max(), 0, when, std::move(ready));
}

bool SlotClock::CancelNotify(NotifyId id) {
  std::lock_guard<std::mutex> lock(mu_);
  return notifies_.erase(id) > 0;
}

absl::StatusOr<Admission> SlotClock::Admit(const AdmitRequest& r) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<Admission> admission = prefixes_.Admit(scheduler_, r);
  if (admission.ok() && !admission->queued) prefixes_.StartUsers(r.id);
  return admission;
}

absl::StatusOr<Booking> SlotClock::BookTransfer(int64_t id, int64_t bytes, int link) {
  std::lock_guard<std::mutex> lock(mu_);
  const double elapsed = std::max(
      0.0, std::chrono::duration<double>(std::chrono::steady_clock::now() - slot_start_).count());
  return scheduler_.BookTransfer(
      {.id = id, .bytes = bytes, .link = link, .elapsed_seconds = elapsed});
}

void SlotClock::HoldResident(const std::string& prefix_key, int gpu, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  // Hold answers true only for a valid gpu, so ApplyCapacity cannot fail.
  if (prefixes_.Hold(prefix_key, gpu, bytes)) (void)prefixes_.ApplyCapacity(scheduler_, gpu);
}

void SlotClock::ReleaseResident(const std::string& prefix_key, int gpu) {
  std::lock_guard<std::mutex> lock(mu_);
  if (prefixes_.Release(prefix_key, gpu)) (void)prefixes_.ApplyCapacity(scheduler_, gpu);
}

int64_t SlotClock::ResidentBytes(int gpu) const {
  std::lock_guard<std::mutex> lock(mu_);
  return prefixes_.ResidentBytes(gpu);
}

absl::Status SlotClock::ShrinkTransfer(int64_t id, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.ShrinkTransfer(id, bytes);
}

absl::Status SlotClock::Release(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!prefixes_.DropUser(id)) return absl::OkStatus();  // joined rounds still verify on it
  return scheduler_.Release(id);
}

bool SlotClock::JoinShared(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  return prefixes_.AddUser(id);
}

bool SlotClock::WaitForSlot(int64_t slot, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return stopping_ || scheduler_.now() >= slot; }) &&
         !stopping_;
}

bool SlotClock::WaitForSlot(int64_t slot, double offset_seconds,
                            std::chrono::steady_clock::time_point deadline) {
  if (!WaitForSlot(slot, deadline)) return false;
  if (!(offset_seconds > 0)) return true;
  std::unique_lock<std::mutex> lock(mu_);
  if (scheduler_.now() > slot) return !stopping_;
  const auto issue_at =
      slot_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(offset_seconds));
  // A slot that ends early (the clock advanced) ends the wait too.
  cv_.wait_until(lock, std::min(deadline, issue_at),
                 [&] { return stopping_ || scheduler_.now() > slot; });
  if (stopping_) return false;
  return issue_at <= deadline || scheduler_.now() > slot;
}

bool SlotClock::SlotBegun(int64_t slot, double offset_seconds) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = scheduler_.now();
  if (now > slot) return true;
  if (now < slot) return false;
  if (!(offset_seconds > 0)) return true;
  return std::chrono::steady_clock::now() >=
         slot_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(offset_seconds));
}

std::chrono::steady_clock::duration SlotClock::TimeUntilSlot(int64_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t ahead = slot - scheduler_.now();
  if (ahead <= 0) return std::chrono::steady_clock::duration::zero();
  const auto start = slot_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(slot_seconds_ * ahead));
  return std::max(std::chrono::steady_clock::duration::zero(),
                  start - std::chrono::steady_clock::now());
}

double SlotClock::slot_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slot_seconds_;
}

absl::Status SlotClock::SetSlotSeconds(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = scheduler_.SetSlotSeconds(seconds); !s.ok()) return s;
  slot_seconds_ = seconds;
  return absl::OkStatus();
}

int64_t SlotClock::now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.now();
}

std::vector<double> SlotClock::LinkOccupancy() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> out;
  for (size_t l = 0; l < scheduler_.options().links.size(); ++l) {
    out.push_back(scheduler_.LinkBooked(static_cast<int>(l), scheduler_.now()) /
                  scheduler_.slot_seconds());
  }
  return out;
}

std::vector<int64_t> SlotClock::MemoryBooked() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  for (size_t g = 0; g < scheduler_.options().gpus.size(); ++g) {
    out.push_back(scheduler_.MemoryBooked(static_cast<int>(g), scheduler_.now()));
  }
  return out;
}

RingSchedulerStats SlotClock::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.stats();
}

bool SlotClock::FindShared(const std::string& prefix_key, int gpu, int64_t max_verify_slot,
                           Shared* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Joining needs the verify to be still ahead (the loaded copy stays pinned
  // until then, so this request's Load finds it) and no later than this
  // request wants.
  std::optional<SharedBooking> found =
      prefixes_.FindShared(prefix_key, gpu, scheduler_.now() + 1, max_verify_slot);
  if (!found) return false;
  *out = *found;
  return true;
}

void SlotClock::NoteShared(const std::string& prefix_key, int gpu, const Booking& booking) {
  std::lock_guard<std::mutex> lock(mu_);
  prefixes_.NoteShared(prefix_key, gpu, booking);
}

}  // namespace vc::coordinator
