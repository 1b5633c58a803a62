// The "tcp" backend: non-blocking sockets, every wait a poll() bounded by the
// caller's deadline (and by 100 ms slices, so Close() is noticed even where
// shutdown() does not wake a poll). With DataPlaneTlsOptions the same socket
// carries OpenSSL TLS 1.3 (mutual); the server's handshake is advanced one
// non-blocking step per readiness event (ContinueHandshake), the client's
// within its connect deadline.
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

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"
#include "common/transport/internal/backends.h"
#include "common/transport/internal/tls.h"

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
  ~TcpStream() override {
    if (ssl_ != nullptr) SSL_free(ssl_);
    ::close(fd_);
  }

  // Puts TLS on the socket (before any byte moves). `server`: accept side.
  absl::Status StartTls(SSL_CTX* ctx, bool server) {
    ERR_clear_error();
    ssl_ = SSL_new(ctx);
    BIO* bio = ssl_ != nullptr ? NewSocketBio(fd_) : nullptr;
    if (bio == nullptr) return absl::UnavailableError("data plane TLS: " + TakeTlsErrors());
    SSL_set_bio(ssl_, bio, bio);  // ssl_ owns it
    if (server) {
      SSL_set_accept_state(ssl_);
    } else {
      SSL_set_connect_state(ssl_);
    }
    handshake_pending_ = true;
    return absl::OkStatus();
  }

  // Client side: names the server the certificate must be for (its IP
  // address or DNS name, as in server_address).
  void ExpectServer(const std::string& host) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl_);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1) {
      ERR_clear_error();
      SSL_set_hostflags(ssl_, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      SSL_set1_host(ssl_, host.c_str());
    }
  }

  // Client side: the whole handshake, within the deadline.
  absl::Status ClientHandshake(TimePoint deadline) {
    while (true) {
      ERR_clear_error();
      const int rc = SSL_do_handshake(ssl_);
      if (rc == 1) break;
      const int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        if (absl::Status s = Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
            !s.ok()) {
          return s;
        }
        continue;
      }
      return absl::UnavailableError(absl::StrCat("data plane TLS handshake failed: ",
                                                 VerifyProblem(), TakeTlsErrors()));
    }
    handshake_pending_ = false;
    identity_ = TlsPeerIdentity(ssl_);
    return absl::OkStatus();
  }

  Handshake ContinueHandshake() override {
    if (!handshake_pending_) return Handshake::kDone;
    // A handshake message larger than the socket buffer may need a short
    // wait for room; never for the peer's bytes (that goes back to epoll).
    const TimePoint write_room = DeadlineAfter(0.2);
    while (true) {
      if (closed_.load()) return Handshake::kFailed;
      ERR_clear_error();
      const int rc = SSL_do_handshake(ssl_);
      if (rc == 1) break;
      const int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ) return Handshake::kWantRead;
      if (err == SSL_ERROR_WANT_WRITE && Wait(POLLOUT, write_room).ok()) continue;
      ERR_clear_error();
      return Handshake::kFailed;
    }
    handshake_pending_ = false;
    identity_ = TlsPeerIdentity(ssl_);
    return Handshake::kDone;
  }

  std::string PeerIdentity() const override { return identity_; }

  bool HasBufferedBytes() const override { return ssl_ != nullptr && SSL_has_pending(ssl_) == 1; }

  absl::StatusOr<size_t> ReadSome(char* buf, size_t max, TimePoint deadline) override {
    if (ssl_ != nullptr) return TlsReadSome(buf, max, deadline);
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
    if (ssl_ != nullptr) return TlsWrite(data, deadline);
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
  std::string VerifyProblem() const {
    const long v = SSL_get_verify_result(ssl_);
    if (v == X509_V_OK) return "";
    return absl::StrCat("certificate: ", X509_verify_cert_error_string(v), "; ");
  }

  // A TLS failure on an established stream: the peer is gone or refused us.
  absl::Status TlsFailure(const char* what, int err) {
    if (err == SSL_ERROR_ZERO_RETURN) {
      return absl::UnavailableError("data plane peer closed the connection");
    }
    if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
      return absl::UnavailableError(
          absl::StrCat("data plane peer closed the connection (", what, ")"));
    }
    return absl::UnavailableError(absl::StrCat("data plane TLS ", what, ": ", TakeTlsErrors()));
  }

  absl::StatusOr<size_t> TlsReadSome(char* buf, size_t max, TimePoint deadline) {
    while (true) {
      if (closed_.load()) return absl::UnavailableError("data plane connection closed");
      ERR_clear_error();
      size_t n = 0;
      const int rc = SSL_read_ex(ssl_, buf, max, &n);
      if (rc == 1) return n;
      const int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        if (absl::Status s = Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
            !s.ok()) {
          return s;
        }
        continue;
      }
      return TlsFailure("read", err);
    }
  }

  // Counts the plaintext bytes TLS accepted (what the caller handed over).
  absl::Status TlsWrite(const std::string& data, TimePoint deadline) {
    size_t done = 0;
    while (done < data.size()) {
      if (closed_.load()) return absl::UnavailableError("data plane connection closed");
      ERR_clear_error();
      size_t n = 0;
      const int rc = SSL_write_ex(ssl_, data.data() + done, data.size() - done, &n);
      if (rc == 1) {
        done += n;
        CountSent(n);
        continue;
      }
      const int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        if (absl::Status s = Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
            !s.ok()) {
          return s;
        }
        continue;
      }
      return TlsFailure("write", err);
    }
    return absl::OkStatus();
  }

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
  SSL* ssl_ = nullptr;  // TLS on this socket, or plaintext
  bool handshake_pending_ = false;
  std::string identity_;  // "cert:<CN>" once the handshake is done
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
  TcpListener(int fd, std::string address, std::shared_ptr<TlsContextSource> tls)
      : fd_(fd), address_(std::move(address)), tls_(std::move(tls)) {}
  ~TcpListener() override { ::close(fd_); }

  absl::StatusOr<std::unique_ptr<ByteStream>> Accept(std::chrono::milliseconds wait) override {
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(wait.count()));
    if (rc <= 0) return std::unique_ptr<ByteStream>();
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return std::unique_ptr<ByteStream>();  // e.g. the peer gave up already
    ConfigureSocket(fd);
    auto stream = std::make_unique<TcpStream>(fd);
    if (tls_ != nullptr) {
      // The handshake itself runs later, one non-blocking step per
      // readiness event; the context is the current files' (reloaded).
      std::shared_ptr<SSL_CTX> ctx = tls_->Get();
      if (!stream->StartTls(ctx.get(), /*server=*/true).ok()) return std::unique_ptr<ByteStream>();
    }
    return std::unique_ptr<ByteStream>(std::move(stream));
  }

  std::string address() const override { return address_; }

 private:
  const int fd_;
  const std::string address_;
  const std::shared_ptr<TlsContextSource> tls_;  // null: plaintext
};

