#include "services/kvstore/kvstore_service.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include <grpcpp/security/auth_context.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/base/status_macros.h"

namespace vc::kvstore {
namespace {

namespace pb = ::vericache::v1;

template <typename T>
T* Must(absl::StatusOr<T*> r, const char* what) {
  VC_CHECK(r.ok(), what);
  return *r;
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1.0,    2.5,     5.0,    10.0};
  return kBuckets;
}

}  // namespace

absl::Status ValidateRawKey(const std::string& key, const std::string& what) {
  if (key.size() != kRawKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be ", kRawKeyBytes,
                                                   " raw bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

std::string OwnerFromPeer(const std::string& peer) {
  // "ipv4:HOST:PORT" / "ipv6:[HOST]:PORT" (newer gRPC writes the brackets
  // URI-encoded, %5B / %5D): the host part.
  std::string host = absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}});
  const size_t scheme = host.find(':');
  if (scheme != std::string::npos) host = host.substr(scheme + 1);
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    host = host.substr(1, close == std::string::npos ? std::string::npos : close - 1);
  } else if (const size_t colon = host.find(':');
             colon != std::string::npos && host.find(':', colon + 1) == std::string::npos) {
    host = host.substr(0, colon);
  }
  // The data plane is IPv4: name an IPv4 peer the same way on both planes.
  constexpr char kMapped[] = "::ffff:";
  if (host.rfind(kMapped, 0) == 0) host = host.substr(sizeof(kMapped) - 1);
  if (host == "::1") host = "127.0.0.1";
  return absl::StrCat("addr:", host);
}

std::string CallerOwner(const grpc::ServerContextBase& ctx) {
  // The control plane must give the same owner string as the data plane
  // for the same writer, or a put begun here could not be staged there.
  // With mutual TLS on both (the same certificate files), both name the
  // writer "cert:<subject CN>" of its client certificate; without it, both
  // use the peer's address. (TLS on only one plane would refuse stages: the
  // two are configured from the same --tls-* flags.)
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      if (!cn.empty()) return absl::StrCat("cert:", std::string(cn.data(), cn.size()));
    }
  }
  return OwnerFromPeer(ctx.peer());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      std::string(status.message()));
}

KvStoreService::KvStoreService(KvStore* store, metrics::Registry* registry) : store_(store) {
  requests_ = Must(registry->AddCounter("vericache_kvstore_requests_total",
                                        "vc-kvstore RPCs served, by method and status code.",
                                        {"method", "code"}),
                   "register vericache_kvstore_requests_total");
  seconds_ = Must(registry->AddHistogram("vericache_kvstore_request_seconds",
                                         "vc-kvstore RPC handling time in seconds.", {"method"},
                                         LatencyBuckets()),
                  "register vericache_kvstore_request_seconds");
  bytes_ = Must(registry->AddGauge("vericache_kvstore_bytes", "Bytes of values held, by tier.",
                                   {"tier"}),
                "register vericache_kvstore_bytes");
  entries_ = Must(registry->AddGauge("vericache_kvstore_entries", "Entries held, by tier.",
                                     {"tier"}),
                  "register vericache_kvstore_entries");
  hits_ = &Must(registry->AddCounter("vericache_kvstore_hits_total",
                                     "Gets served from DRAM or disk."),
                "register vericache_kvstore_hits_total")
               ->Get();
  misses_ = &Must(registry->AddCounter("vericache_kvstore_misses_total",
                                       "Gets of a missing or expired key."),
                  "register vericache_kvstore_misses_total")
                 ->Get();
  evictions_ = &Must(registry->AddCounter("vericache_kvstore_evictions_total",
                                          "Entries evicted from DRAM or disk, or expired."),
                     "register vericache_kvstore_evictions_total")
                    ->Get();
  link_bytes_ = Must(registry->AddCounter("vericache_link_bytes_total",
                                          "Bytes the data plane carried (fetch responses and "
                                          "stage uploads), by link class.",
                                          {"link"}),
                     "register vericache_link_bytes_total");
  link_busy_ =
      Must(registry->AddCounter("vericache_link_busy_seconds_total",
                                "Seconds a link class was busy (utilisation = rate).", {"link"}),
           "register vericache_link_busy_seconds_total");
  link_capacity_ = Must(registry->AddGauge("vericache_link_capacity_bytes_per_second",
                                           "Paced bandwidth of a link class (0: unpaced).",
                                           {"link"}),
                        "register vericache_link_capacity_bytes_per_second");
  RefreshStoreMetrics();
}

