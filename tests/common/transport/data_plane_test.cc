// The data plane over both backends (the same tests, parameterised by kind):
// round trips, errors (missing key, deadline, dead server, bounds), pacing
// lower bounds and the per-slot counters.
#include "common/transport/data_plane.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport {
namespace {

using testing::HasCode;
using testing::In;
using testing::RandomBytes;
using testing::SecondsSince;

using Blobs = std::map<std::string, std::string>;

class DataPlaneTest : public testing::BackendTest {
 protected:

  void StartServer(const DataPlaneServerOptions& options, Blobs blobs) {
    blobs_ = std::make_shared<const Blobs>(std::move(blobs));
    auto s = DataPlaneServer::Create(options, testing::MapLookup(blobs_));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  std::unique_ptr<DataPlaneClient> Client(LinkClass link = LinkClass::kFast,
                                          int64_t max_response_bytes = int64_t{1} << 30) {
    DataPlaneClientOptions o;
    ApplyKind(&o);
    o.server_address = server_->address();
    o.link = link;
    o.max_response_bytes = max_response_bytes;
    auto c = DataPlaneClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The per-slot bound of a paced link and the counters' sum.
  static void CheckSlots(const LinkStats& st, double bytes_per_second, int64_t piece) {
    testing::ExpectSlotsWithinBound(st, bytes_per_second, piece);
  }

  std::shared_ptr<const Blobs> blobs_;
  std::unique_ptr<DataPlaneServer> server_;
};

TEST_P(DataPlaneTest, RoundTripsBlobsInRequestOrder) {
  const std::string sha_key = RandomBytes(32, 1);
  const std::string zero_key("\0\x01\0", 3);
  Blobs blobs = {{"small", "hello"},
                 {sha_key, RandomBytes(1024, 2)},
                 {zero_key, RandomBytes(5 << 20, 3)},  // multi-MiB
                 {"empty", ""}};
  StartServer(ServerOptions(), blobs);
  EXPECT_EQ(server_->kind(), Kind());
  auto client = Client();
  const std::vector<std::string> keys = {zero_key, "small", sha_key, "empty", "small"};
  auto values = client->Fetch(keys, In(60));
  ASSERT_TRUE(values.ok()) << values.status();
  ASSERT_EQ(values->size(), keys.size());
  int64_t payload = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ((*values)[i], blobs.at(keys[i])) << "key " << i;
    payload += static_cast<int64_t>(blobs.at(keys[i]).size());
  }
  // Again on the pooled connection.
  auto again = client->Fetch({"small"}, In(60));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0], "hello");
  payload += 5;

  const ClientStats cs = client->stats();
  EXPECT_EQ(cs.fetches, 2);
  EXPECT_EQ(cs.bytes, payload);
  EXPECT_GE(cs.transport_bytes, payload);  // the transport's own count, framing included
  const LinkStats fast = server_->Stats(LinkClass::kFast);
  EXPECT_EQ(fast.fetches, 2);
  EXPECT_GE(fast.bytes_total, payload);
  EXPECT_EQ(fast.capacity_bytes_per_second, 0);
  EXPECT_EQ(server_->Stats(LinkClass::kSlow).bytes_total, 0);
}

TEST_P(DataPlaneTest, EmptyFetchReturnsNothing) {
  StartServer(ServerOptions(), {{"a", "b"}});
  auto values = Client()->Fetch({}, In(30));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE(values->empty());
}

