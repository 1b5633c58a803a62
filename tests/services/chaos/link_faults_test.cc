// LinkFaults against the kernel: a cut drops the target's packets and only
// the target's, a throttle slows it, Clear() restores it, and all of it
// happens in a network namespace of the test's own (not the host's). Needs
// root, ip and tc; skipped otherwise.
#include "services/chaos/internal/link_faults.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace vc::chaos::internal {
namespace {

using Clock = std::chrono::steady_clock;

bool CanShape() {
  if (geteuid() != 0) return false;
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    if (access((std::string(dir) + "tc").c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string NetNs() { return std::filesystem::read_symlink("/proc/self/ns/net").string(); }

// A TCP echo server on 127.0.0.1 (ephemeral port), one thread per server.
class Echo {
 public:
  Echo() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      ADD_FAILURE() << "bind: " << errno;
    listen(listen_fd_, 4);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      const int c = accept(listen_fd_, nullptr, nullptr);
      if (c < 0) return;
      timeval tv{60, 0};  // bounded: a peer whose FIN was cut still ends it
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      char buf[65536];
      while (true) {
        // EINTR is not an end: the SIGCHLD of each `tc` LinkFaults runs
        // interrupts a receive with a timeout (SO_RCVTIMEO), and the echo
        // once closed its connection there mid-test.
        const ssize_t n = recv(c, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (ssize_t off = 0; off < n;) {
          const ssize_t w = send(c, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) break;
          off += w;
        }
      }
      close(c);
    });
  }
  ~Echo() {
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }
  // Sends `n` bytes and reads them back; false if they are not all back
  // within `timeout`.
  bool RoundTrip(size_t n, std::chrono::seconds timeout) {
    const std::string out(n, 'x');
    std::thread writer([&] {
      for (size_t off = 0; off < out.size();) {
        const ssize_t w = send(fd_, out.data() + off, out.size() - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        off += static_cast<size_t>(w);
      }
    });
    size_t got = 0;
    const auto deadline = Clock::now() + timeout;
    char buf[65536];
    while (got < n && Clock::now() < deadline) {
      timeval tv{0, 100000};
      setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      const ssize_t r = recv(fd_, buf, sizeof(buf), 0);
      if (r > 0) got += static_cast<size_t>(r);
      if (r == 0) break;
    }
    if (got < n) shutdown(fd_, SHUT_RDWR);  // unblocks the writer
    writer.join();
    return got == n;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

TEST(LinkFaultsTest, CutsAndThrottlesOnlyTheTargetInANamespaceOfItsOwn) {
  if (!CanShape()) GTEST_SKIP() << "needs root and tc";
  const std::string host_ns = NetNs();
  absl::StatusOr<std::unique_ptr<LinkFaults>> links = LinkFaults::Enter();
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_NE(NetNs(), host_ns);  // the host's loopback is not the one shaped

  Echo target, bystander;
  {
    Client t(target.port()), b(bystander.port());
    ASSERT_TRUE(t.connected() && b.connected());
    ASSERT_TRUE(t.RoundTrip(1000, std::chrono::seconds(30)));
    ASSERT_TRUE((*links)->Cut({target.port()}).ok());
    EXPECT_FALSE(t.RoundTrip(1000, std::chrono::seconds(2)));    // dropped
    EXPECT_TRUE(b.RoundTrip(100000, std::chrono::seconds(30)));  // untouched
    ASSERT_TRUE((*links)->Clear().ok());
  }
  Echo target2;
  {
    Client t(target2.port());
    ASSERT_TRUE(t.connected());
    EXPECT_TRUE(t.RoundTrip(1000, std::chrono::seconds(30)));  // after Clear
    // 256 KB each way at 1 Mbit/s takes at least 2 s however idle the host;
    // unshaped it takes milliseconds.
    ASSERT_TRUE((*links)->Throttle({target2.port()}, "1mbit").ok());
    const auto start = Clock::now();
    EXPECT_TRUE(t.RoundTrip(size_t{256} * 1024, std::chrono::seconds(120)));
    EXPECT_GE(Clock::now() - start, std::chrono::seconds(2));
    ASSERT_TRUE((*links)->Clear().ok());
  }
}

TEST(LinkFaultsTest, RefusesOnceThreadsRun) {
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const std::string before = NetNs();
  absl::StatusOr<std::unique_ptr<LinkFaults>> links = LinkFaults::Enter();
  stop.store(true);
  other.join();
  ASSERT_FALSE(links.ok());
  EXPECT_EQ(links.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(links.status().message().find(geteuid() == 0 ? "thread" : "root"), std::string::npos)
      << links.status();
  EXPECT_EQ(NetNs(), before);
}

}  // namespace
}  // namespace vc::chaos::internal
