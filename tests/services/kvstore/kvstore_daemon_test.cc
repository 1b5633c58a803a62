// Runs the real `vc-kvstore` binary on loopback (ports picked by the kernel)
// and drives it through generated gRPC stubs: two-phase put, lookup, get,
// errors, health, /metrics, SIGTERM drain and restart on the same data dir;
// and through the daemons' StoreClient and a raw DataPlaneClient: puts whose
// chunk bytes are staged over the data plane (TCP and UCX).
// Every wait is bounded; TearDown kills a daemon that is still running.
#include "tests/services/kvstore/kvstore_daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/kvstore/kv_cipher.h"
#include "common/kvstore/seal.h"
#include "common/transport/data_plane.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "services/common/store_client.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

constexpr auto kRpcDeadline = std::chrono::seconds(5);

std::string Key(char fill) { return std::string(32, fill); }

// Bytes received and not yet read on the established TCP connections to
// local port `port` (the rx_queue column of /proc/net/tcp and tcp6; gRPC's
// listener is dual-stack): a stopped server reads nothing, so a request
// sent to it stays there. -1 if unreadable.
int64_t UnreadBytesToPort(int port) {
  int64_t unread = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* f = std::fopen(table, "r");
    if (f == nullptr) return -1;
    char line[512];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      unsigned local_port = 0, state = 0;
      unsigned long rx = 0;  // NOLINT(google-runtime-int): sscanf's %lx
      if (std::sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x %*x:%lx", &local_port,
                      &state, &rx) == 3 &&
          static_cast<int>(local_port) == port && state == 0x01 /* ESTABLISHED */) {
        unread += static_cast<int64_t>(rx);
      }
    }
    std::fclose(f);
  }
  return unread;
}

// Whether every thread of `pid` has stopped (state T in /proc/PID/task/*/
// stat). kill(SIGSTOP) returns before the group stop is done: a thread busy
// on another core runs on until it next enters the kernel, and can answer a
// call sent right after the kill.
bool AllThreadsStopped(pid_t pid) {
  std::error_code ec;
  int threads = 0;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    FILE* f = std::fopen((task.path() / "stat").c_str(), "r");
    if (f == nullptr) continue;  // the thread exited
    char line[512] = {};
    const bool read = std::fgets(line, sizeof(line), f) != nullptr;
    std::fclose(f);
    // "TID (comm) S ...": the state follows the last ')' (comm may hold one).
    const char* close = read ? std::strrchr(line, ')') : nullptr;
    if (close == nullptr || close[1] != ' ' || (close[2] != 'T' && close[2] != 't')) return false;
    ++threads;
  }
  return !ec && threads > 0;
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
}

using vc::testing::Daemon;

class KvStoreDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/vc_kvstore_daemon_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    data_dir_ = tmpl;
  }
  void TearDown() override {
    stub_.reset();
    daemon_.reset();
    std::error_code ec;
    std::filesystem::remove_all(data_dir_, ec);
  }

  void StartDaemon(const std::vector<std::string>& extra_args = {}) {
    daemon_ = std::make_unique<Daemon>();
    std::string error;
    std::vector<std::string> args = {"--listen",         "127.0.0.1:0", "--metrics-listen",
                                     "127.0.0.1:0",      "--data-listen", "127.0.0.1:0",
                                     "--data-dir",       data_dir_ + "/db"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    ASSERT_TRUE(daemon_->Start(args, &error)) << error;
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(daemon_->grpc_addr(), grpc::InsecureChannelCredentials(),
                                         channel_args);
    ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + kRpcDeadline));
    stub_ = pb::KvStore::NewStub(channel_);
  }

  grpc::Status Put(const std::vector<std::pair<std::string, std::string>>& entries,
                   bool commit = true) {
    uint64_t id = 0;
    {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      pb::BeginPutResponse resp;
      grpc::Status s = stub_->BeginPut(&ctx, pb::BeginPutRequest(), &resp);
      if (!s.ok()) return s;
      id = resp.put_id();
    }
    for (const auto& [key, value] : entries) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      pb::StageChunkRequest req;
      req.set_put_id(id);
      req.set_key(key);
      req.set_value(value);
      pb::StageChunkResponse resp;
      grpc::Status s = stub_->StageChunk(&ctx, req, &resp);
      if (!s.ok()) return s;
    }
    if (!commit) return grpc::Status::OK;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::CommitPutRequest req;
    req.set_put_id(id);
    pb::CommitPutResponse resp;
    return stub_->CommitPut(&ctx, req, &resp);
  }

  grpc::Status Get(const std::string& key, std::string* value) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::GetRequest req;
    req.set_key(key);
    pb::GetResponse resp;
    grpc::Status s = stub_->Get(&ctx, req, &resp);
    if (value != nullptr) *value = resp.value();
    return s;
  }

  // A daemon's StoreClient of this store (`so` with its control address).
  std::unique_ptr<vc::daemon::StoreClient> NewClient(vc::daemon::StoreClientOptions so = {}) {
    so.control_address = daemon_->grpc_addr();
    auto client = vc::daemon::StoreClient::Create(so);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // The coordinator's client (control plane only), with time for a store
  // restart on a loaded machine; `max_attempts` 0 keeps the default retry.
  std::unique_ptr<vc::daemon::StoreClient> ControlPlaneClient(int max_attempts = 0) {
    vc::daemon::StoreClientOptions so;
    so.timeout = std::chrono::seconds(60);
    so.data_plane = "";
    if (max_attempts > 0) so.retry.max_attempts = max_attempts;
    return NewClient(so);
  }

  // StartApply, waited for on this thread.
  static absl::Status StartApplyAndWait(vc::daemon::StoreClient& client,
                                        vc::daemon::StoreClient::KeyAction action,
                                        const std::string& key, const std::string& holder) {
    std::promise<absl::Status> answer;
    client.StartApply(action, key, holder, {},
                      [&answer](absl::Status s) { answer.set_value(std::move(s)); });
    return answer.get_future().get();
  }

  // kill -9 the store (the test's channel goes first), then start it again
  // on the same addresses and data dir (a restart like a supervisor's).
  void KillDaemon() {
    stub_.reset();
    channel_.reset();
    killed_grpc_addr_ = daemon_->grpc_addr();
    killed_data_addr_ = daemon_->data_addr();
    daemon_->Kill();
  }
  bool RestartDaemon(std::string* error) {
    daemon_ = std::make_unique<Daemon>();
    return daemon_->Start({"--listen", killed_grpc_addr_, "--metrics-listen", "127.0.0.1:0",
                           "--data-listen", killed_data_addr_, "--data-dir", data_dir_ + "/db"},
                          error);
  }

  // The store is stopped (SIGSTOP), `call` starts in a thread, and once its
  // request sits unread in the store's socket (in flight) the store is
  // killed -9 and started again on its addresses and data dir 300 ms later,
  // as `vericache local` restarts it; the call's status. The chaos runs'
  // remaining failures were such calls ("recvmsg: Connection reset by
  // peer").
  absl::Status InFlightAtAStoreKill(const std::function<absl::Status()>& call) {
    stub_.reset();  // the test's own channel is not part of it
    channel_.reset();
    const std::string& addr = daemon_->grpc_addr();
    const int port = std::atoi(addr.substr(addr.rfind(':') + 1).c_str());
    kill(daemon_->pid(), SIGSTOP);
    const auto stop_limit = Clock::now() + std::chrono::seconds(10);
    while (!AllThreadsStopped(daemon_->pid()) && Clock::now() < stop_limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(AllThreadsStopped(daemon_->pid())) << "the store did not stop";
    // Counted once it is stopped: from here the unread bytes only grow.
    const int64_t before = UnreadBytesToPort(port);
    EXPECT_GE(before, 0) << "cannot read /proc/net/tcp";
    absl::Status status = absl::UnknownError("the call never returned");
    std::atomic<bool> returned{false};
    std::thread caller([&] {
      status = call();
      returned = true;
    });
    const auto limit = Clock::now() + std::chrono::seconds(60);
    bool in_flight = false;
    // A call answered while the store is stopped was answered by someone
    // else: no use waiting for its request to arrive.
    while (!in_flight && !returned && Clock::now() < limit) {
      in_flight = UnreadBytesToPort(port) > before;
      if (!in_flight) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    KillDaemon();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::string error;
    const bool restarted = RestartDaemon(&error);
    caller.join();
    EXPECT_TRUE(in_flight) << "the call's request never reached the stopped store";
    EXPECT_TRUE(restarted) << error;
    return status;
  }

  pb::StatResponse Stat() {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::StatResponse stat;
    EXPECT_TRUE(stub_->Stat(&ctx, pb::StatRequest(), &stat).ok());
    return stat;
  }

  static const pb::LinkStat* FindLink(const pb::StatResponse& stat, const std::string& name) {
    for (const auto& l : stat.links()) {
      if (l.link() == name) return &l;
    }
    return nullptr;
  }

  uint64_t BeginPut() {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::BeginPutResponse resp;
    EXPECT_TRUE(stub_->BeginPut(&ctx, pb::BeginPutRequest(), &resp).ok());
    return resp.put_id();
  }

  grpc::Status EndPut(uint64_t id, bool commit) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    if (commit) {
      pb::CommitPutRequest req;
      req.set_put_id(id);
      pb::CommitPutResponse resp;
      return stub_->CommitPut(&ctx, req, &resp);
    }
    pb::AbortPutRequest req;
    req.set_put_id(id);
    pb::AbortPutResponse resp;
    return stub_->AbortPut(&ctx, req, &resp);
  }

  bool Visible(const std::string& key) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::LookupRequest req;
    req.add_keys(key);
    pb::LookupResponse resp;
    EXPECT_TRUE(stub_->Lookup(&ctx, req, &resp).ok());
    const bool hit = resp.results_size() == 1 && resp.results(0).hit();
    EXPECT_EQ(Get(key, nullptr).ok(), hit);
    return hit;
  }

  // PutAll through a StoreClient (as the verifier's ingest does), then a
  // raw stage into puts that are left open, committed and aborted.
  void PutsOverTheDataPlane(const std::string& kind);

  std::string data_dir_;
  std::string killed_grpc_addr_, killed_data_addr_;  // KillDaemon -> RestartDaemon
  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KvStore::Stub> stub_;
};

