#include "common/transport/data_plane.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/transport/internal/auth_stream.h"
#include "common/transport/internal/backends.h"
#include "common/transport/internal/stream_client.h"
#include "common/transport/internal/stream_server.h"

namespace vc::transport {
namespace {

using internal::Connector;
using internal::Listener;

// The backend registry: a backend is a listener factory plus a connector
// factory; everything above the bytes is shared.
struct Backend {
  const char* kind;
  absl::StatusOr<std::unique_ptr<Listener>> (*listen)(const DataPlaneServerOptions&);
  absl::StatusOr<std::unique_ptr<Connector>> (*connect)(const DataPlaneClientOptions&);
};

constexpr Backend kBackends[] = {
    {"tcp", &internal::MakeTcpListener, &internal::MakeTcpConnector},
    {"ucx", &internal::MakeUcxListener, &internal::MakeUcxConnector},
};

absl::StatusOr<const Backend*> FindBackend(const std::string& kind) {
  for (const Backend& b : kBackends) {
    if (kind == b.kind) return &b;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data plane kind '", kind, "' (known: ", absl::StrJoin(DataPlaneKinds(), ", "), ")"));
}

absl::Status CheckPacing(const char* name, const LinkPacing& p) {
  if (!std::isfinite(p.bytes_per_second) || p.bytes_per_second < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " link bytes_per_second must be >= 0 (0 = unpaced), got ", p.bytes_per_second));
  }
  if (!std::isfinite(p.latency_seconds) || p.latency_seconds < 0 || p.latency_seconds > 60) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " link latency_seconds must be in [0, 60], got ", p.latency_seconds));
  }
  return absl::OkStatus();
}

// TLS needs all three files, and applies to the tcp backend only (UCX has
// no TLS; refusing beats silently running it unauthenticated).
absl::Status CheckTls(const std::string& kind, const DataPlaneTlsOptions& tls) {
  if (!tls.enabled()) return absl::OkStatus();
  if (tls.cert_file.empty() || tls.key_file.empty() || tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "data plane TLS needs all three of cert_file, key_file and ca_file (or none)");
  }
  (void)kind;  // tcp: TLS; ucx: the authenticated handshake + per-message MACs
  return absl::OkStatus();
}

absl::Status CheckServerOptions(const DataPlaneServerOptions& o) {
  if (absl::Status s = CheckPacing("fast", o.fast); !s.ok()) return s;
  if (absl::Status s = CheckPacing("slow", o.slow); !s.ok()) return s;
  if (!std::isfinite(o.slot_seconds) || o.slot_seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_seconds must be > 0, got ", o.slot_seconds));
  }
  if (o.max_tracked_slots < 1) return absl::InvalidArgumentError("max_tracked_slots must be >= 1");
  if (o.max_connections < 1) return absl::InvalidArgumentError("max_connections must be >= 1");
  if (o.max_connections_per_identity < 1) {
    return absl::InvalidArgumentError("max_connections_per_identity must be >= 1");
  }
  if (o.max_pending_connections < 1) {
    return absl::InvalidArgumentError("max_pending_connections must be >= 1");
  }
  if (o.worker_threads < 1 || o.worker_threads > 1024) {
    return absl::InvalidArgumentError("worker_threads must be in [1, 1024]");
  }
  if (!std::isfinite(o.handshake_timeout_seconds) || o.handshake_timeout_seconds <= 0 ||
      o.handshake_timeout_seconds > 2) {
    return absl::InvalidArgumentError("handshake_timeout_seconds must be in (0, 2]");
  }
  if (!std::isfinite(o.idle_timeout_seconds) || o.idle_timeout_seconds <= 0) {
    return absl::InvalidArgumentError("idle_timeout_seconds must be > 0");
  }
  if (!std::isfinite(o.max_request_seconds) || o.max_request_seconds <= 0) {
    return absl::InvalidArgumentError("max_request_seconds must be > 0");
  }
  if (o.max_keys_per_fetch < 1) {
    return absl::InvalidArgumentError("max_keys_per_fetch must be >= 1");
  }
  if (o.max_key_bytes < 1) return absl::InvalidArgumentError("max_key_bytes must be >= 1");
  if (o.max_entries_per_stage < 1) {
    return absl::InvalidArgumentError("max_entries_per_stage must be >= 1");
  }
  if (o.max_stage_body_bytes < 0) {
    return absl::InvalidArgumentError("max_stage_body_bytes must be >= 0");
  }
  if (o.max_response_bytes < 0) {
    return absl::InvalidArgumentError("max_response_bytes must be >= 0");
  }
  if (o.write_piece_bytes < 1 || o.write_piece_bytes > (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("write_piece_bytes must be in [1, 64 MiB]");
  }
  if (!std::isfinite(o.io_timeout_seconds) || o.io_timeout_seconds <= 0) {
    return absl::InvalidArgumentError("io_timeout_seconds must be > 0");
  }
  return CheckTls(o.kind, o.tls);
}

}  // namespace

