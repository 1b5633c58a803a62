// vc-stress in process (RunStress on a KvStore): a short run under constant
// eviction finds no violation and exercises every operation; the oracle
// catches a store that serves other bytes, loses a committed entry or
// resurrects an aborted put (the tool can fail); TTL expiry is observed; a
// seed replays a thread's schedule; bad options are clear errors.
#include "services/stress/stress.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/kvstore/kv_store.h"
#include "gtest/gtest.h"
#include "services/stress/internal/expected_state.h"

namespace vc::stress {
namespace {

class StressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("vc_stress_", getpid(), "_", counter++);
    // Short runs: the whole file stays under ~20 s on a loaded 2-core machine.
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    o_.mode = "inproc";
    o_.db_dir = (dir_ / "db").string();
    o_.oracle_path = (dir_ / "oracle").string();
    o_.threads = 3;
    o_.duration_s = 2;
    o_.keys = 256;
    o_.min_value_bytes = 64;
    o_.max_value_bytes = 4096;
    o_.disk_bytes = 256 << 10;  // ~120 average values: eviction all the time
    o_.dram_bytes = 32 << 10;
    o_.oracle_sync = false;     // kill -9 safety is enough here; keeps the smoke fast
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  StressReport MustRun(const StressOptions& o) {
    auto r = RunStress(o);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_EQ(r->violations, 0) << FormatReport(*r);
    EXPECT_EQ(r->unexpected_errors, 0) << FormatReport(*r);
    return *r;
  }
  // A key the oracle says is committed (and not pending) after a run.
  uint32_t CommittedKey(KeyRecord* record, uint64_t* ns) {
    ExpectedStateOptions eo;
    eo.path = o_.oracle_path;
    eo.num_keys = static_cast<uint32_t>(o_.keys);
    eo.min_value_bytes = o_.min_value_bytes;
    eo.max_value_bytes = o_.max_value_bytes;
    eo.create = false;
    auto oracle = ExpectedState::Open(eo);
    EXPECT_TRUE(oracle.ok()) << oracle.status();
    *ns = (*oracle)->key_namespace();
    for (uint32_t i = 0; i < (*oracle)->num_keys(); ++i) {
      const KeyRecord r = (*oracle)->Get(i);
      if (r.committed_version != 0 && r.pending == PendingOp::kNone && r.next_version > r.committed_version) {
        *record = r;
        return i;
      }
    }
    ADD_FAILURE() << "no committed key with a later (aborted or overwritten) version";
    return 0;
  }
  // Verifies with a store that was changed behind the oracle's back.
  StressReport VerifyAfter(const std::function<void(kvstore::KvStore&, uint32_t, const KeyRecord&,
                                                    uint64_t)>& tamper) {
    KeyRecord r;
    uint64_t ns = 0;
    const uint32_t i = CommittedKey(&r, &ns);
    {
      kvstore::KvStoreOptions ko;
      ko.path = o_.db_dir;
      ko.disk_budget_bytes = o_.disk_bytes;
      auto store = kvstore::KvStore::Open(ko);
      EXPECT_TRUE(store.ok()) << store.status();
      tamper(**store, i, r, ns);
    }
    StressOptions v = o_;
    v.verify_only = true;
    auto report = RunStress(v);
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *report : StressReport{};
  }

