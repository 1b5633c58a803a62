#include "services/coordinator/coordinator_service.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/kvstore/kv_store.h"
#include "common/rpc/rpc.h"
#include "common/speculative/accept_rule.h"
#include "services/common/daemon.h"
#include "services/common/sampling_config.h"
#include "services/coordinator/queued_writer.h"
#include "services/coordinator/request_validation.h"

namespace vc::coordinator {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kFinishedHistory = 1024;
// Bound on GenerateRequest.stop_token_ids (checked before anything is planned).
constexpr int kMaxStopTokenIds = 64;
// deadline_ms beyond this is refused (the sum with now must not overflow).
constexpr int64_t kMaxDeadlineMs = int64_t{24} * 3600 * 1000;

// The request executor's threads at most: the cores, and never fewer than 4
// (a coordinator on a small pod still overlaps its requests' work with the
// scheduling of others).
int ExecutorThreads() { return std::max(4, static_cast<int>(std::thread::hardware_concurrency())); }

// Requests are kept per (tenant, id): the same id in two tenants is two
// requests, and one tenant cannot name another's.
std::string RequestKey(const std::string& tenant, const std::string& id) {
  return absl::StrCat(tenant.size(), ":", tenant, id);
}

// A call's gRPC deadline on the steady clock the coordinator's requests
// keep; none (max) when the caller set none.
Clock::time_point ServerCallDeadline(const grpc::ServerContextBase& ctx) {
  const auto grpc_deadline = ctx.deadline();
  if (grpc_deadline == std::chrono::system_clock::time_point::max()) {
    return Clock::time_point::max();
  }
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            grpc_deadline - std::chrono::system_clock::now());
}

}  // namespace

// ------------------------------------------------------------- internals

// Ends Generate streams whose reader stopped reading: every write in flight
// is registered, and one thread cancels the call of a write that has been
// pending longer than the timeout (the request then ends as cancelled).
// gRPC's writes have no deadline of their own.
struct CoordinatorService::StreamWatch {
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  uint64_t next = 1;
  std::map<uint64_t, std::pair<grpc::ServerContextBase*, Clock::time_point>> writes;
  std::thread thread;

