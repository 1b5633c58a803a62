#include "services/stress/internal/target.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvstore/kv_store.h"
#include "common/rpc/rpc.h"
#include "services/common/store_client.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc::stress {
namespace {

namespace pb = ::vericache::v1;

class InprocTarget final : public StressTarget {
 public:
  explicit InprocTarget(std::unique_ptr<kvstore::KvStore> store) : store_(std::move(store)) {}

  absl::Status Put(const Entries& entries, bool commit, int route,
                   const std::function<void()>& between) override {
    // Route 1: the one-call Put of a single entry (no staging to observe).
    if (commit && route == 1 && entries.size() == 1 && !between) {
      return store_->Put(entries[0].first, entries[0].second);
    }
    VC_ASSIGN_OR_RETURN(const uint64_t id, store_->BeginPut());
    for (const auto& [key, value] : entries) {
      absl::Status s = store_->Stage(id, key, value);
      if (!s.ok()) {
        // The staging error is the one to report; the abort only cleans up.
        store_->Abort(id).IgnoreError();
        return s;
      }
    }
    if (between) between();
    return commit ? store_->Commit(id) : store_->Abort(id);
  }
  absl::StatusOr<std::string> Get(const std::string& key, int /*route*/) override {
    return store_->Get(key);
  }
  absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys) override {
    VC_ASSIGN_OR_RETURN(const auto found, store_->Lookup(keys));
    std::vector<bool> hits;
    for (const std::string& k : keys) hits.push_back(found.count(k) > 0);
    return hits;
  }
  absl::Status Delete(const std::string& key) override { return store_->Delete(key); }
  absl::Status Pin(const std::string& key, const std::string& holder) override {
    return store_->Pin(key, holder);
  }
  absl::Status Unpin(const std::string& key, const std::string& holder) override {
    return store_->Unpin(key, holder);
  }
  absl::StatusOr<TargetStats> Stats() override {
    const kvstore::KvStoreStats s = store_->Stats();
    return TargetStats{s.disk_entries, s.disk_bytes,     s.dram_bytes,
                       s.dram_evictions, s.disk_evictions, s.expirations};
  }
  std::string Describe() const override { return "in-process KvStore"; }

 private:
  std::unique_ptr<kvstore::KvStore> store_;
};

class RemoteTarget final : public StressTarget {
 public:
  RemoteTarget(RemoteTargetOptions options, std::unique_ptr<daemon::StoreClient> client,
               std::unique_ptr<pb::KvStore::Stub> stub)
      : options_(std::move(options)), client_(std::move(client)), stub_(std::move(stub)) {}

