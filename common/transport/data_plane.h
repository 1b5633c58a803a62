// The KV data plane: moves chunk bytes between vc-kvstore and the workers
// (DESIGN.md section 7). The store runs a DataPlaneServer over its Get (and
// its two-phase put's Stage); verifiers and drafters hold a DataPlaneClient,
// Fetch keys by value, and Stage the chunks of a put they ingest. gRPC keeps
// the control part of a put (BeginPut returns the put id, CommitPut/AbortPut
// by id); only the bytes travel here.
//
// Two backends behind one interface, chosen by name ("kind"):
//   "tcp"  plain sockets with a small length-prefixed framing (the default).
//   "ucx"  UCX (UCP stream API over a sockaddr listener/endpoints, one worker
//          with a progress thread, peer error handling so a dead peer fails
//          in-flight fetches and stages instead of hanging).
// Both speak the same framing (internal/wire.h: magic, version, fetch
// request = link class + keys, stage request = link class + put id +
// entries, response = status + value bytes) and share the server-side pacing.
//
// Link pacing: the server passes every byte of a link class through one token
// bucket (store<->verifier = fast, store<->drafter = slow). Responses are
// paced as they are sent; stage uploads as they are received (the server
// takes a piece's tokens before it reads the piece), so one link's capacity
// is shared by fetches and stages in both directions, and all of them show
// up in the same counters. Bytes are counted per time slot ("what the link
// carried in slot k"), the same slots the scheduler books, so a test or a
// dashboard can hold the two side by side.
//
// UCX's own counters: Debian's UCX 1.13 is built without statistics
// (`ucx_info -b` lists no ENABLE_STATS), so ClientStats::transport_bytes
// counts the lengths UCX itself reports in its stream receive completions
// (the `length` of ucp_stream_recv_nbx), and transport_bytes_sent the lengths
// of its completed stream sends (a send completes as a whole, so that is the
// buffer handed to ucp_stream_send_nbx, counted only once UCX reports it
// done). For TCP they are the sums of what recv() / send() returned. All
// include the framing bytes, so they are >= the value bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace vc::transport {

// store<->verifier (fast) and store<->drafter (slow).
enum class LinkClass { kFast, kSlow };
const char* LinkClassName(LinkClass link);  // "fast" / "slow"

struct LinkPacing {
  // Bandwidth of the link class in bytes per second; 0 = unpaced. Every
  // fetch and stage on the link class shares one bucket.
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
  // Every byte the link carried, both ways (framing included): responses
  // sent, and stage requests received from their header on.
  int64_t bytes_total = 0;
  int64_t bytes_received = 0;  // of bytes_total: the stage uploads
  int64_t fetches = 0;         // fetch responses sent (errors included)
  int64_t stages = 0;          // stage requests answered (errors included)
  // Seconds the link was busy. Paced: the transmission time the bucket
  // charged (bytes / bytes_per_second). Unpaced: wall time during which at
  // least one exchange on the link class was in progress.
  double busy_seconds = 0;
  double capacity_bytes_per_second = 0;  // the configured pacing; 0 = unpaced
  LinkSlotCounters slots;
};

// Who is on the other end of a server connection.
struct PeerInfo {
  std::string address;  // the peer's IP address ("" where the backend cannot tell, e.g. UCX)
  // The authenticated identity: "cert:<subject CN>" of the client's verified
  // certificate under TLS; empty on a plaintext data plane.
  std::string identity;
  // The identity a resource opened by this peer belongs to: the
  // authenticated identity if there is one, else "addr:" + address. The
  // store's control plane derives the same string for a gRPC caller, so a
  // put begun there can be staged here by the same peer and nobody else.
  std::string Owner() const;
};

// What the server serves: the store's Get (NotFound for a missing key). Called
// from the server's connection threads, concurrently.
using BlobLookup = std::function<absl::StatusOr<std::string>(const std::string& key)>;

// Where staged entries go: the store's Stage(put_id, key, value) of a
// two-phase put. Called from the server's connection threads, concurrently,
// once per entry as it arrives. An error fails the stage request with the
// same code (the message names the key); the rest of its body is read and
// dropped.
using BlobStager =
    std::function<absl::Status(uint64_t put_id, const std::string& key, std::string value)>;