  explicit StreamWatch(std::chrono::milliseconds t) : timeout(t) {
    thread = std::thread([this] { Loop(); });
  }
  ~StreamWatch() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  uint64_t Begin(grpc::ServerContextBase* ctx) {
    std::lock_guard<std::mutex> lock(mu);
    const uint64_t id = next++;
    writes[id] = {ctx, Clock::now()};
    return id;
  }
  void End(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    writes.erase(id);
  }
  void Loop() {
    const auto tick = std::min<std::chrono::milliseconds>(
        timeout / 4 + std::chrono::milliseconds(1), std::chrono::milliseconds(250));
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, tick);
      const auto now = Clock::now();
      for (auto it = writes.begin(); it != writes.end();) {
        if (now - it->second.second >= timeout) {
          it->second.first->TryCancel();
          it = writes.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
};

namespace {
// The coordinator's acceptance-collapse rule: common/speculative's policy
// with its own window and minimum (rounds with at least two drafts).
FallbackPolicy AcceptanceFallback(const CoordinatorOptions& o) {
  return FallbackPolicy(
      FallbackOptions{.window = o.fallback_window, .min_accepted = o.fallback_min_accepted});
}
}  // namespace

struct CoordinatorService::Metrics {
  metrics::CounterFamily* requests;
  metrics::HistogramFamily* ttft;
  metrics::HistogramFamily* tpot;
  metrics::Histogram* accepted_per_round;
  metrics::Counter* wasted;
  metrics::Counter* rounds;
  metrics::Counter* fallbacks;
  metrics::Counter* rejections;
  metrics::Counter* workers_refused;
  metrics::Gauge* queue_depth;
  metrics::Gauge* active;
  metrics::GaugeFamily* link_occupancy;
  metrics::GaugeFamily* memory_booked;
  metrics::GaugeFamily* memory_resident;
  metrics::Counter* scheduler_queued;
  metrics::CounterFamily* lossless_check;
  metrics::GaugeFamily* worker_up;
  metrics::CounterFamily* retries;
  metrics::Counter* kv_heals;
  metrics::CounterFamily* release_retries;
};

CoordinatorService::CoordinatorService(const CoordinatorOptions& options,
                                       metrics::Registry* registry)
    : options_(options), registry_(registry), metrics_(std::make_unique<Metrics>()) {
  Metrics& m = *metrics_;
  m.requests = daemon::MustCounter(registry, "vericache_requests_total",
                                   "Generate requests by mode and outcome "
                                   "(ok, error, cancelled, rejected).",
                                   {"mode", "outcome"});
  m.ttft =
      daemon::MustHistogram(registry, "vericache_ttft_seconds", "Time to the first verified token.",
                            {"mode"}, daemon::SecondsBuckets());
  m.tpot = daemon::MustHistogram(registry, "vericache_time_per_output_token_seconds",
                                 "Mean time per output token after the first, per request.",
                                 {"mode"}, daemon::SecondsBuckets());
  m.accepted_per_round = &daemon::MustHistogram(registry, "vericache_accepted_tokens_per_round",
                                                "Drafts accepted per verify round.", {},
                                                {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64})
                              ->Get();
  m.wasted = &daemon::MustCounter(registry, "vericache_drafted_tokens_wasted_total",
                                  "Drafts the verifier rejected.")
                  ->Get();
  m.rounds =
      &daemon::MustCounter(registry, "vericache_verify_rounds_total", "Verify passes.")->Get();
  m.fallbacks = &daemon::MustCounter(registry, "vericache_fallbacks_total",
                                     "Requests that fell back to full-KV decoding.")
                     ->Get();
  m.rejections = &daemon::MustCounter(
                      registry, "vericache_admission_rejections_total",
                      "Generate calls and prefix registrations refused by admission (the queue "
                      "full, or the tenant at --max-requests-per-tenant).")
                      ->Get();
  m.workers_refused =
      &daemon::MustCounter(registry, "vericache_workers_refused_total",
                           "Workers refused at startup: another model id, numerics version or "
                           "end-of-sequence set than the first worker's.")
           ->Get();
  m.queue_depth =
      &daemon::MustGauge(registry, "vericache_queue_depth", "Requests waiting for admission.")
           ->Get();
  m.active = &daemon::MustGauge(registry, "vericache_active_requests", "Requests running.")->Get();
  m.link_occupancy = daemon::MustGauge(registry, "vericache_scheduler_link_occupancy_ratio",
                                       "Booked transfer seconds / slot seconds in the current "
                                       "slot, per link.",
                                       {"link"});
  m.memory_booked = daemon::MustGauge(registry, "vericache_scheduler_memory_booked_bytes",
                                      "Transient full KV booked on a verifier in the current slot.",
                                      {"verifier"});
  m.memory_resident = daemon::MustGauge(
      registry, "vericache_scheduler_memory_resident_bytes",
      "Full KV held resident on a verifier by sessions decoding there alone (full_local, "
      "fallback); the scheduler books reloads only into the rest.",
      {"verifier"});
  m.scheduler_queued = &daemon::MustCounter(registry, "vericache_scheduler_queued_total",
                                            "Admit attempts the ring scheduler answered queued.")
                            ->Get();
  m.lossless_check =
      daemon::MustCounter(registry, "vericache_lossless_check_total",
                          "Shadow checks of vericache output against full_local.", {"result"});
  m.worker_up = daemon::MustGauge(registry, "vericache_worker_up",
                                  "1 while a worker answers its health checks, 0 while it is "
                                  "down (placement skips it).",
                                  {"pool", "index"});
  m.retries = daemon::MustCounter(registry, "vericache_request_retries_total",
                                  "Requests re-established on live workers after a worker they "
                                  "ran on died, by the pool of the worker that died.",
                                  {"pool"});
  m.kv_heals =
      &daemon::MustCounter(registry, "vericache_kv_heals_total",
                           "Requests whose stored prefix went missing while they were served "
                           "(an entry quarantined for failing its seal, or evicted): the "
                           "prefix was ingested again and the request run again.")
           ->Get();
  m.release_retries = daemon::MustCounter(
      registry, "vericache_release_retries_total",
      "Worker session releases that failed at a request's end and were retried in the "
      "background, by outcome (queued, released, gave_up, dropped: the queue was full).",
      {"outcome"});
}

CoordinatorService::~CoordinatorService() { Shutdown(); }

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    const CoordinatorOptions& options, metrics::Registry* registry) {
  if (options.verifiers.empty()) return absl::InvalidArgumentError("--verifiers is required");
  if (options.drafters.empty()) return absl::InvalidArgumentError("--drafters is required");
  if (options.chunk_tokens < 1) return absl::InvalidArgumentError("--chunk-tokens must be >= 1");
  if (options.draft_len < 1) return absl::InvalidArgumentError("--draft-len must be >= 1");
  if (options.max_active_requests < 1 || options.max_queued_requests < 0) {
    return absl::InvalidArgumentError(
        "--max-active-requests must be >= 1 and --max-queued-requests >= 0");
  }
  if (options.lossless_check_fraction < 0 || options.lossless_check_fraction > 1) {
    return absl::InvalidArgumentError("--lossless-check-fraction must be in [0, 1]");
  }
  if (options.max_draft_len < 1) return absl::InvalidArgumentError("--max-draft-len must be >= 1");
  if (options.health_check_interval.count() < 1 || options.health_check_timeout.count() < 1 ||
      options.max_worker_retries < 0) {
    return absl::InvalidArgumentError(
        "--health-check-interval-ms and --health-check-timeout-ms must be >= 1, "
        "--max-worker-retries >= 0");
  }
  if (options.stream_write_timeout.count() < 1) {
    return absl::InvalidArgumentError("--stream-write-timeout-ms must be >= 1");
  }
  // A restarted coordinator counts a tenant's pins by listing their holders
  // in the store, at most KvStore::kMaxPinHoldersListed of them.
  if (options.max_requests_per_tenant < 1 || options.max_pins_per_tenant < 0 ||
      options.max_pins_per_tenant >= kvstore::KvStore::kMaxPinHoldersListed ||
      options.max_stored_bytes_per_tenant < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-requests-per-tenant must be >= 1, --max-pins-per-tenant in [0, ",
        kvstore::KvStore::kMaxPinHoldersListed - 1, "], --max-stored-bytes-per-tenant >= 0"));
  }
  auto service = std::unique_ptr<CoordinatorService>(new CoordinatorService(options, registry));
  if (options.draft_model_id != "auto") {
    service->draft_model_pinned_ = true;
    if (options.draft_model_id != "none") {
      const std::string& hex = options.draft_model_id;
      if (hex.size() != 64 || !std::all_of(hex.begin(), hex.end(), [](char c) {
            return absl::ascii_isxdigit(static_cast<unsigned char>(c));
          })) {
        return absl::InvalidArgumentError(
            "--draft-model-id must be auto, none or 64 hex digits (a worker's draft model id)");
      }
      VC_ASSIGN_OR_RETURN(service->draft_model_id_,
                          kvstore::ChunkKey::FromRaw(absl::HexStringToBytes(hex)));
    }
  }
  VC_ASSIGN_OR_RETURN(service->auth_, TenantAuth::Create(options.auth));
  VC_ASSIGN_OR_RETURN(service->default_variants_,
                      ingest::ParseVariantList(options.ingest_variants));
  if (service->default_variants_.empty()) {
    return absl::InvalidArgumentError("--ingest-variants must name at least one variant");
  }
  if (service->default_variants_.size() > kMaxVariantsPerPrefix) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ingest-variants names more than ", kMaxVariantsPerPrefix, " variants"));
  }
  VC_RETURN_IF_ERROR(service->Connect());
  service->admission_ = std::make_unique<AdmissionController>(
      AdmissionOptions{.max_active = options.max_active_requests,
                       .max_queued = options.max_queued_requests,
                       .max_requests_per_tenant = options.max_requests_per_tenant,
                       .max_pins_per_tenant = options.max_pins_per_tenant,
                       .max_stored_bytes_per_tenant = options.max_stored_bytes_per_tenant},
      AdmissionMetrics{.rejections = service->metrics_->rejections,
                       .queue_depth = service->metrics_->queue_depth,
                       .active = service->metrics_->active});
  RingSchedulerOptions ro;
  ro.slot_seconds = options.slot_seconds;
  ro.window_slots = options.window_slots;
  ro.lock_step = options.lock_step;
  ro.pack_reloads = options.pack_reloads;
  // The store's NIC is one shared link per class (DESIGN.md section 6),
  // at the indices the runners book on (slot_clock.h).
  ro.links.resize(kLinkCount);
  ro.links[kFastLink] = RingLink{kLinkNames[kFastLink], options.fast_link_bytes_per_second,
                                 RingLink::Sharing::kShared, -1};
  ro.links[kSlowLink] = RingLink{kLinkNames[kSlowLink], options.slow_link_bytes_per_second,
                                 RingLink::Sharing::kShared, -1};
  for (const auto& v : service->verifiers_) {
    ro.gpus.push_back(RingGpu{v->address, options.verifier_memory_bytes});
  }
  VC_ASSIGN_OR_RETURN(service->clock_, SlotClock::Create(ro));
  service->watch_ = std::make_unique<StreamWatch>(options.stream_write_timeout);
  CoordinatorService* self = service.get();
  WorkerHealthOptions ho;
  ho.interval = options.health_check_interval;
  service->health_ = std::make_unique<WorkerHealth>(
      static_cast<int>(service->verifiers_.size()), static_cast<int>(service->drafters_.size()),
      [self](WorkerPool pool, int i) { return self->ProbeWorker(pool, i); }, ho,
      [self](WorkerPool pool, int i, bool up, const absl::Status& why) {
        self->metrics_->worker_up->Labels({WorkerPoolName(pool), absl::StrCat(i)}).Set(up ? 1 : 0);
        const auto& workers = pool == WorkerPool::kVerifier ? self->verifiers_ : self->drafters_;
        const std::string address = workers[static_cast<size_t>(i)]->address;
        if (up) {
          std::fprintf(stderr, "vc-coordinator: %s %s is up again\n", WorkerPoolName(pool),
                       address.c_str());
        } else {
          std::fprintf(stderr, "vc-coordinator: %s %s is down: %s\n", WorkerPoolName(pool),
                       address.c_str(), std::string(why.message()).c_str());
        }
      });
  for (size_t i = 0; i < service->verifiers_.size(); ++i) {
    service->metrics_->worker_up->Labels({"verifier", absl::StrCat(i)}).Set(1);
  }
  for (size_t i = 0; i < service->drafters_.size(); ++i) {
    service->metrics_->worker_up->Labels({"drafter", absl::StrCat(i)}).Set(1);
  }
  service->health_->Start();
  service->catalogue_store_ = StoreClientCatalogue(service->store_.get());
  service->catalogue_ = std::make_unique<PrefixCatalogue>(
      CatalogueOptions{.chunk_tokens = options.chunk_tokens,
                       .ingest_variants = options.ingest_variants,
                       .rpc_timeout = options.rpc_timeout,
                       .max_worker_retries = options.max_worker_retries},
      CatalogueModel{.model_id = service->model_id_,
                     .numerics_version = service->numerics_version_,
                     .vocab = service->vocab_,
                     .context = service->context_,
                     .kv_bytes_per_token = service->kv_bytes_per_token_,
                     .draft_model_id = service->draft_model_id_},
      service->catalogue_store_.get(), service->admission_.get(),
      CatalogueHooks{
          .place_verifier =
              [self](const std::string& prefix_key) { return self->PlaceVerifier(prefix_key); },
          .worker_failed =
              [self](WorkerPool pool, Worker& w, const absl::Status& s,
                     std::function<void(bool)> done) {
                self->StartCheckWorker(pool, w, s, std::move(done));
              },
          .on_retry = [self] { self->metrics_->retries->Labels({"verifier"}).Inc(); },
          .admit = [self](Request& r) { return self->Admit(r); }});
  RunnerContext& rc = service->runner_;
  // A separate draft model's KV is its own: the verifier's rows (the
  // target's K/V) would be wrong in it, so none are made or sent.
  rc.options = RunnerOptions{.max_draft_len = options.max_draft_len,
                             .kv_refresh = options.kv_refresh && !service->draft_model_id_,
                             .peer_rounds = options.peer_rounds,
                             .leases = options.leases,
                             .baseline_chunk = options.baseline_chunk,
                             .rpc_timeout = options.rpc_timeout};
  rc.clock = service->clock_.get();
  // Nothing a request waits for holds an executor thread (a slot, its
  // lease, admission, a worker's or the store's answer, a release, a worker
  // probe, room to write: all awaited), so the executor needs threads for
  // the requests' own work, about one per core, not one per request.
  service->executor_ =
      std::make_unique<Executor>(ExecutorOptions{.max_threads = ExecutorThreads()});
  rc.executor = service->executor_.get();
  rc.eos_ids = service->eos_ids_;
  rc.kv_bytes_per_token = service->kv_bytes_per_token_;
  if (service->draft_model_id_) rc.draft_model = kvstore::ShortModelId(*service->draft_model_id_);
  rc.metrics = RunnerMetrics{.ttft = service->metrics_->ttft,
                             .accepted_per_round = service->metrics_->accepted_per_round,
                             .wasted = service->metrics_->wasted,
                             .rounds = service->metrics_->rounds,
                             .fallbacks = service->metrics_->fallbacks,
                             .scheduler_queued = service->metrics_->scheduler_queued};
  rc.worker_failed = [self](WorkerPool pool, Worker& w, const absl::Status& s,
                            std::function<void(bool)> done) {
    self->StartCheckWorker(pool, w, s, std::move(done));
  };
  rc.release = [self](WorkerPool pool, Worker& w, uint64_t session, CallDone done) {
    self->StartReleaseOrRetry(pool, w, session, std::move(done));
  };
  rc.calibrate = [self](double step_seconds) { self->Calibrate(step_seconds); };
  rc.update_gauges = [self] { self->UpdateSchedulerGauges(); };
  service->placement_ =
      std::make_unique<Placement>(service->health_.get(), options.verifiers, options.drafters);
  service->release_retry_ = std::make_unique<ReleaseRetry>(
      [self](WorkerPool pool, int i, uint64_t session) {
        // Off the request path: a worker that is reconnecting (just
        // restarted) may be waited for; Release is idempotent.
        return self->ReleaseOn(pool, i, session, /*wait_for_ready=*/true);
      },
      ReleaseRetryOptions{.max_attempts = options.release_retry_attempts},
      [self](ReleaseRetry::Outcome o) {
        self->metrics_->release_retries->Labels({ReleaseRetry::OutcomeName(o)}).Inc();
      });
  service->release_retry_->Start();
  return service;
}

