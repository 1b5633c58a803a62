// The coordinator's scheduler clock: the pure RingScheduler policy
// (common/scheduler/ring_scheduler.h) driven by wall time. A thread ends a
// slot every slot_seconds (RingScheduler::Advance) and wakes the requests
// waiting for a slot; requests book their reloads and verifies through it,
// and their transfers on the slow link (KV refresh, the drafter Open's
// prefix fetch).
// The prefix rules it applies (residency, the admission rule, joining a
// booking) are the pure PrefixPolicy's (common/scheduler/prefix_policy.h);
// this only locks and applies them to the scheduler. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/scheduler/prefix_policy.h"
#include "common/scheduler/ring_scheduler.h"

namespace vc::coordinator {

// The coordinator's bandwidth rings (RingSchedulerOptions::links), by index:
// coordinator_service.cc builds them in this order, the runners book on
// them, and the link_occupancy_ratio gauge is labelled by kLinkNames.
inline constexpr int kFastLink = 0;  // store -> verifiers: the verify's reload
// store/verifiers -> drafters: KV refresh, and the prefix a drafter's Open
// fetches (compressed variant, or full chunks for full_remote)
inline constexpr int kSlowLink = 1;
inline constexpr int kLinkCount = 2;
inline constexpr const char* kLinkNames[kLinkCount] = {"fast", "slow"};

class SlotClock {
 public:
  static absl::StatusOr<std::unique_ptr<SlotClock>> Create(const RingSchedulerOptions& options);
  ~SlotClock();

  // Books `r` (PrefixPolicy::Admit: RingScheduler::Admit, and queued while
  // it fits the verifier's configured memory only once resident prefixes
  // are released).
  absl::StatusOr<Admission> Admit(const AdmitRequest& r);

  // Books a link-only transfer of `bytes` on `link`
  // (RingScheduler::BookTransfer), e.g. a round's KV refresh or a drafter
  // Open's prefix fetch on the slow link: the part of the current slot that
  // has already run is not offered. Issue it once
  // WaitForSlot(booking.first_slot()) returns, and Release(id) when done (a
  // started transfer keeps its link time; one never sent gives it back). An
  // unlimited link books nothing and starts now.
  absl::StatusOr<Booking> BookTransfer(int64_t id, int64_t bytes, int link);

  // RingScheduler::ShrinkTransfer: a transfer booked at an upper bound
  // gives back the link time beyond `bytes`.
  absl::Status ShrinkTransfer(int64_t id, int64_t bytes);

  // Resident full KV: a session decoding on the verifier alone (full_local,
  // fallback) keeps its prefix loaded for its whole life, outside any
  // booking. While held it lowers that verifier's memory ring capacity, so
  // reloads are never booked into memory it occupies. Keyed by prefix: the
  // verifier keeps one copy per prefix, however many sessions use it
  // (PrefixPolicy::Hold / Release).
  void HoldResident(const std::string& prefix_key, int gpu, int64_t bytes);
  void ReleaseResident(const std::string& prefix_key, int gpu);
  // Bytes held resident on `gpu`.
  int64_t ResidentBytes(int gpu) const;
  // Drops one user of booking `id` (its own request, or a round that joined
  // it): the booking and its memory go when the last one has released it.
  // NotFound for an unknown id.
  absl::Status Release(int64_t id);

  // Waits until the current slot is >= `slot`; false if `deadline` passed or
  // the clock stopped first. With `offset_seconds`, waits until that far into
  // `slot` (returns at once if `slot` has already ended).
  bool WaitForSlot(int64_t slot, std::chrono::steady_clock::time_point deadline);
  bool WaitForSlot(int64_t slot, double offset_seconds,
                   std::chrono::steady_clock::time_point deadline);

