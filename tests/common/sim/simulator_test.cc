// The simulator on hand-computed timelines (one request, long-context and
// remote-prefix, with and without continuation; full-KV baseline), the
// lock-step link arithmetic, the staggered schedule never booking past a
// slot, the KV refresh and the startup fetches booked on the slow links'
// rings, agreement with the closed-form model, the acceptance model and its
// CSV, and config parsing errors.
#include "common/sim/simulator.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <utility>

#include "common/costmodel/cost_model.h"
#include "gtest/gtest.h"
#include "tests/scratch_dir.h"

namespace vc::sim {
namespace {

// Round numbers: weights 1 GB, HBM 1 GB/s, prompt 1000 tokens of 1 MB each
// (full KV 1 GB, compressed 0.5 GB at c = 0.5). A draft iteration of one
// request reads 1.5 GB (1.5 s), a verify reads 2 GB (2 s). KV does not grow.
SimConfig OneRequest() {
  SimConfig c;
  c.topology = SimConfig::Topology::kLongContext;
  c.hbm_bytes = 0;
  c.hbm_bytes_per_second = 1e9;
  c.flops = 0;
  c.host_link_bytes_per_second = 0;  // unlimited
  c.weight_bytes = 1e9;
  c.kv_bytes_per_token = 1e6;
  c.requests = 1;
  c.concurrency = 1;
  c.prompt_tokens = Distribution::Fixed(1000);
  c.output_tokens = Distribution::Fixed(10);
  c.grow_kv = false;
  c.startup_transfer = false;
  c.ratio = 0.5;
  c.draft_len = 4;
  c.acceptance.per_token = 1.0;
  c.slot_seconds = 1.5;
  return c;
}

SimResult MustRun(const SimConfig& c) {
  auto r = Simulate(c);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimResult{};
}

TEST(SimulatorTest, SingleRequestUnlimitedLinkExactTimeline) {
  // Two rounds of 4 drafts (4 * 1.5 s) + a verify (2 s), 5 tokens each.
  const SimResult r = MustRun(OneRequest());
  EXPECT_EQ(r.output_tokens, 10);
  EXPECT_EQ(r.verifies, 2);
  EXPECT_EQ(r.drafted_tokens, 8);
  EXPECT_DOUBLE_EQ(r.mean_accepted, 4);
  EXPECT_NEAR(r.makespan_s, 16.0, 1e-9);
  EXPECT_NEAR(r.ttft_s.p50, 8.0, 1e-9);
  EXPECT_NEAR(r.tpot_s.p50, 8.0 / 9, 1e-9);
  EXPECT_NEAR(r.tokens_per_s, 10 / 16.0, 1e-12);
  EXPECT_DOUBLE_EQ(r.verify_stall_s, 0);
  ASSERT_EQ(r.gpus.size(), 1u);
  EXPECT_EQ(r.gpus[0].iterations, 10);
  // Weights + compressed + one full copy.
  EXPECT_NEAR(r.gpus[0].peak_hbm_bytes, 1e9 + 0.5e9 + 1e9, 1);
}

TEST(SimulatorTest, SingleRequestWithContinuation) {
  // The verify pass also drafts the next round's first token (2.5 s); it
  // survives (all accepted, p = 1), so round 2 needs 3 drafts:
  // 6 + 2.5 + 4.5 + 2.5 = 15.5 s.
  SimConfig c = OneRequest();
  c.continuation = true;
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.output_tokens, 10);
  EXPECT_NEAR(r.makespan_s, 15.5, 1e-9);
  EXPECT_GE(r.continuation_kept, 1);
}

TEST(SimulatorTest, SingleRequestStartupTransferAndLinkStall) {
  // A 2 GB/s link: the 0.5 GB compressed KV takes 0.25 s to arrive; each
  // reload (1 GB) 0.5 s, booked to land before the drafts are done.
  SimConfig c = OneRequest();
  c.startup_transfer = true;
  c.host_link_bytes_per_second = 2e9;
  const SimResult r = MustRun(c);
  EXPECT_NEAR(r.makespan_s, 16.25, 1e-9);
  EXPECT_NEAR(r.ttft_s.p50, 8.25, 1e-9);
  ASSERT_EQ(r.links.size(), 1u);
  EXPECT_NEAR(r.links[0].busy_s, 0.25 + 2 * 0.5, 1e-9);
  EXPECT_EQ(r.links[0].transfers, 3);
  EXPECT_DOUBLE_EQ(r.verify_stall_s, 0);
}

TEST(SimulatorTest, FullModeSingleRequest) {
  // Load the 1 GB full KV (1 s at 1 GB/s), then 3 decode steps of 2 s.
  SimConfig c = OneRequest();
  c.mode = SimConfig::Mode::kFull;
  c.startup_transfer = true;
  c.host_link_bytes_per_second = 1e9;
  c.output_tokens = Distribution::Fixed(3);
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.output_tokens, 3);
  EXPECT_NEAR(r.makespan_s, 7.0, 1e-9);
  EXPECT_NEAR(r.ttft_s.p50, 3.0, 1e-9);
  EXPECT_EQ(r.verifies, 0);
}