TEST_F(KvStoreDaemonTest, PutCommitGetAndLookup) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string a = Key('a'), b = Key('b'), c = Key('c');
  ASSERT_TRUE(Put({{a, "alpha"}, {b, std::string(1000, '\x01')}}).ok());
  // An uncommitted put stays invisible.
  ASSERT_TRUE(Put({{c, "gamma"}}, /*commit=*/false).ok());

  std::string value;
  ASSERT_TRUE(Get(a, &value).ok());
  EXPECT_EQ(value, "alpha");
  ASSERT_TRUE(Get(b, &value).ok());
  EXPECT_EQ(value, std::string(1000, '\x01'));
  EXPECT_EQ(Get(c, nullptr).error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  pb::LookupRequest req;
  req.add_keys(a);
  req.add_keys(c);
  req.add_keys(b);
  pb::LookupResponse resp;
  ASSERT_TRUE(stub_->Lookup(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 3);
  EXPECT_EQ(resp.results(0).key(), a);
  EXPECT_TRUE(resp.results(0).hit());
  EXPECT_NE(resp.results(0).tier(), pb::TIER_UNSPECIFIED);
  EXPECT_FALSE(resp.results(1).hit());
  EXPECT_EQ(resp.results(1).tier(), pb::TIER_UNSPECIFIED);
  EXPECT_TRUE(resp.results(2).hit());

  grpc::ClientContext sctx;
  SetDeadline(&sctx);
  pb::StatResponse stat;
  ASSERT_TRUE(stub_->Stat(&sctx, pb::StatRequest(), &stat).ok());
  EXPECT_EQ(stat.disk_entries(), 2);
  EXPECT_EQ(stat.open_puts(), 1);  // the uncommitted one
  EXPECT_GE(stat.misses(), 1);
}

TEST_F(KvStoreDaemonTest, ErrorsKeepTheirCodes) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  grpc::Status s = Get("short", nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("32"), std::string::npos) << s.error_message();

  EXPECT_EQ(Get(Key('z'), nullptr).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Put({{std::string(33, 'k'), "v"}}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext lctx;
  SetDeadline(&lctx);
  pb::LookupRequest lreq;
  lreq.add_keys(Key('a'));
  lreq.add_keys("");
  pb::LookupResponse lresp;
  s = stub_->Lookup(&lctx, lreq, &lresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("keys[1]"), std::string::npos) << s.error_message();

  grpc::ClientContext cctx;
  SetDeadline(&cctx);
  pb::CommitPutRequest creq;
  creq.set_put_id(987654321);
  pb::CommitPutResponse cresp;
  s = stub_->CommitPut(&cctx, creq, &cresp);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_code(), grpc::StatusCode::UNKNOWN);

  grpc::ClientContext uctx;
  SetDeadline(&uctx);
  pb::UnpinRequest ureq;
  ureq.set_key(Key('a'));
  pb::UnpinResponse uresp;
  const grpc::Status unpin = stub_->Unpin(&uctx, ureq, &uresp);
  EXPECT_EQ(unpin.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unpin.error_message().find("holder"), std::string::npos) << unpin.error_message();
}

TEST_F(KvStoreDaemonTest, PinDeleteAbort) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string k = Key('q');
  ASSERT_TRUE(Put({{k, "v"}}).ok());
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::PinRequest req;
    req.set_key(k);
    req.set_holder("h");
    pb::PinResponse resp;
    ASSERT_TRUE(stub_->Pin(&ctx, req, &resp).ok());
  }
  auto del = [&]() {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::DeleteRequest req;
    req.set_key(k);
    pb::DeleteResponse resp;
    return stub_->Delete(&ctx, req, &resp);
  };
  EXPECT_EQ(del().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::UnpinRequest req;
    req.set_key(k);
    req.set_holder("h");
    pb::UnpinResponse resp;
    ASSERT_TRUE(stub_->Unpin(&ctx, req, &resp).ok());
  }
  EXPECT_TRUE(del().ok());
  EXPECT_EQ(Get(k, nullptr).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(del().error_code(), grpc::StatusCode::NOT_FOUND);

  // An aborted put can be neither committed nor seen.
  grpc::ClientContext bctx;
  SetDeadline(&bctx);
  pb::BeginPutResponse begun;
  ASSERT_TRUE(stub_->BeginPut(&bctx, pb::BeginPutRequest(), &begun).ok());
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::StageChunkRequest req;
    req.set_put_id(begun.put_id());
    req.set_key(k);
    req.set_value("staged");
    pb::StageChunkResponse resp;
    ASSERT_TRUE(stub_->StageChunk(&ctx, req, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::AbortPutRequest req;
    req.set_put_id(begun.put_id());
    pb::AbortPutResponse resp;
    ASSERT_TRUE(stub_->AbortPut(&ctx, req, &resp).ok());
  }
  grpc::ClientContext cctx;
  SetDeadline(&cctx);
  pb::CommitPutRequest creq;
  creq.set_put_id(begun.put_id());
  pb::CommitPutResponse cresp;
  EXPECT_FALSE(stub_->CommitPut(&cctx, creq, &cresp).ok());
  EXPECT_EQ(Get(k, nullptr).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(KvStoreDaemonTest, OversizedMessageIsRejected) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--max-message-bytes", "4096"}));
  EXPECT_EQ(Put({{Key('o'), std::string(8192, 'x')}}).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Put({{Key('o'), std::string(1024, 'x')}}).ok());
}

TEST_F(KvStoreDaemonTest, HealthIsServing) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  // grpc.health.v1.Health/Check over the generic stub: the request
  // (service = "") encodes to no bytes; SERVING (1) encodes to 08 01.
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  grpc::Slice empty(std::string{});
  grpc::ByteBuffer req(&empty, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", req, &cq);
  call->StartCall();
  grpc::ByteBuffer resp;
  grpc::Status status;
  call->Finish(&resp, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));  // bounded by the call's deadline
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(resp.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(KvStoreDaemonTest, MetricsCountRequests) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Put({{Key('m'), "metric"}}).ok());
  ASSERT_TRUE(Get(Key('m'), nullptr).ok());
  EXPECT_EQ(Get(Key('n'), nullptr).error_code(), grpc::StatusCode::NOT_FOUND);

  httplib::Client client(daemon_->metrics_host(), daemon_->metrics_port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << "scrape failed";
  ASSERT_EQ(res->status, 200);
  const std::string& body = res->body;
  EXPECT_NE(body.find("vericache_kvstore_requests_total{method=\"Get\",code=\"OK\"} 1"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find("vericache_kvstore_requests_total{method=\"Get\",code=\"NOT_FOUND\"} 1"),
            std::string::npos);
  EXPECT_NE(body.find("vericache_kvstore_request_seconds_count{method=\"CommitPut\"} 1"),
            std::string::npos);
  EXPECT_NE(body.find("vericache_kvstore_entries{tier=\"disk\"} 1"), std::string::npos);
  EXPECT_NE(body.find("vericache_kvstore_hits_total 1"), std::string::npos);
  EXPECT_NE(body.find("vericache_kvstore_misses_total 1"), std::string::npos);
  EXPECT_NE(body.find("vericache_build_info"), std::string::npos);
}

TEST_F(KvStoreDaemonTest, SigtermDrainsAndDataSurvivesRestart) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Put({{Key('p'), "persist"}}).ok());
  stub_.reset();
  channel_.reset();
  const auto start = Clock::now();
  EXPECT_EQ(daemon_->SignalAndWait(SIGTERM), 0);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));

  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  std::string value;
  ASSERT_TRUE(Get(Key('p'), &value).ok());
  EXPECT_EQ(value, "persist");
  // Close the channel first: an idle client channel only notices the
  // server's GOAWAY on its 5 s backup poll, which holds the drain that long.
  stub_.reset();
  channel_.reset();
  EXPECT_EQ(daemon_->SignalAndWait(SIGINT), 0);
}

