// vc-coordinator's public API (vericache.v1.Coordinator): the gRPC edge over
// the coordinator's parts (DESIGN.md sections 3, 6 and 7; docs/architecture.md
// "The coordinator's parts"). A Generate is authenticated, bounded, recorded
// (GetRequest, Cancel), admitted (admission.h: max_active running, max_queued
// waiting, tenant quotas; beyond that RESOURCE_EXHAUSTED), planned (prompt,
// chunk keys, variant, x), its prefix stored (prefix_catalogue.h: ingested
// first if missing), placed (placement.h: the verifier by its prefix so
// requests over one prefix meet, the drafter least loaded) and run by the
// runner of its mode (request_runner.h: vericache, full_local, full_remote,
// lossy_remote). The edge keeps what spans runs: re-establishing a request on
// live workers when one it ran on died, healing a prefix that went missing,
// releasing sessions, shadow checks of the lossless guarantee and metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ingest/prefix_ingest.h"
#include "common/kvstore/chunk_key.h"
#include "common/metrics/metrics.h"
#include "services/common/store_client.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/placement.h"
#include "services/coordinator/prefix_catalogue.h"
#include "services/coordinator/release_retry.h"
#include "services/coordinator/request_runner.h"
#include "services/coordinator/slot_clock.h"
#include "services/coordinator/tenant_auth.h"
#include "services/coordinator/worker_client.h"
#include "services/coordinator/worker_compat.h"
#include "services/coordinator/worker_health.h"
#include "vericache/v1/coordinator.grpc.pb.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc::coordinator {

struct CoordinatorOptions {
  std::vector<std::string> verifiers;  // HOST:PORT
  std::vector<std::string> drafters;
  std::string kvstore;
  int max_active_requests = 64;
  int max_queued_requests = 256;
  double slot_seconds = 0.02;
  // Recalibrate the slot from the drafters' measured step time (--slot-ms 0).
  bool auto_slot = false;
  int window_slots = 64;
  bool lock_step = false;
  // Reloads may use the leftover of partly booked slots (RingSchedulerOptions).
  bool pack_reloads = true;
  double fast_link_bytes_per_second = 0;  // 0: unlimited
  double slow_link_bytes_per_second = 0;
  int64_t verifier_memory_bytes = int64_t{1} << 30;
  int chunk_tokens = 64;
  std::string ingest_variants = "snapkv:0.25";
  int draft_len = 8;
  // Adaptive x per request (NextDraftLength) within [1, max_draft_len];
  // max_draft_len <= draft_len keeps x fixed.
  int max_draft_len = 32;
  bool kv_refresh = true;
  // vericache rounds run worker to worker (Verifier.Round): drafts and
  // refresh rows never pass through the coordinator. false: it relays them
  // (Draft, Verify, Commit), as before peer rounds.
  bool peer_rounds = true;
  // With peer_rounds: each request's rounds granted on one Verifier.Lease
  // stream, the next grant sent while the round before runs, so the
  // verifier starts it as soon as that one has committed (no coordinator
  // call between rounds). false: one Verifier.Round call per round.
  bool leases = true;
  // The drafter pool's separate draft model (--draft-model-id): "auto" takes
  // the first worker's (Info draft_model_id), "none" requires drafters of
  // the target, 64 hex digits require that draft model. Every worker must
  // report the same one (worker_compat.h). With a draft model there is no
  // KV refresh, and the remote baselines are refused.
  std::string draft_model_id = "auto";
  // Fallback to full-KV decoding when the mean accepted drafts per round of
  // the last fallback_window rounds is below fallback_min_accepted.
  int fallback_window = 8;
  double fallback_min_accepted = 0.25;
  std::chrono::milliseconds rpc_timeout{10000};
  // How long startup waits for every worker to answer Info.
  std::chrono::milliseconds startup_timeout{60000};
  double lossless_check_fraction = 0;
  int max_message_bytes = 64 << 20;
  int baseline_chunk = 16;  // tokens per Draft call in the remote baselines
  // TLS of the calls to the store and the workers (this daemon's --tls-*
  // files: mutual TLS); empty: plaintext.
  rpc::TlsFiles tls;
  // Who may call (API keys -> tenants, salt derivation); off by default.
  TenantAuthOptions auth;
  // A Generate stream whose reader stops reading (one write blocked this
  // long) is ended (--stream-write-timeout-ms); default 30 s.
  std::chrono::milliseconds stream_write_timeout{30000};
  // Per tenant (the anonymous tenant too when authentication is off):
  // requests running or queued at once, and prefixes pinned through
  // ManagePrefix. Defaults 128 and 64.
  int max_requests_per_tenant = 128;
  int max_pins_per_tenant = 64;
  // Bytes of KV a tenant's ingests may add, as reported by the verifiers
  // (0: no limit). Counted since the coordinator started; a DELETE through
  // ManagePrefix gives back what that prefix's ingest added.
  int64_t max_stored_bytes_per_tenant = 0;
  // Worker health (services/coordinator/worker_health.h): every worker's
  // Info is probed each health_check_interval with health_check_timeout as
  // its deadline; a failed probe or a call failing with UNAVAILABLE marks
  // the worker down (placement skips it) until a probe succeeds again.
  std::chrono::milliseconds health_check_interval{1000};
  std::chrono::milliseconds health_check_timeout{2000};
  // A request whose worker died is re-established on live workers from its
  // prompt plus the tokens accepted so far (they are exact), at most this
  // many times; then it fails with UNAVAILABLE naming what died.
  int max_worker_retries = 2;
  // A session Release that failed at a request's end is retried this many
  // times off the request path (release_retry.h); 0: no retries, the
  // workers' idle timeouts free such sessions.
  int release_retry_attempts = 6;
};