TEST(SimulatorTest, RemotePrefixSingleRequestTimeline) {
  // Startup: 0.5 GB compressed over a 1 GB/s slow link (0.5 s); 4 drafts on
  // the drafter (1.5 s each) -> 6.5 s; drafts reach the verifier after half
  // the 0.2 s RTT (6.6 s); verify 2 s -> 8.6 s; result back at 8.7 s.
  SimConfig c = OneRequest();
  c.topology = SimConfig::Topology::kRemotePrefix;
  c.drafters = 1;
  c.verifiers = 1;
  c.startup_transfer = true;
  c.slow_link_bytes_per_second = 1e9;
  c.fast_link_bytes_per_second = 0;
  c.rtt_s = 0.2;
  c.output_tokens = Distribution::Fixed(5);
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_EQ(r.verifies, 1);
  EXPECT_NEAR(r.makespan_s, 8.7, 1e-9);
  EXPECT_NEAR(r.ttft_s.p50, 8.7, 1e-9);
  ASSERT_EQ(r.gpus.size(), 2u);
  EXPECT_EQ(r.gpus[0].role, "drafter");
  EXPECT_EQ(r.gpus[0].iterations, 4);
  EXPECT_EQ(r.gpus[1].role, "verifier");
  EXPECT_EQ(r.gpus[1].iterations, 1);
  EXPECT_NEAR(r.gpus[1].peak_transient_bytes, 1e9, 1);
}

TEST(SimulatorTest, RemotePrefixRefreshLandsBeforeTheNextRound) {
  // No startup load: 4 drafts (6 s), drafts at the verifier at 6.1 s, verify
  // -> 8.1 s, result at the drafter at 8.2 s. The 5 accepted rows (5 MB)
  // cross the 10 MB/s slow link in 0.5 s, booked from the current slot
  // (slot 5 = [7.5, 9) s, 0.8 s of it left): they land at 8.7 s and the
  // drafter starts round 2 then: 6 s of drafts, 0.1 + 2 + 0.1 s -> 16.9 s.
  // Without the refresh round 2 starts at the result: 16.4 s.
  SimConfig c = OneRequest();
  c.topology = SimConfig::Topology::kRemotePrefix;
  c.drafters = 1;
  c.verifiers = 1;
  c.slow_link_bytes_per_second = 10e6;
  c.fast_link_bytes_per_second = 0;
  c.rtt_s = 0.2;
  c.kv_refresh = true;
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.output_tokens, 10);
  EXPECT_EQ(r.verifies, 2);
  EXPECT_NEAR(r.ttft_s.p50, 8.2, 1e-9);
  EXPECT_NEAR(r.makespan_s, 16.9, 1e-9);
  EXPECT_NEAR(r.refresh_wait_s, 0.5, 1e-9);
  // Both rounds' rows are booked and sent (the last one's after its tokens).
  EXPECT_DOUBLE_EQ(r.refresh_bytes, 10e6);
  ASSERT_EQ(r.links.size(), 2u);
  EXPECT_EQ(r.links[1].name, "slow0");
  EXPECT_NEAR(r.links[1].booked_peak_slot_s, 0.5, 1e-9);
  c.kv_refresh = false;
  const SimResult off = MustRun(c);
  EXPECT_NEAR(off.makespan_s, 16.4, 1e-9);
  EXPECT_DOUBLE_EQ(off.refresh_bytes, 0);
  EXPECT_DOUBLE_EQ(off.links[1].booked_peak_slot_s, 0);
}

// Many requests on two drafters whose slow links the refresh rows saturate:
// about 4.6 MB per round at 50 MB/s, rounds of well under a second for 16
// requests per drafter. Full KV moves on an unlimited fast link and nothing
// is loaded at startup, so the slow links carry only the refresh.
SimConfig RefreshBound() {
  SimConfig c = OneRequest();
  c.topology = SimConfig::Topology::kRemotePrefix;
  c.drafters = 2;
  c.verifiers = 1;
  c.requests = 64;
  c.concurrency = 32;
  c.output_tokens = Distribution::Fixed(40);
  c.grow_kv = true;
  c.hbm_bytes_per_second = 100e9;
  c.fast_link_bytes_per_second = 0;
  c.slow_link_bytes_per_second = 50e6;
  c.rtt_s = 0.01;
  c.acceptance.per_token = 0.9;
  c.slot_seconds = 0.05;
  c.window_slots = 256;
  c.kv_refresh = true;
  return c;
}

