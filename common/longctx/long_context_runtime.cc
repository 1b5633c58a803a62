#include "common/longctx/long_context_runtime.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace vc {
namespace {

// Tokens per block of every KV cache here (requests' full KV and the device
// copies): the device budget is planned in these blocks, so they stay small.
constexpr int kBlockTokens = 16;
constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max() / 4;

// Runs the batch's inputs through the engine in as few Forward calls as the
// batch-token limit allows; `rows` gets each input's logit rows.
absl::Status ForwardPacked(Engine& engine, const std::vector<SequenceInput>& inputs,
                           std::vector<float>* logits, std::vector<std::vector<float>>* rows,
                           int64_t* forward_calls) {
  const int64_t vocab = engine.config().vocab_size;
  rows->assign(inputs.size(), {});
  size_t begin = 0;
  while (begin < inputs.size()) {
    size_t end = begin;
    int64_t tokens = 0;
    while (end < inputs.size() &&
           (end == begin || tokens + static_cast<int64_t>(inputs[end].tokens.size()) <=
                                engine.max_batch_tokens())) {
      tokens += static_cast<int64_t>(inputs[end].tokens.size());
      ++end;
    }
    VC_RETURN_IF_ERROR(engine.Forward({inputs.data() + begin, end - begin}, logits));
    ++*forward_calls;
    size_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      const size_t n =
          (inputs[i].tokens.size() - static_cast<size_t>(inputs[i].first_logit)) * vocab;
      (*rows)[i].assign(logits->begin() + static_cast<std::ptrdiff_t>(offset),
                        logits->begin() + static_cast<std::ptrdiff_t>(offset + n));
      offset += n;
    }
    begin = end;
  }
  return absl::OkStatus();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

struct LongContextRuntime::Entry {
  int id = 0;
  std::unique_ptr<SpeculativeRequest> req;
  enum class State { kWaiting, kActive, kFinished };
  State state = State::kWaiting;
  int64_t resident = 0;  // device bytes committed while active
  // VeriCache rounds.
  int round_drafts = 0;        // x of the current round
  int drafts_done = 0;         // draft steps run in the current round
  bool needs_booking = false;  // in to_book_
  bool booked = false;
  Booking booking;
  double booked_slot_seconds = 0;  // T_slot when the booking was made
  int64_t transient = 0;           // device bytes the reload + verify will hold
  bool reload_issued = false;
  bool staged = false;
  bool at_barrier = false;  // lock-step: verified, waiting for the round to end
};

absl::Status LongContextOptions::Validate() const {
  if (window_slots < 3) return absl::InvalidArgumentError("window_slots must be >= 3");
  if (!(initial_slot_seconds > 0))
    return absl::InvalidArgumentError("initial_slot_seconds must be > 0");
  if (!(slot_ewma_weight > 0 && slot_ewma_weight <= 1)) {
    return absl::InvalidArgumentError("slot_ewma_weight must be in (0, 1]");
  }
  if (copy.queue_depth < 1) return absl::InvalidArgumentError("copy queue depth must be >= 1");
  if (max_active < 0) return absl::InvalidArgumentError("max_active must be >= 0");
  if (mode != DecodeMode::kFull) {
    if (request.compressor.name.empty()) {
      return absl::InvalidArgumentError("vericache and lossy modes need a compressor");
    }
    VC_RETURN_IF_ERROR(request.draft.Validate());
  }
  return absl::OkStatus();
}

absl::StatusOr<KvFootprint> MeasureKvFootprint(Engine& engine, const std::vector<int32_t>& prompt,
                                               const RequestOptions& request) {
  const ModelConfig& c = engine.config();
  const int64_t block_bytes = c.kv_bytes_per_token() * kBlockTokens;
  KvFootprint f;
  const int64_t total = static_cast<int64_t>(prompt.size()) + request.max_new_tokens;
  f.full_kv_bytes = CeilDiv(total, kBlockTokens) * block_bytes;
  if (request.compressor.name.empty()) return f;
  RequestOptions ro = request;
  ro.mode = DecodeMode::kLossy;
  ro.staged_verify = false;
  ro.full_kv_arena = nullptr;
  ro.draft_kv_arena = nullptr;
  ro.full_kv_block_tokens = kBlockTokens;
  VC_ASSIGN_OR_RETURN(auto req, SpeculativeRequest::Create(engine, prompt, ro));
  std::vector<float> logits;
  const SequenceInput in = req->NextInput();
  VC_RETURN_IF_ERROR(engine.Forward({&in, 1}, &logits));
  VC_RETURN_IF_ERROR(req->OnLogits(logits));
  f.compressed_prefix_bytes = req->stats().compressed_kv_bytes;
  f.compression_ratio = req->stats().compression_ratio;
  f.compressed_resident_bytes =
      f.compressed_prefix_bytes + CeilDiv(request.max_new_tokens, kBlockTokens) * block_bytes;
  return f;
}

absl::StatusOr<std::unique_ptr<LongContextRuntime>> LongContextRuntime::Create(
    Engine& engine, const LongContextOptions& options) {
  VC_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<LongContextRuntime> rt(new LongContextRuntime(engine, options));
  if (rt->vericache()) {
    RingSchedulerOptions so;
    so.slot_seconds = options.initial_slot_seconds;
    so.window_slots = options.window_slots;
    so.lock_step = options.schedule == LongContextOptions::Schedule::kLockStep;
    // The host-to-device PCIe link: one link that every reload shares.
    so.links = {RingLink{.name = "host-to-device",
                         .bytes_per_second = options.copy.bytes_per_second,
                         .sharing = RingLink::Sharing::kShared}};
    so.gpus = {RingGpu{.name = "device",
                       .transient_capacity_bytes = options.device_budget_bytes > 0
                                                       ? options.device_budget_bytes
                                                       : kUnlimited}};
    VC_ASSIGN_OR_RETURN(RingScheduler s, RingScheduler::Create(so));
    rt->scheduler_ = std::make_unique<RingScheduler>(std::move(s));
    CopyEngineOptions co = options.copy;
    co.block_tokens = kBlockTokens;
    rt->copy_ = std::make_unique<CopyEngine>(co);
  }
  return rt;
}

LongContextRuntime::LongContextRuntime(Engine& engine, const LongContextOptions& options)
    : engine_(engine),
      options_(options),
      epoch_(std::chrono::steady_clock::now()),
      device_(std::make_unique<KvArena>("device", options.device_budget_bytes)),
      host_(std::make_unique<KvArena>("host", options.host_budget_bytes)),
      slot_seconds_(options.initial_slot_seconds) {}

LongContextRuntime::~LongContextRuntime() {
  // The copy worker reads the entries' host caches and charges the device
  // arena: stop it (without waiting for the link) before either goes.
  if (copy_ != nullptr) copy_->Shutdown();
  copy_.reset();
  entries_.clear();
}

double LongContextRuntime::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

int64_t LongContextRuntime::BlockBytes() const {
  return engine_.config().kv_bytes_per_token() * kBlockTokens;
}

int64_t LongContextRuntime::Blocks(int64_t tokens) const {
  return CeilDiv(tokens, kBlockTokens) * BlockBytes();
}

int64_t LongContextRuntime::FullKvMax(const Entry& e) const {
  return Blocks(static_cast<int64_t>(e.req->prompt().size()) + options_.request.max_new_tokens);
}

int64_t LongContextRuntime::UpperResident(const Entry& e) const {
  if (options_.mode == DecodeMode::kFull) return FullKvMax(e);
  // Before compression the prefix's size is unknown: every compressor here
  // produces a size that depends only on the prompt's length and the
  // options, so the size measured for an earlier prompt of the same length
  // is used; otherwise the prompt's full KV, which no compressed prefix
  // exceeds. Corrected to the exact size after prefill (and should a prefix
  // come out larger, its arena reservation fails loudly rather than
  // oversubscribing the device).
  const auto it = prefix_bytes_by_len_.find(static_cast<int64_t>(e.req->prompt().size()));
  const int64_t prefix =
      it != prefix_bytes_by_len_.end()
          ? it->second
          : static_cast<int64_t>(e.req->prompt().size()) * engine_.config().kv_bytes_per_token();
  return prefix + Blocks(options_.request.max_new_tokens);
}

absl::StatusOr<int> LongContextRuntime::Submit(std::vector<int32_t> prompt) {
  RequestOptions ro = options_.request;
  ro.mode = options_.mode;
  ro.staged_verify = vericache();
  ro.full_kv_arena = options_.mode == DecodeMode::kFull ? device_.get() : host_.get();
  ro.draft_kv_arena = device_.get();
  ro.full_kv_block_tokens = kBlockTokens;
  // Falling back to full decoding would decode against the host tier.
  ro.draft.fallback_min_accepted = -1;
  ro.draft.fallback_after_rounds = -1;
  VC_ASSIGN_OR_RETURN(auto req, SpeculativeRequest::Create(engine_, std::move(prompt), ro));
  auto e = std::make_unique<Entry>();
  e->id = static_cast<int>(entries_.size());
  e->req = std::move(req);
  if (options_.device_budget_bytes > 0) {
    const int64_t need = UpperResident(*e) + (vericache() ? FullKvMax(*e) : 0);
    if (need > options_.device_budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "request needs ", need,
          " device bytes (resident KV plus one full KV for its verify) but the budget is ",
          options_.device_budget_bytes));
    }
  }
  waiting_.push_back(e.get());
  entries_.push_back(std::move(e));
  ++stats_.submitted;
  return entries_.back()->id;
}

