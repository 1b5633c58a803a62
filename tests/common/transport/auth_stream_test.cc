// The UCX data plane's authentication (internal/auth_stream.h): over the
// real UCX backend, a round trip with the certificate identity, and
// refusals (a client without authentication, one of another CA) before the
// server reads a request; over an in-memory pipe, a flipped bit, a replayed
// message and a dropped one each fail the stream.
#include "common/transport/internal/auth_stream.h"

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport {
namespace {

using internal::ByteStream;
using testing::In;

// One direction of an in-memory connection.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::string bytes;
  bool closed = false;
};

// An in-memory ByteStream end; `tap` may rewrite every write (the MITM).
class PipeEnd : public ByteStream {
 public:
  PipeEnd(std::shared_ptr<Channel> in, std::shared_ptr<Channel> out) : in_(in), out_(out) {}
  absl::StatusOr<size_t> ReadSome(char* buf, size_t max, internal::TimePoint deadline) override {
    std::unique_lock<std::mutex> lock(in_->mu);
    if (!in_->cv.wait_until(lock, deadline, [&] { return !in_->bytes.empty() || in_->closed; })) {
      return absl::DeadlineExceededError("pipe");
    }
    if (in_->bytes.empty()) return absl::UnavailableError("pipe closed");
    const size_t n = std::min(max, in_->bytes.size());
    in_->bytes.copy(buf, n);
    in_->bytes.erase(0, n);
    return n;
  }
  absl::Status Write(std::string data, internal::TimePoint) override {
    if (tap) data = tap(std::move(data));
    std::lock_guard<std::mutex> lock(out_->mu);
    if (out_->closed) return absl::UnavailableError("pipe closed");
    out_->bytes += data;
    out_->cv.notify_all();
    return absl::OkStatus();
  }
  void Close() override {
    for (auto* c : {in_.get(), out_.get()}) {
      std::lock_guard<std::mutex> lock(c->mu);
      c->closed = true;
      c->cv.notify_all();
    }
  }
  std::function<std::string(std::string)> tap;

 private:
  std::shared_ptr<Channel> in_, out_;
};

class AuthStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_.path();
    ca_.WriteCa(dir_ + "/ca.crt");
    server_files_ = ca_.Leaf(dir_, "vc-kvstore", dir_ + "/ca.crt");
    client_files_ = ca_.Leaf(dir_, "vc-drafter-0", dir_ + "/ca.crt");
  }
  // Connected client and server ends over a pipe, handshake done.
  void Connect() {
    auto a = std::make_shared<Channel>(), b = std::make_shared<Channel>();
    auto client_end = std::make_unique<PipeEnd>(a, b);
    client_pipe_ = client_end.get();
    server_ = internal::AuthServerStream(std::make_unique<PipeEnd>(b, a), server_files_);
    // The server handshakes on its first read; run it alongside.
    std::thread server_side([&] {
      char c;
      server_first_ = server_->ReadSome(&c, 1, In(5));
      if (server_first_.ok()) first_byte_ = c;
    });
    auto client = internal::AuthClientStream(std::move(client_end), client_files_, In(5));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    ASSERT_TRUE(client_->Write("hello", In(5)).ok());
    server_side.join();
    ASSERT_TRUE(server_first_.ok()) << server_first_.status();
    EXPECT_EQ(first_byte_, 'h');
    EXPECT_EQ(server_->PeerIdentity(), "cert:vc-drafter-0");
    EXPECT_EQ(client_->PeerIdentity(), "cert:vc-kvstore");
    char rest[4];
    ASSERT_TRUE(server_->ReadSome(rest, 4, In(5)).ok());
  }

  test_support::ScratchDir scratch_{"vc_dp_auth_test_"};
  std::string dir_;
  testing::TestCa ca_{"vc-cluster-ca"};
  DataPlaneTlsOptions server_files_, client_files_;
  PipeEnd* client_pipe_ = nullptr;
  std::unique_ptr<ByteStream> client_, server_;
  absl::StatusOr<size_t> server_first_ = 0;
  char first_byte_ = 0;
};

TEST_F(AuthStreamTest, MessagesRoundTripBothWays) {
  Connect();
  const std::string big = testing::RandomBytes(3 << 20, 5);  // several messages
  ASSERT_TRUE(client_->Write(big, In(5)).ok());
  std::string got(big.size(), '\0');
  size_t at = 0;
  while (at < got.size()) {
    auto n = server_->ReadSome(got.data() + at, got.size() - at, In(5));
    ASSERT_TRUE(n.ok()) << n.status();
    at += *n;
  }
  EXPECT_EQ(got, big);
  ASSERT_TRUE(server_->Write("back", In(5)).ok());
  char back[4];
  auto n = client_->ReadSome(back, 4, In(5));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(std::string(back, *n), "back");
}

