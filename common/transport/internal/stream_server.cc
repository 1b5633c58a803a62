#include "common/transport/internal/stream_server.h"

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
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

// Adapts a plain BlobStager (no admission, no peer) to a StageSink.
class StagerSink : public StageSink {
 public:
  explicit StagerSink(BlobStager stager) : stager_(std::move(stager)) {}
  absl::Status Begin(const PeerInfo&, uint64_t, uint64_t) override { return absl::OkStatus(); }
  absl::Status Entry(const PeerInfo&, uint64_t put_id, const std::string& key,
                     std::string value) override {
    return stager_(put_id, key, std::move(value));
  }
  void End(const PeerInfo&, uint64_t, uint64_t) override {}

 private:
  BlobStager stager_;
};

// The server's threading model: one accept thread; one watcher thread that
// holds every idle connection in an epoll set (readable, or past its
// deadline: closed); a fixed pool of worker threads that each serve one
// request of a ready connection and hand it back to the watcher. So an idle
// or silent connection costs a file descriptor and a few hundred bytes,
// never a thread, and a flood of silent sockets can neither exhaust the
// workers nor lock out a worker's new connection (the pending cap drops the
// oldest silent one first). Backends without a readiness fd (UCX) keep the
// older model: a thread per connection, with the same deadlines and caps.
class StreamServer : public DataPlaneServer {
 public:
  StreamServer(const DataPlaneServerOptions& options, BlobLookup lookup,
               std::shared_ptr<StageSink> sink, std::unique_ptr<Listener> listener)
      : options_(options),
        lookup_(std::move(lookup)),
        sink_(std::move(sink)),
        listener_(std::move(listener)),
        epoch_(Clock::now()),
        fast_(options.fast, epoch_, options.slot_seconds, options.max_tracked_slots),
        slow_(options.slow, epoch_, options.slot_seconds, options.max_tracked_slots) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < options_.worker_threads; ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
    watcher_thread_ = std::thread([this] { WatchLoop(); });
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~StreamServer() override {
    stop_.Stop();
    accept_thread_.join();
    std::vector<std::shared_ptr<Conn>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, c] : conns_) all.push_back(c);
      for (auto& c : all) DropLocked(c);
      ready_.clear();
    }
    ready_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    watcher_thread_.join();
    std::list<std::shared_ptr<Conn>> dedicated;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dedicated.swap(dedicated_);
    }
    for (auto& c : dedicated) c->thread.join();
    dedicated.clear();
    all.clear();  // streams go before the listener (UCX: before the worker)
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    listener_.reset();
  }

  std::string kind() const override { return options_.kind; }
  std::string address() const override { return listener_->address(); }
  LinkStats Stats(LinkClass link) const override { return Pacer(link).Stats(); }
  std::chrono::steady_clock::time_point epoch() const override { return epoch_; }
  int established_connections() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return established_;
  }
  int pending_connections() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_;
  }

 private:
  struct Conn {
    uint64_t id = 0;  // increasing: a smaller id is an older connection
    std::unique_ptr<ByteStream> stream;
    std::unique_ptr<BufferedReader> reader;
    PeerInfo peer;
    int fd = -1;  // readiness fd; -1: served by its own thread
    enum class State { kIdle, kQueued, kBusy } state = State::kIdle;
    bool established = false;    // sent a valid request
    std::string owner;           // peer.Owner(), set when established
    bool authenticated = false;  // its handshake (TLS) is done
    bool dropped = false;
    bool in_epoll = false;
    TimePoint handshake_deadline;  // first request header by then
    TimePoint idle_deadline;       // closed at this point while idle
    TimePoint last_active;
    std::thread thread;  // fd-less backends only
    std::atomic<bool> finished{false};
  };

  const LinkPacer& Pacer(LinkClass link) const { return link == LinkClass::kFast ? fast_ : slow_; }
  LinkPacer& Pacer(LinkClass link) { return link == LinkClass::kFast ? fast_ : slow_; }

  void AcceptLoop() {
    while (!stop_.stopped()) {
      auto accepted = listener_->Accept(std::chrono::milliseconds(100));
      ReapDedicated();
      if (!accepted.ok() || *accepted == nullptr) continue;
      auto c = std::make_shared<Conn>();
      c->stream = std::move(*accepted);
      c->reader = std::make_unique<BufferedReader>(c->stream.get());
      c->peer.address = c->stream->PeerAddress();
      c->fd = c->stream->ReadinessFd();
      c->handshake_deadline = DeadlineAfter(options_.handshake_timeout_seconds);
      c->idle_deadline = c->handshake_deadline;
      c->last_active = Clock::now();
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_.stopped()) {
        c->stream->Close();
        continue;
      }
      // The pending cap: a new connection pushes out the oldest silent one,
      // so the newest (a worker that is about to send its request) gets in.
      while (pending_ >= options_.max_pending_connections) {
        std::shared_ptr<Conn> oldest;
        for (auto& [id, other] : conns_) {
          if (!other->established) {
            oldest = other;
            break;
          }
        }
        if (oldest == nullptr) break;
        DropLocked(oldest);
        ++dropped_pending_;
      }
      c->id = next_id_++;
      conns_.emplace(c->id, c);
      ++pending_;
      if (c->fd >= 0) {
        ArmLocked(c);
      } else {
        dedicated_.push_back(c);
        c->thread = std::thread([this, c] {
          ServeDedicated(c);
          c->finished.store(true);
        });
      }
    }
  }

  // Joins the threads of fd-less connections that ended.
  void ReapDedicated() {
    std::list<std::shared_ptr<Conn>> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = dedicated_.begin(); it != dedicated_.end();) {
        auto next = std::next(it);
        if ((*it)->finished.load()) finished.splice(finished.end(), dedicated_, it);
        it = next;
      }
    }
    for (auto& c : finished) c->thread.join();
  }

  // Watches an idle connection for its next request (mu_ held).
  void ArmLocked(const std::shared_ptr<Conn>& c) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
    ev.data.u64 = c->id;
    const int op = c->in_epoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (::epoll_ctl(epoll_fd_, op, c->fd, &ev) != 0) {
      DropLocked(c);
      return;
    }
    c->in_epoll = true;
  }

  // Forgets a connection and closes its stream (mu_ held). A worker or
  // thread still holding it sees its next read or write fail.
  void DropLocked(const std::shared_ptr<Conn>& c) {
    if (c->dropped) return;
    c->dropped = true;
    if (c->established) {
      --established_;
      auto it = established_by_owner_.find(c->owner);
      if (it != established_by_owner_.end() && --it->second <= 0) established_by_owner_.erase(it);
    } else {
      --pending_;
    }
    if (c->in_epoll) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
      c->in_epoll = false;
    }
    c->stream->Close();
    conns_.erase(c->id);
  }

  void WatchLoop() {
    constexpr int kMaxEvents = 64;
    epoll_event events[kMaxEvents];
    while (!stop_.stopped()) {
      const int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, 50);
      std::vector<std::shared_ptr<Conn>> doomed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (int i = 0; i < n; ++i) {
          // epoll_event is packed on x86-64, so data.u64 is misaligned:
          // copy it out rather than bind find()'s reference to it.
          const uint64_t id = events[i].data.u64;
          auto it = conns_.find(id);
          if (it == conns_.end()) continue;
          const std::shared_ptr<Conn>& c = it->second;
          if (c->state != Conn::State::kIdle) continue;
          c->state = Conn::State::kQueued;
          ready_.push_back(c);
          ready_cv_.notify_one();
        }
        const TimePoint now = Clock::now();
        for (auto& [id, c] : conns_) {
          if (c->fd >= 0 && c->state == Conn::State::kIdle && c->idle_deadline <= now) {
            doomed.push_back(c);
          }
        }
        for (auto& c : doomed) DropLocked(c);
      }
      doomed.clear();  // streams close outside the lock
    }
  }

  void WorkerLoop() {
    while (true) {
      std::shared_ptr<Conn> c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_cv_.wait(lock, [&] { return stop_.stopped() || !ready_.empty(); });
        if (stop_.stopped()) return;
        c = std::move(ready_.front());
        ready_.pop_front();
        if (c->dropped) continue;
        c->state = Conn::State::kBusy;
      }
      const bool keep = ServeOne(c);
      std::lock_guard<std::mutex> lock(mu_);
      if (!keep || c->dropped || stop_.stopped()) {
        DropLocked(c);
        continue;
      }
      c->last_active = Clock::now();
      // Still pending (a TLS handshake under way, or done and its first
      // request not there yet): the handshake deadline still holds.
      c->idle_deadline = c->established ? DeadlineAfter(options_.idle_timeout_seconds)
                                        : c->handshake_deadline;
      if (c->reader->buffered() > 0 || c->stream->HasBufferedBytes()) {
        // the next request already arrived
        c->state = Conn::State::kQueued;
        ready_.push_back(c);
        ready_cv_.notify_one();
      } else {
        c->state = Conn::State::kIdle;
        ArmLocked(c);
      }
    }
  }

  // fd-less backends: the connection's own thread waits for each request
  // (within the handshake or idle deadline) and serves it.
  void ServeDedicated(const std::shared_ptr<Conn>& c) {
    while (!stop_.stopped()) {
      TimePoint wait_until;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (c->dropped) break;
        wait_until = c->idle_deadline;
      }
      if (c->reader->buffered() == 0 && !c->reader->Fill(wait_until).ok()) break;
      if (!ServeOne(c)) break;
      std::lock_guard<std::mutex> lock(mu_);
      c->last_active = Clock::now();
      c->idle_deadline = DeadlineAfter(options_.idle_timeout_seconds);
    }
    std::lock_guard<std::mutex> lock(mu_);
    DropLocked(c);
  }

  // Promotes a connection that sent a valid request header to established,
  // making room under max_connections by closing the one idle longest.
  // False if every established connection is busy (this one closes).
  bool Promote(const std::shared_ptr<Conn>& c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (c->dropped) return false;
    if (c->established) return true;
    // The idlest established connection (of `owner` only, unless empty).
    auto idlest = [&](const std::string* owner) {
      std::shared_ptr<Conn> lru;
      for (auto& [id, other] : conns_) {
        if (!other->established || other->state != Conn::State::kIdle) continue;
        if (owner != nullptr && other->owner != *owner) continue;
        if (lru == nullptr || other->last_active < lru->last_active) lru = other;
      }
      return lru;
    };
    std::string owner = c->peer.Owner();
    const int per_identity = std::min(options_.max_connections_per_identity, options_.max_connections);
    if (auto it = established_by_owner_.find(owner);
        it != established_by_owner_.end() && it->second >= per_identity) {
      // At its own cap: it gives up one of its own, never another's place.
      std::shared_ptr<Conn> lru = idlest(&owner);
      if (lru == nullptr) return false;
      DropLocked(lru);
    }
    if (established_ >= options_.max_connections) {
      std::shared_ptr<Conn> lru = idlest(nullptr);
      if (lru == nullptr) return false;
      DropLocked(lru);
    }
    c->established = true;
    c->owner = std::move(owner);
    ++established_by_owner_[c->owner];
    --pending_;
    ++established_;
    return true;
  }

  // Reads and serves one request of a connection whose bytes are ready;
  // false if the connection must close.
  bool ServeOne(const std::shared_ptr<Conn>& c) {
    if (!c->authenticated) {
      // The peer authenticates (TLS: its certificate verified) before one
      // byte of a request is read. Each step is non-blocking: a peer that
      // stalls mid-handshake goes back to the watcher, not a worker.
      switch (c->stream->ContinueHandshake()) {
        case ByteStream::Handshake::kFailed:
          return false;
        case ByteStream::Handshake::kWantRead:
          return Clock::now() < c->handshake_deadline;
        case ByteStream::Handshake::kDone:
          break;
      }
      c->authenticated = true;
      c->peer.identity = c->stream->PeerIdentity();
      // Back to the watcher unless the first request's bytes are already
      // here (a plaintext stream's always are: that is why it was queued).
      if (c->reader->buffered() == 0 && !c->stream->HasBufferedBytes() && c->fd >= 0) {
        pollfd p{c->fd, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) return true;
      }
    }
    char header_bytes[kRequestHeaderBytes];
    // A header, once begun, arrives whole within the handshake timeout (a
    // client writes it in one go); a new connection's first one by its
    // handshake deadline.
    TimePoint header_deadline = DeadlineAfter(options_.handshake_timeout_seconds);
    if (!c->established) header_deadline = std::min(header_deadline, c->handshake_deadline);
    if (!c->reader->ReadExact(header_bytes, kRequestHeaderBytes, header_deadline).ok()) {
      return false;
    }
    const TimePoint io_deadline = DeadlineAfter(options_.io_timeout_seconds);
    auto header = DecodeRequestHeader(header_bytes);
    if (!header.ok()) {  // the framing cannot be trusted: answer, then close
      (void)c->stream->Write(EncodeErrorResponse(header.status()),
                             std::min(io_deadline, DeadlineAfter(1)));
      return false;
    }
    if (!Promote(c)) return false;
    return HandleRequest(c->stream.get(), c->reader.get(), c->peer, *header, io_deadline);
  }

  // The deadline of an exchange: the client's (capped at
  // max_request_seconds), or `fallback` for a request without one.
  TimePoint ClientDeadline(const RequestHeader& header, TimePoint fallback) const {
    if (header.timeout_ms == 0) return fallback;
    const double seconds =
        std::min(static_cast<double>(header.timeout_ms) / 1000.0, options_.max_request_seconds);
    return DeadlineAfter(seconds);
  }

  // One request and its response; false if the connection must close.
  bool HandleRequest(ByteStream* stream, BufferedReader* reader, const PeerInfo& peer,
                     const RequestHeader& request, TimePoint io_deadline) {
    const RequestHeader* header = &request;
    if (header->type == kTypeStageRequest) {
      return HandleStage(stream, reader, peer, *header, io_deadline);
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
    const TimePoint deadline = ClientDeadline(*header, io_deadline);
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
  bool HandleStage(ByteStream* stream, BufferedReader* reader, const PeerInfo& peer,
                   const RequestHeader& header, TimePoint io_deadline) {
    // The client's deadline bounds the whole stage (a long paced upload may
    // legitimately outlast io_timeout; each piece must still arrive within
    // it).
    const TimePoint deadline = ClientDeadline(header, io_deadline);
    LinkPacer& pacer = Pacer(header.link);
    pacer.BeginResponse(Exchange::kStage);
    bool in_step = true;
    absl::Status answer;
    absl::Status io = ReceiveStage(reader, &pacer, peer, header, deadline, &answer, &in_step);
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
  absl::Status ReceiveStage(BufferedReader* reader, LinkPacer* pacer, const PeerInfo& peer,
                            const RequestHeader& header, TimePoint deadline, absl::Status* answer,
                            bool* in_step) {
    // The header crossed the link too.
    if (absl::Status s =
            pacer->Acquire(static_cast<int64_t>(kRequestHeaderBytes), deadline, stop_, Flow::kIn);
        !s.ok()) {
      return s;
    }
    PacedReader body(reader, pacer, PieceBytes(*pacer), header.body_bytes, deadline,
                     options_.io_timeout_seconds, &stop_);
    // Refusals decided from the header alone, before anything is allocated.
    if (!sink_) {
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
    } else {
      // The store's admission: the put exists, is this peer's, and its
      // budget holds the body (reserved until End). Still nothing read.
      *answer = sink_->Begin(peer, header.put_id, header.body_bytes);
      if (answer->ok()) {
        uint64_t handed_over = 0;
        absl::Status s = ReceiveEntries(&body, peer, header, answer, &handed_over);
        sink_->End(peer, header.put_id, header.body_bytes - handed_over);
        return s;
      }
    }
    // Refused from the header: drop a small body to stay in step; close
    // after the answer rather than read a large one.
    if (header.body_bytes > kMaxDrainBytes) {
      *in_step = false;
      return absl::OkStatus();
    }
    return body.Read(nullptr, body.left());
  }

  // The entries of an admitted stage, each handed to the sink as it lands;
  // *handed_over counts the value bytes given to it. Values are read piece
  // by piece into a buffer that grows only as their bytes arrive, so a
  // header that claims a large value costs nothing until the bytes come.
  absl::Status ReceiveEntries(PacedReader* body_reader, const PeerInfo& peer,
                              const RequestHeader& header, absl::Status* answer,
                              uint64_t* handed_over) {
    PacedReader& body = *body_reader;
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
      if (value_len > body.left()) {  // bounds the value by the admitted body size
        *answer = absl::InvalidArgumentError(absl::StrCat("stage entry ", i, " claims a value of ",
                                                          value_len, " bytes; the body has ",
                                                          body.left(), " left"));
        break;
      }
      std::string value;
      const uint64_t piece = static_cast<uint64_t>(options_.write_piece_bytes);
      value.reserve(std::min(value_len, piece));
      while (value.size() < value_len) {
        const size_t at = value.size();
        const uint64_t take = std::min(piece, value_len - at);
        value.resize(at + take);
        if (absl::Status s = body.Read(value.data() + at, take); !s.ok()) return s;
      }
      *handed_over += value_len;
      absl::Status staged = sink_->Entry(peer, header.put_id, key, std::move(value));
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
  const std::shared_ptr<StageSink> sink_;  // null: stage requests are refused
  std::unique_ptr<Listener> listener_;
  const TimePoint epoch_;
  LinkPacer fast_, slow_;
  StopSignal stop_;
  int epoll_fd_ = -1;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_;  // by id: oldest first
  std::list<std::shared_ptr<Conn>> dedicated_;       // fd-less: until their thread is joined
  std::deque<std::shared_ptr<Conn>> ready_;          // bounded by conns_
  std::condition_variable ready_cv_;
  uint64_t next_id_ = 1;
  int established_ = 0;
  std::map<std::string, int> established_by_owner_;  // established connections per PeerInfo::Owner()
  int pending_ = 0;
  int64_t dropped_pending_ = 0;
  std::vector<std::thread> workers_;
  std::thread watcher_thread_;
  std::thread accept_thread_;
};

}  // namespace

std::shared_ptr<StageSink> MakeStagerSink(BlobStager stager) {
  return std::make_shared<StagerSink>(std::move(stager));
}

absl::StatusOr<std::unique_ptr<DataPlaneServer>> StartStreamServer(
    const DataPlaneServerOptions& options, BlobLookup lookup, std::shared_ptr<StageSink> sink,
    std::unique_ptr<Listener> listener) {
  return std::unique_ptr<DataPlaneServer>(
      new StreamServer(options, std::move(lookup), std::move(sink), std::move(listener)));
}

}  // namespace vc::transport::internal
