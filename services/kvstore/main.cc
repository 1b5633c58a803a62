// `vc-kvstore`: the KV chunk store daemon (DESIGN.md section 7): gRPC
// control plane (vericache.v1.KvStore), a data plane (TCP or UCX) that
// workers fetch chunk bytes over and upload the chunks of their puts over
// (staged into the put named by the control plane's BeginPut), paced per
// link class, grpc.health.v1, and
// Prometheus /metrics, on the shared daemon runner (services/common/daemon.h).
// SIGTERM/SIGINT drain: health goes NOT_SERVING, the server shuts down with a
// deadline, exit 0.
// Exit codes: 0 ok, 1 runtime failure, 2 bad flags.
#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/flags.h"
#include "common/kvstore/kv_store.h"
#include "common/kvstore/seal.h"
#include "common/metrics/metrics.h"
#include "common/rpc/rpc.h"
#include "common/transport/data_plane.h"
#include "services/common/daemon.h"
#include "services/kvstore/kvstore_service.h"

namespace {

constexpr char kName[] = "vc-kvstore";
constexpr char kVersion[] = "0.1.0";

struct Options {
  vc::daemon::ServerOptions server;
  std::string data_dir;
  int64_t disk_budget_bytes = int64_t{64} << 30;
  int64_t dram_budget_bytes = int64_t{1} << 30;
  int64_t ttl_seconds = 0;
  std::string data_plane = "tcp";
  std::string data_listen = "127.0.0.1:7071";
  double fast_link_bytes_per_second = 0;
  double slow_link_bytes_per_second = 0;
  double fast_link_latency_ms = 0;
  double slow_link_latency_ms = 0;
  double link_slot_seconds = 0.05;
  int64_t put_lease_seconds = 120;
  int64_t max_staged_bytes = int64_t{1} << 30;
  int64_t max_staged_bytes_per_identity = int64_t{512} << 20;
  double data_idle_timeout_seconds = 60;
  double data_handshake_timeout_seconds = 2;
  int64_t data_max_connections = 256;
  int64_t data_max_connections_per_identity = 64;
  int64_t data_max_pending_connections = 64;
  int64_t data_worker_threads = 16;
  double data_max_request_seconds = 600;
  std::string seal_trust;
};

int BadFlags(const std::string& message) { return vc::daemon::BadFlags(kName, message); }
int Fail(const std::string& message) { return vc::daemon::Fail(kName, message); }

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  opts.server.name = kName;
  opts.server.version = kVersion;
  opts.server.listen = "127.0.0.1:7070";
  opts.server.metrics_listen = "127.0.0.1:9470";
  vc::FlagSet flags(kName, "VeriCache KV chunk store daemon: RocksDB + DRAM tiers, gRPC control plane, TCP/UCX data plane.");
  flags.Add("--listen", &opts.server.listen, "HOST:PORT", "gRPC address (port 0 picks a free one)");
  flags.Add("--data-dir", &opts.data_dir, "DIR", "RocksDB directory (required)");
  flags.Add("--disk-budget-bytes", &opts.disk_budget_bytes, "N", "bytes of values kept on disk");
  flags.Add("--dram-budget-bytes", &opts.dram_budget_bytes, "N",
            "bytes of values cached in DRAM (0 disables)");
  flags.Add("--ttl-seconds", &opts.ttl_seconds, "N", "expire entries after N seconds (0: never)");
  flags.Add("--metrics-listen", &opts.server.metrics_listen, "HOST:PORT",
            "Prometheus /metrics address (port 0 picks one; empty disables)");
  flags.Add("--max-message-bytes", &opts.server.max_message_bytes, "N",
            "largest gRPC message sent or received");
  flags.Add("--data-plane", &opts.data_plane, "tcp|ucx", "transport for chunk bytes");
  flags.Add("--data-listen", &opts.data_listen, "HOST:PORT",
            "data plane address (port 0 picks a free one)");
  flags.Add("--fast-link-bytes-per-second", &opts.fast_link_bytes_per_second, "N",
            "pace the store<->verifier link, fetches and uploads (0: unpaced)");
  flags.Add("--slow-link-bytes-per-second", &opts.slow_link_bytes_per_second, "N",
            "pace the store<->drafter link, fetches and uploads (0: unpaced)");
  flags.Add("--fast-link-latency-ms", &opts.fast_link_latency_ms, "X",
            "latency added to each store->verifier response");
  flags.Add("--slow-link-latency-ms", &opts.slow_link_latency_ms, "X",
            "latency added to each store->drafter response");
  flags.Add("--link-slot-seconds", &opts.link_slot_seconds, "X",
            "width of the data plane's per-slot byte counters");
  flags.Add("--put-lease-seconds", &opts.put_lease_seconds, "N",
            "an open put not used for N seconds is discarded");
  flags.Add("--max-staged-bytes", &opts.max_staged_bytes, "N",
            "bytes staged (or reserved by uploads) in all open puts together");
  flags.Add("--max-staged-bytes-per-identity", &opts.max_staged_bytes_per_identity, "N",
            "of those, in the open puts of one identity (client certificate, else address)");
  flags.Add("--data-idle-timeout-seconds", &opts.data_idle_timeout_seconds, "X",
            "close a data plane connection idle this long");
  flags.Add("--data-handshake-timeout-seconds", &opts.data_handshake_timeout_seconds, "X",
            "a new data plane connection's first request header must arrive within X (<= 2)");
  flags.Add("--data-max-connections", &opts.data_max_connections, "N",
            "data plane connections that sent a valid request (the idlest is closed past it)");
  flags.Add("--data-max-connections-per-identity", &opts.data_max_connections_per_identity, "N",
            "of those, held by one identity (client certificate, else address): past it the "
            "idlest of its own is closed");
  flags.Add("--data-max-pending-connections", &opts.data_max_pending_connections, "N",
            "data plane connections yet to send a valid request (the oldest is dropped past it)");
  flags.Add("--data-worker-threads", &opts.data_worker_threads, "N",
            "threads serving data plane requests");
  flags.Add("--seal-trust", &opts.seal_trust, "FILE",
            "public keys (64 hex digits a line) whose seals KV entries must carry on commit "
            "and on disk reads (empty: entries are not checked)");
  flags.Add("--data-max-request-seconds", &opts.data_max_request_seconds, "X",
            "cap on the deadline a data plane client sends");
  // gRPC control port and data plane: mutual TLS with the cluster CA; the
  // same files on both planes, so both name a put's owner by one certificate.
  vc::daemon::AddTlsFlags(flags, &opts.server.tls);
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return BadFlags(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (opts.data_dir.empty()) return BadFlags("--data-dir is required");
  if (absl::Status s = vc::daemon::ValidateServerOptions(opts.server); !s.ok()) {
    return BadFlags(std::string(s.message()));
  }
  if (opts.disk_budget_bytes <= 0) return BadFlags("--disk-budget-bytes must be > 0");
  if (opts.dram_budget_bytes < 0) return BadFlags("--dram-budget-bytes must be >= 0");
  if (opts.ttl_seconds < 0) return BadFlags("--ttl-seconds must be >= 0");
  if (opts.fast_link_bytes_per_second < 0 || opts.slow_link_bytes_per_second < 0) {
    return BadFlags("link bandwidths must be >= 0");
  }
  if (opts.fast_link_latency_ms < 0 || opts.slow_link_latency_ms < 0) {
    return BadFlags("link latencies must be >= 0");
  }
  if (!(opts.link_slot_seconds > 0)) return BadFlags("--link-slot-seconds must be > 0");
  if (opts.put_lease_seconds <= 0 || opts.put_lease_seconds > INT_MAX) {
    return BadFlags("--put-lease-seconds must be in [1, 2^31)");
  }
  if (opts.max_staged_bytes <= 0 || opts.max_staged_bytes_per_identity <= 0) {
    return BadFlags("--max-staged-bytes and --max-staged-bytes-per-identity must be > 0");
  }
  if (!(opts.data_idle_timeout_seconds > 0)) {
    return BadFlags("--data-idle-timeout-seconds must be > 0");
  }
  if (!(opts.data_handshake_timeout_seconds > 0 && opts.data_handshake_timeout_seconds <= 2)) {
    return BadFlags("--data-handshake-timeout-seconds must be in (0, 2]");
  }
  if (opts.data_max_connections < 1 || opts.data_max_connections > 65536 ||
      opts.data_max_pending_connections < 1 || opts.data_max_pending_connections > 65536) {
    return BadFlags("--data-max-connections and --data-max-pending-connections must be in [1, 65536]");
  }
  if (opts.data_max_connections_per_identity < 1 ||
      opts.data_max_connections_per_identity > 65536) {
    return BadFlags("--data-max-connections-per-identity must be in [1, 65536]");
  }
  if (opts.data_worker_threads < 1 || opts.data_worker_threads > 1024) {
    return BadFlags("--data-worker-threads must be in [1, 1024]");
  }
  if (!(opts.data_max_request_seconds > 0)) {
    return BadFlags("--data-max-request-seconds must be > 0");
  }
  {
    const auto kinds = vc::transport::DataPlaneKinds();
    if (std::find(kinds.begin(), kinds.end(), opts.data_plane) == kinds.end()) {
      return BadFlags(absl::StrCat("--data-plane: unknown '", opts.data_plane,
                                   "' (choose from: ", absl::StrJoin(kinds, ", "), ")"));
    }
  }
  vc::daemon::InstallCrashReporter(argv[0]);
  vc::daemon::BlockDrainSignals();

  vc::kvstore::KvStoreOptions store_opts;
  store_opts.path = opts.data_dir;
  store_opts.disk_budget_bytes = opts.disk_budget_bytes;
  store_opts.dram_budget_bytes = opts.dram_budget_bytes;
  store_opts.ttl_seconds = opts.ttl_seconds;
  store_opts.put_lease_seconds = opts.put_lease_seconds;
  store_opts.max_staged_bytes = opts.max_staged_bytes;
  store_opts.max_staged_bytes_per_identity = opts.max_staged_bytes_per_identity;
  // The registry outlives the store (declared first), so the latency
  // observers may record into it.
  vc::metrics::Registry registry;
  auto read_hist = registry.AddHistogram("vericache_kvstore_rocksdb_read_seconds",
                                         "Seconds per value read from RocksDB (DRAM misses).", {},
                                         {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1});
  auto write_hist = registry.AddHistogram("vericache_kvstore_rocksdb_write_seconds",
                                          "Seconds per committed RocksDB write batch (fsync included).",
                                          {}, {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1});
  if (!read_hist.ok() || !write_hist.ok()) return Fail("cannot register the RocksDB histograms");
  vc::metrics::Histogram* read_seconds = &(*read_hist)->Get();
  vc::metrics::Histogram* write_seconds = &(*write_hist)->Get();
  store_opts.on_disk_read = [read_seconds](double s) { read_seconds->Observe(s); };
  store_opts.on_disk_write = [write_seconds](double s) { write_seconds->Observe(s); };
  if (!opts.seal_trust.empty()) {
    auto trust = vc::kvstore::SealTrust::FromFile(opts.seal_trust);
    if (!trust.ok()) return BadFlags(absl::StrCat("--seal-trust: ", trust.status().message()));
    auto shared = std::make_shared<const vc::kvstore::SealTrust>(std::move(*trust));
    // The store holds public keys only: it can refuse a forged entry, never
    // make one.
    store_opts.check_entry = [shared](const std::string& key, const std::string& value) {
      return vc::kvstore::CheckStoredEntry(*shared, key, value);
    };
  }
  auto store = vc::kvstore::KvStore::Open(store_opts);
  if (!store.ok()) return Fail(store.status().ToString());

  vc::kvstore::KvStoreService service(store->get(), &registry);

  vc::transport::DataPlaneServerOptions dp_opts;
  dp_opts.kind = opts.data_plane;
  dp_opts.listen = opts.data_listen;
  dp_opts.fast.bytes_per_second = opts.fast_link_bytes_per_second;
  dp_opts.slow.bytes_per_second = opts.slow_link_bytes_per_second;
  dp_opts.fast.latency_seconds = opts.fast_link_latency_ms / 1000.0;
  dp_opts.slow.latency_seconds = opts.slow_link_latency_ms / 1000.0;
  dp_opts.slot_seconds = opts.link_slot_seconds;
  dp_opts.idle_timeout_seconds = opts.data_idle_timeout_seconds;
  dp_opts.handshake_timeout_seconds = opts.data_handshake_timeout_seconds;
  dp_opts.max_connections = static_cast<int>(opts.data_max_connections);
  dp_opts.max_pending_connections = static_cast<int>(opts.data_max_pending_connections);
  dp_opts.max_connections_per_identity = static_cast<int>(opts.data_max_connections_per_identity);
  dp_opts.worker_threads = static_cast<int>(opts.data_worker_threads);
  dp_opts.max_request_seconds = opts.data_max_request_seconds;
  dp_opts.tls = {opts.server.tls.cert, opts.server.tls.key, opts.server.tls.ca};
  vc::kvstore::KvStore* raw_store = store->get();
  // Fetches read the store; uploads are admitted from their header (the
  // put is the peer's, its budget reserved) and go through the service's
  // staging path (the StageChunk RPC's validation and metrics).
  auto data_plane = vc::transport::DataPlaneServer::Create(
      dp_opts, [raw_store](const std::string& key) { return raw_store->Get(key); },
      service.DataPlaneSink());
  if (!data_plane.ok()) return Fail(data_plane.status().ToString());
  service.AttachDataPlane(data_plane->get());

  // Data-plane traffic bypasses the RPCs: refresh its metrics on a timer.
  std::mutex refresher_mu;
  std::condition_variable refresher_cv;
  bool stopping = false;
  std::thread refresher([&] {
    std::unique_lock<std::mutex> lock(refresher_mu);
    while (!refresher_cv.wait_for(lock, std::chrono::seconds(1), [&] { return stopping; })) {
      raw_store->ExpirePuts();  // abandoned puts free their staging budget
      service.RefreshStoreMetrics();
    }
  });

  opts.server.listening_note = absl::StrCat("data ", opts.data_plane, " ", (*data_plane)->address());
  auto server = vc::daemon::Server::Start(opts.server, {&service}, &registry);
  auto stop_refresher = [&] {
    {
      std::lock_guard<std::mutex> lock(refresher_mu);
      stopping = true;
    }
    refresher_cv.notify_all();
    refresher.join();
  };
  if (!server.ok()) {
    stop_refresher();
    return Fail(server.status().ToString());
  }
  // The data plane outlives the gRPC drain: a commit in flight may still be
  // waiting for its staged bytes.
  const int rc = (*server)->WaitForSignalAndDrain();
  stop_refresher();
  data_plane->reset();
  return rc;
}
