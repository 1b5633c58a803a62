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

// Requests whose count or body is over the limits are still read (and
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

// Reads a stage body of known length in pieces, taking each piece's tokens
// from the link's bucket before reading it (receiver-side pacing: while the
// server waits, the sender is held back by the transport's flow control, so
// an upload takes at least its bytes over the link's bandwidth and shares
// the bucket with the link's responses).
class PacedReader {
 public:
  PacedReader(BufferedReader* reader, LinkPacer* pacer, int64_t piece_bytes, uint64_t body_bytes,
              TimePoint deadline, double io_timeout_seconds, const StopSignal* stop)
      : reader_(reader),
        pacer_(pacer),
        piece_(static_cast<uint64_t>(piece_bytes)),
        left_(body_bytes),
        deadline_(deadline),
        io_timeout_seconds_(io_timeout_seconds),
        stop_(stop) {}

  uint64_t left() const { return left_; }  // body bytes not read yet

  // Reads n <= left() bytes into dst (nullptr: reads and drops them). Each
  // read must make progress within io_timeout (a stalled peer is dropped),
  // and all of them finish by the stage's deadline.
  absl::Status Read(char* dst, uint64_t n) {
    while (n > 0) {
      if (credit_ == 0) {
        const uint64_t grant = std::min(piece_, left_);
        if (absl::Status s =
                pacer_->Acquire(static_cast<int64_t>(grant), deadline_, *stop_, Flow::kIn);
            !s.ok()) {
          return s;
        }
        credit_ = grant;
      }
      const uint64_t take = std::min(n, credit_);
      const TimePoint stall = DeadlineAfter(io_timeout_seconds_);
      if (absl::Status s = reader_->ReadExact(dst, take, std::min(deadline_, stall)); !s.ok()) {
        // A stalled peer is not a deadline the client waits for: hang up
        // now rather than hold the connection until its deadline.
        if (absl::IsDeadlineExceeded(s) && stall < deadline_) {
          return absl::UnavailableError("stage upload stalled past io_timeout");
        }
        return s;
      }
      if (dst != nullptr) dst += take;
      credit_ -= take;
      left_ -= take;
      n -= take;
    }
    return absl::OkStatus();
  }

 private:
  BufferedReader* reader_;
  LinkPacer* pacer_;
  const uint64_t piece_;
  uint64_t left_;
  uint64_t credit_ = 0;  // bytes whose tokens were taken but not read yet
  const TimePoint deadline_;
  const double io_timeout_seconds_;
  const StopSignal* stop_;
};

class StreamServer : public DataPlaneServer {
 public:
  StreamServer(const DataPlaneServerOptions& options, BlobLookup lookup, BlobStager stager,
               std::unique_ptr<Listener> listener)
      : options_(options),
        lookup_(std::move(lookup)),
        stager_(std::move(stager)),
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
    if (header->type == kTypeStageRequest) return HandleStage(stream, reader, *header, io_deadline);
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

  // Piece size of paced transfers on `pacer`'s link (larger when unpaced:
  // fewer transport operations, nothing to shape).
  int64_t PieceBytes(const LinkPacer& pacer) const {
    return pacer.paced() ? options_.write_piece_bytes
                         : std::max(kUnpacedPieceBytes, options_.write_piece_bytes);
  }

  // One stage request and its answer; false if the connection must close.
  bool HandleStage(ByteStream* stream, BufferedReader* reader, const RequestHeader& header,
                   TimePoint io_deadline) {
    // The client's deadline bounds the whole stage (a long paced upload may
    // legitimately outlast io_timeout; each piece must still arrive within
    // it).
    const TimePoint deadline = header.timeout_ms > 0
                                   ? Clock::now() + std::chrono::milliseconds(header.timeout_ms)
                                   : io_deadline;
    LinkPacer& pacer = Pacer(header.link);
    pacer.BeginResponse(Exchange::kStage);
    bool in_step = true;
    absl::Status answer;
    absl::Status io = ReceiveStage(reader, &pacer, header, deadline, &answer, &in_step);
    if (io.ok()) {
      PacedWriter writer(stream, &pacer, PieceBytes(pacer), deadline, &stop_);
      if (answer.ok()) {
        ResponseHeader rh;
        rh.count = header.key_count;
        io = writer.Append(EncodeResponseHeader(rh));
      } else {
        io = writer.Append(EncodeErrorResponse(answer));
      }
      if (io.ok()) io = writer.Flush();
    }
    pacer.EndResponse();
    if (absl::IsDeadlineExceeded(io)) {
      // As for fetches: the client gives up at its deadline and must see
      // DeadlineExceeded then, not an early close.
      stop_.SleepUntil(deadline + std::chrono::milliseconds(200));
    }
    return io.ok() && in_step;
  }

