// gRPC control plane of vc-kvstore (vericache.v1.KvStore): validates every
// request, forwards it to a vc::kvstore::KvStore, maps absl::Status onto
// grpc::Status (same code, message kept) and records per-method metrics.
// It also stages the entries that writers upload over the data plane
// (StageFromDataPlane, the data plane server's stager), through the same
// validation, store call and metrics as the StageChunk RPC.
//
// Uses the gRPC callback API. Handlers run the store call inline on gRPC's
// callback threads (the store takes one mutex; RocksDB commits may fsync).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "common/kvstore/kv_store.h"
#include "common/metrics/metrics.h"
#include "common/transport/data_plane.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc::kvstore {

// Raw chunk keys are SHA-256 digests.
inline constexpr size_t kRawKeyBytes = 32;

// InvalidArgument (naming `what`) unless `key` is exactly kRawKeyBytes long.
absl::Status ValidateRawKey(const std::string& key, const std::string& what);

// absl -> gRPC status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The owner of what a gRPC caller opens (a two-phase put): "addr:" + its IP
// address — the same string the data plane's PeerInfo::Owner() gives for
// that caller, so one peer can begin a put over gRPC and stage it over the
// data plane, and nobody else can. (Both planes move to the authenticated
// identity together once the data plane authenticates its peers.) `peer` is
// grpc's ServerContext::peer() ("ipv4:1.2.3.4:5", "ipv6:[::1]:5").
std::string OwnerFromPeer(const std::string& peer);
std::string CallerOwner(const grpc::ServerContextBase& ctx);

class KvStoreService final : public vericache::v1::KvStore::CallbackService {
 public:
  // `store` and `registry` must outlive the service. Registers the
  // vericache_kvstore_* metric families (aborts on a clash: a programming
  // error).
  KvStoreService(KvStore* store, metrics::Registry* registry);

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx,
                                   const vericache::v1::LookupRequest* req,
                                   vericache::v1::LookupResponse* resp) override;
  grpc::ServerUnaryReactor* BeginPut(grpc::CallbackServerContext* ctx,
                                     const vericache::v1::BeginPutRequest* req,
                                     vericache::v1::BeginPutResponse* resp) override;
  grpc::ServerUnaryReactor* StageChunk(grpc::CallbackServerContext* ctx,
                                       const vericache::v1::StageChunkRequest* req,
                                       vericache::v1::StageChunkResponse* resp) override;
  grpc::ServerUnaryReactor* CommitPut(grpc::CallbackServerContext* ctx,
                                      const vericache::v1::CommitPutRequest* req,
                                      vericache::v1::CommitPutResponse* resp) override;
  grpc::ServerUnaryReactor* AbortPut(grpc::CallbackServerContext* ctx,
                                     const vericache::v1::AbortPutRequest* req,
                                     vericache::v1::AbortPutResponse* resp) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx,
                                const vericache::v1::GetRequest* req,
                                vericache::v1::GetResponse* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const vericache::v1::DeleteRequest* req,
                                   vericache::v1::DeleteResponse* resp) override;
  grpc::ServerUnaryReactor* Pin(grpc::CallbackServerContext* ctx,
                                const vericache::v1::PinRequest* req,
                                vericache::v1::PinResponse* resp) override;
  grpc::ServerUnaryReactor* Unpin(grpc::CallbackServerContext* ctx,
                                  const vericache::v1::UnpinRequest* req,
                                  vericache::v1::UnpinResponse* resp) override;
  grpc::ServerUnaryReactor* ListPinHolders(grpc::CallbackServerContext* ctx,
                                           const vericache::v1::ListPinHoldersRequest* req,
                                           vericache::v1::ListPinHoldersResponse* resp) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* ctx,
                                 const vericache::v1::StatRequest* req,
                                 vericache::v1::StatResponse* resp) override;

  // The data plane's stage sink: admits an upload from its header (the put
  // is the peer's, its bytes are reserved from the staging budget), then
  // validates and stages each entry like a StageChunk RPC, counted in the
  // same request metrics under method "DataPlaneStage". Thread-safe. The
  // service must outlive it.
  std::shared_ptr<transport::StageSink> DataPlaneSink();

  // The data plane serving this store's chunk bytes: Stat advertises it and
  // reports its per-link counters. Must outlive the service.
  void AttachDataPlane(transport::DataPlaneServer* data_plane) { data_plane_ = data_plane; }

  // Refreshes the tier gauges, the hit/miss/eviction counters (from the
  // store's Stats()) and the data plane's link counters. The daemon also
  // calls it periodically, since data-plane traffic bypasses the RPCs.
  void RefreshStoreMetrics();

 private:
  // Runs `body`, records metrics for `method`, finishes the call.
  template <typename Body>
  grpc::ServerUnaryReactor* Handle(grpc::CallbackServerContext* ctx, const char* method,
                                   Body&& body);
  // Records one request of `method` that took `seconds` and ended in `status`.
  void Record(const char* method, double seconds, const absl::Status& status);
  // The staging path shared by StageChunk and the data plane's sink.
  absl::Status StageEntry(uint64_t put_id, const std::string& key, std::string value,
                          const std::string& owner);
  class Sink;

  KvStore* store_;
  metrics::CounterFamily* requests_;
  metrics::HistogramFamily* seconds_;
  metrics::GaugeFamily* bytes_;
  metrics::GaugeFamily* entries_;
  metrics::Counter* hits_;
  metrics::Counter* misses_;
  metrics::Counter* evictions_;
  metrics::CounterFamily* link_bytes_;
  metrics::CounterFamily* link_busy_;
  metrics::GaugeFamily* link_capacity_;
  transport::DataPlaneServer* data_plane_ = nullptr;

  std::mutex mu_;  // guards the last_* snapshot used for counter deltas
  int64_t last_hits_ = 0;
  int64_t last_misses_ = 0;
  int64_t last_evictions_ = 0;
  int64_t last_link_bytes_[2] = {0, 0};
  double last_link_busy_[2] = {0, 0};
};

}  // namespace vc::kvstore
