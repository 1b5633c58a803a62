#include "services/worker/verifier_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/ingest/prefix_ingest.h"
#include "common/rpc/rpc.h"
#include "services/common/daemon.h"
#include "services/common/sampling_config.h"
#include "services/worker/worker_common.h"

namespace vc::worker {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

// A prefix's full K/V, loaded once and shared by the sessions that pin it.
struct VerifierService::Prefix {
  std::string table_key;
  std::vector<std::string> chunk_keys;
  // Picks the key of encrypted chunks. The chunk keys hash it, so sessions
  // sharing this prefix (same table key) share the tenant too.
  std::string tenant_salt;
  int32_t tokens = 0;
  enum class State { kQueued, kLoading, kReady, kFailed } state = State::kQueued;
  std::shared_ptr<const PagedKvCache> kv;
  absl::Status error;
  int pins = 0;
  int64_t bytes = 0;
  double fetch_seconds = 0;
  bool charged_to_verify = false;  // a verify already reported its load bytes
};

struct VerifierService::Session {
  std::unique_ptr<cluster::VerifySession> vs;
  std::vector<std::string> chunk_keys;
  std::string tenant_salt;
  std::string table_key;  // of its prefix ("" when it has no stored prefix)
  bool resident = false;
  bool pinned = false;
  Clock::time_point last_used;
  bool busy = false;  // in a verify pass
  // Lease grants that pinned the prefix ahead of their round: the pin
  // outlives the verify before them (the next round shares the copy).
  int lease_holds = 0;
};

struct VerifierService::Job {
  enum class Kind { kVerify, kIngest } kind = Kind::kVerify;
  grpc::CallbackServerContext* ctx = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;
  uint64_t session_id = 0;
  std::vector<int32_t> drafts;
  std::vector<std::vector<double>> draft_probs;  // rejection sampling: q of each draft
  bool skip_refresh = false;
  // A lease round's verify: its grant's hold on the prefix passes to this
  // job (the pin now goes after this verify, unless a later grant holds it).
  bool drops_lease_hold = false;
  pb::VerifyResponse* verify_resp = nullptr;
  const pb::IngestRequest* ingest_req = nullptr;
  pb::IngestResponse* ingest_resp = nullptr;
  Clock::time_point enqueued;
  // A Round's verify: called with the outcome (verify_resp filled on OK)
  // instead of finishing `reactor`.
  std::function<void(const absl::Status&)> done;

  void Finish(const absl::Status& status) {
    if (done) {
      done(status);
    } else {
      reactor->Finish(rpc::ToGrpcStatus(status));
    }
  }
};

// One Round between its arrival and its answer.
struct VerifierService::RoundCall {
  grpc::CallbackServerContext* ctx = nullptr;
  // Answers the round: the Round's reactor, or the lease it belongs to.
  std::function<void(const absl::Status&)> finish;
  pb::RoundRequest req;
  pb::RoundResponse* resp = nullptr;  // the Round's, or `owned`
  pb::RoundResponse owned;
  Clock::time_point arrived;
  std::chrono::system_clock::time_point deadline;  // of the peer calls
  std::shared_ptr<pb::Drafter::Stub> drafter;
  grpc::ClientContext draft_ctx;
  pb::DraftRequest draft_req;
  pb::DraftResponse draft_resp;
  Clock::time_point draft_start;
  grpc::ClientContext commit_ctx;
  pb::CommitRequest commit_req;
  pb::CommitResponse commit_resp;
  Clock::time_point commit_start;
  std::string rows_key;  // in the outbox while the commit runs
  grpc::Alarm alarm;     // the refresh's slot
  // A lease grant's hold on the prefix not yet passed to the verify job.
  bool lease_hold = false;
  // Called once the round is verified, before its commit (a lease sends the
  // verified tokens on at once); unset for a Round.
  std::function<void()> on_verified;
  // A lease's: fills the Draft of its next round when that grant has come
  // (its take as the budget will leave it after this round's `tokens`);
  // false when there is none. The commit then brings those drafts back.
  std::function<bool(int tokens, pb::DraftRequest* next)> next_draft;
  // The next round's drafts that came with this round's commit.
  std::optional<pb::DraftResponse> next_drafts;
  // This round's drafts, come with the commit of the round before.
  std::optional<pb::DraftResponse> drafts;
};

VerifierService::VerifierService(Engine* engine, const kvstore::ModelId& model_id,
                                 daemon::StoreClient* store, metrics::Registry* registry,
                                 const VerifierOptions& options)
    : engine_(engine),
      config_(engine->config()),
      model_id_(model_id),
      store_(store),
      options_(options),
      arena_("verifier", options.arena_bytes),
      metrics_(RegisterWorkerMetrics(registry, "verifier")) {
  if (options_.numerics_version == 0) options_.numerics_version = NumericsVersionFor(config_);
  batch_requests_ = &daemon::MustHistogram(registry, "vericache_verify_batch_requests",
                                           "Requests verified together in one pass.", {},
                                           {1, 2, 4, 8, 16, 32, 64})
                         ->Get();
  prefix_shared_ = &daemon::MustCounter(registry, "vericache_prefix_load_shared_total",
                                        "Verifies that used a prefix loaded for another request "
                                        "(loads saved by prefix-aware verification).")
                        ->Get();
  ingests_cancelled_ = &daemon::MustCounter(registry, "vericache_ingests_cancelled_total",
                                            "Ingests stopped because their caller cancelled "
                                            "(before, during or right after the prefill; nothing "
                                            "of them is written).")
                            ->Get();
  peer_rounds_ = &daemon::MustCounter(registry, "vericache_peer_rounds_total",
                                      "Rounds this verifier ran with its drafter directly "
                                      "(Round: drafts, commit and refresh rows worker to worker).")
                      ->Get();
  peer_refresh_bytes_ = &daemon::MustCounter(registry, "vericache_peer_refresh_bytes_total",
                                             "Exact K/V row bytes this verifier offered to "
                                             "drafters on its peer data plane.")
                             ->Get();
  peer_drafts_with_commit_ =
      &daemon::MustCounter(registry, "vericache_peer_drafts_with_commit_total",
                           "Lease rounds whose drafts came with the commit of the round before "
                           "(no Draft call of their own).")
           ->Get();
  for (int i = 0; i < std::max(1, options_.loader_threads); ++i) {
    loaders_.emplace_back([this] { LoaderLoop(); });
  }
  batcher_ = std::thread([this] { BatchLoop(); });
}

VerifierService::~VerifierService() { Shutdown(); }

void VerifierService::Shutdown() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !batcher_.joinable()) return;
    stopping_ = true;
    dropped.swap(jobs_);
  }
  for (Job& j : dropped) j.Finish(absl::UnavailableError("verifier is shutting down"));
  work_cv_.notify_all();
  load_cv_.notify_all();
  if (batcher_.joinable()) batcher_.join();
  for (auto& t : loaders_) {
    if (t.joinable()) t.join();
  }
  // Rounds still talking to their drafter, or waiting for their refresh's
  // slot, call back into this object: cancel their calls and alarms (each
  // then finishes, UNAVAILABLE or with the drafter's error) and wait.
  std::set<std::shared_ptr<RoundCall>> rounds;
  {
    std::lock_guard<std::mutex> lock(rounds_mu_);
    rounds = rounds_;
  }
  for (const auto& call : rounds) {
    call->draft_ctx.TryCancel();
    call->commit_ctx.TryCancel();
    call->alarm.Cancel();
  }
  std::unique_lock<std::mutex> lock(rounds_mu_);
  rounds_cv_.wait(lock, [&] { return rounds_.empty(); });
  // Finished rounds are deleted once gRPC lets go of their last callback:
  // promptly, but bounded here so that a lost one cannot hang the exit.
  if (!rounds_cv_.wait_for(lock, std::chrono::seconds(10),
                           [&] { return live_round_calls_ == 0; })) {
    std::fprintf(stderr, "vc-verifier: %d finished rounds not yet freed at shutdown\n",
                 live_round_calls_);
  }
}