TEST_F(AuthStreamTest, AFlippedBitFailsTheMac) {
  Connect();
  client_pipe_->tap = [](std::string d) {
    d[d.size() / 2] ^= 1;
    return d;
  };
  ASSERT_TRUE(client_->Write("payload-bytes", In(5)).ok());
  char buf[32];
  auto n = server_->ReadSome(buf, sizeof(buf), In(5));
  EXPECT_TRUE(testing::HasCode(n, absl::StatusCode::kUnavailable, "MAC"));
}

TEST_F(AuthStreamTest, AReplayedMessageIsRefused) {
  Connect();
  std::string last;
  client_pipe_->tap = [&](std::string d) {
    last = d;
    return d;
  };
  ASSERT_TRUE(client_->Write("once", In(5)).ok());
  char buf[32];
  ASSERT_TRUE(server_->ReadSome(buf, sizeof(buf), In(5)).ok());
  client_pipe_->tap = [&](std::string) { return last; };  // the old message again
  ASSERT_TRUE(client_->Write("twice", In(5)).ok());
  EXPECT_TRUE(testing::HasCode(server_->ReadSome(buf, sizeof(buf), In(5)),
                               absl::StatusCode::kUnavailable, "sequence"));
}

TEST_F(AuthStreamTest, ADroppedMessageIsNoticed) {
  Connect();
  client_pipe_->tap = [](std::string) { return std::string(); };
  ASSERT_TRUE(client_->Write("lost", In(5)).ok());
  client_pipe_->tap = nullptr;
  ASSERT_TRUE(client_->Write("next", In(5)).ok());
  char buf[32];
  EXPECT_TRUE(testing::HasCode(server_->ReadSome(buf, sizeof(buf), In(5)),
                               absl::StatusCode::kUnavailable, "sequence"));
}

// Over the real UCX backend.
class UcxAuthTest : public AuthStreamTest {
 protected:
  void SetUp() override {
    AuthStreamTest::SetUp();
    const std::string reason = testing::UcxUnavailableReason();
    if (!reason.empty()) GTEST_SKIP() << "UCX cannot create a context here: " << reason;
  }
  struct Sink : StageSink {
    std::mutex mu;
    int begins = 0;
    std::vector<std::string> owners;
    absl::Status Begin(const PeerInfo& peer, uint64_t, uint64_t) override {
      std::lock_guard<std::mutex> lock(mu);
      ++begins;
      owners.push_back(peer.Owner());
      return absl::OkStatus();
    }
    absl::Status Entry(const PeerInfo&, uint64_t, const std::string&, std::string) override {
      return absl::OkStatus();
    }
    void End(const PeerInfo&, uint64_t, uint64_t) override {}
  };
  void StartServer() {
    DataPlaneServerOptions o;
    o.kind = "ucx";
    o.tls = server_files_;
    auto s = DataPlaneServer::Create(
        o, [](const std::string&) -> absl::StatusOr<std::string> { return std::string("v"); },
        sink_);
    ASSERT_TRUE(s.ok()) << s.status();
    dp_server_ = std::move(*s);
  }
  absl::Status StageFrom(const DataPlaneTlsOptions& tls) {
    DataPlaneClientOptions o;
    o.kind = "ucx";
    o.server_address = dp_server_->address();
    o.tls = tls;
    auto c = DataPlaneClient::Create(o);
    if (!c.ok()) return c.status();
    std::vector<std::pair<std::string, std::string>> e = {{"k", "v"}};
    if (absl::Status s = (*c)->Stage(1, e, In(5)); !s.ok()) return s;
    auto v = (*c)->Fetch({"k"}, In(5));
    return v.status();
  }
  std::shared_ptr<Sink> sink_ = std::make_shared<Sink>();
  std::unique_ptr<DataPlaneServer> dp_server_;
};

TEST_F(UcxAuthTest, AuthenticatedRoundTripCarriesTheIdentity) {
  StartServer();
  ASSERT_TRUE(StageFrom(client_files_).ok());
  std::lock_guard<std::mutex> lock(sink_->mu);
  ASSERT_EQ(sink_->owners.size(), 1u);
  EXPECT_EQ(sink_->owners[0], "cert:vc-drafter-0");
}

TEST_F(UcxAuthTest, UnauthenticatedAndForeignClientsAreRefused) {
  StartServer();
  EXPECT_FALSE(StageFrom(DataPlaneTlsOptions{}).ok());
  testing::TestCa other("vc-other-ca");
  EXPECT_FALSE(StageFrom(other.Leaf(dir_, "intruder", dir_ + "/ca.crt")).ok());
  std::lock_guard<std::mutex> lock(sink_->mu);
  EXPECT_EQ(sink_->begins, 0);
}

}  // namespace
}  // namespace vc::transport
