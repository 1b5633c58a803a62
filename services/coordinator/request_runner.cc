#include "services/coordinator/request_runner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvstore/chunk_codec.h"
#include "common/speculative/draft_verify.h"
#include "services/coordinator/request_validation.h"

namespace vc::coordinator {

namespace pb = ::vericache::v1;

std::optional<int64_t> VariantSizes::Get(const std::string& variant_key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(variant_key);
  if (it == sizes_.end()) return std::nullopt;
  return it->second;
}

void VariantSizes::Note(const std::string& variant_key, int64_t bytes) {
  if (bytes <= 0 || max_entries_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!sizes_.insert_or_assign(variant_key, bytes).second) return;  // known: updated in place
  order_.push_back(variant_key);
  while (order_.size() > max_entries_) {
    sizes_.erase(order_.front());
    order_.pop_front();
  }
}

namespace {

// The code width a quantiser (or a composite's quantiser, after its '+')
// uses when no bits are named: its registered --bits default; 0 when the
// method quantises nothing or is unknown.
int DefaultBits(const std::string& name) {
  const size_t plus = name.find('+');
  const std::string quantiser = plus == std::string::npos ? name : name.substr(plus + 1);
  for (const CompressorInfo& info : ListCompressors()) {
    if (info.name != quantiser || !info.takes_bits) continue;
    for (const CompressorParamInfo& p : info.params) {
      int bits = 0;
      if (p.name == "--bits" && absl::SimpleAtoi(p.default_value, &bits)) return bits;
    }
  }
  return 0;
}

}  // namespace

int64_t EstimateVariantBytes(int64_t full_bytes, const CompressorOptions& variant) {
  if (full_bytes <= 0) return 0;
  double fraction = variant.ratio > 0 ? std::min(variant.ratio, 1.0) : 1.0;
  const int bits = variant.bits > 0 ? variant.bits : DefaultBits(variant.name);
  if (bits > 0) fraction *= std::min(bits / 16.0, 1.0);
  return static_cast<int64_t>(std::ceil(static_cast<double>(full_bytes) * fraction));
}

WorkerCallOptions RunnerContext::CallOptions(const Request& r) const {
  WorkerCallOptions o;
  o.deadline = std::min(r.deadline, Clock::now() + options.rpc_timeout);
  return o;
}

Task<absl::Status> AwaitStartedCall(const RunnerContext& ctx,
                                    std::function<void(CallDone done)> start) {
  absl::Status status;
  co_await Suspend(ctx.executor, [&](auto resume) {
    start([&status, resume](absl::Status s) {
      status = std::move(s);  // read once resumed: the executor's queue orders it
      resume();
    });
  });
  co_return status;
}

Task<bool> AwaitSignal(const RunnerContext& ctx,
                       const std::function<void(std::function<void()> signal)>& arm,
                       Clock::time_point wake) {
  // The first of the signal and the timer resumes; the other finds `fired`
  // set (and the timer is cancelled once resumed: Suspend resumes only after
  // the lambda has returned, so `timer` is set by then).
  struct Race {
    std::atomic<bool> fired{false};
    std::atomic<bool> signalled{false};
    std::function<void()> resume;
  };
  auto race = std::make_shared<Race>();
  SlotClock::NotifyId timer = 0;
  co_await Suspend(ctx.executor, [&](auto resume) {
    race->resume = resume;
    arm([race] {
      if (!race->fired.exchange(true)) {
        race->signalled = true;
        race->resume();
      }
    });
    timer = ctx.clock->NotifyAt(wake, [race](bool) {
      if (!race->fired.exchange(true)) race->resume();
    });
  });
  ctx.clock->CancelNotify(timer);
  co_return race->signalled.load();
}

Task<bool> AwaitWritable(const RunnerContext& ctx, const Request& r, Sink* writer) {
  if (writer->Writable()) co_return true;
  // Cancelled while its reader is behind: the Cancel abandons a stream it
  // finds waiting, but the queue may have filled after it looked; waiting
  // now would last until the stream's write timeout.
  if (r.cancelled) {
    writer->Abandon();
    co_return false;
  }
  co_return co_await AwaitSignal(
      ctx, [writer](std::function<void()> signal) { writer->WhenWritable(std::move(signal)); },
      r.deadline);
}

Task<absl::Status> ReleaseSession(const RunnerContext& ctx, WorkerPool pool, Worker& w,
                                  uint64_t session) {
  if (!ctx.release) co_return absl::OkStatus();
  co_return co_await AwaitStartedCall(
      ctx, [&](CallDone done) { ctx.release(pool, w, session, std::move(done)); });
}

namespace {

bool Retryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kInternal ||
         s.code() == absl::StatusCode::kOutOfRange || s.code() == absl::StatusCode::kAborted ||
         s.code() == absl::StatusCode::kResourceExhausted;
}

void Inc(metrics::Counter* c, double v = 1) {
  if (c != nullptr) c->Inc(v);
}

void Observe(metrics::Histogram* h, double v) {
  if (h != nullptr) h->Observe(v);
}

// Reports a failed call to `w` (the service probes it); the request goes on
// without waiting for the verdict.
void WorkerFailed(const RunnerContext& ctx, WorkerPool pool, Worker& w, const absl::Status& s) {
  if (ctx.worker_failed) ctx.worker_failed(pool, w, s, [](bool) {});
}

void UpdateGauges(const RunnerContext& ctx) {
  if (ctx.update_gauges) ctx.update_gauges();
}

// After an Open that failed with `s`: an Open that timed out may still have
// opened the session (the worker was paused or slow and the reply came too
// late): release it, or it stays until the worker's idle timeout. The worker
// also drops an Open whose caller's deadline passed before it finished; this
// covers a reply lost after the session was made. An unknown session
// releases as OK.
Task<absl::Status> ReleaseAfterFailedOpen(const RunnerContext& ctx, WorkerPool pool, Worker& w,
                                          uint64_t session, const absl::Status& s) {
  if (s.code() != absl::StatusCode::kDeadlineExceeded) co_return absl::OkStatus();
  co_return co_await ReleaseSession(ctx, pool, w, session);
}

pb::PrefixRef MakePrefixRef(int32_t tokens, const std::vector<std::string>& keys) {
  pb::PrefixRef ref;
  ref.set_prefix_tokens(tokens);
  for (const auto& k : keys) ref.add_chunk_keys(k);
  return ref;
}

// The bytes `req`'s Open makes the drafter fetch over the slow link
// (store -> drafter), as far as they are known before the Open:
//  * none without a whole stored chunk (prefix_tokens 0): nothing is fetched;
//  * full_prefix (full_remote): the full chunks' K/V, prefix_tokens x
//    kv_bytes_per_token (chunk headers and checksums aside, as the verify's
//    reload on the fast link is booked);
//  * the compressed variant: its exact size once a drafter has reported
//    fetching it (ctx.variant_sizes), else EstimateVariantBytes of its spec.
// A drafter that already holds the prefix for another live session of its
// own fetches nothing (its cache); the coordinator does not track that, so
// such an Open is booked as if it fetched: the link is over-booked, never
// oversubscribed.
int64_t DrafterFetchBytes(const RunnerContext& ctx, const Plan& plan,
                          const pb::DrafterOpenRequest& req) {
  if (plan.prefix_tokens <= 0) return 0;
  const int64_t full_bytes = int64_t{plan.prefix_tokens} * ctx.kv_bytes_per_token;
  if (req.full_prefix()) return full_bytes;
  if (ctx.variant_sizes != nullptr) {
    // A drafter's report is believed up to twice the prefix's full K/V (no
    // variant is larger): a wrong or hostile one cannot book the slow link
    // for longer than that.
    if (std::optional<int64_t> known = ctx.variant_sizes->Get(req.variant_key())) {
      return std::min(*known, 2 * full_bytes);
    }
  }
  return EstimateVariantBytes(full_bytes, plan.variant.compressor);
}

// SlotClock::WaitForSlot(slot, offset_seconds, deadline) without holding a
// thread: the runner is suspended until the clock's answer and continues on
// ctx.executor.
Task<bool> AwaitSlot(const RunnerContext& ctx, int64_t slot, double offset_seconds,
                     Clock::time_point deadline) {
  if (ctx.clock->SlotBegun(slot, offset_seconds)) co_return true;
  bool begun = false;
  co_await Suspend(ctx.executor, [&](auto resume) {
    ctx.clock->NotifyAtSlot(slot, offset_seconds, deadline, [&begun, resume](bool answer) {
      begun = answer;  // read once resumed: the executor's queue orders it
      resume();
    });
  });
  co_return begun;
}

// Suspends the runner until `lease` has a message to read (or has ended),
// or until `wake`, whichever comes first.
Task<bool> AwaitLease(const RunnerContext& ctx, LeaseStream& lease, Clock::time_point wake) {
  co_return co_await AwaitSignal(
      ctx, [&lease](std::function<void()> signal) { lease.OnReady(std::move(signal)); }, wake);
}

// Books `bytes` on the slow link's ring and waits for the booking's first
// slot within r's deadline (DeadlineExceeded naming `what` otherwise). The
// id is in *booking_id as soon as it is booked: the caller releases it,
// whether the wait succeeded or not. The slow link's occupancy gauge is
// updated when there was something to book (nothing on an unpaced link).
Task<absl::Status> AwaitSlowLinkSlot(const RunnerContext& ctx, const Request& r, int64_t bytes,
                                     const char* what, std::optional<int64_t>* booking_id) {
  const int64_t id = ctx.clock->NewBookingId();
  VC_CO_ASSIGN_OR_RETURN(Booking booking, ctx.clock->BookTransfer(id, bytes, kSlowLink));
  *booking_id = id;
  const bool begun = co_await AwaitSlot(ctx, booking.first_slot(), 0, r.deadline);
  if (!begun) {
    co_return absl::DeadlineExceededError(
        absl::StrCat("request deadline passed waiting for the slow link (", what, ")"));
  }
  if (booking.transfer_seconds > 0) UpdateGauges(ctx);
  co_return absl::OkStatus();
}

// The drafter's Open of `req`: the prefix it fetches crosses the slow link
// (DESIGN.md section 3), so its bytes are booked on that ring first and the
// Open is sent at the booked slot, within r's deadline; a burst of new
// requests then queues with the rounds' refreshes instead of oversubscribing
// the paced link, and link_occupancy_ratio{link="slow"} shows it. The
// booking is released when the Open returns (a started fetch keeps its link
// time, RingScheduler::Release) or when the wait ends the request
// (DeadlineExceeded, no Open sent: the time is given back). An unpaced link
// books nothing and the Open goes at once; nothing fetched, nothing booked.
// `*sent` says whether the Open was sent: if not, the error is the
// booking's or the wait's, not the drafter's.
Task<absl::Status> BookedDrafterOpen(const RunnerContext& ctx, const Plan& plan, const Request& r,
                                     const pb::DrafterOpenRequest& req,
                                     pb::DrafterOpenResponse* resp, bool* sent) {
  Worker& d = *plan.drafter;
  *sent = false;
  const int64_t bytes = DrafterFetchBytes(ctx, plan, req);
  std::optional<int64_t> booking_id;
  absl::Cleanup release = [&] {
    if (booking_id) (void)ctx.clock->Release(*booking_id);
  };
  if (bytes > 0) {
    VC_CO_RETURN_IF_ERROR(co_await AwaitSlowLinkSlot(ctx, r, bytes, "drafter Open", &booking_id));
  }
  *sent = true;
  absl::Status s =
      co_await AwaitCall(ctx, *d.drafter, &DrafterClient::StartOpen, ctx.CallOptions(r), req, resp);
  if (!s.ok()) co_return s;
  // A fetched variant's exact size, for the next Open of it.
  if (!req.full_prefix() && resp->prefix_bytes() > 0 && ctx.variant_sizes != nullptr) {
    ctx.variant_sizes->Note(req.variant_key(), resp->prefix_bytes());
  }
  co_return absl::OkStatus();
}

// The most bytes a verify pass over `rows` input tokens can send back as
// refresh (every row kept: the chunk codec's header, rows, checksum).
int64_t MostRefreshBytes(const RunnerContext& ctx, int64_t rows) {
  return static_cast<int64_t>(kvstore::kChunkHeaderBytes + kvstore::kChunkChecksumBytes) +
         rows * ctx.kv_bytes_per_token;
}

// A new drafter epoch (DrafterOpenRequest.epoch): unique in this process,
// so a session id reopened on a drafter after a retry never accepts the
// earlier attempt's rounds.
uint64_t NextDrafterEpoch() {
  static std::atomic<uint64_t> epochs{0};
  return epochs.fetch_add(1) + 1;
}

// Adds one round's times to `times` (pb::RoundTimes: the control overhead is
// the wall time no worker reported as compute or transfer).
void NoteRoundTimes(double wall_seconds, double draft_seconds, double slot_wait_seconds,
                    const pb::VerifyResponse& verify, const pb::CommitResponse& commit,
                    pb::RoundTimes* times) {
  times->set_rounds(times->rounds() + 1);
  times->set_wall_seconds(times->wall_seconds() + wall_seconds);
  times->set_draft_seconds(times->draft_seconds() + draft_seconds);
  times->set_verify_seconds(times->verify_seconds() + verify.forward_seconds());
  times->set_transfer_seconds(times->transfer_seconds() + verify.load_wait_seconds());
  times->set_commit_seconds(times->commit_seconds() + commit.commit_seconds());
  const double overhead = wall_seconds - draft_seconds - verify.forward_seconds() -
                          verify.load_wait_seconds() - commit.commit_seconds();
  times->add_overhead_ms(static_cast<float>(overhead * 1000.0));
  times->set_slot_wait_seconds(times->slot_wait_seconds() + slot_wait_seconds);
  times->add_rpc_overhead_ms(static_cast<float>((overhead - slot_wait_seconds) * 1000.0));
}

void NoteDrafterCommit(const pb::CommitResponse& resp, pb::GenerateTotals* totals) {
  totals->set_online_folds(resp.online_folds());
  totals->set_drafter_kv_peak_bytes(std::max(totals->drafter_kv_peak_bytes(), resp.kv_bytes()));
}

// A verified round's counts and metrics, the same for a peer and a relayed
// round; returns the stats streamed with its tokens.
pb::RoundStats NoteVerifiedRound(const RunnerContext& ctx, int32_t drafted,
                                 const pb::VerifyResponse& verify, double verify_ms, Plan& plan) {
  Inc(ctx.metrics.rounds);
  UpdateGauges(ctx);
  Observe(ctx.metrics.accepted_per_round, verify.accepted());
  Inc(ctx.metrics.wasted, static_cast<double>(drafted) - verify.accepted());
  plan.totals.set_verify_rounds(plan.totals.verify_rounds() + 1);
  plan.totals.set_drafted_tokens(plan.totals.drafted_tokens() + drafted);
  plan.totals.set_accepted_drafts(plan.totals.accepted_drafts() + verify.accepted());
  pb::RoundStats round;
  round.set_drafted(drafted);
  round.set_accepted(verify.accepted());
  round.set_verify_ms(verify_ms);
  round.set_batch_requests(verify.batch_requests());
  round.set_prefix_shared(verify.prefix_shared());
  return round;
}

// x adapted to a verified round's acceptance (`take` drafts asked for).
void AdaptDraftLength(const RunnerContext& ctx, int take, int accepted, Plan& plan) {
  if (plan.adaptive && take > 0) {
    plan.x = NextDraftLength(take, accepted, &plan.accept_ewma, 1, ctx.options.max_draft_len);
  }
}

// A round the drafter committed: its totals and times, x adapted to its
// acceptance (unless `x_adapted`: a lease adapts it once the round is
// verified), and the fallback rule's record of it. False when acceptance
// has collapsed (decoding on the verifier alone is faster).
bool NoteCommittedRound(const RunnerContext& ctx, int take, double wall_seconds,
                        double draft_seconds, double slot_wait_seconds,
                        const pb::VerifyResponse& verify, const pb::CommitResponse& commit,
                        Plan& plan, bool x_adapted = false) {
  plan.totals.set_continuation_hits(plan.totals.continuation_hits() + commit.surviving_drafts());
  NoteDrafterCommit(commit, &plan.totals);
  NoteRoundTimes(wall_seconds, draft_seconds, slot_wait_seconds, verify, commit,
                 plan.totals.mutable_round_times());
  if (!x_adapted) AdaptDraftLength(ctx, take, verify.accepted(), plan);
  if (take < 2) return true;
  plan.fallback.RecordRound(verify.accepted());
  return !plan.fallback.ShouldFallBack();
}

// `variant`: the compressor the request's variant was ingested with
// (ParseVariantList's options: name, ratio, bits; default method parameters).
void SetOnlineUpdate(const pb::GenerateRequest& gen, int32_t prefix_tokens,
                     const CompressorOptions& variant, pb::DrafterOpenRequest* req) {
  // A prompt without a whole stored chunk has no compressed view to fold
  // into: its drafter keeps every token exact, as without online update.
  if (!gen.online_update() || prefix_tokens == 0) return;
  req->set_online_update(true);
  req->set_compressor(variant.name);
  req->set_ratio(variant.ratio);
  req->set_bits(variant.bits);
}

// Opens the plan's session on its verifier (`resident`: the prefix stays
// loaded for the whole session, full_local).
Task<absl::Status> OpenVerifier(const RunnerContext& ctx, Plan& plan, const Request& r,
                                bool resident) {
  Worker& v = *plan.verifier;
  pb::VerifierOpenRequest req;
  req.set_session_id(plan.session);
  for (int32_t t : plan.prompt) req.add_prompt(t);
  *req.mutable_prefix() = MakePrefixRef(plan.prefix_tokens, plan.chunk_keys);
  *req.mutable_sampling() = plan.req.sampling();
  if (resident) req.set_resident(true);
  req.set_tenant_salt(plan.req.tenant_salt());
  pb::VerifierOpenResponse resp;
  const absl::Status s = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartOpen,
                                            ctx.CallOptions(r), req, &resp);
  if (!s.ok()) {
    (void)co_await ReleaseAfterFailedOpen(ctx, WorkerPool::kVerifier, v, plan.session, s);
    co_return WithCallName(s, absl::StrCat("verifier ", v.address, " Open"));
  }
  plan.verifier_open = true;
  ++v.active;
  co_return absl::OkStatus();
}