std::shared_ptr<VerifierService::RoundCall> VerifierService::NewRoundCall() {
  {
    std::lock_guard<std::mutex> lock(rounds_mu_);
    ++live_round_calls_;
  }
  // Deleted where its last reference goes: often on the gRPC thread of its
  // last peer callback, after the round has finished. Its client contexts
  // (the peer calls) must be gone before the channels they ran on, which
  // the service owns: Shutdown waits for this count. (A round freed after
  // its channel had gone made gRPC free a completion queue twice: ASan,
  // peer_round_test, a few runs in a thousand.)
  return std::shared_ptr<RoundCall>(new RoundCall(), [this](RoundCall* call) {
    delete call;
    std::lock_guard<std::mutex> lock(rounds_mu_);
    --live_round_calls_;
    rounds_cv_.notify_all();
  });
}

// ------------------------------------------------------------------ RPCs

grpc::ServerUnaryReactor* VerifierService::Info(grpc::CallbackServerContext* ctx,
                                                const pb::WorkerInfoRequest* /*req*/,
                                                pb::WorkerInfoResponse* resp) {
  int32_t sessions = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions = static_cast<int32_t>(sessions_.size());
  }
  FillWorkerInfo("verifier", config_, model_id_, options_.numerics_version, options_.data_plane,
                 sessions, arena_.in_use(), store_->data_stats(), resp,
                 options_.draft_engine != nullptr ? &options_.draft_model_id : nullptr);
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* VerifierService::Open(grpc::CallbackServerContext* ctx,
                                                const pb::VerifierOpenRequest* req,
                                                pb::VerifierOpenResponse* /*resp*/) {
  std::vector<int32_t> prompt(req->prompt().begin(), req->prompt().end());
  absl::StatusOr<PrefixRequest> prefix = ValidatePrefix(req->prefix(), prompt, config_);
  if (!prefix.ok()) return Finish(ctx, prefix.status());
  if (absl::Status st = ValidateTenantSalt(req->tenant_salt()); !st.ok()) return Finish(ctx, st);
  absl::StatusOr<cluster::SessionSampling> sampling = daemon::ToSessionSampling(req->sampling());
  if (!sampling.ok()) return Finish(ctx, sampling.status());
  cluster::VerifySessionOptions vo;
  vo.sampling = *sampling;
  vo.tail_arena = &arena_;
  auto vs = cluster::VerifySession::Create(config_, std::move(prompt), prefix->tokens, vo);
  if (!vs.ok()) return Finish(ctx, vs.status());
  if (options_.before_open_kept) options_.before_open_kept(ctx);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Finish(ctx, absl::UnavailableError("verifier is shutting down"));
  // The caller gave up (its deadline passed while this verifier was paused
  // or busy): it never learns of the session, so none is kept.
  if (ctx->IsCancelled()) {
    return Finish(ctx, absl::DeadlineExceededError("the Open's caller gave up before it finished"));
  }
  if (sessions_.count(req->session_id()) > 0) {
    return Finish(ctx, absl::AlreadyExistsError(
                           absl::StrCat("session ", req->session_id(), " is already open")));
  }
  if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
    return Finish(ctx, absl::ResourceExhaustedError(absl::StrCat(
                           "verifier holds its maximum of ", options_.max_sessions, " sessions")));
  }
  auto s = std::make_unique<Session>();
  s->vs = std::move(*vs);
  s->chunk_keys = prefix->chunk_keys;
  s->tenant_salt = req->tenant_salt();
  if (prefix->tokens > 0) {
    s->table_key = options_.prefix_aware
                       ? prefix->chunk_keys.back()
                       : absl::StrCat(prefix->chunk_keys.back(), "/", req->session_id());
  }
  s->resident = req->resident();
  s->last_used = Clock::now();
  Session& ref = *s;
  sessions_[req->session_id()] = std::move(s);
  if (ref.resident) PinPrefix(ref);
  UpdateGauges();
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* VerifierService::Load(grpc::CallbackServerContext* ctx,
                                                const pb::LoadRequest* req,
                                                pb::LoadResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(req->session_id());
  if (it == sessions_.end()) {
    return Finish(ctx, absl::NotFoundError(absl::StrCat("no session ", req->session_id())));
  }
  it->second->last_used = Clock::now();
  if (req->resident()) it->second->resident = true;
  resp->set_already_loaded(PinPrefix(*it->second));
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* VerifierService::Verify(grpc::CallbackServerContext* ctx,
                                                  const pb::VerifyRequest* req,
                                                  pb::VerifyResponse* resp) {
  Job job;
  job.kind = Job::Kind::kVerify;
  job.ctx = ctx;
  job.session_id = req->session_id();
  job.drafts.assign(req->drafts().begin(), req->drafts().end());
  job.skip_refresh = req->skip_refresh();
  absl::StatusOr<std::vector<std::vector<double>>> probs =
      FromDraftDistributions(req->draft_probs(), engine_->config().vocab_size);
  if (!probs.ok()) return Finish(ctx, probs.status());
  job.draft_probs = *std::move(probs);
  job.verify_resp = resp;
  grpc::ServerUnaryReactor* reactor = nullptr;
  if (absl::Status st = EnqueueVerify(std::move(job), &reactor); !st.ok()) return Finish(ctx, st);
  return reactor;
}

absl::Status VerifierService::EnqueueVerify(Job job, grpc::ServerUnaryReactor** reactor) {
  job.enqueued = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("verifier is shutting down");
    auto it = sessions_.find(job.session_id);
    if (it == sessions_.end())
      return absl::NotFoundError(absl::StrCat("no session ", job.session_id));
    if (static_cast<int>(jobs_.size()) >= options_.max_queued_jobs) {
      return absl::ResourceExhaustedError("verifier job queue is full");
    }
    Session& s = *it->second;
    s.last_used = Clock::now();
    // A verify without an earlier Load starts the load now.
    if (!s.pinned) PinPrefix(s);
    if (job.drops_lease_hold && s.lease_holds > 0) --s.lease_holds;
    if (job.reactor == nullptr && !job.done) job.reactor = job.ctx->DefaultReactor();
    *reactor = job.reactor;
    jobs_.push_back(std::move(job));
  }
  work_cv_.notify_all();
  return absl::OkStatus();
}