  // WaitForSlot without a thread: calls `ready(true)` once the wait would
  // return true, `ready(false)` once `deadline` has passed first or the
  // clock stops. `ready` runs on the clock's thread (or on the caller's, at
  // once, when the slot has begun already): it must be quick and must not
  // call this clock. Returns an id for CancelNotify.
  using NotifyId = uint64_t;
  NotifyId NotifyAtSlot(int64_t slot, double offset_seconds,
                        std::chrono::steady_clock::time_point deadline,
                        std::function<void(bool)> ready);
  // Calls `ready(false)` at `when` (or at Stop), as NotifyAtSlot does.
  NotifyId NotifyAt(std::chrono::steady_clock::time_point when, std::function<void(bool)> ready);
  // Forgets a notification not made yet; false when it has been (or is
  // being) made.
  bool CancelNotify(NotifyId id);

  // Whether WaitForSlot(slot, offset_seconds, ...) would return at once:
  // the slot has begun and the offset into it has passed (or a later slot
  // has begun).
  bool SlotBegun(int64_t slot, double offset_seconds) const;

  int64_t now() const;
  // How long until `slot` begins (zero if it has begun): a wait another
  // process can do (a verifier holding a round's refresh for its slot).
  std::chrono::steady_clock::duration TimeUntilSlot(int64_t slot) const;
  double slot_seconds() const;
  // Recalibrates the slot (RingScheduler::SetSlotSeconds); later slots use
  // the new duration.
  absl::Status SetSlotSeconds(double seconds);
  bool lock_step() const { return lock_step_; }
  // Booked seconds / slot seconds in the current slot, per link.
  std::vector<double> LinkOccupancy() const;
  std::vector<int64_t> MemoryBooked() const;
  RingSchedulerStats stats() const;

  // Prefix-aware booking: the latest booking of `prefix_key` on `gpu`, if
  // its verify slot is still ahead, so a request over the same prefix can
  // join it (verified in the same pass, loaded once) instead of booking a
  // second reload (PrefixPolicy::FindShared / NoteShared).
  using Shared = SharedBooking;
  bool FindShared(const std::string& prefix_key, int gpu, int64_t max_verify_slot, Shared* out) const;
  void NoteShared(const std::string& prefix_key, int gpu, const Booking& booking);
  // A round that joins booking `id` becomes one more user of it, so the
  // shared copy's memory stays booked until that round's verify is over too
  // (it may run in a later pass than the booking's own request, which would
  // otherwise free the memory the copy still occupies); the round releases
  // it like its own. False when the booking is already gone (its request
  // failed or finished): then there is nothing to hold.
  bool JoinShared(int64_t id);
  // An id no booking of this clock has had (for AdmitRequest::id).
  int64_t NewBookingId() { return next_booking_id_.fetch_add(1) + 1; }

  void Stop();

 private:
  // A NotifyAtSlot / NotifyAt not made yet.
  struct Notify {
    int64_t slot = 0;
    double offset_seconds = 0;
    std::chrono::steady_clock::time_point deadline;
    std::function<void(bool)> ready;
  };

  explicit SlotClock(RingScheduler scheduler);
  void Run();
  // Under mu_: the notification's answer if it is due now (true: its slot
  // has begun; false: its deadline passed), or nothing.
  std::optional<bool> NotifyDue(const Notify& n, std::chrono::steady_clock::time_point now) const;
  // Under mu_: when the earliest notification may become due within the
  // current slot (the slot's end wakes the clock anyway).
  std::chrono::steady_clock::time_point NextNotifyTime() const;
  // Makes the due notifications (stopping: all, with false), releasing
  // `lock` while they run.
  void MakeDueNotifications(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  RingScheduler scheduler_;
  double slot_seconds_;
  std::chrono::steady_clock::time_point slot_start_;  // when the current slot began
  const bool lock_step_;
  bool stopping_ = false;
  PrefixPolicy prefixes_;
  std::map<NotifyId, Notify> notifies_;
  NotifyId next_notify_ = 1;
  bool notifies_changed_ = false;   // the clock's thread recomputes its wake-up
  std::condition_variable run_cv_;  // wakes the clock's thread
  std::atomic<int64_t> next_booking_id_{0};
  std::thread thread_;
};

}  // namespace vc::coordinator
