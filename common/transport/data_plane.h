// The KV data plane: moves chunk bytes from vc-kvstore to the workers that
// fetch them (DESIGN.md section 7). The store runs a DataPlaneServer over its
// Get; verifiers and drafters hold a DataPlaneClient and Fetch keys by value.
//
// Two backends behind one interface, chosen by name ("kind"):
//   "tcp"  plain sockets with a small length-prefixed framing (the default).
//   "ucx"  UCX (UCP stream API over a sockaddr listener/endpoints, one worker
//          with a progress thread, peer error handling so a dead peer fails
//          in-flight fetches instead of hanging).
// Both speak the same framing (magic, version, request = link class + keys,
// response = status + value bytes) and share the server-side pacing.
//
// Link pacing: the server sends every response through a token bucket per
// link class (store->verifier = fast, store->drafter = slow). The bucket sits
// on the sender, so it models the store's shared NIC per link class: all
// fetches on one link class share its bandwidth. Bytes are counted per time
// slot ("what the link carried in slot k"), the same slots the scheduler
// books, so a test or a dashboard can hold the two side by side.
//
// UCX's own counters: Debian's UCX 1.13 is built without statistics
// (`ucx_info -b` lists no ENABLE_STATS), so ClientStats::transport_bytes
// counts the lengths UCX itself reports in its stream receive completions
// (the `length` of ucp_stream_recv_nbx). For TCP it is the sum of what read()
// returned. Both include the framing bytes, so they are >= the value bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::transport {

// store->verifier (fast) and store->drafter (slow).
enum class LinkClass { kFast, kSlow };
const char* LinkClassName(LinkClass link);  // "fast" / "slow"

struct LinkPacing {
  // Bandwidth of the link class in bytes per second; 0 = unpaced. Every
  // fetch on the link class shares one bucket.
  double bytes_per_second = 0;
  // One-way latency in seconds, added once per fetch response (before its
  // first byte leaves; it does not occupy the link). Default 0.
  double latency_seconds = 0;
};

// The data plane's own per-slot byte counters. Slot k covers
// [epoch + k*slot_seconds, epoch + (k+1)*slot_seconds) where epoch is
// DataPlaneServer::epoch(). A paced link never puts more than
// ceil(bytes_per_second * slot_seconds) + write_piece_bytes in one slot.
struct LinkSlotCounters {
  double slot_seconds = 0.05;
  int64_t first_slot = 0;  // absolute slot index of bytes_per_slot[0]
  std::vector<int64_t> bytes_per_slot;
};

struct LinkStats {
  int64_t bytes_total = 0;  // every byte sent on the link (framing included)
  int64_t fetches = 0;      // responses sent (errors included)
  // Seconds the link spent sending. Paced: the transmission time the bucket
  // charged (bytes / bytes_per_second). Unpaced: wall time during which at
  // least one response on the link class was being written.
  double busy_seconds = 0;
  double capacity_bytes_per_second = 0;  // the configured pacing; 0 = unpaced
  LinkSlotCounters slots;
};

// What the server serves: the store's Get (NotFound for a missing key). Called
// from the server's connection threads, concurrently.
using BlobLookup = std::function<absl::StatusOr<std::string>(const std::string& key)>;

// The backends Create accepts, e.g. {"tcp", "ucx"}.
std::vector<std::string> DataPlaneKinds();

struct DataPlaneServerOptions {
  std::string kind = "tcp";  // "tcp" | "ucx"
  // HOST:PORT to listen on; port 0 picks a free port (see address()).
  std::string listen = "127.0.0.1:0";
  LinkPacing fast, slow;
  double slot_seconds = 0.05;    // width of the per-slot counters, seconds
  int max_tracked_slots = 4096;  // counter history kept per link (oldest dropped)
  int max_connections = 256;     // open client connections; more are refused
  int max_keys_per_fetch = 1024;
  int max_key_bytes = 1024;  // longest key accepted
  // Sum of value bytes in one response; larger fetches fail with
  // ResourceExhausted before any value is sent. Default 1 GiB.
  int64_t max_response_bytes = int64_t{1} << 30;
  // Size of one paced write: the granularity of the bucket and the slack in
  // the per-slot bound. Default 64 KiB.
  int64_t write_piece_bytes = int64_t{64} << 10;
  // A request must arrive whole within this many seconds of its first byte.
  // A response is bounded by the deadline the client sends with its request
  // (or by this, for a request without one). Default 30.
  double io_timeout_seconds = 30;
};

class DataPlaneServer {
 public:
  // Starts serving `lookup` per `options`. InvalidArgument for bad options or
  // an unknown kind (the message lists the kinds); Unavailable if the address
  // cannot be bound or UCX cannot start.
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Create(
      const DataPlaneServerOptions& options, BlobLookup lookup);
  // Stops serving, fails in-flight responses, closes peers, joins threads.
  virtual ~DataPlaneServer();

  virtual std::string kind() const = 0;
  virtual std::string address() const = 0;  // "HOST:PORT" actually bound
  virtual LinkStats Stats(LinkClass link) const = 0;
  virtual std::chrono::steady_clock::time_point epoch() const = 0;
};

struct DataPlaneClientOptions {
  std::string kind = "tcp";           // must match the server's
  std::string server_address;         // HOST:PORT of the server's data plane (required)
  LinkClass link = LinkClass::kFast;  // link (and pacing bucket) of this client's fetches
  // Sum of value bytes this client accepts in one response. Default 1 GiB.
  int64_t max_response_bytes = int64_t{1} << 30;
  // Connections held at once (concurrent Fetch calls beyond wait for one,
  // within their deadline). Default 8.
  int max_connections = 8;
};

struct ClientStats {
  int64_t fetches = 0;  // successful fetches
  int64_t bytes = 0;    // value bytes returned by successful fetches
  // Bytes the transport itself reported received (UCX: stream receive
  // completion lengths; TCP: read() results), framing included.
  int64_t transport_bytes = 0;
};

// Thread-safe: concurrent Fetch calls run on separate connections.
class DataPlaneClient {
 public:
  // InvalidArgument for bad options or an unknown kind; Unavailable if UCX
  // cannot start. Connects lazily (on the first Fetch).
  static absl::StatusOr<std::unique_ptr<DataPlaneClient>> Create(
      const DataPlaneClientOptions& options);
  virtual ~DataPlaneClient();

  // Values of `keys`, same order. NotFound naming the (hex) key if one is
  // missing; InvalidArgument / ResourceExhausted if the server refuses the
  // request (too many keys, key too long, response over a max);
  // DeadlineExceeded at `deadline` (returns then, plus the moment closing the
  // abandoned connection takes, ~ms); Unavailable if the peer is gone (the
  // next call reconnects). A far-future deadline is capped at 30 days.
  virtual absl::StatusOr<std::vector<std::string>> Fetch(
      const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline) = 0;
  virtual ClientStats stats() const = 0;
};

}  // namespace vc::transport
