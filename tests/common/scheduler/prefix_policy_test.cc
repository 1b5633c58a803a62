// The prefix sharing and residency policy as a pure object: one copy per
// (prefix, worker) however many holders, the capacity it leaves and the
// admission rule (checked against an independent recount over random holds,
// releases and capacity changes), joining a booking only inside its window,
// a booking released with its last user, and placement by rendezvous hashing (only live workers,
// stable, only a dead worker's keys move).
#include "common/scheduler/prefix_policy.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace vc {
namespace {

TEST(PrefixPolicyTest, OneCopyPerPrefixAndWorker) {
  PrefixPolicy p({1000, 1000});
  EXPECT_TRUE(p.Hold("a", 0, 600)) << "first holder loads the copy";
  EXPECT_FALSE(p.Hold("a", 0, 600)) << "second holder shares it";
  EXPECT_EQ(p.Holders("a", 0), 2);
  EXPECT_EQ(p.ResidentBytes(0), 600);
  EXPECT_EQ(p.CapacityLeft(0), 400);
  EXPECT_EQ(p.ResidentBytes(1), 0) << "another worker keeps its own copies";
  EXPECT_TRUE(p.Hold("a", 1, 600));
  EXPECT_EQ(p.ResidentBytes(1), 600);
  EXPECT_FALSE(p.Release("a", 0)) << "one holder left";
  EXPECT_TRUE(p.IsResident("a", 0));
  EXPECT_TRUE(p.Release("a", 0));
  EXPECT_FALSE(p.IsResident("a", 0));
  EXPECT_EQ(p.ResidentBytes(0), 0);
  EXPECT_EQ(p.CapacityLeft(0), 1000);
  // Ignored: unknown prefix, unknown worker, nothing to hold.
  EXPECT_FALSE(p.Release("a", 0));
  EXPECT_FALSE(p.Release("unknown", 1));
  EXPECT_FALSE(p.Hold("b", 2, 10));
  EXPECT_FALSE(p.Hold("b", -1, 10));
  EXPECT_FALSE(p.Hold("", 0, 0));
  EXPECT_EQ(p.ResidentBytes(0), 0);
  EXPECT_EQ(p.ResidentBytes(7), 0);
  EXPECT_EQ(p.CapacityLeft(7), 0);
}

// A booking goes back to the ring with its last user: the round that booked
// it and every round that joined it (the rule SlotClock and the simulator
// share), checked against a plain recount over random starts, joins and drops.
TEST(PrefixPolicyTest, ABookingIsReleasedWithItsLastUser) {
  PrefixPolicy p({1000});
  p.StartUsers(7);
  EXPECT_TRUE(p.AddUser(7));
  EXPECT_TRUE(p.AddUser(7));
  EXPECT_EQ(p.Users(7), 3);
  EXPECT_FALSE(p.DropUser(7)) << "two rounds still verify on it";
  EXPECT_FALSE(p.DropUser(7));
  EXPECT_TRUE(p.DropUser(7)) << "the last user releases it";
  EXPECT_EQ(p.Users(7), 0);
  EXPECT_FALSE(p.AddUser(7)) << "a released booking cannot be joined";
  EXPECT_TRUE(p.DropUser(8)) << "an untracked booking is released at once";

  std::mt19937 rng(3);
  std::map<int64_t, int> recount;
  std::set<int64_t> released;
  for (int step = 0; step < 5000; ++step) {
    const int64_t id = static_cast<int64_t>(rng() % 40);
    switch (rng() % 3) {
      case 0:
        if (!recount.count(id) && !released.count(id)) {
          p.StartUsers(id);
          recount[id] = 1;
        }
        break;
      case 1: {
        const bool tracked = recount.count(id) > 0;
        ASSERT_EQ(p.AddUser(id), tracked) << "step " << step;
        if (tracked) ++recount[id];
        break;
      }
      default:
        if (recount.count(id)) {
          const bool last = --recount[id] == 0;
          ASSERT_EQ(p.DropUser(id), last) << "step " << step;
          if (last) {
            recount.erase(id);
            released.insert(id);
          }
        }
    }
    ASSERT_EQ(p.Users(id), recount.count(id) ? recount[id] : 0);
  }
}

TEST(PrefixPolicyTest, ResidentsMakeFittingReloadsWaitAndLeaveOthersToTheScheduler) {
  RingSchedulerOptions o;
  o.slot_seconds = 1.0;
  o.window_slots = 16;
  o.links = {RingLink{.name = "fast", .bytes_per_second = 1000.0}};
  o.gpus = {RingGpu{.name = "v0", .transient_capacity_bytes = 1000},
            RingGpu{.name = "v1", .transient_capacity_bytes = 1000}};
  RingScheduler s = std::move(RingScheduler::Create(o)).value();
  PrefixPolicy p = PrefixPolicy::ForScheduler(s);
  ASSERT_EQ(p.workers(), 2);
  EXPECT_EQ(p.BaseCapacity(1), 1000);
  ASSERT_TRUE(p.Hold("p", 0, 600));
  ASSERT_TRUE(p.ApplyCapacity(s, 0).ok());
  EXPECT_EQ(s.options().gpus[0].transient_capacity_bytes, 400);
  EXPECT_EQ(p.ApplyCapacity(s, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(p.WaitsForResidents(0, 500));
  EXPECT_FALSE(p.WaitsForResidents(0, 400));
  EXPECT_FALSE(p.WaitsForResidents(0, 1001)) << "never fits: the scheduler's error";
  auto waits = p.Admit(s, {.id = 1, .full_kv_bytes = 500, .target_offset = 3, .gpu = 0});
  ASSERT_TRUE(waits.ok()) << waits.status();
  EXPECT_TRUE(waits->queued);
  EXPECT_EQ(s.Find(1), nullptr) << "nothing booked while it waits";
  auto other = p.Admit(s, {.id = 2, .full_kv_bytes = 500, .target_offset = 3, .gpu = 1});
  ASSERT_TRUE(other.ok() && !other->queued);
  EXPECT_EQ(p.Admit(s, {.id = 3, .full_kv_bytes = 1001, .gpu = 0}).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(p.Release("p", 0));
  ASSERT_TRUE(p.ApplyCapacity(s, 0).ok());
  auto fits = p.Admit(s, {.id = 1, .full_kv_bytes = 500, .target_offset = 3, .gpu = 0});
  ASSERT_TRUE(fits.ok() && !fits->queued);
  // A lower configured capacity (the simulator reserves admitted requests'
  // own KV) counts too, and never goes below zero.
  p.SetBaseCapacity(1, 300);
  ASSERT_TRUE(p.Hold("q", 1, 500));
  EXPECT_EQ(p.CapacityLeft(1), 0);
  EXPECT_TRUE(p.WaitsForResidents(1, 200));
}

TEST(PrefixPolicyTest, JoinsOnlyALiveBookingInsideTheWindow) {
  PrefixPolicy p({1000, 1000});
  Booking b;
  b.id = 42;
  b.verify_slot = 10;
  b.reload_slots = 3;
  p.NoteShared("p", 0, b);
  auto found = p.FindShared("p", 0, 5, 12);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->booking_id, 42);
  EXPECT_EQ(found->first_slot, 7);
  EXPECT_EQ(found->verify_slot, 10);
  EXPECT_TRUE(p.FindShared("p", 0, 10, 10).has_value()) << "bounds are inclusive";
  EXPECT_FALSE(p.FindShared("p", 0, 11, 20).has_value()) << "verify too early";
  EXPECT_FALSE(p.FindShared("p", 0, 1, 9).has_value()) << "verify too late";
  EXPECT_FALSE(p.FindShared("p", 1, 0, 20).has_value()) << "another worker";
  EXPECT_FALSE(p.FindShared("q", 0, 0, 20).has_value()) << "another prefix";
  // The latest booking replaces the previous one.
  b.id = 43;
  b.verify_slot = 14;
  p.NoteShared("p", 0, b);
  EXPECT_EQ(p.FindShared("p", 0, 0, 20)->booking_id, 43);
  p.ExpireShared(14);
  EXPECT_TRUE(p.FindShared("p", 0, 0, 20).has_value()) << "its verify slot is now";
  p.ExpireShared(15);
  EXPECT_FALSE(p.FindShared("p", 0, 0, 20).has_value());
}

// The join rule the coordinator and the simulator share: join at once when
// the shared verify is no later than the round wants; otherwise join instead
// of a booking of its own that would verify no earlier, or that is queued.
TEST(PrefixPolicyTest, JoinRuleSavesTheReloadWheneverItCostsNoTime) {
  SharedBooking shared;
  shared.booking_id = 7;
  shared.verify_slot = 10;
  EXPECT_TRUE(PrefixPolicy::JoinsAtOnce(shared, 10));
  EXPECT_TRUE(PrefixPolicy::JoinsAtOnce(shared, 12));
  EXPECT_FALSE(PrefixPolicy::JoinsAtOnce(shared, 9)) << "the shared verify is later than wanted";

  Admission own;
  own.queued = true;
  EXPECT_TRUE(PrefixPolicy::JoinsInsteadOf(shared, own)) << "its own booking would have to wait";
  own.queued = false;
  own.booking.verify_slot = 10;
  EXPECT_TRUE(PrefixPolicy::JoinsInsteadOf(shared, own)) << "no earlier: same slot";
  own.booking.verify_slot = 11;
  EXPECT_TRUE(PrefixPolicy::JoinsInsteadOf(shared, own));
  own.booking.verify_slot = 9;
  EXPECT_FALSE(PrefixPolicy::JoinsInsteadOf(shared, own)) << "its own booking verifies earlier";
}

// Property: over random holds, releases and capacity changes the policy agrees
// with a recount from the list of live holds (a copy's bytes are its first
// holder's; it is resident while any holder is left).
TEST(PrefixPolicyTest, MatchesAnIndependentRecount) {
  constexpr int kWorkers = 3;
  const std::vector<std::string> prefixes = {"", "a", "b", "c", "d"};
  std::mt19937_64 rng(7);
  PrefixPolicy p({5000, 5000, 5000});
  std::vector<int64_t> base(kWorkers, 5000);
  // Live holds in order: (prefix, worker) -> bytes each holder asked for.
  std::map<std::pair<std::string, int>, std::vector<int64_t>> holds;
  for (int step = 0; step < 20000; ++step) {
    const std::string& prefix = prefixes[rng() % prefixes.size()];
    const int w = static_cast<int>(rng() % (kWorkers + 1)) - (rng() % 8 == 0 ? 1 : 0);  // -1..3
    const int op = static_cast<int>(rng() % 5);
    if (op <= 1) {
      const int64_t bytes = static_cast<int64_t>(rng() % 3000) - 100;  // some <= 0
      const bool valid = w >= 0 && w < kWorkers && bytes > 0;
      const bool first = valid && holds[{prefix, w}].empty();
      EXPECT_EQ(p.Hold(prefix, w, bytes), first) << "step " << step;
      if (valid) holds[{prefix, w}].push_back(bytes);
    } else if (op <= 3) {
      auto it = holds.find({prefix, w});
      const bool last = it != holds.end() && it->second.size() == 1;
      EXPECT_EQ(p.Release(prefix, w), last) << "step " << step;
      if (it != holds.end()) {
        it->second.pop_back();  // which holder leaves does not matter
        if (it->second.empty()) holds.erase(it);
      }
    } else if (w >= 0 && w < kWorkers) {
      base[static_cast<size_t>(w)] = static_cast<int64_t>(rng() % 8000);
      p.SetBaseCapacity(w, base[static_cast<size_t>(w)]);
    }
    // The recount. A copy keeps its first holder's bytes even when that
    // holder has left, so recount from the first entry ever made for it.
    std::vector<int64_t> resident(kWorkers, 0);
    for (const auto& [key, list] : holds) resident[static_cast<size_t>(key.second)] += list.front();
    for (int g = 0; g < kWorkers; ++g) {
      const size_t i = static_cast<size_t>(g);
      ASSERT_EQ(p.ResidentBytes(g), resident[i]) << "step " << step << " worker " << g;
      const int64_t left = std::max<int64_t>(0, base[i] - resident[i]);
      ASSERT_EQ(p.CapacityLeft(g), left);
      const int64_t probe = static_cast<int64_t>(rng() % 8000);
      ASSERT_EQ(p.WaitsForResidents(g, probe), probe <= base[i] && probe > left);
    }
    for (const std::string& pre : prefixes) {
      for (int g = 0; g < kWorkers; ++g) {
        auto it = holds.find({pre, g});
        ASSERT_EQ(p.Holders(pre, g), it == holds.end() ? 0 : static_cast<int>(it->second.size()));
      }
    }
  }
}

TEST(PrefixPolicyTest, PlacementIsStableAndMovesOnlyADeadWorkersKeys) {
  EXPECT_EQ(PlacementKey("abc", 7), "abc");
  EXPECT_EQ(PlacementKey("", 7), "session:7") << "no stored prefix: by session";
  EXPECT_EQ(PlaceByKey("k", {}), std::nullopt);
  EXPECT_EQ(PlaceByKey("k", {false, false}), std::nullopt);
  const std::vector<bool> all(5, true);
  std::map<std::string, int> before;
  std::set<int> used;
  for (int i = 0; i < 200; ++i) {
    const std::string key = "prefix-" + std::to_string(i);
    const auto w = PlaceByKey(key, all);
    ASSERT_TRUE(w.has_value());
    ASSERT_GE(*w, 0);
    ASSERT_LT(*w, 5);
    EXPECT_EQ(PlaceByKey(key, all), w) << "deterministic";
    before[key] = *w;
    used.insert(*w);
  }
  EXPECT_EQ(used.size(), 5u) << "keys spread over every worker";
  std::vector<bool> live = all;
  live[2] = false;
  for (const auto& [key, w] : before) {
    const auto now = PlaceByKey(key, live);
    ASSERT_TRUE(now.has_value());
    EXPECT_NE(*now, 2);
    if (w != 2) {
      EXPECT_EQ(*now, w) << key << ": only the dead worker's keys move";
    }
  }
}

}  // namespace
}  // namespace vc
