// The coordinator's wall-clock driver of the ring scheduler: slots advance on
// their own, waits end at their slot (or offset into it), at the deadline, or
// on Stop; bookings pass through to the policy; prefix joins expire with
// their verify slot, a joined booking lives until its last user is done, and
// many threads' link-only transfers (KV refresh) never overbook a paced
// link in any slot; SlotBegun agrees with the wait.
// Margins are generous: the suite runs on a loaded 2-core machine, so only
// orderings are asserted, never durations.
#include "services/coordinator/slot_clock.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace vc::coordinator {
namespace {

using Clock = std::chrono::steady_clock;

RingSchedulerOptions Options(double slot_seconds) {
  RingSchedulerOptions o;
  o.slot_seconds = slot_seconds;
  o.window_slots = 16;
  o.links = {RingLink{.name = "fast", .bytes_per_second = 1000.0}};
  o.gpus = {RingGpu{.name = "v0", .transient_capacity_bytes = 1 << 20}};
  return o;
}

TEST(SlotClockTest, SlotsAdvanceAndWaitsEndAtTheirSlot) {
  auto clock = std::move(SlotClock::Create(Options(0.005))).value();
  const int64_t start = clock->now();
  ASSERT_TRUE(clock->WaitForSlot(start + 3, Clock::now() + std::chrono::seconds(30)));
  EXPECT_GE(clock->now(), start + 3);
  // A slot already passed: no wait, with or without an offset.
  EXPECT_TRUE(clock->WaitForSlot(start, Clock::now() + std::chrono::seconds(30)));
  EXPECT_TRUE(clock->WaitForSlot(start, 0.004, Clock::now() + std::chrono::seconds(30)));
}

TEST(SlotClockTest, OffsetWaitEndsInsideTheSlotOrFailsAtTheDeadline) {
  // Long slots: the offset wait ends within the target slot.
  auto clock = std::move(SlotClock::Create(Options(10.0))).value();
  const int64_t now = clock->now();
  ASSERT_TRUE(clock->WaitForSlot(now, 0.01, Clock::now() + std::chrono::seconds(30)));
  EXPECT_EQ(clock->now(), now) << "the wait must not run into the next slot";
  // An offset past the deadline: false, without waiting for the offset.
  const auto deadline = Clock::now() + std::chrono::milliseconds(20);
  EXPECT_FALSE(clock->WaitForSlot(now, 9.9, deadline));
  EXPECT_GE(Clock::now(), deadline);
  EXPECT_EQ(clock->now(), now) << "returned at the deadline, not at the offset";
}

// SlotBegun says, without waiting, what WaitForSlot would wait for (the
// lease's runner polls it while it waits for a round's progress).
TEST(SlotClockTest, SlotBegunAgreesWithTheWait) {
  auto clock = std::move(SlotClock::Create(Options(10.0))).value();
  const int64_t now = clock->now();
  EXPECT_TRUE(clock->SlotBegun(now, 0));
  EXPECT_TRUE(clock->SlotBegun(now - 1, 5.0)) << "a later slot has begun";
  EXPECT_FALSE(clock->SlotBegun(now + 1, 0));
  EXPECT_FALSE(clock->SlotBegun(now, 9.9)) << "the offset is seconds away";
  ASSERT_TRUE(clock->WaitForSlot(now, 0.01, Clock::now() + std::chrono::seconds(30)));
  if (clock->now() == now) {
    EXPECT_TRUE(clock->SlotBegun(now, 0.01)) << "the wait for it has returned";
  }
}

// What a notification answered, and the slot the clock was in then.
struct Answer {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<bool> value;
  int64_t slot = -1;
  Clock::time_point at;
  std::function<void(bool)> Callback(const SlotClock* clock) {
    return [this, clock](bool v) {
      std::lock_guard<std::mutex> lock(mu);
      value = v;
      slot = clock->now();
      at = Clock::now();
      cv.notify_all();
    };
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return value.has_value(); });
    return value.value_or(false);
  }
};

