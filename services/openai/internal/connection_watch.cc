#include "services/openai/internal/connection_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <vector>

namespace vc::openai::internal {
namespace {

bool SameEndpoint(const sockaddr_storage& ss, socklen_t len, const std::string& addr, int port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  return addr == host && port == std::atoi(serv);
}

}  // namespace

int FindConnectionFd(const std::string& local_addr, int local_port, const std::string& remote_addr,
                     int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t peer_len = sizeof peer, self_len = sizeof self;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &self_len) != 0) continue;
    if (SameEndpoint(peer, peer_len, remote_addr, remote_port) &&
        SameEndpoint(self, self_len, local_addr, local_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool PeerClosed(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

ConnectionWatcher::ConnectionWatcher(int interval_ms)
    : interval_ms_(interval_ms > 0 ? interval_ms : 100), thread_([this] { Loop(); }) {}

ConnectionWatcher::~ConnectionWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  thread_.join();
}

int64_t ConnectionWatcher::Watch(int fd, std::function<void()> on_hangup) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t id = next_++;
  entries_[id] = Entry{fd, std::move(on_hangup)};
  return id;
}

void ConnectionWatcher::Unwatch(int64_t handle) {
  // Callbacks run under mu_, so once the entry is gone none is running.
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(handle);
}

void ConnectionWatcher::Loop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (PeerClosed(it->second.fd)) {
          it->second.on_hangup();
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms_));
  }
}

}  // namespace vc::openai::internal
