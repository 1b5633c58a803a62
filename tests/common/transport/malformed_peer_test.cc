// The TCP data plane facing peers that do not follow the framing: a server
// that lies about lengths or hangs up mid-response, and clients that send
// garbage or stall. Every case ends in a clear error, never a crash, a huge
// allocation or a hang, and the real server keeps serving others.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/data_plane.h"
#include "common/transport/internal/wire.h"
#include "gtest/gtest.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport {
namespace {

using testing::HasCode;
using testing::In;

// A one-connection TCP server on 127.0.0.1 that runs `script` on the
// accepted socket.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> script) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, script] {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 30'000) <= 0) return;
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      script(fd);
      ::close(fd);
    });
  }
  ~FakeServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

void ReadRequest(int fd) {
  char header[internal::kRequestHeaderBytes];
  ASSERT_EQ(::recv(fd, header, sizeof(header), MSG_WAITALL), static_cast<ssize_t>(sizeof(header)));
  auto h = internal::DecodeRequestHeader(header);
  ASSERT_TRUE(h.ok()) << h.status();
  std::string body(h->body_bytes, '\0');
  ASSERT_EQ(::recv(fd, body.data(), body.size(), MSG_WAITALL), static_cast<ssize_t>(body.size()));
}

void SendAll(int fd, const std::string& s) {
  ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

std::string OkHeader(uint32_t count) {
  internal::ResponseHeader h;
  h.count = count;
  return internal::EncodeResponseHeader(h);
}

std::unique_ptr<DataPlaneClient> ClientFor(const std::string& address,
                                           int64_t max_response_bytes = int64_t{1} << 30) {
  DataPlaneClientOptions o;
  o.server_address = address;
  o.max_response_bytes = max_response_bytes;
  auto c = DataPlaneClient::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

TEST(MalformedServerTest, HugeValueLengthIsRefusedBeforeAllocating) {
  FakeServer server([](int fd) {
    ReadRequest(fd);
    std::string reply = OkHeader(1);
    internal::PutU64(&reply, uint64_t{1} << 60);
    SendAll(fd, reply);
    char c;
    ::recv(fd, &c, 1, 0);  // until the client hangs up
  });
  auto client = ClientFor(server.address(), /*max_response_bytes=*/1 << 20);
  EXPECT_TRUE(HasCode(client->Fetch({"k"}, In(30)), absl::StatusCode::kResourceExhausted,
                      "max_response_bytes"));
}

TEST(MalformedServerTest, WrongValueCountIsDataLoss) {
  FakeServer server([](int fd) {
    ReadRequest(fd);
    SendAll(fd, OkHeader(2));
  });
  EXPECT_TRUE(HasCode(ClientFor(server.address())->Fetch({"k"}, In(30)),
                      absl::StatusCode::kDataLoss, "2 values for 1 keys"));
}

TEST(MalformedServerTest, GarbageHeaderIsDataLoss) {
  FakeServer server([](int fd) {
    ReadRequest(fd);
    SendAll(fd, std::string(internal::kResponseHeaderBytes, 'G'));
  });
  EXPECT_TRUE(HasCode(ClientFor(server.address())->Fetch({"k"}, In(30)),
                      absl::StatusCode::kDataLoss, "magic"));
}

TEST(MalformedServerTest, HangUpMidValueIsUnavailable) {
  FakeServer server([](int fd) {
    ReadRequest(fd);
    std::string reply = OkHeader(1);
    internal::PutU64(&reply, 1000);
    reply += std::string(10, 'v');
    SendAll(fd, reply);
  });
  EXPECT_TRUE(
      HasCode(ClientFor(server.address())->Fetch({"k"}, In(30)), absl::StatusCode::kUnavailable));
}

TEST(MalformedServerTest, SilentServerHitsTheDeadline) {
  FakeServer server([](int fd) {
    ReadRequest(fd);
    char c;
    ::recv(fd, &c, 1, 0);  // says nothing until the client hangs up
  });
  EXPECT_TRUE(HasCode(ClientFor(server.address())->Fetch({"k"}, In(0.2)),
                      absl::StatusCode::kDeadlineExceeded));
}

// A raw TCP connection to a real server.
int Connect(const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Everything the server sends until it closes (or 10 s pass).
std::string ReadUntilClosed(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

class MalformedClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DataPlaneServerOptions o;
    o.io_timeout_seconds = 0.3;
    auto s = DataPlaneServer::Create(
        o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("value"); });
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  void ExpectStillServing() {
    auto v = ClientFor(server_->address())->Fetch({"k"}, In(30));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ((*v)[0], "value");
  }
  std::unique_ptr<DataPlaneServer> server_;
};

TEST_F(MalformedClientTest, GarbageGetsAnErrorResponseAndAHangUp) {
  const int fd = Connect(server_->address());
  SendAll(fd, std::string(internal::kRequestHeaderBytes, 'Z'));
  const std::string reply = ReadUntilClosed(fd);
  ::close(fd);
  ASSERT_GE(reply.size(), internal::kResponseHeaderBytes);
  auto h = internal::DecodeResponseHeader(reply.data());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(reply.find("magic"), std::string::npos);
  ExpectStillServing();
}

TEST_F(MalformedClientTest, BodyShorterThanItsKeysIsRefused) {
  // Claims one key of 100 bytes in a 10-byte body.
  std::string req = *internal::EncodeRequest({"0123456789"}, LinkClass::kFast, 0, 1 << 20);
  req[internal::kRequestHeaderBytes] = 100;
  const int fd = Connect(server_->address());
  SendAll(fd, req);
  char header[internal::kResponseHeaderBytes];
  ASSERT_EQ(::recv(fd, header, sizeof(header), MSG_WAITALL), static_cast<ssize_t>(sizeof(header)));
  ::close(fd);
  auto h = internal::DecodeResponseHeader(header);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  ExpectStillServing();
}

TEST_F(MalformedClientTest, StalledRequestIsDroppedAfterTheIoTimeout) {
  const int fd = Connect(server_->address());
  SendAll(fd, "VCDP");                            // a header that never completes
  const std::string reply = ReadUntilClosed(fd);  // the server hangs up (io_timeout 0.3 s)
  ::close(fd);
  EXPECT_TRUE(reply.empty());
  ExpectStillServing();
}

TEST(MalformedStageTest, ValueOverrunningTheBodyIsRefusedBeforeAllocating) {
  // A stage whose entry claims a 1 TiB value inside a 20-byte body: refused
  // with InvalidArgument, nothing staged, the connection kept in step.
  std::atomic<int> staged{0};
  auto server = DataPlaneServer::Create(
      DataPlaneServerOptions(),
      [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); },
      [&staged](uint64_t, const std::string&, std::string) {
        staged.fetch_add(1);
        return absl::OkStatus();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  std::string body = internal::EncodeStageEntryHead("key", uint64_t{1} << 40);
  body.append(20 - body.size() + 3, 'x');
  const std::string header =
      internal::EncodeStageHeader(7, LinkClass::kFast, 1, static_cast<uint32_t>(body.size()), 0);
  const int fd = Connect((*server)->address());
  SendAll(fd, header + body);
  char reply[internal::kResponseHeaderBytes];
  ASSERT_EQ(::recv(fd, reply, sizeof(reply), MSG_WAITALL), static_cast<ssize_t>(sizeof(reply)));
  auto h = internal::DecodeResponseHeader(reply);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  std::string message(h->message_bytes, '\0');
  ASSERT_EQ(::recv(fd, message.data(), message.size(), MSG_WAITALL),
            static_cast<ssize_t>(message.size()));
  EXPECT_NE(message.find("claims a value"), std::string::npos) << message;
  // Still in step: a fetch on the same connection is answered.
  SendAll(fd, *internal::EncodeRequest({"k"}, LinkClass::kFast, 0, 1 << 20));
  ASSERT_EQ(::recv(fd, reply, sizeof(reply), MSG_WAITALL), static_cast<ssize_t>(sizeof(reply)));
  h = internal::DecodeResponseHeader(reply);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->code, 0u);
  EXPECT_EQ(h->count, 1u);
  ::close(fd);
  EXPECT_EQ(staged.load(), 0);
}

TEST(MalformedStageTest, StalledUploadIsDroppedAfterTheIoTimeout) {
  // A stage with a 10-minute deadline whose body stops after 10 bytes: the
  // server hangs up once io_timeout passes without progress, not at the
  // deadline, and keeps serving.
  DataPlaneServerOptions o;
  o.io_timeout_seconds = 0.3;
  auto server = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); },
      [](uint64_t, const std::string&, std::string) { return absl::OkStatus(); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->address());
  SendAll(fd, internal::EncodeStageHeader(1, LinkClass::kFast, 1, 1000, 600'000) +
                  std::string(10, 'x'));
  pollfd p{fd, POLLIN, 0};
  ASSERT_GT(::poll(&p, 1, 30'000), 0) << "the server held a stalled upload";
  char c = 0;
  EXPECT_LE(::recv(fd, &c, 1, 0), 0);  // closed, no answer
  ::close(fd);
  auto v = ClientFor((*server)->address())->Fetch({"k"}, In(30));
  ASSERT_TRUE(v.ok()) << v.status();
}

TEST(ConnectionLimitTest, ANewConnectionPushesOutTheIdlest) {
  // max_connections = 1: a second client's connection closes the first's
  // idle one (a new worker is never locked out by idle ones); the first
  // client reconnects on its next call.
  DataPlaneServerOptions o;
  o.max_connections = 1;
  auto server = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); });
  ASSERT_TRUE(server.ok()) << server.status();
  auto first = ClientFor((*server)->address());
  ASSERT_TRUE(first->Fetch({"k"}, In(30)).ok());  // holds the one connection (pooled)
  auto second = ClientFor((*server)->address());
  // The first connection turns idle only once the server's worker has
  // finished with it, which may be just after the first client has its
  // answer; until then every established connection is busy and a new one
  // is refused. Once it is idle, the new connection must push it out.
  auto v = second->Fetch({"k"}, In(30));
  for (int attempt = 0; !v.ok() && attempt < 100; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = second->Fetch({"k"}, In(30));
  }
  EXPECT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*server)->established_connections(), 1);
  auto again = first->Fetch({"k"}, In(30));  // its pooled connection was closed: retried
  for (int attempt = 0; !again.ok() && attempt < 100; ++attempt) {  // the same race, reversed
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    again = first->Fetch({"k"}, In(30));
  }
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*server)->established_connections(), 1);
}