TEST(SimulatorTest, RefreshIsBookedOnTheSlowRingsAndNeverOverbooksThem) {
  for (SimConfig::Schedule schedule :
       {SimConfig::Schedule::kStaggered, SimConfig::Schedule::kLockStep}) {
    SimConfig c = RefreshBound();
    c.schedule = schedule;
    const SimResult r = MustRun(c);
    SCOPED_TRACE(schedule == SimConfig::Schedule::kStaggered ? "staggered" : "lock-step");
    EXPECT_EQ(r.requests, 64);
    // Every round's rows, booked at their exact size.
    EXPECT_NEAR(r.refresh_bytes, r.tokens_per_round * r.verifies * c.kv_bytes_per_token, 1);
    ASSERT_EQ(r.links.size(), 3u);
    ASSERT_EQ(r.scheduler_links.size(), 3u);
    double slow_bytes = 0;
    for (int l : {1, 2}) {
      const LinkReport& slow = r.links[l];
      EXPECT_EQ(slow.name, "slow" + std::to_string(l - 1));
      EXPECT_EQ(r.scheduler_links[l], slow.name);
      // Booked, up to a full slot under this load, never past it.
      EXPECT_GT(slow.booked_peak_slot_s, 0.9 * c.slot_seconds) << slow.name;
      EXPECT_LE(slow.booked_peak_slot_s, c.slot_seconds * (1 + 1e-9)) << slow.name;
      EXPECT_DOUBLE_EQ(slow.overrun_s, 0) << slow.name;
      EXPECT_GT(slow.utilisation, 0.5) << slow.name;
      slow_bytes += slow.bytes;
    }
    // Moved: all but the rows still in flight when the last request ends.
    EXPECT_LE(slow_bytes, r.refresh_bytes);
    EXPECT_GT(slow_bytes, 0.95 * r.refresh_bytes);
    for (const TimeSample& s : r.timeseries) {
      for (double v : s.link_booked) EXPECT_LE(v, 1 + 1e-9);
    }
    // A round waits at least for its rows to cross; queued behind the other
    // requests' rows, much longer.
    const double per_round = r.refresh_bytes / r.verifies / c.slow_link_bytes_per_second;
    EXPECT_GT(r.refresh_wait_s, 2 * per_round * r.verifies);
  }
}

TEST(SimulatorTest, NoRefreshBooksNothingOnTheSlowRings) {
  SimConfig c = RefreshBound();
  const SimResult on = MustRun(c);
  c.kv_refresh = false;
  const SimResult off = MustRun(c);
  EXPECT_EQ(off.output_tokens, on.output_tokens);
  EXPECT_DOUBLE_EQ(off.refresh_bytes, 0);
  EXPECT_DOUBLE_EQ(off.refresh_wait_s, 0);
  ASSERT_EQ(off.links.size(), 3u);
  for (int l : {1, 2}) {
    EXPECT_DOUBLE_EQ(off.links[l].booked_peak_slot_s, 0);
    EXPECT_EQ(off.links[l].transfers, 0);
  }
  // The refresh-bound run is slower for waiting on its rows.
  EXPECT_GT(off.tokens_per_s, 1.5 * on.tokens_per_s);
  // An unlimited slow link books no time: the rows land at once.
  c.kv_refresh = true;
  c.slow_link_bytes_per_second = 0;
  const SimResult free = MustRun(c);
  EXPECT_GT(free.refresh_bytes, 0);
  EXPECT_DOUBLE_EQ(free.refresh_wait_s, 0);
  for (int l : {1, 2}) EXPECT_DOUBLE_EQ(free.links[l].booked_peak_slot_s, 0);
}

// Two requests, each on its own drafter behind one shared 1 GB/s slow link,
// arrive together; slots of 0.5 s. The startup fetches (0.5 GB compressed,
// 0.5 s each) are booked on the slow ring as the coordinator books a
// drafter's Open: the first fills slot 0 and goes at once, the second gets
// slot 1 and is sent when it begins, as the first's booking ends (0.5 s).
// A: lands at 0.5 s, 4 drafts -> 6.5 s, at the verifier 6.6 s, verify ->
// 8.6 s, result 8.7 s. B: lands at 1.0 s, drafts -> 7.0 s, at the verifier
// 7.1 s, verified after A (8.6 -> 10.6 s), result 10.7 s.
TEST(SimulatorTest, StartupFetchesAreBookedOnTheSlowRing) {
  SimConfig c = OneRequest();
  c.topology = SimConfig::Topology::kRemotePrefix;
  c.drafters = 2;
  c.verifiers = 1;
  c.slow_link_shared = true;
  c.requests = 2;
  c.concurrency = 2;
  c.startup_transfer = true;
  c.slow_link_bytes_per_second = 1e9;
  c.fast_link_bytes_per_second = 0;
  c.rtt_s = 0.2;
  c.output_tokens = Distribution::Fixed(5);
  c.slot_seconds = 0.5;
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.output_tokens, 10);
  EXPECT_NEAR(r.ttft_s.p50, 8.7, 1e-9);
  EXPECT_NEAR(r.ttft_s.max, 10.7, 1e-9);
  EXPECT_NEAR(r.makespan_s, 10.7, 1e-9);
  EXPECT_DOUBLE_EQ(r.startup_bytes, 1e9);
  EXPECT_NEAR(r.startup_wait_s, 0.5, 1e-9) << "B waited for slot 1";
  ASSERT_EQ(r.links.size(), 2u);
  const LinkReport& slow = r.links[1];
  EXPECT_EQ(slow.name, "slow");
  EXPECT_EQ(slow.transfers, 2);
  EXPECT_NEAR(slow.busy_s, 1.0, 1e-9);
  EXPECT_NEAR(slow.booked_peak_slot_s, 0.5, 1e-9) << "a whole slot, never more";
  EXPECT_DOUBLE_EQ(slow.overrun_s, 0);
  EXPECT_DOUBLE_EQ(slow.unbooked_s, 0);
  // The sample at 0.5 s (slot 1 begins) sees slot 1 fully booked by B.
  ASSERT_EQ(r.scheduler_links.size(), 2u);
  ASSERT_EQ(r.scheduler_links[1], "slow");
  bool seen = false;
  for (const TimeSample& s : r.timeseries) {
    if (std::abs(s.t - 0.5) > 1e-9) continue;
    seen = true;
    EXPECT_NEAR(s.link_booked[1], 1.0, 1e-9);
  }
  EXPECT_TRUE(seen);
}

