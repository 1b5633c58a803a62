#include "services/worker/drafter_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compress/compressor.h"
#include "common/ingest/prefix_ingest.h"
#include "common/kv/compressed_kv.h"
#include "common/kvstore/variant_codec.h"
#include "common/rpc/rpc.h"
#include "services/common/daemon.h"
#include "services/common/sampling_config.h"
#include "services/worker/worker_common.h"

namespace vc::worker {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

struct DrafterService::SharedVariant {
  std::shared_ptr<const CompressedPrefix> prefix;
  KvArena::Reservation charge;  // its bytes, charged once for all sessions
};

struct DrafterService::Session {
  std::unique_ptr<cluster::DraftSession> ds;
  int window = 8;  // x asked by the coordinator
  Clock::time_point last_used;
  bool busy = false;         // in a draft step
  double draft_seconds = 0;  // steps since the last commit (DraftResponse)
  // Peer rounds (0 where unchecked): the attempt this session belongs to,
  // the round of the last Draft and of the last applied Commit.
  uint64_t epoch = 0;
  uint64_t drafted_round = 0;
  uint64_t committed_round = 0;
};

namespace {

// Whether a Draft (`committing` false) or Commit of (`epoch`, `round`) may
// act on `s`: a call of another attempt, or of a round already committed
// (or, for a commit, not the one last drafted), is stale: a late or
// repeated message that must not move the session.
absl::Status CheckRound(uint64_t session_id, uint64_t s_epoch, uint64_t drafted, uint64_t committed,
                        uint64_t epoch, uint64_t round, bool committing) {
  if (epoch != 0 && epoch != s_epoch) {
    return absl::AbortedError(absl::StrCat("stale epoch ", epoch, " for session ", session_id,
                                           " (its epoch is ", s_epoch, ")"));
  }
  if (round == 0) return absl::OkStatus();
  if (round <= committed || (committing && round != drafted)) {
    return absl::AbortedError(absl::StrCat("stale round ", round, " for session ", session_id,
                                           " (last drafted ", drafted, ", last committed ",
                                           committed, ")"));
  }
  return absl::OkStatus();
}

// A Draft's (or a Commit's next drafts') bounds, checked before anything
// is touched.
absl::Status CheckDraftBounds(const pb::DraftRequest& req) {
  if (req.max_tokens() < 1 || req.min_tokens() < 0 || req.min_tokens() > req.max_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 0 <= min_tokens <= max_tokens and max_tokens >= 1, got min ",
                     req.min_tokens(), " max ", req.max_tokens()));
  }
  return absl::OkStatus();
}

}  // namespace

// A Draft call, or a Commit that takes the next round's drafts with it
// (CommitRequest.next), waiting for its drafts.
struct DrafterService::Waiter {
  uint64_t session_id = 0;
  int max_tokens = 1;
  int min_tokens = 1;
  grpc::CallbackServerContext* ctx = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;
  pb::DraftResponse* resp = nullptr;
  // A Commit's: its response (`resp` is its `next`). The commit has been
  // applied, so drafts that cannot be had still answer it OK, without `next`.
  pb::CommitResponse* commit = nullptr;
  Clock::time_point deadline;

  void Fail(const grpc::Status& status) const {
    if (commit == nullptr) return reactor->Finish(status);
    commit->clear_next();
    commit->set_next_error(status.error_message());
    reactor->Finish(grpc::Status::OK);
  }
};

struct DrafterService::OpenJob {
  grpc::CallbackServerContext* ctx = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;
  const pb::DrafterOpenRequest* req = nullptr;
  pb::DrafterOpenResponse* resp = nullptr;
};

