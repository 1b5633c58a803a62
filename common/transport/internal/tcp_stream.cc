// The "tcp" backend: non-blocking sockets, every wait a poll() bounded by the
// caller's deadline (and by 100 ms slices, so Close() is noticed even where
// shutdown() does not wake a poll).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/transport/internal/backends.h"

namespace vc::transport::internal {
namespace {

constexpr int kPollSliceMs = 100;

// Socket errors all mean the peer (or the path to it) is gone: Unavailable.
absl::Status ErrnoStatus(const std::string& what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

// Milliseconds to wait in one poll: up to the deadline, at most one slice.
int PollTimeoutMs(TimePoint deadline) {
  if (deadline == kNoDeadline) return kPollSliceMs;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, kPollSliceMs));
}

class TcpStream : public ByteStream {
 public:
  explicit TcpStream(int fd) : fd_(fd) {}
  ~TcpStream() override { ::close(fd_); }

  absl::StatusOr<size_t> ReadSome(char* buf, size_t max, TimePoint deadline) override {
    while (true) {
      if (closed_.load()) return absl::UnavailableError("data plane connection closed");
      const ssize_t n = ::recv(fd_, buf, max, 0);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) return absl::UnavailableError("data plane peer closed the connection");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus("data plane recv", errno);
      if (absl::Status s = Wait(POLLIN, deadline); !s.ok()) return s;
    }
  }

  absl::Status Write(std::string data, TimePoint deadline) override {
    size_t done = 0;
    while (done < data.size()) {
      if (closed_.load()) return absl::UnavailableError("data plane connection closed");
      const ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        CountSent(static_cast<size_t>(n));  // what the kernel took
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        return ErrnoStatus("data plane send", errno);
      }
      if (absl::Status s = Wait(POLLOUT, deadline); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  void Close() override {
    if (!closed_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
  }

  int ReadinessFd() const override { return fd_; }

  std::string PeerAddress() const override {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text)) == nullptr) return "";
    return text;
  }

 private:
  // Waits for `events` within the deadline; an error Status or OK to retry.
  absl::Status Wait(short events, TimePoint deadline) {
    while (true) {
      if (closed_.load()) return absl::UnavailableError("data plane connection closed");
      if (deadline != kNoDeadline && Clock::now() >= deadline) {
        return absl::DeadlineExceededError("data plane transfer passed its deadline");
      }
      pollfd p{fd_, events, 0};
      const int rc = ::poll(&p, 1, PollTimeoutMs(deadline));
      if (rc > 0) return absl::OkStatus();  // ready, or an error the next call reports
      if (rc < 0 && errno != EINTR) return ErrnoStatus("data plane poll", errno);
    }
  }

  const int fd_;
  std::atomic<bool> closed_{false};
};

// No Nagle delay; TCP keepalive so a peer that vanished without a FIN (a
// dead host, a dropped path) is noticed in about a minute even on a
// connection nobody writes to.
void ConfigureSocket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle_s = 30, interval_s = 10, probes = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

class TcpListener : public Listener {
 public:
  TcpListener(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  ~TcpListener() override { ::close(fd_); }

  absl::StatusOr<std::unique_ptr<ByteStream>> Accept(std::chrono::milliseconds wait) override {
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(wait.count()));
    if (rc <= 0) return std::unique_ptr<ByteStream>();
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return std::unique_ptr<ByteStream>();  // e.g. the peer gave up already
    ConfigureSocket(fd);
    return std::unique_ptr<ByteStream>(new TcpStream(fd));
  }

  std::string address() const override { return address_; }

 private:
  const int fd_;
  const std::string address_;
};

class TcpConnector : public Connector {
 public:
  TcpConnector(sockaddr_in addr, std::string address) : addr_(addr), address_(std::move(address)) {}

  absl::StatusOr<std::unique_ptr<ByteStream>> Connect(TimePoint deadline) override {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoStatus("data plane socket", errno);
    auto stream = std::make_unique<TcpStream>(fd);  // owns fd from here on
    ConfigureSocket(fd);
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr_), sizeof(addr_));
    if (rc < 0 && errno != EINPROGRESS) {
      return ErrnoStatus(absl::StrCat("data plane connect to ", address_), errno);
    }
    if (rc < 0) {
      while (true) {
        if (Clock::now() >= deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("data plane connect to ", address_, " passed its deadline"));
        }
        pollfd p{fd, POLLOUT, 0};
        rc = ::poll(&p, 1, PollTimeoutMs(deadline));
        if (rc > 0) break;
        if (rc < 0 && errno != EINTR) return ErrnoStatus("data plane poll", errno);
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return ErrnoStatus(absl::StrCat("data plane connect to ", address_), err);
    }
    return std::unique_ptr<ByteStream>(std::move(stream));
  }

 private:
  const sockaddr_in addr_;
  const std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> MakeTcpListener(const DataPlaneServerOptions& options) {
  auto hp = ParseHostPort(options.listen);
  if (!hp.ok()) return hp.status();
  auto addr = ResolveIpv4(*hp);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("data plane socket", errno);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) < 0 ||
      ::listen(fd, 512) < 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("data plane cannot listen on ", options.listen, ": ", std::strerror(err)));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  return std::unique_ptr<Listener>(
      new TcpListener(fd, absl::StrCat(hp->host, ":", ntohs(bound.sin_port))));
}

absl::StatusOr<std::unique_ptr<Connector>> MakeTcpConnector(const DataPlaneClientOptions& options) {
  auto hp = ParseHostPort(options.server_address);
  if (!hp.ok()) return hp.status();
  auto addr = ResolveIpv4(*hp);
  if (!addr.ok()) return addr.status();
  return std::unique_ptr<Connector>(new TcpConnector(*addr, options.server_address));
}

}  // namespace vc::transport::internal