std::string PeerInfo::Owner() const {
  if (!identity.empty()) return identity;
  return absl::StrCat("addr:", address);
}

const char* LinkClassName(LinkClass link) { return link == LinkClass::kFast ? "fast" : "slow"; }

std::vector<std::string> DataPlaneKinds() {
  std::vector<std::string> kinds;
  for (const Backend& b : kBackends) kinds.emplace_back(b.kind);
  return kinds;
}

DataPlaneServer::~DataPlaneServer() = default;
DataPlaneClient::~DataPlaneClient() = default;

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Create(
    const DataPlaneServerOptions& options, BlobLookup lookup, BlobStager stager) {
  std::shared_ptr<StageSink> sink;
  if (stager) sink = internal::MakeStagerSink(std::move(stager));
  return Create(options, std::move(lookup), std::move(sink));
}

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Create(
    const DataPlaneServerOptions& options, BlobLookup lookup, std::shared_ptr<StageSink> sink) {
  auto backend = FindBackend(options.kind);
  if (!backend.ok()) return backend.status();
  if (absl::Status s = CheckServerOptions(options); !s.ok()) return s;
  if (!lookup) return absl::InvalidArgumentError("data plane server needs a lookup function");
  auto listener = (*backend)->listen(options);
  if (!listener.ok()) return listener.status();
  if (options.tls.enabled() && options.kind != "tcp") {
    // No TLS on this backend: the handshake and MACs of auth_stream.h.
    listener = internal::WrapAuthListener(std::move(*listener), options.tls);
    if (!listener.ok()) return listener.status();
  }
  return internal::StartStreamServer(options, std::move(lookup), std::move(sink),
                                     std::move(*listener));
}

absl::StatusOr<std::unique_ptr<DataPlaneClient>> DataPlaneClient::Create(
    const DataPlaneClientOptions& options) {
  auto backend = FindBackend(options.kind);
  if (!backend.ok()) return backend.status();
  if (options.server_address.empty()) {
    return absl::InvalidArgumentError("data plane client needs server_address (HOST:PORT)");
  }
  if (options.max_response_bytes < 0) {
    return absl::InvalidArgumentError("max_response_bytes must be >= 0");
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("max_connections must be >= 1");
  }
  if (options.link != LinkClass::kFast && options.link != LinkClass::kSlow) {
    return absl::InvalidArgumentError("unknown link class");
  }
  if (absl::Status s = CheckTls(options.kind, options.tls); !s.ok()) return s;
  auto connector = (*backend)->connect(options);
  if (!connector.ok()) return connector.status();
  if (options.tls.enabled() && options.kind != "tcp") {
    connector = internal::WrapAuthConnector(std::move(*connector), options.tls);
    if (!connector.ok()) return connector.status();
  }
  return internal::MakeStreamClient(options, std::move(*connector));
}

}  // namespace vc::transport
