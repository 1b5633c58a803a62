// The data plane server's decoding of what a client sends (wire.h): request
// headers, fetch bodies and streamed stage bodies, several requests per
// connection. The input is the byte stream a client sends; the real
// StreamServer reads it through an in-memory connection, answers fetches
// from a small fake store and stages into a fake stager. Small limits make
// the refusal paths (too many keys, long keys, oversized bodies) reachable.
// Invariants beyond "no crash, no hang": the server closes the connection
// once the bytes run out, and a stage never hands the stager a key longer
// than max_key_bytes or a value larger than the body it came in.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/transport/data_plane.h"
#include "common/transport/internal/stream_server.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/memory_stream.h"

namespace vc::fuzz {
namespace {

using transport::internal::ByteStream;
using transport::internal::Listener;

constexpr int kMaxKeyBytes = 64;
constexpr int64_t kMaxStageBody = 64 << 10;

// Hands out one connection, then none (each Accept waits a moment so the
// accept loop does not spin).
class OneConnectionListener : public Listener {
 public:
  explicit OneConnectionListener(std::unique_ptr<ByteStream> stream) : stream_(std::move(stream)) {}
  absl::StatusOr<std::unique_ptr<ByteStream>> Accept(std::chrono::milliseconds) override {
    if (stream_ != nullptr) return std::move(stream_);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    return std::unique_ptr<ByteStream>();
  }
  std::string address() const override { return "memory:0"; }

 private:
  std::unique_ptr<ByteStream> stream_;
};

}  // namespace
}  // namespace vc::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  namespace tp = vc::transport;
  auto peer = std::make_shared<PeerBytes>();
  Input in(data, size);
  peer->piece = 1 + in.U8() % 64 * 64;  // 1..4033-byte reads
  peer->bytes = in.Rest();

  tp::DataPlaneServerOptions options;
  options.max_keys_per_fetch = 16;
  options.max_key_bytes = kMaxKeyBytes;
  options.max_entries_per_stage = 16;
  options.max_stage_body_bytes = kMaxStageBody;
  options.max_response_bytes = 64 << 10;
  options.write_piece_bytes = 1024;
  options.io_timeout_seconds = 5;

  // The fake store: keys starting with 'N' are missing, others map to a
  // value whose length the key's second byte chooses.
  tp::BlobLookup lookup = [](const std::string& key) -> absl::StatusOr<std::string> {
    if (!key.empty() && key[0] == 'N') return absl::NotFoundError("no such key");
    const size_t len = key.size() > 1 ? static_cast<uint8_t>(key[1]) * 16u : 3u;
    return std::string(len, 'v');
  };
  std::atomic<bool> violated{false};
  tp::BlobStager stager = [&violated](uint64_t, const std::string& key,
                                      std::string value) -> absl::Status {
    if (key.size() > static_cast<size_t>(kMaxKeyBytes) ||
        value.size() > static_cast<size_t>(kMaxStageBody)) {
      violated = true;
    }
    if (!key.empty() && key[0] == 'F') return absl::FailedPreconditionError("put is not open");
    return absl::OkStatus();
  };

  auto stream = std::make_unique<MemoryStream>(peer);
  auto server = vc::transport::internal::StartStreamServer(
      options, lookup, vc::transport::internal::MakeStagerSink(stager),
      std::make_unique<OneConnectionListener>(std::move(stream)));
  VC_FUZZ_CHECK(server.ok(), "the server starts");
  peer->WaitClosed(1);  // the serving thread has ended: every byte was handled
  server->reset();
  VC_FUZZ_CHECK(!violated.load(), "the stager got a key or value over the limits");
  return 0;
}
