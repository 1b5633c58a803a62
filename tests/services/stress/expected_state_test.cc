// The oracle file: records survive a reopen, a slot cut short by a crash
// falls back to the older slot, a foreign or mismatched file is refused with
// a clear error; the rules allow exactly the outcomes the store may produce.
#include "services/stress/internal/expected_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vc::stress {
namespace {

constexpr int64_t kMB = 1 << 20;

class ExpectedStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::path(::testing::TempDir()) /
             absl::StrCat("vc_oracle_", getpid(), "_", counter++))
                .string();
    std::filesystem::remove(path_);
    options_.path = path_;
    options_.num_keys = 16;
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::unique_ptr<ExpectedState> MustOpen() {
    auto s = ExpectedState::Open(options_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  std::string path_;
  ExpectedStateOptions options_;
};

KeyRecord Committed(uint32_t version) {
  KeyRecord r;
  r.committed_version = version;
  r.next_version = version;
  r.state = KeyState::kCommittedSynced;
  r.commit_g = 1000;
  r.commit_ms = 50'000;
  r.commit_ack_ms = 50'010;
  return r;
}

ExpectContext Ctx() {
  ExpectContext c;
  c.g_now = 1000;
  c.now_ms = c.issue_ms = 50'100;
  c.disk_budget = 4 * kMB;
  c.eviction_slack = 1 * kMB;
  return c;
}

TEST_F(ExpectedStateTest, RecordsAndCountersSurviveAReopen) {
  {
    auto o = MustOpen();
    ASSERT_NE(o, nullptr);
    KeyRecord r = Committed(7);
    r.pending = PendingOp::kPut;
    r.pending_version = 8;
    o->Set(3, r);
    EXPECT_EQ(o->AddTraffic(500), 0);
    EXPECT_EQ(o->NextBatchId(), 1u);
    EXPECT_EQ(o->BeginRun(), 1u);
    ASSERT_TRUE(o->Persist({3}).ok());
  }
  auto o = MustOpen();
  ASSERT_NE(o, nullptr);
  const KeyRecord r = o->Get(3);
  EXPECT_EQ(r.committed_version, 7u);
  EXPECT_EQ(r.pending, PendingOp::kPut);
  EXPECT_EQ(r.pending_version, 8u);
  EXPECT_EQ(o->Get(4).committed_version, 0u);
  EXPECT_EQ(o->Traffic(), 500);
  EXPECT_EQ(o->BeginRun(), 2u);
}

TEST_F(ExpectedStateTest, TornSlotFallsBackToTheOlderRecord) {
  {
    auto o = MustOpen();
    ASSERT_NE(o, nullptr);
    o->Set(2, Committed(1));  // slot 0
    o->Set(2, Committed(2));  // slot 1 (newest)
  }
  // Damage the newest slot as a crash in the middle of writing it would.
  const int fd = open(path_.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(pwrite(fd, junk, sizeof(junk), 4096 + 2 * 256 + 128 + 20), 8);
  close(fd);
  auto o = MustOpen();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->Get(2).committed_version, 1u);
  // The next write goes to the damaged slot and is read back.
  o->Set(2, Committed(3));
  EXPECT_EQ(o->Get(2).committed_version, 3u);
}

TEST_F(ExpectedStateTest, BadFilesAreClearErrors) {
  {
    std::ofstream f(path_);
    f << std::string(8192, 'x');
  }
  auto bad = ExpectedState::Open(options_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  std::filesystem::remove(path_);
  ASSERT_NE(MustOpen(), nullptr);
  ExpectedStateOptions other = options_;
  other.num_keys = 32;
  auto mismatch = ExpectedState::Open(other);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument) << mismatch.status();
  other = options_;
  other.max_value_bytes = 99;
  EXPECT_EQ(ExpectedState::Open(other).status().code(), absl::StatusCode::kInvalidArgument);
  other = options_;
  other.path = path_ + ".missing";
  other.create = false;
  EXPECT_EQ(ExpectedState::Open(other).status().code(), absl::StatusCode::kNotFound);
  other = options_;
  other.min_value_bytes = 4;
  EXPECT_EQ(ExpectedState::Open(other).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpectTest, CommittedEntryMustBePresentUntilEvictionIsPossible) {
  const KeyRecord r = Committed(5);
  ExpectContext c = Ctx();
  Expectation e = Expect(r, 1000, c);
  EXPECT_EQ(e.versions, std::vector<uint32_t>{5});
  EXPECT_FALSE(e.absent_ok);
  // Window = 4 MiB - 1 MiB slack - the value: one byte more and LRU may
  // have evicted it.
  c.g_now = r.commit_g + 3 * kMB - 1000;
  EXPECT_FALSE(Expect(r, 1000, c).absent_ok);
  c.g_now += 1;
  e = Expect(r, 1000, c);
  EXPECT_TRUE(e.absent_ok);
  EXPECT_EQ(e.absent_state, KeyState::kEvicted);
  // A pinned entry is never evicted.
  KeyRecord pinned = r;
  pinned.pins = 1;
  EXPECT_FALSE(Expect(pinned, 1000, c).absent_ok);
  // ... unless the pins are not known (a killed run may have left others).
  c.pins_known = false;
  EXPECT_TRUE(Expect(pinned, 1000, c).absent_ok);
}

TEST(ExpectTest, TtlAllowsMissingAndForbidsServingWhenSurelyExpired) {
  const KeyRecord r = Committed(5);
  ExpectContext c = Ctx();
  c.ttl_ms = 1000;
  c.now_ms = c.issue_ms = r.commit_ms + 500;
  Expectation e = Expect(r, 100, c);
  EXPECT_FALSE(e.absent_ok);
  EXPECT_TRUE(e.present_forbidden.empty());
  c.now_ms = c.issue_ms = r.commit_ms + 1000;
  e = Expect(r, 100, c);
  EXPECT_TRUE(e.absent_ok);
  EXPECT_EQ(e.absent_state, KeyState::kExpired);
  EXPECT_TRUE(e.present_forbidden.empty());  // within the clock slack of the ack
  c.now_ms = c.issue_ms = r.commit_ack_ms + 2000;
  e = Expect(r, 100, c);
  EXPECT_FALSE(e.present_forbidden.empty());
  KeyRecord pinned = r;
  pinned.pins = 1;
  e = Expect(pinned, 100, c);
  EXPECT_FALSE(e.absent_ok);
  EXPECT_TRUE(e.present_forbidden.empty());
}

TEST(ExpectTest, PendingOperationsAllowBothOutcomes) {
  KeyRecord r = Committed(5);
  r.pending = PendingOp::kPut;
  r.pending_version = 6;
  Expectation e = Expect(r, 100, Ctx());
  EXPECT_EQ(e.versions, (std::vector<uint32_t>{5, 6}));
  EXPECT_FALSE(e.absent_ok);
  r.pending = PendingOp::kDelete;
  e = Expect(r, 100, Ctx());
  EXPECT_EQ(e.versions, std::vector<uint32_t>{5});
  EXPECT_TRUE(e.absent_ok);
  KeyRecord fresh;
  fresh.pending = PendingOp::kPut;
  fresh.pending_version = 1;
  e = Expect(fresh, 100, Ctx());
  EXPECT_EQ(e.versions, std::vector<uint32_t>{1});
  EXPECT_TRUE(e.absent_ok);
  // An aborted put never becomes pending: its version is not allowed.
  KeyRecord aborted = Committed(5);
  aborted.next_version = 6;
  e = Expect(aborted, 100, Ctx());
  EXPECT_EQ(e.versions, std::vector<uint32_t>{5});
}

TEST(ExpectTest, UnsyncedCommitsMayRollBackOnlyAfterACrash) {
  KeyRecord r = Committed(9);
  r.state = KeyState::kCommittedUnsynced;
  r.synced_version = 7;
  ExpectContext c = Ctx();
  EXPECT_FALSE(Expect(r, 100, c).absent_ok);
  c.after_crash = true;
  const Expectation e = Expect(r, 100, c);
  EXPECT_TRUE(e.absent_ok);
  EXPECT_EQ(e.versions, (std::vector<uint32_t>{9, 7, 8}));
  r.state = KeyState::kCommittedSynced;
  EXPECT_FALSE(Expect(r, 100, c).absent_ok);
}

TEST(ValuesTest, DeterministicSelfDescribingAndDistinct) {
  const std::string a = ValueBytes(42, 3, 1, 64, 4096);
  EXPECT_EQ(a, ValueBytes(42, 3, 1, 64, 4096));
  EXPECT_EQ(static_cast<int64_t>(a.size()), ValueSize(42, 3, 1, 64, 4096));
  EXPECT_GE(a.size(), 64u);
  EXPECT_LE(a.size(), 4096u);
  EXPECT_NE(a, ValueBytes(42, 3, 2, 64, 4096));
  EXPECT_NE(a, ValueBytes(42, 4, 1, 64, 4096));
  EXPECT_NE(a, ValueBytes(43, 3, 1, 64, 4096));
  auto id = ParseValue(a);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->index, 3u);
  EXPECT_EQ(id->version, 1u);
  EXPECT_EQ(ParseValue("short").status().code(), absl::StatusCode::kInvalidArgument);
  std::string bad = a;
  bad[0] ^= 1;
  EXPECT_EQ(ParseValue(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseValue(a.substr(0, a.size() - 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeyBytes(42, 3).size(), 32u);
  EXPECT_NE(KeyBytes(42, 3), KeyBytes(42, 4));
  EXPECT_NE(KeyBytes(42, 3), KeyBytes(43, 3));
}

}  // namespace
}  // namespace vc::stress