// Full mode, remote-prefix: a GPU behind the slow link fetches the full KV
// (1 GB, 1 s at 1 GB/s) as full_remote's drafter does, booked like its Open;
// the verifier's load over the fast link is not booked (nor is full_local's
// verifier Open). One request per GPU (max_batch 1), 3 tokens of 2 s each,
// slots of 8 s. A (drafter) and B (verifier) load at 0 -> 1 s and finish at
// 7 s; C, waiting, then goes to the drafter. Slot 0 holds A's booked second
// and 7 s of it have run: nothing is left of it, so C's fetch is booked in
// slot 1 and starts at 8 s, though the link is idle from 1 s (unbooked, it
// would start at 7 s): it lands at 9 s, C's tokens at 11, 13 and 15 s.
TEST(SimulatorTest, FullModeDrafterFetchStartsAtItsBookedSlot) {
  SimConfig c = OneRequest();
  c.mode = SimConfig::Mode::kFull;
  c.topology = SimConfig::Topology::kRemotePrefix;
  c.drafters = 1;
  c.verifiers = 1;
  c.max_batch = 1;
  c.requests = 3;
  c.concurrency = 3;
  c.startup_transfer = true;
  c.slow_link_bytes_per_second = 1e9;
  c.fast_link_bytes_per_second = 1e9;
  c.output_tokens = Distribution::Fixed(3);
  c.slot_seconds = 8;
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.output_tokens, 9);
  EXPECT_NEAR(r.makespan_s, 15.0, 1e-9);
  EXPECT_NEAR(r.ttft_s.max, 11.0, 1e-9);
  EXPECT_NEAR(r.startup_wait_s, 1.0, 1e-9);
  ASSERT_EQ(r.links.size(), 2u);
  const LinkReport& fast = r.links[0];
  const LinkReport& slow = r.links[1];
  ASSERT_EQ(slow.name, "slow0");
  EXPECT_EQ(slow.transfers, 2);
  EXPECT_NEAR(slow.booked_peak_slot_s, 1.0, 1e-9);
  EXPECT_DOUBLE_EQ(slow.unbooked_s, 0);
  EXPECT_EQ(fast.transfers, 1);
  EXPECT_DOUBLE_EQ(fast.booked_peak_slot_s, 0);
  EXPECT_NEAR(fast.unbooked_s, 1.0, 1e-9);
}

// Many requests starting over the paced slow links of RefreshBound: each
// drafter's startup fetch (100 prompt tokens at c = 0.1: 10 MB, 0.2 s at
// 50 MB/s) is booked on its slow ring with the rounds' refreshes.
SimConfig StartupAndRefreshBound() {
  SimConfig c = RefreshBound();
  c.prompt_tokens = Distribution::Fixed(100);
  c.ratio = 0.1;
  c.startup_transfer = true;
  c.timeseries_max_points = 1 << 20;
  return c;
}

TEST(SimulatorTest, StartupFetchesAndRefreshesNeverOverbookTheSlowRings) {
  for (SimConfig::Schedule schedule :
       {SimConfig::Schedule::kStaggered, SimConfig::Schedule::kLockStep}) {
    SimConfig c = StartupAndRefreshBound();
    c.schedule = schedule;
    const SimResult r = MustRun(c);
    SCOPED_TRACE(schedule == SimConfig::Schedule::kStaggered ? "staggered" : "lock-step");
    EXPECT_EQ(r.requests, 64);
    EXPECT_NEAR(r.startup_bytes, 64 * 10e6, 1);
    ASSERT_EQ(r.links.size(), 3u);
    ASSERT_EQ(r.scheduler_links.size(), 3u);
    double slow_bytes = 0, slow_busy = 0;
    for (int l : {1, 2}) {
      const LinkReport& slow = r.links[l];
      EXPECT_EQ(r.scheduler_links[l], slow.name);
      EXPECT_GT(slow.booked_peak_slot_s, 0.9 * c.slot_seconds) << slow.name;
      EXPECT_LE(slow.booked_peak_slot_s, c.slot_seconds * (1 + 1e-9)) << slow.name;
      EXPECT_DOUBLE_EQ(slow.overrun_s, 0) << slow.name;
      // Nothing crossed it unbooked: the ring saw all of its time.
      EXPECT_DOUBLE_EQ(slow.unbooked_s, 0) << slow.name;
      slow_bytes += slow.bytes;
      slow_busy += slow.busy_s;
    }
    // Every startup fetch and all the rows but those in flight at the end.
    EXPECT_LE(slow_bytes, r.startup_bytes + r.refresh_bytes + 1);
    EXPECT_GT(slow_bytes, r.startup_bytes + 0.95 * r.refresh_bytes);
    EXPECT_GT(slow_busy, 0);
    for (const TimeSample& s : r.timeseries) {
      for (double v : s.link_booked) EXPECT_LE(v, 1 + 1e-9);
    }
    // The first 32 arrive together, 16 per drafter: the i-th fetch on a ring
    // waits at least for the i before it (0.2 s each), 2 * 0.2 * (0 + ... +
    // 15) = 48 request-seconds in all; later ones queue with the refreshes.
    EXPECT_GT(r.startup_wait_s, 48 * (1 - 1e-6));
  }
}