// Regression (docs/results.md section 6): a verifier's first data-plane
// fetch after a store restart failed ("data plane connect to ...: Connection
// refused" while the store was down, "peer closed the connection" on
// connections pooled before the restart). A fetch is a read: the
// StoreClient now tries again until its deadline, so one made while the
// store is down returns once it is back on its addresses. Without that this
// fetch fails at once.
TEST_F(KvStoreDaemonTest, FetchWaitsForARestartedStore) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::unique_ptr<vc::daemon::StoreClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->PutAll({{Key('r'), "restarted"}}).ok());
  // A pooled connection to the store that is about to die.
  ASSERT_TRUE(client->Fetch({Key('r')}).ok());
  KillDaemon();
  absl::StatusOr<std::vector<std::string>> fetched;
  std::thread fetch(
      [&] { fetched = client->Fetch({Key('r')}, Clock::now() + std::chrono::seconds(30)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::string error;
  const bool restarted = RestartDaemon(&error);
  fetch.join();
  ASSERT_TRUE(restarted) << error;
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(*fetched, std::vector<std::string>{"restarted"});
}

// Regression (issue 13, cluster chaos): a verifier's ingest whose put was
// under way when the store was killed failed once ("data plane peer closed
// the connection" on the connection pooled before the kill, or "no open put"
// once a stage reached the restarted store, which had never heard of the
// put). A put the store lost is now begun again and staged again in full on
// a fresh connection, never resumed. Here the store's link is paced so that
// the kill -9 lands between the put's stage calls; the store comes back on
// the same addresses and data dir, the put succeeds, and every committed
// value reads back whole. Without the retry this put fails.
TEST_F(KvStoreDaemonTest, PutStartsAgainAfterTheStoreIsKilledMidPut) {
  // 500 kB/s: the put's 16 stage calls of 64 KiB take about two seconds, so
  // the kill comes well before its end even on a loaded machine.
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--fast-link-bytes-per-second", "500000"}));
  vc::daemon::StoreClientOptions so;
  so.stage_batch_bytes = 64 << 10;
  so.timeout = std::chrono::seconds(30);
  const std::unique_ptr<vc::daemon::StoreClient> client = NewClient(so);
  ASSERT_NE(client, nullptr);
  constexpr int kEntries = 16;
  std::vector<std::pair<std::string, std::string>> entries;
  for (int i = 0; i < kEntries; ++i) {
    entries.emplace_back(Key(static_cast<char>('A' + i)),
                         std::string(64 << 10, static_cast<char>('a' + i)));
  }
  absl::Status put;
  std::thread writer(
      [&] { put = client->PutAll(entries, Clock::now() + std::chrono::seconds(60)); });
  // Mid-put: some stage calls answered, not all.
  const auto limit = Clock::now() + std::chrono::seconds(30);
  int64_t stages = 0;
  while (stages < 2 && Clock::now() < limit) {
    const pb::StatResponse stat = Stat();
    const pb::LinkStat* fast = FindLink(stat, "fast");
    stages = fast == nullptr ? 0 : fast->stages();
    if (stages < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  KillDaemon();
  std::string error;
  const bool restarted = RestartDaemon(&error);
  writer.join();
  ASSERT_GE(stages, 2) << "the put never got going";
  ASSERT_TRUE(restarted) << error;
  ASSERT_TRUE(put.ok()) << put;
  // The kill did land mid-put: the put was staged again from its start.
  EXPECT_GT(client->data_stats().stages, kEntries);
  for (const auto& [key, value] : entries) {
    absl::StatusOr<std::string> got = client->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, value);
  }
}

// A put the store refuses is not tried again (only a put it lost is).
TEST_F(KvStoreDaemonTest, RefusedPutIsNotTriedAgain) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::unique_ptr<vc::daemon::StoreClient> client = NewClient();
  ASSERT_NE(client, nullptr);
  const absl::Status put = client->PutAll({{"short key", "v"}});
  EXPECT_TRUE(absl::IsInvalidArgument(put)) << put;
  EXPECT_EQ(client->data_stats().stages, 0);  // the one refused stage call
  const pb::StatResponse stat = Stat();
  const pb::LinkStat* fast = FindLink(stat, "fast");
  ASSERT_NE(fast, nullptr);
  EXPECT_EQ(fast->stages(), 1);
  EXPECT_EQ(stat.open_puts(), 0);
}

// Regression (issue 13, cluster chaos): every clean failure left in the
// chaos runs was a coordinator's Lookup or Get in flight when the store was
// killed -9 ("recvmsg: Connection reset by peer"): waiting for the channel
// helps a call made while the store is down, not one already sent. Reads
// are now tried again on UNAVAILABLE (StoreClientOptions::retry) within
// their deadline: each call below is sent to the stopped store, which is
// then killed and restarted, and returns the stored answer. With the retry
// off (max_attempts 1) the same calls fail.
TEST_F(KvStoreDaemonTest, LookupAndGetAreTriedAgainAcrossAStoreKill) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::unique_ptr<vc::daemon::StoreClient> client = ControlPlaneClient();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->PutAll({{Key('m'), "manifest"}}).ok());
  // Connected: the calls below go out on the connection the kill resets.
  ASSERT_TRUE(client->Lookup({Key('m')}).ok());

  absl::StatusOr<std::vector<bool>> hits;
  const absl::Status lookup = InFlightAtAStoreKill([&] {
    hits = client->Lookup({Key('m'), Key('x')});
    return hits.status();
  });
  ASSERT_TRUE(lookup.ok()) << lookup;
  EXPECT_EQ(*hits, (std::vector<bool>{true, false}));
  EXPECT_GE(client->retries(), 1);  // the kill did land under the call

  const int64_t retries = client->retries();
  absl::StatusOr<std::string> value;
  const absl::Status get = InFlightAtAStoreKill([&] {
    value = client->Get(Key('m'));
    return value.status();
  });
  ASSERT_TRUE(get.ok()) << get;
  EXPECT_EQ(*value, "manifest");
  EXPECT_GE(client->retries(), retries + 1);
}