DrafterService::DrafterService(Engine* engine, const kvstore::ModelId& model_id,
                               daemon::StoreClient* store, metrics::Registry* registry,
                               const DrafterOptions& options)
    : engine_(engine),
      config_(engine->config()),
      model_id_(model_id),
      store_(store),
      options_(options),
      arena_("drafter", options.arena_bytes),
      peer_rows_(options.peer_rows),
      metrics_(RegisterWorkerMetrics(registry, "drafter")) {
  if (options_.target_config != nullptr) config_.max_seq_len = options_.target_config->max_seq_len;
  if (options_.numerics_version == 0) {
    options_.numerics_version =
        NumericsVersionFor(options_.target_config != nullptr ? *options_.target_config : config_);
  }
  continuation_hits_ = &daemon::MustCounter(registry, "vericache_drafter_continuation_drafts_total",
                                            "Drafts made during a verify that survived it "
                                            "(speculative continuation).")
                            ->Get();
  rolled_back_ = &daemon::MustCounter(registry, "vericache_drafter_rolled_back_drafts_total",
                                      "Drafts thrown away after a verify.")
                      ->Get();
  online_folds_ = &daemon::MustCounter(registry, "vericache_drafter_online_folds_total",
                                       "Online compressor updates: settled tokens folded into "
                                       "a session's compressed view.")
                       ->Get();
  batcher_ = std::thread([this] { BatchLoop(); });
  opener_ = std::thread([this] { OpenLoop(); });
}

DrafterService::~DrafterService() { Shutdown(); }

void DrafterService::Shutdown() {
  std::vector<Waiter> waiters;
  std::deque<OpenJob> opens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    waiters.swap(waiters_);
    opens.swap(open_queue_);
  }
  const grpc::Status gone(grpc::StatusCode::UNAVAILABLE, "drafter is shutting down");
  for (Waiter& w : waiters) w.Fail(gone);
  for (OpenJob& j : opens) j.reactor->Finish(gone);
  work_cv_.notify_all();
  open_cv_.notify_all();
  if (batcher_.joinable()) batcher_.join();
  if (opener_.joinable()) opener_.join();
}

grpc::ServerUnaryReactor* DrafterService::Info(grpc::CallbackServerContext* ctx,
                                               const pb::WorkerInfoRequest* /*req*/,
                                               pb::WorkerInfoResponse* resp) {
  int32_t sessions = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions = static_cast<int32_t>(sessions_.size());
  }
  const bool draft_model = options_.target_config != nullptr;
  FillWorkerInfo("drafter", draft_model ? *options_.target_config : config_, model_id_,
                 options_.numerics_version, options_.data_plane, sessions, arena_.in_use(),
                 store_->data_stats(), resp, draft_model ? &options_.draft_model_id : nullptr);
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* DrafterService::Open(grpc::CallbackServerContext* ctx,
                                               const pb::DrafterOpenRequest* req,
                                               pb::DrafterOpenResponse* resp) {
  if (req->lookahead() < 1) {
    return Finish(ctx, absl::InvalidArgumentError(
                           absl::StrCat("lookahead must be >= 1, got ", req->lookahead())));
  }
  if (req->prefix().prefix_tokens() > 0 && !req->full_prefix() && req->variant_key().size() != 32) {
    return Finish(ctx, absl::InvalidArgumentError(
                           "variant_key must be a 32-byte key (or set full_prefix)"));
  }
  if (req->full_prefix() && options_.target_config != nullptr) {
    return Finish(ctx, absl::FailedPreconditionError(
                           "this drafter drafts with a separate draft model (--draft-model); "
                           "full_prefix (full_remote) needs a drafter of the target model"));
  }
  if (req->online_update() && (req->full_prefix() || req->prefix().prefix_tokens() == 0)) {
    return Finish(ctx, absl::InvalidArgumentError(
                           "online update folds into a compressed variant: it needs a stored "
                           "prefix and a variant_key, not full_prefix"));
  }
  OpenJob job{ctx, ctx->DefaultReactor(), req, resp};
  grpc::ServerUnaryReactor* reactor = job.reactor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      job.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "drafter is shutting down"));
      return reactor;
    }
    if (static_cast<int>(open_queue_.size()) >= options_.max_open_queue) {
      job.reactor->Finish(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "drafter open queue is full"));
      return reactor;
    }
    open_queue_.push_back(job);
    opening_.insert(req->session_id());
  }
  open_cv_.notify_one();
  return reactor;
}

