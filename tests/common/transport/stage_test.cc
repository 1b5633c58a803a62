// Stage requests (the upload half of a two-phase put) over both backends:
// round trips into the server's stager, refusals by the server's bounds with
// the connection kept (or closed cleanly), a server without a stager, stager
// errors, deadlines, and receiver-side pacing in the per-slot counters.
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/transport/data_plane.h"
#include "gtest/gtest.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport {
namespace {

using testing::HasCode;
using testing::In;
using testing::RandomBytes;
using testing::SecondsSince;

using Entries = std::vector<std::pair<std::string, std::string>>;

// What the stager was handed, by put id; optionally fails on one key.
struct StagedTable {
  std::mutex mu;
  std::map<uint64_t, Entries> puts;
  std::string fail_key;
  absl::Status fail_with;

  BlobStager Stager() {
    return [this](uint64_t put_id, const std::string& key, std::string value) -> absl::Status {
      std::lock_guard<std::mutex> lock(mu);
      if (!fail_key.empty() && key == fail_key) return fail_with;
      puts[put_id].emplace_back(key, std::move(value));
      return absl::OkStatus();
    };
  }
  Entries Of(uint64_t put_id) {
    std::lock_guard<std::mutex> lock(mu);
    return puts[put_id];
  }
};

int64_t ValueBytes(const Entries& entries) {
  int64_t n = 0;
  for (const auto& e : entries) n += static_cast<int64_t>(e.second.size());
  return n;
}

class StageTest : public testing::BackendTest {
 protected:

