// The prefix catalogue over a fake store (a map) and fake verifiers whose
// Ingest writes the keys the real one would: one ingest for concurrent
// requests over a prefix (the ingest and the waits for it holding no
// thread), a verifier that dies under an ingest replaced by
// another, the tenant's stored-bytes budget, and register / look up / pin /
// delete with another tenant's id answering like an unknown one. Every store
// call gets the request's deadline, cut to the rpc timeout: over the fake,
// and over the real store client against a store that never answers.
#include "services/coordinator/prefix_catalogue.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/common/store_client.h"
#include "tests/services/common/fake_kvstore.h"
#include "tests/services/coordinator/fake_workers.h"

namespace vc::coordinator {
namespace {

namespace pb = ::vericache::v1;

constexpr int kChunk = 4;

kvstore::ModelId TestModel() { return kvstore::ChunkKey::FromRaw(std::string(32, 'm')).value(); }

// A map; every call's deadline is kept in `deadlines`.
class FakeStore final : public CatalogueStore {
 public:
  absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys,
                                           Clock::time_point deadline) override {
    std::lock_guard<std::mutex> lock(mu);
    deadlines.push_back(deadline);
    std::vector<bool> hits;
    for (const auto& k : keys) hits.push_back(entries.count(k) > 0);
    return hits;
  }
  absl::StatusOr<std::string> Get(const std::string& key, Clock::time_point deadline) override {
    std::lock_guard<std::mutex> lock(mu);
    deadlines.push_back(deadline);
    auto it = entries.find(key);
    if (it == entries.end()) return absl::NotFoundError("no such key");
    return it->second;
  }
  absl::Status Put(const std::string& key, const std::string& value,
                   Clock::time_point deadline) override {
    std::lock_guard<std::mutex> lock(mu);
    deadlines.push_back(deadline);
    entries[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> PinHolders(const std::string& prefix, int limit,
                                                      Clock::time_point deadline) override {
    std::lock_guard<std::mutex> lock(mu);
    deadlines.push_back(deadline);
    ++pin_holder_lists;
    std::set<std::string> holders;
    for (const auto& [key, hs] : pinned) {
      for (const auto& h : hs) {
        if (absl::StartsWith(h, prefix)) holders.insert(h);
      }
    }
    std::vector<std::string> out(holders.begin(), holders.end());
    if (static_cast<int>(out.size()) > limit) out.resize(limit);
    return out;
  }
  int pin_holder_lists = 0;  // mu
  // Pins per holder, as vc-kvstore keeps them.
  absl::Status Apply(Action action, const std::string& key, const std::string& holder,
                     Clock::time_point deadline) override {
    std::lock_guard<std::mutex> lock(mu);
    deadlines.push_back(deadline);
    if (applies_before_failing == 0) return absl::UnavailableError("store went away");
    if (applies_before_failing > 0) --applies_before_failing;
    if (!entries.count(key)) return absl::NotFoundError("no such key");
    if (action == Action::kDelete) entries.erase(key);
    if (action == Action::kPin) pinned[key].insert(holder);
    if (action == Action::kUnpin) {
      auto it = pinned.find(key);
      if (it != pinned.end() && it->second.erase(holder) > 0 && it->second.empty()) {
        pinned.erase(it);
      }
    }
    return absl::OkStatus();
  }
  // The awaited lookups: the first `lookups_to_hold` of them wait for
  // held_lookups.Release.
  void StartLookup(const std::vector<std::string>& keys, Clock::time_point deadline,
                   LookupDone done) override {
    bool hold = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      hold = lookups_to_hold > 0;
      if (hold) --lookups_to_hold;
    }
    if (hold && held_lookups.Keep([this, keys, deadline, done] { done(Lookup(keys, deadline)); })) {
      return;
    }
    done(Lookup(keys, deadline));
  }
  // Applies that succeed before every later one fails (negative: none fails).
  int applies_before_failing = -1;
  // An entry the store dropped (evicted, expired), with its pins.
  void Drop(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    entries.erase(key);
    pinned.erase(key);
  }
  // What a verifier's ingest writes (not a catalogue call).
  void Store(const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(mu);
    entries[key] = value;
  }
  // The pins ManagePrefix made (the tenant ledgers' left out).
  std::map<std::string, std::set<std::string>> PrefixPins() {
    std::lock_guard<std::mutex> lock(mu);
    std::map<std::string, std::set<std::string>> out;
    for (const auto& [key, holders] : pinned) {
      for (const auto& h : holders) {
        if (h != kTenantLedgerHolder) out[key].insert(h);
      }
    }
    return out;
  }
  // The entries other than tenant ledgers.
  std::map<std::string, std::string> PrefixEntries() {
    std::lock_guard<std::mutex> lock(mu);
    std::map<std::string, std::string> out;
    for (const auto& [key, value] : entries) {
      if (!DecodeTenantLedger(value).ok()) out.emplace(key, value);
    }
    return out;
  }
  std::mutex mu;
  std::map<std::string, std::string> entries;
  std::map<std::string, std::set<std::string>> pinned;  // key -> its holders
  std::vector<Clock::time_point> deadlines;
  int lookups_to_hold = 0;  // mu
  HeldAnswers held_lookups;
};

// Ingest stores the chunks and variants the request names, as the verifier
// does; while `held` holds, its answers wait for held.Release.
class FakeVerifier final : public FakeVerifierBase {
 public:
  FakeVerifier(std::string address, FakeStore* store)
      : FakeVerifierBase(std::move(address)), store_(store) {}
  absl::Status Ingest(const WorkerCallOptions&, const pb::IngestRequest& req,
                      pb::IngestResponse* resp) override {
    ++ingests;
    held.WaitWhileHeld();
    return Answer(req, resp);
  }
  void StartIngest(const WorkerCallOptions& o, const pb::IngestRequest& req,
                   pb::IngestResponse* resp, CallDone done) override {
    if (held.Keep([this, &req, resp, done] { done(Answer(req, resp)); })) {
      ++ingests;
      return;
    }
    done(Ingest(o, req, resp));
  }
  std::atomic<int> ingests{0};
  HeldAnswers held;
  std::optional<absl::Status> fail;