absl::Status CoordinatorService::Connect() {
  daemon::StoreClientOptions so;
  so.control_address = options_.kvstore;
  // Each call gets --rpc-timeout-ms (as the flag says); only the first
  // contact waits as long as the workers may take to start.
  so.timeout = options_.rpc_timeout;
  so.connect_timeout = options_.startup_timeout;
  so.max_message_bytes = options_.max_message_bytes;
  so.tls = options_.tls;
  // The coordinator never fetches chunk bytes; it only needs the control
  // plane, but the client asks the store which data plane it runs.
  so.data_plane = "";
  so.metrics = registry_;  // vericache_store_call_retries_total
  VC_ASSIGN_OR_RETURN(store_, daemon::StoreClient::Create(so));
  std::string model;
  auto info_of = [&](Worker& w, bool verifier) -> absl::Status {
    pb::WorkerInfoRequest req;
    pb::WorkerInfoResponse resp;
    WorkerCallOptions o = CallWithin(options_.startup_timeout);
    o.wait_for_ready = true;
    const absl::Status s = w.client().Info(o, req, &resp);
    if (!s.ok()) {
      return WithCallName(s, absl::StrCat(verifier ? "verifier " : "drafter ", w.address, " Info"));
    }
    if (resp.role() != (verifier ? "verifier" : "drafter")) {
      return absl::FailedPreconditionError(absl::StrCat(
          w.address, " is a ", resp.role(), ", listed as a ", verifier ? "verifier" : "drafter"));
    }
    const WorkerModel reported = WorkerModelOf(resp);
    absl::Status refused;
    if (model.empty()) {
      model = resp.model_id();
      VC_ASSIGN_OR_RETURN(model_id_, kvstore::ChunkKey::FromRaw(model));
      vocab_ = resp.vocab_size();
      context_ = resp.context_length();
      eos_ids_ = reported.eos_ids;
      kv_bytes_per_token_ = resp.kv_bytes_per_token();
      numerics_version_ = resp.numerics_version();
      if (!draft_model_pinned_ && !resp.draft_model_id().empty()) {
        VC_ASSIGN_OR_RETURN(draft_model_id_, kvstore::ChunkKey::FromRaw(resp.draft_model_id()));
      }
    }
    // The first worker too: its draft model may be pinned by the flag.
    refused = CheckSameModel(ExpectedWorkerModel(), reported, w.address);
    if (!refused.ok()) {
      metrics_->workers_refused->Inc();
      std::fprintf(stderr, "vc-coordinator: refusing a worker: %s\n",
                   std::string(refused.message()).c_str());
    }
    return refused;
  };
  for (size_t i = 0; i < options_.verifiers.size(); ++i) {
    auto w = std::make_unique<Worker>();
    w->address = options_.verifiers[i];
    w->index = static_cast<int>(i);
    w->verifier = MakeGrpcVerifierClient(w->address, options_.max_message_bytes, options_.tls);
    VC_RETURN_IF_ERROR(info_of(*w, true));
    verifiers_.push_back(std::move(w));
  }
  for (size_t i = 0; i < options_.drafters.size(); ++i) {
    auto w = std::make_unique<Worker>();
    w->address = options_.drafters[i];
    w->index = static_cast<int>(i);
    w->drafter = MakeGrpcDrafterClient(w->address, options_.max_message_bytes, options_.tls);
    VC_RETURN_IF_ERROR(info_of(*w, false));
    drafters_.push_back(std::move(w));
  }
  return absl::OkStatus();
}