// Appends verified tokens (up to EOS / max_new_tokens) and streams them.
// Returns false when the request is complete.
bool Emit(const RunnerContext& ctx, Plan& plan, Request& r, const std::vector<int32_t>& tokens,
          const pb::RoundStats& round, Sink* writer) {
  pb::GenerateResponse msg;
  msg.set_request_id(r.id);
  *msg.mutable_round() = round;
  bool done = false;
  for (int32_t t : tokens) {
    plan.output.push_back(t);
    msg.add_tokens(t);
    const auto& stop_ids = plan.req.stop_token_ids();
    if ((std::find(ctx.eos_ids.begin(), ctx.eos_ids.end(), t) != ctx.eos_ids.end() &&
         !plan.req.ignore_eos()) ||
        std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) {
      plan.stopped_at_eos = true;
      done = true;
      break;
    }
    if (static_cast<int64_t>(plan.output.size()) >= plan.req.max_new_tokens()) {
      done = true;
      break;
    }
  }
  r.generated = static_cast<int64_t>(plan.output.size());
  if (!plan.first_token_sent && msg.tokens_size() > 0) {
    plan.first_token_sent = true;
    plan.first_token_time = Clock::now();
    const double ttft = std::chrono::duration<double>(plan.first_token_time - r.start).count();
    plan.totals.set_ttft_ms(ttft * 1000);
    if (ctx.metrics.ttft != nullptr) ctx.metrics.ttft->Labels({ModeName(r.mode)}).Observe(ttft);
  }
  if (!writer->Write(msg)) r.cancelled = true;  // the receiver is gone
  return !done;
}