 private:
  absl::Status Answer(const pb::IngestRequest& req, pb::IngestResponse* resp) {
    if (fail.has_value()) return *fail;
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = req.chunk_tokens();
    ko.tenant_salt = req.tenant_salt();
    std::vector<int32_t> tokens(req.tokens().begin(), req.tokens().end());
    auto keys = kvstore::ChunkKeysForTokens(ko, TestModel(), tokens);
    if (!keys.ok()) return keys.status();
    for (const auto& k : *keys) store_->Store(k.Raw(), "chunk");
    auto variants = ingest::ParseVariantList(req.variants());
    if (!variants.ok()) return variants.status();
    for (const auto& v : *variants) {
      auto vk = ingest::VariantKeyFor(keys->back(), v);
      if (!vk.ok()) return vk.status();
      store_->Store(vk->Raw(), "variant");
      resp->add_variants()->set_key(vk->Raw());
    }
    resp->set_bytes(int64_t{100} * req.tokens_size());
    return absl::OkStatus();
  }

  FakeStore* store_;
};

// The slot clock and executor EnsureStored waits on.
RunnerContext MakeContext(Executor* executor, std::unique_ptr<SlotClock>* clock) {
  RingSchedulerOptions ro;
  ro.slot_seconds = 0.001;
  ro.links = {RingLink{.name = "fast"}, RingLink{.name = "slow"}};
  ro.gpus = {RingGpu{.name = "v0", .transient_capacity_bytes = 1 << 20}};
  *clock = std::move(SlotClock::Create(ro)).value();
  RunnerContext ctx;
  ctx.clock = clock->get();
  ctx.executor = executor;
  return ctx;
}

class CatalogueTest : public ::testing::Test {
 protected:
  CatalogueTest() : ctx_(MakeContext(&executor_, &clock_)) {}
  ~CatalogueTest() override { clock_->Stop(); }
  void SetUp() override { Make(AdmissionOptions{}); }
  void Make(AdmissionOptions ao) {
    admission_ = std::make_unique<AdmissionController>(ao);
    for (int i = 0; i < 2; ++i) {
      auto w = std::make_unique<Worker>();
      auto client = std::make_unique<FakeVerifier>(absl::StrCat("v", i, ":1"), &store_);
      fakes_[i] = client.get();
      w->address = client->address();
      w->verifier = std::move(client);
      w->index = i;
      workers_[i] = std::move(w);
    }
    CatalogueHooks hooks;
    hooks.place_verifier = [this](const std::string&) -> absl::StatusOr<Worker*> {
      return workers_[dead_ ? 1 : 0].get();
    };
    hooks.worker_failed = [this](WorkerPool, Worker& w, const absl::Status&,
                                 const std::function<void(bool)>& done) {
      if (w.index == 0) dead_ = true;
      done(w.index == 0);
    };
    hooks.on_retry = [this] { ++retries_; };
    catalogue_ = std::make_unique<PrefixCatalogue>(
        CatalogueOptions{.chunk_tokens = kChunk, .ingest_variants = "snapkv:0.25"},
        CatalogueModel{.model_id = TestModel(),
                       // What the fake verifier keys with.
                       .numerics_version = kvstore::ChunkKeyOptions{}.numerics_version,
                       .vocab = 100,
                       .context = 64,
                       .kv_bytes_per_token = 10},
        &store_, admission_.get(), hooks);
  }

  // What PlanRequest makes of a prompt (its whole chunks are the prefix).
  Plan PlanFor(std::vector<int32_t> prompt, const std::string& salt = "") {
    Plan plan;
    plan.prompt = std::move(prompt);
    plan.req.set_tenant_salt(salt);
    plan.prefix_tokens = static_cast<int32_t>(plan.prompt.size()) / kChunk * kChunk;
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = kChunk;
    ko.tenant_salt = salt;
    auto keys = kvstore::ChunkKeysForTokens(
        ko, TestModel(), absl::MakeConstSpan(plan.prompt).first(plan.prefix_tokens));
    EXPECT_TRUE(keys.ok());
    for (const auto& k : *keys) plan.chunk_keys.push_back(k.Raw());
    plan.prefix_key = keys->back().Hex();
    plan.variant = ingest::ParseVariantList("snapkv:0.25").value().front();
    plan.variant_key = ingest::VariantKeyFor(keys->back(), plan.variant).value().Raw();
    return plan;
  }
  static void Init(Request& r, const std::string& tenant = "t") {
    r.tenant = tenant;
    r.deadline = Later();
  }
  static Clock::time_point Later() { return Clock::now() + std::chrono::minutes(5); }

