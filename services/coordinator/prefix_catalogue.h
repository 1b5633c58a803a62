// The coordinator's prefix catalogue: what is stored for a prefix, and under
// which id. It owns
//  * manifests: a registered prefix's token list, stored under its id (the
//    manifest key under the registering tenant's salt, so another tenant's
//    id answers exactly like an unknown one);
//  * EnsureStored: a request's chunks and its compressed variant are in the
//    store before it runs, ingested on the verifier the prefix is placed on
//    if not; one ingest per (prefix, variant) at a time, the others wait for
//    it and look again (ingest de-duplication);
//  * RegisterPrefix (ingest ahead of requests, admitted like a request) and
//    ManagePrefix (pin, unpin, delete), with the tenant quotas of the
//    admission controller.
// The store is behind a seam (CatalogueStore) and the verifiers behind the
// worker-client interface, so the catalogue is unit-tested on fakes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/task.h"
#include "common/ingest/prefix_ingest.h"
#include "common/kvstore/chunk_key.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/request_runner.h"
#include "vericache/v1/coordinator.pb.h"

namespace vc::daemon {
class StoreClient;
}  // namespace vc::daemon

namespace vc::coordinator {

// Bounds on the variants a request names.
inline constexpr size_t kMaxVariantsPerPrefix = 16;
inline constexpr size_t kMaxVariantsTextBytes = 1024;

// A variant list from a request: bounded text and count, parsed.
absl::StatusOr<std::vector<ingest::VariantSpec>> RequestVariants(const std::string& text);

// The holder of the store pins ManagePrefix makes for `tenant`'s prefix
// `prefix_id`: one per tenant and prefix, unambiguous for any tenant name.
// PinHolder(tenant, "") starts the names of all of the tenant's holders.
std::string PinHolder(const std::string& tenant, const std::string& prefix_id);

// The tenant ledger (kvstore::TenantLedgerKey): a tenant's StoredCharges,
// kept in the store so that --max-stored-bytes-per-tenant survives a
// coordinator restart. Its value, little-endian: "VCLG", u32 version 1, i64
// unlisted bytes, u32 count (at most kMaxChargedPrefixes), then per charged
// prefix its 32-byte key and i64 bytes, in key order. Decode answers
// DATA_LOSS for anything else (a wrong length, a count past the bound, a
// negative or zero charge, keys out of order). The entry is pinned by
// kTenantLedgerHolder, so that neither the store's byte budget nor its TTL
// drops it.
std::string EncodeTenantLedger(const StoredCharges& charges);
absl::StatusOr<StoredCharges> DecodeTenantLedger(const std::string& value);
inline constexpr char kTenantLedgerHolder[] = "tenant-ledger";

// The store calls the catalogue makes. Each ends by `deadline` (retries
// after the store went away included): the deadline of the request it is
// made for, cut to the catalogue's rpc_timeout, so that a request with 2 s
// left never waits 10 s on a store that does not answer.
class CatalogueStore {
 public:
  enum class Action { kDelete, kPin, kUnpin };
  virtual ~CatalogueStore() = default;
  virtual absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys,
                                                   Clock::time_point deadline) = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& key, Clock::time_point deadline) = 0;
  virtual absl::Status Put(const std::string& key, const std::string& value,
                           Clock::time_point deadline) = 0;
  // The store's pin holders whose names start with `prefix`, at most
  // `limit` of them.
  virtual absl::StatusOr<std::vector<std::string>> PinHolders(const std::string& prefix, int limit,
                                                              Clock::time_point deadline) = 0;
  // `holder` names the pin (Pin, Unpin; Delete ignores it).
  virtual absl::Status Apply(Action action, const std::string& key, const std::string& holder,
                             Clock::time_point deadline) = 0;
  // Lookup and Get for a request's coroutine, which must not hold its
  // thread while the store answers: `done` is told once, on any thread, what
  // the synchronous call would return. The default makes the synchronous
  // call (the unit tests' fakes); the daemon's store client makes them on
  // gRPC's callback API.
  using LookupDone = std::function<void(absl::StatusOr<std::vector<bool>>)>;
  using GetDone = std::function<void(absl::StatusOr<std::string>)>;
  using PutDone = std::function<void(absl::Status)>;
  using ApplyDone = std::function<void(absl::Status)>;
  using PinHoldersDone = std::function<void(absl::StatusOr<std::vector<std::string>>)>;
  virtual void StartLookup(const std::vector<std::string>& keys, Clock::time_point deadline,
                           LookupDone done) {
    done(Lookup(keys, deadline));
  }
  virtual void StartGet(const std::string& key, Clock::time_point deadline, GetDone done) {
    done(Get(key, deadline));
  }
  // Put for a registration's coroutine, likewise (the daemon's store client
  // runs it on threads of its own: a put is a protocol of several calls).
  virtual void StartPut(const std::string& key, const std::string& value,
                        Clock::time_point deadline, PutDone done) {
    done(Put(key, value, deadline));
  }
  virtual void StartApply(Action action, const std::string& key, const std::string& holder,
                          Clock::time_point deadline, ApplyDone done) {
    done(Apply(action, key, holder, deadline));
  }
  virtual void StartPinHolders(const std::string& prefix, int limit, Clock::time_point deadline,
                               PinHoldersDone done) {
    done(PinHolders(prefix, limit, deadline));
  }
};
// The daemon's: the KV store's client (which must outlive it).
std::unique_ptr<CatalogueStore> StoreClientCatalogue(daemon::StoreClient* store);