// A round's verify as booked on the rings (SlotClock): the reload's first
// slot (and the offset into it of a packed reload), the verify's slot, and
// the booking the round releases once its verify is over: its own, or the
// one it joined (SlotClock::JoinShared keeps that one's memory booked until
// then); none without a stored prefix.
struct VerifyBooking {
  int64_t first_slot = 0;
  double issue_offset = 0;
  int64_t verify_slot = 0;
  std::optional<int64_t> held;
  // TryBookVerify only: the rings were full and nothing is booked; try
  // again once the next slot has begun.
  bool queued = false;
};

// One try at booking the verify of plan's next round, `target_offset` slots
// ahead, as `booking_id`: the prefix's reload on the fast link and the
// verifier's memory, or a join of a booking of the same prefix on the same
// verifier (PrefixPolicy's rule, the simulator's too). With the rings full,
// a `queued` booking (nothing booked).
absl::StatusOr<VerifyBooking> TryBookVerify(const RunnerContext& ctx, const Plan& plan,
                                            int64_t prefix_bytes, int target_offset,
                                            int64_t booking_id) {
  const Worker& v = *plan.verifier;
  VerifyBooking b;
  b.first_slot = ctx.clock->now();
  b.verify_slot = b.first_slot;
  if (prefix_bytes <= 0) return b;
  const int64_t target = ctx.clock->now() + target_offset;
  SlotClock::Shared shared;
  const bool can_join =
      !ctx.clock->lock_step() &&
      ctx.clock->FindShared(plan.prefix_key, v.index, std::numeric_limits<int64_t>::max(), &shared);
  auto join = [&] {
    b.first_slot = std::max(shared.first_slot, ctx.clock->now());
    b.verify_slot = shared.verify_slot;
    if (ctx.clock->JoinShared(shared.booking_id)) b.held = shared.booking_id;
  };
  // Join a booking of the prefix on this verifier whose verify is still
  // ahead when it is no later than this round wants, or when a booking of
  // its own would verify no earlier or has to wait.
  if (can_join && PrefixPolicy::JoinsAtOnce(shared, target)) {
    join();
    return b;
  }
  AdmitRequest ar;
  ar.id = booking_id;
  ar.full_kv_bytes = prefix_bytes;
  ar.target_offset = target_offset;
  ar.min_offset = 1;
  ar.link = kFastLink;
  ar.gpu = v.index;
  VC_ASSIGN_OR_RETURN(Admission adm, ctx.clock->Admit(ar));
  if (can_join && PrefixPolicy::JoinsInsteadOf(shared, adm)) {
    if (!adm.queued) VC_RETURN_IF_ERROR(ctx.clock->Release(booking_id));
    join();
    return b;
  }
  if (!adm.queued) {
    b.first_slot = adm.booking.first_slot();
    b.issue_offset = adm.booking.issue_offset_seconds;
    b.verify_slot = adm.booking.verify_slot;
    b.held = booking_id;
    ctx.clock->NoteShared(plan.prefix_key, v.index, adm.booking);
    return b;
  }
  Inc(ctx.metrics.scheduler_queued);
  b.queued = true;
  return b;
}

// TryBookVerify until it books, waiting (suspended) for the next slot
// while the rings are full, within r's deadline; that wait is added to
// *slot_wait_seconds.
Task<absl::StatusOr<VerifyBooking>> BookVerify(const RunnerContext& ctx, const Plan& plan,
                                               const Request& r, int64_t prefix_bytes,
                                               int target_offset, double* slot_wait_seconds) {
  // A new id every round: a booking this request's last round left to
  // rounds that joined it may outlive that round.
  const int64_t booking_id = ctx.clock->NewBookingId();
  while (true) {
    VC_CO_ASSIGN_OR_RETURN(VerifyBooking b,
                           TryBookVerify(ctx, plan, prefix_bytes, target_offset, booking_id));
    if (!b.queued) co_return b;
    const auto t = Clock::now();
    const bool begun = co_await AwaitSlot(ctx, ctx.clock->now() + 1, 0, r.deadline);
    *slot_wait_seconds += std::chrono::duration<double>(Clock::now() - t).count();
    if (!begun) {
      co_return absl::DeadlineExceededError("request deadline passed waiting for a verify slot");
    }
  }
}