  // RegisterPrefix of `tokens` for tenant "a" (salt "salt-a"), waited for on
  // this thread.
  // A catalogue whose tenants may pin one prefix each, and two prefixes of
  // tenant a registered (their ids); `pin` pins the first.
  void TwoPrefixesUnderAPinQuotaOfOne(std::vector<std::string>* ids, pb::ManagePrefixRequest* pin) {
    Make(AdmissionOptions{.max_pins_per_tenant = 1});
    for (int p = 0; p < 2; ++p) {
      pb::RegisterPrefixResponse resp;
      ASSERT_TRUE(RegisterForA({5 + p, 6, 7, 8, 9, 10}, &resp).ok());
      ids->push_back(resp.prefix_id());
    }
    pin->set_prefix_id(ids->front());
    pin->set_action(pb::ManagePrefixRequest::PIN);
  }

  absl::Status RegisterForA(const std::vector<int32_t>& tokens, pb::RegisterPrefixResponse* resp) {
    pb::RegisterPrefixRequest reg;
    for (int32_t t : tokens) reg.add_tokens(t);
    Request r;
    Init(r, "a");
    return BlockOn(catalogue_->Register(ctx_, "salt-a", reg, r, resp));
  }

  // ManagePrefix for `tenant` with `salt`, waited for on this thread; `r`
  // (if given) is the call.
  absl::Status Manage(const std::string& tenant, const std::string& salt,
                      const pb::ManagePrefixRequest& req, pb::ManagePrefixResponse* resp,
                      Request* call = nullptr) {
    Request own;
    Request& r = call != nullptr ? *call : own;
    Init(r, tenant);
    return BlockOn(catalogue_->Manage(ctx_, salt, req, r, resp));
  }

  // The total of the tenant ledger under `key` (-1: none or unreadable).
  int64_t LedgerTotal(const std::string& key) {
    std::lock_guard<std::mutex> lock(store_.mu);
    auto it = store_.entries.find(key);
    if (it == store_.entries.end()) return -1;
    const absl::StatusOr<StoredCharges> charges = DecodeTenantLedger(it->second);
    return charges.ok() ? charges->total() : -1;
  }

  // EnsureStored, waited for on this thread.
  absl::Status Store(Plan& plan, Request& r) {
    return BlockOn(catalogue_->EnsureStored(ctx_, plan, r));
  }

  // What EnsureStoredOnOneThread saw.
  struct OneThread {
    bool last_done = false;    // the last request finished within 20 s
    bool others_done = false;  // and another one had by then
  };
  // Runs EnsureStored for each (plan, request) on an executor of one
  // thread, in order. Once the last one has finished (within 20 s: it fails
  // the test if it has not), calls `release` (what lets the others go on),
  // and checks that all of them finish OK.
  OneThread EnsureStoredOnOneThread(const std::vector<std::pair<Plan*, Request*>>& requests,
                                    const std::function<void()>& release) {
    Executor one(ExecutorOptions{.max_threads = 1});
    ctx_.executor = &one;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::optional<absl::Status>> done(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      one.Post([&, i] {
        Spawn(catalogue_->EnsureStored(ctx_, *requests[i].first, *requests[i].second),
              [&, i](const absl::Status& s) {
                std::lock_guard<std::mutex> lock(mu);
                done[i] = s;
                cv.notify_all();
              });
      });
    }
    auto count = [&] {
      return std::count_if(done.begin(), done.end(), [](const auto& d) { return d.has_value(); });
    };
    OneThread seen;
    {
      std::unique_lock<std::mutex> lock(mu);
      seen.last_done =
          cv.wait_for(lock, std::chrono::seconds(20), [&] { return done.back().has_value(); });
      seen.others_done = count() > (seen.last_done ? 1 : 0);
    }
    release();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(60),
                  [&] { return count() == static_cast<ptrdiff_t>(done.size()); });
    }
    for (const auto& d : done) {
      EXPECT_TRUE(d.has_value() && d->ok()) << d.value_or(absl::OkStatus());
    }
    ctx_.executor = &executor_;
    return seen;
  }

  Executor executor_;
  std::unique_ptr<SlotClock> clock_;
  RunnerContext ctx_;
  FakeStore store_;
  std::unique_ptr<AdmissionController> admission_;
  std::unique_ptr<Worker> workers_[2];
  FakeVerifier* fakes_[2];
  bool dead_ = false;
  int retries_ = 0;
  std::unique_ptr<PrefixCatalogue> catalogue_;
};

TEST_F(CatalogueTest, ConcurrentRequestsOverOnePrefixIngestItOnce) {
  fakes_[0]->held.Hold();
  Plan a = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 9});
  Plan b = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 10});
  Request ra, rb;
  Init(ra);
  Init(rb);
  absl::Status sa, sb;
  std::thread ta([&] { sa = Store(a, ra); });
  while (fakes_[0]->ingests.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread tb([&] { sb = Store(b, rb); });
  std::this_thread::sleep_for(
      std::chrono::milliseconds(100));  // b (most likely) waits for a's ingest
  fakes_[0]->held.Release();
  ta.join();
  tb.join();
  EXPECT_TRUE(sa.ok()) << sa;
  EXPECT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);
  EXPECT_TRUE(a.totals.ingested());
  EXPECT_FALSE(BlockOn(catalogue_->Missing(ctx_, b, Later())));
  // Stored now: no ingest at all.
  Plan c = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 11});
  Request rc;
  Init(rc);
  EXPECT_TRUE(Store(c, rc).ok());
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);
  EXPECT_FALSE(c.totals.ingested());
}