const SpeculativeRequest& LongContextRuntime::request(int id) const { return *entries_[id]->req; }

bool LongContextRuntime::done() const {
  return stats_.finished == static_cast<int64_t>(entries_.size());
}

absl::Status LongContextRuntime::UpdateMemoryRing() {
  if (scheduler_ == nullptr || options_.device_budget_bytes <= 0) return absl::OkStatus();
  return scheduler_->SetMemoryCapacity(
      0, std::max<int64_t>(0, options_.device_budget_bytes - resident_total_));
}

absl::Status LongContextRuntime::AdmitWaiting(double* prefill_seconds) {
  const int64_t budget = options_.device_budget_bytes;
  // Admit in groups: each group is charged an upper bound of its resident
  // KV, prefilled together, then corrected to the exact compressed size, so
  // that one call admits everything the budget allows.
  for (;;) {
    int64_t largest_full = 0;  // one verify must always be able to run
    if (vericache()) {
      for (const auto& e : entries_) {
        if (e->state == Entry::State::kActive) largest_full = std::max(largest_full, FullKvMax(*e));
      }
    }
    std::vector<Entry*> admitted;
    while (!waiting_.empty()) {
      Entry& e = *waiting_.front();
      if (options_.max_active > 0 && active_ >= options_.max_active) break;
      const int64_t need = UpperResident(e);
      if (budget > 0) {
        int64_t transient = 0;
        if (vericache()) {
          transient = std::max({transient_total_, scheduler_->PeakMemoryBooked(0),
                                std::max(largest_full, FullKvMax(e))});
        }
        if (resident_total_ + need + transient > budget) break;
      }
      waiting_.pop_front();
      e.state = Entry::State::kActive;
      e.resident = need;
      resident_total_ += need;
      if (vericache()) largest_full = std::max(largest_full, FullKvMax(e));
      ++active_;
      admitted.push_back(&e);
    }
    stats_.max_active = std::max(stats_.max_active, active_);
    if (admitted.empty()) return absl::OkStatus();
    const double t0 = Now();
    VC_RETURN_IF_ERROR(Prefill(admitted));
    *prefill_seconds += Now() - t0;
    VC_RETURN_IF_ERROR(UpdateMemoryRing());
    // Full KV is charged exactly up front: nothing more can fit now.
    if (options_.mode == DecodeMode::kFull) return absl::OkStatus();
  }
}