void DrafterService::OpenLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    open_cv_.wait(lock, [&] { return stopping_ || !open_queue_.empty(); });
    if (stopping_) return;
    OpenJob job = open_queue_.front();
    open_queue_.pop_front();
    lock.unlock();
    RunOpen(job);
    lock.lock();
  }
}

void DrafterService::RunOpen(OpenJob& job) {
  const pb::DrafterOpenRequest& req = *job.req;
  absl::Status status = [&]() -> absl::Status {
    std::vector<int32_t> prompt(req.prompt().begin(), req.prompt().end());
    VC_ASSIGN_OR_RETURN(PrefixRequest prefix, ValidatePrefix(req.prefix(), prompt, config_));
    VC_RETURN_IF_ERROR(ValidateTenantSalt(req.tenant_salt()));
    VC_ASSIGN_OR_RETURN(cluster::SessionSampling sampling, daemon::ToSessionSampling(req.sampling()));
    // Before the fetch: a bad compressor fails fast. The ingest made the
    // variant from (name, ratio, bits) with default method parameters;
    // DraftSession::Create checks the description against the variant's.
    std::shared_ptr<const Compressor> online;
    if (req.online_update()) {
      CompressorOptions co;
      co.name = req.compressor();
      co.ratio = req.ratio();
      co.bits = req.bits();
      absl::StatusOr<std::unique_ptr<Compressor>> c = CreateCompressor(co);
      if (!c.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("online update compressor: ", c.status().message()));
      }
      online = std::move(c).value();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (sessions_.count(req.session_id()) > 0) {
        return absl::AlreadyExistsError(absl::StrCat("session ", req.session_id(), " is already open"));
      }
      if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "drafter holds its maximum of ", options_.max_sessions, " sessions"));
      }
    }
    auto session = std::make_unique<Session>();
    session->epoch = req.epoch();
    std::unique_ptr<SequenceKv> kv;
    const auto t0 = Clock::now();
    if (prefix.tokens == 0) {
      kv = std::make_unique<cluster::PrefixTailKv>(config_, nullptr, 0, 0, &arena_);
      job.resp->set_achieved_ratio(1.0);
    } else if (req.full_prefix()) {
      // full_remote: the full chunks over the slow link, fetched once while
      // any session of this drafter uses them.
      const std::string cache_key = prefix.chunk_keys.back();
      std::shared_ptr<const PagedKvCache> full;
      {
        std::lock_guard<std::mutex> lock(mu_);
        full = full_cache_[cache_key].lock();
      }
      if (full == nullptr) {
        VC_ASSIGN_OR_RETURN(std::vector<std::string> chunks,
                            store_->FetchKv(prefix.chunk_keys, req.tenant_salt()));
        int64_t bytes = 0;
        for (const auto& c : chunks) bytes += static_cast<int64_t>(c.size());
        PagedKvCache::Options o;
        o.arena = &arena_;
        VC_ASSIGN_OR_RETURN(std::unique_ptr<PagedKvCache> loaded,
                            ingest::LoadFullPrefix(config_, chunks, o, store_->fetched_checksum()));
        full = std::move(loaded);
        job.resp->set_prefix_bytes(bytes);
        metrics_.fetch_bytes_full->Inc(static_cast<double>(bytes));
        std::lock_guard<std::mutex> lock(mu_);
        full_cache_[cache_key] = full;
      }
      kv = std::make_unique<cluster::PrefixTailKv>(config_, std::move(full), prefix.tokens, 0,
                                                   &arena_);
      job.resp->set_achieved_ratio(1.0);
      job.resp->set_compressor("full");
    } else {
      // The compressed variant over the slow link, fetched once while any
      // session of this drafter uses it (requests over one prefix share it).
      std::shared_ptr<const SharedVariant> variant;
      {
        std::lock_guard<std::mutex> lock(mu_);
        variant = variant_cache_[req.variant_key()].lock();
      }
      if (variant == nullptr) {
        VC_ASSIGN_OR_RETURN(std::vector<std::string> blobs,
                            store_->FetchKv({req.variant_key()}, req.tenant_salt()));
        VC_ASSIGN_OR_RETURN(
            std::shared_ptr<const CompressedPrefix> compressed,
            kvstore::DecodeCompressedPrefix(config_, blobs[0], store_->fetched_checksum()));
        if (compressed->prefix_len() != prefix.tokens) {
          return absl::DataLossError(absl::StrCat("stored variant covers ",
                                                  compressed->prefix_len(),
                                                  " tokens, the prefix has ", prefix.tokens));
        }
        auto holder = std::make_shared<SharedVariant>();
        VC_ASSIGN_OR_RETURN(holder->charge, arena_.Reserve(compressed->bytes()));
        holder->prefix = std::move(compressed);
        job.resp->set_prefix_bytes(static_cast<int64_t>(blobs[0].size()));
        metrics_.fetch_bytes_compressed->Inc(static_cast<double>(blobs[0].size()));
        variant = holder;
        std::lock_guard<std::mutex> lock(mu_);
        variant_cache_[req.variant_key()] = variant;
      }
      job.resp->set_achieved_ratio(variant->prefix->ratio());
      job.resp->set_compressor(variant->prefix->description());
      // Aliasing: the view keeps the holder (and its arena charge) alive.
      std::shared_ptr<const CompressedPrefix> view(variant, variant->prefix.get());
      kv = std::make_unique<CompressedSequenceKv>(config_, std::move(view), 0, &arena_);
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    job.resp->set_fetch_seconds(secs);
    if (prefix.tokens > 0) {
      metrics_.fetch_seconds->Observe(secs);
      metrics_.prefix_loads->Inc();
    }
    cluster::DraftSessionOptions dopt;
    dopt.sampling = sampling;
    dopt.end_position = req.end_position();
    dopt.lookahead = req.lookahead() + options_.continuation_tokens;
    dopt.online.compressor = std::move(online);
    dopt.online.arena = &arena_;
    session->window = req.lookahead();
    VC_ASSIGN_OR_RETURN(session->ds, cluster::DraftSession::Create(config_, std::move(prompt),
                                                                   std::move(kv), prefix.tokens,
                                                                   dopt));
    session->last_used = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("drafter is shutting down");
    // The caller gave up (its deadline passed while this drafter was paused
    // or fetching) and may have released the session already: it never
    // learns of this one, so none is kept.
    if (released_while_opening_.count(req.session_id()) > 0) {
      return absl::CancelledError(
          absl::StrCat("session ", req.session_id(), " was released before its Open finished"));
    }
    if (job.ctx->IsCancelled()) {
      return absl::DeadlineExceededError("the Open's caller gave up before it finished");
    }
    if (!sessions_.emplace(req.session_id(), std::move(session)).second) {
      return absl::AlreadyExistsError(absl::StrCat("session ", req.session_id(), " is already open"));
    }
    UpdateGauges();
    return absl::OkStatus();
  }();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = opening_.find(req.session_id());
    if (it != opening_.end()) opening_.erase(it);
    if (opening_.count(req.session_id()) == 0) released_while_opening_.erase(req.session_id());
  }
  if (status.ok()) work_cv_.notify_all();
  job.reactor->Finish(rpc::ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* DrafterService::Draft(grpc::CallbackServerContext* ctx,
                                                const pb::DraftRequest* req,
                                                pb::DraftResponse* resp) {
  if (absl::Status st = CheckDraftBounds(*req); !st.ok()) return Finish(ctx, st);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Waiter w;
  w.ctx = ctx;
  w.reactor = reactor;
  w.resp = resp;
  w.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  ctx->deadline() - std::chrono::system_clock::now());
  absl::Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st = QueueDraftWaiter(*req, w);
  }
  if (!st.ok()) {
    reactor->Finish(rpc::ToGrpcStatus(st));
  } else {
    work_cv_.notify_all();
  }
  return reactor;
}

