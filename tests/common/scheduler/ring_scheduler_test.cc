// The ring scheduler as a pure policy: admission order x, x+1, x-1, ...,
// reload span sizes, ring capacities never exceeded (property test over
// random admits, releases and advances), queueing, long reloads booked past
// the window, shared vs per-verifier links, lock-step vs staggered on
// the review's example (B=10, 4 GB full KV, 64 GB/s), and link-only
// transfers (KV refresh): earliest placement, release, and a paced link
// never overbooked by them (property test).
#include "common/scheduler/ring_scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace vc {
namespace {

// The paper's model (whole-slot spans, no packing) unless `pack` is given.
RingSchedulerOptions Options(double slot_seconds, int window, double bw, int64_t capacity,
                             bool lock_step = false, bool pack = false) {
  RingSchedulerOptions o;
  o.slot_seconds = slot_seconds;
  o.window_slots = window;
  o.lock_step = lock_step;
  o.pack_reloads = pack;
  o.links = {RingLink{.name = "pcie", .bytes_per_second = bw}};
  o.gpus = {RingGpu{.name = "gpu0", .transient_capacity_bytes = capacity}};
  return o;
}

RingScheduler Make(const RingSchedulerOptions& o) {
  auto s = RingScheduler::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

Booking MustBook(RingScheduler& s, const AdmitRequest& r) {
  auto a = s.Admit(r);
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->queued) << "request " << r.id;
  return a->booking;
}

TEST(RingSchedulerTest, TriesTargetThenLaterThenEarlier) {
  // Each reload takes exactly one slot of the link, so two reloads cannot
  // share a slot: the k-th request lands on x, x+1, x-1, x+2, x-2, ...
  RingScheduler s = Make(Options(1.0, 32, 100.0, 1 << 30));
  const std::vector<int64_t> expected = {10, 11, 9, 12, 8, 13, 7};
  for (size_t i = 0; i < expected.size(); ++i) {
    const Booking b =
        MustBook(s, {.id = static_cast<int64_t>(i), .full_kv_bytes = 100, .target_offset = 10});
    EXPECT_EQ(b.verify_slot, expected[i]) << "request " << i;
    EXPECT_EQ(b.reload_slots, 1);
    EXPECT_EQ(b.first_slot(), b.verify_slot - 1);
  }
}

TEST(RingSchedulerTest, SpanSizes) {
  RingScheduler s = Make(Options(0.5, 64, 1000.0, 1 << 30));
  // 1250 bytes at 1000 B/s = 1.25 s = 2.5 slots -> S = 3, shares .5 .5 .25.
  Booking b = MustBook(s, {.id = 1, .full_kv_bytes = 1250, .target_offset = 10});
  EXPECT_EQ(b.reload_slots, 3);
  EXPECT_EQ(b.verify_slot, 10);
  EXPECT_EQ(b.first_slot(), 7);
  ASSERT_EQ(b.slot_seconds.size(), 3u);
  EXPECT_DOUBLE_EQ(b.slot_seconds[0], 0.5);
  EXPECT_DOUBLE_EQ(b.slot_seconds[1], 0.5);
  EXPECT_DOUBLE_EQ(b.slot_seconds[2], 0.25);
  EXPECT_DOUBLE_EQ(b.transfer_seconds, 1.25);
  for (int64_t slot = 7; slot <= 10; ++slot) EXPECT_EQ(s.MemoryBooked(0, slot), 1250) << slot;
  EXPECT_EQ(s.MemoryBooked(0, 6), 0);
  EXPECT_EQ(s.MemoryBooked(0, 11), 0);
  EXPECT_DOUBLE_EQ(s.LinkBooked(0, 9), 0.25);
  EXPECT_DOUBLE_EQ(s.LinkBooked(0, 10), 0.0);
  // Exactly two slots of transfer -> S = 2; a tiny one -> S = 1.
  EXPECT_EQ(s.ReloadSlots(1000, 0), 2);
  EXPECT_EQ(s.ReloadSlots(1, 0), 1);
  EXPECT_EQ(s.ReloadSlots(0, 0), 1);
  // Unlimited bandwidth: S = 1 and nothing booked on the link.
  RingScheduler u = Make(Options(0.5, 64, 0.0, 1 << 30));
  b = MustBook(u, {.id = 1, .full_kv_bytes = 1 << 20, .target_offset = 5});
  EXPECT_EQ(b.reload_slots, 1);
  EXPECT_DOUBLE_EQ(u.LinkBooked(0, 4), 0.0);
  // Recalibration changes S for later admissions.
  ASSERT_TRUE(s.SetSlotSeconds(0.25).ok());
  EXPECT_EQ(s.ReloadSlots(1250, 0), 5);
}

TEST(RingSchedulerTest, ClampsToSpanAndWindowAndMinOffset) {
  RingScheduler s = Make(Options(1.0, 16, 100.0, 1 << 30));
  // S = 3: the earliest verify offset is S + 1 = 4.
  EXPECT_EQ(MustBook(s, {.id = 1, .full_kv_bytes = 300, .target_offset = 0}).verify_slot, 4);
  // Past the window: clamped to W - 1.
  EXPECT_EQ(MustBook(s, {.id = 2, .full_kv_bytes = 100, .target_offset = 100}).verify_slot, 15);
  // min_offset = target = W - 1, whose reload slot is taken: nothing earlier
  // may be tried, so it queues.
  auto a = s.Admit({.id = 3, .full_kv_bytes = 100, .target_offset = 15, .min_offset = 15});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->queued);
  EXPECT_EQ(MustBook(s, {.id = 4, .full_kv_bytes = 100, .target_offset = 14, .min_offset = 14})
                .verify_slot,
            14);
}

