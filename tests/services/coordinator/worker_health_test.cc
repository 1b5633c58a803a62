// WorkerHealth with a fake probe: transitions, placement among live workers
// only (deterministic, sticky per key, only a dead worker's keys move), and
// the background prober taking a worker back.
#include "services/coordinator/worker_health.h"

#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vc::coordinator {
namespace {

// Probe answers set by the test, per (pool, index); default healthy.
struct FakeProbe {
  std::mutex mu;
  std::map<std::pair<int, int>, absl::Status> answers;
  int calls = 0;
  void Set(WorkerPool pool, int i, absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    answers[{static_cast<int>(pool), i}] = std::move(s);
  }
  absl::Status operator()(WorkerPool pool, int i) {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    auto it = answers.find({static_cast<int>(pool), i});
    return it == answers.end() ? absl::OkStatus() : it->second;
  }
};

TEST(WorkerHealthTest, TransportErrorsMarkDownAtOnceOtherErrorsDoNot) {
  WorkerHealth h(2, 2, [](WorkerPool, int) { return absl::OkStatus(); });
  EXPECT_TRUE(h.Up(WorkerPool::kVerifier, 1));
  EXPECT_FALSE(h.ReportFailure(WorkerPool::kVerifier, 1, absl::InvalidArgumentError("bad draft")));
  EXPECT_TRUE(h.Up(WorkerPool::kVerifier, 1));
  EXPECT_TRUE(h.ReportFailure(WorkerPool::kVerifier, 1, absl::UnavailableError("Socket closed")));
  EXPECT_FALSE(h.Up(WorkerPool::kVerifier, 1));
  EXPECT_EQ(h.DownReason(WorkerPool::kVerifier, 1), "Socket closed");
  EXPECT_TRUE(h.Up(WorkerPool::kDrafter, 1)) << "pools are separate";
  EXPECT_EQ(h.LiveCount(WorkerPool::kVerifier), 1);
  h.MarkUp(WorkerPool::kVerifier, 1);
  EXPECT_TRUE(h.Up(WorkerPool::kVerifier, 1));
  EXPECT_EQ(h.DownReason(WorkerPool::kVerifier, 1), "");
  // Out of range indices are ignored, not a crash.
  h.MarkDown(WorkerPool::kVerifier, 7, absl::UnavailableError("x"));
  EXPECT_FALSE(h.Up(WorkerPool::kVerifier, 7));
  EXPECT_EQ(h.LiveCount(WorkerPool::kVerifier), 2);
}

TEST(WorkerHealthTest, ProbeRoundTakesWorkersDownAndBackWithOneEventPerTransition) {
  FakeProbe probe;
  std::vector<std::string> events;
  std::mutex events_mu;
  WorkerHealth h(
      2, 1, [&](WorkerPool p, int i) { return probe(p, i); }, {},
      [&](WorkerPool p, int i, bool up, const absl::Status&) {
        std::lock_guard<std::mutex> lock(events_mu);
        events.push_back(absl::StrCat(WorkerPoolName(p), i, up ? " up" : " down"));
      });
  probe.Set(WorkerPool::kDrafter, 0, absl::UnavailableError("connection refused"));
  h.ProbeAll();
  h.ProbeAll();  // still down: no second event
  EXPECT_FALSE(h.Up(WorkerPool::kDrafter, 0));
  EXPECT_EQ(h.PickLeastLoaded(WorkerPool::kDrafter, {0}), std::nullopt);
  probe.Set(WorkerPool::kDrafter, 0, absl::OkStatus());
  h.ProbeAll();
  EXPECT_TRUE(h.Up(WorkerPool::kDrafter, 0));
  EXPECT_EQ(events, (std::vector<std::string>{"drafter0 down", "drafter0 up"}));
  EXPECT_EQ(probe.calls, 9);
}

TEST(WorkerHealthTest, PlacementByKeyIsStickyAndOnlyTheDeadWorkersKeysMove) {
  WorkerHealth h(4, 1, [](WorkerPool, int) { return absl::OkStatus(); });
  std::map<std::string, int> before;
  std::set<int> used;
  for (int k = 0; k < 200; ++k) {
    const std::string key = absl::StrCat("prefix-", k);
    const auto v = h.PickByKey(WorkerPool::kVerifier, key);
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(h.PickByKey(WorkerPool::kVerifier, key), v) << "deterministic";
    before[key] = *v;
    used.insert(*v);
  }
  EXPECT_EQ(used.size(), 4u) << "keys spread over every worker";
  h.MarkDown(WorkerPool::kVerifier, 2, absl::UnavailableError("killed"));
  for (const auto& [key, v] : before) {
    const auto now = h.PickByKey(WorkerPool::kVerifier, key);
    ASSERT_TRUE(now.has_value());
    EXPECT_NE(*now, 2);
    if (v != 2) {
      EXPECT_EQ(*now, v) << key << " moved although its worker is up";
    }
  }
  // Back up: every key returns to where it was.
  h.MarkUp(WorkerPool::kVerifier, 2);
  for (const auto& [key, v] : before) EXPECT_EQ(h.PickByKey(WorkerPool::kVerifier, key), v);
  for (int i = 0; i < 4; ++i) h.MarkDown(WorkerPool::kVerifier, i, absl::UnavailableError("all dead"));
  EXPECT_EQ(h.PickByKey(WorkerPool::kVerifier, "prefix-1"), std::nullopt);
}

TEST(WorkerHealthTest, LeastLoadedSkipsDeadWorkers) {
  WorkerHealth h(1, 3, [](WorkerPool, int) { return absl::OkStatus(); });
  EXPECT_EQ(h.PickLeastLoaded(WorkerPool::kDrafter, {5, 1, 1}), 1);
  h.MarkDown(WorkerPool::kDrafter, 1, absl::UnavailableError("killed"));
  EXPECT_EQ(h.PickLeastLoaded(WorkerPool::kDrafter, {5, 1, 1}), 2);
  h.MarkDown(WorkerPool::kDrafter, 2, absl::UnavailableError("killed"));
  EXPECT_EQ(h.PickLeastLoaded(WorkerPool::kDrafter, {5, 1, 1}), 0);
}

TEST(WorkerHealthTest, BackgroundProberTakesARestartedWorkerBackAndStops) {
  FakeProbe probe;
  WorkerHealthOptions o;
  o.interval = std::chrono::milliseconds(5);
  WorkerHealth h(1, 1, [&](WorkerPool p, int i) { return probe(p, i); }, o);
  h.MarkDown(WorkerPool::kVerifier, 0, absl::UnavailableError("Socket closed"));
  h.Start();
  // No timing assertion: wait (bounded generously) for the prober.
  for (int i = 0; i < 20000 && !h.Up(WorkerPool::kVerifier, 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(h.Up(WorkerPool::kVerifier, 0));
  h.Stop();
  int calls = 0;
  {
    std::lock_guard<std::mutex> lock(probe.mu);
    calls = probe.calls;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  std::lock_guard<std::mutex> lock(probe.mu);
  EXPECT_EQ(probe.calls, calls) << "probes after Stop()";
}

}  // namespace
}  // namespace vc::coordinator
