#include "common/transport/internal/stream_client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/internal/wire.h"

namespace vc::transport::internal {
namespace {

struct Connection {
  std::unique_ptr<ByteStream> stream;
  std::unique_ptr<BufferedReader> reader;
};

class StreamClient : public DataPlaneClient {
 public:
  StreamClient(const DataPlaneClientOptions& options, std::unique_ptr<Connector> connector)
      : options_(options), connector_(std::move(connector)) {}

  ~StreamClient() override {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.clear();  // connections go before the connector (UCX: before the worker)
  }

  absl::StatusOr<std::vector<std::string>> Fetch(const std::vector<std::string>& keys,
                                                 TimePoint deadline) override {
    uint32_t timeout_ms = 0;
    if (absl::Status s = Bound(&deadline, &timeout_ms, "fetch"); !s.ok()) return s;
    auto request = EncodeRequest(keys, options_.link, timeout_ms,
                                 static_cast<uint64_t>(options_.max_response_bytes));
    if (!request.ok()) return request.status();
    auto values = RunExchange<std::vector<std::string>>(
        deadline, /*retry_stale=*/true, [&](Connection* conn, bool* in_step) {
          return FetchOn(conn, *request, keys, deadline, in_step);
        });
    if (values.ok()) {
      int64_t bytes = 0;
      for (const std::string& v : *values) bytes += static_cast<int64_t>(v.size());
      fetches_.fetch_add(1);
      bytes_.fetch_add(bytes);
    }
    return values;
  }

  absl::Status Stage(uint64_t put_id, absl::Span<const std::pair<std::string, std::string>> entries,
                     TimePoint deadline) override {
    if (entries.empty()) return absl::OkStatus();  // nothing to move
    uint32_t timeout_ms = 0;
    if (absl::Status s = Bound(&deadline, &timeout_ms, "stage"); !s.ok()) return s;
    auto body_bytes = StageBodyBytes(entries);
    if (!body_bytes.ok()) return body_bytes.status();
    const std::string header = EncodeStageHeader(
        put_id, options_.link, static_cast<uint32_t>(entries.size()), *body_bytes, timeout_ms);
    // Not repeated on a fresh connection: the put it belongs to may have
    // died with a restarted server (a new one could even have reused its
    // id). The writer starts the whole put again (StoreClient::PutAll).
    auto staged =
        RunExchange<int64_t>(deadline, /*retry_stale=*/false, [&](Connection* conn, bool* in_step) {
          return StageOn(conn, header, entries, deadline, in_step);
        });
    if (!staged.ok()) return staged.status();
    stages_.fetch_add(1);
    staged_bytes_.fetch_add(*staged);
    return absl::OkStatus();
  }

  ClientStats stats() const override {
    ClientStats s;
    s.fetches = fetches_.load();
    s.bytes = bytes_.load();
    s.stages = stages_.load();
    s.staged_bytes = staged_bytes_.load();
    s.transport_bytes = transport_bytes_.load();
    s.transport_bytes_sent = transport_bytes_sent_.load();
    return s;
  }

 private:
  // Caps a far-future deadline and derives the timeout sent to the server.
  // DeadlineExceeded if it has passed.
  static absl::Status Bound(TimePoint* deadline, uint32_t* timeout_ms, const char* what) {
    const auto now = Clock::now();
    // "No deadline" callers pass far-future times; keep the waits' arithmetic
    // away from overflow.
    *deadline = std::min(*deadline, now + std::chrono::hours(24 * 30));
    if (now >= *deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("data plane ", what, ": deadline already passed"));
    }
    const int64_t ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now).count() + 1;
    *timeout_ms =
        static_cast<uint32_t>(std::min<int64_t>(ms, std::numeric_limits<uint32_t>::max()));
    return absl::OkStatus();
  }