TEST(SimulatorTest, StartupFetchesBookNothingWhereTheCoordinatorDoesNot) {
  // An unpaced slow link books no time: the fetches start at once.
  SimConfig c = StartupAndRefreshBound();
  c.slow_link_bytes_per_second = 0;
  const SimResult free = MustRun(c);
  EXPECT_GT(free.startup_bytes, 0);
  EXPECT_DOUBLE_EQ(free.startup_wait_s, 0);
  for (int l : {1, 2}) EXPECT_DOUBLE_EQ(free.links[l].booked_peak_slot_s, 0);
  // No startup fetch, no refresh: the slow rings stay empty.
  c = StartupAndRefreshBound();
  c.startup_transfer = false;
  c.kv_refresh = false;
  const SimResult none = MustRun(c);
  EXPECT_DOUBLE_EQ(none.startup_bytes, 0);
  EXPECT_DOUBLE_EQ(none.startup_wait_s, 0);
  for (int l : {1, 2}) {
    EXPECT_DOUBLE_EQ(none.links[l].booked_peak_slot_s, 0);
    EXPECT_EQ(none.links[l].transfers, 0);
  }
  // Long-context: the compressed KV crosses the GPU's own host link
  // unbooked (no coordinator books it); only the reloads are booked.
  SimConfig lc = OneRequest();
  lc.startup_transfer = true;
  lc.host_link_bytes_per_second = 2e9;
  const SimResult local = MustRun(lc);
  EXPECT_DOUBLE_EQ(local.startup_wait_s, 0);
  ASSERT_EQ(local.links.size(), 1u);
  EXPECT_NEAR(local.links[0].unbooked_s, 0.25, 1e-9);
}

// B requests, one round each, 1 GB full KV over a 1 GB/s link (1 s per
// reload), slots of 0.1 s.
SimConfig LinkBound(int b, SimConfig::Schedule schedule) {
  SimConfig c = OneRequest();
  c.schedule = schedule;
  c.requests = b;
  c.concurrency = b;
  c.output_tokens = Distribution::Fixed(5);  // one round of x = 4, all accepted
  c.host_link_bytes_per_second = 1e9;
  c.slot_seconds = 0.1;
  c.window_slots = 256;
  return c;
}

TEST(SimulatorTest, LockStepLinkBusyIsBTimesTheTransfer) {
  for (int b : {1, 4, 10}) {
    const SimResult r = MustRun(LinkBound(b, SimConfig::Schedule::kLockStep));
    ASSERT_EQ(r.links.size(), 1u);
    EXPECT_EQ(r.links[0].transfers, b);
    EXPECT_NEAR(r.links[0].busy_s, b * 1.0, 1e-9) << "B = " << b;
    EXPECT_EQ(r.lock_step_rounds, 1);
    EXPECT_NEAR(r.link_seconds_per_round, b * 1.0, 1e-9);
    if (b > 1) {
      // Every reload was booked into the same slots: B - 1 transfers' worth
      // of link time is booked beyond the slots' capacity.
      EXPECT_GT(r.links[0].overrun_s, 0);
      EXPECT_GT(r.verify_stall_s, 0);
    }
  }
}

TEST(SimulatorTest, StaggeredNeverBooksPastASlot) {
  SimConfig c = LinkBound(10, SimConfig::Schedule::kStaggered);
  c.requests = 40;
  c.output_tokens = Distribution::Fixed(60);
  c.acceptance.per_token = 0.9;
  c.grow_kv = true;
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.requests, 40);
  ASSERT_EQ(r.links.size(), 1u);
  EXPECT_LE(r.links[0].booked_peak_slot_s, c.slot_seconds * (1 + 1e-9));
  EXPECT_GT(r.links[0].booked_peak_slot_s, 0);
  EXPECT_DOUBLE_EQ(r.links[0].overrun_s, 0);
  for (const TimeSample& s : r.timeseries) {
    for (double v : s.link_booked) EXPECT_LE(v, 1 + 1e-9);
    for (double v : s.memory_booked) EXPECT_LE(v, 1 + 1e-9);
  }
  // Same work under lock-step stalls longer.
  SimConfig l = c;
  l.schedule = SimConfig::Schedule::kLockStep;
  const SimResult rl = MustRun(l);
  EXPECT_GT(rl.verify_stall_s, r.verify_stall_s);
  EXPECT_GT(rl.links[0].overrun_s, 0);
}