// How a peer round (or a lease's) left the request.
enum class PeerRoundOutcome {
  kContinue,        // more rounds with the drafter
  kComplete,        // EOS or max_new_tokens: the request is done
  kDrafterDropped,  // the drafter failed (reported): decode on the verifier
  kCollapsed,       // acceptance collapsed: decode on the verifier
};

// The coordinator's view of a peer round's time: its wall time, the part of
// it spent waiting for the scheduler, and the Round's (or the lease
// progress's) own latency as the verify time streamed with its tokens.
struct PeerRoundTimes {
  double wall_seconds = 0;
  double slot_wait_seconds = 0;
  double verify_ms = 0;
};

// Applies a peer round's answer (RoundResponse, the same from a Round and a
// lease): its tokens are streamed, its counts and times noted, x adapted,
// the fallback rule fed. A drafter failure the verifier reported is the
// drafter's: it is marked and kDrafterDropped returned (after streaming the
// verified tokens of a round whose Commit failed); a failure of the
// request's own kind (not retryable) is returned.
// Streams a peer round's verified tokens (and notes the round); false when
// they complete the request.
bool EmitVerifiedRound(const RunnerContext& ctx, Plan& plan, Request& r, Sink* writer,
                       const pb::RoundResponse& rresp, double verify_ms) {
  const pb::VerifyResponse& vresp = rresp.verify();
  std::vector<int32_t> tokens(vresp.tokens().begin(), vresp.tokens().end());
  const pb::RoundStats round = NoteVerifiedRound(ctx, rresp.drafted(), vresp, verify_ms, plan);
  return Emit(ctx, plan, r, tokens, round, writer);
}

// `emitted`: the round's tokens were streamed already (a lease's verified
// progress, EmitVerifiedRound).
absl::StatusOr<PeerRoundOutcome> ApplyPeerRound(const RunnerContext& ctx, Plan& plan, Request& r,
                                                Sink* writer, const pb::RoundResponse& rresp,
                                                int take, const PeerRoundTimes& times,
                                                bool emitted = false) {
  Worker& v = *plan.verifier;
  Worker& d = *plan.drafter;
  auto drop_drafter = [&](const absl::Status& st) -> absl::StatusOr<PeerRoundOutcome> {
    if (!Retryable(st)) return st;
    WorkerFailed(ctx, WorkerPool::kDrafter, d, st);
    return PeerRoundOutcome::kDrafterDropped;
  };
  absl::Status drafter_status =
      rresp.drafter_error_code() == 0
          ? absl::OkStatus()
          : absl::Status(static_cast<absl::StatusCode>(rresp.drafter_error_code()),
                         absl::StrCat("drafter ", d.address, " ", rresp.drafter_error(),
                                      " (from verifier ", v.address, ")"));
  if (!rresp.has_verify()) {
    // Nothing was verified: the drafter failed before (or answered nothing
    // the verifier could judge).
    return drop_drafter(drafter_status.ok()
                            ? absl::InternalError(absl::StrCat("verifier ", v.address,
                                                               " answered a round with no verify"))
                            : drafter_status);
  }
  if (ctx.calibrate && rresp.draft_step_seconds() > 0) ctx.calibrate(rresp.draft_step_seconds());
  const pb::VerifyResponse& vresp = rresp.verify();
  plan.totals.set_refresh_bytes(plan.totals.refresh_bytes() + rresp.refresh_bytes());
  if (!emitted && !EmitVerifiedRound(ctx, plan, r, writer, rresp, times.verify_ms)) {
    return PeerRoundOutcome::kComplete;
  }
  // The commit failed after a verify whose tokens stand (streamed).
  if (!drafter_status.ok()) return drop_drafter(drafter_status);
  plan.drafts_ready = rresp.commit().surviving_drafts();
  const bool keep = NoteCommittedRound(ctx, take, times.wall_seconds, rresp.draft_seconds(),
                                       times.slot_wait_seconds, vresp, rresp.commit(), plan,
                                       /*x_adapted=*/emitted);
  return keep ? PeerRoundOutcome::kContinue : PeerRoundOutcome::kCollapsed;
}

// One round of a lease, from its booking to its progress.
struct LeaseRound {
  uint64_t round = 0;
  int take = 0;
  int64_t pending = 1;  // rows the verifier holds unverified before its pass
  VerifyBooking booking;
  std::optional<int64_t> refresh_booking;  // the most its rows can be, slow link
  std::chrono::microseconds refresh_delay{0};
  Clock::time_point booked;  // when its booking began
  Clock::time_point sent;    // when its grant was sent
  bool emitted = false;      // its verified tokens were streamed
};