void CoordinatorService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, r] : requests_) {
      r->cancelled = true;
      // A running call's context lives until it is finished, which its
      // coroutine does only after leaving this state (under mu_). Cancelled,
      // a request held up by its reader (a full write queue) ends too.
      if (r->is_generate && r->server_ctx != nullptr &&
          (r->state == "running" || r->state == "queued")) {
        r->server_ctx->TryCancel();
      }
    }
    // A registration's ingest is cancelled with its call, and a ManagePrefix
    // stops at its next key.
    for (const auto& r : prefix_calls_) {
      r->cancelled = true;
      r->server_ctx->TryCancel();
    }
  }
  if (admission_) admission_->Stop();
  if (health_) health_->Stop();
  if (release_retry_) release_retry_->Stop();
  // A stopped clock ends every wait at once (a request waiting for a slot
  // or for its lease's next message continues, finds itself cancelled and
  // returns): then every Generate coroutine and worker check in flight, and
  // the shadow checks on their own threads, are waited for before the
  // service (and the executor they continue on) goes away.
  if (clock_) clock_->Stop();
  {
    std::unique_lock<std::mutex> lock(calls_mu_);
    calls_cv_.wait(lock, [&] { return calls_running_ == 0 && checks_running_ == 0; });
  }
  while (shadow_checks_running_.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Clock::time_point CoordinatorService::CallDeadline(const Request& r) const {
  return std::min(r.deadline, Clock::now() + options_.rpc_timeout);
}

// ------------------------------------------------------------- admission

namespace {

// How often a queued request looks at its deadline without being woken (a
// place freed, a Cancel or its client going away wakes it at once).
constexpr auto kQueuePoll = std::chrono::milliseconds(100);

}  // namespace

Task<absl::Status> CoordinatorService::Admit(Request& r) {
  VC_CO_ASSIGN_OR_RETURN(const AdmissionController::Entered entered, admission_->Enter(r.tenant));
  AdmissionController::Entry entry = entered.entry;
  if (entry == AdmissionController::Entry::kQueued) {
    std::lock_guard<std::mutex> lock(mu_);
    r.admission_ticket = entered.ticket;
  }
  while (entry == AdmissionController::Entry::kQueued) {
    // Queued, suspended: woken when a place is handed to this request (the
    // queue is first come, first served), by a Cancel, a client that went
    // away or Stop, and at least every kQueuePoll to look at its deadline.
    // Whichever comes first resumes it (once); the other is cancelled. A
    // stopped clock answers at once; TryStart then finds the controller
    // stopped too.
    bool told = false;
    SlotClock::NotifyId poll_id = 0;
    co_await Suspend(executor_.get(), [&](auto resume) {
      auto once = std::make_shared<std::atomic<bool>>(false);
      auto wake = [once, resume] {
        if (!once->exchange(true)) resume();
      };
      told = admission_->NotifyTurn(entered.ticket, wake);
      if (!told) return wake();
      poll_id = clock_->NotifyAt(std::min(r.deadline, Clock::now() + kQueuePoll),
                                 [wake](bool) { wake(); });
    });
    if (told) admission_->CancelNotifyTurn(entered.ticket);
    if (poll_id != 0) (void)clock_->CancelNotify(poll_id);
    VC_CO_ASSIGN_OR_RETURN(entry,
                           admission_->TryStart(r.tenant, entered.ticket, r.gone(), r.deadline));
  }
  std::lock_guard<std::mutex> lock(mu_);
  r.state = "running";
  r.admission_ticket = 0;
  co_return absl::OkStatus();
}

void CoordinatorService::WakeIfQueued(const Request& r) {
  std::lock_guard<std::mutex> lock(mu_);
  WakeIfQueuedLocked(r);
}

void CoordinatorService::WakeIfQueuedLocked(const Request& r) {
  // A ticket of 0 (not queued yet) or one that left the queue wakes nobody.
  if (r.state == "queued") admission_->Wake(r.admission_ticket);
}

void CoordinatorService::Leave(Request& r) { admission_->Leave(r.tenant, r.is_generate); }

// ------------------------------------------------------------ identity

absl::StatusOr<Identity> CoordinatorService::Caller(grpc::ServerContextBase* ctx,
                                                    const std::string& request_salt) {
  if (!auth_->enabled()) {
    if (request_salt.size() > kMaxTenantSaltBytes) {
      return absl::InvalidArgumentError(absl::StrCat("tenant_salt is ", request_salt.size(),
                                                     " bytes, the limit is ", kMaxTenantSaltBytes));
    }
    Identity id;
    id.salt = request_salt;
    return id;
  }
  absl::string_view authorization;
  const auto& md = ctx->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  // A client certificate on the public port is optional; gRPC has verified
  // it against the cluster CA when the peer counts as authenticated.
  std::string certificate_cn;
  if (const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      if (!cn.empty()) certificate_cn.assign(cn.data(), cn.size());
    }
  }
  VC_ASSIGN_OR_RETURN(Identity id, auth_->Authenticate(authorization, ctx->peer(), certificate_cn));
  if (!request_salt.empty()) {
    return absl::InvalidArgumentError(
        "tenant_salt must be empty when authentication is on: the server derives the tenant's "
        "salt from its API key");
  }
  return id;
}

absl::Status CoordinatorService::CheckBounds(const pb::GenerateRequest& req) const {
  if (req.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id is ", req.request_id().size(),
                                                   " bytes, the limit is ", kMaxRequestIdBytes));
  }
  if (req.compressor().size() > kMaxCompressorNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("compressor name is longer than the limit of ",
                                                   kMaxCompressorNameBytes, " bytes"));
  }
  if (req.prompt_ids_size() > context_ || req.suffix_ids_size() > context_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has more tokens than the model's context of ", context_, " tokens"));
  }
  if (req.max_new_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens must be >= 1, got ", req.max_new_tokens()));
  }
  // Bounded on its own first, so the sum with the prompt cannot overflow.
  if (req.max_new_tokens() > context_) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens ", req.max_new_tokens(),
                                                   " exceeds the model's context of ", context_,
                                                   " tokens"));
  }
  const int max_x = std::max(options_.draft_len, options_.max_draft_len);
  if (req.draft_len() < 0 || req.draft_len() > max_x) {
    return absl::InvalidArgumentError(absl::StrCat("draft_len must be in [0, ", max_x,
                                                   "] (--max-draft-len), got ", req.draft_len()));
  }
  if (req.deadline_ms() < 0 || req.deadline_ms() > kMaxDeadlineMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline_ms must be in [0, ", kMaxDeadlineMs, "], got ", req.deadline_ms()));
  }
  if (!req.compressor().empty() && !(req.ratio() >= 0 && req.ratio() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("ratio must be in (0, 1], got ", req.ratio()));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- Generate

// One Generate call on gRPC's callback API and the Sink its request writes
// to (queued_writer.h: messages queued and written one at a time; the call
// finishes once its coroutine has returned and the queue has drained). A
// reader that falls kMaxQueued messages behind holds the request up: the
// runner awaits room before each message (AwaitWritable; no thread waits),
// so a client that stops reading stops its request's rounds, and the stream
// watch ends it after --stream-write-timeout-ms. A write that fails, or a cancelled call, makes
// every later Write answer false, and the request ends as cancelled.
class CoordinatorService::GenerateCall final : public QueuedWriteReactor<pb::GenerateResponse>,
                                               public Sink {
 public:
  // `on_cancel`: called when the client cancels or goes away (a queued
  // request then leaves the admission queue at once).
  GenerateCall(grpc::CallbackServerContext* ctx, StreamWatch* watch,
               std::function<void()> on_cancel)
      : QueuedWriteReactor(kMaxQueued),
        ctx_(ctx),
        watch_(watch),
        on_cancel_(std::move(on_cancel)) {}

  static constexpr size_t kMaxQueued = 16;

  bool Write(const pb::GenerateResponse& msg) override { return QueuedWriteReactor::Write(msg); }
  bool Writable() override { return QueuedWriteReactor::Writable(); }
  void WhenWritable(std::function<void()> ready) override {
    QueuedWriteReactor::WhenWritable(std::move(ready));
  }
  void Abandon() override {
    Break();
    ctx_->TryCancel();
  }

 private:
  void WriteStarted() override { write_id_ = watch_->Begin(ctx_); }
  void WriteEnded() override { watch_->End(write_id_); }
  void Cancelled() override {
    if (on_cancel_) on_cancel_();
  }

  grpc::CallbackServerContext* const ctx_;
  StreamWatch* const watch_;
  const std::function<void()> on_cancel_;
  uint64_t write_id_ = 0;  // the write in flight (at most one), in watch_
};

grpc::ServerWriteReactor<pb::GenerateResponse>* CoordinatorService::Generate(
    grpc::CallbackServerContext* ctx, const pb::GenerateRequest* req) {
  // The request record exists before the call, so that the call's cancel
  // wakes this request alone if it is queued (not every queued request).
  auto r = std::make_shared<Request>();
  auto* call = new GenerateCall(ctx, watch_.get(), [this, weak = std::weak_ptr<Request>(r)] {
    if (std::shared_ptr<Request> queued = weak.lock()) WakeIfQueued(*queued);
  });
  absl::StatusOr<Identity> who = Caller(ctx, req->tenant_salt());
  if (!who.ok()) {
    call->FinishWhenWritten(rpc::ToGrpcStatus(who.status()));
    return call;
  }
  // Checked before the request is recorded: a refused request keeps nothing.
  if (absl::Status s = CheckBounds(*req); !s.ok()) {
    call->FinishWhenWritten(rpc::ToGrpcStatus(s));
    return call;
  }
  // With authentication on, every key the request makes uses the derived
  // salt (the request's own was refused above).
  pb::GenerateRequest request = *req;
  if (auth_->enabled()) request.set_tenant_salt(who->salt);
  r->id = request.request_id().empty() ? absl::StrCat("req-", next_request_.fetch_add(1))
                                       : request.request_id();
  r->tenant = who->tenant;
  r->server_ctx = ctx;
  r->sink = call;
  r->mode = request.mode() == pb::MODE_UNSPECIFIED ? pb::MODE_VERICACHE : request.mode();
  r->start = Clock::now();
  r->client_gone = [ctx] { return ctx->IsCancelled(); };
  r->deadline = ServerCallDeadline(*ctx);
  const std::string key = RequestKey(r->tenant, r->id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(key);
    if (it != requests_.end() &&
        (it->second->state == "running" || it->second->state == "queued")) {
      call->FinishWhenWritten(rpc::ToGrpcStatus(
          absl::AlreadyExistsError(absl::StrCat("request ", r->id, " is already running"))));
      return call;
    }
    requests_[key] = r;
  }
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    ++calls_running_;
  }
  // Planning and ingest call workers: not on gRPC's thread.
  executor_->Post([this, call, r, request = std::move(request)]() mutable {
    Spawn(ServeCall(call, std::move(r), std::move(request)), [this](const absl::Status&) {
      std::lock_guard<std::mutex> lock(calls_mu_);
      --calls_running_;
      calls_cv_.notify_all();
    });
  });
  return call;
}