TEST_P(DataPlaneTest, ConcurrentFetchesOnOneClient) {
  Blobs blobs;
  // (absl::StrCat: "k" + std::to_string(i) trips a false -Wrestrict in GCC 12 at -O3.)
  for (int i = 0; i < 8; ++i) blobs[absl::StrCat("k", i)] = RandomBytes(100'000 + i, 10 + i);
  StartServer(ServerOptions(), blobs);
  auto client = Client();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 5; ++r) {
        const std::string a = absl::StrCat("k", (t + r) % 8);
        const std::string b = absl::StrCat("k", (t * 3 + r) % 8);
        auto v = client->Fetch({a, b}, In(60));
        if (!v.ok() || (*v)[0] != blobs.at(a) || (*v)[1] != blobs.at(b)) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(client->stats().fetches, 20);
}

TEST_P(DataPlaneTest, MissingKeyIsNotFoundNamingTheHexKey) {
  StartServer(ServerOptions(), {{"present", "x"}});
  auto client = Client();
  const std::string missing("\x01\xab\xff", 3);
  auto values = client->Fetch({"present", missing}, In(30));
  EXPECT_TRUE(HasCode(values, absl::StatusCode::kNotFound, "01abff"));
  // The connection stays in step: the next fetch works.
  auto ok = client->Fetch({"present"}, In(30));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], "x");
}

TEST_P(DataPlaneTest, DeadlineExceededThenRecovers) {
  auto options = ServerOptions();
  options.slow.bytes_per_second = 1e6;
  StartServer(options, {{"big", RandomBytes(4 << 20, 4)}, {"small", "s"}});
  auto client = Client(LinkClass::kSlow);
  const auto start = testing::Clock::now();
  auto values = client->Fetch({"big"}, In(0.2));
  EXPECT_TRUE(HasCode(values, absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(SecondsSince(start), 0.19);  // it waited for the deadline, not less
  auto ok = client->Fetch({"small"}, In(30));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], "s");
}

TEST_P(DataPlaneTest, PastDeadlineFailsAtOnce) {
  StartServer(ServerOptions(), {{"a", "b"}});
  EXPECT_TRUE(
      HasCode(Client()->Fetch({"a"}, testing::Clock::now()), absl::StatusCode::kDeadlineExceeded));
}

TEST_P(DataPlaneTest, ServerDestroyedMidFetchIsUnavailable) {
  auto options = ServerOptions();
  options.slow.bytes_per_second = 2e6;
  StartServer(options, {{"big", RandomBytes(8 << 20, 5)}});  // ~4 s on the paced link
  auto client = Client(LinkClass::kSlow);
  absl::StatusOr<std::vector<std::string>> result;
  std::thread fetcher([&] { result = client->Fetch({"big"}, In(120)); });
  // Wait until the response is flowing, then take the server away.
  while (server_->Stats(LinkClass::kSlow).bytes_total == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server_.reset();
  fetcher.join();
  EXPECT_TRUE(HasCode(result, absl::StatusCode::kUnavailable));
}

TEST_P(DataPlaneTest, NoServerIsUnavailable) {
  StartServer(ServerOptions(), {});
  const std::string address = server_->address();
  server_.reset();
  DataPlaneClientOptions o;
  ApplyKind(&o);
  o.server_address = address;
  auto client = DataPlaneClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(HasCode((*client)->Fetch({"a"}, In(60)), absl::StatusCode::kUnavailable));
}

TEST_P(DataPlaneTest, ReconnectsAfterServerRestart) {
  StartServer(ServerOptions(), {{"a", "first"}});
  const std::string address = server_->address();
  auto client = Client();
  ASSERT_TRUE(client->Fetch({"a"}, In(30)).ok());
  server_.reset();
  // The pooled connection is dead now; with no server the fetch fails...
  EXPECT_TRUE(HasCode(client->Fetch({"a"}, In(60)), absl::StatusCode::kUnavailable));
  // ...and once a server is back on the address, the next fetch reconnects.
  auto options = ServerOptions();
  options.listen = address;
  StartServer(options, {{"a", "second"}});
  auto values = client->Fetch({"a"}, In(60));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ((*values)[0], "second");
}

TEST_P(DataPlaneTest, FarFutureDeadlineWorks) {
  StartServer(ServerOptions(), {{"a", "b"}});
  auto values = Client()->Fetch({"a"}, testing::Clock::time_point::max());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ((*values)[0], "b");
}

TEST_P(DataPlaneTest, ClientOfTheOtherKindFailsCleanly) {
  // A tcp client at a ucx server (and the reverse) gets an error within its
  // deadline, and the server keeps serving clients of its own kind.
  StartServer(ServerOptions(), {{"a", "b"}});
  DataPlaneClientOptions o;
  o.kind = Kind() == "tcp" ? "ucx" : "tcp";
  o.server_address = server_->address();
  auto other = DataPlaneClient::Create(o);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE((*other)->Fetch({"a"}, In(1)).ok());
  other->reset();
  auto values = Client()->Fetch({"a"}, In(30));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ((*values)[0], "b");
}

TEST_P(DataPlaneTest, TooManyKeysIsRefusedByTheServer) {
  auto options = ServerOptions();
  options.max_keys_per_fetch = 4;
  StartServer(options, {{"a", "1"}});
  auto client = Client();
  EXPECT_TRUE(HasCode(client->Fetch(std::vector<std::string>(5, "a"), In(30)),
                      absl::StatusCode::kInvalidArgument, "max_keys_per_fetch"));
  auto ok = client->Fetch(std::vector<std::string>(4, "a"), In(30));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 4u);
  // The refusal went out on the client's link like any response.
  EXPECT_EQ(server_->Stats(LinkClass::kFast).fetches, 2);
}

