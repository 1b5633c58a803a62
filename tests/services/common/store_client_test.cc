// The store client against a control plane in the test process
// (FakeKvStore): the retries a store that went away causes are counted in
// the daemon's registry as vericache_store_call_retries_total{call}. The
// kill -9 of a real store under a Lookup or Get is KvStoreDaemonTest's.
#include "services/common/store_client.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/services/common/fake_kvstore.h"

namespace vc::daemon {
namespace {

// Short waits without jitter: the retries are quick and their count exact.
StoreClientOptions Options(const std::string& address, metrics::Registry* registry) {
  StoreClientOptions o;
  o.control_address = address;
  o.data_plane = "";  // control plane only (the fake has no data plane)
  o.timeout = std::chrono::seconds(30);
  o.retry.initial_backoff = std::chrono::milliseconds(1);
  o.retry.max_backoff = std::chrono::milliseconds(4);
  o.retry.jitter = 0;
  o.metrics = registry;
  return o;
}

// The sample line of `name` with `labels` in the exposition, or "".
std::string Sample(const metrics::Registry& registry, const std::string& name_and_labels) {
  const std::string text = registry.Expose();
  const std::string prefix = name_and_labels + " ";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, prefix)) return std::string(line.substr(prefix.size()));
  }
  return "";
}

TEST(StoreClientTest, RetriesAreCountedInTheRegistryByCall) {
  testing::FakeKvStore store;
  ASSERT_TRUE(store.started());
  metrics::Registry registry;
  auto client = StoreClient::Create(Options(store.address(), &registry));
  ASSERT_TRUE(client.ok()) << client.status();
  // Registered at once, at zero: a scrape shows it before anything failed.
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"lookup\"}"), "0");

  // Two UNAVAILABLE answers, then the answer: two retries.
  store.unavailable = 2;
  absl::StatusOr<std::vector<bool>> hits = (*client)->Lookup({"k1", "k2"});
  ASSERT_TRUE(hits.ok()) << hits.status();
  EXPECT_EQ(hits->size(), 2u);
  EXPECT_EQ((*client)->retries(), 2);
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"lookup\"}"), "2");
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"get\"}"), "0");

  // A Get that fails after one retry (NotFound is not tried again) counts it.
  store.unavailable = 1;
  absl::StatusOr<std::string> value = (*client)->Get("k1");
  EXPECT_TRUE(absl::IsNotFound(value.status())) << value.status();
  EXPECT_EQ((*client)->retries(), 3);
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"get\"}"), "1");

  // A call that succeeds at once adds nothing.
  ASSERT_TRUE((*client)->Lookup({"k1"}).ok());
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"lookup\"}"), "2");

  // One given up after max_attempts counts every attempt beyond the first.
  store.unavailable = 100;
  absl::StatusOr<std::vector<bool>> lost = (*client)->Lookup({"k1"});
  EXPECT_TRUE(absl::IsUnavailable(lost.status())) << lost.status();
  EXPECT_TRUE(absl::StrContains(lost.status().message(), "gave up after 4 attempts"))
      << lost.status();
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"lookup\"}"), "5");
  EXPECT_EQ((*client)->retries(), 6);
}

// Without a registry (tools, tests) nothing is registered; retries() counts.
TEST(StoreClientTest, WithoutARegistryOnlyRetriesCounts) {
  testing::FakeKvStore store;
  ASSERT_TRUE(store.started());
  auto client = StoreClient::Create(Options(store.address(), nullptr));
  ASSERT_TRUE(client.ok()) << client.status();
  store.unavailable = 1;
  ASSERT_TRUE((*client)->Lookup({"k1"}).ok());
  EXPECT_EQ((*client)->retries(), 1);
}

// What an asynchronous call's `done` was told, waited for by the test.
template <typename T>
class Answer {
 public:
  std::function<void(absl::StatusOr<T>)> Done() {
    return [this](absl::StatusOr<T> v) {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
      value_ = std::move(v);
      cv_.notify_all();
    };
  }
  bool Arrived() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_ > 0;
  }
  // The answer, once it came (a generous bound for a loaded machine).
  absl::StatusOr<T> Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60), [&] { return calls_ > 0; }));
    EXPECT_EQ(calls_, 1);
    if (calls_ == 0) return absl::DeadlineExceededError("the test's wait");
    return *value_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  std::optional<absl::StatusOr<T>> value_;
};

