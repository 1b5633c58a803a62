// Notices that an HTTP client hung up while its request is still running
// (queued in the coordinator, or between two streamed tokens), so the
// gateway can cancel the coordinator call and the cluster frees the
// request's KV at once instead of when generation would have ended.
// cpp-httplib 0.11 hands request handlers no access to their connection, so
// FindConnectionFd looks the socket up by the connection's addresses (unique
// among this process's sockets while the handler runs: httplib closes it only
// after the handler returns). One watcher thread polls every watched socket.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace vc::openai::internal {

// The fd of this process's TCP socket with these numeric addresses, -1 if
// there is none.
int FindConnectionFd(const std::string& local_addr, int local_port, const std::string& remote_addr,
                     int remote_port);

// Whether the peer of `fd` has closed its side (EOF, reset or error), without
// consuming any bytes; pipelined request bytes waiting do not count.
bool PeerClosed(int fd);

class ConnectionWatcher {
 public:
  // `interval_ms`: how often the sockets are polled at most.
  explicit ConnectionWatcher(int interval_ms = 100);
  ~ConnectionWatcher();
  ConnectionWatcher(const ConnectionWatcher&) = delete;
  ConnectionWatcher& operator=(const ConnectionWatcher&) = delete;

  // Calls `on_hangup` once, from the watcher thread, when the peer of `fd`
  // closes; it must be quick and must not call Watch/Unwatch. Returns a
  // handle for Unwatch.
  int64_t Watch(int fd, std::function<void()> on_hangup);
  // After this returns the callback is not running and never will.
  void Unwatch(int64_t handle);

 private:
  void Loop();
  struct Entry {
    int fd;
    std::function<void()> on_hangup;
  };
  const int interval_ms_;
  std::mutex mu_;
  std::map<int64_t, Entry> entries_;
  int64_t next_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vc::openai::internal