// A stage's sink with admission: the store's side of an upload.
class StageSink {
 public:
  virtual ~StageSink() = default;
  // Called once per stage request from its header alone, before any body
  // byte is read or any buffer allocated: may `peer` upload `body_bytes`
  // into `put_id` (the put exists, is the peer's, and the staging budget
  // holds the body — reserved until End)? A refusal is sent back as is and
  // the body is dropped (or the connection closed if the body is large).
  [[nodiscard]] virtual absl::Status Begin(const PeerInfo& peer, uint64_t put_id,
                                           uint64_t body_bytes) = 0;
  // One entry of an admitted stage, as it lands; an error ends the stage
  // with that code (the message naming the key).
  [[nodiscard]] virtual absl::Status Entry(const PeerInfo& peer, uint64_t put_id,
                                           const std::string& key, std::string value) = 0;
  // Ends an admitted stage; `unused_bytes` = body bytes admitted but not
  // handed over as values (framing, a failure part way).
  virtual void End(const PeerInfo& peer, uint64_t put_id, uint64_t unused_bytes) = 0;
};

// Mutual TLS on the "tcp" backend: the same three PEM files as the daemon's
// gRPC mutual TLS (--tls-cert, --tls-key, --tls-ca). All empty = plaintext;
// otherwise all three are required. TLS 1.3 only; both ends present a
// certificate chaining to the CA (the server verifies the client's before
// it reads any request byte; the client checks the server's against the
// host of server_address: its IP or DNS SAN). The files are re-read when
// one of their mtimes changes, for new connections. The "ucx" backend does
// not support it yet (Create fails with InvalidArgument).
struct DataPlaneTlsOptions {
  std::string cert_file;  // this end's certificate chain (PEM)
  std::string key_file;   // its private key (PEM)
  std::string ca_file;    // the cluster CA the peer's certificate must chain to
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// The backends Create accepts, e.g. {"tcp", "ucx"}.
std::vector<std::string> DataPlaneKinds();

struct DataPlaneServerOptions {
  std::string kind = "tcp";  // "tcp" | "ucx"
  // HOST:PORT to listen on; port 0 picks a free port (see address()).
  std::string listen = "127.0.0.1:0";
  LinkPacing fast, slow;
  double slot_seconds = 0.05;    // width of the per-slot counters, seconds
  int max_tracked_slots = 4096;  // counter history kept per link (oldest dropped)
  // Connections that sent at least one valid request, held at once. When a
  // new one is admitted past it, the one idle longest is closed (if every
  // one is busy, the new one is closed). Default 256.
  int max_connections = 256;
  // Established connections of one identity (PeerInfo::Owner(): the
  // certificate's under TLS, else the peer's address), held at once: past
  // it the idlest of that identity's own is closed (if all of them are
  // busy, the new one is), so one worker cannot take the places of the
  // others. Clamped to max_connections. Default 64.
  int max_connections_per_identity = 64;
  // Connections that have not yet sent a valid request (not authenticated,
  // once the data plane authenticates), held at once, separately from
  // max_connections: past it the oldest of them is dropped, so a flood of
  // silent sockets cannot lock out a worker's new connection. Default 64.
  int max_pending_connections = 64;
  // A new connection must deliver its first request header within this
  // many seconds (the handshake deadline), and every request header must
  // arrive whole within it once its first byte has. In (0, 2]. Default 2.
  double handshake_timeout_seconds = 2;
  // A connection idle (between requests) this long is closed. Default 60.
  double idle_timeout_seconds = 60;
  // Threads that serve requests. A connection holds one only while a
  // request is being read or answered, never while idle or waiting for its
  // first byte (TCP: readiness is watched by one epoll thread). Default 16.
  int worker_threads = 16;
  // Cap on the deadline a client sends with a request (its timeout_ms),
  // seconds. Default 600.
  double max_request_seconds = 600;
  int max_keys_per_fetch = 1024;
  int max_key_bytes = 1024;  // longest key accepted (fetch and stage)
  // Entries in one stage request. Default 1024.
  int max_entries_per_stage = 1024;
  // Body bytes of one stage request (entries with their framing); checked
  // from the header, before anything is allocated or staged: a larger stage
  // fails with ResourceExhausted. Default 1 GiB.
  int64_t max_stage_body_bytes = int64_t{1} << 30;
  // Sum of value bytes in one response; larger fetches fail with
  // ResourceExhausted before any value is sent. Default 1 GiB.
  int64_t max_response_bytes = int64_t{1} << 30;
  // Size of one paced write (or paced read of an upload): the granularity of
  // the bucket and the slack in the per-slot bound. Default 64 KiB.
  int64_t write_piece_bytes = int64_t{64} << 10;
  // A request must arrive whole within this many seconds of its first byte;
  // a stage body, whose paced upload may take longer, must instead make
  // progress (one piece) within it. A response, and a stage as a whole, is
  // bounded by the deadline the client sends with its request (or by this,
  // for a request without one). Default 30.
  double io_timeout_seconds = 30;
  // Mutual TLS; empty = plaintext. With it, a connection is pending until
  // its TLS handshake (driven without blocking: it never holds a worker
  // while the peer is silent) and its first request header are done, both
  // within handshake_timeout_seconds, and PeerInfo::identity is the
  // client certificate's "cert:<CN>".
  DataPlaneTlsOptions tls;
};

class DataPlaneServer {
 public:
  // Starts serving `lookup` (fetches) and `stager` (stages) per `options`.
  // Without a stager, stage requests fail with Unimplemented. InvalidArgument
  // for bad options or an unknown kind (the message lists the kinds);
  // Unavailable if the address cannot be bound or UCX cannot start.
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Create(
      const DataPlaneServerOptions& options, BlobLookup lookup, BlobStager stager = nullptr);
  // The same, with a sink that admits each stage from its header (put id,
  // owner and budget checked before the body is read).
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Create(
      const DataPlaneServerOptions& options, BlobLookup lookup, std::shared_ptr<StageSink> sink);
  // Stops serving, fails in-flight responses, closes peers, joins threads.
  virtual ~DataPlaneServer();