// ------------------------------------------------------------ peer rounds

absl::Status VerifierService::CheckRound(const pb::RoundRequest& req) const {
  if (options_.peer_rows == nullptr) {
    return absl::FailedPreconditionError(
        "this verifier takes no peer rounds (it has no peer data plane)");
  }
  if (req.drafter().empty() || req.drafter().size() > 256) {
    return absl::InvalidArgumentError("Round: drafter must be HOST:PORT");
  }
  if (req.round() == 0) return absl::InvalidArgumentError("Round: round must be > 0");
  if (req.take() < 1 || req.take() > config_.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("Round: take must be in [1, ", config_.max_seq_len, "]"));
  }
  if (req.lookahead() < 0 || req.lookahead() > config_.max_seq_len) {
    return absl::InvalidArgumentError("Round: lookahead out of range");
  }
  if (req.refresh_delay_us() < 0 || req.refresh_delay_us() > int64_t{600} * 1000 * 1000) {
    return absl::InvalidArgumentError("Round: refresh_delay_us must be in [0, 600 s]");
  }
  return absl::OkStatus();
}

absl::Status VerifierService::TouchRoundSession(const pb::RoundRequest& req, bool hold) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("verifier is shutting down");
  auto it = sessions_.find(req.session_id());
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", req.session_id()));
  }
  Session& s = *it->second;
  s.last_used = Clock::now();
  if (req.load()) {
    PinPrefix(s);
    if (hold) ++s.lease_holds;
  }
  return absl::OkStatus();
}

void VerifierService::DropLeaseHold(uint64_t session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  Session& s = *it->second;
  if (s.lease_holds > 0) --s.lease_holds;
  // Nothing else keeps the pin: no verify running or queued will drop it.
  if (s.lease_holds == 0 && !s.busy && !s.resident) {
    const bool queued = std::any_of(jobs_.begin(), jobs_.end(),
                                    [&](const Job& j) { return j.session_id == session_id; });
    if (!queued) UnpinPrefix(s);
  }
}

absl::Status VerifierService::StartRound(const std::shared_ptr<RoundCall>& call,
                                         std::chrono::system_clock::time_point deadline) {
  call->arrived = Clock::now();
  // The peer calls end a margin before the caller's deadline, so that a
  // drafter that stops answering is reported as the drafter's failure
  // (drafter_error), not seen by the coordinator as this verifier's
  // timeout; the wait for the refresh's slot is part of the budget.
  const auto now = std::chrono::system_clock::now();
  const auto margin = std::clamp<std::chrono::system_clock::duration>(
      (deadline - now) / 4, std::chrono::milliseconds(10), std::chrono::seconds(2));
  call->deadline =
      std::min(deadline - margin, now + options_.peer_timeout +
                                      std::chrono::microseconds(call->req.refresh_delay_us()));
  call->drafter = PeerStub(call->req.drafter());
  {
    std::lock_guard<std::mutex> lock(rounds_mu_);
    if (static_cast<int>(rounds_.size()) >= options_.max_queued_jobs) {
      return absl::ResourceExhaustedError("verifier: too many rounds in flight");
    }
    rounds_.insert(call);
  }
  if (call->drafts.has_value()) {
    if (call->drafts->drafts_size() <= call->req.take()) {
      // Taken with the commit of the round before: no Draft call, and their
      // steps were that round's.
      call->draft_resp = *std::move(call->drafts);
      call->draft_resp.set_draft_seconds(0);
      call->resp->set_drafts_with_commit(true);
      OnPeerDraft(call, grpc::Status::OK);
      return absl::OkStatus();
    }
    call->drafts.reset();  // more than the budget now allows: drafted again
  }
  pb::DraftRequest& d = call->draft_req;
  d.set_session_id(call->req.session_id());
  d.set_max_tokens(call->req.take());
  d.set_min_tokens(call->req.take());
  d.set_lookahead(call->req.lookahead());
  d.set_epoch(call->req.epoch());
  d.set_round(call->req.round());
  call->draft_ctx.set_deadline(call->deadline);
  call->draft_start = Clock::now();
  call->drafter->async()->Draft(&call->draft_ctx, &call->draft_req, &call->draft_resp,
                                [this, call](const grpc::Status& st) { OnPeerDraft(call, st); });
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* VerifierService::Round(grpc::CallbackServerContext* ctx,
                                                 const pb::RoundRequest* req,
                                                 pb::RoundResponse* resp) {
  if (absl::Status st = CheckRound(*req); !st.ok()) return Finish(ctx, st);
  if (absl::Status st = TouchRoundSession(*req, /*hold=*/false); !st.ok()) return Finish(ctx, st);
  std::shared_ptr<RoundCall> call = NewRoundCall();
  call->ctx = ctx;
  call->req = *req;
  call->resp = resp;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  call->finish = [reactor](const absl::Status& st) { reactor->Finish(rpc::ToGrpcStatus(st)); };
  if (absl::Status st = StartRound(call, ctx->deadline()); !st.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(st));
  }
  return reactor;
}

std::shared_ptr<pb::Drafter::Stub> VerifierService::PeerStub(const std::string& address) {
  std::lock_guard<std::mutex> lock(rounds_mu_);
  auto it = peer_stubs_.find(address);
  if (it != peer_stubs_.end()) return it->second;
  // Bounded: past the cap one channel goes (a call holding its stub keeps
  // it alive until the call ends).
  if (static_cast<int>(peer_stubs_.size()) >= std::max(1, options_.max_peer_channels)) {
    peer_stubs_.erase(peer_stubs_.begin());
  }
  auto stub = std::shared_ptr<pb::Drafter::Stub>(pb::Drafter::NewStub(
      rpc::MakeChannel(address, options_.peer_max_message_bytes, options_.peer_tls)));
  peer_stubs_.emplace(address, stub);
  return stub;
}

namespace {

// What the coordinator is told of a failed call to the drafter.
void NoteDrafterError(const std::string& what, const grpc::Status& st, pb::RoundResponse* resp) {
  resp->set_drafter_error_code(static_cast<int32_t>(st.error_code()));
  resp->set_drafter_error(absl::StrCat(what, ": ", st.error_message()));
}

}  // namespace

