#include "services/openai/internal/bounded_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
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
// wait.
class BudgetStream final : public httplib::Stream {
 public:
  BudgetStream(int fd, int read_timeout_ms, int write_timeout_ms)
      : fd_(fd), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  void StartRequest(size_t head_budget) { budget_ = head_budget; }
  void StartBody(size_t body_budget) { budget_ = body_budget; }

  bool is_readable() const override { return pos_ < end_ || WaitFor(fd_, POLLIN, read_timeout_ms_); }
  bool is_writable() const override { return WaitFor(fd_, POLLOUT, write_timeout_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (budget_ == 0) return -1;  // over the limit: httplib fails the request
    size = std::min(size, budget_);
    if (pos_ == end_) {
      if (!WaitFor(fd_, POLLIN, read_timeout_ms_)) return -1;
      ssize_t n;
      do {
        n = recv(fd_, buf_, sizeof buf_, 0);
      } while (n < 0 && errno == EINTR);
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

  // Bytes already received and not yet consumed (a pipelined request).
  bool buffered() const { return pos_ < end_; }

 private:
  const int fd_;
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

bool BoundedServer::process_and_close_socket(socket_t sock) {
  const int read_ms = static_cast<int>(read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000);
  const int write_ms = static_cast<int>(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
  BudgetStream strm(sock, read_ms, write_ms);
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
  shutdown(sock, SHUT_RDWR);
  close(sock);
  return ok;
}

}  // namespace vc::openai::internal