class TcpConnector : public Connector {
 public:
  TcpConnector(sockaddr_in addr, std::string address, std::string host,
               std::shared_ptr<TlsContextSource> tls)
      : addr_(addr), address_(std::move(address)), host_(std::move(host)), tls_(std::move(tls)) {}

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
    if (tls_ != nullptr) {
      std::shared_ptr<SSL_CTX> ctx = tls_->Get();
      if (absl::Status s = stream->StartTls(ctx.get(), /*server=*/false); !s.ok()) return s;
      stream->ExpectServer(host_);
      if (absl::Status s = stream->ClientHandshake(deadline); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(s.message(), " (", address_, ")"));
      }
    }
    return std::unique_ptr<ByteStream>(std::move(stream));
  }

 private:
  const sockaddr_in addr_;
  const std::string address_;
  const std::string host_;
  const std::shared_ptr<TlsContextSource> tls_;  // null: plaintext
};

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> MakeTcpListener(const DataPlaneServerOptions& options) {
  std::shared_ptr<TlsContextSource> tls;
  if (options.tls.enabled()) {
    auto source = TlsContextSource::Create(options.tls, /*server=*/true);
    if (!source.ok()) return source.status();
    tls = std::move(*source);
  }
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
      new TcpListener(fd, absl::StrCat(hp->host, ":", ntohs(bound.sin_port)), std::move(tls)));
}

absl::StatusOr<std::unique_ptr<Connector>> MakeTcpConnector(const DataPlaneClientOptions& options) {
  auto hp = ParseHostPort(options.server_address);
  if (!hp.ok()) return hp.status();
  auto addr = ResolveIpv4(*hp);
  if (!addr.ok()) return addr.status();
  std::shared_ptr<TlsContextSource> tls;
  if (options.tls.enabled()) {
    auto source = TlsContextSource::Create(options.tls, /*server=*/false);
    if (!source.ok()) return source.status();
    tls = std::move(*source);
  }
  return std::unique_ptr<Connector>(
      new TcpConnector(*addr, options.server_address, hp->host, std::move(tls)));
}

}  // namespace vc::transport::internal