// Ingests are awaited, not waited on: with one executor thread, a request
// whose ingest the verifier has not answered yet, and another waiting for
// that ingest, are suspended, and a third over a stored prefix runs to its
// end on that thread meanwhile. A synchronous ingest (or wait) held the only
// thread until the answer came.
TEST_F(CatalogueTest, RequestsWaitingOnAnIngestHoldNoThread) {
  Plan stored = PlanFor({9, 9, 9, 9, 9});
  Request rs;
  Init(rs);
  ASSERT_TRUE(Store(stored, rs).ok());
  fakes_[0]->held.Hold();
  Plan a = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 9});
  Plan b = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 10});
  Plan c = PlanFor({9, 9, 9, 9, 9});
  Request ra, rb, rc;
  Init(ra);
  Init(rb);
  Init(rc);
  const OneThread seen = EnsureStoredOnOneThread({{&a, &ra}, {&b, &rb}, {&c, &rc}},
                                                 [&] { fakes_[0]->held.Release(); });
  EXPECT_TRUE(seen.last_done) << "the stored prefix's request did not run while the others waited";
  EXPECT_FALSE(seen.others_done) << "the ingest was held";
  EXPECT_EQ(fakes_[0]->ingests.load(), 2) << "the stored prefix's, then a's (b waited for it)";
  EXPECT_TRUE(a.totals.ingested());
  EXPECT_FALSE(b.totals.ingested());
}

// The store's lookups are awaited too: a request whose lookup the store has
// not answered yet is suspended, and another one (over a stored prefix, its
// lookup answered) runs to its end on the only thread meanwhile.
TEST_F(CatalogueTest, ARequestWaitingOnAStoreLookupHoldsNoThread) {
  Plan stored = PlanFor({9, 9, 9, 9, 9});
  Request rs;
  Init(rs);
  ASSERT_TRUE(Store(stored, rs).ok());
  {
    std::lock_guard<std::mutex> lock(store_.mu);
    store_.lookups_to_hold = 1;
  }
  store_.held_lookups.Hold();
  Plan a = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 9});
  Plan c = PlanFor({9, 9, 9, 9, 9});
  Request ra, rc;
  Init(ra);
  Init(rc);
  const OneThread seen =
      EnsureStoredOnOneThread({{&a, &ra}, {&c, &rc}}, [&] { store_.held_lookups.Release(); });
  EXPECT_TRUE(seen.last_done)
      << "the second request did not run while the first one's lookup waited";
  EXPECT_FALSE(seen.others_done) << "the first request's lookup was held";
  EXPECT_TRUE(a.totals.ingested());
}

TEST_F(CatalogueTest, AVerifierThatDiesUnderTheIngestIsReplaced) {
  fakes_[0]->fail = absl::UnavailableError("socket closed");
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r);
  const absl::Status s = Store(p, r);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(retries_, 1);
  EXPECT_EQ(fakes_[1]->ingests.load(), 1);
}

TEST_F(CatalogueTest, AFailedIngestNamesTheVerifier) {
  fakes_[0]->fail = absl::InvalidArgumentError("bad variant");
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r);
  const absl::Status s = Store(p, r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "verifier v0:1 Ingest: bad variant");
  EXPECT_TRUE(BlockOn(catalogue_->Missing(ctx_, p, Later())));
}

TEST_F(CatalogueTest, ATenantOverItsStoredBytesIsRefusedBeforeTheIngest) {
  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 100});
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r, "a");
  ASSERT_TRUE(Store(p, r).ok());
  Plan q = PlanFor({9, 9, 9, 9, 9});
  const absl::Status s = Store(q, r);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);
  Request other;
  Init(other, "b");
  EXPECT_TRUE(Store(q, other).ok()) << "another tenant has its own budget";
}

// A tenant's ingests in flight hold the least they will store: with one
// ingest of 8 tokens (80 bytes of full KV) under way, a second one of
// another prefix would pass the limit of 100 and is refused at once; it
// was let through before (nothing was charged yet), so concurrent ingests
// together passed the limit. A prefix bigger than the limit on its own is
// refused before any ingest.
TEST_F(CatalogueTest, ATenantsConcurrentIngestsCannotPassItsStoredBytesTogether) {
  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 100});
  fakes_[0]->held.Hold();
  Plan a = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 9});
  Plan b = PlanFor({2, 2, 3, 4, 5, 6, 7, 8, 9});
  Request ra, rb;
  Init(ra);
  Init(rb);
  absl::Status sa;
  std::thread ta([&] { sa = Store(a, ra); });
  while (fakes_[0]->ingests.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::optional<absl::Status> sb;
  std::mutex mu;
  std::condition_variable cv;
  std::thread tb([&] {
    const absl::Status s = Store(b, rb);
    std::lock_guard<std::mutex> lock(mu);
    sb = s;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(20), [&] { return sb.has_value(); });
  }
  fakes_[0]->held.Release();
  ta.join();
  tb.join();
  EXPECT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.has_value());
  EXPECT_EQ(sb->code(), absl::StatusCode::kResourceExhausted) << *sb;
  EXPECT_TRUE(absl::StrContains(sb->message(), "ingesting at least 80")) << *sb;
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);

  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 30});
  Plan big = PlanFor({7, 7, 7, 7, 7});  // 4 tokens: 40 bytes
  Request r;
  Init(r, "other");
  EXPECT_EQ(Store(big, r).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fakes_[0]->ingests.load(), 0);
  EXPECT_EQ(admission_->tenants(), 0u) << "nothing reserved is left behind";
}