TEST(SlotClockTest, NotificationsComeAtTheirSlotOrOffsetAsTheWaitsEnd) {
  auto clock = std::move(SlotClock::Create(Options(0.005))).value();
  const int64_t start = clock->now();
  Answer later;
  clock->NotifyAtSlot(start + 3, 0, Clock::now() + std::chrono::seconds(60),
                      later.Callback(clock.get()));
  ASSERT_TRUE(later.Wait());
  EXPECT_GE(later.slot, start + 3);
  // A slot that has begun: answered at once, on this thread.
  Answer begun;
  clock->NotifyAtSlot(start, 0.004, Clock::now() + std::chrono::seconds(60),
                      begun.Callback(clock.get()));
  EXPECT_EQ(begun.value, std::optional<bool>(true));

  // Long slots: an offset notification comes inside its slot; one whose
  // offset is past its deadline answers false at the deadline.
  auto slow = std::move(SlotClock::Create(Options(10.0))).value();
  const int64_t now = slow->now();
  Answer offset;
  slow->NotifyAtSlot(now, 0.01, Clock::now() + std::chrono::seconds(60),
                     offset.Callback(slow.get()));
  ASSERT_TRUE(offset.Wait());
  EXPECT_EQ(offset.slot, now) << "the notification must not run into the next slot";
  Answer missed;
  const auto deadline = Clock::now() + std::chrono::milliseconds(20);
  slow->NotifyAtSlot(now, 9.9, deadline, missed.Callback(slow.get()));
  EXPECT_FALSE(missed.Wait());
  EXPECT_GE(missed.at, deadline);
  EXPECT_EQ(missed.slot, now) << "answered at the deadline, not at the offset";
  Answer timer;
  const auto when = Clock::now() + std::chrono::milliseconds(10);
  slow->NotifyAt(when, timer.Callback(slow.get()));
  EXPECT_FALSE(timer.Wait());
  EXPECT_GE(timer.at, when);
}

TEST(SlotClockTest, ACancelledNotificationIsNeverMadeAndStopAnswersTheRestFalse) {
  auto clock = std::move(SlotClock::Create(Options(0.001))).value();
  std::atomic<int> cancelled_calls{0};
  const SlotClock::NotifyId id =
      clock->NotifyAtSlot(clock->now() + 20, 0, Clock::now() + std::chrono::seconds(60),
                          [&](bool) { ++cancelled_calls; });
  EXPECT_TRUE(clock->CancelNotify(id));
  EXPECT_FALSE(clock->CancelNotify(id)) << "gone already";
  Answer pending;
  clock->NotifyAtSlot(clock->now() + 1'000'000, 0, Clock::time_point::max(),
                      pending.Callback(clock.get()));
  ASSERT_TRUE(clock->WaitForSlot(clock->now() + 40, Clock::now() + std::chrono::seconds(60)));
  EXPECT_EQ(cancelled_calls.load(), 0);
  clock->Stop();
  EXPECT_FALSE(pending.Wait());
  ASSERT_TRUE(pending.value.has_value()) << "Stop answers every notification";
  // After Stop: answered false at once.
  Answer after;
  clock->NotifyAtSlot(0, 0, Clock::time_point::max(), after.Callback(clock.get()));
  EXPECT_EQ(after.value, std::optional<bool>(false));
}

