// Mutual TLS on the tcp data plane: who gets in (a client of the cluster CA)
// and who does not (plaintext, no certificate, another CA's certificate) —
// refused before the server reads any request byte, so the stage sink never
// hears of them; the identity the sink sees; certificate reload on mtime;
// and a silent TLS peer holds no worker.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <csignal>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/transport/data_plane.h"
#include "gtest/gtest.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport {
namespace {

using testing::In;
using testing::RandomBytes;

// Records every call the server makes into it, and the peers it saw.
class RecordingSink : public StageSink {
 public:
  absl::Status Begin(const PeerInfo& peer, uint64_t, uint64_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++begins_;
    owners_.push_back(peer.Owner());
    return absl::OkStatus();
  }
  absl::Status Entry(const PeerInfo&, uint64_t, const std::string& key,
                     std::string value) override {
    std::lock_guard<std::mutex> lock(mu_);
    staged_.emplace_back(key, std::move(value));
    return absl::OkStatus();
  }
  void End(const PeerInfo&, uint64_t, uint64_t) override {}

  int begins() {
    std::lock_guard<std::mutex> lock(mu_);
    return begins_;
  }
  std::vector<std::string> owners() {
    std::lock_guard<std::mutex> lock(mu_);
    return owners_;
  }
  std::vector<std::pair<std::string, std::string>> staged() {
    std::lock_guard<std::mutex> lock(mu_);
    return staged_;
  }