TEST_F(CatalogueTest, RegisterLookUpPinAndDelete) {
  const std::vector<int32_t> prefix = {5, 6, 7, 8, 9, 10};
  pb::RegisterPrefixResponse resp;
  ASSERT_TRUE(RegisterForA(prefix, &resp).ok());
  EXPECT_EQ(resp.prefix_tokens(), 4);
  EXPECT_FALSE(resp.already_stored());
  EXPECT_EQ(admission_->active(), 0) << "the ingest's admission place is given back";
  const absl::StatusOr<std::vector<int32_t>> tokens =
      catalogue_->Tokens(resp.prefix_id(), "salt-a", Later());
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  const absl::Status other = catalogue_->Tokens(resp.prefix_id(), "salt-b", Later()).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.message(),
            absl::StrCat("prefix ", resp.prefix_id(), " is not registered (vericache ingest)"));
  pb::RegisterPrefixResponse again;
  ASSERT_TRUE(RegisterForA(prefix, &again).ok());
  EXPECT_TRUE(again.already_stored());
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);

  pb::ManagePrefixRequest pin;
  pin.set_prefix_id(resp.prefix_id());
  pin.set_action(pb::ManagePrefixRequest::PIN);
  pb::ManagePrefixResponse mresp;
  ASSERT_TRUE(Manage("a", "salt-a", pin, &mresp).ok());
  EXPECT_EQ(mresp.entries(), 3) << "the chunk, the variant and the manifest";
  EXPECT_EQ(store_.PrefixPins().size(), 3u);
  EXPECT_EQ(Manage("b", "salt-b", pin, &mresp).code(), absl::StatusCode::kNotFound);
  pb::ManagePrefixRequest del = pin;
  del.set_action(pb::ManagePrefixRequest::DELETE);
  ASSERT_TRUE(Manage("a", "salt-a", del, &mresp).ok());
  EXPECT_EQ(catalogue_->Tokens(resp.prefix_id(), "salt-a", Later()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_.PrefixEntries().empty());
  pb::ManagePrefixRequest bad = pin;
  bad.set_action(pb::ManagePrefixRequest::ACTION_UNSPECIFIED);
  EXPECT_EQ(Manage("a", "salt-a", bad, &mresp).code(), absl::StatusCode::kInvalidArgument);
}