  std::filesystem::path dir_;
  StressOptions o_;
};

TEST_F(StressTest, ShortRunUnderEvictionHasNoViolation) {
  const StressReport r = MustRun(o_);
  EXPECT_GT(r.total_ops, 100) << FormatReport(r);
  for (const char* op : {"put", "put_abort", "get", "lookup", "delete", "pin", "unpin"}) {
    EXPECT_GT(r.ops.at(op).ok, 0) << op << "\n" << FormatReport(r);
  }
  EXPECT_GT(r.ops.at("put").refused + r.ops.at("put").ok, 0);
  EXPECT_EQ(r.verified_keys, 2 * o_.keys);  // before and after the load
  EXPECT_NE(r.store_stats.find("evictions"), std::string::npos);
  EXPECT_GT(r.observed_evicted, 0) << FormatReport(r);
  EXPECT_EQ(ExitCode(r), 0);
  // A second run resumes from the oracle; --verify-only checks it.
  StressOptions again = o_;
  again.duration_s = 1;
  MustRun(again);
  StressOptions verify = o_;
  verify.verify_only = true;
  const StressReport v = MustRun(verify);
  EXPECT_EQ(v.total_ops, 0);
  EXPECT_EQ(v.verified_keys, o_.keys);
  EXPECT_EQ(v.run, 3u);
}

TEST_F(StressTest, OtherBytesAreAViolation) {
  o_.disk_bytes = 64 << 20;  // nothing evicted: every committed key must be there
  o_.duration_s = 1;
  MustRun(o_);
  const StressReport v = VerifyAfter([](kvstore::KvStore& s, uint32_t i, const KeyRecord& r,
                                        uint64_t ns) {
    std::string bytes = ValueBytes(ns, i, r.committed_version, 64, 4096);
    bytes[bytes.size() / 2] ^= 1;
    ASSERT_TRUE(s.Put(KeyBytes(ns, i), bytes).ok());
  });
  EXPECT_GE(v.violations, 1);
  ASSERT_FALSE(v.violation_messages.empty());
  EXPECT_NE(v.violation_messages[0].find("different bytes"), std::string::npos)
      << v.violation_messages[0];
  EXPECT_EQ(ExitCode(v), 1);
}

TEST_F(StressTest, LostCommitIsAViolation) {
  o_.disk_bytes = 64 << 20;
  o_.duration_s = 1;
  MustRun(o_);
  const StressReport v = VerifyAfter([](kvstore::KvStore& s, uint32_t i, const KeyRecord&,
                                        uint64_t ns) { ASSERT_TRUE(s.Delete(KeyBytes(ns, i)).ok()); });
  EXPECT_GE(v.violations, 1);
  ASSERT_FALSE(v.violation_messages.empty());
  EXPECT_NE(v.violation_messages[0].find("missing"), std::string::npos) << v.violation_messages[0];
}

TEST_F(StressTest, AnAbortedOrOverwrittenValueIsAViolation) {
  o_.disk_bytes = 64 << 20;
  o_.duration_s = 1;
  MustRun(o_);
  const StressReport v = VerifyAfter([](kvstore::KvStore& s, uint32_t i, const KeyRecord& r,
                                        uint64_t ns) {
    ASSERT_TRUE(s.Put(KeyBytes(ns, i), ValueBytes(ns, i, r.next_version, 64, 4096)).ok());
  });
  EXPECT_GE(v.violations, 1);
  ASSERT_FALSE(v.violation_messages.empty());
  EXPECT_NE(v.violation_messages[0].find("aborted, overwritten"), std::string::npos)
      << v.violation_messages[0];
}

TEST_F(StressTest, TtlExpiryIsObservedWithoutViolation) {
  o_.disk_bytes = 64 << 20;  // only expiry removes entries
  o_.ttl_seconds = 1;
  o_.keys = 2048;            // most keys go unwritten for over a second
  o_.duration_s = 2.5;
  const StressReport r = MustRun(o_);
  EXPECT_GT(r.observed_expired, 0) << FormatReport(r);
}

TEST_F(StressTest, UnsyncedCommitsPassTheirOwnChecks) {
  o_.sync_writes = false;
  o_.duration_s = 1;
  MustRun(o_);
}

TEST_F(StressTest, SeedReplaysAThreadsSchedule) {
  o_.threads = 1;
  o_.ops = 400;
  o_.duration_s = 60;
  o_.seed = 4242;
  const StressReport a = MustRun(o_);
  o_.db_dir = (dir_ / "db2").string();
  o_.oracle_path = (dir_ / "oracle2").string();
  const StressReport b = MustRun(o_);
  EXPECT_EQ(a.seed, 4242u);
  EXPECT_EQ(a.total_ops, b.total_ops);
  // One thread on a fresh store and oracle: the same operations, keys and
  // values, so the same outcomes too.
  for (const auto& [op, c] : a.ops) {
    EXPECT_EQ(c.issued, b.ops.at(op).issued) << op;
    EXPECT_EQ(c.ok, b.ops.at(op).ok) << op;
    EXPECT_EQ(c.missing, b.ops.at(op).missing) << op;
  }
}

TEST_F(StressTest, BadOptionsAreClearErrors) {
  StressOptions o = o_;
  o.threads = 0;
  EXPECT_EQ(RunStress(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = o_;
  o.mode = "sideways";
  EXPECT_EQ(RunStress(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = o_;
  o.duration_s = 0;
  EXPECT_EQ(RunStress(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = o_;
  o.mode = "remote";
  o.store_address = "10.1.2.3:7070";  // load only ever goes to loopback
  auto r = RunStress(o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  o = o_;
  o.oracle_path = (dir_ / "never-created").string();
  o.verify_only = true;  // no oracle to verify against
  EXPECT_EQ(RunStress(o).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vc::stress