 private:
  std::mutex mu_;
  int begins_ = 0;
  std::vector<std::string> owners_;
  std::vector<std::pair<std::string, std::string>> staged_;
};

class DataPlaneTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_.path();
    ca_.WriteCa(dir_ + "/ca.crt");
    server_files_ = ca_.Leaf(dir_, "vc-kvstore", dir_ + "/ca.crt");
    client_files_ = ca_.Leaf(dir_, "vc-verifier-0", dir_ + "/ca.crt");
  }
  void TearDown() override { server_.reset(); }

  void StartServer() {
    DataPlaneServerOptions o;
    o.tls = server_files_;
    o.worker_threads = 2;
    auto s = DataPlaneServer::Create(
        o,
        [](const std::string& key) -> absl::StatusOr<std::string> {
          if (key == "k") return std::string("value-of-k");
          return absl::NotFoundError("not in the test table");
        },
        sink_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  std::unique_ptr<DataPlaneClient> Client(const DataPlaneTlsOptions& tls) {
    DataPlaneClientOptions o;
    o.server_address = server_->address();
    o.tls = tls;
    auto c = DataPlaneClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // A stage and a fetch from `client` must both fail, and the sink never
  // sees a Begin (nothing of a request was read).
  void ExpectRefused(DataPlaneClient* client) {
    ASSERT_NE(client, nullptr);
    std::vector<std::pair<std::string, std::string>> entries = {{"x", "y"}};
    EXPECT_FALSE(client->Stage(7, entries, In(5)).ok());
    EXPECT_FALSE(client->Fetch({"k"}, In(5)).ok());
    EXPECT_EQ(sink_->begins(), 0);
    EXPECT_TRUE(sink_->staged().empty());
  }

  test_support::ScratchDir scratch_{"vc_dp_tls_test_"};
  std::string dir_;
  testing::TestCa ca_{"vc-cluster-ca"};
  DataPlaneTlsOptions server_files_, client_files_;
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
  std::unique_ptr<DataPlaneServer> server_;
};

TEST_F(DataPlaneTlsTest, FetchAndStageRoundTripWithTheClientCertIdentity) {
  StartServer();
  auto client = Client(client_files_);
  ASSERT_NE(client, nullptr);
  const std::string big = RandomBytes(3 << 20, 11);  // many TLS records
  std::vector<std::pair<std::string, std::string>> entries = {{"a", big}, {"b", "small"}};
  ASSERT_TRUE(client->Stage(42, entries, In(30)).ok());
  auto staged = sink_->staged();
  ASSERT_EQ(staged.size(), 2u);
  EXPECT_EQ(staged[0].second, big);
  EXPECT_EQ(staged[1].second, "small");
  ASSERT_EQ(sink_->owners().size(), 1u);
  EXPECT_EQ(sink_->owners()[0], "cert:vc-verifier-0");
  auto values = client->Fetch({"k", "k"}, In(30));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ((*values)[0], "value-of-k");
  EXPECT_EQ((*values)[1], "value-of-k");
  EXPECT_EQ(server_->established_connections(), 1);
}

TEST_F(DataPlaneTlsTest, PlaintextClientIsRefusedBeforeAnyRequestIsRead) {
  StartServer();
  auto client = Client(DataPlaneTlsOptions{});
  ExpectRefused(client.get());
  EXPECT_EQ(server_->established_connections(), 0);
}

TEST_F(DataPlaneTlsTest, ClientOfAnotherCaIsRefused) {
  StartServer();
  testing::TestCa other("vc-other-ca");
  other.WriteCa(dir_ + "/other-ca.crt");
  // Its own certificate chains to the other CA; it trusts the real one, so
  // only the server's check can refuse it.
  DataPlaneTlsOptions foreign = other.Leaf(dir_, "intruder", dir_ + "/ca.crt");
  auto client = Client(foreign);
  ExpectRefused(client.get());
  EXPECT_EQ(server_->established_connections(), 0);
}

TEST_F(DataPlaneTlsTest, ClientWithoutACertificateIsRefused) {
  StartServer();
  // A raw TLS client that presents no certificate (the data plane client
  // always does), trusting the cluster CA.
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(SSL_CTX_load_verify_locations(ctx, (dir_ + "/ca.crt").c_str(), nullptr), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(
      std::stoi(server_->address().substr(server_->address().rfind(':') + 1))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  // This raw client writes through OpenSSL's own socket BIO (write()); the
  // server may already have closed, and a SIGPIPE must not end the test.
  ::signal(SIGPIPE, SIG_IGN);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  // TLS 1.3: the client finishes its side before the server judges it.
  EXPECT_EQ(SSL_connect(ssl), 1);
  // A whole stage header: were it read, the sink would see a Begin.
  std::string junk(64, '\0');
  (void)SSL_write(ssl, junk.data(), static_cast<int>(junk.size()));
  char buf[64];
  EXPECT_LE(SSL_read(ssl, buf, sizeof(buf)), 0);  // an alert, then the close
  SSL_free(ssl);
  ::close(fd);
  SSL_CTX_free(ctx);
  EXPECT_EQ(sink_->begins(), 0);
  EXPECT_EQ(server_->established_connections(), 0);
}

TEST_F(DataPlaneTlsTest, ServerNotOfTheClientsCaIsRefusedByTheClient) {
  testing::TestCa other("vc-other-ca");
  other.WriteCa(dir_ + "/other-ca.crt");
  server_files_ = other.Leaf(dir_, "fake-store", dir_ + "/other-ca.crt");
  StartServer();
  auto client = Client(client_files_);
  ASSERT_NE(client, nullptr);
  auto values = client->Fetch({"k"}, In(5));
  ASSERT_FALSE(values.ok());
  EXPECT_NE(values.status().message().find("certificate"), std::string::npos)
      << values.status();
}

TEST_F(DataPlaneTlsTest, SilentTlsPeersHoldNoWorker) {
  // Two workers, and more silent TCP peers than that mid-handshake (they
  // connect and send nothing, or half a ClientHello): a real client's
  // fetch still goes through at once.
  StartServer();
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(
        std::stoi(server_->address().substr(server_->address().rfind(':') + 1))));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const char partial[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01};  // a record header, a byte
    if (i % 2 == 0) (void)!::send(fd, partial, sizeof(partial), 0);
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto client = Client(client_files_);
  ASSERT_NE(client, nullptr);
  const auto start = testing::Clock::now();
  auto values = client->Fetch({"k"}, In(10));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_LT(testing::SecondsSince(start), 1.5);  // not behind a 2 s handshake deadline
  for (int fd : fds) ::close(fd);
}

TEST_F(DataPlaneTlsTest, RotatedCertificatesApplyToNewConnections) {
  StartServer();
  // The client trusts only a new CA at first: the server's old certificate
  // is refused.
  testing::TestCa next("vc-cluster-ca-2");
  const std::string next_ca = dir_ + "/ca2.crt";
  next.WriteCa(next_ca);
  DataPlaneTlsOptions client2 = next.Leaf(dir_, "vc-verifier-1", next_ca);
  EXPECT_FALSE(Client(client2)->Fetch({"k"}, In(5)).ok());
  // Rotate the server's three files in place (new mtimes) to the new CA.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  DataPlaneTlsOptions server2 = next.Leaf(dir_, "vc-kvstore-2", next_ca);
  std::filesystem::copy_file(server2.cert_file, server_files_.cert_file,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(server2.key_file, server_files_.key_file,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(next_ca, server_files_.ca_file,
                             std::filesystem::copy_options::overwrite_existing);
  auto values = Client(client2)->Fetch({"k"}, In(5));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ((*values)[0], "value-of-k");
  // And a client of the old CA is now refused.
  EXPECT_FALSE(Client(client_files_)->Fetch({"k"}, In(5)).ok());
}

TEST_F(DataPlaneTlsTest, HalfTlsOptionsAreInvalidArgumentAndABadKeyUnavailable) {
  DataPlaneServerOptions o;
  o.tls.cert_file = server_files_.cert_file;
  EXPECT_TRUE(testing::HasCode(DataPlaneServer::Create(o, testing::MapLookup(nullptr)),
                               absl::StatusCode::kInvalidArgument, "all three"));
  DataPlaneServerOptions bad;
  bad.tls = server_files_;
  bad.tls.key_file = client_files_.key_file;  // not the certificate's key
  EXPECT_TRUE(testing::HasCode(DataPlaneServer::Create(bad, testing::MapLookup(nullptr)),
                               absl::StatusCode::kUnavailable, "key"));
}

}  // namespace
}  // namespace vc::transport