// A pin cut short (the store failed after the first key) still counts the
// prefix against the tenant's pin quota: otherwise a tenant could pin keys
// past its quota with calls that end part way.
TEST_F(CatalogueTest, APinCutShortCountsAgainstThePinQuota) {
  std::vector<std::string> ids;
  pb::ManagePrefixRequest pin;
  ASSERT_NO_FATAL_FAILURE(TwoPrefixesUnderAPinQuotaOfOne(&ids, &pin));
  pb::ManagePrefixResponse mresp;
  store_.applies_before_failing = 1;
  EXPECT_EQ(Manage("a", "salt-a", pin, &mresp).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(mresp.entries(), 1);
  store_.applies_before_failing = -1;
  pin.set_prefix_id(ids[1]);
  const absl::Status second = Manage("a", "salt-a", pin, &mresp);
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  // Pinning the first one again (to finish it) is not a second pin, and
  // pins each of its keys once: one holder, the tenant's prefix.
  pin.set_prefix_id(ids[0]);
  EXPECT_TRUE(Manage("a", "salt-a", pin, &mresp).ok());
  EXPECT_EQ(mresp.entries(), 3);
  ASSERT_EQ(store_.PrefixPins().size(), 3u);
  for (const auto& [key, holders] : store_.PrefixPins()) {
    EXPECT_EQ(holders, std::set<std::string>{PinHolder("a", ids[0])});
  }
  pb::ManagePrefixRequest unpin = pin;
  unpin.set_action(pb::ManagePrefixRequest::UNPIN);
  EXPECT_TRUE(Manage("a", "salt-a", unpin, &mresp).ok());
  EXPECT_TRUE(store_.PrefixPins().empty()) << "one unpin releases a pin made by two calls";
}

// The store keeps the pins, the coordinator only counts them: a restarted
// coordinator (a fresh admission controller and catalogue over the same
// store) lists the tenant's pin holders before its first pin, so the quota
// still holds.
TEST_F(CatalogueTest, TheRestartedCoordinatorCountsTheTenantsPinsInTheStore) {
  std::vector<std::string> ids;
  pb::ManagePrefixRequest pin;
  ASSERT_NO_FATAL_FAILURE(TwoPrefixesUnderAPinQuotaOfOne(&ids, &pin));
  pb::ManagePrefixResponse mresp;
  ASSERT_TRUE(Manage("a", "salt-a", pin, &mresp).ok());
  EXPECT_EQ(store_.pin_holder_lists, 1);
  ASSERT_TRUE(Manage("a", "salt-a", pin, &mresp).ok());
  EXPECT_EQ(store_.pin_holder_lists, 1) << "known once listed";

  Make(AdmissionOptions{.max_pins_per_tenant = 1});  // the restart
  pin.set_prefix_id(ids[1]);
  const absl::Status second = Manage("a", "salt-a", pin, &mresp);
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_EQ(store_.pin_holder_lists, 2);
  pin.set_prefix_id(ids[0]);
  EXPECT_TRUE(Manage("a", "salt-a", pin, &mresp).ok()) << "its own pin again is no new pin";
  pb::ManagePrefixRequest unpin = pin;
  unpin.set_action(pb::ManagePrefixRequest::UNPIN);
  ASSERT_TRUE(Manage("a", "salt-a", unpin, &mresp).ok());
  pin.set_prefix_id(ids[1]);
  EXPECT_TRUE(Manage("a", "salt-a", pin, &mresp).ok()) << "room again after the unpin";
}

// The stored-bytes quota holds across a restart: the count is kept in the
// tenant's ledger in the store (pinned), which a fresh admission controller
// and catalogue over the same store read before their first check, and a
// delete after the restart gives its bytes back from that count.
TEST_F(CatalogueTest, TheRestartedCoordinatorReadsTheTenantsStoredBytesFromItsLedger) {
  const std::string ledger = kvstore::TenantLedgerKey(TestModel(), "a").Raw();
  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 1000});
  pb::RegisterPrefixResponse resp, resp2;
  ASSERT_TRUE(RegisterForA({5, 6, 7, 8, 9}, &resp).ok());
  ASSERT_EQ(store_.entries.count(ledger), 1u);
  EXPECT_EQ(LedgerTotal(ledger), 400) << "the fake verifier's 100 bytes per token, 4 tokens";
  EXPECT_EQ(store_.pinned.at(ledger), std::set<std::string>{kTenantLedgerHolder});
  ASSERT_TRUE(RegisterForA({6, 7, 8, 9, 10}, &resp2).ok());
  EXPECT_EQ(LedgerTotal(ledger), 800);

  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 400});  // the restart
  Plan p = PlanFor({1, 2, 3, 4, 5}, "salt-a");
  Request r;
  Init(r, "a");
  const absl::Status over = Store(p, r);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ(fakes_[0]->ingests.load(), 0);
  Request other;
  Init(other, "b");
  EXPECT_TRUE(Store(p, other).ok()) << "another tenant has its own ledger";

  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 400});  // and again
  pb::ManagePrefixRequest del;
  del.set_prefix_id(resp.prefix_id());
  del.set_action(pb::ManagePrefixRequest::DELETE);
  pb::ManagePrefixResponse mresp;
  ASSERT_TRUE(Manage("a", "salt-a", del, &mresp).ok());
  EXPECT_EQ(LedgerTotal(ledger), 400) << "the deleted prefix's charge given back, the other's kept";
  del.set_prefix_id(resp2.prefix_id());
  ASSERT_TRUE(Manage("a", "salt-a", del, &mresp).ok());
  EXPECT_EQ(LedgerTotal(ledger), 0);
  Plan again = PlanFor({2, 3, 4, 5, 6}, "salt-a");
  EXPECT_TRUE(Store(again, r).ok()) << "under the limit again";
  EXPECT_EQ(LedgerTotal(ledger), 400);
}

// A ledger that is not one (bad bytes in the store) is counted from zero
// and written over, instead of refusing the tenant for ever.
TEST_F(CatalogueTest, AnUnreadableLedgerIsCountedFromZeroAndWrittenOver) {
  const std::string ledger = kvstore::TenantLedgerKey(TestModel(), "a").Raw();
  store_.Store(ledger, "not a ledger");
  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 1000});
  pb::RegisterPrefixResponse resp;
  ASSERT_TRUE(RegisterForA({5, 6, 7, 8, 9}, &resp).ok());
  EXPECT_EQ(LedgerTotal(ledger), 400);
}

// The budget counts what the store still holds: a tenant refused at its
// limit has its charged prefixes looked up, and those the store dropped
// (evicted, expired) are given back before the check is made again. A
// prefix ingested again is charged once.
TEST_F(CatalogueTest, PrefixesTheStoreDroppedAreGivenBackWhenTheTenantIsAtItsLimit) {
  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 400,
                        .stored_recheck_interval = std::chrono::milliseconds(0)});
  const std::string ledger = kvstore::TenantLedgerKey(TestModel(), "a").Raw();
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r, "a");
  ASSERT_TRUE(Store(p, r).ok());
  EXPECT_EQ(LedgerTotal(ledger), 400);
  Plan q = PlanFor({9, 9, 9, 9, 9});
  EXPECT_EQ(Store(q, r).code(), absl::StatusCode::kResourceExhausted) << "p is still stored";
  store_.Drop(p.chunk_keys.back());  // evicted
  ASSERT_TRUE(Store(q, r).ok()) << "p's charge given back";
  EXPECT_EQ(LedgerTotal(ledger), 400) << "q's alone";

  // Far from the limit (no recheck), an evicted prefix ingested again
  // replaces its charge.
  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 10000});
  const std::string c_ledger = kvstore::TenantLedgerKey(TestModel(), "c").Raw();
  Plan t = PlanFor({7, 7, 7, 7, 7}, "salt-c");
  Request c;
  Init(c, "c");
  ASSERT_TRUE(Store(t, c).ok());
  store_.Drop(t.chunk_keys.back());
  ASSERT_TRUE(Store(t, c).ok());
  EXPECT_EQ(fakes_[0]->ingests.load(), 2) << "ingested again";
  EXPECT_EQ(LedgerTotal(c_ledger), 400) << "charged once, not twice";
}