TEST(SimulatorTest, MemoryCapacityBoundsLockStep) {
  // Without a memory limit lock-step holds all 10 full copies at once.
  SimConfig c = LinkBound(10, SimConfig::Schedule::kLockStep);
  const SimResult unlimited = MustRun(c);
  EXPECT_NEAR(unlimited.gpus[0].peak_transient_bytes, 10e9, 1);
  EXPECT_NEAR(unlimited.gpus[0].peak_hbm_bytes, 1e9 + 10 * 0.5e9 + 10e9, 1);
  // Room for weights + 10 compressed + 4 full copies: the scheduler spreads
  // the verifies and the simulated HBM never exceeds the capacity.
  c.hbm_bytes = 1e9 + 10 * 0.5e9 + 4 * 1e9;
  const SimResult r = MustRun(c);
  EXPECT_EQ(r.requests, 10);
  EXPECT_LE(r.gpus[0].peak_hbm_bytes, c.hbm_bytes + 1);
  EXPECT_LT(r.gpus[0].peak_transient_bytes, 10e9);
}

TEST(SimulatorTest, AgreesWithClosedFormWhenGpuBound) {
  // Big weights so that the per-iteration mix of drafts and verifies (which
  // the closed form averages) hardly matters; unlimited link.
  SimConfig c = OneRequest();
  c.weight_bytes = 40e9;
  c.hbm_bytes_per_second = 2000e9;
  c.kv_bytes_per_token = 1e6;  // K = 1 GB
  c.ratio = 0.2;
  c.draft_len = 8;
  c.acceptance.per_token = 0.9;
  // Closed loop, 8 in the system, many requests: the closed form describes
  // the steady state, and the last requests' tail is short next to the run.
  c.requests = 64;
  c.concurrency = 8;
  c.output_tokens = Distribution::Fixed(2000);
  c.slot_seconds = 0;  // estimated
  const SimResult r = MustRun(c);
  costmodel::LongContextInputs in;
  in.weight_bytes = c.weight_bytes;
  in.hbm_bytes_per_second = c.hbm_bytes_per_second;
  in.link_bytes_per_second = 1e30;
  in.full_kv_bytes = 1e9;
  in.batch = 8;
  in.ratio = 0.2;
  in.draft_len = 8;
  in.acceptance = costmodel::MeanAcceptedGeometric(0.9, 8) / 8;
  auto e = costmodel::EstimateLongContext(in);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(r.tokens_per_s / e->tokens_per_s, 1.0, 0.02)
      << "sim " << r.tokens_per_s << " vs model " << e->tokens_per_s;
  EXPECT_NEAR(r.mean_accepted / 8, in.acceptance, 0.02);
}

TEST(SimulatorTest, AcceptanceModels) {
  std::mt19937_64 rng(3);
  AcceptanceModel all;
  all.per_token = 1.0;
  EXPECT_EQ(all.Sample(7, rng), 7);
  AcceptanceModel none;
  none.per_token = 0.0;
  EXPECT_EQ(none.Sample(7, rng), 0);
  AcceptanceModel geo;
  geo.per_token = 0.8;
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) sum += geo.Sample(10, rng);
  EXPECT_NEAR(sum / n, costmodel::MeanAcceptedGeometric(0.8, 10), 0.03);
  EXPECT_NEAR(geo.MeanFraction(10), costmodel::MeanAcceptedGeometric(0.8, 10) / 10, 1e-12);

  // Empirical at x = 4: {0, 4, 4, 2}. Truncated to 2 drafts: {0, 2, 2, 2}.
  AcceptanceModel emp;
  emp.kind = AcceptanceModel::Kind::kEmpirical;
  emp.empirical = {0, 4, 4, 2};
  emp.empirical_draft_len = 4;
  ASSERT_TRUE(emp.Validate().ok());
  EXPECT_NEAR(emp.MeanFraction(2), 6.0 / 4 / 2, 1e-12);
  EXPECT_NEAR(emp.MeanFraction(4), 10.0 / 4 / 4, 1e-12);
  for (int i = 0; i < 1000; ++i) {
    const int a = emp.Sample(2, rng);
    EXPECT_TRUE(a == 0 || a == 2) << a;
    const int b = emp.Sample(8, rng);  // a full block of 4 continues into a new one
    EXPECT_TRUE(b == 0 || b == 2 || b == 4 || b == 6 || b == 8) << b;
  }
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  static const test_support::ScratchDir scratch("vc_simulator_test_");  // goes at exit
  const std::string path = scratch / name;
  std::ofstream(path) << text;
  return path;
}