absl::Status LongContextRuntime::Prefill(const std::vector<Entry*>& batch) {
  std::vector<SequenceInput> inputs;
  for (Entry* e : batch) inputs.push_back(e->req->NextInput());
  std::vector<std::vector<float>> rows;
  VC_RETURN_IF_ERROR(ForwardPacked(engine_, inputs, &logits_, &rows, &stats_.forward_calls));
  for (size_t i = 0; i < batch.size(); ++i) {
    Entry& e = *batch[i];
    VC_RETURN_IF_ERROR(e.req->OnLogits(rows[i]));
    if (options_.mode != DecodeMode::kFull) {
      // The exact resident size now that the prefix is compressed.
      const int64_t prefix = e.req->stats().compressed_kv_bytes;
      int64_t& known = prefix_bytes_by_len_[static_cast<int64_t>(e.req->prompt().size())];
      known = std::max(known, prefix);
      const int64_t exact = prefix + Blocks(options_.request.max_new_tokens);
      resident_total_ += exact - e.resident;
      e.resident = exact;
    }
    if (e.req->done()) {
      VC_RETURN_IF_ERROR(Finish(e));
    } else if (vericache()) {
      StartRound(e);
    }
  }
  return absl::OkStatus();
}

void LongContextRuntime::StartRound(Entry& e) {
  e.round_drafts = e.req->stats().draft_lengths.empty() ? 0 : e.req->stats().draft_lengths.back();
  e.drafts_done = 0;
  if (options_.schedule == LongContextOptions::Schedule::kLockStep) {
    e.at_barrier = true;
  } else {
    e.needs_booking = true;
    to_book_.push_back(&e);
  }
}