Task<absl::Status> CoordinatorService::ServeCall(GenerateCall* call, std::shared_ptr<Request> r,
                                                 pb::GenerateRequest req) {
  const char* mode = ModeName(r->mode);
  const std::string key = RequestKey(r->tenant, r->id);
  std::vector<int32_t> output;
  const absl::Status s = co_await Serve(req, *r, call, &output);
  const char* outcome = s.ok()                                             ? "ok"
                        : s.code() == absl::StatusCode::kCancelled         ? "cancelled"
                        : s.code() == absl::StatusCode::kResourceExhausted ? "rejected"
                                                                           : "error";
  metrics_->requests->Labels({mode, outcome}).Inc();
  {
    std::lock_guard<std::mutex> lock(mu_);
    r->state =
        s.ok() ? "done" : (s.code() == absl::StatusCode::kCancelled ? "cancelled" : "failed");
    r->error = std::string(s.message());
    finished_order_.push_back(key);
    while (finished_order_.size() > kFinishedHistory) {
      auto it = requests_.find(finished_order_.front());
      if (it != requests_.end() && it->second->state != "running" &&
          it->second->state != "queued") {
        requests_.erase(it);
      }
      finished_order_.pop_front();
    }
  }
  // Rejection sampling is distribution-identical, not token-identical, to
  // full-KV decoding: there is nothing to compare token by token.
  if (s.ok() && r->mode == pb::MODE_VERICACHE && options_.lossless_check_fraction > 0 &&
      req.sampling().mode() != pb::SamplingConfig::REJECTION) {
    ShadowCheck(req, output);
  }
  call->FinishWhenWritten(rpc::ToGrpcStatus(s));
  co_return s;
}

Task<absl::Status> CoordinatorService::Serve(const pb::GenerateRequest& req, Request& r, Sink* sink,
                                             std::vector<int32_t>* output) {
  VC_CO_RETURN_IF_ERROR(CheckBounds(req));
  if (req.deadline_ms() > 0) {
    r.deadline = std::min(r.deadline, Clock::now() + std::chrono::milliseconds(req.deadline_ms()));
  }
  VC_CO_ASSIGN_OR_RETURN(Plan plan, co_await PlanRequest(req, r.deadline));
  VC_CO_RETURN_IF_ERROR(co_await Admit(r));
  absl::Status status = co_await catalogue_->EnsureStored(runner_, plan, r);
  if (status.ok()) status = co_await Run(plan, r, sink);
  // (No co_await inside a condition here or in PrepareHeal: GCC 12.2 built
  // PrepareHeal's `if (!co_await ...)` into a coroutine that died of SIGILL
  // when resumed, even on a path that never reached that await.)
  bool heal = false;
  if (!status.ok()) heal = co_await PrepareHeal(plan, r, status);
  if (heal) {
    status = co_await catalogue_->EnsureStored(runner_, plan, r);
    if (status.ok()) status = co_await Run(plan, r, sink);
  }
  (void)co_await ReleaseSessions(plan);
  Leave(r);
  VC_CO_RETURN_IF_ERROR(status);
  pb::GenerateResponse last;
  last.set_request_id(r.id);
  last.set_final(true);
  pb::GenerateTotals& t = *last.mutable_totals();
  t = plan.totals;
  for (int32_t tok : plan.output) t.add_tokens(tok);
  t.set_stopped_at_eos(plan.stopped_at_eos);
  t.set_total_ms(std::chrono::duration<double, std::milli>(Clock::now() - r.start).count());
  t.set_prefix_tokens(plan.prefix_tokens);
  if (plan.verifier) t.set_verifier(plan.verifier->address);
  if (plan.drafter) t.set_drafter(plan.drafter->address);
  if (plan.output.size() > 1 && plan.first_token_sent) {
    const double after_first =
        std::chrono::duration<double>(Clock::now() - plan.first_token_time).count();
    metrics_->tpot->Labels({ModeName(r.mode)})
        .Observe(after_first / static_cast<double>(plan.output.size() - 1));
  }
  (void)co_await AwaitWritable(runner_, r, sink);
  if (!sink->Write(last)) {
    co_return absl::CancelledError("the stream ended before its final message");
  }
  *output = plan.output;
  co_return absl::OkStatus();
}

Task<absl::StatusOr<Plan>> CoordinatorService::PlanRequest(const pb::GenerateRequest& req,
                                                           Clock::time_point deadline) {
  Plan plan;
  plan.req = req;
  VC_CO_RETURN_IF_ERROR(CheckPromptSource(req));
  if (draft_model_id_ &&
      (req.mode() == pb::MODE_FULL_REMOTE || req.mode() == pb::MODE_LOSSY_REMOTE)) {
    // Their drafters decode alone: with a draft model that would be the
    // draft model's output, not the target's.
    co_return absl::FailedPreconditionError(
        absl::StrCat(ModeName(req.mode()),
                     " needs drafters of the target model; this cluster's drafters run "
                     "draft model ",
                     kvstore::ShortModelId(*draft_model_id_), " (use vericache or full_local)"));
  }
  if (!req.prefix_id().empty()) {
    VC_CO_ASSIGN_OR_RETURN(plan.prompt, co_await catalogue_->AwaitTokens(
                                            runner_, req.prefix_id(), req.tenant_salt(), deadline));
    plan.prompt.insert(plan.prompt.end(), req.suffix_ids().begin(), req.suffix_ids().end());
  } else {
    plan.prompt.assign(req.prompt_ids().begin(), req.prompt_ids().end());
  }
  VC_CO_RETURN_IF_ERROR(ValidateGenerate(req, plan.prompt,
                                         {vocab_, context_, options_.chunk_tokens},
                                         default_variants_.front().compressor));
  if (req.stop_token_ids_size() > kMaxStopTokenIds) {
    co_return absl::InvalidArgumentError(absl::StrCat(
        "at most ", kMaxStopTokenIds, " stop_token_ids, got ", req.stop_token_ids_size()));
  }
  for (int32_t id : req.stop_token_ids()) {
    if (id < 0 || id >= vocab_) {
      co_return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids has id ", id, ", outside the vocabulary [0, ", vocab_, ")"));
    }
  }
  plan.x = req.draft_len() > 0 ? req.draft_len() : options_.draft_len;
  plan.fallback = AcceptanceFallback(options_);
  // A request that names its x keeps it; the coordinator's default adapts.
  plan.adaptive = req.draft_len() == 0 && options_.max_draft_len > options_.draft_len;
  // The compressed variant the drafter uses.
  if (!req.compressor().empty()) {
    plan.variant.compressor.name = req.compressor();
    plan.variant.compressor.ratio = req.ratio();
    plan.variant.compressor.bits = req.bits();
  } else {
    plan.variant = default_variants_.front();
  }
  // The stored prefix and its keys.
  plan.prefix_tokens =
      ingest::StoredPrefixTokens(static_cast<int32_t>(plan.prompt.size()), options_.chunk_tokens);
  if (plan.prefix_tokens > 0) {
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = options_.chunk_tokens;
    ko.numerics_version = numerics_version_;
    ko.tenant_salt = req.tenant_salt();
    VC_CO_ASSIGN_OR_RETURN(
        auto keys, kvstore::ChunkKeysForTokens(
                       ko, model_id_, absl::MakeConstSpan(plan.prompt).first(plan.prefix_tokens)));
    for (const auto& k : keys) plan.chunk_keys.push_back(k.Raw());
    plan.prefix_key = keys.back().Hex();
    VC_CO_ASSIGN_OR_RETURN(kvstore::ChunkKey vk,
                           ingest::VariantKeyFor(keys.back(), plan.variant,
                                                 draft_model_id_ ? &*draft_model_id_ : nullptr));
    plan.variant_key = vk.Raw();
  }
  plan.session = next_session_.fetch_add(1);
  co_return plan;
}

