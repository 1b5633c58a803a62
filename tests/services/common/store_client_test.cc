// The store client against a control plane in the test process
// (FakeKvStore): the retries a store that went away causes are counted in
// the daemon's registry as vericache_store_call_retries_total{call}. The
// kill -9 of a real store under a Lookup or Get is KvStoreDaemonTest's.
#include "services/common/store_client.h"

#include <chrono>
#include <string>

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

}  // namespace
}  // namespace vc::daemon