// vericache rounds on a lease (worker.proto LeaseGrant): one stream to the
// verifier for the request, each round booked as a Round is and granted at
// its reload's slot, the next one booked and granted while the round before
// still runs, so the verifier starts it as soon as that one has committed:
// no call of the coordinator's between rounds. The runner never blocks on
// the next grant's slot while a round's progress may arrive: it waits for
// whichever comes first. Each progress is applied as a Round's answer
// (ApplyPeerRound). When the fallback is decided the lease is half-closed
// and drained: a round already running completes on the verifier, and its
// verified tokens are streamed before the fallback decodes on the same
// session. kContinue: the lease is over with tokens left (the budget left
// no room for a draft, or the verifier has no leases): the caller goes on
// with single rounds.
Task<absl::StatusOr<PeerRoundOutcome>> RunLease(const RunnerContext& ctx, Plan& plan, Request& r,
                                                Sink* writer, int64_t prefix_bytes,
                                                int64_t* unverified) {
  Worker& v = *plan.verifier;
  Worker& d = *plan.drafter;
  WorkerCallOptions lo;
  lo.deadline =
      r.deadline == Clock::time_point::max() ? Clock::now() + std::chrono::hours(24) : r.deadline;
  lo.parent = r.server_ctx;
  absl::StatusOr<std::unique_ptr<LeaseStream>> opened = v.verifier->OpenLease(lo);
  if (absl::IsUnimplemented(opened.status())) co_return PeerRoundOutcome::kContinue;
  if (!opened.ok()) {
    co_return WithCallName(opened.status(), absl::StrCat("verifier ", v.address, " Lease"));
  }
  LeaseStream& lease = **opened;
  std::deque<LeaseRound> rounds;   // granted, oldest first
  std::optional<LeaseRound> next;  // booked, its grant not sent yet
  auto release = [&](const LeaseRound& lr) {
    if (lr.booking.held) (void)ctx.clock->Release(*lr.booking.held);
    if (lr.refresh_booking) (void)ctx.clock->Release(*lr.refresh_booking);
  };
  // Declared after the stream: runs first, before the stream is cancelled.
  absl::Cleanup release_all = [&] {
    for (const LeaseRound& lr : rounds) release(lr);
    if (next) release(*next);
    UpdateGauges(ctx);
  };
  bool first = true;
  // While the rings are full: when the next round's booking was first tried
  // (its slot wait counts from then), and the slot to try it again at.
  std::optional<Clock::time_point> booking_since;
  std::optional<int64_t> rebook_slot;
  // Books the next round (into `next`) when the budget leaves room for a
  // draft (each round granted adds at least one token). It never waits for
  // full rings (a round's progress may arrive meanwhile): a queued booking
  // sets `rebook_slot`, and the loop below waits for that slot.
  auto book = [&]() -> absl::Status {
    // Rounds whose tokens are not in the output yet.
    const auto unstreamed = std::count_if(rounds.begin(), rounds.end(),
                                          [](const LeaseRound& lr) { return !lr.emitted; });
    const int64_t left = plan.req.max_new_tokens() - static_cast<int64_t>(plan.output.size()) -
                         static_cast<int64_t>(unstreamed);
    const int take = static_cast<int>(std::min<int64_t>(plan.x, left - 1));
    if (take < 1) return absl::OkStatus();
    LeaseRound lr;
    lr.take = take;
    lr.pending = rounds.empty() ? *unverified : 1;
    lr.booked = booking_since.value_or(Clock::now());
    // The first as a Round's: booked for the drafts the drafter did not
    // hold ready after the last commit. A round granted ahead, while one of
    // the lease runs, at the next slot: it cannot start before the round
    // running commits, and its grant should be on the verifier by then, so
    // that it keeps the prefix the running round holds (no reload) and the
    // commit takes its drafts (CommitRequest.next). Its transfer is still
    // never issued before its slot (the grant is sent at it), and the
    // booking is held until its progress arrives.
    const int target_offset = rounds.empty() ? std::max(1, take - plan.drafts_ready) : 1;
    VC_ASSIGN_OR_RETURN(lr.booking, TryBookVerify(ctx, plan, prefix_bytes, target_offset,
                                                  ctx.clock->NewBookingId()));
    if (lr.booking.queued) {
      booking_since = lr.booked;
      rebook_slot = ctx.clock->now() + 1;
      return absl::OkStatus();
    }
    booking_since.reset();
    rebook_slot.reset();
    next = lr;
    return absl::OkStatus();
  };
  // Whether `next`'s reload slot has come (no stored prefix: at once).
  auto due = [&] {
    return prefix_bytes <= 0 ||
           ctx.clock->SlotBegun(next->booking.first_slot, next->booking.issue_offset);
  };
  // Sends `next`'s grant (its slot has come) with its refresh booked.
  auto send = [&]() -> absl::Status {
    LeaseRound& lr = rounds.emplace_back(*next);
    next.reset();
    pb::LeaseGrant g;
    pb::RoundRequest& rreq = *g.mutable_round();
    if (ctx.options.kv_refresh) {
      const int64_t id = ctx.clock->NewBookingId();
      VC_ASSIGN_OR_RETURN(
          Booking booking,
          ctx.clock->BookTransfer(id, MostRefreshBytes(ctx, lr.pending + lr.take), kSlowLink));
      lr.refresh_booking = id;
      if (booking.transfer_seconds > 0) UpdateGauges(ctx);
      lr.refresh_delay = std::chrono::duration_cast<std::chrono::microseconds>(
          ctx.clock->TimeUntilSlot(booking.first_slot()));
      rreq.set_refresh_delay_us(lr.refresh_delay.count());
    }
    rreq.set_session_id(plan.session);
    rreq.set_drafter(d.address);
    rreq.set_epoch(plan.drafter_epoch);
    rreq.set_round(++plan.round_id);
    rreq.set_take(lr.take);
    rreq.set_lookahead(plan.x);
    rreq.set_skip_refresh(!ctx.options.kv_refresh);
    rreq.set_load(prefix_bytes > 0);
    // The verifier keeps its rounds within the request's tokens (a round
    // granted ahead does not know how many the one before adds).
    if (first) {
      g.set_budget(plan.req.max_new_tokens() - static_cast<int64_t>(plan.output.size()));
    }
    g.set_round_timeout_ms(ctx.options.rpc_timeout.count());
    first = false;
    lr.round = rreq.round();
    lr.sent = Clock::now();
    // A stream that has ended takes no grant; Next says how it ended.
    (void)lease.Send(g);
    return absl::OkStatus();
  };
  bool closing = false;  // half-closed: no more grants, drain what runs
  std::optional<PeerRoundOutcome> decided;
  bool answered = false;
  // The verifier's take of a granted round (`granted` drafts asked for), as
  // it clamped it to the budget before that round's tokens, `streamed` of
  // which are in the output already.
  auto verifier_take = [&](int granted, int streamed) {
    const int64_t left =
        plan.req.max_new_tokens() - static_cast<int64_t>(plan.output.size()) + streamed;
    return static_cast<int>(std::min<int64_t>(granted, left - 1));
  };
  // When the last progress arrived (the first round: none).
  Clock::time_point last_arrival = Clock::time_point::min();
  while (true) {
    if (r.gone()) co_return absl::CancelledError("request cancelled");
    if (Clock::now() >= r.deadline) {
      co_return absl::DeadlineExceededError("request deadline passed");
    }
    if (closing && next) {
      // Half-closed: a booked grant is not sent; its booking goes back.
      release(*next);
      next.reset();
    }
    if (closing) rebook_slot.reset();
    // One grant ahead of the round running, counted from its verified
    // progress: the next round is booked (with x adapted to the running
    // round's acceptance) while that round commits, so its grant is on the
    // verifier before the round after it commits, and that commit takes its
    // drafts along (with full rings: tried again once the slot it waits for
    // has begun).
    const auto unverified_rounds = std::count_if(rounds.begin(), rounds.end(),
                                                 [](const LeaseRound& lr) { return !lr.emitted; });
    if (!closing && !next && unverified_rounds < 2 && rounds.size() < 3 &&
        (!rebook_slot || ctx.clock->now() >= *rebook_slot)) {
      VC_CO_RETURN_IF_ERROR(book());
    }
    if (next && due()) {
      VC_CO_RETURN_IF_ERROR(send());
      continue;
    }
    if (rounds.empty()) {
      // Nothing runs, so nothing can arrive: wait for the slot of the grant
      // to send, or for the one to book it again at.
      if (next || rebook_slot) {
        const int64_t slot = next ? next->booking.first_slot : *rebook_slot;
        const double offset = next ? next->booking.issue_offset : 0.0;
        const bool begun = co_await AwaitSlot(ctx, slot, offset, r.deadline);
        if (!begun) co_return absl::DeadlineExceededError("request deadline passed");
        if (next) VC_CO_RETURN_IF_ERROR(send());
        continue;
      }
      co_return decided.value_or(PeerRoundOutcome::kContinue);
    }
    const LeaseRound& front = rounds.front();
    // The verifier ends its peer calls before this (its margin), so a silent
    // drafter is reported as the drafter's, not timed out here.
    const Clock::time_point answer_by =
        std::min(r.deadline, std::max(front.sent, last_arrival) + ctx.options.rpc_timeout +
                                 front.refresh_delay + std::chrono::seconds(2));
    Clock::time_point wake = answer_by;
    if (next) {
      const auto issue = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(next->booking.issue_offset));
      wake = std::min(wake, Clock::now() + ctx.clock->TimeUntilSlot(next->booking.first_slot) +
                                issue + std::chrono::microseconds(50));
    } else if (rebook_slot) {
      wake = std::min(wake, Clock::now() + ctx.clock->TimeUntilSlot(*rebook_slot) +
                                std::chrono::microseconds(50));
    }
    // Suspended (no thread held) until a message can be read or `wake`.
    co_await AwaitLease(ctx, lease, wake);
    pb::LeaseProgress progress;
    Clock::time_point arrived;
    absl::StatusOr<bool> got = lease.Next(Clock::now(), &progress, &arrived);
    if (absl::IsDeadlineExceeded(got.status()) && Clock::now() < answer_by) continue;
    if (!got.ok()) {
      // A verifier without leases: single rounds instead.
      if (absl::IsUnimplemented(got.status()) && !answered) co_return PeerRoundOutcome::kContinue;
      co_return WithCallName(got.status(), absl::StrCat("verifier ", v.address, " Lease"));
    }
    // Ended: after the drafter's failure or the half-close (grants not
    // started are not run; their bookings go with `release_all`).
    if (!*got) co_return decided.value_or(PeerRoundOutcome::kContinue);
    if (progress.round() != front.round) {
      co_return absl::InternalError(absl::StrCat("verifier ", v.address, " answered lease round ",
                                                 progress.round(), ", expected ", front.round));
    }
    if (progress.verified_only()) {
      // The round's tokens, before its commit: streamed now; its progress
      // after the commit follows.
      if (front.emitted || !progress.result().has_verify()) {
        co_return absl::InternalError(absl::StrCat(
            "verifier ", v.address, " sent a bad verified progress of round ", progress.round()));
      }
      rounds.front().emitted = true;
      const double verify_ms =
          std::chrono::duration<double, std::milli>(arrived - std::max(front.sent, last_arrival))
              .count();
      // x adapts now, so the next grant, booked below before this round
      // commits, has it.
      AdaptDraftLength(ctx, verifier_take(front.take, 0), progress.result().verify().accepted(),
                       plan);
      (void)co_await AwaitWritable(ctx, r, writer);
      if (!EmitVerifiedRound(ctx, plan, r, writer, progress.result(), verify_ms)) {
        co_return PeerRoundOutcome::kComplete;
      }
      continue;
    }
    const LeaseRound lr = rounds.front();
    rounds.pop_front();
    answered = true;
    if (lr.booking.held) (void)ctx.clock->Release(*lr.booking.held);
    if (lr.refresh_booking) {
      // As a Round's: the rows keep the link time they took, the rest of
      // the bound is free (a skipped grant sent none).
      (void)ctx.clock->ShrinkTransfer(*lr.refresh_booking, progress.result().refresh_bytes());
      (void)ctx.clock->Release(*lr.refresh_booking);
    }
    UpdateGauges(ctx);
    // The round's time on the critical path: from the round before's answer
    // (or, first, from its booking) to its own; the part of it the verifier
    // waited for this grant is slot waiting.
    const Clock::time_point start = std::max(last_arrival, lr.booked);
    last_arrival = arrived;
    if (progress.skipped()) {
      // The budget left no room for a draft: the rest is single rounds.
      closing = true;
      lease.Close();
      continue;
    }
    PeerRoundTimes times;
    times.wall_seconds = std::chrono::duration<double>(arrived - start).count();
    times.slot_wait_seconds = std::max(0.0, std::chrono::duration<double>(lr.sent - start).count());
    times.verify_ms =
        std::chrono::duration<double, std::milli>(arrived - std::max(lr.sent, start)).count();
    const int take =
        verifier_take(lr.take, lr.emitted ? progress.result().verify().tokens_size() : 0);
    *unverified = 1;
    if (!lr.emitted) (void)co_await AwaitWritable(ctx, r, writer);
    VC_CO_ASSIGN_OR_RETURN(
        const PeerRoundOutcome out,
        ApplyPeerRound(ctx, plan, r, writer, progress.result(), take, times, lr.emitted));
    if (out == PeerRoundOutcome::kComplete) co_return out;
    if (out != PeerRoundOutcome::kContinue && !decided) {
      decided = out;
      closing = true;
      lease.Close();
    }
  }
}

}  // namespace