Task<bool> CoordinatorService::PrepareHeal(Plan& plan, Request& r, const absl::Status& failed) {
  // Only before the first token: every token already streamed was verified,
  // but a second run could not take them back. Once is enough; a prefix that
  // goes missing again fails the request cleanly.
  if (plan.prefix_tokens == 0 || !plan.output.empty() || plan.healed || r.gone() ||
      Clock::now() >= r.deadline) {
    co_return false;
  }
  switch (failed.code()) {
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kResourceExhausted:
      co_return false;
    default:
      break;
  }
  // The store is the witness: a reader that finds a bad seal deletes the
  // entry before it answers, and the store deletes one that fails its check
  // on a disk read, so a miss here means "ingest again", whatever error
  // text the worker chose.
  const bool missing = co_await catalogue_->Missing(runner_, plan, r.deadline);
  if (!missing) co_return false;
  (void)co_await ReleaseSessions(plan);
  plan.healed = true;
  plan.session = next_session_.fetch_add(1);
  plan.fallback = AcceptanceFallback(options_);
  metrics_->kv_heals->Inc();
  co_return true;
}

// ------------------------------------------------------------------ rounds

absl::StatusOr<Worker*> CoordinatorService::PlaceVerifier(const std::string& prefix_key,
                                                          uint64_t session) {
  VC_ASSIGN_OR_RETURN(const int i, placement_->Verifier(prefix_key, session));
  return verifiers_[static_cast<size_t>(i)].get();
}

absl::Status CoordinatorService::Place(Plan& plan, pb::Mode mode) {
  const bool needs_verifier = mode != pb::MODE_FULL_REMOTE && mode != pb::MODE_LOSSY_REMOTE;
  const bool needs_drafter = mode != pb::MODE_FULL_LOCAL;
  plan.verifier = nullptr;
  plan.drafter = nullptr;
  if (needs_verifier) {
    // By prefix (requests over one prefix meet there); a prompt without a
    // stored prefix by its session.
    VC_ASSIGN_OR_RETURN(plan.verifier, PlaceVerifier(plan.prefix_key, plan.session));
  }
  if (needs_drafter) {
    std::vector<int> loads;
    for (const auto& d : drafters_) loads.push_back(d->active.load());
    absl::StatusOr<int> i = placement_->Drafter(loads);
    if (i.ok()) {
      plan.drafter = drafters_[static_cast<size_t>(*i)].get();
    } else if (mode != pb::MODE_VERICACHE) {
      return i.status();
    }
    // vericache without a live drafter: the verifier decodes alone.
  }
  return absl::OkStatus();
}

absl::Status CoordinatorService::ProbeWorker(WorkerPool pool, int index) {
  const auto& workers = pool == WorkerPool::kVerifier ? verifiers_ : drafters_;
  Worker& w = *workers[static_cast<size_t>(index)];
  pb::WorkerInfoRequest req;
  pb::WorkerInfoResponse resp;
  const absl::Status s = w.client().Info(CallWithin(options_.health_check_timeout), req, &resp);
  return ProbeVerdict(pool, w, s, resp);
}

void CoordinatorService::StartProbeWorker(WorkerPool pool, int index, CallDone done) {
  const auto& workers = pool == WorkerPool::kVerifier ? verifiers_ : drafters_;
  Worker& w = *workers[static_cast<size_t>(index)];
  struct InfoCall {
    pb::WorkerInfoRequest req;
    pb::WorkerInfoResponse resp;
  };
  auto call = std::make_shared<InfoCall>();
  w.client().StartInfo(CallWithin(options_.health_check_timeout), call->req, &call->resp,
                       [this, pool, &w, call, done = std::move(done)](const absl::Status& s) {
                         done(ProbeVerdict(pool, w, s, call->resp));
                       });
}

absl::Status CoordinatorService::ProbeVerdict(WorkerPool pool, const Worker& w,
                                              const absl::Status& info,
                                              const pb::WorkerInfoResponse& resp) {
  if (!info.ok()) {
    // Any failed probe means down, whatever its code (a hung worker times out).
    return absl::UnavailableError(
        absl::StrCat(WorkerPoolName(pool), " ", w.address, " health check: ", info.message()));
  }
  // A worker restarted on the same address must still be the same model,
  // numerics and stop set (the rule the coordinator applied at start).
  const absl::Status same = CheckSameModel(ExpectedWorkerModel(), WorkerModelOf(resp), w.address);
  if (!same.ok()) {
    metrics_->workers_refused->Inc();
    return absl::UnavailableError(
        absl::StrCat(WorkerPoolName(pool), " came back changed: ", std::string(same.message())));
  }
  return absl::OkStatus();
}

WorkerModel CoordinatorService::ExpectedWorkerModel() const {
  WorkerModel expected;
  expected.model_id = model_id_.Raw();
  expected.numerics_version = numerics_version_;
  expected.eos_ids = eos_ids_;
  expected.vocab_size = vocab_;
  expected.context_length = context_;
  expected.kv_bytes_per_token = kv_bytes_per_token_;
  if (draft_model_id_) expected.draft_model_id = draft_model_id_->Raw();
  return expected;
}

void CoordinatorService::StartCheckWorker(WorkerPool pool, Worker& w, const absl::Status& s,
                                          std::function<void(bool down)> done) {
  if (!IsWorkerLost(s)) {
    done(false);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    ++checks_running_;
  }
  StartProbeWorker(pool, w.index,
                   [this, pool, &w, s, done = std::move(done)](const absl::Status& probe) {
                     // It answers: the call failed for another reason, or the
                     // worker came back already (its sessions are gone either
                     // way).
                     if (!probe.ok()) health_->MarkDown(pool, w.index, s);
                     done(!probe.ok());
                     std::lock_guard<std::mutex> lock(calls_mu_);
                     --checks_running_;
                     calls_cv_.notify_all();
                   });
}

Task<CoordinatorService::WorkersDown> CoordinatorService::CheckWorkersAfterFailure(
    const Plan& plan, const absl::Status& s) {
  // Both probes at once: when both workers are gone, each probe waits out
  // its deadline, and one after the other doubled the request's wait.
  struct Probes {
    std::atomic<int> left{0};
    std::atomic<bool> verifier_down{false}, drafter_down{false};
    std::function<void(WorkersDown)> answer;
    void Answered() {
      if (left.fetch_sub(1) == 1) answer({verifier_down.load(), drafter_down.load()});
    }
  };
  WorkersDown down;
  (void)co_await AwaitAnswer(runner_, &down, [&](std::function<void(WorkersDown)> answer) {
    auto probes = std::make_shared<Probes>();
    probes->answer = std::move(answer);
    // One count for this function, so the answer waits for both starts.
    probes->left = 1 + (plan.verifier ? 1 : 0) + (plan.drafter ? 1 : 0);
    if (plan.verifier) {
      StartCheckWorker(WorkerPool::kVerifier, *plan.verifier, s, [probes](bool d) {
        probes->verifier_down = d;
        probes->Answered();
      });
    }
    if (plan.drafter) {
      StartCheckWorker(WorkerPool::kDrafter, *plan.drafter, s, [probes](bool d) {
        probes->drafter_down = d;
        probes->Answered();
      });
    }
    probes->Answered();
  });
  co_return down;
}