void VerifierService::OnPeerDraft(const std::shared_ptr<RoundCall>& call,
                                  const grpc::Status& status) {
  if (!call->resp->drafts_with_commit()) {
    call->resp->set_peer_draft_seconds(
        std::chrono::duration<double>(Clock::now() - call->draft_start).count());
  }
  if (!status.ok()) {
    NoteDrafterError("Draft", status, call->resp);
    return FinishRound(call, absl::OkStatus());
  }
  const pb::DraftResponse& dr = call->draft_resp;
  call->resp->set_drafted(dr.drafts_size());
  call->resp->set_draft_step_seconds(dr.step_seconds());
  call->resp->set_draft_seconds(dr.draft_seconds());
  Job job;
  job.kind = Job::Kind::kVerify;
  job.ctx = call->ctx;
  job.session_id = call->req.session_id();
  // The drafter's answer is checked like a coordinator's Verify request:
  // bounded drafts, and a distribution per draft under rejection sampling.
  if (dr.drafts_size() > call->req.take()) {
    NoteDrafterError(
        "Draft",
        grpc::Status(grpc::StatusCode::INTERNAL,
                     absl::StrCat("returned ", dr.drafts_size(), " drafts for ", call->req.take())),
        call->resp);
    return FinishRound(call, absl::OkStatus());
  }
  job.drafts.assign(dr.drafts().begin(), dr.drafts().end());
  absl::StatusOr<std::vector<std::vector<double>>> probs =
      FromDraftDistributions(dr.draft_probs(), engine_->config().vocab_size);
  if (!probs.ok()) {
    NoteDrafterError("Draft", rpc::ToGrpcStatus(probs.status()), call->resp);
    return FinishRound(call, absl::OkStatus());
  }
  job.draft_probs = *std::move(probs);
  job.skip_refresh = call->req.skip_refresh();
  job.verify_resp = call->resp->mutable_verify();
  job.done = [this, call](const absl::Status& st) { OnRoundVerified(call, st); };
  // The hold passes to the job as it is queued (before: the job may be done
  // before EnqueueVerify returns); a job not queued leaves it to the lease.
  job.drops_lease_hold = std::exchange(call->lease_hold, false);
  const bool held = job.drops_lease_hold;
  grpc::ServerUnaryReactor* unused = nullptr;
  if (absl::Status st = EnqueueVerify(std::move(job), &unused); !st.ok()) {
    call->lease_hold = held;
    FinishRound(call, st);
  }
}

void VerifierService::OnRoundVerified(const std::shared_ptr<RoundCall>& call,
                                      const absl::Status& status) {
  if (!status.ok()) return FinishRound(call, status);
  pb::VerifyResponse* v = call->resp->mutable_verify();
  pb::CommitRequest& c = call->commit_req;
  c.set_session_id(call->req.session_id());
  c.mutable_tokens()->CopyFrom(v->tokens());
  c.set_epoch(call->req.epoch());
  c.set_round(call->req.round());
  if (v->has_refresh() && !v->refresh().chunk().empty()) {
    pb::KvRows* rows = v->mutable_refresh();
    const auto bytes = static_cast<int64_t>(rows->chunk().size());
    call->resp->set_refresh_bytes(bytes);
    call->resp->set_refresh_rows(rows->count());
    absl::StatusOr<std::string> key = options_.peer_rows->Put(rows->mutable_chunk());
    if (key.ok()) {
      call->rows_key = *key;
      pb::PeerRows* ref = c.mutable_refresh_from();
      ref->set_data_plane(options_.peer_rows->address());
      ref->set_key(*key);
      ref->set_bytes(bytes);
      ref->set_first_position(rows->first_position());
      ref->set_count(rows->count());
      peer_refresh_bytes_->Inc(static_cast<double>(bytes));
    } else {
      // The outbox is full (its bounds): the rows ride the Commit itself,
      // still worker to worker, unpaced, rather than fail a verified round.
      c.mutable_refresh()->Swap(rows);
    }
  }
  v->clear_refresh();
  if (call->on_verified) call->on_verified();
  if (call->next_draft && !call->next_draft(v->tokens_size(), c.mutable_next())) c.clear_next();
  const auto slot = call->arrived + std::chrono::microseconds(call->req.refresh_delay_us());
  if (!call->rows_key.empty() && slot > Clock::now()) {
    // Offer the rows at their booked slot on the slow link; the alarm's
    // thread starts the commit (no thread waits for it).
    const auto wait = slot - Clock::now();
    call->alarm.Set(std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(wait),
                    [this, weak = std::weak_ptr<RoundCall>(call)](bool fired) {
                      // Weak: a cancelled alarm may keep its callback
                      // (it did, under ASan), and a strong reference
                      // would then keep the call, which owns the alarm,
                      // forever. The call is tracked (rounds_) while the
                      // callback can run.
                      auto c = weak.lock();
                      if (c == nullptr) return;
                      if (fired) return StartPeerCommit(c);
                      // Cancelled: the verifier is shutting down.
                      options_.peer_rows->Remove(c->rows_key);
                      FinishRound(c, absl::UnavailableError("verifier is shutting down"));
                    });
    return;
  }
  StartPeerCommit(call);
}

void VerifierService::StartPeerCommit(const std::shared_ptr<RoundCall>& call) {
  call->commit_ctx.set_deadline(call->deadline);
  call->commit_start = Clock::now();
  call->drafter->async()->Commit(&call->commit_ctx, &call->commit_req, &call->commit_resp,
                                 [this, call](const grpc::Status& st) { OnPeerCommit(call, st); });
}

void VerifierService::OnPeerCommit(const std::shared_ptr<RoundCall>& call,
                                   const grpc::Status& status) {
  if (!call->rows_key.empty()) options_.peer_rows->Remove(call->rows_key);
  call->resp->set_peer_commit_seconds(
      std::chrono::duration<double>(Clock::now() - call->commit_start).count());
  if (status.ok()) {
    pb::CommitResponse& commit = call->commit_resp;
    if (commit.has_next()) {
      // The next round's drafts stay here (no draft goes to the
      // coordinator); their steps were on this round's path.
      call->next_drafts.emplace();
      call->next_drafts->Swap(commit.mutable_next());
      commit.clear_next();
      call->resp->set_draft_seconds(call->resp->draft_seconds() +
                                    call->next_drafts->draft_seconds());
      peer_drafts_with_commit_->Inc();
    }
    *call->resp->mutable_commit() = commit;
  } else {
    NoteDrafterError("Commit", status, call->resp);
  }
  FinishRound(call, absl::OkStatus());
}

void VerifierService::FinishRound(const std::shared_ptr<RoundCall>& call,
                                  const absl::Status& status) {
  if (status.ok()) peer_rounds_->Inc();
  call->finish(status);
  std::lock_guard<std::mutex> lock(rounds_mu_);
  rounds_.erase(call);
  rounds_cv_.notify_all();
}

// ------------------------------------------------------------------ leases

namespace {

// Grants a lease may hold that have not started (the coordinator keeps one
// ahead); one more is refused, ending the lease.
constexpr int kMaxLeaseGrantsAhead = 4;

// The drafts a lease's round takes with `budget_left` tokens left to the
// lease: its grant's take, leaving room for the round's own token.
int64_t TakeWithinBudget(const pb::RoundRequest& r, int64_t budget_left) {
  return std::min<int64_t>(r.take(), budget_left - 1);
}

}  // namespace