// ------------------------------------------------------------- vericache

Task<absl::Status> RunVeriCache(const RunnerContext& ctx, Plan& plan, Request& r, Sink* writer) {
  Worker& v = *plan.verifier;
  Worker& d = *plan.drafter;
  const int32_t n = static_cast<int32_t>(plan.prompt.size());
  // Open both sessions; the drafter starts drafting as soon as its
  // compressed prefix has arrived over the slow link.
  VC_CO_RETURN_IF_ERROR(co_await OpenVerifier(ctx, plan, r, /*resident=*/false));
  bool drafter_ok = true;
  {
    pb::DrafterOpenRequest req;
    req.set_session_id(plan.session);
    for (int32_t t : plan.prompt) req.add_prompt(t);
    *req.mutable_prefix() = MakePrefixRef(plan.prefix_tokens, plan.chunk_keys);
    *req.mutable_sampling() = plan.req.sampling();
    req.set_variant_key(plan.variant_key);
    req.set_tenant_salt(plan.req.tenant_salt());
    SetOnlineUpdate(plan.req, plan.prefix_tokens, plan.variant.compressor, &req);
    req.set_lookahead(plan.x);
    req.set_end_position(n + static_cast<int32_t>(plan.req.max_new_tokens()) -
                         static_cast<int32_t>(plan.resumed));
    plan.drafter_epoch = NextDrafterEpoch();
    plan.round_id = 0;
    plan.drafts_ready = 0;
    req.set_epoch(plan.drafter_epoch);
    pb::DrafterOpenResponse resp;
    bool sent = false;
    absl::Status s = co_await BookedDrafterOpen(ctx, plan, r, req, &resp, &sent);
    if (!sent) co_return s;  // the request's deadline passed waiting for the link
    if (!s.ok()) {
      (void)co_await ReleaseAfterFailedOpen(ctx, WorkerPool::kDrafter, d, plan.session, s);
      absl::Status st = WithCallName(s, absl::StrCat("drafter ", d.address, " Open"));
      if (!Retryable(st)) co_return st;
      WorkerFailed(ctx, WorkerPool::kDrafter, d, st);
      drafter_ok = false;  // fall back to full-KV decoding on the verifier
    } else {
      plan.drafter_open = true;
      ++d.active;
      plan.totals.set_compression_ratio(resp.achieved_ratio());
      plan.totals.set_compressor(resp.compressor());
      plan.totals.set_draft_model(ctx.draft_model);
    }
  }
  const int64_t prefix_bytes = int64_t{plan.prefix_tokens} * ctx.kv_bytes_per_token;
  // Tokens the verifier session holds unverified before the next pass: the
  // prompt after the stored prefix, then the last round's correction.
  int64_t unverified = n - plan.prefix_tokens;
  // A drafter call failed with `st`: a failure of the request's own (not
  // retryable) ends it; otherwise the drafter is reported and the request
  // falls back to the verifier alone.
  auto drop_drafter = [&](const absl::Status& st) -> absl::Status {
    if (!Retryable(st)) return st;
    WorkerFailed(ctx, WorkerPool::kDrafter, d, st);
    drafter_ok = false;
    return absl::OkStatus();
  };
  // Leases: the rounds on one stream, the verifier running each as soon as
  // the one before has committed; what is left after the lease (the last
  // token, without drafts; a verifier without leases) runs below.
  if (drafter_ok && ctx.options.peer_rounds && ctx.options.leases) {
    VC_CO_ASSIGN_OR_RETURN(const PeerRoundOutcome outcome,
                           co_await RunLease(ctx, plan, r, writer, prefix_bytes, &unverified));
    if (outcome == PeerRoundOutcome::kComplete) co_return absl::OkStatus();
    drafter_ok = outcome == PeerRoundOutcome::kContinue;
  }
  while (drafter_ok) {
    if (r.gone()) co_return absl::CancelledError("request cancelled");
    if (Clock::now() >= r.deadline)
      co_return absl::DeadlineExceededError("request deadline passed");
    const int64_t remaining = plan.req.max_new_tokens() - static_cast<int64_t>(plan.output.size());
    const int take = static_cast<int>(std::min<int64_t>(plan.x, remaining - 1));
    const auto round_start = Clock::now();
    double round_draft_seconds = 0;
    // Time this round spent waiting for the scheduler (a queued booking,
    // the reload's and the verify's slots; relayed: the refresh's slot).
    double slot_wait_seconds = 0;
    // The verify's slot: when the drafts should be ready, x draft steps
    // ahead (a slot is a draft step when calibrated). With peer rounds the
    // drafter's drafts that survived the last commit are known ready
    // (CommitResponse.surviving_drafts), so only the rest are waited for.
    const int target_offset =
        std::max(1, ctx.options.peer_rounds ? take - plan.drafts_ready : take);
    VC_CO_ASSIGN_OR_RETURN(
        const VerifyBooking verify,
        co_await BookVerify(ctx, plan, r, prefix_bytes, target_offset, &slot_wait_seconds));
    // Peer rounds: the Round, sent at the reload's slot, starts the reload
    // itself (RoundRequest.load) and the verify follows the drafts and the
    // load on the verifier: no Load call, no wait here for the verify's
    // slot. (A Round sent at once, the verifier waiting for the slot,
    // measured no faster, and a Round in flight through the slot wait is
    // exposed to a pause of this process: its deadline expires under it.
    // So the wait stays here: docs/results.md.)
    const bool peer_round = ctx.options.peer_rounds && take > 0;
    absl::Status round_status = absl::OkStatus();
    if (prefix_bytes > 0) {
      // The reload starts at its slot (just in time within it when packed).
      auto t = Clock::now();
      bool begun = co_await AwaitSlot(ctx, verify.first_slot, verify.issue_offset, r.deadline);
      slot_wait_seconds += std::chrono::duration<double>(Clock::now() - t).count();
      if (!begun) {
        round_status = absl::DeadlineExceededError("request deadline passed");
      } else if (!peer_round) {
        pb::LoadRequest req;
        req.set_session_id(plan.session);
        pb::LoadResponse resp;
        const absl::Status s = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartLoad,
                                                  ctx.CallOptions(r), req, &resp);
        if (!s.ok()) {
          round_status = WithCallName(s, absl::StrCat("verifier ", v.address, " Load"));
        } else {
          t = Clock::now();
          begun = co_await AwaitSlot(ctx, verify.verify_slot, 0, r.deadline);
          slot_wait_seconds += std::chrono::duration<double>(Clock::now() - t).count();
          if (!begun) round_status = absl::DeadlineExceededError("request deadline passed");
        }
      }
    }
    if (!round_status.ok()) {
      if (verify.held) (void)ctx.clock->Release(*verify.held);
      co_return round_status;
    }
    if (peer_round) {
      // The whole round worker to worker: the verifier takes the drafts,
      // verifies and commits to the drafter, whose refresh rows cross the
      // slow link from the verifier's peer data plane at their booked slot.
      pb::RoundRequest rreq;
      rreq.set_session_id(plan.session);
      rreq.set_drafter(d.address);
      rreq.set_epoch(plan.drafter_epoch);
      rreq.set_round(++plan.round_id);
      rreq.set_take(take);
      rreq.set_lookahead(plan.x);
      rreq.set_skip_refresh(!ctx.options.kv_refresh);
      rreq.set_load(prefix_bytes > 0);
      std::optional<int64_t> refresh_booking;
      absl::Cleanup release_refresh = [&] {
        if (refresh_booking) (void)ctx.clock->Release(*refresh_booking);
      };
      if (ctx.options.kv_refresh) {
        // The rows' size is known only on the verifier, after the verify:
        // book the most they can be (every row of the pass kept), so the
        // slow link is never oversubscribed; the verifier offers them no
        // earlier than the booked slot.
        const int64_t id = ctx.clock->NewBookingId();
        VC_CO_ASSIGN_OR_RETURN(
            Booking booking,
            ctx.clock->BookTransfer(id, MostRefreshBytes(ctx, unverified + take), kSlowLink));
        refresh_booking = id;
        if (booking.transfer_seconds > 0) UpdateGauges(ctx);
        rreq.set_refresh_delay_us(std::chrono::duration_cast<std::chrono::microseconds>(
                                      ctx.clock->TimeUntilSlot(booking.first_slot()))
                                      .count());
      }
      pb::RoundResponse rresp;
      const auto t0 = Clock::now();
      // The Round includes the refresh's wait for its slot.
      WorkerCallOptions round_call = ctx.CallOptions(r);
      round_call.deadline = std::min(
          r.deadline, round_call.deadline + std::chrono::microseconds(rreq.refresh_delay_us()));
      const absl::Status rs = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartRound,
                                                 round_call, rreq, &rresp);
      if (verify.held) (void)ctx.clock->Release(*verify.held);
      if (refresh_booking && rs.ok()) {
        // Now that their size is known (0: none were sent), the rows keep
        // only their own link time; the rest of the upper bound, where still
        // ahead, is free for the next transfers. (More than booked cannot
        // be: the bound holds every row of the pass.) A failed Round keeps
        // the bound: its rows may have crossed.
        (void)ctx.clock->ShrinkTransfer(*refresh_booking, rresp.refresh_bytes());
        UpdateGauges(ctx);
      }
      if (!rs.ok()) co_return WithCallName(rs, absl::StrCat("verifier ", v.address, " Round"));
      PeerRoundTimes times;
      times.wall_seconds = std::chrono::duration<double>(Clock::now() - round_start).count();
      times.slot_wait_seconds = slot_wait_seconds;
      times.verify_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      (void)co_await AwaitWritable(ctx, r, writer);
      VC_CO_ASSIGN_OR_RETURN(const PeerRoundOutcome outcome,
                             ApplyPeerRound(ctx, plan, r, writer, rresp, take, times));
      unverified = 1;
      if (outcome == PeerRoundOutcome::kComplete) co_return absl::OkStatus();
      drafter_ok = outcome == PeerRoundOutcome::kContinue;
      continue;
    }
    // Take the drafts (they have been drafting since the last commit).
    std::vector<int32_t> drafts;
    google::protobuf::RepeatedPtrField<pb::DraftDistribution> draft_probs;  // rejection sampling
    if (take > 0) {
      pb::DraftRequest req;
      req.set_session_id(plan.session);
      req.set_max_tokens(take);
      req.set_min_tokens(take);
      req.set_lookahead(plan.x);
      pb::DraftResponse resp;
      const absl::Status s = co_await AwaitCall(ctx, *d.drafter, &DrafterClient::StartDraft,
                                                ctx.CallOptions(r), req, &resp);
      if (!s.ok()) {
        absl::Status st = WithCallName(s, absl::StrCat("drafter ", d.address, " Draft"));
        if (verify.held) (void)ctx.clock->Release(*verify.held);
        VC_CO_RETURN_IF_ERROR(drop_drafter(st));
        break;
      }
      drafts.assign(resp.drafts().begin(), resp.drafts().end());
      draft_probs.Swap(resp.mutable_draft_probs());
      if (ctx.calibrate) ctx.calibrate(resp.step_seconds());
      round_draft_seconds = resp.draft_seconds();
    }
    pb::VerifyRequest vreq;
    vreq.set_session_id(plan.session);
    for (int32_t t : drafts) vreq.add_drafts(t);
    vreq.mutable_draft_probs()->Swap(&draft_probs);
    vreq.set_skip_refresh(!ctx.options.kv_refresh);
    pb::VerifyResponse vresp;
    const auto t0 = Clock::now();
    const absl::Status vs = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartVerify,
                                               ctx.CallOptions(r), vreq, &vresp);
    if (verify.held) (void)ctx.clock->Release(*verify.held);
    if (!vs.ok()) {
      // Without the verifier nothing can be verified: fail cleanly (every
      // token streamed so far was verified).
      co_return WithCallName(vs, absl::StrCat("verifier ", v.address, " Verify"));
    }
    std::vector<int32_t> tokens(vresp.tokens().begin(), vresp.tokens().end());
    const pb::RoundStats round = NoteVerifiedRound(
        ctx, static_cast<int32_t>(drafts.size()), vresp,
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), plan);
    (void)co_await AwaitWritable(ctx, r, writer);
    if (!Emit(ctx, plan, r, tokens, round, writer)) co_return absl::OkStatus();
    // Tell the drafter: its confirmed drafts survive, the rest roll back,
    // and the exact K/V of the verified tokens replaces its own.
    {
      pb::CommitRequest req;
      req.set_session_id(plan.session);
      for (int32_t t : tokens) req.add_tokens(t);
      std::optional<int64_t> refresh_booking;
      // Released when the Commit is answered or the request ends first:
      // once sent, the rows keep their link time booked (RingScheduler::
      // Release), so the next refreshes queue behind them; never sent, the
      // time is given back.
      absl::Cleanup release_refresh = [&] {
        if (refresh_booking) (void)ctx.clock->Release(*refresh_booking);
      };
      if (ctx.options.kv_refresh) {
        *req.mutable_refresh() = vresp.refresh();
        const auto refresh_bytes = static_cast<int64_t>(req.refresh().chunk().size());
        // The rows cross the slow link (DESIGN.md section 3): book their
        // transfer time on its ring and send them at the booked slot, so
        // many requests' refreshes never oversubscribe a paced link. An
        // unpaced link books nothing and starts now: no wait.
        const auto t = Clock::now();
        VC_CO_RETURN_IF_ERROR(
            co_await AwaitSlowLinkSlot(ctx, r, refresh_bytes, "KV refresh", &refresh_booking));
        slot_wait_seconds += std::chrono::duration<double>(Clock::now() - t).count();
        plan.totals.set_refresh_bytes(plan.totals.refresh_bytes() + refresh_bytes);
      }
      pb::CommitResponse resp;
      const absl::Status s = co_await AwaitCall(ctx, *d.drafter, &DrafterClient::StartCommit,
                                                ctx.CallOptions(r), req, &resp);
      if (!s.ok()) {
        absl::Status st = WithCallName(s, absl::StrCat("drafter ", d.address, " Commit"));
        VC_CO_RETURN_IF_ERROR(drop_drafter(st));
        break;
      }
      drafter_ok = NoteCommittedRound(
          ctx, take, std::chrono::duration<double>(Clock::now() - round_start).count(),
          round_draft_seconds, slot_wait_seconds, vresp, resp, plan);
    }
  }
  // Fallback: plain full-KV decoding on the verifier.
  plan.totals.set_fallbacks(plan.totals.fallbacks() + 1);
  Inc(ctx.metrics.fallbacks);
  if (plan.drafter_open) {
    (void)co_await ReleaseSession(ctx, WorkerPool::kDrafter, d, plan.session);
    plan.drafter_open = false;
    --d.active;
  }
  co_return co_await RunFullLocal(ctx, plan, r, writer, true);
}

