// The prefix catalogue over a fake store (a map) and fake verifiers whose
// Ingest writes the keys the real one would: one ingest for concurrent
// requests over a prefix, a verifier that dies under an ingest replaced by
// another, the tenant's stored-bytes budget, and register / look up / pin /
// delete with another tenant's id answering like an unknown one.
#include "services/coordinator/prefix_catalogue.h"

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/services/coordinator/fake_workers.h"

namespace vc::coordinator {
namespace {

namespace pb = ::vericache::v1;

constexpr int kChunk = 4;

kvstore::ModelId TestModel() { return kvstore::ChunkKey::FromRaw(std::string(32, 'm')).value(); }

class FakeStore final : public CatalogueStore {
 public:
  absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<bool> hits;
    for (const auto& k : keys) hits.push_back(entries.count(k) > 0);
    return hits;
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = entries.find(key);
    if (it == entries.end()) return absl::NotFoundError("no such key");
    return it->second;
  }
  absl::Status Put(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu);
    entries[key] = value;
    return absl::OkStatus();
  }
  absl::Status Apply(Action action, const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!entries.count(key)) return absl::NotFoundError("no such key");
    if (action == Action::kDelete) entries.erase(key);
    if (action == Action::kPin) pinned.insert(key);
    if (action == Action::kUnpin) pinned.erase(key);
    return absl::OkStatus();
  }
  std::mutex mu;
  std::map<std::string, std::string> entries;
  std::set<std::string> pinned;
};

// Ingest stores the chunks and variants the request names, as the verifier does.
class FakeVerifier final : public FakeVerifierBase {
 public:
  FakeVerifier(std::string address, FakeStore* store)
      : FakeVerifierBase(std::move(address)), store_(store) {}
  absl::Status Ingest(const WorkerCallOptions&, const pb::IngestRequest& req,
                      pb::IngestResponse* resp) override {
    ++ingests;
    while (hold.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (fail.has_value()) return *fail;
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = req.chunk_tokens();
    ko.tenant_salt = req.tenant_salt();
    std::vector<int32_t> tokens(req.tokens().begin(), req.tokens().end());
    auto keys = kvstore::ChunkKeysForTokens(ko, TestModel(), tokens);
    if (!keys.ok()) return keys.status();
    for (const auto& k : *keys) EXPECT_TRUE(store_->Put(k.Raw(), "chunk").ok());
    auto variants = ingest::ParseVariantList(req.variants());
    if (!variants.ok()) return variants.status();
    for (const auto& v : *variants) {
      auto vk = ingest::VariantKeyFor(keys->back(), v);
      if (!vk.ok()) return vk.status();
      EXPECT_TRUE(store_->Put(vk->Raw(), "variant").ok());
      resp->add_variants()->set_key(vk->Raw());
    }
    resp->set_bytes(int64_t{100} * req.tokens_size());
    return absl::OkStatus();
  }
  std::atomic<int> ingests{0};
  std::atomic<bool> hold{false};
  std::optional<absl::Status> fail;

 private:
  FakeStore* store_;
};

class CatalogueTest : public ::testing::Test {
 protected:
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
    hooks.worker_failed = [this](WorkerPool, Worker& w, const absl::Status&) {
      if (w.index == 0) dead_ = true;
      return w.index == 0;
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
    r.deadline = Clock::now() + std::chrono::minutes(5);
  }

  FakeStore store_;
  std::unique_ptr<AdmissionController> admission_;
  std::unique_ptr<Worker> workers_[2];
  FakeVerifier* fakes_[2];
  bool dead_ = false;
  int retries_ = 0;
  std::unique_ptr<PrefixCatalogue> catalogue_;
};

TEST_F(CatalogueTest, ConcurrentRequestsOverOnePrefixIngestItOnce) {
  fakes_[0]->hold = true;
  Plan a = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 9});
  Plan b = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 10});
  Request ra, rb;
  Init(ra);
  Init(rb);
  absl::Status sa, sb;
  std::thread ta([&] { sa = catalogue_->EnsureStored(a, ra); });
  while (fakes_[0]->ingests.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread tb([&] { sb = catalogue_->EnsureStored(b, rb); });
  std::this_thread::sleep_for(
      std::chrono::milliseconds(100));  // b (most likely) waits for a's ingest
  fakes_[0]->hold = false;
  ta.join();
  tb.join();
  EXPECT_TRUE(sa.ok()) << sa;
  EXPECT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);
  EXPECT_TRUE(a.totals.ingested());
  EXPECT_FALSE(catalogue_->Missing(b));
  // Stored now: no ingest at all.
  Plan c = PlanFor({1, 2, 3, 4, 5, 6, 7, 8, 11});
  Request rc;
  Init(rc);
  EXPECT_TRUE(catalogue_->EnsureStored(c, rc).ok());
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);
  EXPECT_FALSE(c.totals.ingested());
}

