// The coordinator's one placement rule over a WorkerHealth with a fake probe:
// a prefix sticks to one live verifier, a down one is skipped, a prompt
// without a prefix is placed by its session, and an empty pool is a clear
// UNAVAILABLE naming why each worker is down.
#include "services/coordinator/placement.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vc::coordinator {
namespace {

absl::Status Healthy(WorkerPool, int) { return absl::OkStatus(); }

TEST(PlacementTest, PrefixSticksToOneVerifierAndMovesOnlyWhenItIsDown) {
  WorkerHealth health(3, 1, Healthy);
  Placement p(&health, {"v0:1", "v1:1", "v2:1"}, {"d0:1"});
  const absl::StatusOr<int> first = p.Verifier("abcd");
  ASSERT_TRUE(first.ok()) << first.status();
  for (uint64_t session = 0; session < 10; ++session) {
    EXPECT_EQ(*p.Verifier("abcd", session), *first) << "the session does not matter with a prefix";
  }
  health.MarkDown(WorkerPool::kVerifier, *first, absl::UnavailableError("gone"));
  const absl::StatusOr<int> moved = p.Verifier("abcd");
  ASSERT_TRUE(moved.ok());
  EXPECT_NE(*moved, *first);
  health.MarkUp(WorkerPool::kVerifier, *first);
  EXPECT_EQ(*p.Verifier("abcd"), *first) << "back on its home once that is up again";
}

TEST(PlacementTest, PromptsWithoutPrefixSpreadBySession) {
  WorkerHealth health(3, 1, Healthy);
  Placement p(&health, {"v0:1", "v1:1", "v2:1"}, {"d0:1"});
  std::set<int> used;
  for (uint64_t session = 1; session <= 64; ++session) {
    const absl::StatusOr<int> v = p.Verifier("", session);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*p.Verifier("", session), *v) << "deterministic";
    used.insert(*v);
  }
  EXPECT_EQ(used.size(), 3u);
}

TEST(PlacementTest, NoLiveVerifierNamesEveryOneAndWhy) {
  WorkerHealth health(2, 1, Healthy);
  Placement p(&health, {"v0:1", "v1:1"}, {"d0:1"});
  health.MarkDown(WorkerPool::kVerifier, 0, absl::UnavailableError("refused"));
  health.MarkDown(WorkerPool::kVerifier, 1, absl::UnavailableError("timed out"));
  const absl::StatusOr<int> v = p.Verifier("abcd");
  ASSERT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(v.status().message(), "no live verifier: v0:1 (refused), v1:1 (timed out)");
}

TEST(PlacementTest, DrafterIsTheLeastLoadedLiveOne) {
  WorkerHealth health(1, 3, Healthy);
  Placement p(&health, {"v0:1"}, {"d0:1", "d1:1", "d2:1"});
  EXPECT_EQ(*p.Drafter({2, 1, 1}), 1) << "lowest index on ties";
  health.MarkDown(WorkerPool::kDrafter, 1, absl::UnavailableError("gone"));
  EXPECT_EQ(*p.Drafter({2, 1, 1}), 2);
  health.MarkDown(WorkerPool::kDrafter, 0, absl::UnavailableError("gone"));
  health.MarkDown(WorkerPool::kDrafter, 2, absl::UnavailableError("gone"));
  const absl::StatusOr<int> none = p.Drafter({0, 0, 0});
  ASSERT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(none.status().message(), "no live drafter: d0:1 (gone) and the others");
}

}  // namespace
}  // namespace vc::coordinator