TEST_P(DataPlaneTest, KeyTooLongIsRefused) {
  auto options = ServerOptions();
  options.max_key_bytes = 8;
  StartServer(options, {{"a", "1"}});
  EXPECT_TRUE(
      HasCode(Client()->Fetch({std::string(9, 'k')}, In(30)), absl::StatusCode::kInvalidArgument));
}

TEST_P(DataPlaneTest, ResponseOverServerMaxIsRefused) {
  auto options = ServerOptions();
  options.max_response_bytes = 1000;
  StartServer(options, {{"a", std::string(600, 'a')}, {"b", std::string(600, 'b')}});
  auto client = Client();
  EXPECT_TRUE(HasCode(client->Fetch({"a", "b"}, In(30)), absl::StatusCode::kResourceExhausted,
                      "max_response_bytes"));
  EXPECT_TRUE(client->Fetch({"a"}, In(30)).ok());
  // Nothing of the refused values went out on the link.
  EXPECT_LT(server_->Stats(LinkClass::kFast).bytes_total, 1200);
}

TEST_P(DataPlaneTest, ResponseOverClientMaxIsRefused) {
  StartServer(ServerOptions(), {{"a", std::string(600, 'a')}, {"b", std::string(600, 'b')}});
  auto client = Client(LinkClass::kFast, /*max_response_bytes=*/1000);
  EXPECT_TRUE(HasCode(client->Fetch({"a", "b"}, In(30)), absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(client->Fetch({"b"}, In(30)).ok());
}

TEST_P(DataPlaneTest, PacedFetchTakesAtLeastBytesOverBandwidth) {
  constexpr double kBandwidth = 4e6;
  constexpr int64_t kBytes = 2'000'000;
  auto options = ServerOptions();
  options.slow.bytes_per_second = kBandwidth;
  options.write_piece_bytes = 64 << 10;
  StartServer(options, {{"blob", RandomBytes(kBytes, 6)}});
  auto client = Client(LinkClass::kSlow);
  const auto start = testing::Clock::now();
  auto values = client->Fetch({"blob"}, In(60));
  const double elapsed = SecondsSince(start);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ((*values)[0], blobs_->at("blob"));
  EXPECT_GE(elapsed, kBytes / kBandwidth - 1e-3);

  const LinkStats st = server_->Stats(LinkClass::kSlow);
  EXPECT_EQ(st.fetches, 1);
  EXPECT_GE(st.bytes_total, kBytes);
  EXPECT_EQ(st.capacity_bytes_per_second, kBandwidth);
  EXPECT_NEAR(st.busy_seconds, st.bytes_total / kBandwidth, 1e-6);
  CheckSlots(st, kBandwidth, options.write_piece_bytes);
  EXPECT_EQ(server_->Stats(LinkClass::kFast).bytes_total, 0);
}

TEST_P(DataPlaneTest, ConcurrentClientsShareOneLink) {
  constexpr double kBandwidth = 4e6;
  constexpr int64_t kBytes = 1'000'000;
  auto options = ServerOptions();
  options.slow.bytes_per_second = kBandwidth;
  StartServer(options, {{"a", RandomBytes(kBytes, 7)}, {"b", RandomBytes(kBytes, 8)}});
  auto c1 = Client(LinkClass::kSlow);
  auto c2 = Client(LinkClass::kSlow);
  absl::StatusOr<std::vector<std::string>> r1, r2;
  const auto start = testing::Clock::now();
  std::thread t1([&] { r1 = c1->Fetch({"a"}, In(60)); });
  std::thread t2([&] { r2 = c2->Fetch({"b"}, In(60)); });
  t1.join();
  t2.join();
  const double elapsed = SecondsSince(start);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ((*r1)[0], blobs_->at("a"));
  EXPECT_EQ((*r2)[0], blobs_->at("b"));
  EXPECT_GE(elapsed, 2 * kBytes / kBandwidth - 1e-3);
  const LinkStats st = server_->Stats(LinkClass::kSlow);
  EXPECT_EQ(st.fetches, 2);
  CheckSlots(st, kBandwidth, options.write_piece_bytes);
}

TEST_P(DataPlaneTest, LatencyIsAddedPerResponse) {
  auto options = ServerOptions();
  options.fast.latency_seconds = 0.15;
  StartServer(options, {{"a", "1"}});
  auto client = Client(LinkClass::kFast);
  for (int i = 0; i < 2; ++i) {
    const auto start = testing::Clock::now();
    ASSERT_TRUE(client->Fetch({"a"}, In(30)).ok());
    EXPECT_GE(SecondsSince(start), 0.15);
  }
}

TEST_P(DataPlaneTest, BadOptionsAreInvalidArgument) {
  auto options = ServerOptions();
  options.slot_seconds = 0;
  EXPECT_TRUE(HasCode(DataPlaneServer::Create(options, testing::MapLookup(nullptr)),
                      absl::StatusCode::kInvalidArgument, "slot_seconds"));
  options = ServerOptions();
  options.slow.bytes_per_second = -1;
  EXPECT_TRUE(HasCode(DataPlaneServer::Create(options, testing::MapLookup(nullptr)),
                      absl::StatusCode::kInvalidArgument, "slow"));
  options = ServerOptions();
  options.listen = "nonsense";
  EXPECT_TRUE(HasCode(DataPlaneServer::Create(options, testing::MapLookup(nullptr)),
                      absl::StatusCode::kInvalidArgument, "HOST:PORT"));
  DataPlaneClientOptions co;
  ApplyKind(&co);
  EXPECT_TRUE(
      HasCode(DataPlaneClient::Create(co), absl::StatusCode::kInvalidArgument, "server_address"));
  co.server_address = "127.0.0.1:99999";
  EXPECT_TRUE(HasCode(DataPlaneClient::Create(co), absl::StatusCode::kInvalidArgument, "port"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, DataPlaneTest, ::testing::Values("tcp", "ucx", "tls", "ucxauth"),
                         [](const auto& info) { return info.param; });

TEST(DataPlaneKindsTest, UnknownKindListsTheKnownOnes) {
  DataPlaneServerOptions o;
  o.kind = "carrier-pigeon";
  auto s = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string(); });
  EXPECT_TRUE(HasCode(s, absl::StatusCode::kInvalidArgument, "tcp, ucx"));
  DataPlaneClientOptions c;
  c.kind = "carrier-pigeon";
  c.server_address = "127.0.0.1:1";
  EXPECT_TRUE(HasCode(DataPlaneClient::Create(c), absl::StatusCode::kInvalidArgument, "tcp, ucx"));
  EXPECT_STREQ(LinkClassName(LinkClass::kFast), "fast");
  EXPECT_STREQ(LinkClassName(LinkClass::kSlow), "slow");
}

}  // namespace
}  // namespace vc::transport