Task<absl::Status> CoordinatorService::Run(Plan& plan, Request& r, Sink* writer) {
  for (int attempt = 0;; ++attempt) {
    VC_CO_RETURN_IF_ERROR(Place(plan, r.mode));
    absl::Status s = co_await RunOnce(plan, r, writer);
    if (s.ok() || r.gone() || !IsWorkerLost(s)) co_return s;
    // Which of its workers died? (Probed now: the next round is too late
    // for the requests placed meanwhile.)
    std::vector<std::string> died;
    const char* pool = plan.verifier ? "verifier" : "drafter";
    const WorkersDown down = co_await CheckWorkersAfterFailure(plan, s);
    if (down.verifier) {
      died.push_back(absl::StrCat("verifier ", plan.verifier->address, " is down"));
    }
    if (down.drafter) {
      died.push_back(absl::StrCat("drafter ", plan.drafter->address, " is down"));
      if (died.size() == 1) pool = "drafter";
    }
    // Both answer: the worker came back already (its sessions are gone), or
    // something behind it (the store) failed; a retry is bounded either way.
    if (died.empty()) died.push_back("its workers answer again");
    if (attempt >= options_.max_worker_retries) {
      co_return absl::UnavailableError(absl::StrCat(s.message(), " (", absl::StrJoin(died, ", "),
                                                    "; gave up after ", attempt, " retries)"));
    }
    if (Clock::now() >= r.deadline) co_return s;
    (void)co_await ReleaseSessions(plan);
    metrics_->retries->Labels({pool}).Inc();
    // Re-establish the request from its exact state: the prompt plus every
    // token accepted so far (sampling is keyed by absolute position, so the
    // continuation is the same). A new session id is a new epoch: nothing
    // from the old sessions is read again.
    plan.prompt.insert(plan.prompt.end(),
                       plan.output.begin() + static_cast<std::ptrdiff_t>(plan.resumed),
                       plan.output.end());
    plan.resumed = plan.output.size();
    plan.session = next_session_.fetch_add(1);
    plan.fallback = AcceptanceFallback(options_);
  }
}

Task<absl::Status> CoordinatorService::RunOnce(Plan& plan, Request& r, Sink* writer) {
  switch (r.mode) {
    case pb::MODE_FULL_LOCAL:
      co_return co_await RunFullLocal(runner_, plan, r, writer, false);
    case pb::MODE_FULL_REMOTE:
    case pb::MODE_LOSSY_REMOTE:
      co_return co_await RunRemote(runner_, plan, r, writer);
    default:
      if (plan.drafter == nullptr) {
        // No live drafter: the verifier decodes alone (a fallback).
        plan.totals.set_fallbacks(plan.totals.fallbacks() + 1);
        metrics_->fallbacks->Inc();
        co_return co_await RunFullLocal(runner_, plan, r, writer, false);
      }
      co_return co_await RunVeriCache(runner_, plan, r, writer);
  }
}

void CoordinatorService::Calibrate(double step_seconds) {
  if (!options_.auto_slot || !(step_seconds > 0)) return;
  double slot = 0;
  {
    std::lock_guard<std::mutex> lock(calib_mu_);
    step_ewma_ = step_ewma_ == 0 ? step_seconds : 0.9 * step_ewma_ + 0.1 * step_seconds;
    if (++calib_samples_ % 16 != 0) return;
    slot = std::clamp(step_ewma_, 0.0005, 1.0);
  }
  // Only a real drift is worth a recalibration.
  const double current = clock_->slot_seconds();
  if (std::abs(slot - current) > 0.2 * current) (void)clock_->SetSlotSeconds(slot);
}

void CoordinatorService::UpdateSchedulerGauges() {
  const std::vector<double> links = clock_->LinkOccupancy();
  for (size_t l = 0; l < links.size() && l < static_cast<size_t>(kLinkCount); ++l) {
    metrics_->link_occupancy->Labels({kLinkNames[l]}).Set(links[l]);
  }
  const std::vector<int64_t> mem = clock_->MemoryBooked();
  for (size_t g = 0; g < mem.size() && g < verifiers_.size(); ++g) {
    metrics_->memory_booked->Labels({verifiers_[g]->address}).Set(static_cast<double>(mem[g]));
    metrics_->memory_resident->Labels({verifiers_[g]->address})
        .Set(static_cast<double>(clock_->ResidentBytes(static_cast<int>(g))));
  }
}

namespace {

// A Release's deadline: short, so a request's end is not held up by a worker
// that is paused or unreachable (a failed release is retried later).
WorkerCallOptions ReleaseCallOptions(bool wait_for_ready) {
  WorkerCallOptions o = CallWithin(std::chrono::milliseconds(2000));
  o.wait_for_ready = wait_for_ready;
  return o;
}

std::string ReleaseCallName(WorkerPool pool, const Worker& w) {
  return absl::StrCat(WorkerPoolName(pool), " ", w.address, " Release");
}

}  // namespace

absl::Status CoordinatorService::ReleaseOn(WorkerPool pool, int index, uint64_t session,
                                           bool wait_for_ready) {
  const auto& workers = pool == WorkerPool::kVerifier ? verifiers_ : drafters_;
  Worker& w = *workers[static_cast<size_t>(index)];
  pb::ReleaseRequest req;
  req.set_session_id(session);
  pb::ReleaseResponse resp;
  const absl::Status s = w.client().Release(ReleaseCallOptions(wait_for_ready), req, &resp);
  return WithCallName(s, ReleaseCallName(pool, w));
}

void CoordinatorService::StartReleaseOrRetry(WorkerPool pool, Worker& w, uint64_t session,
                                             CallDone done) {
  // A worker that misses the short deadline (paused, briefly unreachable)
  // gets the Release again later, off the request path, and its idle
  // timeout remains the last resort.
  struct ReleaseCall {
    pb::ReleaseRequest req;
    pb::ReleaseResponse resp;
  };
  auto call = std::make_shared<ReleaseCall>();
  call->req.set_session_id(session);
  w.client().StartRelease(
      ReleaseCallOptions(/*wait_for_ready=*/false), call->req, &call->resp,
      [this, call, pool, &w, session, done = std::move(done)](const absl::Status& s) {
        if (!s.ok()) (void)release_retry_->Add(pool, w.index, session);
        done(WithCallName(s, ReleaseCallName(pool, w)));
      });
}

Task<absl::Status> CoordinatorService::ReleaseSessions(Plan& plan) {
  for (const WorkerPool pool : {WorkerPool::kVerifier, WorkerPool::kDrafter}) {
    const bool verifier = pool == WorkerPool::kVerifier;
    bool& open = verifier ? plan.verifier_open : plan.drafter_open;
    Worker* w = verifier ? plan.verifier : plan.drafter;
    if (!open || w == nullptr) continue;
    (void)co_await ReleaseSession(runner_, pool, *w, plan.session);
    open = false;
    --w->active;
  }
  co_return absl::OkStatus();
}

void CoordinatorService::ShadowCheck(const pb::GenerateRequest& req,
                                     const std::vector<int32_t>& tokens) {
  // A deterministic sample of requests (by a hash of the request) is decoded
  // again in full_local mode; a mismatch means the lossless guarantee broke.
  std::string fingerprint = req.SerializeAsString();
  const uint64_t h = std::hash<std::string>{}(fingerprint);
  if (static_cast<double>(h % 10000) >= options_.lossless_check_fraction * 10000) return;
  if (shadow_checks_running_.fetch_add(1) >= 2) {  // bounded: skip when busy
    --shadow_checks_running_;
    return;
  }
  pb::GenerateRequest copy = req;
  copy.set_mode(pb::MODE_FULL_LOCAL);
  copy.set_online_update(false);  // a drafter option: full_local refuses it
  copy.set_request_id("");
  std::thread([this, copy, tokens] {
    struct NullSink final : Sink {
      bool Write(const pb::GenerateResponse&) override { return true; }
    } sink;
    Request r;
    r.id = absl::StrCat("shadow-", next_request_.fetch_add(1));
    // Its own admission bucket: a shadow run never takes a tenant's places.
    r.tenant = std::string("\0shadow", 7);
    r.mode = pb::MODE_FULL_LOCAL;
    r.start = Clock::now();
    r.deadline = Clock::now() + options_.rpc_timeout * 6;
    std::vector<int32_t> full;
    // Its own thread blocks on it (it continues on the executor between
    // its worker calls, like any request).
    const absl::Status s = BlockOn(Serve(copy, r, &sink, &full));
    if (s.ok()) {
      metrics_->lossless_check->Labels({full == tokens ? "match" : "mismatch"}).Inc();
      if (full != tokens) {
        std::fprintf(stderr, "vc-coordinator: LOSSLESS CHECK MISMATCH for a vericache request\n");
      }
    }
    --shadow_checks_running_;
  }).detach();
}

// ------------------------------------------------------------- other RPCs