// One Lease stream: reads grants, runs their rounds one at a time (each as
// a RoundCall whose finish comes back here), writes one progress message per
// grant in order. Deleted by gRPC's OnDone, which follows Finish; Finish is
// called only when no round runs and no write is pending, so a round never
// outlives its lease.
class VerifierService::LeaseReactor final
    : public grpc::ServerBidiReactor<pb::LeaseGrant, pb::LeaseProgress> {
 public:
  LeaseReactor(VerifierService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx) {
    if (service_->options_.peer_rows == nullptr) {
      ending_ = true;
      finished_ = true;
      Finish(rpc::ToGrpcStatus(absl::FailedPreconditionError(
          "this verifier takes no peer rounds (it has no peer data plane)")));
      return;
    }
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ok) {
      // Half-closed (or cancelled): no more grants; the running round ends
      // the lease, the grants not started are not run.
      ending_ = true;
      return MaybeFinish(lock);
    }
    if (ending_) return MaybeFinish(lock);
    absl::Status st = Accept(incoming_);
    if (st.ok()) {
      Pending p{incoming_.round(), Clock::now(), incoming_.round().load(),
                std::chrono::milliseconds(incoming_.round_timeout_ms())};
      lock.unlock();
      st = service_->TouchRoundSession(p.req, /*hold=*/true);
      lock.lock();
      if (st.ok() && finished_) {
        // The lease ended meanwhile: this grant never runs.
        lock.unlock();
        if (p.hold) service_->DropLeaseHold(session_);
        return;
      }
      if (st.ok()) {
        granted_.push_back(std::move(p));
        if (!ending_) StartRead(&incoming_);
        if (running_ == nullptr) return StartNext(lock);
        return;
      }
    }
    End(st);
    MaybeFinish(lock);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writes_.pop_front();
    if (!ok) {
      End(absl::CancelledError("the lease's coordinator is gone"));
      writes_.clear();
    }
    if (!writes_.empty()) {
      StartWrite(&writes_.front());
      return;
    }
    MaybeFinish(lock);
  }

  void OnCancel() override {
    std::shared_ptr<RoundCall> running;
    {
      std::lock_guard<std::mutex> lock(mu_);
      End(absl::CancelledError("lease cancelled"));
      running = running_;
    }
    // The running round ends promptly (its peer calls and its slot's alarm
    // are cancelled; a verify in the batch sees the cancelled context).
    if (running != nullptr) {
      running->draft_ctx.TryCancel();
      running->commit_ctx.TryCancel();
      running->alarm.Cancel();
    }
  }

  void OnDone() override { delete this; }

 private:
  struct Pending {
    pb::RoundRequest req;
    Clock::time_point arrived;
    bool hold = false;                           // it pinned the prefix (load)
    std::chrono::milliseconds round_timeout{0};  // 0: the peer timeout
  };

  // mu_ held. A grant's fields against the lease's.
  absl::Status Accept(const pb::LeaseGrant& g) {
    VC_RETURN_IF_ERROR(service_->CheckRound(g.round()));
    const pb::RoundRequest& r = g.round();
    if (last_round_ == 0) {
      if (g.budget() < 1 || g.budget() > service_->config_.max_seq_len) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Lease: the first grant's budget must be in [1, ", service_->config_.max_seq_len, "]"));
      }
      session_ = r.session_id();
      drafter_ = r.drafter();
      epoch_ = r.epoch();
      budget_left_ = g.budget();
    } else if (r.session_id() != session_ || r.drafter() != drafter_ || r.epoch() != epoch_) {
      return absl::InvalidArgumentError(
          "Lease: a grant's session, drafter and epoch must be the first grant's");
    } else if (r.round() != last_round_ + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Lease: grant of round ", r.round(), " after round ", last_round_));
    }
    if (g.round_timeout_ms() < 0 || g.round_timeout_ms() > int64_t{600} * 1000) {
      return absl::InvalidArgumentError("Lease: round_timeout_ms must be in [0, 600 s]");
    }
    if (static_cast<int>(granted_.size()) >= kMaxLeaseGrantsAhead) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Lease: more than ", kMaxLeaseGrantsAhead, " grants ahead"));
    }
    last_round_ = r.round();
    return absl::OkStatus();
  }

  // mu_ held. Ends the lease with `st` (the first reason stands).
  void End(const absl::Status& st) {
    if (!ending_) final_ = st;
    ending_ = true;
  }

  // mu_ held, no round running: starts the next granted round, or answers
  // the grants the budget leaves no room for.
  void StartNext(std::unique_lock<std::mutex>& lock) {
    while (!granted_.empty() && !ending_) {
      Pending p = std::move(granted_.front());
      granted_.pop_front();
      const int64_t take = TakeWithinBudget(p.req, budget_left_);
      if (take < 1) {
        pb::LeaseProgress& out = writes_.emplace_back();
        out.set_round(p.req.round());
        out.set_skipped(true);
        // Started before mu_ is let go: a write finishing meanwhile would
        // start this one itself (one write at a time).
        if (writes_.size() == 1) StartWrite(&writes_.front());
        if (p.hold) {
          lock.unlock();
          service_->DropLeaseHold(session_);
          lock.lock();
        }
        continue;
      }
      std::shared_ptr<RoundCall> call = service_->NewRoundCall();
      call->ctx = ctx_;
      call->req = std::move(p.req);
      call->req.set_take(static_cast<int32_t>(take));
      call->resp = &call->owned;
      call->lease_hold = p.hold;
      start_delay_ = Clock::now() - p.arrived;
      call->finish = [this, weak = std::weak_ptr<RoundCall>(call)](const absl::Status& st) {
        OnRoundDone(weak.lock(), st);
      };
      call->on_verified = [this, raw = call.get()] { OnVerified(*raw); };
      call->next_draft = [this](int tokens, pb::DraftRequest* next) {
        return NextDraft(tokens, next);
      };
      if (next_drafts_ && next_drafts_round_ == call->req.round()) {
        call->drafts = std::move(next_drafts_);
      }
      next_drafts_.reset();
      running_ = call;
      // The round's budget as a Round's call deadline would give it, from
      // now (it may have waited behind the round before).
      auto deadline = ctx_->deadline();
      if (p.round_timeout.count() > 0) {
        deadline = std::min(deadline, std::chrono::system_clock::now() + p.round_timeout +
                                          std::chrono::microseconds(call->req.refresh_delay_us()));
      }
      lock.unlock();
      const absl::Status st = service_->StartRound(call, deadline);
      lock.lock();
      if (!st.ok()) {
        running_ = nullptr;
        if (call->lease_hold) {
          lock.unlock();
          service_->DropLeaseHold(session_);
          lock.lock();
        }
        End(st);
      }
      return MaybeFinish(lock);
    }
    MaybeFinish(lock);
  }

  // The running round is verified (its commit is next): its tokens go to
  // the coordinator now, in a progress of their own.
  void OnVerified(const RoundCall& call) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ending_) return;
    pb::LeaseProgress& out = writes_.emplace_back();
    out.set_round(call.req.round());
    out.set_verified_only(true);
    // The round's answer so far: the draft's fields and the verify (its rows
    // already moved to the outbox); the commit's come with the full progress.
    *out.mutable_result() = call.owned;
    if (writes_.size() == 1) StartWrite(&writes_.front());
  }

  // The running round is verified with `tokens`: the Draft of the grant
  // after it, when that has come and the budget leaves it a draft.
  bool NextDraft(int tokens, pb::DraftRequest* next) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ending_ || granted_.empty()) return false;
    const pb::RoundRequest& r = granted_.front().req;
    // As StartNext will clamp it, once this round's tokens are counted.
    const int64_t take = TakeWithinBudget(r, budget_left_ - tokens);
    if (take < 1) return false;
    next->set_session_id(r.session_id());
    next->set_max_tokens(static_cast<int32_t>(take));
    next->set_min_tokens(static_cast<int32_t>(take));
    next->set_lookahead(r.lookahead());
    next->set_epoch(r.epoch());
    next->set_round(r.round());
    return true;
  }

  // A round of this lease is over (FinishRound's call; the round is still
  // tracked by the service until it returns).
  void OnRoundDone(const std::shared_ptr<RoundCall>& call, const absl::Status& st) {
    if (call != nullptr && call->lease_hold) service_->DropLeaseHold(session_);
    std::unique_lock<std::mutex> lock(mu_);
    // This runs on the round's thread, outside gRPC's reactions (gRPC
    // deletes the reactor once Finish is done and no reaction runs), and
    // StartNext lets mu_ go around its calls into the service: the lease
    // must not finish until this thread is out of it. (It did: a write done
    // and a half-close meanwhile finished it, and StartNext went on in a
    // deleted reactor; UBSan in a chaos run.)
    ++round_threads_;
    running_ = nullptr;
    RoundDone(call, st, lock);
    --round_threads_;
    MaybeFinish(lock);
  }

  // OnRoundDone's work; mu_ held (StartNext may let it go in between).
  void RoundDone(const std::shared_ptr<RoundCall>& call, const absl::Status& st,
                 std::unique_lock<std::mutex>& lock) {
    if (call == nullptr) {
      End(absl::InternalError("lease round lost"));
      return;
    }
    if (!st.ok()) {
      End(st);
      return;
    }
    pb::LeaseProgress& out = writes_.emplace_back();
    out.set_round(call->req.round());
    out.set_start_delay_us(
        std::chrono::duration_cast<std::chrono::microseconds>(start_delay_).count());
    *out.mutable_result() = std::move(call->owned);
    budget_left_ -= out.result().verify().tokens_size();
    if (call->next_drafts) {
      next_drafts_ = std::move(call->next_drafts);
      next_drafts_round_ = call->commit_req.next().round();
    }
    if (writes_.size() == 1) StartWrite(&writes_.front());
    // A round whose drafter failed (or that verified nothing) ends the
    // lease; the coordinator decides what follows.
    if (out.result().drafter_error_code() != 0 || !out.result().has_verify()) End(absl::OkStatus());
    StartNext(lock);
  }

  // mu_ held. Finishes once nothing runs, nothing is being written, no
  // more grants will run and no round's thread is in the reactor.
  void MaybeFinish(std::unique_lock<std::mutex>& lock) {
    if (finished_ || running_ != nullptr || !writes_.empty() || !ending_ || round_threads_ > 0) {
      return;
    }
    finished_ = true;
    // Grants never run give back their holds on the prefix.
    std::deque<Pending> left;
    left.swap(granted_);
    const absl::Status final_status = final_;
    lock.unlock();
    for (const Pending& p : left) {
      if (p.hold) service_->DropLeaseHold(session_);
    }
    Finish(rpc::ToGrpcStatus(final_status));
  }

  VerifierService* service_;
  grpc::CallbackServerContext* ctx_;
  std::mutex mu_;
  pb::LeaseGrant incoming_;  // the read in flight
  bool ending_ = false;
  bool finished_ = false;
  absl::Status final_;
  uint64_t session_ = 0;
  std::string drafter_;
  uint64_t epoch_ = 0;
  uint64_t last_round_ = 0;
  int64_t budget_left_ = 0;
  std::deque<Pending> granted_;  // not started, in grant order
  std::shared_ptr<RoundCall> running_;
  int round_threads_ = 0;  // threads in OnRoundDone
  Clock::duration start_delay_{};
  std::deque<pb::LeaseProgress> writes_;  // the front is being written
  // Drafts of round next_drafts_round_, come with the last round's commit.
  std::optional<pb::DraftResponse> next_drafts_;
  uint64_t next_drafts_round_ = 0;
};

