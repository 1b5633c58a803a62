// What a data plane backend provides: connections that carry bytes both ways
// (ByteStream), a Listener on the server side and a Connector on the client
// side. The framing, pacing and connection handling above them are shared
// (stream_server.h, stream_client.h), so a backend is only byte transport.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport/data_plane.h"
#include "common/transport/internal/link_pacer.h"

namespace vc::transport::internal {

// TimePoint::max() means "no deadline" (used only where a stream may idle,
// e.g. a server waiting for the next request; Close() ends such waits).
inline constexpr TimePoint kNoDeadline = TimePoint::max();

// One connection. Reads and writes are issued by one thread at a time; Close
// may be called from any thread, concurrently with them.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Reads between 1 and `max` bytes; the count is the transport's own (UCX:
  // the receive completion's length). DeadlineExceeded at the deadline,
  // Unavailable if the peer is gone or the stream was closed. After an error
  // the stream is unusable.
  virtual absl::StatusOr<size_t> ReadSome(char* buf, size_t max, TimePoint deadline) = 0;
  // Sends all of `data` (taken by value so an asynchronous transport owns
  // the buffer until the send completes). Same errors as ReadSome.
  virtual absl::Status Write(std::string data, TimePoint deadline) = 0;
  // Fails pending and later reads and writes with Unavailable.
  virtual void Close() = 0;
  // A file descriptor that polls readable when the stream has bytes (or an
  // error) to read, so a server can watch idle streams without a thread
  // each; -1 if the backend has none (the server then waits in a thread).
  virtual int ReadinessFd() const { return -1; }
  // The peer's IP address, "" if unknown.
  virtual std::string PeerAddress() const { return ""; }

  // Bytes the transport itself reported sent on this stream (TCP: send()
  // results; UCX: lengths of completed stream sends).
  int64_t bytes_sent() const { return sent_.load(); }
  // Also advance `counter` for every byte sent from now on, live. Set it
  // before the stream is used; it must outlive the stream.
  void ShareSentCounter(std::atomic<int64_t>* counter) { shared_sent_ = counter; }

 protected:
  // Backends call this with the count their transport reported sent.
  void CountSent(size_t n) {
    sent_.fetch_add(static_cast<int64_t>(n));
    if (shared_sent_ != nullptr) shared_sent_->fetch_add(static_cast<int64_t>(n));
  }

 private:
  std::atomic<int64_t> sent_{0};
  std::atomic<int64_t>* shared_sent_ = nullptr;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Waits up to `wait` for a new connection; nullptr if none arrived.
  virtual absl::StatusOr<std::unique_ptr<ByteStream>> Accept(std::chrono::milliseconds wait) = 0;
  virtual std::string address() const = 0;
};

class Connector {
 public:
  virtual ~Connector() = default;
  // A new connection to the server. Backends may connect lazily, in which
  // case a refused connection surfaces as Unavailable on the first read.
  virtual absl::StatusOr<std::unique_ptr<ByteStream>> Connect(TimePoint deadline) = 0;
};

// Exact reads over a ByteStream, with a small buffer so headers do not cost
// one transport operation each; large reads go straight to the destination.
class BufferedReader {
 public:
  // `received` (optional) is also advanced by every read, live.
  explicit BufferedReader(ByteStream* stream, std::atomic<int64_t>* received = nullptr,
                          size_t buffer_bytes = 64 << 10);
  absl::Status ReadExact(char* dst, size_t n, TimePoint deadline);
  // Reads and drops n bytes.
  absl::Status Skip(size_t n, TimePoint deadline);
  // Waits (up to the deadline) until at least one byte is buffered.
  absl::Status Fill(TimePoint deadline);
  // Bytes obtained from the stream so far (for "did the peer say anything").
  int64_t bytes_received() const { return received_; }
  // Bytes read from the stream but not consumed yet.
  size_t buffered() const { return end_ - begin_; }

 private:
  ByteStream* stream_;
  std::atomic<int64_t>* shared_received_;
  std::string buffer_;
  size_t begin_ = 0, end_ = 0;
  int64_t received_ = 0;
};

struct HostPort {
  std::string host;
  int port = 0;
};
// "HOST:PORT" with an IPv4 address or a host name; port 0..65535.
absl::StatusOr<HostPort> ParseHostPort(const std::string& address);
// Resolves to an IPv4 socket address (numeric hosts without a lookup).
absl::StatusOr<sockaddr_in> ResolveIpv4(const HostPort& hp);

TimePoint DeadlineAfter(double seconds);

}  // namespace vc::transport::internal