TEST_F(KvStoreDaemonTest, LookupAndGetFailAcrossAStoreKillWithoutTheRetry) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::unique_ptr<vc::daemon::StoreClient> client = ControlPlaneClient(1);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->PutAll({{Key('m'), "manifest"}}).ok());
  ASSERT_TRUE(client->Lookup({Key('m')}).ok());
  const absl::Status lookup =
      InFlightAtAStoreKill([&] { return client->Lookup({Key('m')}).status(); });
  EXPECT_TRUE(absl::IsUnavailable(lookup)) << lookup;
  EXPECT_TRUE(absl::StrContains(lookup.message(), "vc-kvstore Lookup")) << lookup;
  EXPECT_TRUE(absl::StrContains(lookup.message(), "gave up after 1 attempt")) << lookup;
  // The restarted store answers the next call (it waits for the channel).
  ASSERT_TRUE(client->Get(Key('m')).ok());
  const absl::Status get = InFlightAtAStoreKill([&] { return client->Get(Key('m')).status(); });
  EXPECT_TRUE(absl::IsUnavailable(get)) << get;
  EXPECT_TRUE(absl::StrContains(get.message(), "vc-kvstore Get")) << get;
  EXPECT_EQ(client->retries(), 0);
}

// Pins are idempotent per holder, so the store client tries a Pin or Unpin
// sent to a store that is killed under it again (as a read), and the pin
// outlives the kill: the restarted store still refuses to delete the entry.
TEST_F(KvStoreDaemonTest, PinsAreTriedAgainAcrossAStoreKillAndOutliveIt) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::unique_ptr<vc::daemon::StoreClient> client = ControlPlaneClient();
  ASSERT_NE(client, nullptr);
  using Action = vc::daemon::StoreClient::KeyAction;
  const std::string k = Key('n');
  ASSERT_TRUE(client->PutAll({{k, "pinned"}}).ok());
  ASSERT_TRUE(client->Lookup({k}).ok());  // connected
  const absl::Status pin =
      InFlightAtAStoreKill([&] { return client->Apply(Action::kPin, k, "prefix-1"); });
  ASSERT_TRUE(pin.ok()) << pin;
  EXPECT_GE(client->retries(), 1) << "the kill did land under the pin";
  // Killed and started again with the pin held: the pin is still there.
  KillDaemon();
  std::string error;
  ASSERT_TRUE(RestartDaemon(&error)) << error;
  ASSERT_TRUE(client->Lookup({k}).ok());  // reconnected (a lookup waits for it)
  const absl::Status refused = client->Apply(Action::kDelete, k, "");
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  const absl::StatusOr<vc::daemon::StoreClient::PinHolderList> holders =
      client->PinHolders("prefix-", 10);
  ASSERT_TRUE(holders.ok()) << holders.status();
  EXPECT_EQ(holders->holders, std::vector<std::string>{"prefix-1"});
  // Once more: the answer of an asynchronous unpin sent before a kill.
  const int64_t retries = client->retries();
  const absl::Status unpin = InFlightAtAStoreKill(
      [&] { return StartApplyAndWait(*client, Action::kUnpin, k, "prefix-1"); });
  ASSERT_TRUE(unpin.ok()) << unpin;
  EXPECT_GE(client->retries(), retries + 1);
  EXPECT_TRUE(client->Apply(Action::kUnpin, k, "prefix-1").ok()) << "repeated: harmless";
  std::promise<absl::StatusOr<vc::daemon::StoreClient::PinHolderList>> none;
  client->StartPinHolders("prefix-", 10, {}, [&none](auto list) { none.set_value(list); });
  const auto listed = none.get_future().get();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->holders.empty());
  const absl::Status deleted = client->Apply(Action::kDelete, k, "");
  EXPECT_TRUE(deleted.ok()) << deleted;
}