grpc::ServerBidiReactor<pb::LeaseGrant, pb::LeaseProgress>* VerifierService::Lease(
    grpc::CallbackServerContext* ctx) {
  return new LeaseReactor(this, ctx);
}

grpc::ServerUnaryReactor* VerifierService::Release(grpc::CallbackServerContext* ctx,
                                                   const pb::ReleaseRequest* req,
                                                   pb::ReleaseResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = sessions_.find(req->session_id());
  if (it == sessions_.end()) {
    resp->set_existed(false);
    return Finish(ctx, absl::OkStatus());
  }
  // A pass in flight finishes first (it holds pointers into the session).
  work_cv_.wait(lock, [&] {
    auto again = sessions_.find(req->session_id());
    return again == sessions_.end() || !again->second->busy;
  });
  it = sessions_.find(req->session_id());
  if (it != sessions_.end()) {
    if (it->second->pinned) UnpinPrefix(*it->second);
    sessions_.erase(it);
  }
  resp->set_existed(true);
  UpdateGauges();
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* VerifierService::Ingest(grpc::CallbackServerContext* ctx,
                                                  const pb::IngestRequest* req,
                                                  pb::IngestResponse* resp) {
  if (req->chunk_tokens() <= 0) {
    return Finish(ctx, absl::InvalidArgumentError("chunk_tokens must be > 0"));
  }
  if (req->tokens_size() == 0 || req->tokens_size() % req->chunk_tokens() != 0) {
    return Finish(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "ingest needs a whole number of ", req->chunk_tokens(),
                           "-token chunks, got ", req->tokens_size(), " tokens")));
  }
  if (absl::Status st = ValidateTenantSalt(req->tenant_salt()); !st.ok()) return Finish(ctx, st);
  if (!req->draft_model_id().empty() && (options_.draft_engine == nullptr ||
                                         req->draft_model_id() != options_.draft_model_id.Raw())) {
    // Variants of a model this verifier cannot run would be stored under
    // that model's id but made from another's prefill.
    return Finish(ctx, absl::FailedPreconditionError(
                           absl::StrCat("ingest asks for variants of draft model ",
                                        absl::BytesToHexString(req->draft_model_id()).substr(0, 16),
                                        ", this verifier's --draft-model is ",
                                        options_.draft_engine == nullptr
                                            ? std::string("not set")
                                            : kvstore::ShortModelId(options_.draft_model_id))));
  }
  // Before any prefill: an ingest whose entries could not be encrypted fails
  // at once instead of after the work.
  if (store_->encrypts_kv() && req->tenant_salt().empty()) {
    return Finish(ctx, absl::FailedPreconditionError(
                           "KV encryption (--kv-secret-file) needs authenticated tenants: this "
                           "ingest has no tenant salt (turn on the coordinator's API keys)"));
  }
  Job job;
  job.kind = Job::Kind::kIngest;
  job.ctx = ctx;
  job.ingest_req = req;
  job.ingest_resp = resp;
  job.enqueued = Clock::now();
  grpc::ServerUnaryReactor* reactor = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Finish(ctx, absl::UnavailableError("verifier is shutting down"));
    if (static_cast<int>(jobs_.size()) >= options_.max_queued_jobs) {
      return Finish(ctx, absl::ResourceExhaustedError("verifier job queue is full"));
    }
    job.reactor = ctx->DefaultReactor();
    reactor = job.reactor;
    jobs_.push_back(std::move(job));
  }
  work_cv_.notify_all();
  return reactor;
}