// ------------------------------------------------------------ full_local

Task<absl::Status> RunFullLocal(const RunnerContext& ctx, Plan& plan, Request& r, Sink* writer,
                                bool already_open) {
  Worker& v = *plan.verifier;
  // The prefix stays loaded for the whole session: keep that memory out of
  // what the scheduler books reloads into, until the session ends.
  const int64_t resident_bytes = int64_t{plan.prefix_tokens} * ctx.kv_bytes_per_token;
  ctx.clock->HoldResident(plan.prefix_key, v.index, resident_bytes);
  absl::Cleanup release_resident = [&] {
    ctx.clock->ReleaseResident(plan.prefix_key, v.index);
    UpdateGauges(ctx);
  };
  UpdateGauges(ctx);
  if (!already_open) {
    VC_CO_RETURN_IF_ERROR(co_await OpenVerifier(ctx, plan, r, /*resident=*/true));
  } else {
    pb::LoadRequest req;
    req.set_session_id(plan.session);
    req.set_resident(true);
    pb::LoadResponse resp;
    const absl::Status s = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartLoad,
                                              ctx.CallOptions(r), req, &resp);
    if (!s.ok()) co_return WithCallName(s, absl::StrCat("verifier ", v.address, " Load"));
  }
  while (true) {
    if (r.gone()) co_return absl::CancelledError("request cancelled");
    if (Clock::now() >= r.deadline) {
      co_return absl::DeadlineExceededError("request deadline passed");
    }
    pb::VerifyRequest req;
    req.set_session_id(plan.session);
    pb::VerifyResponse resp;
    const auto t0 = Clock::now();
    const absl::Status s = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartVerify,
                                              ctx.CallOptions(r), req, &resp);
    if (!s.ok()) co_return WithCallName(s, absl::StrCat("verifier ", v.address, " Verify"));
    pb::RoundStats round;
    round.set_verify_ms(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    round.set_batch_requests(resp.batch_requests());
    round.set_fallback(already_open);
    std::vector<int32_t> tokens(resp.tokens().begin(), resp.tokens().end());
    (void)co_await AwaitWritable(ctx, r, writer);
    if (!Emit(ctx, plan, r, tokens, round, writer)) co_return absl::OkStatus();
  }
}