// A Delete sent to a store that is killed under it is tried again (the
// restarted store deletes the entry), on both APIs; one that is repeated
// after it was applied answers NotFound, which ManagePrefix takes as
// deleted.
TEST_F(KvStoreDaemonTest, DeletesAreTriedAgainAcrossAStoreKill) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::unique_ptr<vc::daemon::StoreClient> client = ControlPlaneClient();
  ASSERT_NE(client, nullptr);
  using Action = vc::daemon::StoreClient::KeyAction;
  const std::string sync_key = Key('d'), async_key = Key('e');
  ASSERT_TRUE(client->PutAll({{sync_key, "one"}, {async_key, "two"}}).ok());
  ASSERT_TRUE(client->Lookup({sync_key}).ok());  // connected
  const absl::Status deleted =
      InFlightAtAStoreKill([&] { return client->Apply(Action::kDelete, sync_key, ""); });
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_GE(client->retries(), 1) << "the kill did land under the delete";
  ASSERT_TRUE(client->Lookup({sync_key}).ok());  // reconnected
  const int64_t retries = client->retries();
  const absl::Status async_deleted = InFlightAtAStoreKill(
      [&] { return StartApplyAndWait(*client, Action::kDelete, async_key, ""); });
  ASSERT_TRUE(async_deleted.ok()) << async_deleted;
  EXPECT_GE(client->retries(), retries + 1);
  const absl::StatusOr<std::vector<bool>> hits = client->Lookup({sync_key, async_key});
  ASSERT_TRUE(hits.ok()) << hits.status();
  EXPECT_EQ(*hits, (std::vector<bool>{false, false}));
  EXPECT_TRUE(absl::IsNotFound(client->Apply(Action::kDelete, sync_key, "")));
}

// A Get of a missing key is answered NotFound after one call: not retried.
TEST_F(KvStoreDaemonTest, AMissingKeyIsNotTriedAgain) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  vc::daemon::StoreClientOptions so;
  so.data_plane = "";
  const std::unique_ptr<vc::daemon::StoreClient> client = NewClient(so);
  ASSERT_NE(client, nullptr);
  const absl::StatusOr<std::string> got = client->Get(Key('z'));
  EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
  EXPECT_EQ(client->retries(), 0);
}