grpc::Status CoordinatorService::Cancel(grpc::ServerContext* ctx, const pb::CancelRequest* req,
                                        pb::CancelResponse* resp) {
  absl::StatusOr<Identity> who = Caller(ctx, "");
  if (!who.ok()) return rpc::ToGrpcStatus(who.status());
  if (req->request_id().size() > kMaxRequestIdBytes) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "request_id is ", req->request_id().size(), " bytes, the limit is ", kMaxRequestIdBytes)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Another tenant's request with this id is not found: existed = false.
  auto it = requests_.find(RequestKey(who->tenant, req->request_id()));
  const bool live =
      it != requests_.end() && (it->second->state == "running" || it->second->state == "queued");
  resp->set_existed(live);
  if (!live) return grpc::Status::OK;
  Request& r = *it->second;
  r.cancelled = true;
  // A running request looks at `cancelled` between its rounds, unless its
  // reader stopped reading and it waits for room to write: then it would
  // wait until --stream-write-timeout-ms, so its stream is abandoned (its
  // reader, who reads nothing, loses nothing it would have read). The sink
  // lives while the state is running (ServeCall leaves it under mu_ before
  // it finishes the call). Its TryCancel does not run the call's OnCancel
  // (whose hook takes mu_) on this thread: gRPC runs a reactor's OnCancel on
  // its own executor, as Shutdown relies on too.
  if (r.state == "running" && r.sink != nullptr && !r.sink->Writable()) r.sink->Abandon();
  // Only a queued request waits in admission for a wake to see `cancelled`,
  // and only it is woken: waking the whole queue would let a caller make
  // every queued request retry its admission with Cancels.
  WakeIfQueuedLocked(r);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetRequest(grpc::ServerContext* ctx,
                                            const pb::GetRequestRequest* req,
                                            pb::RequestStatus* resp) {
  absl::StatusOr<Identity> who = Caller(ctx, "");
  if (!who.ok()) return rpc::ToGrpcStatus(who.status());
  if (req->request_id().size() > kMaxRequestIdBytes) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "request_id is ", req->request_id().size(), " bytes, the limit is ", kMaxRequestIdBytes)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(RequestKey(who->tenant, req->request_id()));
  if (it == requests_.end()) {
    return rpc::ToGrpcStatus(absl::NotFoundError(absl::StrCat("no request '", req->request_id(),
                                                              "' (running or among the last ",
                                                              kFinishedHistory, " finished)")));
  }
  resp->set_request_id(it->second->id);
  resp->set_state(it->second->state);
  resp->set_generated(it->second->generated);
  resp->set_error(it->second->error);
  resp->set_mode(it->second->mode);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ClusterStatus(grpc::ServerContext* ctx,
                                               const pb::ClusterStatusRequest* /*req*/,
                                               pb::ClusterStatusResponse* resp) {
  // Any tenant may see the cluster's shape; an outsider may not.
  if (absl::StatusOr<Identity> who = Caller(ctx, ""); !who.ok()) {
    return rpc::ToGrpcStatus(who.status());
  }
  auto add = [&](Worker& w, bool verifier) {
    pb::WorkerStatus* out = resp->add_workers();
    out->set_address(w.address);
    out->set_role(verifier ? "verifier" : "drafter");
    pb::WorkerInfoRequest req;
    pb::WorkerInfoResponse info;
    const absl::Status s = w.client().Info(CallWithin(std::chrono::milliseconds(1000)), req, &info);
    out->set_healthy(s.ok());
    if (!s.ok()) out->set_error(std::string(s.message()));
    out->set_sessions(info.sessions());
    out->set_kv_bytes(info.kv_bytes());
  };
  for (auto& v : verifiers_) add(*v, true);
  for (auto& d : drafters_) add(*d, false);
  resp->set_active_requests(admission_->active());
  resp->set_queued_requests(admission_->queued());
  resp->set_completed_requests(admission_->completed());
  resp->set_slot_seconds(clock_->slot_seconds());
  resp->set_context_length(context_);
  resp->set_slot(clock_->now());
  resp->set_lock_step(clock_->lock_step());
  for (double o : clock_->LinkOccupancy()) resp->add_link_occupancy(o);
  const RingSchedulerStats st = clock_->stats();
  for (double o : st.overrun_seconds) resp->add_link_overrun_seconds(o);
  for (double p : st.peak_slot_seconds) resp->add_link_peak_slot_seconds(p);
  resp->set_scheduler_admitted(st.admitted);
  resp->set_scheduler_queued(st.queued);
  resp->set_model_id(model_id_.Hex());
  return grpc::Status::OK;
}

// One RegisterPrefix or ManagePrefix call on gRPC's callback API. Its work
// runs as a coroutine on the executor (PrefixCatalogue::Register, Manage),
// so one that is queued for admission, ingesting or waiting on the store
// holds no thread; the call's cancel runs `on_cancel` (a queued
// registration is woken). Finished (then deleted by gRPC) once the
// coroutine has returned.
class CoordinatorService::PrefixCall final : public grpc::ServerUnaryReactor {
 public:
  explicit PrefixCall(std::function<void()> on_cancel) : on_cancel_(std::move(on_cancel)) {}
  void OnCancel() override {
    if (on_cancel_) on_cancel_();
  }
  void OnDone() override { delete this; }

 private:
  const std::function<void()> on_cancel_;
};

void CoordinatorService::StartPrefixCall(PrefixCall* call, std::shared_ptr<Request> r,
                                         std::function<Task<absl::Status>()> start) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefix_calls_.insert(r);
  }
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    ++calls_running_;
  }
  executor_->Post([this, call, r = std::move(r), start = std::move(start)]() mutable {
    Spawn(start(), [this, call, r](const absl::Status& s) {
      {
        // Out of Shutdown's reach before its context goes.
        std::lock_guard<std::mutex> lock(mu_);
        prefix_calls_.erase(r);
      }
      call->Finish(rpc::ToGrpcStatus(s));
      std::lock_guard<std::mutex> lock(calls_mu_);
      --calls_running_;
      calls_cv_.notify_all();
    });
  });
}

std::shared_ptr<Request> CoordinatorService::PrefixCallRequest(grpc::CallbackServerContext* ctx,
                                                               const std::string& tenant) {
  auto r = std::make_shared<Request>();
  r->id = "prefix-call";
  r->is_generate = false;
  r->tenant = tenant;
  r->server_ctx = ctx;
  r->start = Clock::now();
  r->client_gone = [ctx] { return ctx->IsCancelled(); };
  r->deadline = ServerCallDeadline(*ctx);
  return r;
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterPrefix(grpc::CallbackServerContext* ctx,
                                                             const pb::RegisterPrefixRequest* req,
                                                             pb::RegisterPrefixResponse* resp) {
  absl::StatusOr<Identity> who = Caller(ctx, req->tenant_salt());
  if (!who.ok()) {
    auto* call = new PrefixCall(nullptr);
    call->Finish(rpc::ToGrpcStatus(who.status()));
    return call;
  }
  // The ingest is admitted like a request (it holds a verifier as long as a
  // prefill) and ends when its caller goes away; the call's cancel wakes
  // it if it is queued.
  std::shared_ptr<Request> r = PrefixCallRequest(ctx, who->tenant);
  auto* call = new PrefixCall([this, weak = std::weak_ptr<Request>(r)] {
    if (std::shared_ptr<Request> queued = weak.lock()) WakeIfQueued(*queued);
  });
  // gRPC keeps req and resp until the call is finished, after the task.
  StartPrefixCall(call, r, [this, salt = who->salt, req, resp, &request = *r] {
    return catalogue_->Register(runner_, salt, *req, request, resp);
  });
  return call;
}

grpc::ServerUnaryReactor* CoordinatorService::ManagePrefix(grpc::CallbackServerContext* ctx,
                                                           const pb::ManagePrefixRequest* req,
                                                           pb::ManagePrefixResponse* resp) {
  auto* call = new PrefixCall(nullptr);
  absl::StatusOr<Identity> who = Caller(ctx, req->tenant_salt());
  if (!who.ok()) {
    call->Finish(rpc::ToGrpcStatus(who.status()));
    return call;
  }
  std::shared_ptr<Request> r = PrefixCallRequest(ctx, who->tenant);
  StartPrefixCall(call, r, [this, salt = who->salt, req, resp, &request = *r] {
    return catalogue_->Manage(runner_, salt, *req, request, resp);
  });
  return call;
}

}  // namespace vc::coordinator