struct CatalogueOptions {
  int chunk_tokens = 64;
  std::string ingest_variants = "snapkv:0.25";
  // The longest a store call may take (a request's earlier deadline cuts
  // it), and the base of the verifier Ingest's deadline. Default 10 s.
  std::chrono::milliseconds rpc_timeout{10000};
  int max_worker_retries = 2;
};

// The model the workers serve (their Info), as keys and bounds need it.
struct CatalogueModel {
  kvstore::ModelId model_id;
  uint32_t numerics_version = 0;
  int vocab = 0;
  int context = 0;
  int64_t kv_bytes_per_token = 0;
  // The pool's separate draft model (the workers' Info draft_model_id):
  // ingests make its variants, and variant keys name it. Unset: the target's.
  std::optional<kvstore::ModelId> draft_model_id = std::nullopt;
};

struct CatalogueHooks {
  // The verifier a prefix (last chunk key in hex) is placed on.
  std::function<absl::StatusOr<Worker*>(const std::string& prefix_key)> place_verifier;
  // A call to `w` failed with `s`: `done(down)` once the worker has been
  // probed (RunnerContext::worker_failed).
  std::function<void(WorkerPool pool, Worker& w, const absl::Status& s,
                     std::function<void(bool down)> done)>
      worker_failed;
  // An ingest is tried again on another verifier (a metric).
  std::function<void()> on_retry;
  // An admission place for a registration, awaited (the coordinator's
  // queue: a Cancel or the caller going away wakes it). Unset: the
  // controller's Admit, waiting on the caller's thread (unit tests).
  std::function<Task<absl::Status>(Request& r)> admit;
};

class PrefixCatalogue {
 public:
  PrefixCatalogue(CatalogueOptions options, CatalogueModel model, CatalogueStore* store,
                  AdmissionController* admission, CatalogueHooks hooks);

  // A registered prefix's token list from its manifest; NotFound if unknown
  // or registered under another salt. `deadline`: the request's.
  absl::StatusOr<std::vector<int32_t>> Tokens(const std::string& prefix_id, const std::string& salt,
                                              Clock::time_point deadline);
  // The same for a request: a coroutine on ctx's executor that holds no
  // thread while the store answers. The arguments must outlive the task.
  Task<absl::StatusOr<std::vector<int32_t>>> AwaitTokens(const RunnerContext& ctx,
                                                         const std::string& prefix_id,
                                                         const std::string& salt,
                                                         Clock::time_point deadline);
  // The plan's chunks and variant are stored (ingested if not), within r's
  // deadline; the ingest is charged to r's tenant. A coroutine on ctx's
  // executor that holds no thread while the store answers its lookups,
  // while the verifier ingests or while it waits for another request's
  // ingest of the same prefix. `ctx`, `plan` and `r` must outlive the task.
  Task<absl::Status> EnsureStored(const RunnerContext& ctx, Plan& plan, Request& r);
  // True when the store answers (by `deadline`, the request's) and one of
  // the plan's entries is missing (evicted, or quarantined for failing its
  // seal). A coroutine as EnsureStored.
  Task<bool> Missing(const RunnerContext& ctx, const Plan& plan, Clock::time_point deadline);
  // RegisterPrefix for r's tenant, whose keys use `salt`; `r` is the call
  // (deadline, cancellation) and takes an admission place while the ingest
  // runs. A coroutine on ctx's executor that holds no thread while the
  // store answers, while it waits for its admission place, while the
  // verifier ingests or while the manifest is put. `ctx`, `req`, `r` and
  // `resp` must outlive the task.
  Task<absl::Status> Register(const RunnerContext& ctx, std::string salt,
                              const vericache::v1::RegisterPrefixRequest& req, Request& r,
                              vericache::v1::RegisterPrefixResponse* resp);
  // ManagePrefix for r's tenant, whose keys use `salt`, by r's deadline;
  // r.cancelled (Shutdown) stops it between keys, its caller going away
  // does not. A coroutine as Register (it holds no thread while the store
  // answers). `ctx`, `req`, `r` and `resp` must outlive the task.
  Task<absl::Status> Manage(const RunnerContext& ctx, std::string salt,
                            const vericache::v1::ManagePrefixRequest& req, Request& r,
                            vericache::v1::ManagePrefixResponse* resp);