void KvStoreDaemonTest::PutsOverTheDataPlane(const std::string& kind) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--data-plane", kind}));
  vc::daemon::StoreClientOptions so;
  so.control_address = daemon_->grpc_addr();
  so.data_plane = kind;
  so.link = vc::transport::LinkClass::kFast;
  so.stage_batch_bytes = 256 << 10;  // several stage calls for one put
  auto client = vc::daemon::StoreClient::Create(so);
  ASSERT_TRUE(client.ok()) << client.status();

  std::vector<std::pair<std::string, std::string>> entries;
  int64_t value_bytes = 0;
  for (int i = 0; i < 6; ++i) {
    std::string value(100'000 + i, static_cast<char>('0' + i));
    value_bytes += static_cast<int64_t>(value.size());
    entries.emplace_back(Key(static_cast<char>('a' + i)), std::move(value));
  }
  const absl::Status put = (*client)->PutAll(entries);
  ASSERT_TRUE(put.ok()) << put;
  const vc::transport::ClientStats cs = (*client)->data_stats();
  EXPECT_EQ(cs.stages, 3);  // 600 kB in batches of <= 256 KiB
  EXPECT_EQ(cs.staged_bytes, value_bytes);
  EXPECT_GE(cs.transport_bytes_sent, value_bytes);
  for (const auto& [key, value] : entries) {
    std::string got;
    ASSERT_TRUE(Get(key, &got).ok());
    EXPECT_EQ(got, value);
  }
  // The bytes crossed the store's data plane, on the writer's link.
  const pb::StatResponse stat = Stat();
  EXPECT_EQ(stat.data_plane(), kind);
  const pb::LinkStat* fast = FindLink(stat, "fast");
  ASSERT_NE(fast, nullptr);
  EXPECT_EQ(fast->stages(), 3);
  EXPECT_GE(fast->bytes_received(), value_bytes);
  EXPECT_GE(fast->bytes_total(), fast->bytes_received());
  const pb::LinkStat* slow = FindLink(stat, "slow");
  ASSERT_NE(slow, nullptr);
  EXPECT_EQ(slow->bytes_received(), 0);

  // A raw data plane client: staged entries stay invisible until CommitPut,
  // and AbortPut discards them.
  vc::transport::DataPlaneClientOptions dopts;
  dopts.kind = kind;
  dopts.server_address = stat.data_address();
  auto dp = vc::transport::DataPlaneClient::Create(dopts);
  ASSERT_TRUE(dp.ok()) << dp.status();
  const auto in30 = [] { return Clock::now() + std::chrono::seconds(30); };
  const std::string committed = Key('x'), aborted = Key('y');
  const uint64_t id1 = BeginPut();
  ASSERT_TRUE((*dp)->Stage(id1, {{committed, "later"}}, in30()).ok());
  const uint64_t id2 = BeginPut();
  ASSERT_TRUE((*dp)->Stage(id2, {{aborted, "never"}}, in30()).ok());
  EXPECT_FALSE(Visible(committed)) << "a staged, uncommitted entry is visible";
  EXPECT_FALSE(Visible(aborted));
  EXPECT_EQ(Stat().open_puts(), 2);
  ASSERT_TRUE(EndPut(id1, /*commit=*/true).ok());
  EXPECT_TRUE(Visible(committed));
  ASSERT_TRUE(EndPut(id2, /*commit=*/false).ok());
  EXPECT_FALSE(Visible(aborted));
  EXPECT_FALSE(EndPut(id2, /*commit=*/true).ok());  // gone with the abort

  // The StageChunk RPC's validation and the store's errors, same codes.
  const uint64_t id3 = BeginPut();
  const absl::Status short_key = (*dp)->Stage(id3, {{"short", "v"}}, in30());
  EXPECT_TRUE(absl::IsInvalidArgument(short_key)) << short_key;
  EXPECT_NE(std::string(short_key.message()).find("32"), std::string::npos) << short_key;
  const absl::Status no_put = (*dp)->Stage(987654321, {{Key('z'), "v"}}, in30());
  EXPECT_TRUE(absl::IsNotFound(no_put)) << no_put;
  EXPECT_NE(std::string(no_put.message()).find("no open put"), std::string::npos) << no_put;
  ASSERT_TRUE(EndPut(id3, /*commit=*/false).ok());

  // Counted in the request metrics like the RPC.
  httplib::Client metrics(daemon_->metrics_host(), daemon_->metrics_port());
  metrics.set_connection_timeout(5);
  metrics.set_read_timeout(5);
  auto res = metrics.Get("/metrics");
  ASSERT_TRUE(res) << "scrape failed";
  EXPECT_NE(
      res->body.find("vericache_kvstore_requests_total{method=\"DataPlaneStage\",code=\"OK\"} 8"),
      std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("vericache_kvstore_requests_total{method=\"DataPlaneStage\",code="
                           "\"INVALID_ARGUMENT\"} 1"),
            std::string::npos);
}

TEST_F(KvStoreDaemonTest, PutAllStagesOverTheTcpDataPlane) { PutsOverTheDataPlane("tcp"); }

TEST_F(KvStoreDaemonTest, PutAllStagesOverTheUcxDataPlane) {
  vc::transport::DataPlaneClientOptions probe;
  probe.kind = "ucx";
  probe.server_address = "127.0.0.1:1";
  auto ucx = vc::transport::DataPlaneClient::Create(probe);
  if (!ucx.ok()) GTEST_SKIP() << "UCX cannot create a context here: " << ucx.status();
  PutsOverTheDataPlane("ucx");
}

TEST_F(KvStoreDaemonTest, PutAllWithoutADataPlaneUsesStageChunk) {
  // The coordinator's client (no data plane): the gRPC fallback.
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  vc::daemon::StoreClientOptions so;
  so.control_address = daemon_->grpc_addr();
  so.data_plane = "";
  auto client = vc::daemon::StoreClient::Create(so);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->PutAll({{Key('f'), "fallback"}}).ok());
  std::string value;
  ASSERT_TRUE(Get(Key('f'), &value).ok());
  EXPECT_EQ(value, "fallback");
  const pb::LinkStat* fast = FindLink(Stat(), "fast");
  ASSERT_NE(fast, nullptr);
  EXPECT_EQ(fast->stages(), 0);
  // A failed stage aborts the put: nothing stays open.
  EXPECT_TRUE(absl::IsInvalidArgument((*client)->PutAll({{"short", "v"}})));
  EXPECT_EQ(Stat().open_puts(), 0);
}