  // Runs one request/answer exchange `on(conn, &in_step)` on a pooled
  // connection. A pooled connection may have died while idle (server
  // restarted, or it closed idle connections); the other idle ones date from
  // before the same event, so they are closed too, and with `retry_stale`
  // the exchange is tried once more on a fresh connection if the peer had
  // said nothing.
  template <typename T, typename On>
  absl::StatusOr<T> RunExchange(TimePoint deadline, bool retry_stale, On&& on) {
    for (int attempt = 0;; ++attempt) {
      bool reused = false;
      auto conn = Acquire(deadline, &reused);
      if (!conn.ok()) return conn.status();
      const int64_t before = (*conn)->reader->bytes_received();
      // Kept only after a complete exchange (a refusal by the server is one;
      // transport errors and deadlines leave the framing out of step).
      bool in_step = false;
      absl::StatusOr<T> result = on(conn->get(), &in_step);
      const bool quiet = (*conn)->reader->bytes_received() == before;
      Release(std::move(*conn), in_step);
      if (result.ok()) return result;
      const bool stale = reused && quiet && absl::IsUnavailable(result.status());
      if (stale) DropIdle();
      if (stale && retry_stale && attempt == 0 && Clock::now() < deadline) continue;
      return result.status();
    }
  }

  // Closes every idle connection (see RunExchange).
  void DropIdle() {
    std::vector<std::unique_ptr<Connection>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dropped.swap(idle_);
      open_ -= static_cast<int>(dropped.size());
    }
    cv_.notify_all();
    for (auto& conn : dropped) conn->stream->Close();
  }

  absl::StatusOr<std::unique_ptr<Connection>> Acquire(TimePoint deadline, bool* reused) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool ready = cv_.wait_until(
          lock, deadline, [&] { return !idle_.empty() || open_ < options_.max_connections; });
      if (!ready) {
        return absl::DeadlineExceededError(
            absl::StrCat("data plane: all ", options_.max_connections, " connections stayed busy"));
      }
      if (!idle_.empty()) {
        auto conn = std::move(idle_.back());
        idle_.pop_back();
        *reused = true;
        return conn;
      }
      ++open_;
    }
    auto stream = connector_->Connect(deadline);
    if (!stream.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      --open_;
      cv_.notify_one();
      return stream.status();
    }
    auto conn = std::make_unique<Connection>();
    conn->stream = std::move(*stream);
    conn->reader = std::make_unique<BufferedReader>(conn->stream.get(), &transport_bytes_);
    conn->stream->ShareSentCounter(&transport_bytes_sent_);
    return conn;
  }

  void Release(std::unique_ptr<Connection> conn, bool keep) {
    std::unique_ptr<Connection> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (keep) {
        idle_.push_back(std::move(conn));
      } else {
        --open_;
        dropped = std::move(conn);
      }
    }
    cv_.notify_one();
    if (dropped != nullptr) dropped->stream->Close();
  }

  absl::StatusOr<std::vector<std::string>> FetchOn(Connection* conn, const std::string& request,
                                                   const std::vector<std::string>& keys,
                                                   TimePoint deadline, bool* in_step) {
    if (absl::Status s = conn->stream->Write(request, deadline); !s.ok()) return s;
    auto header = ReadAnswerHeader(conn, deadline, in_step);
    if (!header.ok()) return header.status();
    if (header->count != keys.size()) {
      return absl::DataLossError(
          absl::StrCat("fetch response has ", header->count, " values for ", keys.size(), " keys"));
    }
    std::vector<std::string> values(keys.size());
    int64_t budget = options_.max_response_bytes;
    for (std::string& value : values) {
      char len_bytes[kEntryHeaderBytes];
      if (absl::Status s = conn->reader->ReadExact(len_bytes, sizeof(len_bytes), deadline);
          !s.ok()) {
        return s;
      }
      const uint64_t len = GetU64(len_bytes);
      if (len > static_cast<uint64_t>(budget)) {
        return absl::ResourceExhaustedError(
            absl::StrCat("fetch response exceeds this client's max_response_bytes ",
                         options_.max_response_bytes));
      }
      budget -= static_cast<int64_t>(len);
      value.resize(len);
      if (absl::Status s = conn->reader->ReadExact(value.data(), len, deadline); !s.ok()) return s;
    }
    *in_step = true;
    return values;
  }

  // Reads an answer's header; a server error (its message read too, the
  // connection in step) comes back as that error.
  static absl::StatusOr<ResponseHeader> ReadAnswerHeader(Connection* conn, TimePoint deadline,
                                                         bool* in_step) {
    char header_bytes[kResponseHeaderBytes];
    if (absl::Status s = conn->reader->ReadExact(header_bytes, sizeof(header_bytes), deadline);
        !s.ok()) {
      return s;
    }
    auto header = DecodeResponseHeader(header_bytes);
    if (!header.ok()) return header.status();
    if (header->code != 0) {
      std::string message(header->message_bytes, '\0');
      if (absl::Status s = conn->reader->ReadExact(message.data(), message.size(), deadline);
          !s.ok()) {
        return s;
      }
      *in_step = true;
      return absl::Status(static_cast<absl::StatusCode>(header->code),
                          absl::StrCat("data plane server: ", message));
    }
    return header;
  }

  // Sends a stage request (header, then each entry's framing and value in
  // writes of at most kStageWriteBytes) and reads its answer. The value
  // bytes staged, or the error.
  absl::StatusOr<int64_t> StageOn(Connection* conn, const std::string& header,
                                  absl::Span<const std::pair<std::string, std::string>> entries,
                                  TimePoint deadline, bool* in_step) {
    std::string out = header;
    out.reserve(kStageWriteBytes);
    int64_t value_bytes = 0;
    auto flush = [&]() -> absl::Status {
      if (out.empty()) return absl::OkStatus();
      std::string piece;
      piece.reserve(kStageWriteBytes);
      piece.swap(out);
      return conn->stream->Write(std::move(piece), deadline);
    };
    absl::Status sent;
    for (const auto& [key, value] : entries) {
      out += EncodeStageEntryHead(key, value.size());
      value_bytes += static_cast<int64_t>(value.size());
      if (out.size() >= kStageWriteBytes) sent = flush();
      for (size_t at = 0; at < value.size() && sent.ok();) {
        const size_t take =
            std::min(value.size() - at, kStageWriteBytes - std::min(kStageWriteBytes, out.size()));
        out.append(value, at, take);
        at += take;
        if (out.size() >= kStageWriteBytes) sent = flush();
      }
      if (!sent.ok()) break;
    }
    if (sent.ok()) sent = flush();
    if (!sent.ok()) {
      // A server that refuses a request too large to drain answers, then
      // hangs up while we are still sending: report its answer if it came.
      if (absl::IsUnavailable(sent)) {
        const TimePoint grace = std::min(deadline, Clock::now() + kRefusalGrace);
        auto answer = ReadAnswerHeader(conn, grace, in_step);
        *in_step = false;
        if (!answer.ok() && !absl::IsUnavailable(answer.status()) &&
            !absl::IsDeadlineExceeded(answer.status())) {
          return answer.status();
        }
      }
      return sent;
    }
    auto answer = ReadAnswerHeader(conn, deadline, in_step);
    if (!answer.ok()) return answer.status();
    if (answer->count != entries.size()) {
      return absl::DataLossError(absl::StrCat("stage answer counts ", answer->count,
                                              " entries for ", entries.size(), " sent"));
    }
    *in_step = true;
    return value_bytes;
  }

  // Stage requests are sent in writes of this size (bounded copies, and few
  // transport operations).
  static constexpr size_t kStageWriteBytes = size_t{1} << 20;
  // How long a failed stage send waits for a refusal the server may have sent.
  static constexpr std::chrono::milliseconds kRefusalGrace{200};

  const DataPlaneClientOptions options_;
  std::unique_ptr<Connector> connector_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> idle_;
  int open_ = 0;
  std::atomic<int64_t> transport_bytes_{0};       // live, in-flight exchanges included
  std::atomic<int64_t> transport_bytes_sent_{0};  // live, in-flight exchanges included
  std::atomic<int64_t> fetches_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> stages_{0};
  std::atomic<int64_t> staged_bytes_{0};
};

}  // namespace

std::unique_ptr<DataPlaneClient> MakeStreamClient(const DataPlaneClientOptions& options,
                                                  std::unique_ptr<Connector> connector) {
  return std::make_unique<StreamClient>(options, std::move(connector));
}

}  // namespace vc::transport::internal