  virtual std::string kind() const = 0;
  virtual std::string address() const = 0;  // "HOST:PORT" actually bound
  virtual LinkStats Stats(LinkClass link) const = 0;
  virtual std::chrono::steady_clock::time_point epoch() const = 0;
  // Connections held now: established (sent a valid request) and pending.
  virtual int established_connections() const = 0;
  virtual int pending_connections() const = 0;
};

struct DataPlaneClientOptions {
  std::string kind = "tcp";    // must match the server's
  std::string server_address;  // HOST:PORT of the server's data plane (required)
  LinkClass link =
      LinkClass::kFast;  // link (and pacing bucket) of this client's fetches and stages
  // Sum of value bytes this client accepts in one response. Default 1 GiB.
  int64_t max_response_bytes = int64_t{1} << 30;
  // Connections held at once (concurrent Fetch / Stage calls beyond wait for
  // one, within their deadline). Default 8.
  int max_connections = 8;
  // Mutual TLS; empty = plaintext. Must match the server's.
  DataPlaneTlsOptions tls;
};

struct ClientStats {
  int64_t fetches = 0;       // successful fetches
  int64_t bytes = 0;         // value bytes returned by successful fetches
  int64_t stages = 0;        // successful stages
  int64_t staged_bytes = 0;  // value bytes sent by successful stages
  // Bytes the transport itself reported received (UCX: stream receive
  // completion lengths; TCP: recv() results), framing included.
  int64_t transport_bytes = 0;
  // Bytes the transport itself reported sent, requests of both kinds (UCX:
  // lengths of completed stream sends; TCP: send() results), framing
  // included; failed calls count what went out before they failed.
  int64_t transport_bytes_sent = 0;
};

// Thread-safe: concurrent Fetch / Stage calls run on separate connections.
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
  // Uploads `entries` (key, value) into the open put `put_id` on the server
  // (the store's two-phase put; they stay invisible until the put commits).
  // Errors as for Fetch, plus the stager's own (same code, the message
  // naming the key), Unimplemented if the server takes no stages,
  // ResourceExhausted / InvalidArgument if it refuses the request's size.
  // After an error some entries may have been staged: abort the put. Unlike
  // a fetch, a stage whose pooled connection turns out dead is not repeated
  // on a fresh one (Unavailable): the put may have died with a restarted
  // server, so the writer starts the whole put again.
  // (A span, so a writer can send a large put in slices without copies.)
  virtual absl::Status Stage(uint64_t put_id,
                             absl::Span<const std::pair<std::string, std::string>> entries,
                             std::chrono::steady_clock::time_point deadline) = 0;
  virtual ClientStats stats() const = 0;
};

}  // namespace vc::transport