void LongContextRuntime::ReleaseBarrierIfComplete() {
  if (options_.schedule != LongContextOptions::Schedule::kLockStep) return;
  bool any = false;
  for (const auto& e : entries_) {
    if (e->state != Entry::State::kActive) continue;
    if (!e->at_barrier) return;  // someone is still mid-round
    any = true;
  }
  if (!any) return;
  // Everyone has verified: the next round starts for all at once, and all
  // are admitted in the same slot, so the scheduler puts them on one common
  // verify slot.
  for (const auto& e : entries_) {
    if (e->state != Entry::State::kActive) continue;
    e->at_barrier = false;
    e->needs_booking = true;
    to_book_.push_back(e.get());
  }
}

absl::Status LongContextRuntime::BookRounds(bool after_forward) {
  std::deque<Entry*> still;
  while (!to_book_.empty()) {
    Entry& e = *to_book_.front();
    to_book_.pop_front();
    if (e.state != Entry::State::kActive || !e.needs_booking) continue;
    // Verify-ready slot, from now: the remaining draft steps run in this
    // slot's pass (before it) or in the next slots (after it).
    const int remaining = std::max(0, e.round_drafts - e.drafts_done);
    const int ready = std::max(1, remaining + (after_forward ? 1 : 0));
    const int64_t copy_tokens = e.req->full_kv().next_position();
    const int64_t transient = Blocks(copy_tokens + e.round_drafts + 1);
    AdmitRequest r;
    r.id = e.id;
    r.full_kv_bytes = transient;
    r.target_offset = ready;
    r.min_offset = ready;  // a round cannot be cut short
    VC_ASSIGN_OR_RETURN(Admission a, scheduler_->Admit(r));
    if (a.queued) {
      ++stats_.admissions_queued;
      still.push_back(&e);
      continue;
    }
    e.needs_booking = false;
    e.booked = true;
    e.booking = a.booking;
    e.booked_slot_seconds = scheduler_->slot_seconds();
    e.transient = transient;
  }
  to_book_ = std::move(still);
  return absl::OkStatus();
}

absl::Status LongContextRuntime::RebookOnDrift() {
  // A booking's reload slots were sized with the T_slot of its day; when
  // iteration times drift (fewer requests drafting makes iterations
  // shorter), reloads not started yet are booked again at the current T_slot
  // so that the plan keeps matching the link's real time.
  const double t = scheduler_->slot_seconds();
  std::vector<Entry*> stale;
  for (const auto& e : entries_) {
    if (e->state == Entry::State::kActive && e->booked && !e->reload_issued &&
        std::abs(e->booked_slot_seconds - t) > options_.rebook_drift * e->booked_slot_seconds) {
      stale.push_back(e.get());
    }
  }
  if (stale.empty()) return absl::OkStatus();
  std::sort(stale.begin(), stale.end(), [](const Entry* a, const Entry* b) {
    return std::make_pair(a->booking.verify_slot, a->id) <
           std::make_pair(b->booking.verify_slot, b->id);
  });
  for (Entry* e : stale) {
    VC_RETURN_IF_ERROR(scheduler_->Release(e->id));
    e->booked = false;
    e->transient = 0;
    e->needs_booking = true;
  }
  ++stats_.rebooks;
  // Ahead of the rounds already waiting for a booking, in their old order.
  std::deque<Entry*> order(stale.begin(), stale.end());
  order.insert(order.end(), to_book_.begin(), to_book_.end());
  to_book_ = std::move(order);
  return absl::OkStatus();
}

void LongContextRuntime::IssueReloads() {
  std::vector<Entry*> due;
  for (const auto& e : entries_) {
    if (e->state == Entry::State::kActive && e->booked && !e->reload_issued &&
        e->booking.first_slot() <= scheduler_->now()) {
      due.push_back(e.get());
    }
  }
  std::sort(due.begin(), due.end(), [](const Entry* a, const Entry* b) {
    return std::make_pair(a->booking.first_slot(), a->id) <
           std::make_pair(b->booking.first_slot(), b->id);
  });
  const int64_t budget = options_.device_budget_bytes;
  for (Entry* e : due) {
    // The plan can slip (a copy lands late, a verify runs late); the device
    // budget is checked again here so the arena never refuses a block.
    if (budget > 0 && resident_total_ + transient_total_ + e->transient > budget) {
      ++stats_.memory_deferred;
      continue;
    }
    CopyJob job;
    job.id = e->id;
    job.source = &e->req->full_kv();
    job.arena = device_.get();
    job.config = &engine_.config();
    const absl::Status s = copy_->Submit(job);
    if (absl::IsResourceExhausted(s)) {
      ++stats_.copy_queue_full;
      break;  // retried next iteration
    }
    VC_CHECK(s.ok(), "copy engine refused a job");
    e->reload_issued = true;
    transient_total_ += e->transient;
    ++stats_.reloads;
    stats_.reload_bytes += e->req->full_kv().bytes();
  }
}

