// An in-memory data plane connection for the wire fuzzers: reads come from a
// fixed byte string (the fuzz input), in pieces whose sizes the input also
// chooses; writes are counted and dropped. When the bytes run out a read
// fails with Unavailable, as a peer hanging up does, so every exchange ends.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/transport/internal/stream.h"

namespace vc::fuzz {

// What the peer sends, shared by successive connections (a client that
// reconnects continues where the previous connection stopped), and what the
// fuzzer waits on. Outlives the streams (a server may destroy a stream as
// soon as it closes it).
struct PeerBytes {
  std::mutex mu;
  std::condition_variable cv;
  std::string bytes;
  size_t pos = 0;
  size_t piece = 4096;  // largest single read: small pieces exercise reassembly
  int closed = 0;       // streams closed so far
  size_t written = 0;   // bytes written to the peer, all streams

  // Blocks until `n` streams have been closed.
  void WaitClosed(int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return closed >= n; });
  }
};

class MemoryStream : public transport::internal::ByteStream {
 public:
  explicit MemoryStream(std::shared_ptr<PeerBytes> peer) : peer_(std::move(peer)) {}
  ~MemoryStream() override { Close(); }

  absl::StatusOr<size_t> ReadSome(char* buf, size_t max, transport::internal::TimePoint) override {
    std::lock_guard<std::mutex> lock(peer_->mu);
    if (closed_) return absl::UnavailableError("memory stream closed");
    const size_t left = peer_->bytes.size() - peer_->pos;
    if (left == 0) return absl::UnavailableError("peer closed the connection (input exhausted)");
    const size_t n = std::min({max, left, peer_->piece});
    std::memcpy(buf, peer_->bytes.data() + peer_->pos, n);
    peer_->pos += n;
    return n;
  }

  absl::Status Write(std::string data, transport::internal::TimePoint) override {
    {
      std::lock_guard<std::mutex> lock(peer_->mu);
      if (closed_) return absl::UnavailableError("memory stream closed");
      peer_->written += data.size();
    }
    CountSent(data.size());
    return absl::OkStatus();
  }

  void Close() override {
    std::lock_guard<std::mutex> lock(peer_->mu);
    if (closed_) return;
    closed_ = true;
    ++peer_->closed;
    peer_->cv.notify_all();
  }

 private:
  std::shared_ptr<PeerBytes> peer_;
  bool closed_ = false;  // guarded by peer_->mu
};

}  // namespace vc::fuzz