TEST(TenantLedgerTest, ValuesRoundTripAndAnythingElseIsRefused) {
  StoredCharges full;
  for (size_t i = 0; i < kMaxChargedPrefixes; ++i) {
    std::string key(32, '\0');
    key[0] = static_cast<char>(i >> 8);
    key[1] = static_cast<char>(i & 0xff);
    full.by_prefix.emplace(key, static_cast<int64_t>(i) + 1);
  }
  full.unlisted = INT64_MAX;
  for (const StoredCharges& c :
       {StoredCharges{}, StoredCharges{.by_prefix = {{std::string(32, 'k'), 7}}}, full}) {
    EXPECT_EQ(DecodeTenantLedger(EncodeTenantLedger(c)), absl::StatusOr<StoredCharges>(c));
  }
  EXPECT_EQ(full.total(), INT64_MAX) << "a sum past int64 saturates";
  const std::string one = EncodeTenantLedger({.by_prefix = {{std::string(32, 'k'), 7}}});
  EXPECT_EQ(one.size(), 20u + 40u);
  std::string bad_magic = one, bad_version = one, bad_count = one, zero_charge = one;
  bad_magic[0] = 'X';
  bad_version[4] = 2;
  bad_count[16] = 2;  // two charges announced, one present
  for (int b = 52; b < 60; ++b) zero_charge[b] = 0;
  StoredCharges two{.by_prefix = {{std::string(32, 'a'), 1}, {std::string(32, 'b'), 1}}};
  std::string swapped = EncodeTenantLedger(two);  // keys out of order
  std::swap_ranges(swapped.begin() + 20, swapped.begin() + 60, swapped.begin() + 60);
  std::string too_many = EncodeTenantLedger(full);
  too_many[16] = 1;  // 1025 announced
  too_many[17] = 4;
  for (const std::string& bad :
       {std::string(), one.substr(0, 19), one + "x", bad_magic, bad_version, bad_count, zero_charge,
        swapped, too_many, EncodeTenantLedger({.by_prefix = {}, .unlisted = -1})}) {
    EXPECT_EQ(DecodeTenantLedger(bad).status().code(), absl::StatusCode::kDataLoss) << bad.size();
  }
}

// Prefixes that share chunks pin them each under their own holder: the
// shared chunk stays pinned until the last of them is unpinned.
TEST_F(CatalogueTest, AChunkSharedByTwoPinnedPrefixesStaysPinnedUntilBothAreUnpinned) {
  pb::RegisterPrefixResponse shorter, longer;
  ASSERT_TRUE(RegisterForA({5, 6, 7, 8, 9}, &shorter).ok());
  ASSERT_TRUE(RegisterForA({5, 6, 7, 8, 1, 2, 3, 4}, &longer).ok());
  pb::ManagePrefixRequest pin;
  pin.set_action(pb::ManagePrefixRequest::PIN);
  pb::ManagePrefixResponse mresp;
  for (const auto* p : {&shorter, &longer}) {
    pin.set_prefix_id(p->prefix_id());
    ASSERT_TRUE(Manage("a", "salt-a", pin, &mresp).ok());
  }
  std::string shared;
  for (const auto& [key, holders] : store_.PrefixPins()) {
    if (holders.size() == 2) shared = key;
  }
  ASSERT_FALSE(shared.empty()) << "the first chunk is both prefixes'";
  pb::ManagePrefixRequest unpin;
  unpin.set_action(pb::ManagePrefixRequest::UNPIN);
  unpin.set_prefix_id(shorter.prefix_id());
  ASSERT_TRUE(Manage("a", "salt-a", unpin, &mresp).ok());
  ASSERT_EQ(store_.PrefixPins().count(shared), 1u);
  EXPECT_EQ(store_.PrefixPins().at(shared),
            std::set<std::string>{PinHolder("a", longer.prefix_id())});
  unpin.set_prefix_id(longer.prefix_id());
  ASSERT_TRUE(Manage("a", "salt-a", unpin, &mresp).ok());
  EXPECT_TRUE(store_.PrefixPins().empty());
}

// Holders are unambiguous whatever the tenant is called.
TEST(PinHolderTest, NoTwoTenantAndPrefixPairsShareAHolder) {
  EXPECT_NE(PinHolder("a/b", "c"), PinHolder("a", "b/c"));
  EXPECT_NE(PinHolder("a", "bc"), PinHolder("ab", "c"));
  EXPECT_EQ(PinHolder("a", "bc"), PinHolder("a", "bc"));
}