// Bounds on request fields, checked before anything is allocated for them.
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr size_t kMaxCompressorNameBytes = 64;
inline constexpr size_t kMaxTenantSaltBytes = 64;

// Generate, RegisterPrefix and ManagePrefix are on gRPC's callback API:
// each call is a coroutine (Serve, PrefixCatalogue::Register and Manage, on
// the executor) that holds no thread while it waits for its admission, a
// slot, a lease message, the store or a worker. The other methods (Cancel,
// GetRequest, ClusterStatus) are short, call no other process and stay
// synchronous.
class CoordinatorService final
    : public vericache::v1::Coordinator::WithCallbackMethod_Generate<
          vericache::v1::Coordinator::WithCallbackMethod_RegisterPrefix<
              vericache::v1::Coordinator::WithCallbackMethod_ManagePrefix<
                  vericache::v1::Coordinator::Service>>> {
 public:
  // Connects to the store and every worker (waiting for them up to
  // startup_timeout) and checks they all run the same model.
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(
      const CoordinatorOptions& options, metrics::Registry* registry);
  ~CoordinatorService() override;

  // Refuses new requests, cancels running ones, stops the clock.
  void Shutdown();

  grpc::ServerWriteReactor<vericache::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const vericache::v1::GenerateRequest* req) override;
  grpc::Status Cancel(grpc::ServerContext* ctx, const vericache::v1::CancelRequest* req,
                      vericache::v1::CancelResponse* resp) override;
  grpc::Status GetRequest(grpc::ServerContext* ctx, const vericache::v1::GetRequestRequest* req,
                          vericache::v1::RequestStatus* resp) override;
  grpc::Status ClusterStatus(grpc::ServerContext* ctx,
                             const vericache::v1::ClusterStatusRequest* req,
                             vericache::v1::ClusterStatusResponse* resp) override;
  grpc::ServerUnaryReactor* RegisterPrefix(grpc::CallbackServerContext* ctx,
                                           const vericache::v1::RegisterPrefixRequest* req,
                                           vericache::v1::RegisterPrefixResponse* resp) override;
  grpc::ServerUnaryReactor* ManagePrefix(grpc::CallbackServerContext* ctx,
                                         const vericache::v1::ManagePrefixRequest* req,
                                         vericache::v1::ManagePrefixResponse* resp) override;

 private:
  struct Metrics;
  struct StreamWatch;
  class GenerateCall;
  class PrefixCall;

  CoordinatorService(const CoordinatorOptions& options, metrics::Registry* registry);
  absl::Status Connect();

  // One Generate call from its request to its status: Serve, the request's
  // record and metrics, the shadow check; then the call is finished.
  Task<absl::Status> ServeCall(GenerateCall* call, std::shared_ptr<Request> r,
                               vericache::v1::GenerateRequest req);
  // A prefix call's record: its tenant, context, deadline and cancellation.
  std::shared_ptr<Request> PrefixCallRequest(grpc::CallbackServerContext* ctx,
                                             const std::string& tenant);
  // Runs start()'s coroutine on the executor (Shutdown cancels it through
  // r and waits for it), then finishes `call` with its status.
  void StartPrefixCall(PrefixCall* call, std::shared_ptr<Request> r,
                       std::function<Task<absl::Status>()> start);
  // Plans, admits, runs and releases one request; the final message (with
  // totals) is the last thing written to `sink`.
  Task<absl::Status> Serve(const vericache::v1::GenerateRequest& req, Request& r, Sink* sink,
                           std::vector<int32_t>* output);
  // Admission (admission.h): waits (suspended, polling) for a place among
  // the active requests.
  Task<absl::Status> Admit(Request& r);
  void Leave(Request& r);
  // Wakes `r` if it is queued for admission (to see that it was cancelled).
  void WakeIfQueued(const Request& r);
  void WakeIfQueuedLocked(const Request& r);  // mu_ held

  // The caller's identity (UNAUTHENTICATED without a valid key) with the
  // salt its KV keys use: derived when authentication is on (a request salt
  // is then refused), the request's own salt when it is off.
  [[nodiscard]] absl::StatusOr<Identity> Caller(grpc::ServerContextBase* ctx,
                                                const std::string& request_salt);
  // Bounds on a GenerateRequest's sizes and numbers, before any allocation.
  [[nodiscard]] absl::Status CheckBounds(const vericache::v1::GenerateRequest& req) const;
  // `deadline`: the request's (a registered prefix's manifest is read by
  // it, awaited). `req` must outlive the task.
  Task<absl::StatusOr<Plan>> PlanRequest(const vericache::v1::GenerateRequest& req,
                                         Clock::time_point deadline);
  // After `failed` ended a run before any token was sent: true (and the
  // plan's sessions released, a fresh session id taken) when one of the
  // prefix's entries is missing from the store — evicted, or quarantined by
  // the store or a reader because it failed its seal — so the caller ingests
  // again and runs once more instead of failing the request. The store's
  // lookup and the releases are awaited.
  Task<bool> PrepareHeal(Plan& plan, Request& r, const absl::Status& failed);
  // Places the request on live workers and runs it; re-establishes it on
  // live workers (bounded) when a worker it runs on dies.
  Task<absl::Status> Run(Plan& plan, Request& r, Sink* writer);
  Task<absl::Status> RunOnce(Plan& plan, Request& r, Sink* writer);
  // Placement among the live workers (placement.h): the verifier by the
  // prefix (or the session), the drafter least loaded. UNAVAILABLE when the
  // pool has no live worker.
  absl::StatusOr<Worker*> PlaceVerifier(const std::string& prefix_key, uint64_t session = 0);
  absl::Status Place(Plan& plan, vericache::v1::Mode mode);
  // One health probe of a worker (Info, with a deadline; same model): the
  // health checker's, on its thread.
  absl::Status ProbeWorker(WorkerPool pool, int index);
  // The same on gRPC's callback API, for a request: `done` gets the verdict.
  void StartProbeWorker(WorkerPool pool, int index, CallDone done);
  // A probe's verdict from its Info call's status and answer.
  absl::Status ProbeVerdict(WorkerPool pool, const Worker& w, const absl::Status& info,
                            const vericache::v1::WorkerInfoResponse& resp);
  // The model, numerics and stop ids of the first worker: every other must match.
  WorkerModel ExpectedWorkerModel() const;
  // A call to `w` failed with `s`: when the failure says the worker may be
  // gone, probes it now (not at the next round: StartProbeWorker) and marks
  // it down if it is; `done(down)`. Shutdown waits for the probes in flight.
  void StartCheckWorker(WorkerPool pool, Worker& w, const absl::Status& s,
                        std::function<void(bool down)> done);
  // StartCheckWorker for the plan's verifier and drafter (those it has), both
  // at once, awaited by a request: which of them are down.
  struct WorkersDown {
    bool verifier = false;
    bool drafter = false;
  };
  Task<WorkersDown> CheckWorkersAfterFailure(const Plan& plan, const absl::Status& s);
  // Releases the plan's worker sessions (2 s deadline each), awaited; a
  // failed Release is queued for retries off the request path
  // (release_retry_). Always OK.
  Task<absl::Status> ReleaseSessions(Plan& plan);
  // One Release RPC (2 s deadline); `wait_for_ready`: wait within it for a
  // reconnecting channel instead of failing at once. The retries' (their own
  // thread).
  absl::Status ReleaseOn(WorkerPool pool, int index, uint64_t session, bool wait_for_ready);
  // A request's Release (RunnerContext::release): ReleaseOn's call on gRPC's
  // callback API, failing fast; a failure is queued in release_retry_ before
  // `done` hears it.
  void StartReleaseOrRetry(WorkerPool pool, Worker& w, uint64_t session, CallDone done);
  // Auto slot: folds a drafter's step time into the slot duration.
  void Calibrate(double step_seconds);
  void UpdateSchedulerGauges();
  void ShadowCheck(const vericache::v1::GenerateRequest& req, const std::vector<int32_t>& tokens);
  std::chrono::steady_clock::time_point CallDeadline(const Request& r) const;

  CoordinatorOptions options_;
  metrics::Registry* registry_;
  // Where requests run and continue after their waits; declared first so
  // that it goes last (Shutdown has waited for every request before).
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<daemon::StoreClient> store_;
  std::unique_ptr<SlotClock> clock_;
  // What the runners (request_runner.h) get from the service.
  RunnerContext runner_;
  std::vector<std::unique_ptr<Worker>> verifiers_;
  std::vector<std::unique_ptr<Worker>> drafters_;
  kvstore::ModelId model_id_;
  int vocab_ = 0;
  int context_ = 0;
  // The ids that end generation, as the workers report them (all workers
  // must agree: a request may move between them).
  std::vector<int32_t> eos_ids_ = {2};
  int64_t kv_bytes_per_token_ = 0;
  uint32_t numerics_version_ = 0;  // the first worker's; chunk keys use it
  // The pool's separate draft model (options_.draft_model_id); unset: none.
  std::optional<kvstore::ModelId> draft_model_id_;
  bool draft_model_pinned_ = false;  // from the flag, not the first worker
  std::vector<ingest::VariantSpec> default_variants_;
  std::unique_ptr<TenantAuth> auth_;
  std::unique_ptr<StreamWatch> watch_;
  std::unique_ptr<WorkerHealth> health_;
  std::unique_ptr<Placement> placement_;
  std::unique_ptr<ReleaseRetry> release_retry_;

  std::unique_ptr<AdmissionController> admission_;
  std::unique_ptr<CatalogueStore> catalogue_store_;
  std::unique_ptr<PrefixCatalogue> catalogue_;
  // Guards the request table.
  std::mutex mu_;
  // Running requests and a bounded history of finished ones (GetRequest),
  // keyed by (tenant, request id): a tenant sees only its own.
  std::map<std::string, std::shared_ptr<Request>> requests_;
  // RegisterPrefix and ManagePrefix calls not finished, under mu_:
  // Shutdown cancels them, as it does the running requests.
  std::set<std::shared_ptr<Request>> prefix_calls_;
  std::deque<std::string> finished_order_;
  std::atomic<uint64_t> next_session_{1};
  std::atomic<int64_t> next_request_{1};
  std::atomic<int> shadow_checks_running_{0};
  // Generate calls whose coroutine has not returned yet, and worker checks
  // in flight (Shutdown waits for both).
  std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  int calls_running_ = 0;
  int checks_running_ = 0;
  std::mutex calib_mu_;
  double step_ewma_ = 0;
  int calib_samples_ = 0;
};

}  // namespace vc::coordinator