TEST(RingSchedulerTest, MinOffsetNeverGoesEarlier) {
  RingScheduler s = Make(Options(1.0, 32, 100.0, 1 << 30));
  MustBook(s, {.id = 1, .full_kv_bytes = 100, .target_offset = 10});
  // 10 is taken; with min_offset 10 the next is 11, never 9.
  EXPECT_EQ(MustBook(s, {.id = 2, .full_kv_bytes = 100, .target_offset = 10, .min_offset = 10})
                .verify_slot,
            11);
  EXPECT_EQ(MustBook(s, {.id = 3, .full_kv_bytes = 100, .target_offset = 10, .min_offset = 10})
                .verify_slot,
            12);
}

TEST(RingSchedulerTest, QueuesWhenFullAndRetriesNextSlot) {
  // W = 8, one slot of transfer each: offsets 2..7 -> six reloads fit.
  RingScheduler s = Make(Options(1.0, 8, 100.0, 1 << 30));
  for (int i = 0; i < 6; ++i) MustBook(s, {.id = i, .full_kv_bytes = 100, .target_offset = 4});
  auto a = s.Admit({.id = 6, .full_kv_bytes = 100, .target_offset = 4});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->queued);
  EXPECT_EQ(s.Find(6), nullptr);
  EXPECT_EQ(s.stats().queued, 1);
  s.Advance();  // a new slot enters the window
  const Booking b = MustBook(s, {.id = 6, .full_kv_bytes = 100, .target_offset = 4});
  EXPECT_EQ(b.verify_slot, 8);  // now = 1, offset 7
  // Releasing frees the slots for others.
  ASSERT_TRUE(s.Release(3).ok());
  EXPECT_EQ(s.Release(3).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(s.Admit({.id = 7, .full_kv_bytes = 100, .target_offset = 4})->queued);
}

TEST(RingSchedulerTest, MemoryRingQueues) {
  // Unlimited link; memory for two full KVs at a time.
  RingScheduler s = Make(Options(1.0, 6, 0.0, 200));
  MustBook(s, {.id = 1, .full_kv_bytes = 100, .target_offset = 3});
  MustBook(s, {.id = 2, .full_kv_bytes = 100, .target_offset = 3});
  // Spans are [d-1, d]; offsets 2..5. Two at offset 3 ([2,3]); a third at
  // 5 ([4,5]) fits, then 4 cannot ([3,4] overlaps 3).
  EXPECT_EQ(MustBook(s, {.id = 3, .full_kv_bytes = 100, .target_offset = 3}).verify_slot, 5);
  EXPECT_EQ(MustBook(s, {.id = 4, .full_kv_bytes = 100, .target_offset = 3}).verify_slot, 5);
  auto a = s.Admit({.id = 5, .full_kv_bytes = 100, .target_offset = 3});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->queued);
  // Never fits: an error, not an endless queue.
  EXPECT_EQ(s.Admit({.id = 6, .full_kv_bytes = 201, .target_offset = 3}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.PeakMemoryBooked(0), 200);
}

TEST(RingSchedulerTest, LongReloadIsBookedPastTheWindow) {
  RingScheduler s = Make(Options(1.0, 8, 100.0, 1 << 30));
  // Fill the window's link with short reloads.
  for (int i = 0; i < 6; ++i) MustBook(s, {.id = i, .full_kv_bytes = 100, .target_offset = 4});
  // 20 slots of transfer: S + 1 = 21 > W - 1.
  const Booking a = MustBook(s, {.id = 100, .full_kv_bytes = 2000, .target_offset = 4});
  EXPECT_TRUE(a.beyond_window);
  EXPECT_EQ(a.reload_slots, 20);
  EXPECT_GE(a.first_slot(), 7);  // after the short reloads' link slots (1..6)
  EXPECT_EQ(a.verify_slot, a.first_slot() + 20);
  // A second long one goes after the first's link slots.
  const Booking b = MustBook(s, {.id = 101, .full_kv_bytes = 2000, .target_offset = 4});
  EXPECT_GE(b.first_slot(), a.verify_slot);
  EXPECT_EQ(s.stats().beyond_window, 2);
  // The rings never exceed their limits anywhere.
  for (int64_t slot = 0; slot < b.verify_slot + 2; ++slot)
    EXPECT_LE(s.LinkBooked(0, slot), 1.0 + 1e-9);
  // Advancing into the booking keeps its accounting consistent on release.
  s.Advance(10);
  ASSERT_TRUE(s.Release(100).ok());
  ASSERT_TRUE(s.Release(101).ok());
  for (int64_t slot = s.now(); slot < s.now() + 80; ++slot) {
    EXPECT_EQ(s.MemoryBooked(0, slot), 0) << slot;
  }
}