TEST(SimulatorTest, EmpiricalCsv) {
  const std::string path = WriteTemp("acc.csv", "accepted,count,draft_len\n4,3,4\n1,1,4\n");
  auto m = LoadEmpiricalAcceptance(path, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->empirical_draft_len, 4);
  EXPECT_EQ(m->empirical, (std::vector<int>{4, 4, 4, 1}));

  const std::string plain = WriteTemp("acc2.csv", "accepted\n3\n5\n");
  auto p = LoadEmpiricalAcceptance(plain, 8);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->empirical_draft_len, 8);

  auto too_big = LoadEmpiricalAcceptance(plain, 4);  // 5 > 4
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = LoadEmpiricalAcceptance(WriteTemp("acc3.csv", "accepted\nx\n"), 4);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos);
  auto missing = LoadEmpiricalAcceptance("/nonexistent/acc.csv", 4);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(SimulatorTest, ParseConfig) {
  auto c = ParseSimConfig(R"({
    "topology": "remote-prefix", "schedule": "lock-step",
    "hardware": {"profile": "h100-nvl", "slow_link_gbps": 2.4},
    "model": "mistral-24b",
    "cluster": {"drafters": 4, "verifiers": 2, "rtt_ms": 1},
    "workload": {"requests": 20, "arrival": {"process": "poisson", "rate": 0.5},
                 "prompt_tokens": {"dist": "uniform", "min": 1000, "max": 2000},
                 "output_tokens": 128},
    "vericache": {"ratio": 0.25, "draft_len": 40, "acceptance": {"model": "fraction", "gamma": 0.8}},
    "scheduler": {"slot_ms": 20, "window_slots": 128}
  })",
                          "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->topology, SimConfig::Topology::kRemotePrefix);
  EXPECT_EQ(c->schedule, SimConfig::Schedule::kLockStep);
  EXPECT_DOUBLE_EQ(c->slow_link_bytes_per_second, 2.4e9);
  EXPECT_DOUBLE_EQ(c->hbm_bytes_per_second, 3900e9);
  EXPECT_DOUBLE_EQ(c->kv_bytes_per_token, 163840);
  EXPECT_EQ(c->verifiers, 2);
  EXPECT_DOUBLE_EQ(c->rtt_s, 0.001);
  EXPECT_EQ(c->arrival, SimConfig::Arrival::kPoisson);
  EXPECT_EQ(c->prompt_tokens.kind, Distribution::Kind::kUniform);
  EXPECT_NEAR(c->acceptance.MeanFraction(40), 0.8, 1e-9);
  EXPECT_DOUBLE_EQ(c->slot_seconds, 0.02);

  auto typo = ParseSimConfig(R"({"workload": {"request": 5}})", "");
  ASSERT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(typo.status().message().find("'request'"), std::string::npos);
  auto bad_json = ParseSimConfig("{", "");
  EXPECT_EQ(bad_json.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_profile = ParseSimConfig(R"({"hardware": "a100"})", "");
  EXPECT_NE(bad_profile.status().message().find("a100"), std::string::npos);
  auto bad_ratio = ParseSimConfig(R"({"model": "llama-70b", "vericache": {"ratio": 0}})", "");
  EXPECT_NE(bad_ratio.status().message().find("ratio"), std::string::npos);
}

