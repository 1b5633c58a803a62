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
    const auto now = Clock::now();
    // "No deadline" callers pass far-future times; keep the waits' arithmetic
    // away from overflow.
    deadline = std::min(deadline, now + std::chrono::hours(24 * 30));
    if (now >= deadline)
      return absl::DeadlineExceededError("data plane fetch: deadline already passed");
    const int64_t timeout_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    auto request = EncodeRequest(
        keys, options_.link,
        static_cast<uint32_t>(std::min<int64_t>(timeout_ms, std::numeric_limits<uint32_t>::max())),
        static_cast<uint64_t>(options_.max_response_bytes));
    if (!request.ok()) return request.status();

    // A pooled connection may have died while idle (server restarted); the
    // fetch then retries once on a fresh one if the peer had said nothing.
    for (int attempt = 0;; ++attempt) {
      bool reused = false;
      auto conn = Acquire(deadline, &reused);
      if (!conn.ok()) return conn.status();
      const int64_t before = (*conn)->reader->bytes_received();
      // Kept only after a complete exchange (a refusal by the server is one;
      // transport errors and deadlines leave the framing out of step).
      bool in_step = false;
      auto values = FetchOn(conn->get(), *request, keys, deadline, &in_step);
      const bool quiet = (*conn)->reader->bytes_received() == before;
      Release(std::move(*conn), in_step);
      if (values.ok()) {
        int64_t bytes = 0;
        for (const std::string& v : *values) bytes += static_cast<int64_t>(v.size());
        fetches_.fetch_add(1);
        bytes_.fetch_add(bytes);
        return values;
      }
      if (reused && quiet && attempt == 0 && absl::IsUnavailable(values.status()) &&
          Clock::now() < deadline) {
        continue;
      }
      return values.status();
    }
  }

  ClientStats stats() const override {
    ClientStats s;
    s.fetches = fetches_.load();
    s.bytes = bytes_.load();
    s.transport_bytes = transport_bytes_.load();
    return s;
  }

 private:
  absl::StatusOr<std::unique_ptr<Connection>> Acquire(TimePoint deadline, bool* reused) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool ready = cv_.wait_until(
          lock, deadline, [&] { return !idle_.empty() || open_ < options_.max_connections; });
      if (!ready) {
        return absl::DeadlineExceededError(absl::StrCat(
            "data plane fetch: all ", options_.max_connections, " connections stayed busy"));
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

  const DataPlaneClientOptions options_;
  std::unique_ptr<Connector> connector_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> idle_;
  int open_ = 0;
  std::atomic<int64_t> transport_bytes_{0};  // live, in-flight fetches included
  std::atomic<int64_t> fetches_{0};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace

std::unique_ptr<DataPlaneClient> MakeStreamClient(const DataPlaneClientOptions& options,
                                                  std::unique_ptr<Connector> connector) {
  return std::make_unique<StreamClient>(options, std::move(connector));
}

}  // namespace vc::transport::internal