absl::Status LongContextRuntime::CollectCopies(std::vector<CopyResult> results) {
  for (CopyResult& r : results) {
    Entry& e = *entries_[r.id];
    if (!r.copy.ok()) {
      return absl::InternalError(
          absl::StrCat("reload of request ", r.id, " failed: ", r.copy.status().ToString()));
    }
    VC_RETURN_IF_ERROR(e.req->StageVerifyKv(std::move(r.copy).value()));
    e.staged = true;
  }
  return absl::OkStatus();
}

absl::Status LongContextRuntime::Finish(Entry& e) {
  e.state = Entry::State::kFinished;
  resident_total_ -= e.resident;
  e.resident = 0;
  --active_;
  ++stats_.finished;
  stats_.generated_tokens += static_cast<int64_t>(e.req->output().size());
  return UpdateMemoryRing();
}

absl::Status LongContextRuntime::Step() {
  if (stop_.load()) return absl::CancelledError("long-context runtime stopped");
  if (done()) return absl::OkStatus();
  const double t_begin = Now();
  double prefill = 0;
  VC_RETURN_IF_ERROR(AdmitWaiting(&prefill));
  if (vericache()) {
    ReleaseBarrierIfComplete();
    VC_RETURN_IF_ERROR(BookRounds(/*after_forward=*/false));
    IssueReloads();
    VC_RETURN_IF_ERROR(CollectCopies(copy_->Poll()));
  }

  // The pass: every drafting / decoding request's next step, plus the
  // verifies whose full KV has landed.
  std::vector<Entry*> batch;
  std::vector<Entry*> stalled;
  IterationRecord rec;
  rec.slot = scheduler_ ? scheduler_->now() : stats_.iterations + stats_.idle_iterations;
  rec.start = t_begin;
  for (const auto& e : entries_) {
    if (e->state != Entry::State::kActive || e->at_barrier) continue;
    const SpeculativeRequest::Phase phase = e->req->phase();
    if (phase == SpeculativeRequest::Phase::kVerify && e->req->awaiting_verify_kv()) {
      stalled.push_back(e.get());
      continue;
    }
    batch.push_back(e.get());
    if (phase == SpeculativeRequest::Phase::kVerify) {
      ++rec.verifying;
    } else {
      ++rec.drafting;
    }
  }
  rec.stalled = static_cast<int>(stalled.size());

  if (batch.empty()) {
    // Nothing can run: wait for a copy to land, or move time on.
    if (active_ == 0 && !waiting_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request ", waiting_.front()->id, " cannot be admitted under the device budget of ",
          options_.device_budget_bytes, " bytes"));
    }
    int64_t advance = 1;
    if (copy_ != nullptr && copy_->in_flight() > 0) {
      const double w0 = Now();
      VC_RETURN_IF_ERROR(CollectCopies(copy_->WaitForAny(0.25)));
      const double waited = Now() - w0;
      stats_.engine_idle_seconds += waited;
      advance = std::max<int64_t>(1, std::llround(waited / slot_seconds_));
    } else if (scheduler_ != nullptr) {
      // Jump to the next booked reload start, if that is all there is.
      int64_t next = std::numeric_limits<int64_t>::max();
      for (const auto& e : entries_) {
        if (e->state == Entry::State::kActive && e->booked && !e->reload_issued) {
          next = std::min(next, e->booking.first_slot());
        }
      }
      if (next != std::numeric_limits<int64_t>::max() && next > scheduler_->now()) {
        advance = next - scheduler_->now();
      }
    }
    const double seconds = Now() - t_begin - prefill;
    stats_.request_stall_seconds += seconds * static_cast<double>(stalled.size());
    for (const auto& e : entries_) {
      if (e->state == Entry::State::kActive && e->at_barrier) stats_.barrier_seconds += seconds;
    }
    stats_.decode_seconds += seconds;
    stats_.prefill_seconds += prefill;
    ++stats_.idle_iterations;
    if (scheduler_ != nullptr) scheduler_->Advance(advance);
    rec.seconds = seconds;
    rec.copies_in_flight = copy_ != nullptr ? copy_->in_flight() : 0;
    rec.device_in_use = device_->in_use();
    if (options_.record_trace) trace_.push_back(rec);
    return absl::OkStatus();
  }

  std::vector<SequenceInput> inputs;
  std::vector<SpeculativeRequest::Phase> phases;
  std::vector<int64_t> host_read_marks;
  for (Entry* e : batch) {
    phases.push_back(e->req->phase());
    host_read_marks.push_back(e->req->full_kv().bytes_read());
    inputs.push_back(e->req->NextInput());
  }
  std::vector<std::vector<float>> rows;
  const double f0 = Now();
  VC_RETURN_IF_ERROR(ForwardPacked(engine_, inputs, &logits_, &rows, &stats_.forward_calls));
  stats_.forward_seconds += Now() - f0;
  if (options_.mode != DecodeMode::kFull) {
    // The pass must not have read any request's host-tier full KV.
    for (size_t i = 0; i < batch.size(); ++i) {
      stats_.host_kv_bytes_read_in_decode +=
          batch[i]->req->full_kv().bytes_read() - host_read_marks[i];
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Entry& e = *batch[i];
    VC_RETURN_IF_ERROR(e.req->OnLogits(rows[i]));
    if (phases[i] == SpeculativeRequest::Phase::kDraft) {
      ++e.drafts_done;
    } else if (phases[i] == SpeculativeRequest::Phase::kVerify) {
      ++stats_.verifies;
      if (scheduler_->now() > e.booking.verify_slot) {
        ++stats_.late_verifies;
        stats_.late_verify_slots += scheduler_->now() - e.booking.verify_slot;
      }
      VC_RETURN_IF_ERROR(scheduler_->Release(e.id));
      e.booked = false;
      e.reload_issued = false;
      e.staged = false;
      transient_total_ -= e.transient;
      e.transient = 0;
      if (!e.req->done()) StartRound(e);  // re-admitted below (staggered) or at the barrier
    }
    if (e.req->done()) VC_RETURN_IF_ERROR(Finish(e));
  }
  if (vericache()) {
    ReleaseBarrierIfComplete();
    VC_RETURN_IF_ERROR(BookRounds(/*after_forward=*/true));
  }

  const double seconds = Now() - t_begin - prefill;
  stats_.request_stall_seconds += seconds * static_cast<double>(stalled.size());
  for (const auto& e : entries_) {
    if (e->state == Entry::State::kActive && e->at_barrier) stats_.barrier_seconds += seconds;
  }
  stats_.decode_seconds += seconds;
  stats_.prefill_seconds += prefill;
  ++stats_.iterations;
  // T_slot: an EWMA of measured iteration times.
  slot_seconds_ =
      (1 - options_.slot_ewma_weight) * slot_seconds_ + options_.slot_ewma_weight * seconds;
  if (scheduler_ != nullptr) {
    VC_RETURN_IF_ERROR(scheduler_->SetSlotSeconds(std::max(slot_seconds_, 1e-6)));
    if (options_.rebook_drift > 0) {
      VC_RETURN_IF_ERROR(RebookOnDrift());
      VC_RETURN_IF_ERROR(BookRounds(/*after_forward=*/true));
    }
    scheduler_->Advance(1);
  }
  rec.seconds = seconds;
  rec.copies_in_flight = copy_ != nullptr ? copy_->in_flight() : 0;
  rec.device_in_use = device_->in_use();
  if (options_.record_trace) trace_.push_back(rec);
  return absl::OkStatus();
}

absl::Status LongContextRuntime::Run() {
  while (!done()) VC_RETURN_IF_ERROR(Step());
  return absl::OkStatus();
}

LongContextStats LongContextRuntime::stats() const {
  LongContextStats s = stats_;
  s.slot_seconds = slot_seconds_;
  s.device_budget = options_.device_budget_bytes;
  s.device_high_water = device_->high_water();
  if (scheduler_ != nullptr) s.link_overrun_seconds = scheduler_->stats().overrun_seconds[0];
  return s;
}

CopyEngineStats LongContextRuntime::copy_stats() const {
  return copy_ != nullptr ? copy_->stats() : CopyEngineStats{};
}

}  // namespace vc
