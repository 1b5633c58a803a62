#include "common/kvstore/kv_store.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vc::kvstore {
namespace {

class KvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("vc_kvstore_", std::string(info->name()), "_", getpid(), "_", counter++);
    std::filesystem::remove_all(dir_);
    options_.path = (dir_ / "db").string();
    options_.clock_ms = [this] { return now_ms_.load(); };
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // (Re)opens the store with options_, closing any open one first.
  void Reopen() {
    store_.reset();
    auto s = KvStore::Open(options_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(s).value();
  }
  std::string MustGet(const std::string& key) {
    auto v = store_->Get(key);
    EXPECT_TRUE(v.ok()) << key << ": " << v.status();
    return v.ok() ? *v : std::string();
  }
  std::map<std::string, Tier> MustLookup(const std::vector<std::string>& keys) {
    auto r = store_->Lookup(keys);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::map<std::string, Tier>{};
  }

  std::filesystem::path dir_;
  KvStoreOptions options_;
  std::atomic<int64_t> now_ms_{1'000'000};
  std::unique_ptr<KvStore> store_;
};

TEST_F(KvStoreTest, PutGetDelete) {
  Reopen();
  EXPECT_EQ(store_->Get("a").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_->Put("a", "alpha").ok());
  ASSERT_TRUE(store_->Put("b", std::string("\0b\0", 3)).ok());
  EXPECT_EQ(MustGet("a"), "alpha");
  EXPECT_EQ(MustGet("b"), std::string("\0b\0", 3));
  ASSERT_TRUE(store_->Put("a", "alpha2").ok());  // overwrite
  EXPECT_EQ(MustGet("a"), "alpha2");
  ASSERT_TRUE(store_->Delete("a").ok());
  EXPECT_EQ(store_->Get("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Delete("a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Put("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Put(std::string(300, 'k'), "x").code(), absl::StatusCode::kInvalidArgument);
  const KvStoreStats s = store_->Stats();
  EXPECT_EQ(s.disk_entries, 1);
  EXPECT_EQ(s.disk_bytes, 3);
}

TEST_F(KvStoreTest, CommitIsAtomic) {
  Reopen();
  auto id = store_->BeginPut();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store_->Stage(*id, "c0", "zero").ok());
  ASSERT_TRUE(store_->Stage(*id, "c1", "one").ok());
  ASSERT_TRUE(store_->Stage(*id, "c1", "ONE").ok());  // last stage wins
  EXPECT_TRUE(MustLookup({"c0", "c1"}).empty());
  EXPECT_EQ(store_->Get("c0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().open_puts, 1);
  EXPECT_EQ(store_->Stats().staged_bytes, 7);
  ASSERT_TRUE(store_->Commit(*id).ok());
  EXPECT_EQ(MustLookup({"c0", "c1"}).size(), 2u);
  EXPECT_EQ(MustGet("c1"), "ONE");
  EXPECT_EQ(store_->Commit(*id).code(), absl::StatusCode::kNotFound);  // already done
  EXPECT_EQ(store_->Stage(*id, "c2", "x").code(), absl::StatusCode::kNotFound);

  // Abort discards.
  auto aborted = store_->BeginPut();
  ASSERT_TRUE(aborted.ok());
  ASSERT_TRUE(store_->Stage(*aborted, "d0", "x").ok());
  ASSERT_TRUE(store_->Abort(*aborted).ok());
  EXPECT_TRUE(MustLookup({"d0"}).empty());
  EXPECT_EQ(store_->Stats().staged_bytes, 0);

  // An uncommitted put does not survive the store.
  auto pending = store_->BeginPut();
  ASSERT_TRUE(pending.ok());
  ASSERT_TRUE(store_->Stage(*pending, "e0", "never").ok());
  Reopen();
  EXPECT_TRUE(MustLookup({"e0"}).empty());
  EXPECT_EQ(store_->Commit(*pending).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MustGet("c0"), "zero");
  EXPECT_EQ(store_->Stats().open_puts, 0);
}

TEST_F(KvStoreTest, PendingPutsAreBounded) {
  options_.max_open_puts = 2;
  options_.max_staged_bytes = 10;
  Reopen();
  auto a = store_->BeginPut();
  auto b = store_->BeginPut();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(store_->BeginPut().status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store_->Stage(*a, "k", "123456").ok());
  EXPECT_EQ(store_->Stage(*b, "k", "123456").code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store_->Stage(*a, "k", "12").ok());  // replacing frees bytes
  ASSERT_TRUE(store_->Stage(*b, "k", "123456").ok());
  ASSERT_TRUE(store_->Abort(*a).ok());
  EXPECT_TRUE(store_->BeginPut().ok());
}

TEST_F(KvStoreTest, OpenPutsAreLeasesThatExpire) {
  options_.put_lease_seconds = 10;
  options_.max_open_puts = 1;
  Reopen();
  auto a = store_->BeginPut("w1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(store_->Stage(*a, "k", "value", "w1").ok());
  now_ms_ += 9'000;  // each use renews the lease
  ASSERT_TRUE(store_->Stage(*a, "k2", "value", "w1").ok());
  now_ms_ += 9'000;
  EXPECT_EQ(store_->Stats().open_puts, 1);
  now_ms_ += 1'001;  // 10 s since the last use: abandoned
  EXPECT_EQ(store_->ExpirePuts(), 1);
  const KvStoreStats st = store_->Stats();
  EXPECT_EQ(st.open_puts, 0);
  EXPECT_EQ(st.staged_bytes, 0);
  EXPECT_EQ(st.expired_puts, 1);
  EXPECT_EQ(store_->Commit(*a, "w1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Get("k").status().code(), absl::StatusCode::kNotFound);
  // The slot it held is free again; BeginPut also sweeps expired puts.
  auto b = store_->BeginPut("w1");
  ASSERT_TRUE(b.ok());
  now_ms_ += 10'000;
  EXPECT_TRUE(store_->BeginPut("w2").ok());
}

TEST_F(KvStoreTest, APutBelongsToItsOwner) {
  Reopen();
  auto a = store_->BeginPut("addr:10.0.0.1");
  ASSERT_TRUE(a.ok());
  // Another caller gets the same answer as for a put that never existed.
  for (const std::string& other : {std::string("addr:10.0.0.2"), std::string()}) {
    EXPECT_EQ(store_->Stage(*a, "k", "forged", other).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(store_->ReserveStage(*a, other, 10).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(store_->Commit(*a, other).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(store_->Abort(*a, other).code(), absl::StatusCode::kNotFound);
  }
  ASSERT_TRUE(store_->Stage(*a, "k", "mine", "addr:10.0.0.1").ok());
  ASSERT_TRUE(store_->Commit(*a, "addr:10.0.0.1").ok());
  EXPECT_EQ(MustGet("k"), "mine");
}

TEST_F(KvStoreTest, ReservationsHoldTheStagingBudget) {
  options_.max_staged_bytes = 100;
  Reopen();
  auto a = store_->BeginPut("w");
  auto b = store_->BeginPut("w");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(store_->ReserveStage(*a, "w", 80).ok());
  // The reservation counts: another upload of 30 does not fit...
  EXPECT_EQ(store_->ReserveStage(*b, "w", 30).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Stage(*b, "x", std::string(30, 'x'), "w").code(),
            absl::StatusCode::kResourceExhausted);
  // ...while the reserving put stages within it.
  ASSERT_TRUE(store_->Stage(*a, "k", std::string(60, 'v'), "w").ok());
  EXPECT_EQ(store_->Stats().reserved_bytes, 20);
  store_->ReleaseStage(*a, 20);  // the upload ended: framing and the rest
  EXPECT_EQ(store_->Stats().reserved_bytes, 0);
  EXPECT_TRUE(store_->ReserveStage(*b, "w", 30).ok());
  // Aborting a put returns its reservation too.
  ASSERT_TRUE(store_->Abort(*b, "w").ok());
  EXPECT_EQ(store_->Stats().reserved_bytes, 0);
  EXPECT_EQ(store_->ReserveStage(*a, "w", 41).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store_->ReserveStage(*a, "w", 40).ok());
  store_->ReleaseStage(*a, 1000);  // never more than was reserved
  EXPECT_EQ(store_->Stats().reserved_bytes, 0);
  EXPECT_EQ(store_->Stats().staged_bytes, 60);
}

// One identity's open puts hold at most max_staged_bytes_per_identity of the
// staging budget (reserved or staged), so the others keep the rest.
TEST_F(KvStoreTest, StagingIsLimitedPerIdentity) {
  options_.max_staged_bytes = 100;
  options_.max_staged_bytes_per_identity = 60;
  Reopen();
  auto a1 = store_->BeginPut("cert:a");
  auto a2 = store_->BeginPut("cert:a");
  auto b = store_->BeginPut("cert:b");
  ASSERT_TRUE(a1.ok() && a2.ok() && b.ok());
  ASSERT_TRUE(store_->ReserveStage(*a1, "cert:a", 40).ok());
  // Across its puts: 40 reserved in one, 21 more in another is too much.
  const absl::Status over = store_->ReserveStage(*a2, "cert:a", 21);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(over.message()).find("max_staged_bytes_per_identity 60"), std::string::npos)
      << over;
  EXPECT_EQ(store_->Stage(*a2, "x", std::string(21, 'x'), "cert:a").code(),
            absl::StatusCode::kResourceExhausted);
  // Staging inside its reservation costs nothing more.
  ASSERT_TRUE(store_->Stage(*a1, "k", std::string(40, 'v'), "cert:a").ok());
  ASSERT_TRUE(store_->Stage(*a2, "y", std::string(20, 'y'), "cert:a").ok());
  // The other identity still has the rest of the store-wide budget.
  EXPECT_TRUE(store_->ReserveStage(*b, "cert:b", 40).ok());
  EXPECT_EQ(store_->ReserveStage(*b, "cert:b", 1).code(), absl::StatusCode::kResourceExhausted)
      << "store-wide budget";
  store_->ReleaseStage(*b, 40);
  // Committing or aborting gives an identity's bytes back.
  ASSERT_TRUE(store_->Commit(*a1, "cert:a").ok());
  ASSERT_TRUE(store_->Abort(*a2, "cert:a").ok());
  auto a3 = store_->BeginPut("cert:a");
  ASSERT_TRUE(a3.ok());
  EXPECT_TRUE(store_->ReserveStage(*a3, "cert:a", 60).ok());
  EXPECT_EQ(store_->Stats().reserved_bytes, 60);
  EXPECT_EQ(store_->Stats().staged_bytes, 0);
  // An expired put gives them back too.
  now_ms_ += options_.put_lease_seconds * 1000 + 1;
  EXPECT_EQ(store_->ExpirePuts(), 2);
  auto a4 = store_->BeginPut("cert:a");
  ASSERT_TRUE(a4.ok());
  EXPECT_TRUE(store_->ReserveStage(*a4, "cert:a", 60).ok());
  options_.max_staged_bytes_per_identity = 0;
  EXPECT_EQ(KvStore::Open(options_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, DurableAcrossReopen) {
  Reopen();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(store_->Put(absl::StrCat("key", i), std::string(i + 1, 'a' + i)).ok());
  }
  ASSERT_TRUE(store_->Delete("key3").ok());
  const KvStoreStats before = store_->Stats();
  Reopen();
  const KvStoreStats after = store_->Stats();
  EXPECT_EQ(after.disk_entries, before.disk_entries);
  EXPECT_EQ(after.disk_bytes, before.disk_bytes);
  EXPECT_EQ(after.dram_entries, 0);
  for (int i = 0; i < 20; ++i) {
    auto v = store_->Get(absl::StrCat("key", i));
    if (i == 3) {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
    } else {
      ASSERT_TRUE(v.ok()) << i;
      EXPECT_EQ(*v, std::string(i + 1, 'a' + i));
    }
  }
}

TEST_F(KvStoreTest, DramTierServesHotEntries) {
  Reopen();
  ASSERT_TRUE(store_->Put("k", "value").ok());
  EXPECT_EQ(MustLookup({"k", "missing"}), (std::map<std::string, Tier>{{"k", Tier::kDram}}));
  EXPECT_EQ(MustGet("k"), "value");
  EXPECT_EQ(store_->Stats().dram_hits, 1);
  EXPECT_EQ(store_->Stats().disk_hits, 0);
  Reopen();  // DRAM is empty after a restart
  EXPECT_EQ(MustLookup({"k"}).at("k"), Tier::kDisk);
  EXPECT_EQ(MustGet("k"), "value");
  EXPECT_EQ(store_->Stats().disk_hits, 1);
  EXPECT_EQ(MustLookup({"k"}).at("k"), Tier::kDram);  // promoted
  EXPECT_EQ(MustGet("k"), "value");
  EXPECT_EQ(store_->Stats().dram_hits, 1);

  options_.dram_budget_bytes = 0;  // tier off
  Reopen();
  EXPECT_EQ(MustGet("k"), "value");
  EXPECT_EQ(MustLookup({"k"}).at("k"), Tier::kDisk);
  EXPECT_EQ(store_->Stats().dram_entries, 0);
}

TEST_F(KvStoreTest, DramLruEviction) {
  options_.dram_budget_bytes = 250;
  Reopen();
  const std::string v(100, 'v');
  ASSERT_TRUE(store_->Put("a", v).ok());
  ASSERT_TRUE(store_->Put("b", v).ok());
  EXPECT_EQ(MustGet("a"), v);  // a is now more recent than b
  ASSERT_TRUE(store_->Put("c", v).ok());
  auto tiers = MustLookup({"a", "b", "c"});
  EXPECT_EQ(tiers.at("a"), Tier::kDram);
  EXPECT_EQ(tiers.at("b"), Tier::kDisk);
  EXPECT_EQ(tiers.at("c"), Tier::kDram);
  const KvStoreStats s = store_->Stats();
  EXPECT_EQ(s.dram_evictions, 1);
  EXPECT_EQ(s.dram_bytes, 200);
  EXPECT_EQ(s.disk_entries, 3);
  EXPECT_EQ(s.disk_evictions, 0);
  // An entry larger than the DRAM budget is served from disk only.
  ASSERT_TRUE(store_->Put("big", std::string(300, 'x')).ok());
  EXPECT_EQ(MustLookup({"big"}).at("big"), Tier::kDisk);
  EXPECT_EQ(store_->Stats().dram_bytes, 200);
}

TEST_F(KvStoreTest, DiskLruEvictionAndOrderSurvivesReopen) {
  options_.disk_budget_bytes = 300;
  Reopen();
  const std::string v(100, 'v');
  ASSERT_TRUE(store_->Put("a", v).ok());
  ASSERT_TRUE(store_->Put("b", v).ok());
  ASSERT_TRUE(store_->Put("c", v).ok());
  EXPECT_EQ(MustGet("a"), v);             // order now (old->new): b c a
  ASSERT_TRUE(store_->Put("d", v).ok());  // evicts b
  EXPECT_EQ(MustLookup({"a", "b", "c", "d"}).count("b"), 0u);
  EXPECT_EQ(store_->Stats().disk_evictions, 1);
  EXPECT_EQ(store_->Stats().disk_bytes, 300);
  Reopen();  // order c a d is kept on disk
  EXPECT_EQ(store_->Stats().disk_bytes, 300);
  ASSERT_TRUE(store_->Put("e", v).ok());  // evicts c
  auto live = MustLookup({"a", "b", "c", "d", "e"});
  EXPECT_EQ(live.size(), 3u);
  EXPECT_EQ(live.count("c"), 0u);
  // A multi-entry commit evicts as many as it needs, never its own entries.
  auto id = store_->BeginPut();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store_->Stage(*id, "f", v).ok());
  ASSERT_TRUE(store_->Stage(*id, "g", v).ok());
  ASSERT_TRUE(store_->Commit(*id).ok());
  live = MustLookup({"a", "d", "e", "f", "g"});
  EXPECT_EQ(live.size(), 3u);
  EXPECT_EQ(live.count("f") + live.count("g") + live.count("e"), 3u);
  // A value bigger than the whole budget cannot fit.
  EXPECT_EQ(store_->Put("huge", std::string(301, 'h')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(MustLookup({"e", "f", "g"}).size(), 3u);  // nothing was evicted for it
}

TEST_F(KvStoreTest, PinnedEntriesAreNeverEvicted) {
  options_.disk_budget_bytes = 200;
  options_.dram_budget_bytes = 100;
  Reopen();
  const std::string v(100, 'v');
  ASSERT_TRUE(store_->Put("a", v).ok());
  ASSERT_TRUE(store_->Pin("a", "h1").ok());
  ASSERT_TRUE(store_->Put("b", v).ok());  // DRAM: a is pinned, b not cached
  EXPECT_EQ(MustLookup({"a"}).at("a"), Tier::kDram);
  EXPECT_EQ(MustLookup({"b"}).at("b"), Tier::kDisk);
  ASSERT_TRUE(store_->Put("c", v).ok());  // disk: evicts b, not the older a
  auto live = MustLookup({"a", "b", "c"});
  EXPECT_EQ(live.count("a"), 1u);
  EXPECT_EQ(live.count("b"), 0u);
  ASSERT_TRUE(store_->Pin("c", "h1").ok());
  EXPECT_EQ(store_->Put("d", v).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Stats().pinned_entries, 2);
  EXPECT_EQ(store_->Delete("a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Pin("zz", "h1").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->Unpin("b", "h1").ok()) << "an unpin of what is not pinned changes nothing";
  ASSERT_TRUE(store_->Pin("a", "h1").ok());  // the same holder: no second pin
  ASSERT_TRUE(store_->Pin("a", "h2").ok());
  ASSERT_TRUE(store_->Unpin("a", "h1").ok());
  EXPECT_EQ(store_->Put("d", v).code(),
            absl::StatusCode::kResourceExhausted);  // a still pinned by h2, c pinned
  ASSERT_TRUE(store_->Unpin("a", "h2").ok());
  ASSERT_TRUE(store_->Unpin("a", "h2").ok());  // repeated: harmless
  ASSERT_TRUE(store_->Put("d", v).ok());       // now a can go
  EXPECT_EQ(MustLookup({"a"}).count("a"), 0u);
  EXPECT_EQ(MustGet("c"), v);
}

TEST_F(KvStoreTest, TtlExpiresOnRead) {
  options_.ttl_seconds = 10;
  Reopen();
  ASSERT_TRUE(store_->Put("a", "x").ok());
  ASSERT_TRUE(store_->Put("p", "y").ok());
  ASSERT_TRUE(store_->Pin("p", "h").ok());
  now_ms_ += 9'999;
  EXPECT_EQ(MustGet("a"), "x");  // reads do not extend the lifetime
  now_ms_ += 1;
  EXPECT_EQ(store_->Get("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MustGet("p"), "y");  // pinned: not expired
  KvStoreStats s = store_->Stats();
  EXPECT_EQ(s.expirations, 1);
  EXPECT_EQ(s.disk_entries, 1);
  // Write time is persisted: an old entry is expired after a reopen; so is
  // the pin, which keeps p.
  ASSERT_TRUE(store_->Put("b", "z").ok());
  now_ms_ += 20'000;
  Reopen();
  EXPECT_EQ(MustLookup({"b", "p"}).size(), 1u);
  EXPECT_EQ(MustGet("p"), "y");
  ASSERT_TRUE(store_->Unpin("p", "h").ok());
  EXPECT_EQ(store_->Get("p").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().disk_entries, 0);
}

// Pins survive a reopen with their holders.
TEST_F(KvStoreTest, PinsAndTheirHoldersSurviveAReopen) {
  options_.disk_budget_bytes = 300;
  Reopen();
  const std::string v(100, 'v');
  ASSERT_TRUE(store_->Put("a", v).ok());
  ASSERT_TRUE(store_->Put("b", v).ok());
  ASSERT_TRUE(store_->Put("ab", v).ok());
  ASSERT_TRUE(store_->Pin("a", "h1").ok());
  ASSERT_TRUE(store_->Pin("a", "h2").ok());
  // Key "a" with holder "bx" and key "ab" with holder "x" are two pins.
  ASSERT_TRUE(store_->Pin("a", "bx").ok());
  ASSERT_TRUE(store_->Pin("ab", "x").ok());
  ASSERT_TRUE(store_->Unpin("a", "bx").ok());
  Reopen();
  EXPECT_EQ(store_->Stats().pinned_entries, 2);
  EXPECT_EQ(store_->Delete("a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Delete("ab").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->Put("c", v).ok());  // evicts b, the unpinned one
  EXPECT_EQ(MustLookup({"a", "b", "ab", "c"}).count("b"), 0u);
  ASSERT_TRUE(store_->Unpin("a", "h1").ok());
  ASSERT_TRUE(store_->Unpin("ab", "x").ok());
  Reopen();
  EXPECT_EQ(store_->Delete("a").code(), absl::StatusCode::kFailedPrecondition) << "h2 holds it";
  ASSERT_TRUE(store_->Delete("ab").ok());
  ASSERT_TRUE(store_->Unpin("a", "h2").ok());
  Reopen();
  EXPECT_EQ(store_->Stats().pinned_entries, 0);
  ASSERT_TRUE(store_->Delete("a").ok());
}

// The holders with a pin, by name prefix, in byte order and bounded; a
// holder whose last pin goes (an unpin, or a reopen without it) is not
// listed.
TEST_F(KvStoreTest, PinHoldersAreListedByPrefix) {
  Reopen();
  for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(store_->Put(k, "x").ok());
  ASSERT_TRUE(store_->Pin("a", "t1/p2").ok());
  ASSERT_TRUE(store_->Pin("b", "t1/p2").ok());
  ASSERT_TRUE(store_->Pin("a", "t1/p1").ok());
  ASSERT_TRUE(store_->Pin("c", "t2/p1").ok());
  auto list = [&](const std::string& prefix, int limit) {
    absl::StatusOr<KvStore::PinHolderList> l = store_->PinHolders(prefix, limit);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? *l : KvStore::PinHolderList{};
  };
  EXPECT_EQ(list("t1/", 10).holders, (std::vector<std::string>{"t1/p1", "t1/p2"}));
  EXPECT_FALSE(list("t1/", 10).truncated);
  EXPECT_EQ(list("t1/", 1).holders, std::vector<std::string>{"t1/p1"});
  EXPECT_TRUE(list("t1/", 1).truncated);
  EXPECT_EQ(list("", 10).holders.size(), 3u);
  ASSERT_TRUE(store_->Unpin("a", "t1/p2").ok());
  EXPECT_EQ(list("t1/", 10).holders.size(), 2u) << "t1/p2 still pins b";
  ASSERT_TRUE(store_->Unpin("b", "t1/p2").ok());
  Reopen();
  EXPECT_EQ(list("t1/", 10).holders, std::vector<std::string>{"t1/p1"});
  EXPECT_EQ(list("t2/", 10).holders, std::vector<std::string>{"t2/p1"});
  EXPECT_EQ(store_->PinHolders("t", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->PinHolders("t", KvStore::kMaxPinHoldersListed + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->PinHolders(std::string(257, 't'), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, PinHoldersAreBoundedAndNamed) {
  options_.max_pin_holders = 2;
  options_.max_holder_bytes = 8;
  Reopen();
  ASSERT_TRUE(store_->Put("a", "x").ok());
  EXPECT_EQ(store_->Pin("a", "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Unpin("a", "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Pin("a", "123456789").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store_->Pin("a", "12345678").ok());
  ASSERT_TRUE(store_->Pin("a", "h").ok());
  const absl::Status third = store_->Pin("a", "g");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_TRUE(store_->Pin("a", "h").ok()) << "a holder's pin again is no new holder";
  options_.max_pin_holders = 0;
  EXPECT_EQ(KvStore::Open(options_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, StatsCountHitsMissesAndBytes) {
  Reopen();
  ASSERT_TRUE(store_->Put("a", "1234").ok());
  ASSERT_TRUE(store_->Put("b", "56").ok());
  (void)store_->Get("a");
  (void)store_->Get("nope");
  (void)store_->Get("nope2");
  const KvStoreStats s = store_->Stats();
  EXPECT_EQ(s.disk_entries, 2);
  EXPECT_EQ(s.disk_bytes, 6);
  EXPECT_EQ(s.dram_entries, 2);
  EXPECT_EQ(s.dram_bytes, 6);
  EXPECT_EQ(s.dram_hits, 1);
  EXPECT_EQ(s.disk_hits, 0);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.pinned_entries, 0);
}

TEST_F(KvStoreTest, BadPathAndOptionsGiveClearErrors) {
  std::filesystem::create_directories(dir_);
  const std::string file = (dir_ / "plainfile").string();
  std::ofstream(file) << "x";
  options_.path = absl::StrCat(file, "/db");
  auto s = KvStore::Open(options_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(options_.path), std::string::npos) << s.status();

  KvStoreOptions empty;
  EXPECT_EQ(KvStore::Open(empty).status().code(), absl::StatusCode::kInvalidArgument);
  KvStoreOptions bad = options_;
  bad.path = (dir_ / "ok").string();
  bad.disk_budget_bytes = 0;
  EXPECT_EQ(KvStore::Open(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.disk_budget_bytes = 1;
  bad.ttl_seconds = -1;
  EXPECT_EQ(KvStore::Open(bad).status().code(), absl::StatusCode::kInvalidArgument);

  // A second store on an open database fails (RocksDB's lock), not crashes.
  options_.path = (dir_ / "db2").string();
  Reopen();
  auto second = KvStore::Open(options_);
  EXPECT_FALSE(second.ok());
}

// Random put/get/delete/commit/abort/reopen against a std::map oracle.
TEST_F(KvStoreTest, RandomizedAgainstModel) {
  options_.sync_writes = false;
  options_.dram_budget_bytes = 2000;  // forces DRAM evictions; disk unbounded
  Reopen();
  std::mt19937 rng(12345);
  std::map<std::string, std::string> model;
  auto key = [&] { return absl::StrCat("k", rng() % 40); };
  auto value = [&] { return std::string(rng() % 200, static_cast<char>('a' + rng() % 26)); };
  for (int op = 0; op < 3000; ++op) {
    const int r = static_cast<int>(rng() % 100);
    if (r < 30) {
      const std::string k = key(), v = value();
      ASSERT_TRUE(store_->Put(k, v).ok());
      model[k] = v;
    } else if (r < 60) {
      const std::string k = key();
      auto got = store_->Get(k);
      auto it = model.find(k);
      if (it == model.end()) {
        ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << "op " << op;
      } else {
        ASSERT_TRUE(got.ok()) << "op " << op << ": " << got.status();
        ASSERT_EQ(*got, it->second) << "op " << op;
      }
    } else if (r < 75) {
      const std::string k = key();
      const absl::Status s = store_->Delete(k);
      ASSERT_EQ(s.ok(), model.erase(k) == 1) << "op " << op << ": " << s;
    } else if (r < 90) {
      auto id = store_->BeginPut();
      ASSERT_TRUE(id.ok());
      std::map<std::string, std::string> staged;
      for (int n = 1 + rng() % 4; n > 0; --n) {
        const std::string k = key(), v = value();
        ASSERT_TRUE(store_->Stage(*id, k, v).ok());
        staged[k] = v;
      }
      const std::vector<std::string> probe = {staged.begin()->first};
      const auto seen = MustLookup(probe);
      ASSERT_EQ(seen.size(), model.count(probe[0])) << "staged data visible, op " << op;
      if (rng() % 3 == 0) {
        ASSERT_TRUE(store_->Abort(*id).ok());
      } else {
        ASSERT_TRUE(store_->Commit(*id).ok());
        for (auto& [k, v] : staged) model[k] = v;
      }
    } else if (r < 97) {
      std::vector<std::string> keys;
      for (int i = 0; i < 40; ++i) keys.push_back(absl::StrCat("k", i));
      const auto found = MustLookup(keys);
      ASSERT_EQ(found.size(), model.size()) << "op " << op;
      for (auto& [k, tier] : found) ASSERT_EQ(model.count(k), 1u) << k;
    } else {
      if (rng() % 2 == 0) {
        auto id = store_->BeginPut();  // left open: discarded by the reopen
        ASSERT_TRUE(id.ok());
        ASSERT_TRUE(store_->Stage(*id, key(), "lost").ok());
      }
      Reopen();
    }
    const KvStoreStats s = store_->Stats();
    ASSERT_EQ(s.disk_entries, static_cast<int64_t>(model.size())) << "op " << op;
    ASSERT_LE(s.dram_bytes, options_.dram_budget_bytes);
  }
  int64_t bytes = 0;
  for (auto& [k, v] : model) bytes += static_cast<int64_t>(v.size());
  EXPECT_EQ(store_->Stats().disk_bytes, bytes);
}

TEST_F(KvStoreTest, ConcurrentClients) {
  options_.sync_writes = false;
  options_.dram_budget_bytes = 4096;
  Reopen();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string k = absl::StrCat("t", t, "_", i % 20);
        const std::string v = absl::StrCat(i, k);
        if (!store_->Put(k, v).ok()) ++failures;
        auto got = store_->Get(k);
        if (!got.ok() || *got != v) ++failures;
        if (i % 7 == 0 && !store_->Lookup({k}).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->Stats().disk_entries, 80);
}

}  // namespace
}  // namespace vc::kvstore