// A pin whose caller went away is applied to every key all the same;
// Shutdown (r.cancelled) stops it before the next key.
TEST_F(CatalogueTest, APinRunsToItsEndWithoutItsCallerButStopsAtShutdown) {
  pb::RegisterPrefixResponse resp;
  ASSERT_TRUE(RegisterForA({5, 6, 7, 8, 9, 10}, &resp).ok());
  pb::ManagePrefixRequest pin;
  pin.set_prefix_id(resp.prefix_id());
  pin.set_action(pb::ManagePrefixRequest::PIN);
  pb::ManagePrefixResponse mresp;
  Request gone;
  gone.client_gone = [] { return true; };
  EXPECT_TRUE(Manage("a", "salt-a", pin, &mresp, &gone).ok());
  EXPECT_EQ(mresp.entries(), 3) << "the chunk, the variant and the manifest";
  pb::ManagePrefixRequest unpin = pin;
  unpin.set_action(pb::ManagePrefixRequest::UNPIN);
  Request stopping;
  stopping.cancelled = true;
  mresp.Clear();
  EXPECT_EQ(Manage("a", "salt-a", unpin, &mresp, &stopping).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(mresp.entries(), 0);
  EXPECT_EQ(store_.PrefixPins().size(), 3u) << "nothing unpinned";
}

// Each store call ends by the request's deadline, or rpc_timeout (10 s by
// default) from now when the request has longer.
TEST_F(CatalogueTest, StoreCallsEndByTheRequestDeadlineCutToTheRpcTimeout) {
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r);
  r.deadline = Clock::now() + std::chrono::seconds(2);
  ASSERT_TRUE(Store(p, r).ok());
  ASSERT_FALSE(store_.deadlines.empty());
  for (const Clock::time_point d : store_.deadlines) EXPECT_EQ(d, r.deadline);

  store_.deadlines.clear();
  const Clock::time_point before = Clock::now();
  EXPECT_FALSE(BlockOn(catalogue_->Missing(ctx_, p, Clock::time_point::max())));
  const Clock::time_point after = Clock::now();
  ASSERT_EQ(store_.deadlines.size(), 1u);
  EXPECT_GE(store_.deadlines[0], before + CatalogueOptions{}.rpc_timeout);
  EXPECT_LE(store_.deadlines[0], after + CatalogueOptions{}.rpc_timeout);
}

// The real store client under the catalogue, against a store that never
// answers (FakeKvStore with `hang`, as a SIGSTOPped vc-kvstore): a request
// with 2 s left gets DEADLINE_EXCEEDED at about 2 s, not at the client's
// and the catalogue's 10 s timeout.
TEST(CatalogueDeadlineTest, ARequestWithTwoSecondsLeftDoesNotWaitTenOnAStoreThatNeverAnswers) {
  testing::FakeKvStore server;
  ASSERT_TRUE(server.started());
  daemon::StoreClientOptions so;
  so.control_address = server.address();
  so.data_plane = "";
  so.timeout = std::chrono::seconds(10);
  auto client = daemon::StoreClient::Create(so);
  ASSERT_TRUE(client.ok()) << client.status();
  server.hang = true;
  std::unique_ptr<CatalogueStore> store = StoreClientCatalogue(client->get());
  AdmissionController admission(AdmissionOptions{});
  CatalogueHooks hooks;
  hooks.place_verifier = [](const std::string&) -> absl::StatusOr<Worker*> {
    return absl::InternalError("no ingest: the store never answered the lookup");
  };
  hooks.worker_failed = [](WorkerPool, Worker&, const absl::Status&,
                           const std::function<void(bool)>& done) { done(false); };
  PrefixCatalogue catalogue(
      CatalogueOptions{.chunk_tokens = kChunk, .rpc_timeout = std::chrono::seconds(10)},
      CatalogueModel{.model_id = TestModel(), .vocab = 100, .context = 64}, store.get(), &admission,
      hooks);
  constexpr auto kLeft = std::chrono::seconds(2);
  // Well under the 10 s timeout, with room for a loaded machine.
  constexpr auto kMost = std::chrono::seconds(7);

  Plan plan;
  plan.prompt = {1, 2, 3, 4, 5};
  plan.prefix_tokens = kChunk;
  plan.chunk_keys = {std::string(32, 'c')};
  plan.variant_key = std::string(32, 'v');
  plan.prefix_key = "cc";
  Request r;
  r.tenant = "t";
  Clock::time_point start = Clock::now();
  r.deadline = start + kLeft;
  Executor executor;
  std::unique_ptr<SlotClock> clock;
  const RunnerContext ctx = MakeContext(&executor, &clock);
  const absl::Status stored = BlockOn(catalogue.EnsureStored(ctx, plan, r));
  Clock::duration took = Clock::now() - start;
  EXPECT_EQ(stored.code(), absl::StatusCode::kDeadlineExceeded) << stored;
  EXPECT_GE(took, kLeft - std::chrono::milliseconds(50));
  EXPECT_LT(took, kMost);

  // A registered prefix's manifest read (PlanRequest's) as well.
  start = Clock::now();
  const absl::Status tokens = catalogue.Tokens(std::string(64, 'a'), "", start + kLeft).status();
  took = Clock::now() - start;
  EXPECT_EQ(tokens.code(), absl::StatusCode::kDeadlineExceeded) << tokens;
  EXPECT_GE(took, kLeft - std::chrono::milliseconds(50));
  EXPECT_LT(took, kMost);
  EXPECT_GE(server.calls.load(), 2);
  clock->Stop();
}

}  // namespace
}  // namespace vc::coordinator
