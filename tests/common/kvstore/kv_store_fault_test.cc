// The store on a file system that fails: write errors, sync errors and a
// full disk give a clean Status (never a crash), reads keep serving what was
// committed, and a reopen finds every acknowledged commit intact. A machine
// crash (unsynced bytes lost, the last write torn) loses nothing that was
// synced, and a damaged table is reported as DataLoss, never served.
#include <unistd.h>

#include <rocksdb/env.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kvstore/kv_store.h"
#include "gtest/gtest.h"
#include "tests/common/kvstore/fault_injection_fs.h"

namespace vc::kvstore {
namespace {

using testing::FaultInjectionFs;

std::string Key(int i) { return absl::StrCat("key-", i); }
std::string Value(int i, int version) {
  return absl::StrCat("value ", i, " v", version, " ") +
         std::string(static_cast<size_t>(100 + (i * 37 + version * 11) % 900),
                     static_cast<char>('a' + (i + version) % 26));
}

class KvStoreFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("vc_kvstore_fault_", std::string(info->name()), "_", getpid(), "_",
                        counter++);
    std::filesystem::remove_all(dir_);
    fs_ = std::make_shared<FaultInjectionFs>(rocksdb::FileSystem::Default());
    env_ = rocksdb::NewCompositeEnv(fs_);
    options_.path = (dir_ / "db").string();
    options_.env = env_.get();
    options_.dram_budget_bytes = 0;  // every read goes to RocksDB
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void Reopen() {
    store_.reset();
    auto s = KvStore::Open(options_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(s).value();
  }
  // Writes keys [0, n) and checks each commit.
  void PutAll(int n, int version) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(store_->Put(Key(i), Value(i, version)).ok()) << i;
      committed_[i] = version;
    }
  }
  // Every committed key holds exactly its bytes.
  void ExpectCommitted(const char* when) {
    for (const auto& [i, version] : committed_) {
      auto v = store_->Get(Key(i));
      ASSERT_TRUE(v.ok()) << when << ": key " << i << ": " << v.status();
      EXPECT_EQ(*v, Value(i, version)) << when << ": key " << i;
    }
  }
  // A put whose commit failed is either absent or whole after a reopen (the
  // record may have reached the log before the error): never other bytes.
  void ExpectAbsentOrExact(const std::string& key, const std::string& value) {
    auto v = store_->Get(key);
    if (v.ok()) {
      EXPECT_EQ(*v, value);
    } else {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound) << v.status();
    }
  }

  std::filesystem::path dir_;
  std::shared_ptr<FaultInjectionFs> fs_;
  std::unique_ptr<rocksdb::Env> env_;
  KvStoreOptions options_;
  std::unique_ptr<KvStore> store_;
  std::map<int, int> committed_;  // key -> version acknowledged
};

TEST_F(KvStoreFaultTest, WriteErrorIsACleanStatusAndCommittedDataStays) {
  Reopen();
  PutAll(20, 1);
  fs_->FailWrites(true);
  const absl::Status put = store_->Put("failed", Value(99, 1));
  EXPECT_EQ(put.code(), absl::StatusCode::kUnavailable) << put;
  EXPECT_NE(put.message().find("injected write error"), std::string::npos) << put;
  const absl::Status del = store_->Delete(Key(3));
  EXPECT_FALSE(del.ok());
  EXPECT_GT(fs_->injected(), 0);
  // Reads still serve every committed entry (read-path bookkeeping writes
  // fail quietly).
  ExpectCommitted("while writes fail");
  auto found = store_->Lookup({Key(0), Key(19), "failed"});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->size(), 2u);
  fs_->FailWrites(false);
  Reopen();
  ExpectCommitted("after reopen");
  ExpectAbsentOrExact("failed", Value(99, 1));
  PutAll(5, 2);  // writable again after a reopen
  ExpectCommitted("after new puts");
}

TEST_F(KvStoreFaultTest, SyncErrorIsACleanStatusAndCommittedDataStays) {
  Reopen();
  PutAll(20, 1);
  fs_->FailSyncs(true);
  auto id = store_->BeginPut();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store_->Stage(*id, "a", Value(50, 1)).ok());
  ASSERT_TRUE(store_->Stage(*id, "b", Value(51, 1)).ok());
  const absl::Status commit = store_->Commit(*id);
  EXPECT_EQ(commit.code(), absl::StatusCode::kUnavailable) << commit;
  EXPECT_NE(commit.message().find("injected sync error"), std::string::npos) << commit;
  // Not acknowledged, so not visible in this process.
  EXPECT_EQ(store_->Get("a").status().code(), absl::StatusCode::kNotFound);
  ExpectCommitted("while syncs fail");
  EXPECT_EQ(store_->Stats().open_puts, 0);
  fs_->FailSyncs(false);
  Reopen();
  ExpectCommitted("after reopen");
  // The two-phase put is all or nothing even across the failure.
  auto a = store_->Get("a");
  auto b = store_->Get("b");
  EXPECT_EQ(a.ok(), b.ok()) << a.status() << " / " << b.status();
  ExpectAbsentOrExact("a", Value(50, 1));
  ExpectAbsentOrExact("b", Value(51, 1));
}

TEST_F(KvStoreFaultTest, FullDiskIsResourceExhaustedAndCommittedDataStays) {
  Reopen();
  PutAll(20, 1);
  fs_->SetSpaceLeft(0);
  const absl::Status put = store_->Put("no-space", Value(77, 1));
  EXPECT_EQ(put.code(), absl::StatusCode::kResourceExhausted) << put;
  EXPECT_NE(put.message().find("injected full disk"), std::string::npos) << put;
  ExpectCommitted("with the disk full");
  fs_->SetSpaceLeft(-1);  // space freed
  Reopen();
  ExpectCommitted("after reopen");
  ExpectAbsentOrExact("no-space", Value(77, 1));
}