TEST(RingSchedulerTest, SharedAndPerVerifierLinks) {
  RingSchedulerOptions o = Options(1.0, 16, 100.0, 1 << 30);
  o.gpus.push_back(RingGpu{.name = "gpu1", .transient_capacity_bytes = 1 << 30});
  // Shared (the default): reloads into different GPUs still serialise.
  {
    RingScheduler s = Make(o);
    const Booking a = MustBook(s, {.id = 1, .full_kv_bytes = 100, .target_offset = 5, .gpu = 0});
    const Booking b = MustBook(s, {.id = 2, .full_kv_bytes = 100, .target_offset = 5, .gpu = 1});
    EXPECT_NE(a.first_slot(), b.first_slot());
  }
  // One dedicated link per verifier: both reloads may stream in the same slot.
  o.links = {RingLink{.name = "nic0",
                      .bytes_per_second = 100.0,
                      .sharing = RingLink::Sharing::kPerVerifier,
                      .gpu = 0},
             RingLink{.name = "nic1",
                      .bytes_per_second = 100.0,
                      .sharing = RingLink::Sharing::kPerVerifier,
                      .gpu = 1}};
  RingScheduler s = Make(o);
  const Booking a =
      MustBook(s, {.id = 1, .full_kv_bytes = 100, .target_offset = 5, .link = 0, .gpu = 0});
  const Booking b =
      MustBook(s, {.id = 2, .full_kv_bytes = 100, .target_offset = 5, .link = 1, .gpu = 1});
  EXPECT_EQ(a.first_slot(), b.first_slot());
  EXPECT_EQ(s.Admit({.id = 3, .full_kv_bytes = 100, .target_offset = 5, .link = 0, .gpu = 1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RingSchedulerTest, RejectsBadInput) {
  EXPECT_FALSE(RingScheduler::Create(Options(0.0, 16, 1, 1)).ok());
  EXPECT_FALSE(RingScheduler::Create(Options(1.0, 2, 1, 1)).ok());
  EXPECT_FALSE(RingScheduler::Create(Options(1.0, 16, 1, 0)).ok());
  RingScheduler s = Make(Options(1.0, 16, 100.0, 1000));
  EXPECT_EQ(s.Admit({.id = 1, .full_kv_bytes = 10, .link = 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Admit({.id = 1, .full_kv_bytes = 10, .gpu = 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  MustBook(s, {.id = 1, .full_kv_bytes = 10, .target_offset = 4});
  EXPECT_EQ(s.Admit({.id = 1, .full_kv_bytes = 10, .target_offset = 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(s.SetSlotSeconds(-1).ok());
  EXPECT_FALSE(s.SetMemoryCapacity(5, 1).ok());
}

// Random admits, releases, advances and recalibration-free operation: the
// link never holds more than a slot of transfer per slot, memory never more
// than its capacity, and the rings always equal the sum of the live bookings.
TEST(RingSchedulerTest, PropertyRingsNeverExceeded) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    std::mt19937_64 rng(seed);
    RingSchedulerOptions o;
    o.pack_reloads = seed % 2 == 0;
    o.slot_seconds = 0.01;
    o.window_slots = 24;
    o.links = {RingLink{.name = "a", .bytes_per_second = 1e6},
               RingLink{.name = "b", .bytes_per_second = 3e5}};
    o.gpus = {RingGpu{.name = "g0", .transient_capacity_bytes = 60000},
              RingGpu{.name = "g1", .transient_capacity_bytes = 25000}};
    RingScheduler s = Make(o);
    int64_t next_id = 0;
    std::vector<int64_t> live;
    for (int op = 0; op < 3000; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 5) {
        AdmitRequest r;
        r.id = next_id++;
        r.link = static_cast<int>(rng() % 2);
        r.gpu = static_cast<int>(rng() % 2);
        r.full_kv_bytes = 1000 + static_cast<int64_t>(rng() % 24000);
        r.target_offset = static_cast<int>(rng() % 30);
        r.min_offset = static_cast<int>(rng() % 4) == 0 ? r.target_offset : 1;
        const int64_t now = s.now();
        auto a = s.Admit(r);
        ASSERT_TRUE(a.ok()) << a.status();
        if (!a->queued) {
          const Booking& b = a->booking;
          live.push_back(r.id);
          EXPECT_GT(b.first_slot(), now);
          EXPECT_GE(b.verify_slot - now, std::max(b.reload_slots + 1, r.min_offset));
          // Every booked slot carries transfer: a reload never pauses.
          for (double share : b.slot_seconds) EXPECT_GT(share, 0.0);
          double sum = 0;
          for (double share : b.slot_seconds) sum += share;
          EXPECT_NEAR(sum, b.transfer_seconds, 1e-9);
          EXPECT_NEAR(b.issue_offset_seconds, o.pack_reloads ? o.slot_seconds - b.slot_seconds[0] : 0.0, 1e-9);
          if (!b.beyond_window) {
            EXPECT_LE(b.verify_slot - now, o.window_slots - 1);
          }
        }
      } else if (kind < 7 && !live.empty()) {
        const size_t i = rng() % live.size();
        ASSERT_TRUE(s.Release(live[i]).ok());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        s.Advance(1 + static_cast<int64_t>(rng() % 2));
      }
      // Check every tracked slot against the limits and the live bookings.
      std::map<std::pair<int, int64_t>, double> link_sum;
      std::map<std::pair<int, int64_t>, int64_t> mem_sum;
      int64_t horizon = s.now();
      for (const auto& [id, b] : s.bookings()) {
        for (int i = 0; i < b.reload_slots; ++i) {
          if (b.first_slot() + i >= s.now())
            link_sum[{b.link, b.first_slot() + i}] += b.slot_seconds[i];
        }
        for (int64_t slot = std::max(s.now(), b.first_slot()); slot <= b.verify_slot; ++slot) {
          mem_sum[{b.gpu, slot}] += b.full_kv_bytes;
        }
        horizon = std::max(horizon, b.verify_slot + 1);
      }
      for (int64_t slot = s.now(); slot < horizon; ++slot) {
        for (int l = 0; l < 2; ++l) {
          const double booked = s.LinkBooked(l, slot);
          ASSERT_LE(booked, o.slot_seconds * (1 + 1e-6)) << "seed " << seed << " op " << op;
          const double expected = link_sum[std::make_pair(l, slot)];
          ASSERT_NEAR(booked, expected, 1e-9);
        }
        for (int g = 0; g < 2; ++g) {
          const int64_t booked = s.MemoryBooked(g, slot);
          ASSERT_LE(booked, o.gpus[g].transient_capacity_bytes) << "seed " << seed << " op " << op;
          const int64_t expected = mem_sum[std::make_pair(g, slot)];
          ASSERT_EQ(booked, expected);
        }
      }
    }
    EXPECT_GT(s.stats().admitted, 500);
    EXPECT_GT(s.stats().queued, 0);  // the rings did fill up
    for (double overrun : s.stats().overrun_seconds) EXPECT_NEAR(overrun, 0.0, 1e-6);
  }
}

// The review's example: B = 10 requests with 4 GB of full KV each over a
// 64 GB/s PCIe link (62.5 ms per reload), a 35 ms iteration, draft length 30.
// Lock-step books every reload on the same slots: 625 ms of serialised
// transfer in the reload window, ~18x the iteration (the review rounds each
// transfer to 80 ms and says ~20x), and 40 GB of transient KV at once.
// Staggered keeps every slot within one iteration of transfer and at most
// two full KVs resident.
TEST(RingSchedulerTest, LockStepVersusStaggeredOnTheReviewExample) {
  constexpr int kB = 10;
  constexpr int64_t kFull = 4'000'000'000;
  constexpr double kBw = 64e9, kT = 0.035;
  struct Result {
    double max_slot_seconds = 0, total_seconds = 0, overrun = 0;
    int64_t peak_memory = 0;
    std::vector<int64_t> verify_slots;
  };
  auto run = [&](bool lock_step) {
    RingScheduler s = Make(Options(kT, 64, kBw, 100'000'000'000, lock_step));
    Result r;
    for (int i = 0; i < kB; ++i) {
      const Booking b = MustBook(s, {.id = i, .full_kv_bytes = kFull, .target_offset = 30});
      EXPECT_EQ(b.reload_slots, 2);
      r.verify_slots.push_back(b.verify_slot);
    }
    for (int64_t slot = 0; slot < 64; ++slot) {
      r.max_slot_seconds = std::max(r.max_slot_seconds, s.LinkBooked(0, slot));
      r.total_seconds += s.LinkBooked(0, slot);
      r.peak_memory = std::max(r.peak_memory, s.MemoryBooked(0, slot));
    }
    s.Advance(64);
    r.overrun = s.stats().overrun_seconds[0];
    EXPECT_EQ(s.stats().peak_memory_bytes[0], r.peak_memory);
    return r;
  };
  const Result lock = run(true);
  const Result stag = run(false);
  // Lock-step: all ten verify together, 10 x 62.5 ms on two slots.
  for (int64_t d : lock.verify_slots) EXPECT_EQ(d, 30);
  EXPECT_NEAR(lock.total_seconds, 0.625, 1e-9);
  EXPECT_GT(lock.total_seconds / kT, 17.0);  // serialised transfer ~18 iteration windows
  EXPECT_NEAR(lock.max_slot_seconds, 10 * kT, 1e-9);
  EXPECT_NEAR(lock.overrun, 0.625 - 2 * kT, 1e-9);
  EXPECT_EQ(lock.peak_memory, kB * kFull);
  // Staggered: the same transfer, never more than one iteration per slot.
  EXPECT_NEAR(stag.total_seconds, 0.625, 1e-9);
  EXPECT_LE(stag.max_slot_seconds, kT * (1 + 1e-9));
  EXPECT_NEAR(stag.overrun, 0.0, 1e-12);
  EXPECT_LE(stag.peak_memory, 2 * kFull);
  std::vector<int64_t> sorted = stag.verify_slots;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());  // all distinct
  EXPECT_EQ(stag.verify_slots[0], 30);
  // Lock-step's peak slot holds 10x what staggered's does; 5x the memory.
  EXPECT_GE(lock.max_slot_seconds / stag.max_slot_seconds, 9.9);
  EXPECT_GE(lock.peak_memory / stag.peak_memory, 5);
}

TEST(RingSchedulerTest, PackedReloadsFillTheLink) {
  // 31 ms reloads in 48 ms slots (the simulator's finding): without packing
  // each reload owns a slot and the link idles 35% of the time; packed, a
  // reload starts in the leftover of the slot before and the link is full.
  constexpr double kT = 0.048, kBw = 1000.0;
  constexpr int64_t kBytes = 31;  // 31 ms at 1000 B/s
  auto fill = [&](bool pack) {
    RingScheduler s = Make(Options(kT, 64, kBw, 1 << 30, false, pack));
    for (int i = 0; i < 200; ++i) {
      if (s.Admit({.id = i, .full_kv_bytes = kBytes, .target_offset = 10})->queued) break;
    }
    double booked = 0;
    for (int64_t slot = 1; slot < 64; ++slot) booked += s.LinkBooked(0, slot);
    return std::make_pair(s.stats().admitted, booked / (63 * kT));
  };
  const auto [plain_admitted, plain_use] = fill(false);
  const auto [packed_admitted, packed_use] = fill(true);
  EXPECT_EQ(plain_admitted, 62);  // one per slot, offsets 2..63
  EXPECT_NEAR(plain_use, 31.0 / 48.0 * 62 / 63, 1e-9);
  EXPECT_GT(packed_use, 0.9);
  EXPECT_GE(packed_admitted, 90);
  // Just in time: a packed reload ends as its verify slot begins.
  RingScheduler s = Make(Options(kT, 64, kBw, 1 << 30, false, true));
  const Booking a = MustBook(s, {.id = 1, .full_kv_bytes = kBytes, .target_offset = 10});
  EXPECT_EQ(a.verify_slot, 10);
  EXPECT_EQ(a.reload_slots, 1);
  EXPECT_NEAR(a.issue_offset_seconds, 0.017, 1e-9);
  // The next one due at 10 streams in the 17 ms left in slot 9, the other
  // 14 ms at the end of slot 8.
  const Booking b = MustBook(s, {.id = 2, .full_kv_bytes = kBytes, .target_offset = 10});
  EXPECT_EQ(b.verify_slot, 10);
  ASSERT_EQ(b.reload_slots, 2);
  EXPECT_NEAR(b.slot_seconds[0], 0.014, 1e-9);
  EXPECT_NEAR(b.slot_seconds[1], 0.017, 1e-9);
  EXPECT_NEAR(b.issue_offset_seconds, 0.034, 1e-9);
  EXPECT_NEAR(s.LinkBooked(0, 9), 0.048, 1e-9);
  // Slot 9 is full: a third one due at 10 would have to pause there, so it
  // verifies at 11 with its transfer in slot 10.
  const Booking c =
      MustBook(s, {.id = 3, .full_kv_bytes = kBytes, .target_offset = 10, .min_offset = 10});
  EXPECT_EQ(c.verify_slot, 11);
  EXPECT_EQ(c.first_slot(), 10);
  // Memory spans: b [8, 10], a [9, 10], c [10, 11].
  EXPECT_EQ(s.MemoryBooked(0, 8), kBytes);
  EXPECT_EQ(s.MemoryBooked(0, 9), 2 * kBytes);
  EXPECT_EQ(s.MemoryBooked(0, 10), 3 * kBytes);
  EXPECT_EQ(s.MemoryBooked(0, 11), kBytes);
}

TEST(RingSchedulerTest, LockStepRespectsMemory) {
  // Memory for two full KVs: a lock-step round of six verifies in pairs,
  // each pair after the previous pair's span; the link limit is ignored.
  RingScheduler s = Make(Options(1.0, 64, 100.0, 200, /*lock_step=*/true));
  std::vector<int64_t> d;
  for (int i = 0; i < 6; ++i)
    d.push_back(MustBook(s, {.id = i, .full_kv_bytes = 100, .target_offset = 10}).verify_slot);
  EXPECT_EQ(d, (std::vector<int64_t>{10, 10, 12, 12, 14, 14}));
  EXPECT_DOUBLE_EQ(s.LinkBooked(0, 9), 2.0);             // two reloads in one slot: overrun
  EXPECT_NEAR(s.stats().overrun_seconds[0], 3.0, 1e-9);  // one extra slot per pair
  for (int64_t slot = 0; slot < 20; ++slot) EXPECT_LE(s.MemoryBooked(0, slot), 200);
  // A request admitted after the round's slot is out of reach opens a new round.
  s.Advance(9);
  EXPECT_EQ(MustBook(s, {.id = 10, .full_kv_bytes = 50, .target_offset = 10}).verify_slot, 19);
  EXPECT_EQ(MustBook(s, {.id = 11, .full_kv_bytes = 50, .target_offset = 3}).verify_slot, 19);
}

TEST(RingSchedulerTest, TransfersStartInWhatIsLeftOfTheCurrentSlot) {
  // 100 B/s in 1 s slots: 100 bytes fill a slot.
  RingScheduler s = Make(Options(1.0, 16, 100.0, 1 << 30));
  // A quarter of the current slot has run: 50 bytes fit in the rest of it.
  auto a = s.BookTransfer({.id = 1, .bytes = 50, .link = 0, .elapsed_seconds = 0.25});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->transfer_only);
  EXPECT_EQ(a->first_slot(), 0);
  ASSERT_EQ(a->reload_slots, 1);
  EXPECT_NEAR(a->slot_seconds[0], 0.5, 1e-9);
  // The next 50 bytes: the quarter left now, the rest in slot 1.
  auto b = s.BookTransfer({.id = 2, .bytes = 50, .link = 0, .elapsed_seconds = 0.25});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->first_slot(), 0);
  ASSERT_EQ(b->reload_slots, 2);
  EXPECT_NEAR(b->slot_seconds[0], 0.25, 1e-9);
  EXPECT_NEAR(b->slot_seconds[1], 0.25, 1e-9);
  EXPECT_EQ(b->verify_slot, 2) << "the slot after its last";
  // The current slot is full: 100 bytes start in slot 1 and spill into 2.
  auto c = s.BookTransfer({.id = 3, .bytes = 100, .link = 0, .elapsed_seconds = 0.5});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->first_slot(), 1);
  ASSERT_EQ(c->reload_slots, 2);
  EXPECT_NEAR(c->slot_seconds[0], 0.75, 1e-9);
  EXPECT_NEAR(c->slot_seconds[1], 0.25, 1e-9);
  EXPECT_NEAR(s.LinkBooked(0, 0), 0.75, 1e-9);
  EXPECT_NEAR(s.LinkBooked(0, 1), 1.0, 1e-9);
  EXPECT_NEAR(s.LinkBooked(0, 2), 0.25, 1e-9);
  // No GPU memory anywhere.
  for (int64_t slot = 0; slot < 4; ++slot) EXPECT_EQ(s.MemoryBooked(0, slot), 0);
  EXPECT_EQ(s.stats().transfers, 3);
  EXPECT_EQ(s.stats().admitted, 0) << "transfers are not verifies";
}

TEST(RingSchedulerTest, TransfersStreamPastAFullSlot) {
  // An unpacked reload of a whole slot fills slot 4 (verify slot 5).
  RingScheduler s = Make(Options(1.0, 16, 100.0, 1 << 30));
  const Booking r = MustBook(s, {.id = 1, .full_kv_bytes = 100, .target_offset = 5});
  ASSERT_EQ(r.first_slot(), 4);
  // Slots 0..3 take 3.5 s of transfers; a 1 s transfer then has 0.5 s of
  // slot 3, nothing in 4, and 0.5 s of slot 5.
  ASSERT_TRUE(s.BookTransfer({.id = 2, .bytes = 350, .link = 0}).ok());
  auto t = s.BookTransfer({.id = 3, .bytes = 100, .link = 0});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->first_slot(), 3);
  EXPECT_EQ(t->slot_seconds, (std::vector<double>{0.5, 0.0, 0.5}));
  for (int64_t slot = 0; slot < 8; ++slot) EXPECT_LE(s.LinkBooked(0, slot), 1.0 + 1e-9);
}

TEST(RingSchedulerTest, AnUnlimitedLinkBooksNoTransferTime) {
  RingSchedulerOptions o = Options(1.0, 16, 100.0, 1 << 30);
  o.links.push_back(RingLink{.name = "unlimited", .bytes_per_second = 0});
  RingScheduler s = Make(o);
  s.Advance(3);
  auto t = s.BookTransfer({.id = 1, .bytes = int64_t{1} << 40, .link = 1, .elapsed_seconds = 0.9});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->first_slot(), 3) << "starts now";
  EXPECT_EQ(t->transfer_seconds, 0.0);
  EXPECT_EQ(s.LinkBooked(1, 3), 0.0);
  EXPECT_TRUE(s.Release(1).ok());
}

// A transfer booked at an upper bound (a peer round's KV refresh, sized only
// once verified) keeps the time its bytes took from its start and gives the
// rest back where it is still ahead.
TEST(RingSchedulerTest, AShrunkTransferKeepsOnlyTheTimeItsBytesTook) {
  RingScheduler s = Make(Options(1.0, 16, 100.0, 1 << 30));
  s.Advance(1);
  auto a = s.BookTransfer({.id = 1, .bytes = 250, .link = 0});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->first_slot(), 1);
  EXPECT_EQ(a->slot_seconds, (std::vector<double>{1.0, 1.0, 0.5}));
  s.Advance(1);  // started: its first slot is over
  // 120 bytes: 1.2 s, all of slot 1 (past) and 0.2 s of slot 2.
  ASSERT_TRUE(s.ShrinkTransfer(1, 120).ok());
  EXPECT_NEAR(s.LinkBooked(0, 2), 0.2, 1e-9);
  EXPECT_EQ(s.LinkBooked(0, 3), 0.0);
  EXPECT_NEAR(s.Find(1)->transfer_seconds, 1.2, 1e-9);
  // The freed time goes to the next transfer at once.
  auto b = s.BookTransfer({.id = 2, .bytes = 100, .link = 0});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->first_slot(), 2);
  EXPECT_NEAR(b->slot_seconds[0], 0.8, 1e-9);
  // Never grown, never negative; only transfers shrink.
  EXPECT_EQ(s.ShrinkTransfer(1, 121).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ShrinkTransfer(1, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ShrinkTransfer(9, 0).code(), absl::StatusCode::kNotFound);
  MustBook(s, {.id = 3, .full_kv_bytes = 100, .target_offset = 4});
  EXPECT_EQ(s.ShrinkTransfer(3, 0).code(), absl::StatusCode::kInvalidArgument);
  // Nothing sent: all of it that is ahead is free; a release after a shrink
  // keeps what the transfer kept.
  ASSERT_TRUE(s.ShrinkTransfer(2, 0).ok());
  EXPECT_NEAR(s.LinkBooked(0, 2), 0.2, 1e-9);
  ASSERT_TRUE(s.Release(1).ok());
  EXPECT_NEAR(s.LinkBooked(0, 2), 0.2, 1e-9);
}

TEST(RingSchedulerTest, ReleasingATransferKeepsTheTimeItHasUsed) {
  RingScheduler s = Make(Options(1.0, 16, 100.0, 1 << 30));
  s.Advance(1);
  // Slot 1 (the current one) is filled by a transfer issued now.
  ASSERT_TRUE(s.BookTransfer({.id = 1, .bytes = 100, .link = 0}).ok());
  // Not started yet (it begins in slot 2): everything is freed.
  ASSERT_TRUE(s.BookTransfer({.id = 2, .bytes = 50, .link = 0}).ok());
  EXPECT_EQ(s.Find(2)->first_slot(), 2);
  EXPECT_NEAR(s.LinkBooked(0, 2), 0.5, 1e-9);
  ASSERT_TRUE(s.Release(2).ok());
  EXPECT_EQ(s.LinkBooked(0, 2), 0.0);
  // Released once it has started (however early its sender heard back):
  // its bytes are on the link for the time booked, so every slot keeps its
  // share and the next transfer queues behind it.
  ASSERT_TRUE(s.BookTransfer({.id = 3, .bytes = 150, .link = 0}).ok());
  EXPECT_EQ(s.Find(3)->first_slot(), 2);
  s.Advance(1);
  ASSERT_TRUE(s.Release(3).ok());
  EXPECT_NEAR(s.LinkBooked(0, 2), 1.0, 1e-9);
  EXPECT_NEAR(s.LinkBooked(0, 3), 0.5, 1e-9);
  EXPECT_EQ(s.Find(3), nullptr);
  EXPECT_EQ(s.Release(3).code(), absl::StatusCode::kNotFound);
  auto next = s.BookTransfer({.id = 4, .bytes = 100, .link = 0});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->first_slot(), 3);
  EXPECT_EQ(next->slot_seconds, (std::vector<double>{0.5, 0.5}));
  ASSERT_TRUE(s.Release(1).ok());
  s.Advance(3);
  EXPECT_NEAR(s.stats().peak_slot_seconds[0], 1.0, 1e-9);
  EXPECT_EQ(s.stats().released, 3);
}

TEST(RingSchedulerTest, TransfersRejectBadInput) {
  RingScheduler s = Make(Options(1.0, 16, 100.0, 1 << 30));
  EXPECT_EQ(s.BookTransfer({.id = 1, .bytes = 10, .link = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.BookTransfer({.id = 1, .bytes = -1, .link = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.BookTransfer({.id = 1, .bytes = 1, .elapsed_seconds = -0.1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.BookTransfer({.id = 1, .bytes = 1, .elapsed_seconds = NAN}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.BookTransfer({.id = 1, .bytes = 1}).ok());
  EXPECT_EQ(s.BookTransfer({.id = 1, .bytes = 1}).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "id already booked";
  MustBook(s, {.id = 2, .full_kv_bytes = 10, .target_offset = 4});
  EXPECT_EQ(s.BookTransfer({.id = 2, .bytes = 1}).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "an id a reload holds";
}

// Issue 14: many requests' KV refreshes on a paced slow link, mixed with
// reloads, random sizes, mid-slot bookings, shrinks to what crossed,
// releases and advances (also in lock-step mode): no slot is ever booked
// more than bandwidth x slot length in bytes, and each transfer is booked
// in full.
TEST(RingSchedulerTest, PropertyTransfersNeverOverbookAPacedLink) {
  constexpr double kT = 0.02;    // 20 ms slots
  constexpr double kBw = 1.2e6;  // a 1.2 MB/s slow link: 24 kB per slot
  for (const bool lock_step : {false, true}) {
    RingSchedulerOptions o = Options(kT, 32, kBw, int64_t{1} << 40, lock_step, /*pack=*/true);
    o.links.push_back(RingLink{.name = "slow", .bytes_per_second = kBw});
    RingScheduler s = Make(o);
    std::mt19937_64 rng(14 + lock_step);
    std::map<int64_t, int64_t> live;  // id -> a transfer's bytes (-1: a reload)
    int64_t next_id = 0;
    double booked_total = 0, expected_total = 0;
    for (int step = 0; step < 4000; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 6) {
        // A refresh of 1..40 tokens of 1280 bytes, up to 2 slots' worth.
        const int64_t bytes = 1280 * static_cast<int64_t>(1 + rng() % 40);
        const double elapsed = kT * static_cast<double>(rng() % 1000) / 1000.0;
        auto b =
            s.BookTransfer({.id = next_id, .bytes = bytes, .link = 1, .elapsed_seconds = elapsed});
        ASSERT_TRUE(b.ok()) << b.status();
        double sum = 0;
        for (double share : b->slot_seconds) sum += share;
        EXPECT_NEAR(sum, static_cast<double>(bytes) / kBw, 1e-9) << "booked in full";
        EXPECT_GE(b->first_slot(), s.now());
        booked_total += sum;
        expected_total += static_cast<double>(bytes) / kBw;
        live[next_id++] = bytes;
      } else if (op < 7) {
        // A reload beside them on the same link (lock-step books its
        // reloads past the limit by design: there, on the other link).
        auto a = s.Admit(
            {.id = next_id, .full_kv_bytes = 4096, .target_offset = 4, .link = lock_step ? 0 : 1});
        ASSERT_TRUE(a.ok()) << a.status();
        if (!a->queued) live[next_id] = -1;
        ++next_id;
      } else if (op < 9 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        if (it->second > 0 && rng() % 2 == 0) {
          // Its rows turned out smaller than booked.
          it->second = static_cast<int64_t>(rng() % static_cast<uint64_t>(it->second + 1));
          ASSERT_TRUE(s.ShrinkTransfer(it->first, it->second).ok());
        } else {
          ASSERT_TRUE(s.Release(it->first).ok());
          live.erase(it);
        }
      } else {
        s.Advance(1 + static_cast<int64_t>(rng() % 2));
      }
      // Every tracked slot of the slow link stays within one slot of bytes.
      for (int64_t slot = s.now(); slot < s.now() + 64; ++slot) {
        ASSERT_LE(s.LinkBooked(1, slot) * kBw, kBw * kT * (1 + 1e-9)) << "slot " << slot;
      }
    }
    EXPECT_NEAR(booked_total, expected_total, 1e-6);
    s.Advance(200);
    EXPECT_GT(s.stats().peak_slot_seconds[1], 0.9 * kT) << "the link was filled";
    EXPECT_LE(s.stats().peak_slot_seconds[1], kT * (1 + 1e-9));
    EXPECT_EQ(s.stats().overrun_seconds[1], 0.0);
  }
}

}  // namespace
}  // namespace vc