// StoreClient's KV encryption (--kv-secret-file) against the real store: the
// store holds only the encrypted, sealed entry; a reader decrypts it with its
// tenant's key and refuses it without a secret, with another secret or for
// another tenant, each with its own clear error; a plaintext entry is refused
// by a reader that expects encryption.
TEST_F(KvStoreDaemonTest, PutKvEncryptsAndFetchKvDecryptsPerTenant) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  auto generated = vc::kvstore::SealSigner::Generate();
  ASSERT_TRUE(generated.ok()) << generated.status();
  const std::shared_ptr<const vc::kvstore::SealSigner> signer = std::move(*generated);
  auto trust = std::make_shared<vc::kvstore::SealTrust>();
  ASSERT_TRUE(trust->Add(signer->PublicKeyHex()).ok());
  auto ring = [](char fill) {
    return std::make_shared<const vc::kvstore::KvKeyring>(
        std::move(vc::kvstore::KvKeyring::FromSecret(std::string(32, fill))).value());
  };
  // Sealed (one hash per byte: the decryption skips the checksum the seal
  // recomputed) or not (the decryption recomputes it).
  for (const bool sealed : {true, false}) {
    SCOPED_TRACE(sealed ? "sealed" : "unsealed");
    auto client = [&](std::shared_ptr<const vc::kvstore::KvKeyring> keyring) {
      vc::daemon::StoreClientOptions so;
      so.control_address = daemon_->grpc_addr();
      if (sealed) {
        so.seal_signer = signer;
        so.seal_trust = trust;
      }
      so.kv_keyring = std::move(keyring);
      return std::move(vc::daemon::StoreClient::Create(so)).value();
    };
    const std::string key = Key(sealed ? 'e' : 'u');
    const std::string plain = "VCKC chunk bytes of tenant one";
    auto writer = client(ring('a'));
    ASSERT_TRUE(writer->PutKv({{key, plain}}, "salt-one").ok());
    std::string stored;
    ASSERT_TRUE(Get(key, &stored).ok());
    EXPECT_TRUE(vc::kvstore::LooksEncrypted(stored));
    EXPECT_EQ(stored.find("chunk bytes"), std::string::npos);

    auto same = writer->FetchKv({key}, "salt-one");
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_EQ((*same)[0], plain);
    EXPECT_EQ(writer->fetched_checksum(), vc::kvstore::ChecksumCheck::kAlreadyRecomputed);

    const absl::Status other_tenant = writer->FetchKv({key}, "salt-two").status();
    EXPECT_TRUE(absl::IsUnauthenticated(other_tenant)) << other_tenant;
    const absl::Status no_tenant = writer->FetchKv({key}, "").status();
    EXPECT_TRUE(absl::IsFailedPrecondition(no_tenant)) << no_tenant;
    const absl::Status other_secret = client(ring('b'))->FetchKv({key}, "salt-one").status();
    EXPECT_TRUE(absl::IsUnauthenticated(other_secret)) << other_secret;
    EXPECT_NE(std::string(other_secret.message()).find("--kv-secret-file"), std::string::npos);
    const absl::Status no_secret = client(nullptr)->FetchKv({key}, "salt-one").status();
    EXPECT_TRUE(absl::IsFailedPrecondition(no_secret)) << no_secret;
    EXPECT_NE(std::string(no_secret.message()).find("--kv-secret-file"), std::string::npos);
    // Refused, not quarantined: still there for the right reader.
    EXPECT_TRUE(writer->FetchKv({key}, "salt-one").ok());

    // An ingest without a tenant writes nothing.
    EXPECT_TRUE(absl::IsFailedPrecondition(writer->PutKv({{Key('n'), plain}}, "")));
    EXPECT_EQ(Stat().open_puts(), 0);
  }
  // A plaintext entry (written without a secret, unsealed) is refused by a
  // reader that holds one, not decoded.
  vc::daemon::StoreClientOptions so;
  so.control_address = daemon_->grpc_addr();
  auto plain_writer = std::move(vc::daemon::StoreClient::Create(so)).value();
  ASSERT_TRUE(plain_writer->PutKv({{Key('p'), "plaintext"}}, "salt-one").ok());
  so.kv_keyring = ring('a');
  auto reader = std::move(vc::daemon::StoreClient::Create(so)).value();
  const absl::Status refused = reader->FetchKv({Key('p')}, "salt-one").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(std::string(refused.message()).find("not encrypted"), std::string::npos) << refused;
}

TEST(KvStoreDaemonFlagsTest, BadFlagsExitTwoWithOneLine) {
  for (const std::string& args : {std::string("--listen 127.0.0.1:0"),  // no --data-dir
                                  std::string("--data-dir /tmp/x --max-message-bytes 0"),
                                  std::string("--data-dir /tmp/x --listen nonsense"),
                                  std::string("--no-such-flag 1")}) {
    const std::string err_path =
        ::testing::TempDir() + "/vc_kvstore_flags_" + std::to_string(getpid()) + ".txt";
    const std::string cmd = std::string(VC_KVSTORE_PATH) + " " + args + " >/dev/null 2>" + err_path;
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << args;
    EXPECT_EQ(WEXITSTATUS(status), 2) << args;
    std::string err;
    if (FILE* f = std::fopen(err_path.c_str(), "r")) {
      std::array<char, 1024> buf;
      size_t n;
      while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) err.append(buf.data(), n);
      std::fclose(f);
    }
    std::remove(err_path.c_str());
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << args << ": " << err;
  }
}

TEST(KvStoreDaemonFlagsTest, HelpExitsZero) {
  const std::string cmd = std::string(VC_KVSTORE_PATH) + " --help >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