  absl::Status Put(const Entries& entries, bool commit, int route,
                   const std::function<void()>& between) override {
    // Route 1: the workers' path (StoreClient::PutAll, bytes over the data
    // plane), which gives no point to observe staged bytes from.
    if (commit && route == 1 && !between) return client_->PutAll(entries);
    // Otherwise the control plane step by step: BeginPut, StageChunk per
    // entry, then CommitPut or AbortPut.
    pb::BeginPutResponse began;
    {
      auto ctx = Context();
      VC_RETURN_IF_ERROR(rpc::FromGrpcStatus(
          stub_->BeginPut(ctx.get(), pb::BeginPutRequest(), &began), "vc-kvstore BeginPut"));
    }
    const uint64_t id = began.put_id();
    for (const auto& [key, value] : entries) {
      pb::StageChunkRequest req;
      req.set_put_id(id);
      req.set_key(key);
      req.set_value(value);
      pb::StageChunkResponse resp;
      auto ctx = Context();
      absl::Status s = rpc::FromGrpcStatus(stub_->StageChunk(ctx.get(), req, &resp),
                                           "vc-kvstore StageChunk");
      if (!s.ok()) {
        Abort(id).IgnoreError();  // the staging error is the one to report
        return s;
      }
    }
    if (between) between();
    if (!commit) return Abort(id);
    pb::CommitPutRequest req;
    req.set_put_id(id);
    pb::CommitPutResponse resp;
    auto ctx = Context();
    return rpc::FromGrpcStatus(stub_->CommitPut(ctx.get(), req, &resp), "vc-kvstore CommitPut");
  }
  absl::StatusOr<std::string> Get(const std::string& key, int route) override {
    if (route == 1) {
      VC_ASSIGN_OR_RETURN(auto values, client_->Fetch({key}));
      if (values.size() != 1) {
        return absl::InternalError(
            absl::StrCat("data plane fetch of 1 key returned ", values.size(), " values"));
      }
      return std::move(values[0]);
    }
    return client_->Get(key);
  }
  absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys) override {
    return client_->Lookup(keys);
  }
  absl::Status Delete(const std::string& key) override {
    return client_->Apply(daemon::StoreClient::KeyAction::kDelete, key, "");
  }
  absl::Status Pin(const std::string& key, const std::string& holder) override {
    return client_->Apply(daemon::StoreClient::KeyAction::kPin, key, holder);
  }
  absl::Status Unpin(const std::string& key, const std::string& holder) override {
    return client_->Apply(daemon::StoreClient::KeyAction::kUnpin, key, holder);
  }
  absl::StatusOr<TargetStats> Stats() override {
    pb::StatResponse resp;
    auto ctx = Context();
    VC_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->Stat(ctx.get(), pb::StatRequest(), &resp),
                                           "vc-kvstore Stat"));
    return TargetStats{resp.disk_entries(), resp.disk_bytes(), resp.dram_bytes(),
                       resp.dram_evictions(), resp.disk_evictions(), resp.expirations()};
  }
  std::string Describe() const override {
    return absl::StrCat("vc-kvstore at ", options_.address, " (data plane ", options_.data_plane,
                        " ", client_->data_address(), ")");
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    return rpc::ContextWithTimeout(std::chrono::milliseconds(options_.timeout_ms));
  }
  absl::Status Abort(uint64_t id) {
    pb::AbortPutRequest req;
    req.set_put_id(id);
    pb::AbortPutResponse resp;
    auto ctx = Context();
    return rpc::FromGrpcStatus(stub_->AbortPut(ctx.get(), req, &resp), "vc-kvstore AbortPut");
  }

  RemoteTargetOptions options_;
  std::unique_ptr<daemon::StoreClient> client_;
  std::unique_ptr<pb::KvStore::Stub> stub_;
};

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1" ||
         host.rfind("127.", 0) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StressTarget>> OpenInprocTarget(const InprocTargetOptions& options) {
  if (options.db_dir.empty()) return absl::InvalidArgumentError("--db is required in inproc mode");
  kvstore::KvStoreOptions o;
  o.path = options.db_dir;
  o.dram_budget_bytes = options.dram_bytes;
  o.disk_budget_bytes = options.disk_bytes;
  o.ttl_seconds = options.ttl_seconds;
  o.sync_writes = options.sync_writes;
  VC_ASSIGN_OR_RETURN(auto store, kvstore::KvStore::Open(o));
  return std::unique_ptr<StressTarget>(new InprocTarget(std::move(store)));
}

absl::StatusOr<std::unique_ptr<StressTarget>> OpenRemoteTarget(const RemoteTargetOptions& options) {
  std::string host;
  int port = 0;
  VC_RETURN_IF_ERROR(rpc::SplitHostPort("--store", options.address, &host, &port));
  // A stress tool sends its load to this machine only.
  if (!IsLoopback(host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store must be a loopback address (127.0.0.1, localhost, [::1]), got ",
                     options.address));
  }
  if (options.timeout_ms <= 0) return absl::InvalidArgumentError("--rpc-timeout-ms must be > 0");
  daemon::StoreClientOptions co;
  co.control_address = options.address;
  co.data_plane = options.data_plane;
  co.timeout = std::chrono::milliseconds(options.timeout_ms);
  VC_ASSIGN_OR_RETURN(auto client, daemon::StoreClient::Create(co));
  std::string data_host;
  int data_port = 0;
  if (options.data_plane == "tcp" &&
      (!rpc::SplitHostPort("data", client->data_address(), &data_host, &data_port).ok() ||
       !IsLoopback(data_host))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the store advertises a non-loopback data plane address ", client->data_address()));
  }
  auto stub = pb::KvStore::NewStub(rpc::MakeChannel(options.address, 64 << 20));
  return std::unique_ptr<StressTarget>(
      new RemoteTarget(options, std::move(client), std::move(stub)));
}

}  // namespace vc::stress