bool ClosedByPeer(int fd);

// A raw connection from `source` (a loopback address other than 127.0.0.1
// is another identity on a plaintext data plane: PeerInfo::Owner() is
// "addr:" + the source) that sends one fetch and reads its answer, so the
// server holds it established and idle.
int EstablishedFrom(const std::string& server, const char* source) {
  const size_t colon = server.rfind(':');
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(server.substr(colon + 1))));
  ::inet_pton(AF_INET, server.substr(0, colon).c_str(), &to.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  SendAll(fd, *internal::EncodeRequest({"k"}, LinkClass::kFast, 0, 1 << 20));
  char reply[internal::kResponseHeaderBytes];
  EXPECT_EQ(::recv(fd, reply, sizeof(reply), MSG_WAITALL), static_cast<ssize_t>(sizeof(reply)));
  return fd;  // the value's bytes stay unread: the server is done with them
}

TEST(ConnectionLimitTest, OneIdentityCannotTakeTheOthersPlaces) {
  // 4 places, at most 2 per identity: identity A (127.0.0.1) opening 4
  // connections keeps 2 (each new one closes A's idlest, not anyone
  // else's), and identity B (127.0.0.2) still gets its 2.
  DataPlaneServerOptions o;
  o.max_connections = 4;
  o.max_connections_per_identity = 2;
  o.idle_timeout_seconds = 600;
  auto server = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  std::vector<int> fds;
  // A connection turns idle a moment after its answer is sent (the worker
  // hands it back); until then a third one of A finds both of A's busy and
  // is refused. Wait for the server to count each one before the next.
  auto settle = [&](int want) {
    for (int i = 0; i < 500 && (*server)->established_connections() != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  for (int i = 0; i < 4; ++i) {
    fds.push_back(EstablishedFrom(address, "127.0.0.1"));
    settle(std::min(i + 1, 2));
  }
  EXPECT_EQ((*server)->established_connections(), 2) << "identity A holds more than its cap";
  // A's first two were closed by the server (A's own newer ones took them).
  EXPECT_TRUE(ClosedByPeer(fds[0]));
  EXPECT_TRUE(ClosedByPeer(fds[1]));
  for (int i = 0; i < 2; ++i) {
    fds.push_back(EstablishedFrom(address, "127.0.0.2"));
    settle(3 + i);
  }
  EXPECT_EQ((*server)->established_connections(), 4);
  for (int fd : fds) ::close(fd);
}

// Reads until the peer closes (or 10 s pass); true if it closed.
bool ClosedByPeer(int fd) {
  char buf[256];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
}

TEST(IdleConnectionTest, SilentConnectionIsDroppedAtTheHandshakeDeadline) {
  DataPlaneServerOptions o;
  o.handshake_timeout_seconds = 0.2;
  o.idle_timeout_seconds = 600;
  auto server = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->address());
  EXPECT_TRUE(ClosedByPeer(fd));  // never said a word: closed, not held for idle_timeout
  ::close(fd);
  EXPECT_EQ((*server)->pending_connections(), 0);
}

TEST(IdleConnectionTest, IdleConnectionIsClosedAfterTheIdleTimeout) {
  DataPlaneServerOptions o;
  o.idle_timeout_seconds = 0.2;
  auto server = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->address());
  SendAll(fd, *internal::EncodeRequest({"k"}, LinkClass::kFast, 0, 1 << 20));
  char reply[internal::kResponseHeaderBytes];
  ASSERT_EQ(::recv(fd, reply, sizeof(reply), MSG_WAITALL), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_TRUE(ClosedByPeer(fd));  // the value, then the idle close
  ::close(fd);
  EXPECT_EQ((*server)->established_connections(), 0);
  // A pooled client whose connection timed out reconnects transparently.
  auto client = ClientFor((*server)->address());
  ASSERT_TRUE(client->Fetch({"k"}, In(30)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto v = client->Fetch({"k"}, In(30));
  EXPECT_TRUE(v.ok()) << v.status();
}

TEST(IdleConnectionTest, PendingCapDropsTheOldestSilentConnectionFirst) {
  DataPlaneServerOptions o;
  o.max_pending_connections = 2;
  auto server = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int oldest = Connect((*server)->address());
  // Let the server accept them in order.
  auto accepted = [&](int n) {
    for (int i = 0; i < 500 && (*server)->pending_connections() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return (*server)->pending_connections();
  };
  ASSERT_EQ(accepted(1), 1);
  const int middle = Connect((*server)->address());
  ASSERT_EQ(accepted(2), 2);
  const int newest = Connect((*server)->address());
  EXPECT_TRUE(ClosedByPeer(oldest));
  // The two newer ones are still open: a request on either is answered.
  for (int fd : {middle, newest}) {
    SendAll(fd, *internal::EncodeRequest({"k"}, LinkClass::kFast, 0, 1 << 20));
    char reply[internal::kResponseHeaderBytes];
    ASSERT_EQ(::recv(fd, reply, sizeof(reply), MSG_WAITALL), static_cast<ssize_t>(sizeof(reply)));
    auto h = internal::DecodeResponseHeader(reply);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->code, 0u);
  }
  for (int fd : {oldest, middle, newest}) ::close(fd);
}

TEST(IdleConnectionTest, HundredsOfSilentSocketsDoNotBlockAFetch) {
  // One worker thread and 300 silent sockets: idle ones hold no thread, and
  // the pending cap keeps room for the worker's new connection.
  DataPlaneServerOptions o;
  o.worker_threads = 1;
  auto server = DataPlaneServer::Create(
      o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); });
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i) {
    const int fd = Connect((*server)->address());
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  auto v = ClientFor((*server)->address())->Fetch({"k"}, In(5));
  EXPECT_TRUE(v.ok()) << v.status();
  EXPECT_LE((*server)->pending_connections(), o.max_pending_connections);
  for (int fd : fds) ::close(fd);
}

TEST(StageAdmissionTest, RefusedFromTheHeaderBeforeAnyBodyByte) {
  // The sink refuses the put: the answer comes back although not one body
  // byte was sent (a body over the drain limit: then the server hangs up),
  // and no entry reaches the sink.
  struct Sink : StageSink {
    std::atomic<int> begun{0}, entries{0}, ended{0};
    PeerInfo seen;
    absl::Status Begin(const PeerInfo& peer, uint64_t put_id, uint64_t body_bytes) override {
      begun.fetch_add(1);
      seen = peer;
      return absl::NotFoundError(absl::StrCat("no open put ", put_id, " (", body_bytes, ")"));
    }
    absl::Status Entry(const PeerInfo&, uint64_t, const std::string&, std::string) override {
      entries.fetch_add(1);
      return absl::OkStatus();
    }
    void End(const PeerInfo&, uint64_t, uint64_t) override { ended.fetch_add(1); }
  };
  auto sink = std::make_shared<Sink>();
  auto server = DataPlaneServer::Create(
      DataPlaneServerOptions(),
      [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); }, sink);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->address());
  SendAll(fd, internal::EncodeStageHeader(42, LinkClass::kFast, 1, (uint32_t{1} << 30) - 64, 0));
  char reply[internal::kResponseHeaderBytes];
  ASSERT_EQ(::recv(fd, reply, sizeof(reply), MSG_WAITALL), static_cast<ssize_t>(sizeof(reply)));
  auto h = internal::DecodeResponseHeader(reply);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->code, static_cast<uint32_t>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);
  EXPECT_EQ(sink->begun.load(), 1);
  EXPECT_EQ(sink->entries.load(), 0);
  EXPECT_EQ(sink->ended.load(), 0);
  EXPECT_EQ(sink->seen.address, "127.0.0.1");
  EXPECT_EQ(sink->seen.Owner(), "addr:127.0.0.1");
}

TEST(StageAdmissionTest, AdmittedStageEndsWithTheUnusedBytes) {
  struct Sink : StageSink {
    std::atomic<uint64_t> unused{~uint64_t{0}};
    std::atomic<int> entries{0};
    absl::Status Begin(const PeerInfo&, uint64_t, uint64_t) override { return absl::OkStatus(); }
    absl::Status Entry(const PeerInfo&, uint64_t, const std::string&, std::string v) override {
      entries.fetch_add(v == "value" ? 1 : 100);
      return absl::OkStatus();
    }
    void End(const PeerInfo&, uint64_t, uint64_t unused_bytes) override {
      unused.store(unused_bytes);
    }
  };
  auto sink = std::make_shared<Sink>();
  auto server = DataPlaneServer::Create(
      DataPlaneServerOptions(),
      [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); }, sink);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ClientFor((*server)->address());
  ASSERT_TRUE(client->Stage(1, {{"key", "value"}}, In(30)).ok());
  EXPECT_EQ(sink->entries.load(), 1);
  EXPECT_EQ(sink->unused.load(), internal::kStageEntryFramingBytes + 3);  // the framing
}

}  // namespace
}  // namespace vc::transport
