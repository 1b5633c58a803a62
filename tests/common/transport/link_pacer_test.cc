// Slot counters against hand-computed slots, and the pacer's guarantees:
// N bytes take at least N / bandwidth, no slot holds more than
// bandwidth * slot + one piece, deadlines and stop are honoured.
#include "common/transport/internal/link_pacer.h"

#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport::internal {
namespace {

using testing::HasCode;

TEST(SlotCountersTest, BytesLandInTheirSlots) {
  SlotCounters c(0.5, 8);
  c.Add(0.0, 10);
  c.Add(0.49, 5);
  c.Add(0.5, 7);
  c.Add(1.7, 3);  // slot 3
  LinkSlotCounters s = c.Snapshot();
  EXPECT_EQ(s.slot_seconds, 0.5);
  EXPECT_EQ(s.first_slot, 0);
  EXPECT_EQ(s.bytes_per_slot, (std::vector<int64_t>{15, 7, 0, 3}));
}

TEST(SlotCountersTest, HistoryIsBoundedAndOldBytesDropped) {
  SlotCounters c(1.0, 3);
  c.Add(0.5, 1);  // slot 0
  c.Add(2.5, 2);  // slot 2
  c.Add(3.5, 4);  // slot 3: slot 0 falls out
  LinkSlotCounters s = c.Snapshot();
  EXPECT_EQ(s.first_slot, 1);
  EXPECT_EQ(s.bytes_per_slot, (std::vector<int64_t>{0, 2, 4}));
  c.Add(0.2, 100);  // older than the history: dropped
  c.Add(1.2, 8);    // still kept
  s = c.Snapshot();
  EXPECT_EQ(s.bytes_per_slot, (std::vector<int64_t>{8, 2, 4}));
  c.Add(1000.0, 9);  // a long gap resets the window
  s = c.Snapshot();
  EXPECT_EQ(s.first_slot, 998);
  EXPECT_EQ(s.bytes_per_slot, (std::vector<int64_t>{0, 0, 9}));
}

TEST(SlotCountersTest, FirstSampleLateStartsTheWindowAtItsHistory) {
  SlotCounters c(1.0, 4);
  c.Add(10.5, 1);
  LinkSlotCounters s = c.Snapshot();
  EXPECT_EQ(s.first_slot, 7);
  EXPECT_EQ(s.bytes_per_slot, (std::vector<int64_t>{0, 0, 0, 1}));
}

TEST(LinkPacerTest, UnpacedCountsWithoutWaiting) {
  StopSignal stop;
  LinkPacer p(LinkPacing{}, Clock::now(), 0.05, 100);
  EXPECT_FALSE(p.paced());
  p.BeginResponse();
  ASSERT_TRUE(p.Acquire(1000, TimePoint::max(), stop).ok());
  ASSERT_TRUE(p.Acquire(24, TimePoint::max(), stop).ok());
  p.EndResponse();
  LinkStats st = p.Stats();
  EXPECT_EQ(st.bytes_total, 1024);
  EXPECT_EQ(st.fetches, 1);
  EXPECT_EQ(st.capacity_bytes_per_second, 0);
  int64_t sum = 0;
  for (int64_t b : st.slots.bytes_per_slot) sum += b;
  EXPECT_EQ(sum, 1024);
}

TEST(LinkPacerTest, InboundBytesShareTheLinkAndAreCountedApart) {
  StopSignal stop;
  LinkPacer p(LinkPacing{1e9, 0}, Clock::now(), 0.05, 100);
  p.BeginResponse(Exchange::kStage);
  ASSERT_TRUE(p.Acquire(1000, TimePoint::max(), stop, Flow::kIn).ok());
  ASSERT_TRUE(p.Acquire(24, TimePoint::max(), stop).ok());  // the answer goes out
  p.EndResponse();
  p.BeginResponse();
  ASSERT_TRUE(p.Acquire(500, TimePoint::max(), stop).ok());
  p.EndResponse();
  const LinkStats st = p.Stats();
  EXPECT_EQ(st.bytes_total, 1524);
  EXPECT_EQ(st.bytes_received, 1000);
  EXPECT_EQ(st.stages, 1);
  EXPECT_EQ(st.fetches, 1);
  EXPECT_NEAR(st.busy_seconds, 1524 / 1e9, 1e-12);
}

TEST(LinkPacerTest, PacedPiecesTakeAtLeastBytesOverBandwidthAndRespectTheSlotBound) {
  constexpr double kBandwidth = 2e6;
  constexpr int64_t kPiece = 20'000;
  constexpr double kSlot = 0.02;
  StopSignal stop;
  const TimePoint epoch = Clock::now();
  LinkPacer p(LinkPacing{kBandwidth, 0}, epoch, kSlot, 1000);
  // Two senders share the link: 2 x 20 pieces x 20 kB = 800 kB => >= 0.4 s.
  const auto start = Clock::now();
  std::vector<std::thread> senders;
  for (int t = 0; t < 2; ++t) {
    senders.emplace_back([&] {
      for (int i = 0; i < 20; ++i) ASSERT_TRUE(p.Acquire(kPiece, TimePoint::max(), stop).ok());
    });
  }
  for (auto& t : senders) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(elapsed, 40 * kPiece / kBandwidth - 1e-3);
  const LinkStats st = p.Stats();
  EXPECT_EQ(st.bytes_total, 40 * kPiece);
  EXPECT_NEAR(st.busy_seconds, 40 * kPiece / kBandwidth, 1e-9);
  const int64_t bound = static_cast<int64_t>(std::ceil(kBandwidth * kSlot)) + kPiece;
  int64_t sum = 0;
  for (int64_t b : st.slots.bytes_per_slot) {
    EXPECT_LE(b, bound);
    sum += b;
  }
  EXPECT_EQ(sum, st.bytes_total);
}

TEST(LinkPacerTest, DeadlineRefusesWithoutCounting) {
  StopSignal stop;
  LinkPacer p(LinkPacing{1000, 0}, Clock::now(), 0.05, 100);
  // 10 kB at 1 kB/s needs 10 s; the deadline is 50 ms away.
  EXPECT_TRUE(HasCode(p.Acquire(10'000, Clock::now() + std::chrono::milliseconds(50), stop),
                      absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(p.Stats().bytes_total, 0);
}

TEST(LinkPacerTest, StopWakesASleepingSender) {
  StopSignal stop;
  LinkPacer p(LinkPacing{1000, 0}, Clock::now(), 0.05, 100);
  absl::Status result;
  std::thread sender([&] { result = p.Acquire(100'000, TimePoint::max(), stop); });  // 100 s
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.Stop();
  sender.join();
  EXPECT_TRUE(HasCode(result, absl::StatusCode::kCancelled));
  EXPECT_TRUE(stop.stopped());
  EXPECT_FALSE(stop.SleepUntil(Clock::now() + std::chrono::hours(1)));
}

}  // namespace
}  // namespace vc::transport::internal