absl::Status DrafterService::QueueDraftWaiter(const pb::DraftRequest& req, Waiter w) {
  auto it = sessions_.find(req.session_id());
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", req.session_id()));
  }
  Session& s = *it->second;
  VC_RETURN_IF_ERROR(CheckRound(req.session_id(), s.epoch, s.drafted_round, s.committed_round,
                                req.epoch(), req.round(), false));
  if (static_cast<int>(waiters_.size()) >= options_.max_waiting_drafts) {
    return absl::ResourceExhaustedError("too many Draft calls waiting on this drafter");
  }
  if (req.round() != 0) s.drafted_round = req.round();
  s.last_used = Clock::now();
  if (req.lookahead() > 0) {
    s.window = req.lookahead();
    s.ds->set_lookahead(req.lookahead() + options_.continuation_tokens);
  }
  // The session must be able to reach max_tokens before the next commit.
  if (s.ds->lookahead() < req.max_tokens()) s.ds->set_lookahead(req.max_tokens());
  w.session_id = req.session_id();
  w.max_tokens = req.max_tokens();
  w.min_tokens = std::max(1, req.min_tokens());
  waiters_.push_back(w);
  ServeWaiters();
  return absl::OkStatus();
}

void DrafterService::ServeWaiters() {
  const auto now = Clock::now();
  std::vector<Waiter> still;
  for (Waiter& w : waiters_) {
    auto it = sessions_.find(w.session_id);
    if (it == sessions_.end()) {
      w.Fail(grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("session ", w.session_id, " was released")));
      continue;
    }
    Session& s = *it->second;
    const auto drafts = s.ds->drafts();
    const bool can_draft_more = s.ds->wants_step() || s.busy;
    if (static_cast<int>(drafts.size()) >= w.min_tokens || (!can_draft_more && !drafts.empty())) {
      const int n = std::min<int>(w.max_tokens, static_cast<int>(drafts.size()));
      for (int i = 0; i < n; ++i) w.resp->add_drafts(drafts[i]);
      const auto probs = s.ds->draft_probs();
      for (int i = 0; i < n && i < static_cast<int>(probs.size()); ++i) {
        ToDraftDistribution(probs[i], w.resp->add_draft_probs());
      }
      w.resp->set_first_position(s.ds->verified_end());
      w.resp->set_ready(static_cast<int32_t>(drafts.size()));
      w.resp->set_step_seconds(step_seconds_ewma_);
      w.resp->set_draft_seconds(s.draft_seconds);
      w.reactor->Finish(grpc::Status::OK);
      continue;
    }
    if (!can_draft_more) {
      w.Fail(grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                          "no draft possible: the session reached its end position"));
      continue;
    }
    if (now >= w.deadline || w.ctx->IsCancelled()) {
      w.Fail(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "drafts were not ready before the deadline"));
      continue;
    }
    still.push_back(w);
  }
  waiters_.swap(still);
}