TEST(SimulatorTest, RejectsRequestsThatCannotFit) {
  SimConfig c = OneRequest();
  c.hbm_bytes = 2e9;  // 1 GB free: not enough for 0.5 GB compressed + 1 GB full
  auto r = Simulate(c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimulatorTest, ClosedLoopRunsExactlyTheRequestsAsked) {
  // Identical requests finish together in one iteration; the closed loop
  // must not admit more than `requests` in all.
  SimConfig c = OneRequest();
  c.mode = SimConfig::Mode::kFull;
  c.concurrency = 4;
  c.output_tokens = Distribution::Fixed(3);
  for (int n : {5, 6, 7, 9, 13}) {
    c.requests = n;
    const SimResult r = MustRun(c);
    EXPECT_EQ(r.requests, n);
    EXPECT_EQ(r.output_tokens, 3 * n) << n;
  }
}

TEST(SimulatorTest, DeterministicForASeed) {
  SimConfig c = LinkBound(6, SimConfig::Schedule::kStaggered);
  c.acceptance.per_token = 0.85;
  c.output_tokens = Distribution::Fixed(40);
  c.arrival = SimConfig::Arrival::kPoisson;
  c.arrival_rate = 0.5;
  c.requests = 12;
  const SimResult a = MustRun(c), b = MustRun(c);
  EXPECT_EQ(a.makespan_s, b.makespan_s);
  EXPECT_EQ(a.verifies, b.verifies);
  c.seed = 2;
  EXPECT_NE(MustRun(c).makespan_s, a.makespan_s);
}

// The same workload with prefix sharing off, then on.
std::pair<SimResult, SimResult> RunSharingOffAndOn(SimConfig c) {
  c.prefix_sharing = false;
  SimResult off = MustRun(c);
  c.prefix_sharing = true;
  return {std::move(off), MustRun(c)};
}

// Two requests over one stored prefix on one long-context GPU, in step (same
// arrival, all drafts accepted): with sharing the second round of each pair
// joins the first's booking, so each round reloads the 1 GB prefix once and
// holds one copy; without sharing (the same workload) each loads its own.
TEST(SimulatorTest, SharedPrefixLoadedOncePerVerifyPass) {
  SimConfig c = OneRequest();
  c.requests = 2;
  c.concurrency = 2;
  c.host_link_bytes_per_second = 1e9;
  c.slot_seconds = 0.5;
  c.shared_prefixes = 1;
  const auto [off, on] = RunSharingOffAndOn(c);
  for (const SimResult* r : {&off, &on}) {
    EXPECT_EQ(r->output_tokens, 20);
    EXPECT_EQ(r->verifies, 4) << "two rounds each";
  }
  EXPECT_EQ(off.shared_joins, 0);
  EXPECT_DOUBLE_EQ(off.reload_bytes, 4e9);
  EXPECT_EQ(on.shared_joins, 2) << "the second request joins in both rounds";
  EXPECT_DOUBLE_EQ(on.reload_bytes, 2e9);
  ASSERT_EQ(on.links.size(), 1u);
  EXPECT_EQ(on.links[0].transfers, 2);
  EXPECT_NEAR(off.gpus[0].peak_transient_bytes, 2e9, 1);
  EXPECT_NEAR(on.gpus[0].peak_transient_bytes, 1e9, 1);
  EXPECT_LE(on.makespan_s, off.makespan_s);
  EXPECT_LT(on.peak_memory_booked_bytes, off.peak_memory_booked_bytes);
}

// A remote-prefix cluster under load, the same workload with and without
// sharing: 4 prefixes over 48 requests, the fast link the bottleneck. Sharing
// holds one compressed copy per drafter and prefix and joins verifies over
// one prefix, so it moves fewer bytes at startup and on reloads, holds less
// resident KV, and serves more tokens per second.
TEST(SimulatorTest, PrefixSharingMovesAndHoldsLessOnTheSameWorkload) {
  SimConfig c = OneRequest();
  c.topology = SimConfig::Topology::kRemotePrefix;
  c.drafters = 4;
  c.verifiers = 2;
  c.requests = 48;
  c.concurrency = 16;
  c.output_tokens = Distribution::Fixed(40);
  c.prompt_tokens = Distribution::Fixed(1000);
  c.grow_kv = true;
  c.startup_transfer = true;
  // Iterations of tens of ms, a 1 GB reload of 0.5 s per round: link-bound.
  c.hbm_bytes_per_second = 100e9;
  c.slow_link_bytes_per_second = 4e9;
  c.fast_link_bytes_per_second = 2e9;
  c.rtt_s = 0.01;
  c.acceptance.per_token = 0.9;
  c.slot_seconds = 0.05;
  c.window_slots = 256;
  c.shared_prefixes = 4;
  const auto [off, on] = RunSharingOffAndOn(c);
  EXPECT_EQ(on.requests, 48);
  EXPECT_EQ(on.output_tokens, off.output_tokens) << "the same workload";
  EXPECT_EQ(off.shared_joins, 0);
  EXPECT_EQ(off.shared_resident, 0);
  EXPECT_GT(on.shared_joins, 0);
  EXPECT_GT(on.shared_resident, 0);
  EXPECT_LT(on.reload_bytes, off.reload_bytes / 2);
  EXPECT_LT(on.startup_bytes, off.startup_bytes);
  double off_resident = 0, on_resident = 0;
  for (const GpuReport& g : off.gpus) off_resident = std::max(off_resident, g.peak_resident_bytes);
  for (const GpuReport& g : on.gpus) on_resident = std::max(on_resident, g.peak_resident_bytes);
  EXPECT_LT(on_resident, off_resident);
  // Link-bound, a quarter of the reload bytes: about 4x here (29.0 vs 7.4).
  EXPECT_GT(on.tokens_per_s, 2 * off.tokens_per_s);
}

// Full-KV serving with memory for two private copies per GPU: sharing one
// prefix's copy lets more requests in at once.
TEST(SimulatorTest, SharedResidentCopyAdmitsMoreRequests) {
  SimConfig c = OneRequest();
  c.mode = SimConfig::Mode::kFull;
  c.hbm_bytes = 3.5e9;  // 2.5 GB free: two 1 GB copies, not three
  c.requests = 8;
  c.concurrency = 8;
  c.output_tokens = Distribution::Fixed(3);
  c.shared_prefixes = 1;
  const auto [off, on] = RunSharingOffAndOn(c);
  EXPECT_EQ(on.output_tokens, off.output_tokens);
  EXPECT_EQ(on.shared_resident, 7) << "one copy for all eight";
  EXPECT_NEAR(off.gpus[0].peak_resident_bytes, 2e9, 1);
  EXPECT_LT(on.makespan_s, off.makespan_s);
}

TEST(SimulatorTest, ParsesThePrefixSharingKnobs) {
  auto c = ParseSimConfig(
      R"({"model": "llama-70b", "workload": {"shared_prefixes": 8, "prefix_sharing": false}})", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shared_prefixes, 8);
  EXPECT_FALSE(c->prefix_sharing);
  auto bad = ParseSimConfig(R"({"model": "llama-70b", "workload": {"shared_prefixes": -1}})", "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("shared_prefixes"), std::string::npos);
}

}  // namespace
}  // namespace vc::sim