TEST_F(CatalogueTest, AVerifierThatDiesUnderTheIngestIsReplaced) {
  fakes_[0]->fail = absl::UnavailableError("socket closed");
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r);
  const absl::Status s = catalogue_->EnsureStored(p, r);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(retries_, 1);
  EXPECT_EQ(fakes_[1]->ingests.load(), 1);
}

TEST_F(CatalogueTest, AFailedIngestNamesTheVerifier) {
  fakes_[0]->fail = absl::InvalidArgumentError("bad variant");
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r);
  const absl::Status s = catalogue_->EnsureStored(p, r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "verifier v0:1 Ingest: bad variant");
  EXPECT_TRUE(catalogue_->Missing(p));
}

TEST_F(CatalogueTest, ATenantOverItsStoredBytesIsRefusedBeforeTheIngest) {
  Make(AdmissionOptions{.max_stored_bytes_per_tenant = 100});
  Plan p = PlanFor({1, 2, 3, 4, 5});
  Request r;
  Init(r, "a");
  ASSERT_TRUE(catalogue_->EnsureStored(p, r).ok());
  Plan q = PlanFor({9, 9, 9, 9, 9});
  const absl::Status s = catalogue_->EnsureStored(q, r);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);
  Request other;
  Init(other, "b");
  EXPECT_TRUE(catalogue_->EnsureStored(q, other).ok()) << "another tenant has its own budget";
}

TEST_F(CatalogueTest, RegisterLookUpPinAndDelete) {
  pb::RegisterPrefixRequest reg;
  for (int32_t t : {5, 6, 7, 8, 9, 10}) reg.add_tokens(t);
  Request r;
  Init(r, "a");
  pb::RegisterPrefixResponse resp;
  ASSERT_TRUE(catalogue_->Register("salt-a", reg, r, &resp).ok());
  EXPECT_EQ(resp.prefix_tokens(), 4);
  EXPECT_FALSE(resp.already_stored());
  EXPECT_EQ(admission_->active(), 0) << "the ingest's admission place is given back";
  const absl::StatusOr<std::vector<int32_t>> tokens =
      catalogue_->Tokens(resp.prefix_id(), "salt-a");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  const absl::Status other = catalogue_->Tokens(resp.prefix_id(), "salt-b").status();
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.message(),
            absl::StrCat("prefix ", resp.prefix_id(), " is not registered (vericache ingest)"));
  pb::RegisterPrefixResponse again;
  ASSERT_TRUE(catalogue_->Register("salt-a", reg, r, &again).ok());
  EXPECT_TRUE(again.already_stored());
  EXPECT_EQ(fakes_[0]->ingests.load(), 1);

  pb::ManagePrefixRequest pin;
  pin.set_prefix_id(resp.prefix_id());
  pin.set_action(pb::ManagePrefixRequest::PIN);
  pb::ManagePrefixResponse mresp;
  ASSERT_TRUE(catalogue_->Manage("a", "salt-a", pin, &mresp).ok());
  EXPECT_EQ(mresp.entries(), 3) << "the chunk, the variant and the manifest";
  EXPECT_EQ(store_.pinned.size(), 3u);
  EXPECT_EQ(catalogue_->Manage("b", "salt-b", pin, &mresp).code(), absl::StatusCode::kNotFound);
  pb::ManagePrefixRequest del = pin;
  del.set_action(pb::ManagePrefixRequest::DELETE);
  ASSERT_TRUE(catalogue_->Manage("a", "salt-a", del, &mresp).ok());
  EXPECT_EQ(catalogue_->Tokens(resp.prefix_id(), "salt-a").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_.entries.empty());
  pb::ManagePrefixRequest bad = pin;
  bad.set_action(pb::ManagePrefixRequest::ACTION_UNSPECIFIED);
  EXPECT_EQ(catalogue_->Manage("a", "salt-a", bad, &mresp).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vc::coordinator