grpc::ServerUnaryReactor* DrafterService::Commit(grpc::CallbackServerContext* ctx,
                                                 const pb::CommitRequest* req,
                                                 pb::CommitResponse* resp) {
  const auto start = Clock::now();
  std::vector<int32_t> tokens(req->tokens().begin(), req->tokens().end());
  if (req->has_refresh() && req->has_refresh_from()) {
    return Finish(ctx,
                  absl::InvalidArgumentError("Commit: refresh and refresh_from are exclusive"));
  }
  if (options_.target_config != nullptr &&
      (req->has_refresh_from() || !req->refresh().chunk().empty())) {
    // Same shape or not, the verifier's rows are the target's K/V: written
    // into the draft model's cache they would be wrong KV.
    return Finish(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "this drafter drafts with draft model ",
                           kvstore::ShortModelId(options_.draft_model_id),
                           ", whose KV the target's refresh rows are not; commit without them")));
  }
  if (req->has_next()) {
    // The next round's drafts, taken once this commit is applied: checked
    // first, so a malformed request changes nothing.
    const pb::DraftRequest& next = req->next();
    if (absl::Status st = CheckDraftBounds(next); !st.ok()) {
      return Finish(ctx, absl::Status(st.code(), absl::StrCat("Commit next: ", st.message())));
    }
    if (next.session_id() != req->session_id() || next.epoch() != req->epoch() ||
        (req->round() != 0 && next.round() <= req->round())) {
      return Finish(ctx, absl::InvalidArgumentError(
                             "Commit next: the next drafts must be of the same session and epoch "
                             "and of a later round"));
    }
  }
  // A stale or unknown commit is refused before anything else (checked again
  // below, once the session is idle: a round may have moved it meanwhile).
  auto check = [&](const Session* s) {
    if (s == nullptr) return absl::NotFoundError(absl::StrCat("no session ", req->session_id()));
    return CheckRound(req->session_id(), s->epoch, s->drafted_round, s->committed_round,
                      req->epoch(), req->round(), true);
  };
  auto find = [&]() -> Session* {
    auto it = sessions_.find(req->session_id());
    return it == sessions_.end() ? nullptr : it->second.get();
  };
  if (req->has_refresh_from()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = check(find()); !st.ok()) return Finish(ctx, st);
  }
  // Peer rounds: the rows wait on the verifier's peer data plane; fetched
  // before the session is touched (the slow link's time is the fetch's).
  std::string fetched_rows;
  if (req->has_refresh_from()) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             ctx->deadline() - std::chrono::system_clock::now());
    absl::StatusOr<std::string> rows = peer_rows_.Fetch(req->refresh_from(), deadline);
    if (!rows.ok()) {
      return Finish(
          ctx, absl::Status(rows.status().code(), absl::StrCat("fetching the refresh rows from ",
                                                               req->refresh_from().data_plane(),
                                                               ": ", rows.status().message())));
    }
    fetched_rows = std::move(*rows);
    resp->set_refresh_fetch_seconds(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::unique_lock<std::mutex> lock(mu_);
  work_cv_.wait(lock, [&] {
    const Session* s = find();
    return s == nullptr || !s->busy;
  });
  Session* found = find();
  if (absl::Status st = check(found); !st.ok()) return Finish(ctx, st);
  Session& s = *found;
  s.last_used = Clock::now();
  absl::StatusOr<cluster::CommitOutcome> out =
      s.ds->Commit(tokens, req->has_refresh_from() ? fetched_rows : req->refresh().chunk());
  if (!out.ok()) return Finish(ctx, out.status());
  if (req->round() != 0) s.committed_round = req->round();
  resp->set_surviving_drafts(out->surviving_drafts);
  resp->set_rolled_back(out->rolled_back);
  resp->set_online_folds(s.ds->online_folds());
  resp->set_kv_bytes(s.ds->kv_bytes());
  s.draft_seconds = 0;
  resp->set_commit_seconds(std::chrono::duration<double>(Clock::now() - start).count());
  continuation_hits_->Inc(out->surviving_drafts);
  rolled_back_->Inc(out->rolled_back);
  if (out->folded) {
    online_folds_->Inc();
    UpdateGauges();  // a fold changes the arena's bytes
  }
  if (!req->has_next()) {
    lock.unlock();
    work_cv_.notify_all();
    return Finish(ctx, absl::OkStatus());
  }
  // The next round's drafts ride this answer (one call fewer per round). Its
  // wait is bounded by half the call's time left, so the applied commit is
  // answered before the caller gives up on it.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Waiter w;
  w.ctx = ctx;
  w.reactor = reactor;
  w.resp = resp->mutable_next();
  w.commit = resp;
  const auto now = Clock::now();
  w.deadline = now + std::chrono::duration_cast<Clock::duration>(
                         (ctx->deadline() - std::chrono::system_clock::now()) / 2);
  if (absl::Status st = QueueDraftWaiter(req->next(), w); !st.ok()) {
    w.Fail(rpc::ToGrpcStatus(st));
  }
  lock.unlock();
  work_cv_.notify_all();
  return reactor;
}