TEST(SlotClockTest, StopEndsEveryWait) {
  auto clock = std::move(SlotClock::Create(Options(5.0))).value();
  bool far = true, offset = true;
  std::thread a([&] { far = clock->WaitForSlot(clock->now() + 100, Clock::now() + std::chrono::hours(1)); });
  std::thread b([&] { offset = clock->WaitForSlot(clock->now(), 4.0, Clock::now() + std::chrono::hours(1)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  clock->Stop();
  a.join();
  b.join();
  EXPECT_FALSE(far);
  EXPECT_FALSE(offset);
}

TEST(SlotClockTest, BookingsPackAndSharedPrefixesExpire) {
  // Slots long enough that the clock does not move during the test.
  auto clock = std::move(SlotClock::Create(Options(30.0))).value();
  const int64_t now = clock->now();
  // 10 s at 1000 B/s in 30 s slots: a third of a slot, issued 20 s in.
  auto a = clock->Admit({.id = 1, .full_kv_bytes = 10000, .target_offset = 4});
  ASSERT_TRUE(a.ok() && !a->queued);
  EXPECT_EQ(a->booking.verify_slot, now + 4);
  EXPECT_NEAR(a->booking.issue_offset_seconds, 20.0, 1e-9);
  // A second one packs into the same slot's leftover.
  auto b = clock->Admit({.id = 2, .full_kv_bytes = 10000, .target_offset = 4});
  ASSERT_TRUE(b.ok() && !b->queued);
  EXPECT_EQ(b->booking.first_slot(), a->booking.first_slot());
  clock->NoteShared("prefix", 0, a->booking);
  SlotClock::Shared shared;
  EXPECT_TRUE(clock->FindShared("prefix", 0, now + 10, &shared));
  EXPECT_EQ(shared.verify_slot, now + 4);
  EXPECT_FALSE(clock->FindShared("prefix", 0, now + 3, &shared)) << "verify later than allowed";
  EXPECT_FALSE(clock->FindShared("prefix", 1, now + 10, &shared)) << "another verifier";
  EXPECT_TRUE(clock->Release(1).ok());
  EXPECT_EQ(clock->Release(1).code(), absl::StatusCode::kNotFound);
}

// A round that joins a booking holds its memory too: the copy stays booked
// until the last of them has verified, whichever releases first.
TEST(SlotClockTest, AJoinedBookingKeepsItsMemoryUntilItsLastUserReleases) {
  RingSchedulerOptions o = Options(30.0);
  o.gpus = {RingGpu{.name = "v0", .transient_capacity_bytes = 1000}};
  auto clock = std::move(SlotClock::Create(o)).value();
  const int64_t now = clock->now();
  auto a = clock->Admit({.id = 1, .full_kv_bytes = 600, .target_offset = 2});
  ASSERT_TRUE(a.ok() && !a->queued);
  ASSERT_EQ(a->booking.verify_slot, now + 2);
  clock->NoteShared("prefix", 0, a->booking);
  SlotClock::Shared shared;
  ASSERT_TRUE(clock->FindShared("prefix", 0, now + 10, &shared));
  ASSERT_TRUE(clock->JoinShared(shared.booking_id));
  EXPECT_FALSE(clock->JoinShared(99)) << "no such booking";

  // The booking's own request is done; the joiner is not: 600 more bytes do
  // not fit beside the copy, so they go to a later verify slot.
  ASSERT_TRUE(clock->Release(1).ok());
  auto b = clock->Admit({.id = 2, .full_kv_bytes = 600, .target_offset = 2});
  ASSERT_TRUE(b.ok() && !b->queued);
  EXPECT_GT(b->booking.verify_slot, now + 2) << "the joined copy's memory was freed early";
  // The joiner's release frees it.
  ASSERT_TRUE(clock->Release(1).ok());
  EXPECT_EQ(clock->Release(1).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(clock->JoinShared(1)) << "gone";
  ASSERT_TRUE(clock->Release(2).ok());
  auto c = clock->Admit({.id = 3, .full_kv_bytes = 600, .target_offset = 2});
  ASSERT_TRUE(c.ok() && !c->queued);
  EXPECT_EQ(c->booking.verify_slot, now + 2);
}

TEST(SlotClockTest, ResidentPrefixesTakeMemoryFromTheRing) {
  RingSchedulerOptions o = Options(30.0);
  o.gpus = {RingGpu{.name = "v0", .transient_capacity_bytes = 1000},
            RingGpu{.name = "v1", .transient_capacity_bytes = 1000}};
  auto clock = std::move(SlotClock::Create(o)).value();
  // Two sessions decoding on v0 alone over one prefix hold one copy.
  clock->HoldResident("p", 0, 600);
  clock->HoldResident("p", 0, 600);
  EXPECT_EQ(clock->ResidentBytes(0), 600);
  EXPECT_EQ(clock->ResidentBytes(1), 0);
  // 500 bytes fit the verifier but not what the resident copy leaves: queued,
  // not refused (it fits once the copy goes).
  auto a = clock->Admit({.id = 1, .full_kv_bytes = 500, .target_offset = 3, .gpu = 0});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->queued);
  auto other = clock->Admit({.id = 2, .full_kv_bytes = 500, .target_offset = 3, .gpu = 1});
  ASSERT_TRUE(other.ok() && !other->queued) << "another verifier is unaffected";
  auto small = clock->Admit({.id = 3, .full_kv_bytes = 400, .target_offset = 3, .gpu = 0});
  ASSERT_TRUE(small.ok() && !small->queued);
  // More than the verifier could ever hold is still an error.
  EXPECT_EQ(clock->Admit({.id = 4, .full_kv_bytes = 1001, .gpu = 0}).status().code(),
            absl::StatusCode::kResourceExhausted);
  clock->ReleaseResident("p", 0);
  EXPECT_EQ(clock->ResidentBytes(0), 600) << "one holder left";
  clock->ReleaseResident("p", 0);
  EXPECT_EQ(clock->ResidentBytes(0), 0);
  ASSERT_TRUE(clock->Release(3).ok());
  a = clock->Admit({.id = 1, .full_kv_bytes = 500, .target_offset = 3, .gpu = 0});
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->queued);
  clock->ReleaseResident("unknown", 0);  // harmless
}

TEST(SlotClockTest, TransfersStartInTheCurrentSlotAndUnlimitedLinksBookNothing) {
  // Slots long enough that the clock does not move during the test.
  RingSchedulerOptions o = Options(30.0);
  o.links.push_back(RingLink{.name = "slow", .bytes_per_second = 0});
  auto clock = std::move(SlotClock::Create(o)).value();
  const int64_t now = clock->now();
  // 1 s at 1000 B/s: it fits in what is left of the current 30 s slot.
  auto paced = clock->BookTransfer(1, 1000, 0);
  ASSERT_TRUE(paced.ok()) << paced.status();
  EXPECT_EQ(paced->first_slot(), now);
  EXPECT_NEAR(clock->LinkOccupancy()[0], 1.0 / 30.0, 1e-9);
  auto unlimited = clock->BookTransfer(2, int64_t{1} << 40, 1);
  ASSERT_TRUE(unlimited.ok()) << unlimited.status();
  EXPECT_EQ(unlimited->first_slot(), now);
  EXPECT_EQ(clock->LinkOccupancy()[1], 0.0);
  EXPECT_TRUE(clock->WaitForSlot(unlimited->first_slot(), Clock::now() + std::chrono::seconds(30)));
  EXPECT_EQ(clock->BookTransfer(3, 10, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(clock->Release(1).ok());
  EXPECT_TRUE(clock->Release(2).ok());
  EXPECT_EQ(clock->stats().transfers, 2);
}

// Issue 14: eight threads book KV refreshes on a paced slow link as the
// runners do (book, wait for the first slot, release), 40 each, while the
// clock runs. The ring never books more than the link can carry in a slot:
// the occupancy each thread sees and the peak of every passed slot stay
// within one slot, and the link was used.
TEST(SlotClockTest, ConcurrentTransfersNeverOverbookAPacedLink) {
  constexpr double kT = 0.005;   // 5 ms slots
  constexpr double kBw = 200e3;  // 200 kB/s: 1000 bytes per slot
  RingSchedulerOptions o = Options(kT);
  o.links.push_back(RingLink{.name = "slow", .bytes_per_second = kBw});
  auto clock = std::move(SlotClock::Create(o)).value();
  constexpr int kThreads = 8, kEach = 40;
  std::vector<double> worst(kThreads, 0.0);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        // 1..5 tokens of 128 bytes: 128..640 bytes, up to 0.64 of a slot.
        const int64_t bytes = int64_t{128} * (1 + (t + i) % 5);
        const int64_t id = clock->NewBookingId();
        auto b = clock->BookTransfer(id, bytes, 1);
        if (!b.ok() ||
            !clock->WaitForSlot(b->first_slot(), Clock::now() + std::chrono::seconds(60))) {
          ++failures[t];
          continue;
        }
        worst[t] = std::max(worst[t], clock->LinkOccupancy()[1]);
        if (!clock->Release(id).ok()) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(clock->WaitForSlot(clock->now() + 2, Clock::now() + std::chrono::seconds(30)));
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_LE(worst[t], 1.0 + 1e-9) << "thread " << t;
  }
  const RingSchedulerStats st = clock->stats();
  EXPECT_EQ(st.transfers, kThreads * kEach);
  EXPECT_EQ(st.released, kThreads * kEach);
  EXPECT_GT(st.peak_slot_seconds[1], 0.0);
  EXPECT_LE(st.peak_slot_seconds[1] * kBw, kBw * kT * (1 + 1e-9)) << "bytes in the fullest slot";
  EXPECT_EQ(st.overrun_seconds[1], 0.0);
}

}  // namespace
}  // namespace vc::coordinator