// --------------------------------------------------------------- prefixes

bool VerifierService::PinPrefix(Session& s) {
  if (s.pinned) {
    auto it = prefixes_.find(s.table_key);
    return it != prefixes_.end() && it->second->state == Prefix::State::kReady;
  }
  s.pinned = true;
  if (s.table_key.empty()) return true;
  std::shared_ptr<Prefix>& p = prefixes_[s.table_key];
  if (p == nullptr) {
    p = std::make_shared<Prefix>();
    p->table_key = s.table_key;
    p->chunk_keys = s.chunk_keys;
    p->tenant_salt = s.tenant_salt;
    p->tokens = s.vs->prefix_len();
    load_queue_.push_back(p);
    load_cv_.notify_one();
  }
  ++p->pins;
  return p->state == Prefix::State::kReady;
}

void VerifierService::UnpinPrefix(Session& s) {
  if (!s.pinned) return;
  s.pinned = false;
  if (s.table_key.empty()) return;
  auto it = prefixes_.find(s.table_key);
  if (it == prefixes_.end()) return;
  if (--it->second->pins <= 0) {
    // A queued or loading prefix is dropped from the table; the loader sees
    // it is orphaned and discards what it fetched.
    prefixes_.erase(it);
  }
  UpdateGauges();
}

void VerifierService::LoaderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    load_cv_.wait(lock, [&] { return stopping_ || !load_queue_.empty(); });
    if (stopping_) return;
    std::shared_ptr<Prefix> p = load_queue_.front();
    load_queue_.pop_front();
    if (prefixes_.count(p->table_key) == 0 || prefixes_[p->table_key] != p) continue;  // orphaned
    p->state = Prefix::State::kLoading;
    const std::vector<std::string> keys = p->chunk_keys;
    const std::string tenant_salt = p->tenant_salt;
    lock.unlock();
    const auto t0 = Clock::now();
    absl::StatusOr<std::unique_ptr<PagedKvCache>> kv = absl::UnknownError("not fetched");
    absl::StatusOr<std::vector<std::string>> chunks = store_->FetchKv(keys, tenant_salt);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t bytes = 0;
    if (chunks.ok()) {
      for (const auto& c : *chunks) bytes += static_cast<int64_t>(c.size());
      PagedKvCache::Options o;
      o.arena = &arena_;
      kv = ingest::LoadFullPrefix(config_, *chunks, o, store_->fetched_checksum());
    } else {
      kv = chunks.status();
    }
    metrics_.fetch_seconds->Observe(secs);
    metrics_.fetch_bytes_full->Inc(static_cast<double>(bytes));
    metrics_.prefix_loads->Inc();
    lock.lock();
    if (kv.ok()) {
      p->kv = std::shared_ptr<const PagedKvCache>(std::move(*kv));
      p->state = Prefix::State::kReady;
      p->bytes = bytes;
      p->fetch_seconds = secs;
    } else {
      p->error = kv.status();
      p->state = Prefix::State::kFailed;
    }
    UpdateGauges();
    work_cv_.notify_all();
  }
}

// ------------------------------------------------------------ batch thread

void VerifierService::BatchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto last_reap = Clock::now();
  while (true) {
    work_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    if (Clock::now() - last_reap > std::chrono::seconds(1)) {
      ReapIdleSessions();
      last_reap = Clock::now();
    }
    if (jobs_.empty()) continue;
    if (jobs_.front().kind == Job::Kind::kIngest) {
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      RunIngest(job);
      lock.lock();
      continue;
    }
    // Gather the verifies due together: wait (within the gather window) only
    // while a session that asked for its prefix (Load) has not sent its
    // verify yet; plain decode steps never wait.
    auto others_due = [&] {
      int due = 0;
      for (const auto& [id, s] : sessions_) {
        if (s->pinned && !s->resident && !s->busy) ++due;
      }
      return due > static_cast<int>(jobs_.size());
    };
    const auto gather_until = Clock::now() + options_.gather;
    work_cv_.wait_until(lock, gather_until, [&] {
      return stopping_ || static_cast<int>(jobs_.size()) >= options_.max_batch_requests ||
             !others_due();
    });
    if (stopping_) return;
    // Take the verifies whose prefix is ready (or failed: they fail now);
    // the rest wait for their load, which wakes this thread.
    std::vector<Job> batch;
    std::deque<Job> keep;
    // Answered once mu_ is released (a Round's or a lease's continuation
    // may take it).
    std::vector<std::pair<Job, absl::Status>> refused;
    bool any_waiting = false;
    while (!jobs_.empty()) {
      Job j = std::move(jobs_.front());
      jobs_.pop_front();
      if (j.kind != Job::Kind::kVerify ||
          static_cast<int>(batch.size()) >= options_.max_batch_requests) {
        keep.push_back(std::move(j));
        continue;
      }
      auto it = sessions_.find(j.session_id);
      if (it == sessions_.end()) {
        const uint64_t id = j.session_id;
        refused.emplace_back(std::move(j),
                             absl::NotFoundError(absl::StrCat("session ", id, " was released")));
        continue;
      }
      if (j.ctx->IsCancelled()) {
        refused.emplace_back(std::move(j), absl::CancelledError("verify cancelled"));
        continue;
      }
      Session& s = *it->second;
      bool ready = s.table_key.empty();
      if (!ready) {
        auto p = prefixes_.find(s.table_key);
        if (p == prefixes_.end()) {
          PinPrefix(s);  // released meanwhile: load again
          p = prefixes_.find(s.table_key);
        }
        ready = p->second->state == Prefix::State::kReady ||
                p->second->state == Prefix::State::kFailed;
      }
      if (!ready || s.busy) {
        any_waiting = true;
        keep.push_back(std::move(j));
        continue;
      }
      s.busy = true;
      batch.push_back(std::move(j));
    }
    jobs_ = std::move(keep);
    if (!refused.empty()) {
      lock.unlock();
      for (auto& [job, status] : refused) job.Finish(status);
      lock.lock();
    }
    if (batch.empty()) {
      if (any_waiting) work_cv_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    lock.unlock();
    RunVerifies(batch);
    lock.lock();
    work_cv_.notify_all();  // Release waits for busy sessions
  }
}