// A machine crash: every synced commit survives, whatever unsynced bytes
// (the read path's access-order updates) were lost or torn.
TEST_F(KvStoreFaultTest, CrashLosesNothingSyncedEvenWithATornTail) {
  Reopen();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const int n = 40;
    for (int i = 0; i < n; ++i) {
      const int version = static_cast<int>(seed);
      ASSERT_TRUE(store_->Put(Key(i), Value(i, version)).ok());
      committed_[i] = version;
      // Reads append unsynced bookkeeping to the log between synced commits.
      auto touched = store_->Get(Key(i / 2));
      ASSERT_TRUE(touched.ok()) << "seed " << seed << " key " << i / 2 << ": " << touched.status();
    }
    for (int i = 0; i < n; i += 7) {
      ASSERT_TRUE(store_->Delete(Key(i)).ok());
      committed_.erase(i);
    }
    for (int i = 1; i < n; i += 3) {  // an unsynced tail of access-order updates
      if (committed_.count(i) > 0) {
        ASSERT_TRUE(store_->Get(Key(i)).ok()) << i;
      }
    }
    const std::string crashed = (dir_ / absl::StrCat("crashed", seed)).string();
    const int64_t dropped = fs_->CopyAsCrashed(options_.path, crashed, /*torn=*/true, seed);
    ASSERT_GE(dropped, 0);
    KvStoreOptions crashed_options = options_;
    crashed_options.path = crashed;
    crashed_options.env = nullptr;  // the copy is read back without faults
    auto reopened = KvStore::Open(crashed_options);
    ASSERT_TRUE(reopened.ok()) << "seed " << seed << ": " << reopened.status();
    for (int i = 0; i < n; ++i) {
      auto v = (*reopened)->Get(Key(i));
      if (committed_.count(i) > 0) {
        ASSERT_TRUE(v.ok()) << "seed " << seed << " key " << i << ": " << v.status();
        EXPECT_EQ(*v, Value(i, committed_[i])) << "seed " << seed << " key " << i;
      } else {
        EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound) << "seed " << seed << " key " << i;
      }
    }
  }
}

// Without sync, a crash may lose the newest commits, but what survives is a
// prefix of them (point-in-time recovery), never a hole, never other bytes.
TEST_F(KvStoreFaultTest, UnsyncedCrashKeepsAPrefixAndNeverServesOtherBytes) {
  options_.sync_writes = false;
  Reopen();
  const int n = 60;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(store_->Put(Key(i), Value(i, 1)).ok());
  int lost_runs = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const std::string crashed = (dir_ / absl::StrCat("crashed", seed)).string();
    const int64_t dropped = fs_->CopyAsCrashed(options_.path, crashed, /*torn=*/true, seed);
    ASSERT_GE(dropped, 0);
    KvStoreOptions crashed_options = options_;
    crashed_options.path = crashed;
    crashed_options.env = nullptr;
    auto reopened = KvStore::Open(crashed_options);
    ASSERT_TRUE(reopened.ok()) << "seed " << seed << ": " << reopened.status();
    int present = 0;
    bool hole = false;
    for (int i = 0; i < n; ++i) {
      auto v = (*reopened)->Get(Key(i));
      if (v.ok()) {
        EXPECT_EQ(*v, Value(i, 1)) << "seed " << seed << " key " << i;
        if (hole) ADD_FAILURE() << "seed " << seed << ": key " << i << " survived an earlier loss";
        ++present;
      } else {
        EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound) << v.status();
        hole = true;
      }
    }
    if (present < n) ++lost_runs;
  }
  // The crash model really dropped unsynced commits (else this proves nothing).
  EXPECT_GT(lost_runs, 0);
}

// Damage to a table file on disk is reported (DataLoss), never served.
TEST_F(KvStoreFaultTest, CorruptTableIsDataLossNeverOtherBytes) {
  Reopen();
  PutAll(200, 1);
  Reopen();  // recovery writes the log into a table file
  store_.reset();
  std::vector<std::filesystem::path> tables;
  for (const auto& e : std::filesystem::directory_iterator(options_.path)) {
    if (e.path().extension() == ".sst") tables.push_back(e.path());
  }
  ASSERT_FALSE(tables.empty()) << "no table file to damage";
  for (const auto& t : tables) {
    std::fstream f(t, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<int64_t>(std::filesystem::file_size(t));
    // Flip bytes through the data blocks (the footer stays, so the file opens).
    for (int64_t off = 64; off < size * 2 / 3; off += 97) {
      f.seekg(off);
      char c = 0;
      f.read(&c, 1);
      f.seekp(off);
      c = static_cast<char>(c ^ 0x5a);
      f.write(&c, 1);
    }
  }
  auto reopened = KvStore::Open(options_);
  if (!reopened.ok()) {
    // The metadata scan at open found the damage.
    EXPECT_EQ(reopened.status().code(), absl::StatusCode::kDataLoss) << reopened.status();
    return;
  }
  int detected = 0;
  for (int i = 0; i < 200; ++i) {
    auto v = (*reopened)->Get(Key(i));
    if (v.ok()) {
      EXPECT_EQ(*v, Value(i, 1)) << "key " << i << " served other bytes";
    } else {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss) << "key " << i << ": " << v.status();
      ++detected;
    }
  }
  EXPECT_GT(detected, 0) << "the damage went unnoticed";
}

}  // namespace
}  // namespace vc::kvstore