grpc::ServerUnaryReactor* DrafterService::Release(grpc::CallbackServerContext* ctx,
                                                  const pb::ReleaseRequest* req,
                                                  pb::ReleaseResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  work_cv_.wait(lock, [&] {
    auto it = sessions_.find(req->session_id());
    return it == sessions_.end() || !it->second->busy;
  });
  resp->set_existed(sessions_.erase(req->session_id()) > 0);
  if (!resp->existed() && opening_.count(req->session_id()) > 0) {
    released_while_opening_.insert(req->session_id());
  }
  ServeWaiters();
  UpdateGauges();
  return Finish(ctx, absl::OkStatus());
}

void DrafterService::BatchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto last_reap = Clock::now();
  std::vector<float> logits;
  while (true) {
    work_cv_.wait_for(lock, std::chrono::milliseconds(20), [&] {
      if (stopping_) return true;
      for (const auto& [id, s] : sessions_) {
        if (!s->busy && s->ds->wants_step()) return true;
      }
      return false;
    });
    if (stopping_) return;
    ServeWaiters();  // expire waiters even when nothing drafts
    if (Clock::now() - last_reap > std::chrono::seconds(1)) {
      ReapIdleSessions();
      last_reap = Clock::now();
    }
    // One step for every session below its lookahead, bounded by the
    // engine's batch size.
    std::vector<Session*> stepping;
    std::vector<SequenceInput> batch;
    int64_t tokens = 0;
    for (auto& [id, s] : sessions_) {
      if (s->busy || !s->ds->wants_step()) continue;
      SequenceInput in = s->ds->BeginStep();
      if (tokens + static_cast<int64_t>(in.tokens.size()) > engine_->max_batch_tokens() &&
          !batch.empty()) {
        s->ds->AbortStep();
        break;
      }
      tokens += static_cast<int64_t>(in.tokens.size());
      s->busy = true;
      stepping.push_back(s.get());
      batch.push_back(in);
    }
    if (batch.empty()) continue;
    lock.unlock();
    const auto t0 = Clock::now();
    std::vector<absl::Status> status(stepping.size());
    std::vector<std::vector<float>> rows(stepping.size());
    const absl::Status st = engine_->Forward(batch, &logits);
    const int64_t vocab = config_.vocab_size;
    if (st.ok()) {
      for (size_t i = 0; i < stepping.size(); ++i) {
        rows[i].assign(logits.begin() + static_cast<std::ptrdiff_t>(i * vocab),
                       logits.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
      }
    } else {
      // The engine validates the whole batch before touching any KV; find
      // the session(s) at fault by running each alone.
      for (size_t i = 0; i < stepping.size(); ++i) {
        status[i] = stepping.size() == 1 ? st : engine_->Forward({&batch[i], 1}, &rows[i]);
      }
    }
    const double step = std::chrono::duration<double>(Clock::now() - t0).count();
    metrics_.forward_seconds->Observe(step);
    lock.lock();
    step_seconds_ewma_ = step_seconds_ewma_ == 0 ? step : 0.9 * step_seconds_ewma_ + 0.1 * step;
    for (size_t i = 0; i < stepping.size(); ++i) {
      Session* s = stepping[i];
      s->busy = false;
      s->draft_seconds += step;
      if (!status[i].ok()) {
        // Out of arena or context: the session stops drafting; its waiters
        // get what exists (or an error) and the coordinator falls back.
        s->ds->AbortStep();
        s->ds->set_lookahead(static_cast<int>(s->ds->drafts().size()));
        continue;
      }
      (void)s->ds->FinishStep(rows[i]);
    }
    ServeWaiters();
    UpdateGauges();
    work_cv_.notify_all();
  }
}

void DrafterService::ReapIdleSessions() {
  for (auto it = variant_cache_.begin(); it != variant_cache_.end();) {
    it = it->second.expired() ? variant_cache_.erase(it) : std::next(it);
  }
  for (auto it = full_cache_.begin(); it != full_cache_.end();) {
    it = it->second.expired() ? full_cache_.erase(it) : std::next(it);
  }
  const auto now = Clock::now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!it->second->busy && now - it->second->last_used > options_.session_idle) {
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  UpdateGauges();
}

void DrafterService::UpdateGauges() {
  metrics_.sessions->Set(static_cast<double>(sessions_.size()));
  metrics_.kv_device->Set(static_cast<double>(arena_.in_use()));
}

}  // namespace vc::worker