void VerifierService::RunVerifies(std::vector<Job>& jobs) {
  // mu_ is not held; the sessions are marked busy, their prefixes pinned.
  std::vector<Session*> sessions;
  std::vector<std::shared_ptr<Prefix>> prefixes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Job& j : jobs) {
      Session* s = sessions_.at(j.session_id).get();
      sessions.push_back(s);
      prefixes.push_back(s->table_key.empty() ? nullptr : prefixes_.at(s->table_key));
    }
  }
  std::map<Prefix*, int> users;
  for (auto& p : prefixes) {
    if (p) ++users[p.get()];
  }
  std::vector<cluster::VerifySession*> run;
  std::vector<std::vector<int32_t>> drafts;
  std::vector<std::vector<std::vector<double>>> draft_probs;
  std::vector<size_t> run_index;
  std::vector<absl::Status> errors(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (prefixes[i] != nullptr) {
      if (prefixes[i]->state == Prefix::State::kFailed) {
        errors[i] = absl::UnavailableError(
            absl::StrCat("loading the prefix's full KV failed: ", prefixes[i]->error.message()));
        continue;
      }
      if (absl::Status st = sessions[i]->vs->AttachPrefix(prefixes[i]->kv); !st.ok()) {
        errors[i] = st;
        continue;
      }
    }
    run.push_back(sessions[i]->vs.get());
    drafts.push_back(jobs[i].drafts);
    draft_probs.push_back(jobs[i].draft_probs);
    run_index.push_back(i);
  }
  const auto t0 = Clock::now();
  auto results = cluster::RunVerifyPass(*engine_, run, drafts, draft_probs);
  const double forward = std::chrono::duration<double>(Clock::now() - t0).count();
  metrics_.forward_seconds->Observe(forward);
  batch_requests_->Observe(static_cast<double>(run.size()));

  std::unique_lock<std::mutex> lock(mu_);
  for (size_t r = 0; r < run.size(); ++r) {
    const size_t i = run_index[r];
    Session& s = *sessions[i];
    s.vs->DetachPrefix();
    if (!results[r].ok()) {
      errors[i] = results[r].status();
      continue;
    }
    const cluster::VerifyOutcome& o = *results[r];
    pb::VerifyResponse* resp = jobs[i].verify_resp;
    resp->set_accepted(o.accepted);
    for (int32_t t : o.tokens) resp->add_tokens(t);
    if (o.refresh_count > 0 && !jobs[i].skip_refresh) {
      absl::StatusOr<std::string> rows = s.vs->EncodeRows(o.refresh_first, o.refresh_count);
      if (!rows.ok()) {
        errors[i] = rows.status();
        continue;
      }
      resp->mutable_refresh()->set_first_position(o.refresh_first);
      resp->mutable_refresh()->set_count(o.refresh_count);
      resp->mutable_refresh()->set_chunk(std::move(*rows));
    }
    resp->set_forward_seconds(forward);
    resp->set_batch_requests(static_cast<int32_t>(run.size()));
    resp->set_load_wait_seconds(
        std::chrono::duration<double>(t0 - jobs[i].enqueued).count());
    if (prefixes[i] != nullptr) {
      Prefix& p = *prefixes[i];
      const bool shared = users[&p] > 1 || p.charged_to_verify;
      resp->set_prefix_shared(shared);
      if (!p.charged_to_verify) {
        resp->set_prefix_bytes_loaded(p.bytes);
        p.charged_to_verify = true;
      } else {
        prefix_shared_->Inc();
      }
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    Session& s = *sessions[i];
    s.busy = false;
    s.last_used = Clock::now();
    // The transient prefix goes after its verify unless the session decodes
    // with it resident or a lease's next round has asked for it already.
    if (!s.resident && s.lease_holds == 0) UnpinPrefix(s);
  }
  UpdateGauges();
  // Answered without mu_: a Round's or a lease's continuation may take it
  // (a lease gives back its holds on the prefix).
  lock.unlock();
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].Finish(errors[i]);
}

void VerifierService::RunIngest(Job& job) {
  const pb::IngestRequest& req = *job.ingest_req;
  // The coordinator's call is a child of its client's: when that client
  // cancels (or its deadline passes) this context is cancelled too, and the
  // ingest stops at the next piece, chunk or variant instead of finishing
  // and writing for nobody.
  auto cancelled = [&job] { return job.ctx->IsCancelled(); };
  absl::Status status = [&]() -> absl::Status {
    if (cancelled()) return absl::CancelledError("ingest cancelled by its caller before it started");
    VC_ASSIGN_OR_RETURN(auto variants, ingest::ParseVariantList(req.variants()));
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = req.chunk_tokens();
    ko.tenant_salt = req.tenant_salt();
    ko.numerics_version = options_.numerics_version;
    std::vector<int32_t> tokens(req.tokens().begin(), req.tokens().end());
    const auto t0 = Clock::now();
    const ingest::DraftModelIngest draft{options_.draft_engine, options_.draft_model_id};
    VC_ASSIGN_OR_RETURN(
        ingest::PrefixEntries entries,
        ingest::BuildPrefixEntries(*engine_, tokens, ko, model_id_, variants, cancelled,
                                   req.draft_model_id().empty() ? nullptr : &draft));
    job.ingest_resp->set_prefill_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
    if (cancelled()) return absl::CancelledError("ingest cancelled by its caller before its put");
    int64_t bytes = 0;
    for (const auto& e : entries.entries) bytes += static_cast<int64_t>(e.second.size());
    // Encrypted (with a KV secret) before sealed; the bytes counted above
    // are the plaintext's.
    // The put, retries after a store restart included, ends with the
    // ingest's own deadline (when it has one within the hour).
    std::chrono::steady_clock::time_point put_deadline{};
    const auto left = job.ctx->deadline() - std::chrono::system_clock::now();
    if (left < std::chrono::hours(1)) {
      put_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
    }
    VC_RETURN_IF_ERROR(store_->PutKv(std::move(entries.entries), req.tenant_salt(), put_deadline));
    job.ingest_resp->set_bytes(bytes);
    for (const auto& k : entries.chunk_keys) job.ingest_resp->add_chunk_keys(k.Raw());
    for (const auto& v : entries.variants) {
      pb::StoredVariantInfo* out = job.ingest_resp->add_variants();
      out->set_key(v.key.Raw());
      out->set_description(v.description);
      out->set_target_ratio(v.target_ratio);
      out->set_achieved_ratio(v.achieved_ratio);
      out->set_bytes(v.bytes);
      out->set_draft_model_id(req.draft_model_id());
    }
    return absl::OkStatus();
  }();
  if (status.code() == absl::StatusCode::kCancelled) ingests_cancelled_->Inc();
  job.reactor->Finish(rpc::ToGrpcStatus(status));
}

void VerifierService::ReapIdleSessions() {
  const auto now = Clock::now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    Session& s = *it->second;
    if (!s.busy && now - s.last_used > options_.session_idle) {
      if (s.pinned) UnpinPrefix(s);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  UpdateGauges();
}

void VerifierService::UpdateGauges() {
  metrics_.sessions->Set(static_cast<double>(sessions_.size()));
  int64_t transient = 0;
  for (const auto& [key, p] : prefixes_) {
    if (p->kv) transient += p->kv->bytes();
  }
  metrics_.kv_transient->Set(static_cast<double>(transient));
  metrics_.kv_device->Set(static_cast<double>(arena_.in_use() - transient));
}

}  // namespace vc::worker