void KvStoreService::RefreshStoreMetrics() {
  const KvStoreStats s = store_->Stats();
  bytes_->Labels({"dram"}).Set(static_cast<double>(s.dram_bytes));
  bytes_->Labels({"disk"}).Set(static_cast<double>(s.disk_bytes));
  entries_->Labels({"dram"}).Set(static_cast<double>(s.dram_entries));
  entries_->Labels({"disk"}).Set(static_cast<double>(s.disk_entries));
  const int64_t hits = s.dram_hits + s.disk_hits;
  const int64_t evictions = s.dram_evictions + s.disk_evictions + s.expirations;
  std::lock_guard<std::mutex> lock(mu_);
  if (hits > last_hits_) hits_->Inc(static_cast<double>(hits - last_hits_));
  if (s.misses > last_misses_) misses_->Inc(static_cast<double>(s.misses - last_misses_));
  if (evictions > last_evictions_) evictions_->Inc(static_cast<double>(evictions - last_evictions_));
  last_hits_ = std::max(last_hits_, hits);
  last_misses_ = std::max(last_misses_, s.misses);
  last_evictions_ = std::max(last_evictions_, evictions);
  if (data_plane_ != nullptr) {
    for (const transport::LinkClass link : {transport::LinkClass::kFast, transport::LinkClass::kSlow}) {
      const int i = link == transport::LinkClass::kFast ? 0 : 1;
      const transport::LinkStats ls = data_plane_->Stats(link);
      const char* name = transport::LinkClassName(link);
      if (ls.bytes_total > last_link_bytes_[i]) {
        link_bytes_->Labels({name}).Inc(static_cast<double>(ls.bytes_total - last_link_bytes_[i]));
        last_link_bytes_[i] = ls.bytes_total;
      }
      if (ls.busy_seconds > last_link_busy_[i]) {
        link_busy_->Labels({name}).Inc(ls.busy_seconds - last_link_busy_[i]);
        last_link_busy_[i] = ls.busy_seconds;
      }
      link_capacity_->Labels({name}).Set(ls.capacity_bytes_per_second);
    }
  }
}

template <typename Body>
grpc::ServerUnaryReactor* KvStoreService::Handle(grpc::CallbackServerContext* ctx,
                                                 const char* method, Body&& body) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status;
  try {
    status = body();
  } catch (const std::exception& e) {  // no exception crosses the service edge
    status = absl::InternalError(absl::StrCat(method, ": ", e.what()));
  }
  Record(method, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
         status);
  RefreshStoreMetrics();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

void KvStoreService::Record(const char* method, double seconds, const absl::Status& status) {
  seconds_->Labels({method}).Observe(seconds);
  requests_->Labels({method, absl::StatusCodeToString(status.code())}).Inc();
}

absl::Status KvStoreService::StageEntry(uint64_t put_id, const std::string& key,
                                        std::string value, const std::string& owner) {
  VC_RETURN_IF_ERROR(ValidateRawKey(key, "key"));
  return store_->Stage(put_id, key, std::move(value), owner);
}

class KvStoreService::Sink : public transport::StageSink {
 public:
  explicit Sink(KvStoreService* service) : service_(service) {}

  absl::Status Begin(const transport::PeerInfo& peer, uint64_t put_id,
                     uint64_t body_bytes) override {
    if (body_bytes > static_cast<uint64_t>(INT64_MAX)) {
      return absl::ResourceExhaustedError("stage body too large");
    }
    return service_->store_->ReserveStage(put_id, peer.Owner(), static_cast<int64_t>(body_bytes));
  }