// ----------------------------------------------- full_remote, lossy_remote

Task<absl::Status> RunRemote(const RunnerContext& ctx, Plan& plan, Request& r, Sink* writer) {
  Worker& d = *plan.drafter;
  const bool full = r.mode == pb::MODE_FULL_REMOTE;
  {
    pb::DrafterOpenRequest req;
    req.set_session_id(plan.session);
    for (int32_t t : plan.prompt) req.add_prompt(t);
    *req.mutable_prefix() = MakePrefixRef(plan.prefix_tokens, plan.chunk_keys);
    *req.mutable_sampling() = plan.req.sampling();
    // Without a verifier nothing is judged: rejection sampling is plain
    // seeded sampling here, as in full-KV decoding (so full_remote equals
    // full_local token for token).
    if (req.sampling().mode() == pb::SamplingConfig::REJECTION) {
      req.mutable_sampling()->set_mode(pb::SamplingConfig::SEEDED);
    }
    req.set_tenant_salt(plan.req.tenant_salt());
    if (full) {
      req.set_full_prefix(true);
    } else {
      req.set_variant_key(plan.variant_key);
      SetOnlineUpdate(plan.req, plan.prefix_tokens, plan.variant.compressor, &req);
    }
    req.set_lookahead(ctx.options.baseline_chunk);
    req.set_end_position(
        static_cast<int32_t>(plan.prompt.size() + plan.req.max_new_tokens() - plan.resumed));
    pb::DrafterOpenResponse resp;
    bool sent = false;
    absl::Status s = co_await BookedDrafterOpen(ctx, plan, r, req, &resp, &sent);
    if (!sent) co_return s;  // the request's deadline passed waiting for the link
    if (!s.ok()) {
      (void)co_await ReleaseAfterFailedOpen(ctx, WorkerPool::kDrafter, d, plan.session, s);
      co_return WithCallName(s, absl::StrCat("drafter ", d.address, " Open"));
    }
    plan.drafter_open = true;
    ++d.active;
    plan.totals.set_compression_ratio(resp.achieved_ratio());
    plan.totals.set_compressor(full ? "full" : resp.compressor());
  }
  while (true) {
    if (r.gone()) co_return absl::CancelledError("request cancelled");
    if (Clock::now() >= r.deadline)
      co_return absl::DeadlineExceededError("request deadline passed");
    const int64_t remaining = plan.req.max_new_tokens() - static_cast<int64_t>(plan.output.size());
    pb::DraftRequest req;
    req.set_session_id(plan.session);
    req.set_max_tokens(
        static_cast<int32_t>(std::min<int64_t>(ctx.options.baseline_chunk, remaining)));
    req.set_min_tokens(1);
    pb::DraftResponse resp;
    {
      const absl::Status s = co_await AwaitCall(ctx, *d.drafter, &DrafterClient::StartDraft,
                                                ctx.CallOptions(r), req, &resp);
      if (!s.ok()) co_return WithCallName(s, absl::StrCat("drafter ", d.address, " Draft"));
    }
    // These tokens are final: the drafter's own choices are the output.
    std::vector<int32_t> tokens(resp.drafts().begin(), resp.drafts().end());
    pb::CommitRequest creq;
    creq.set_session_id(plan.session);
    for (int32_t t : tokens) creq.add_tokens(t);
    pb::CommitResponse cresp;
    {
      const absl::Status s = co_await AwaitCall(ctx, *d.drafter, &DrafterClient::StartCommit,
                                                ctx.CallOptions(r), creq, &cresp);
      if (!s.ok()) co_return WithCallName(s, absl::StrCat("drafter ", d.address, " Commit"));
    }
    NoteDrafterCommit(cresp, &plan.totals);
    pb::RoundStats round;
    (void)co_await AwaitWritable(ctx, r, writer);
    if (!Emit(ctx, plan, r, tokens, round, writer)) co_return absl::OkStatus();
  }
}

}  // namespace vc::coordinator