// StartLookup and StartGet answer as Lookup and Get do, retries (on gRPC
// alarms) and their counting included.
TEST(StoreClientTest, AsynchronousReadsRetryAndCountAsTheSynchronousOnes) {
  testing::FakeKvStore store;
  ASSERT_TRUE(store.started());
  metrics::Registry registry;
  auto client = StoreClient::Create(Options(store.address(), &registry));
  ASSERT_TRUE(client.ok()) << client.status();
  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(30); };

  store.unavailable = 2;
  Answer<std::vector<bool>> hits;
  (*client)->StartLookup({"k1", "k2", "k3"}, deadline(), hits.Done());
  absl::StatusOr<std::vector<bool>> h = hits.Wait();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, std::vector<bool>({false, false, false}));
  EXPECT_EQ(store.calls.load(), 3);
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"lookup\"}"), "2");

  store.unavailable = 1;
  Answer<std::string> value;
  (*client)->StartGet("k1", deadline(), value.Done());
  absl::StatusOr<std::string> v = value.Wait();
  EXPECT_TRUE(absl::IsNotFound(v.status())) << v.status();
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"get\"}"), "1");

  // The same message as the synchronous call's when it gives up.
  store.unavailable = 100;
  Answer<std::vector<bool>> lost;
  (*client)->StartLookup({"k1"}, deadline(), lost.Done());
  absl::StatusOr<std::vector<bool>> l = lost.Wait();
  EXPECT_TRUE(absl::IsUnavailable(l.status())) << l.status();
  EXPECT_TRUE(absl::StrContains(l.status().message(), "gave up after 4 attempts")) << l.status();
  EXPECT_EQ(Sample(registry, "vericache_store_call_retries_total{call=\"lookup\"}"), "5");
  EXPECT_EQ((*client)->retries(), 6);
}

// A store that never answers: the caller's thread is not held (StartLookup
// returns before the answer), and the answer is DEADLINE_EXCEEDED at the
// caller's deadline, not at the client's 30 s timeout.
TEST(StoreClientTest, AnAsynchronousReadOfAHungStoreEndsAtItsDeadline) {
  testing::FakeKvStore store;
  ASSERT_TRUE(store.started());
  auto client = StoreClient::Create(Options(store.address(), nullptr));
  ASSERT_TRUE(client.ok()) << client.status();
  store.hang = true;
  const auto start = std::chrono::steady_clock::now();
  Answer<std::vector<bool>> hits;
  (*client)->StartLookup({"k1"}, start + std::chrono::milliseconds(500), hits.Done());
  EXPECT_FALSE(hits.Arrived());
  absl::StatusOr<std::vector<bool>> h = hits.Wait();
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDeadlineExceeded) << h.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// StartApply answers what Apply answers, for every action (the fake store
// has no Delete, Pin or Unpin: UNIMPLEMENTED, named by the call).
TEST(StoreClientTest, AsynchronousKeyActionsAnswerAsTheSynchronousOnes) {
  testing::FakeKvStore store;
  ASSERT_TRUE(store.started());
  auto client = StoreClient::Create(Options(store.address(), nullptr));
  ASSERT_TRUE(client.ok()) << client.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (const auto& [action, name] :
       {std::pair{StoreClient::KeyAction::kDelete, "vc-kvstore Delete"},
        std::pair{StoreClient::KeyAction::kPin, "vc-kvstore Pin"},
        std::pair{StoreClient::KeyAction::kUnpin, "vc-kvstore Unpin"}}) {
    SCOPED_TRACE(name);
    const absl::Status sync = (*client)->Apply(action, "k1", "holder", deadline);
    Answer<bool> answer;
    auto done = answer.Done();
    (*client)->StartApply(action, "k1", "holder", deadline, [done](const absl::Status& s) {
      done(s.ok() ? absl::StatusOr<bool>(true) : absl::StatusOr<bool>(s));
    });
    const absl::Status async = answer.Wait().status();
    EXPECT_EQ(async.code(), absl::StatusCode::kUnimplemented) << async;
    EXPECT_EQ(async, sync);
    EXPECT_TRUE(absl::StrContains(async.message(), name)) << async;
  }
}

// A backoff that would end past the deadline is not waited for.
TEST(StoreClientTest, AnAsynchronousReadWaitsNoBackoffPastItsDeadline) {
  testing::FakeKvStore store;
  ASSERT_TRUE(store.started());
  StoreClientOptions o = Options(store.address(), nullptr);
  o.retry.initial_backoff = std::chrono::milliseconds(5000);
  o.retry.max_backoff = std::chrono::milliseconds(5000);
  auto client = StoreClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  store.unavailable = 100;
  Answer<std::string> value;
  (*client)->StartGet("k1", std::chrono::steady_clock::now() + std::chrono::seconds(1),
                      value.Done());
  absl::StatusOr<std::string> v = value.Wait();
  EXPECT_TRUE(absl::IsUnavailable(v.status())) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "the deadline left no time")) << v.status();
  EXPECT_EQ(store.calls.load(), 1);
}

}  // namespace
}  // namespace vc::daemon
