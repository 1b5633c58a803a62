// The data plane client's decoding of what a server answers (wire.h):
// response headers, error messages and fetch values. The input chooses a few
// fetches and stages (their key counts and sizes) and then is the byte
// stream the "server" sends back; the real StreamClient runs them over
// in-memory connections (a reconnect continues in the same bytes).
// Invariants beyond "no crash, no hang": a successful fetch returns one value
// per key, and never more value bytes than max_response_bytes.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/transport/data_plane.h"
#include "common/transport/internal/stream_client.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/memory_stream.h"

namespace vc::fuzz {
namespace {

class MemoryConnector : public transport::internal::Connector {
 public:
  explicit MemoryConnector(std::shared_ptr<PeerBytes> peer) : peer_(std::move(peer)) {}
  absl::StatusOr<std::unique_ptr<transport::internal::ByteStream>> Connect(
      transport::internal::TimePoint) override {
    if (++connects_ > 8) return absl::UnavailableError("connection refused");
    return std::unique_ptr<transport::internal::ByteStream>(std::make_unique<MemoryStream>(peer_));
  }

 private:
  std::shared_ptr<PeerBytes> peer_;
  int connects_ = 0;
};

constexpr int64_t kMaxResponseBytes = 16 << 10;

}  // namespace
}  // namespace vc::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  namespace tp = vc::transport;
  Input in(data, size);
  // The calls: up to 4, each a fetch or a stage of 1..8 short keys.
  struct Call {
    bool stage;
    std::vector<std::string> keys;
  };
  std::vector<Call> calls(1 + in.U8() % 4);
  for (Call& c : calls) {
    const uint8_t b = in.U8();
    c.stage = (b & 0x80) != 0;
    const int n = 1 + (b & 7);
    for (int i = 0; i < n; ++i) c.keys.push_back(std::string(1 + i % 3, static_cast<char>('a' + i)));
  }
  auto peer = std::make_shared<PeerBytes>();
  peer->piece = 1 + in.U8() % 64 * 64;
  peer->bytes = in.Rest();

  tp::DataPlaneClientOptions options;
  options.server_address = "memory:0";
  options.max_response_bytes = kMaxResponseBytes;
  options.max_connections = 2;
  auto client = vc::transport::internal::MakeStreamClient(
      options, std::make_unique<MemoryConnector>(peer));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (const Call& c : calls) {
    if (c.stage) {
      std::vector<std::pair<std::string, std::string>> entries;
      for (const std::string& k : c.keys) entries.emplace_back(k, std::string(k.size() * 5, 'x'));
      (void)client->Stage(7, entries, deadline);  // any status is fine; no crash or hang
    } else {
      auto values = client->Fetch(c.keys, deadline);
      if (values.ok()) {
        VC_FUZZ_CHECK(values->size() == c.keys.size(), "one value per key");
        int64_t bytes = 0;
        for (const std::string& v : *values) bytes += static_cast<int64_t>(v.size());
        VC_FUZZ_CHECK(bytes <= kMaxResponseBytes, "values within max_response_bytes");
      }
    }
  }
  return 0;
}
