#include "services/openai/internal/bounded_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace vc::openai::internal {
namespace {

// Slack over the body limit for chunked transfer framing (sizes, CRLFs,
// trailers); the body itself is bounded by the gateway.
constexpr size_t kFramingSlack = 64 << 10;

bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  while (true) {
    const int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0;
  }
}

void Endpoint(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int r = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                     : getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (r != 0 || getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv,
                            sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return;
  }
  ip = host;
  port = std::atoi(serv);
}

// One connection: buffered reads with a per-phase budget, timeouts on every
// wait. Over TLS (`ssl` set, the socket non-blocking) the same budgets count
// the decrypted bytes.
class BudgetStream final : public httplib::Stream {
 public:
  BudgetStream(int fd, SSL* ssl, int read_timeout_ms, int write_timeout_ms)
      : fd_(fd), ssl_(ssl), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  void StartRequest(size_t head_budget) { budget_ = head_budget; }
  void StartBody(size_t body_budget) { budget_ = body_budget; }

  bool is_readable() const override { return buffered() || WaitFor(fd_, POLLIN, read_timeout_ms_); }
  bool is_writable() const override { return WaitFor(fd_, POLLOUT, write_timeout_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (budget_ == 0) return -1;  // over the limit: httplib fails the request
    size = std::min(size, budget_);
    if (pos_ == end_) {
      const ssize_t n = ssl_ != nullptr ? TlsRead() : PlainRead();
      if (n <= 0) return n;
      pos_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t take = std::min(size, end_ - pos_);
    std::memcpy(ptr, buf_ + pos_, take);
    pos_ += take;
    budget_ -= take;
    return static_cast<ssize_t>(take);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (ssl_ != nullptr) return TlsWrite(ptr, size);
    if (!WaitFor(fd_, POLLOUT, write_timeout_ms_)) return -1;
    ssize_t n;
    do {
      n = send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { Endpoint(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Endpoint(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

  // Bytes already received and not yet consumed (a pipelined request),
  // here or decrypted inside OpenSSL.
  bool buffered() const { return pos_ < end_ || (ssl_ != nullptr && SSL_pending(ssl_) > 0); }

 private:
  ssize_t PlainRead() {
    if (!WaitFor(fd_, POLLIN, read_timeout_ms_)) return -1;
    ssize_t n;
    do {
      n = recv(fd_, buf_, sizeof buf_, 0);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  // Waits for what OpenSSL asked for after a call returned `r`; false when
  // the call failed for good (or the wait timed out).
  bool TlsRetry(int r) const {
    switch (SSL_get_error(ssl_, r)) {
      case SSL_ERROR_WANT_READ:
        return WaitFor(fd_, POLLIN, read_timeout_ms_);
      case SSL_ERROR_WANT_WRITE:
        return WaitFor(fd_, POLLOUT, write_timeout_ms_);
      default:
        return false;
    }
  }

  ssize_t TlsRead() {
    while (true) {
      ERR_clear_error();
      const int n = SSL_read(ssl_, buf_, sizeof buf_);
      if (n > 0) return n;
      if (SSL_get_error(ssl_, n) == SSL_ERROR_ZERO_RETURN) return 0;  // close_notify
      if (!TlsRetry(n)) return -1;
    }
  }

  ssize_t TlsWrite(const char* ptr, size_t size) {
    const int len = static_cast<int>(std::min<size_t>(size, INT_MAX));
    while (true) {
      ERR_clear_error();
      const int n = SSL_write(ssl_, ptr, len);
      if (n > 0) return n;
      if (!TlsRetry(n)) return -1;
    }
  }

  const int fd_;
  SSL* const ssl_;
  const int read_timeout_ms_;
  const int write_timeout_ms_;
  size_t budget_ = 0;
  char buf_[4096];
  size_t pos_ = 0, end_ = 0;
};

struct Current {
  BudgetStream* stream = nullptr;
  size_t body_budget = 0;
};
thread_local Current current;

}  // namespace

void BoundedServer::HeadDone() {
  if (current.stream != nullptr) current.stream->StartBody(current.body_budget);
}

int BoundedServer::CurrentSocket() { return current.stream ? current.stream->socket() : -1; }

std::unique_ptr<SSL, void (*)(SSL*)> BoundedServer::Handshake(socket_t sock) {
  std::unique_ptr<SSL, void (*)(SSL*)> none(nullptr, &SSL_free);
  const int flags = fcntl(sock, F_GETFL);
  if (flags < 0 || fcntl(sock, F_SETFL, flags | O_NONBLOCK) != 0) return none;
  const std::shared_ptr<SSL_CTX> ctx = tls_->Get();  // the SSL keeps its own reference
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), &SSL_free);
  if (ssl == nullptr || SSL_set_fd(ssl.get(), sock) != 1) {
    ERR_clear_error();
    return none;
  }
  // The whole handshake within one deadline, waited for in short slices so
  // that stop() is prompt: a peer that sends nothing, sends plain HTTP
  // (OpenSSL rejects the record at once) or trickles bytes loses its thread.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(handshake_timeout_ms_);
  while (true) {
    ERR_clear_error();
    const int r = SSL_accept(ssl.get());
    if (r == 1) return ssl;
    const int err = SSL_get_error(ssl.get(), r);
    const short events = err == SSL_ERROR_WANT_READ ? POLLIN : err == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (events == 0) break;
    bool ready = false;
    while (!ready && is_running()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) break;
      ready = WaitFor(sock, events, static_cast<int>(std::min<int64_t>(left, 100)));
    }
    if (!ready) break;
  }
  ERR_clear_error();  // this thread serves other connections next
  return none;
}

bool BoundedServer::process_and_close_socket(socket_t sock) {
  const int read_ms = static_cast<int>(read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000);
  const int write_ms = static_cast<int>(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(nullptr, &SSL_free);
  if (tls_ != nullptr) {
    ssl = Handshake(sock);
    if (ssl == nullptr) {
      shutdown(sock, SHUT_RDWR);
      close(sock);
      return false;
    }
  }
  BudgetStream strm(sock, ssl.get(), read_ms, write_ms);
  bool ok = true;
  // httplib's keep-alive loop: at most keep_alive_max_count_ requests, each
  // arriving within keep_alive_timeout_sec_ (waited for in short slices so
  // that stop() ends idle connections promptly).
  for (size_t count = keep_alive_max_count_; count > 0; --count) {
    bool ready = strm.buffered();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (!ready && is_running() && svr_sock_ != INVALID_SOCKET &&
           std::chrono::steady_clock::now() < deadline) {
      ready = WaitFor(sock, POLLIN, 100);
    }
    if (!ready) break;
    strm.StartRequest(max_head_bytes_);
    current = Current{&strm, max_body_bytes_ + kFramingSlack};
    bool connection_closed = false;
    ok = process_request(strm, /*close_connection=*/count == 1 || !is_running(), connection_closed, nullptr);
    current = Current{};
    if (!ok || connection_closed) break;
  }
  if (ssl != nullptr) {
    // close_notify, best effort (non-blocking: a peer that stopped reading
    // does not hold the thread); then clear what a failed send queued.
    SSL_shutdown(ssl.get());
    ERR_clear_error();
  }
  shutdown(sock, SHUT_RDWR);
  close(sock);
  return ok;
}

}  // namespace vc::openai::internal