  absl::Status Entry(const transport::PeerInfo& peer, uint64_t put_id, const std::string& key,
                     std::string value) override {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = service_->StageEntry(put_id, key, std::move(value), peer.Owner());
    // The store's gauges are refreshed by the daemon's timer, not per entry:
    // a stage carries up to max_entries_per_stage of them.
    service_->Record(
        "DataPlaneStage",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), status);
    return status;
  }

  void End(const transport::PeerInfo& /*peer*/, uint64_t put_id, uint64_t unused_bytes) override {
    service_->store_->ReleaseStage(
        put_id, static_cast<int64_t>(std::min<uint64_t>(unused_bytes, INT64_MAX)));
  }

 private:
  KvStoreService* service_;
};

std::shared_ptr<transport::StageSink> KvStoreService::DataPlaneSink() {
  return std::make_shared<Sink>(this);
}

grpc::ServerUnaryReactor* KvStoreService::Lookup(grpc::CallbackServerContext* ctx,
                                                 const pb::LookupRequest* req,
                                                 pb::LookupResponse* resp) {
  return Handle(ctx, "Lookup", [&]() -> absl::Status {
    std::vector<std::string> keys;
    keys.reserve(static_cast<size_t>(req->keys_size()));
    for (int i = 0; i < req->keys_size(); ++i) {
      VC_RETURN_IF_ERROR(ValidateRawKey(req->keys(i), absl::StrCat("keys[", i, "]")));
      keys.push_back(req->keys(i));
    }
    VC_ASSIGN_OR_RETURN(auto found, store_->Lookup(keys));
    for (const std::string& key : keys) {
      pb::LookupResult* r = resp->add_results();
      r->set_key(key);
      auto it = found.find(key);
      r->set_hit(it != found.end());
      if (it != found.end()) {
        r->set_tier(it->second == Tier::kDram ? pb::TIER_DRAM : pb::TIER_DISK);
      }
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvStoreService::BeginPut(grpc::CallbackServerContext* ctx,
                                                   const pb::BeginPutRequest* /*req*/,
                                                   pb::BeginPutResponse* resp) {
  return Handle(ctx, "BeginPut", [&]() -> absl::Status {
    VC_ASSIGN_OR_RETURN(uint64_t id, store_->BeginPut(CallerOwner(*ctx)));
    resp->set_put_id(id);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvStoreService::StageChunk(grpc::CallbackServerContext* ctx,
                                                     const pb::StageChunkRequest* req,
                                                     pb::StageChunkResponse* /*resp*/) {
  return Handle(ctx, "StageChunk", [&]() -> absl::Status {
    return StageEntry(req->put_id(), req->key(), req->value(), CallerOwner(*ctx));
  });
}

grpc::ServerUnaryReactor* KvStoreService::CommitPut(grpc::CallbackServerContext* ctx,
                                                    const pb::CommitPutRequest* req,
                                                    pb::CommitPutResponse* /*resp*/) {
  return Handle(ctx, "CommitPut",
                [&]() -> absl::Status { return store_->Commit(req->put_id(), CallerOwner(*ctx)); });
}

grpc::ServerUnaryReactor* KvStoreService::AbortPut(grpc::CallbackServerContext* ctx,
                                                   const pb::AbortPutRequest* req,
                                                   pb::AbortPutResponse* /*resp*/) {
  return Handle(ctx, "AbortPut",
                [&]() -> absl::Status { return store_->Abort(req->put_id(), CallerOwner(*ctx)); });
}

grpc::ServerUnaryReactor* KvStoreService::Get(grpc::CallbackServerContext* ctx,
                                              const pb::GetRequest* req, pb::GetResponse* resp) {
  return Handle(ctx, "Get", [&]() -> absl::Status {
    VC_RETURN_IF_ERROR(ValidateRawKey(req->key(), "key"));
    VC_ASSIGN_OR_RETURN(std::string value, store_->Get(req->key()));
    resp->set_value(std::move(value));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvStoreService::Delete(grpc::CallbackServerContext* ctx,
                                                 const pb::DeleteRequest* req,
                                                 pb::DeleteResponse* /*resp*/) {
  return Handle(ctx, "Delete", [&]() -> absl::Status {
    VC_RETURN_IF_ERROR(ValidateRawKey(req->key(), "key"));
    return store_->Delete(req->key());
  });
}

grpc::ServerUnaryReactor* KvStoreService::Pin(grpc::CallbackServerContext* ctx,
                                              const pb::PinRequest* req, pb::PinResponse* /*resp*/) {
  return Handle(ctx, "Pin", [&]() -> absl::Status {
    VC_RETURN_IF_ERROR(ValidateRawKey(req->key(), "key"));
    return store_->Pin(req->key(), req->holder());
  });
}

grpc::ServerUnaryReactor* KvStoreService::Unpin(grpc::CallbackServerContext* ctx,
                                                const pb::UnpinRequest* req,
                                                pb::UnpinResponse* /*resp*/) {
  return Handle(ctx, "Unpin", [&]() -> absl::Status {
    VC_RETURN_IF_ERROR(ValidateRawKey(req->key(), "key"));
    return store_->Unpin(req->key(), req->holder());
  });
}

grpc::ServerUnaryReactor* KvStoreService::ListPinHolders(grpc::CallbackServerContext* ctx,
                                                         const pb::ListPinHoldersRequest* req,
                                                         pb::ListPinHoldersResponse* resp) {
  return Handle(ctx, "ListPinHolders", [&]() -> absl::Status {
    VC_ASSIGN_OR_RETURN(KvStore::PinHolderList list,
                        store_->PinHolders(req->prefix(), req->limit()));
    for (std::string& h : list.holders) resp->add_holders(std::move(h));
    resp->set_truncated(list.truncated);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvStoreService::Stat(grpc::CallbackServerContext* ctx,
                                               const pb::StatRequest* /*req*/,
                                               pb::StatResponse* resp) {
  return Handle(ctx, "Stat", [&]() -> absl::Status {
    const KvStoreStats s = store_->Stats();
    resp->set_dram_entries(s.dram_entries);
    resp->set_dram_bytes(s.dram_bytes);
    resp->set_disk_entries(s.disk_entries);
    resp->set_disk_bytes(s.disk_bytes);
    resp->set_pinned_entries(s.pinned_entries);
    resp->set_open_puts(s.open_puts);
    resp->set_staged_bytes(s.staged_bytes);
    resp->set_dram_hits(s.dram_hits);
    resp->set_disk_hits(s.disk_hits);
    resp->set_misses(s.misses);
    resp->set_dram_evictions(s.dram_evictions);
    resp->set_disk_evictions(s.disk_evictions);
    resp->set_expirations(s.expirations);
    if (data_plane_ != nullptr) {
      resp->set_data_plane(data_plane_->kind());
      resp->set_data_address(data_plane_->address());
      for (const transport::LinkClass link :
           {transport::LinkClass::kFast, transport::LinkClass::kSlow}) {
        const transport::LinkStats ls = data_plane_->Stats(link);
        pb::LinkStat* out = resp->add_links();
        out->set_link(transport::LinkClassName(link));
        out->set_bytes_total(ls.bytes_total);
        out->set_bytes_received(ls.bytes_received);
        out->set_fetches(ls.fetches);
        out->set_stages(ls.stages);
        out->set_busy_seconds(ls.busy_seconds);
        out->set_capacity_bytes_per_second(ls.capacity_bytes_per_second);
        out->set_slot_seconds(ls.slots.slot_seconds);
        out->set_first_slot(ls.slots.first_slot);
        for (const int64_t b : ls.slots.bytes_per_slot) out->add_bytes_per_slot(b);
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace vc::kvstore