 private:
  // An ingest in flight, and what to signal when it is over (mu_ guards
  // both).
  struct IngestWait {
    bool done = false;
    std::vector<std::function<void()>> waiting;
  };
  // The ingest of EnsureStored; *ingest_on: the verifier it was sent to
  // (null if none was placed).
  Task<absl::Status> Ingest(const RunnerContext& ctx, Plan& plan, Request& r, Worker** ingest_on);
  // The store's Lookup and Get, awaited (CatalogueStore's Start* calls).
  Task<absl::StatusOr<std::vector<bool>>> AwaitLookup(const RunnerContext& ctx,
                                                      const std::vector<std::string>& keys,
                                                      Clock::time_point deadline);
  Task<absl::StatusOr<std::string>> AwaitGet(const RunnerContext& ctx, const std::string& key,
                                             Clock::time_point deadline);
  Task<absl::Status> AwaitPut(const RunnerContext& ctx, const std::string& key,
                              const std::string& value, Clock::time_point deadline);
  // The prefixes `tenant` pins in the store, loaded into the admission
  // controller unless it knows them (a coordinator that restarted does not).
  Task<absl::Status> AwaitTenantPins(const RunnerContext& ctx, const std::string& tenant,
                                     Clock::time_point deadline);
  // The tenant's charges from its ledger, loaded into the admission
  // controller unless it knows them (a coordinator that restarted does not;
  // a tenant without a ledger has stored nothing, and an unreadable one is
  // reported and counted from zero). Before any check or change of them.
  Task<absl::Status> AwaitTenantStored(const RunnerContext& ctx, const std::string& tenant,
                                       Clock::time_point deadline);
  // The tenant's stored-bytes budget before an ingest of `tokens` tokens:
  // its charges loaded, and the least the ingest stores (the tokens' full
  // KV) reserved until the ingest is charged (ReserveStored). When that
  // would pass the limit, the charged prefixes are looked up in the store
  // and those it no longer holds (evicted, expired) given back before the
  // reservation is tried again (at most once per stored_recheck_interval).
  Task<absl::StatusOr<StoredReservation>> AwaitStoredBudget(const RunnerContext& ctx,
                                                            const std::string& tenant,
                                                            int32_t tokens,
                                                            Clock::time_point deadline);
  // Writes the tenant's charges to its ledger (and pins it), unless another
  // of the tenant's requests is writing it, which then writes this change
  // too. A failed write is reported and left to the tenant's next change:
  // the request that made the change goes on (its charges in memory hold).
  Task<absl::Status> AwaitLedgerWrite(const RunnerContext& ctx, const std::string& tenant,
                                      Clock::time_point deadline);
  Task<absl::Status> AwaitApply(const RunnerContext& ctx, CatalogueStore::Action action,
                                const std::string& key, const std::string& holder,
                                Clock::time_point deadline);
  // hooks_.admit, or the controller's Admit where it is unset.
  Task<absl::Status> AwaitAdmission(Request& r);
  // The token list of prefix `prefix_id` (whose raw key is `raw`) from the
  // store's answer for its manifest, checked against `salt`.
  absl::StatusOr<std::vector<int32_t>> TokensOfManifest(const std::string& prefix_id,
                                                        const std::string& raw,
                                                        const std::string& salt,
                                                        absl::StatusOr<std::string> manifest) const;
  // The store keys of the plan's chunks and variant.
  static std::vector<std::string> PlanKeys(const Plan& plan);
  // hooks_.worker_failed, awaited: true if `w` is down.
  Task<bool> AwaitWorkerCheck(const RunnerContext& ctx, Worker& w, const absl::Status& s);
  // A verifier Ingest on r's behalf: cancelled with its caller.
  WorkerCallOptions IngestCallOptions(const Request& r) const;
  kvstore::ChunkKeyOptions KeyOptions(const std::string& salt) const;
  // A store call's deadline on behalf of a request whose own is `deadline`:
  // the earlier of it and rpc_timeout from now.
  Clock::time_point StoreDeadline(Clock::time_point deadline) const;
  // The draft model's id for an IngestRequest (empty: none), and for keys.
  std::string DraftModelRaw() const;
  const kvstore::ModelId* DraftModel() const;

  const CatalogueOptions options_;
  const CatalogueModel model_;
  CatalogueStore* store_;
  AdmissionController* admission_;
  const CatalogueHooks hooks_;
  std::mutex mu_;
  // Prefixes being ingested: later requests wait for the first one's ingest.
  std::map<std::string, std::shared_ptr<IngestWait>> ingesting_;
};

}  // namespace vc::coordinator
