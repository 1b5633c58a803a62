#include "common/transport/internal/stream_server.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/internal/wire.h"

namespace vc::transport::internal {
namespace {

// Requests whose key count or body is over the limits are still read (and
// dropped) up to this size so the connection stays usable; past it the
// connection is closed after the error response.
constexpr uint64_t kMaxDrainBytes = uint64_t{64} << 20;
// Unpaced responses go out in pieces this large (paced ones use the
// configured write_piece_bytes).
constexpr int64_t kUnpacedPieceBytes = int64_t{1} << 20;

// Buffers a response into pieces and sends each one through the pacer.
class PacedWriter {
 public:
  PacedWriter(ByteStream* stream, LinkPacer* pacer, int64_t piece_bytes, TimePoint deadline,
              const StopSignal* stop)
      : stream_(stream),
        pacer_(pacer),
        piece_(static_cast<size_t>(piece_bytes)),
        deadline_(deadline),
        stop_(stop) {
    buffer_.reserve(piece_);
  }

  absl::Status Append(const char* data, size_t n) {
    while (n > 0) {
      const size_t take = std::min(n, piece_ - buffer_.size());
      buffer_.append(data, take);
      data += take;
      n -= take;
      if (buffer_.size() == piece_) {
        if (absl::Status s = Flush(); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Append(const std::string& s) { return Append(s.data(), s.size()); }

  absl::Status Flush() {
    if (buffer_.empty()) return absl::OkStatus();
    const int64_t n = static_cast<int64_t>(buffer_.size());
    if (absl::Status s = pacer_->Acquire(n, deadline_, *stop_); !s.ok()) return s;
    std::string piece;
    piece.reserve(piece_);
    piece.swap(buffer_);
    return stream_->Write(std::move(piece), deadline_);
  }

 private:
  ByteStream* stream_;
  LinkPacer* pacer_;
  const size_t piece_;
  const TimePoint deadline_;
  const StopSignal* stop_;
  std::string buffer_;
};

class StreamServer : public DataPlaneServer {
 public:
  StreamServer(const DataPlaneServerOptions& options, BlobLookup lookup,
               std::unique_ptr<Listener> listener)
      : options_(options),
        lookup_(std::move(lookup)),
        listener_(std::move(listener)),
        epoch_(Clock::now()),
        fast_(options.fast, epoch_, options.slot_seconds, options.max_tracked_slots),
        slow_(options.slow, epoch_, options.slot_seconds, options.max_tracked_slots) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~StreamServer() override {
    stop_.Stop();
    accept_thread_.join();
    std::list<Connection> connections;
    {
      std::lock_guard<std::mutex> lock(mu_);
      connections.swap(connections_);
    }
    for (Connection& c : connections) c.stream->Close();
    for (Connection& c : connections) c.thread.join();
    connections.clear();  // streams go before the listener (UCX: before the worker)
    listener_.reset();
  }

  std::string kind() const override { return options_.kind; }
  std::string address() const override { return listener_->address(); }
  LinkStats Stats(LinkClass link) const override { return Pacer(link).Stats(); }
  std::chrono::steady_clock::time_point epoch() const override { return epoch_; }

 private:
  struct Connection {
    std::unique_ptr<ByteStream> stream;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  const LinkPacer& Pacer(LinkClass link) const { return link == LinkClass::kFast ? fast_ : slow_; }
  LinkPacer& Pacer(LinkClass link) { return link == LinkClass::kFast ? fast_ : slow_; }

  void AcceptLoop() {
    while (!stop_.stopped()) {
      auto accepted = listener_->Accept(std::chrono::milliseconds(100));
      ReapFinished();
      if (!accepted.ok() || *accepted == nullptr) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int>(connections_.size()) >= options_.max_connections || stop_.stopped()) {
        (*accepted)->Close();  // refused: over max_connections
        continue;
      }
      Connection& c = connections_.emplace_back();
      c.stream = std::move(*accepted);
      c.thread = std::thread([this, &c] {
        Serve(c.stream.get());
        c.stream->Close();
        c.done.store(true);
      });
    }
  }

  void ReapFinished() {
    std::list<Connection> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = connections_.begin(); it != connections_.end();) {
        auto next = std::next(it);
        if (it->done.load()) finished.splice(finished.end(), connections_, it);
        it = next;
      }
    }
    for (Connection& c : finished) c.thread.join();
  }

  // Serves requests until the peer leaves, an I/O error, or shutdown.
  void Serve(ByteStream* stream) {
    BufferedReader reader(stream);
    while (!stop_.stopped()) {
      char header_bytes[kRequestHeaderBytes];
      // Idle connections may wait for their next request indefinitely (the
      // destructor closes them); a request, once begun, has io_timeout.
      if (!reader.ReadExact(header_bytes, 1, kNoDeadline).ok()) return;
      const TimePoint io_deadline = DeadlineAfter(options_.io_timeout_seconds);
      if (!reader.ReadExact(header_bytes + 1, kRequestHeaderBytes - 1, io_deadline).ok()) return;
      if (!HandleRequest(stream, &reader, header_bytes, io_deadline)) return;
    }
  }

  // One request and its response; false if the connection must close.
  bool HandleRequest(ByteStream* stream, BufferedReader* reader, const char* header_bytes,
                     TimePoint io_deadline) {
    auto header = DecodeRequestHeader(header_bytes);
    if (!header.ok()) {  // the framing cannot be trusted: answer, then close
      (void)stream->Write(EncodeErrorResponse(header.status()), io_deadline);
      return false;
    }
    const uint64_t body_limit =
        static_cast<uint64_t>(options_.max_keys_per_fetch) * (4 + options_.max_key_bytes);
    absl::Status refused;
    if (header->key_count > static_cast<uint32_t>(options_.max_keys_per_fetch)) {
      refused = absl::InvalidArgumentError(absl::StrCat("fetch of ", header->key_count,
                                                        " keys exceeds max_keys_per_fetch ",
                                                        options_.max_keys_per_fetch));
    } else if (header->body_bytes > body_limit) {
      refused = absl::InvalidArgumentError(
          absl::StrCat("fetch request body of ", header->body_bytes, " bytes exceeds the limit ",
                       body_limit, " (max_keys_per_fetch x (4 + max_key_bytes))"));
    }
    if (!refused.ok()) {
      const bool drained = header->body_bytes <= kMaxDrainBytes &&
                           reader->Skip(header->body_bytes, io_deadline).ok();
      LinkPacer& pacer = Pacer(header->link);
      pacer.BeginResponse();
      PacedWriter writer(stream, &pacer, options_.write_piece_bytes, io_deadline, &stop_);
      const bool sent = writer.Append(EncodeErrorResponse(refused)).ok() && writer.Flush().ok();
      pacer.EndResponse();
      return sent && drained;
    }
    std::string body(header->body_bytes, '\0');
    if (!reader->ReadExact(body.data(), body.size(), io_deadline).ok()) return false;

    // The client's deadline bounds the response: past it nobody waits. (A
    // long paced transfer may legitimately outlast io_timeout.)
    const TimePoint deadline = header->timeout_ms > 0
                                   ? Clock::now() + std::chrono::milliseconds(header->timeout_ms)
                                   : DeadlineAfter(options_.io_timeout_seconds);
    LinkPacer& pacer = Pacer(header->link);
    pacer.BeginResponse();
    absl::Status sent = Respond(stream, &pacer, *header, body, deadline);
    pacer.EndResponse();
    if (absl::IsDeadlineExceeded(sent)) {
      // The link cannot deliver in time. The client gives up at its deadline
      // and must see DeadlineExceeded then, not an early close.
      stop_.SleepUntil(deadline + std::chrono::milliseconds(200));
    }
    return sent.ok();
  }

  // Sends the response; an error means the connection must close.
  absl::Status Respond(ByteStream* stream, LinkPacer* pacer, const RequestHeader& header,
                       const std::string& body, TimePoint deadline) {
    auto keys =
        DecodeRequestBody(body, header.key_count, static_cast<uint32_t>(options_.max_key_bytes));
    const int64_t max_bytes = std::min<uint64_t>(static_cast<uint64_t>(options_.max_response_bytes),
                                                 header.max_response_bytes);
    const int64_t piece = pacer->paced() ? options_.write_piece_bytes
                                         : std::max(kUnpacedPieceBytes, options_.write_piece_bytes);
    PacedWriter writer(stream, pacer, piece, deadline, &stop_);
    auto fail = [&](const absl::Status& status) {
      if (absl::Status s = writer.Append(EncodeErrorResponse(status)); !s.ok()) return s;
      return writer.Flush();
    };
    if (!keys.ok()) return fail(keys.status());

    std::vector<std::string> values;
    values.reserve(keys->size());
    int64_t total = 0;
    for (const std::string& key : *keys) {
      absl::StatusOr<std::string> value = lookup_(key);
      if (!value.ok()) {
        return fail(absl::Status(value.status().code(), absl::StrCat("key ", KeyHex(key), ": ",
                                                                     value.status().message())));
      }
      total += static_cast<int64_t>(value->size());
      if (total > max_bytes) {
        return fail(absl::ResourceExhaustedError(absl::StrCat(
            "fetch response exceeds max_response_bytes ", max_bytes, " (server ",
            options_.max_response_bytes, ", client ", header.max_response_bytes, ")")));
      }
      values.push_back(std::move(*value));
    }
    if (pacer->latency_seconds() > 0) {
      const TimePoint arrival = DeadlineAfter(pacer->latency_seconds());
      if (arrival > deadline) return absl::DeadlineExceededError("latency passes the deadline");
      if (!stop_.SleepUntil(arrival)) return absl::CancelledError("stopping");
    }
    ResponseHeader rh;
    rh.count = static_cast<uint32_t>(values.size());
    if (absl::Status s = writer.Append(EncodeResponseHeader(rh)); !s.ok()) return s;
    for (const std::string& value : values) {
      std::string len;
      PutU64(&len, value.size());
      if (absl::Status s = writer.Append(len); !s.ok()) return s;
      if (absl::Status s = writer.Append(value); !s.ok()) return s;
    }
    return writer.Flush();
  }

  const DataPlaneServerOptions options_;
  const BlobLookup lookup_;
  std::unique_ptr<Listener> listener_;
  const TimePoint epoch_;
  LinkPacer fast_, slow_;
  StopSignal stop_;
  std::mutex mu_;
  std::list<Connection> connections_;
  std::thread accept_thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneServer>> StartStreamServer(
    const DataPlaneServerOptions& options, BlobLookup lookup, std::unique_ptr<Listener> listener) {
  return std::unique_ptr<DataPlaneServer>(
      new StreamServer(options, std::move(lookup), std::move(listener)));
}

}  // namespace vc::transport::internal