  // A server whose lookup serves {"k": "v"} and whose stager fills staged_
  // (none with with_stager = false).
  void StartServer(const DataPlaneServerOptions& options, bool with_stager = true) {
    auto s = DataPlaneServer::Create(
        options,
        [](const std::string& key) -> absl::StatusOr<std::string> {
          if (key == "k") return std::string("v");
          return absl::NotFoundError("not in the test table");
        },
        with_stager ? staged_.Stager() : nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  std::unique_ptr<DataPlaneClient> Client(LinkClass link = LinkClass::kFast) {
    DataPlaneClientOptions o;
    ApplyKind(&o);
    o.server_address = server_->address();
    o.link = link;
    auto c = DataPlaneClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The connection (pool) still answers a fetch.
  static void ExpectFetchWorks(DataPlaneClient* client) {
    auto v = client->Fetch({"k"}, In(30));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ((*v)[0], "v");
  }

  StagedTable staged_;
  std::unique_ptr<DataPlaneServer> server_;
};

TEST_P(StageTest, RoundTripsEntriesIntoTheStager) {
  StartServer(ServerOptions());
  const Entries entries = {{RandomBytes(32, 1), RandomBytes(5 << 20, 2)},  // multi-MiB
                           {std::string("\0\x01", 2), "small"},
                           {RandomBytes(32, 3), ""},
                           {RandomBytes(32, 4), RandomBytes(100'000, 5)}};
  auto client = Client();
  ASSERT_TRUE(client->Stage(42, entries, In(60)).ok());
  EXPECT_EQ(staged_.Of(42), entries);
  // The pooled connection stays in step for a fetch and a second stage.
  ExpectFetchWorks(client.get());
  ASSERT_TRUE(client->Stage(43, {{"a", "b"}}, In(60)).ok());
  EXPECT_EQ(staged_.Of(43), (Entries{{"a", "b"}}));

  const ClientStats cs = client->stats();
  EXPECT_EQ(cs.stages, 2);
  EXPECT_EQ(cs.staged_bytes, ValueBytes(entries) + 1);
  // The transport's own count of what it sent, framing included.
  EXPECT_GE(cs.transport_bytes_sent, ValueBytes(entries) + 1);
  EXPECT_EQ(cs.fetches, 1);

  const LinkStats fast = server_->Stats(LinkClass::kFast);
  EXPECT_EQ(fast.stages, 2);
  EXPECT_EQ(fast.fetches, 1);
  EXPECT_GE(fast.bytes_received, ValueBytes(entries) + 1);
  EXPECT_GT(fast.bytes_total, fast.bytes_received);  // the answers went out on it too
  const LinkStats slow = server_->Stats(LinkClass::kSlow);
  EXPECT_EQ(slow.bytes_total, 0);
  EXPECT_EQ(slow.stages, 0);
}

TEST_P(StageTest, EmptyStageIsOkWithoutTraffic) {
  StartServer(ServerOptions());
  ASSERT_TRUE(Client()->Stage(1, {}, In(30)).ok());
  EXPECT_EQ(server_->Stats(LinkClass::kFast).stages, 0);
}

TEST_P(StageTest, ServerWithoutStagerIsUnimplemented) {
  StartServer(ServerOptions(), /*with_stager=*/false);
  auto client = Client();
  EXPECT_TRUE(HasCode(client->Stage(1, {{"a", std::string(1000, 'x')}}, In(30)),
                      absl::StatusCode::kUnimplemented, "no stager"));
  ExpectFetchWorks(client.get());
}

TEST_P(StageTest, TooManyEntriesIsRefusedAndTheConnectionKept) {
  auto options = ServerOptions();
  options.max_entries_per_stage = 4;
  StartServer(options);
  auto client = Client();
  const Entries five(5, {"a", "1"});
  EXPECT_TRUE(HasCode(client->Stage(1, five, In(30)), absl::StatusCode::kInvalidArgument,
                      "max_entries_per_stage"));
  EXPECT_TRUE(staged_.Of(1).empty());  // refused before anything was staged
  ASSERT_TRUE(client->Stage(1, Entries(4, {"a", "1"}), In(30)).ok());
  EXPECT_EQ(staged_.Of(1).size(), 4u);
  EXPECT_EQ(server_->Stats(LinkClass::kFast).stages, 2);
}

TEST_P(StageTest, BodyOverTheMaxIsRefused) {
  auto options = ServerOptions();
  options.max_stage_body_bytes = 1000;
  StartServer(options);
  auto client = Client();
  EXPECT_TRUE(HasCode(
      client->Stage(1, {{"a", std::string(600, 'a')}, {"b", std::string(600, 'b')}}, In(30)),
      absl::StatusCode::kResourceExhausted, "max_stage_body_bytes"));
  EXPECT_TRUE(staged_.Of(1).empty());
  ASSERT_TRUE(client->Stage(1, {{"a", std::string(600, 'a')}}, In(30)).ok());
  EXPECT_EQ(staged_.Of(1).size(), 1u);
}

TEST_P(StageTest, BodyTooLargeToDrainClosesCleanly) {
  // Past the server's drain limit (64 MiB) the refusal is answered and the
  // connection closed; the client sees the refusal or the hang-up, and the
  // next stage reconnects.
  auto options = ServerOptions();
  options.max_stage_body_bytes = 1 << 20;
  StartServer(options);
  auto client = Client();
  const absl::Status refused = client->Stage(1, {{"big", std::string((65 << 20), 'x')}}, In(60));
  EXPECT_TRUE(absl::IsResourceExhausted(refused) || absl::IsUnavailable(refused)) << refused;
  EXPECT_TRUE(staged_.Of(1).empty());
  ASSERT_TRUE(client->Stage(1, {{"a", "1"}}, In(30)).ok());
  EXPECT_EQ(staged_.Of(1).size(), 1u);
}

TEST_P(StageTest, KeyOverTheMaxIsRefused) {
  auto options = ServerOptions();
  options.max_key_bytes = 8;
  StartServer(options);
  auto client = Client();
  EXPECT_TRUE(HasCode(client->Stage(1, {{"ok", "1"}, {std::string(9, 'k'), "2"}}, In(30)),
                      absl::StatusCode::kInvalidArgument, "limit is 8"));
  ExpectFetchWorks(client.get());
}

TEST_P(StageTest, StagerErrorKeepsItsCodeAndMessage) {
  StartServer(ServerOptions());
  staged_.fail_key = std::string("\xab\xcd", 2);
  staged_.fail_with = absl::FailedPreconditionError("put 7 is not open");
  auto client = Client();
  const absl::Status s =
      client->Stage(7, {{"first", "1"}, {staged_.fail_key, "2"}, {"third", "3"}}, In(30));
  EXPECT_TRUE(HasCode(s, absl::StatusCode::kFailedPrecondition, "put 7 is not open"));
  EXPECT_TRUE(HasCode(s, absl::StatusCode::kFailedPrecondition, "abcd"));  // names the key
  // Entries after the failure are not staged (those before may be).
  EXPECT_EQ(staged_.Of(7), (Entries{{"first", "1"}}));
  EXPECT_EQ(client->stats().stages, 0);
  // The rest of the body was read: the connection stays in step.
  ASSERT_TRUE(client->Stage(8, {{"x", "y"}}, In(30)).ok());
  ExpectFetchWorks(client.get());
}

TEST_P(StageTest, PastDeadlineFailsAtOnce) {
  StartServer(ServerOptions());
  EXPECT_TRUE(HasCode(Client()->Stage(1, {{"a", "b"}}, testing::Clock::now()),
                      absl::StatusCode::kDeadlineExceeded));
}

TEST_P(StageTest, DeadlineExceededThenRecovers) {
  auto options = ServerOptions();
  options.slow.bytes_per_second = 1e6;
  StartServer(options);
  auto client = Client(LinkClass::kSlow);
  const auto start = testing::Clock::now();
  EXPECT_TRUE(HasCode(client->Stage(1, {{"big", RandomBytes(4 << 20, 6)}}, In(0.2)),
                      absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(SecondsSince(start), 0.19);  // it waited for the deadline, not less
  ASSERT_TRUE(client->Stage(2, {{"small", "s"}}, In(30)).ok());
  EXPECT_EQ(staged_.Of(2), (Entries{{"small", "s"}}));
}

TEST_P(StageTest, PacedUploadTakesAtLeastBytesOverBandwidthWithinTheSlotBound) {
  constexpr double kBandwidth = 4e6;
  constexpr int64_t kBytes = 2'000'000;
  auto options = ServerOptions();
  options.slow.bytes_per_second = kBandwidth;
  options.write_piece_bytes = 64 << 10;
  StartServer(options);
  auto client = Client(LinkClass::kSlow);
  const Entries entries = {{"a", RandomBytes(kBytes / 2, 7)}, {"b", RandomBytes(kBytes / 2, 8)}};
  const auto start = testing::Clock::now();
  ASSERT_TRUE(client->Stage(3, entries, In(60)).ok());
  EXPECT_GE(SecondsSince(start), kBytes / kBandwidth - 1e-3);
  EXPECT_EQ(staged_.Of(3), entries);

  const LinkStats st = server_->Stats(LinkClass::kSlow);
  EXPECT_EQ(st.stages, 1);
  EXPECT_GE(st.bytes_received, kBytes);
  EXPECT_NEAR(st.busy_seconds, st.bytes_total / kBandwidth, 1e-6);
  testing::ExpectSlotsWithinBound(st, kBandwidth, options.write_piece_bytes);
  EXPECT_EQ(server_->Stats(LinkClass::kFast).bytes_total, 0);
}

TEST_P(StageTest, FetchesAndStagesShareOneLink) {
  constexpr double kBandwidth = 4e6;
  constexpr int64_t kBytes = 1'000'000;
  auto options = ServerOptions();
  options.slow.bytes_per_second = kBandwidth;
  const std::string blob = RandomBytes(kBytes, 9);
  auto s = DataPlaneServer::Create(
      options, [&blob](const std::string&) -> absl::StatusOr<std::string> { return blob; },
      staged_.Stager());
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = std::move(*s);
  auto reader = Client(LinkClass::kSlow);
  auto writer = Client(LinkClass::kSlow);
  absl::StatusOr<std::vector<std::string>> fetched;
  absl::Status staged;
  const auto start = testing::Clock::now();
  std::thread t1([&] { fetched = reader->Fetch({"blob"}, In(60)); });
  std::thread t2([&] { staged = writer->Stage(4, {{"up", RandomBytes(kBytes, 10)}}, In(60)); });
  t1.join();
  t2.join();
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_TRUE(staged.ok()) << staged;
  EXPECT_EQ((*fetched)[0], blob);
  // One bucket for both directions: together they take their sum's time.
  EXPECT_GE(SecondsSince(start), 2 * kBytes / kBandwidth - 1e-3);
  const LinkStats st = server_->Stats(LinkClass::kSlow);
  EXPECT_EQ(st.fetches, 1);
  EXPECT_EQ(st.stages, 1);
  EXPECT_GE(st.bytes_received, kBytes);
  EXPECT_GE(st.bytes_total - st.bytes_received, kBytes);
  testing::ExpectSlotsWithinBound(st, kBandwidth, options.write_piece_bytes);
}

TEST_P(StageTest, ServerDestroyedMidStageIsUnavailable) {
  auto options = ServerOptions();
  options.slow.bytes_per_second = 2e6;
  StartServer(options);
  auto client = Client(LinkClass::kSlow);
  absl::Status result;
  std::thread stager([&] {
    result = client->Stage(5, {{"big", RandomBytes(8 << 20, 11)}}, In(120));
  });
  while (server_->Stats(LinkClass::kSlow).bytes_received == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server_.reset();
  stager.join();
  EXPECT_TRUE(HasCode(result, absl::StatusCode::kUnavailable));
}

TEST_P(StageTest, BadStageOptionsAreInvalidArgument) {
  auto options = ServerOptions();
  options.max_entries_per_stage = 0;
  EXPECT_TRUE(HasCode(DataPlaneServer::Create(options, testing::MapLookup(nullptr)),
                      absl::StatusCode::kInvalidArgument, "max_entries_per_stage"));
  options = ServerOptions();
  options.max_stage_body_bytes = -1;
  EXPECT_TRUE(HasCode(DataPlaneServer::Create(options, testing::MapLookup(nullptr)),
                      absl::StatusCode::kInvalidArgument, "max_stage_body_bytes"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, StageTest, ::testing::Values("tcp", "ucx", "tls", "ucxauth"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace vc::transport