  // Reads a stage body, handing each entry to the stager as it lands. A
  // refusal or the first failure goes to *answer, and the rest of the body
  // is read and dropped (so the connection stays in step), except for a
  // refused header whose body is over kMaxDrainBytes (*in_step = false: the
  // answer is sent, then the connection closes). The returned Status is a
  // transport failure or a deadline: no answer, close.
  absl::Status ReceiveStage(BufferedReader* reader, LinkPacer* pacer, const RequestHeader& header,
                            TimePoint deadline, absl::Status* answer, bool* in_step) {
    // The header crossed the link too.
    if (absl::Status s =
            pacer->Acquire(static_cast<int64_t>(kRequestHeaderBytes), deadline, stop_, Flow::kIn);
        !s.ok()) {
      return s;
    }
    PacedReader body(reader, pacer, PieceBytes(*pacer), header.body_bytes, deadline,
                     options_.io_timeout_seconds, &stop_);
    // Refusals decided from the header alone, before anything is allocated.
    if (!stager_) {
      *answer = absl::UnimplementedError(
          "this data plane server takes no stage requests (it has no stager); use the control "
          "plane's StageChunk");
    } else if (header.key_count > static_cast<uint32_t>(options_.max_entries_per_stage)) {
      *answer = absl::InvalidArgumentError(absl::StrCat("stage of ", header.key_count,
                                                        " entries exceeds max_entries_per_stage ",
                                                        options_.max_entries_per_stage));
    } else if (header.body_bytes > static_cast<uint64_t>(options_.max_stage_body_bytes)) {
      *answer = absl::ResourceExhaustedError(
          absl::StrCat("stage request body of ", header.body_bytes,
                       " bytes exceeds max_stage_body_bytes ", options_.max_stage_body_bytes));
    }
    if (!answer->ok()) {
      if (header.body_bytes > kMaxDrainBytes) {
        *in_step = false;
        return absl::OkStatus();
      }
      return body.Read(nullptr, body.left());
    }

    const uint32_t max_key = static_cast<uint32_t>(options_.max_key_bytes);
    for (uint32_t i = 0; i < header.key_count; ++i) {
      auto ends_inside = [&] {
        return absl::InvalidArgumentError(absl::StrCat("stage request body ends inside entry ", i));
      };
      char len_bytes[8];
      if (body.left() < 4) {
        *answer = ends_inside();
        break;
      }
      if (absl::Status s = body.Read(len_bytes, 4); !s.ok()) return s;
      const uint32_t key_len = GetU32(len_bytes);
      if (key_len > max_key) {
        *answer = absl::InvalidArgumentError(absl::StrCat(
            "stage entry ", i, " has a key of ", key_len, " bytes; the limit is ", max_key));
        break;
      }
      if (body.left() < uint64_t{key_len} + 8) {
        *answer = ends_inside();
        break;
      }
      std::string key(key_len, '\0');
      if (absl::Status s = body.Read(key.data(), key_len); !s.ok()) return s;
      if (absl::Status s = body.Read(len_bytes, 8); !s.ok()) return s;
      const uint64_t value_len = GetU64(len_bytes);
      if (value_len > body.left()) {  // bounds the allocation by the checked body size
        *answer = absl::InvalidArgumentError(absl::StrCat("stage entry ", i, " claims a value of ",
                                                          value_len, " bytes; the body has ",
                                                          body.left(), " left"));
        break;
      }
      std::string value(value_len, '\0');
      if (absl::Status s = body.Read(value.data(), value_len); !s.ok()) return s;
      absl::Status staged = stager_(header.put_id, key, std::move(value));
      if (!staged.ok()) {
        *answer =
            absl::Status(staged.code(), absl::StrCat("key ", KeyHex(key), ": ", staged.message()));
        break;
      }
    }
    if (answer->ok() && body.left() > 0) {
      *answer = absl::InvalidArgumentError(
          absl::StrCat("stage request body has ", body.left(), " bytes after its entries"));
    }
    // The body's size passed the limits: read the rest, keeping the
    // connection in step so the client gets the answer.
    return body.Read(nullptr, body.left());
  }

  // Sends the response; an error means the connection must close.
  absl::Status Respond(ByteStream* stream, LinkPacer* pacer, const RequestHeader& header,
                       const std::string& body, TimePoint deadline) {
    auto keys =
        DecodeRequestBody(body, header.key_count, static_cast<uint32_t>(options_.max_key_bytes));
    const int64_t max_bytes = std::min<uint64_t>(static_cast<uint64_t>(options_.max_response_bytes),
                                                 header.max_response_bytes);
    PacedWriter writer(stream, pacer, PieceBytes(*pacer), deadline, &stop_);
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
  const BlobStager stager_;  // null: stage requests are refused
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
    const DataPlaneServerOptions& options, BlobLookup lookup, BlobStager stager,
    std::unique_ptr<Listener> listener) {
  return std::unique_ptr<DataPlaneServer>(
      new StreamServer(options, std::move(lookup), std::move(stager), std::move(listener)));
}

}  // namespace vc::transport::internal
