#include "common/speculative/draft_verify.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/decode/full_decode.h"

namespace vc {
namespace {

// Copies the K/V rows of positions [from, to) of every layer from `src` to
// `dst` (both already hold those positions).
void CopyRows(const PagedKvCache& src, SequenceKv* dst, int32_t from, int32_t to) {
  const int hd = src.head_dim(), heads = src.kv_heads();
  std::vector<float> k(static_cast<size_t>(heads) * hd), v(k.size());
  for (int32_t pos = from; pos < to; ++pos) {
    for (int l = 0; l < src.n_layers(); ++l) {
      for (int h = 0; h < heads; ++h) {
        std::copy_n(src.KeyAt(l, h, pos), hd, &k[h * hd]);
        std::copy_n(src.ValueAt(l, h, pos), hd, &v[h * hd]);
      }
      dst->Write(l, pos, k.data(), v.data());
    }
  }
}

bool IsLlama2c(const Model& m) { return m.config().architecture == "llama2c"; }

// The bytes of a Hugging Face checkpoint's tokenizer.json.
absl::StatusOr<std::string> ReadTokenizerJson(const Model& m) {
  const std::filesystem::path path = std::filesystem::path(m.source()) / "tokenizer.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("draft model: cannot compare tokenizers, ",
                                                   path.string(), " is missing or unreadable"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

absl::Status CheckDraftVocabulary(const Model& target, const Model& draft) {
  const int tv = target.config().vocab_size, dv = draft.config().vocab_size;
  if (tv != dv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model ", draft.source(), " has a vocabulary of ", dv, " tokens but the target ",
        target.source(), " has ", tv, "; a drafter needs the target's vocabulary"));
  }
  if (IsLlama2c(target) != IsLlama2c(draft)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model ", draft.source(), " and target ", target.source(),
        " mix a llama2.c and a Hugging Face checkpoint; their vocabularies cannot be shown to "
        "match"));
  }
  if (!IsLlama2c(target)) {
    VC_ASSIGN_OR_RETURN(const std::string t, ReadTokenizerJson(target));
    VC_ASSIGN_OR_RETURN(const std::string d, ReadTokenizerJson(draft));
    if (t != d) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft model ", draft.source(),
                       ": its tokenizer.json differs from the "
                       "target's; a drafter needs the same tokenizer"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DecodeMode> ParseDecodeMode(const std::string& name) {
  if (name == "full") return DecodeMode::kFull;
  if (name == "vericache") return DecodeMode::kVeriCache;
  if (name == "lossy") return DecodeMode::kLossy;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", name, "' (expected full, vericache or lossy)"));
}

absl::StatusOr<SamplingMode> ParseSamplingMode(const std::string& name) {
  if (name == "greedy") return SamplingMode::kGreedy;
  if (name == "seeded") return SamplingMode::kSeeded;
  if (name == "rejection") return SamplingMode::kRejection;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sampling '", name, "' (expected greedy, seeded or rejection)"));
}

const char* DecodeModeName(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::kFull:
      return "full";
    case DecodeMode::kVeriCache:
      return "vericache";
    case DecodeMode::kLossy:
      return "lossy";
  }
  return "?";
}

absl::Status DraftOptions::Validate() const {
  if (draft_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("draft length must be >= 1, got ", draft_len));
  }
  if (min_draft_len < 1 || max_draft_len < min_draft_len) {
    return absl::InvalidArgumentError(absl::StrCat("draft length bounds must satisfy 1 <= min (",
                                                   min_draft_len, ") <= max (", max_draft_len,
                                                   ")"));
  }
  if (fallback_window < 1) return absl::InvalidArgumentError("fallback window must be >= 1");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SpeculativeRequest>> SpeculativeRequest::Create(
    const Engine& engine, std::vector<int32_t> prompt, const RequestOptions& options) {
  const ModelConfig& c = engine.config();
  VC_RETURN_IF_ERROR(ValidateRequest(c, prompt, options.max_new_tokens));
  if (options.sampling_mode == SamplingMode::kGreedy) {
    if (!options.sampling.greedy()) {
      return absl::InvalidArgumentError("greedy sampling takes no temperature");
    }
  } else {
    VC_RETURN_IF_ERROR(options.sampling.Validate());
    if (options.sampling.greedy()) {
      return absl::InvalidArgumentError("seeded and rejection sampling need a temperature > 0");
    }
  }
  std::unique_ptr<Compressor> compressor;
  if (options.staged_verify &&
      (options.mode != DecodeMode::kVeriCache || options.draft.fallback_min_accepted >= 0 ||
       options.draft.fallback_after_rounds >= 0)) {
    // Falling back would decode against the host copy of the full KV.
    return absl::InvalidArgumentError(
        "staged verify needs --mode vericache with fallback disabled");
  }
  if (options.online_update && options.mode == DecodeMode::kFull) {
    return absl::InvalidArgumentError(
        "online update compresses the drafter's KV: it needs mode vericache or lossy");
  }
  if (options.draft_model != nullptr) {
    if (options.mode != DecodeMode::kVeriCache) {
      return absl::InvalidArgumentError("a separate draft model needs mode vericache");
    }
    if (options.draft_model->vocab_size != c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("the draft model's vocabulary (", options.draft_model->vocab_size,
                       " tokens) differs from the target's (", c.vocab_size, ")"));
    }
    if (options.draft.kv_refresh) {
      // The verifier's K/V rows are the target's; they mean nothing to
      // another model.
      return absl::InvalidArgumentError(
          "a separate draft model keeps KV of its own: it needs KV refresh off");
    }
    if (options.staged_verify) {
      return absl::InvalidArgumentError("staged verify does not take a separate draft model");
    }
  }
  // A separate draft model without a compressor drafts from its exact KV.
  const bool exact_draft_kv = options.draft_model != nullptr && options.compressor.name.empty();
  if (exact_draft_kv && options.online_update) {
    return absl::InvalidArgumentError("online update needs a compressor");
  }
  if (options.mode != DecodeMode::kFull && !exact_draft_kv) {
    VC_RETURN_IF_ERROR(options.draft.Validate());
    VC_ASSIGN_OR_RETURN(compressor, CreateCompressor(options.compressor));
    if (options.online_update && compressor->online_policy().kind == OnlinePolicy::Kind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "online update: ", compressor->info().name,
          " has no online rule (its published rule compresses once after prefill)"));
    }
  }
  if (exact_draft_kv) VC_RETURN_IF_ERROR(options.draft.Validate());
  return std::unique_ptr<SpeculativeRequest>(
      new SpeculativeRequest(engine, std::move(prompt), options, std::move(compressor)));
}

SpeculativeRequest::SpeculativeRequest(const Engine& engine, std::vector<int32_t> prompt,
                                       const RequestOptions& options,
                                       std::unique_ptr<Compressor> compressor)
    : config_(engine.config()),
      draft_config_(options.draft_model != nullptr ? *options.draft_model : engine.config()),
      vocab_(engine.config().vocab_size),
      prompt_(std::move(prompt)),
      options_(options),
      compressor_(std::move(compressor)),
      full_kv_(std::make_unique<PagedKvCache>(
          engine.config(), PagedKvCache::Options{.block_tokens = options.full_kv_block_tokens,
                                                 .arena = options.full_kv_arena})),
      fallback_(FallbackOptions{.window = options.draft.fallback_window,
                                .min_accepted = options.draft.fallback_min_accepted,
                                .after_rounds = options.draft.fallback_after_rounds}) {
  x_ = options_.draft.adaptive
           ? std::clamp(options_.draft.draft_len, options_.draft.min_draft_len,
                        options_.draft.max_draft_len)
           : options_.draft.draft_len;
  if (compressor_ != nullptr && compressor_->info().needs_attention_stats) {
    // It observes the prefill of the drafter's model.
    stats_observer_ = std::make_unique<AttentionStats>(
        draft_config_, static_cast<int32_t>(prompt_.size()), options_.compressor.window);
  }
}

absl::Status SpeculativeRequest::StageVerifyKv(std::unique_ptr<PagedKvCache> copy) {
  if (!options_.staged_verify) {
    return absl::FailedPreconditionError("StageVerifyKv on a request without staged_verify");
  }
  if (copy == nullptr || copy->first_position() != full_kv_->first_position() ||
      copy->next_position() != full_kv_->next_position()) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged verify KV must copy positions [", full_kv_->first_position(), ", ",
                     full_kv_->next_position(), ")"));
  }
  verify_kv_ = std::move(copy);
  return absl::OkStatus();
}

SequenceInput SpeculativeRequest::NextInput() {
  switch (phase_) {
    case Phase::kPrefill:
      return {full_kv_.get(), prompt_, static_cast<int64_t>(prompt_.size()) - 1,
              separate_draft_model() ? nullptr : stats_observer_.get()};
    case Phase::kDraftPrefill:
      // No logits: the first draft step feeds p.
      return {draft_prompt_kv_.get(), prompt_, static_cast<int64_t>(prompt_.size()),
              stats_observer_.get()};
    case Phase::kDraft:
      full_kv_read_mark_ = full_kv_->bytes_read();
      if (decode_stats_ != nullptr) {
        decode_stats_->BeginPass(draft_kv_->next_position() +
                                 static_cast<int32_t>(draft_feed_.size()) - 1);
      }
      return {draft_kv_.get(), draft_feed_, static_cast<int64_t>(draft_feed_.size()) - 1,
              decode_stats_.get()};
    case Phase::kVerify:
      VC_CHECK(!awaiting_verify_kv(), "staged verify without StageVerifyKv");
      return {verify_kv_ ? verify_kv_.get() : full_kv_.get(), verify_input_, 0};
    case Phase::kFullDecode: {
      if (options_.mode == DecodeMode::kLossy) {
        if (decode_stats_ != nullptr) {
          decode_stats_->BeginPass(draft_kv_->next_position() +
                                   static_cast<int32_t>(draft_feed_.size()) - 1);
        }
        return {draft_kv_.get(), draft_feed_, static_cast<int64_t>(draft_feed_.size()) - 1,
                decode_stats_.get()};
      }
      return {full_kv_.get(), draft_feed_, static_cast<int64_t>(draft_feed_.size()) - 1};
    }
    case Phase::kDone:
      break;
  }
  return {};
}

absl::Status SpeculativeRequest::OnLogits(std::span<const float> rows) {
  switch (phase_) {
    case Phase::kPrefill:
      return AfterPrefill(rows);
    case Phase::kDraftPrefill:
      return AfterDraftPrefill();
    case Phase::kDraft:
      stats_.drafter_full_kv_bytes_read += full_kv_->bytes_read() - full_kv_read_mark_;
      NoteDrafterBytes();
      return AfterDraftStep(rows);
    case Phase::kVerify:
      return AfterVerify(rows);
    case Phase::kFullDecode:
      return AfterFullStep(rows);
    case Phase::kDone:
      break;
  }
  return absl::FailedPreconditionError("request is already done");
}

int32_t SpeculativeRequest::Choose(std::span<const float> logits, int64_t position,
                                   uint64_t stream) const {
  if (options_.sampling_mode == SamplingMode::kGreedy) return Argmax(logits);
  SamplingParams p = options_.sampling;
  p.seed ^= stream;
  return SampleToken(logits, p, position);
}

void SpeculativeRequest::ReleaseFullKv() {
  // An empty cache rather than null: full_kv() stays valid for callers that
  // read its counters after the request finished.
  full_kv_ = std::make_unique<PagedKvCache>(config_);
}

bool SpeculativeRequest::Emit(std::span<const int32_t> tokens) {
  for (const int32_t t : tokens) {
    output_.push_back(t);
    if (config_.IsEos(t) && !options_.ignore_eos) {
      stopped_at_eos_ = true;
      break;
    }
    if (static_cast<int64_t>(output_.size()) >= options_.max_new_tokens) break;
  }
  if (stopped_at_eos_ || static_cast<int64_t>(output_.size()) >= options_.max_new_tokens) {
    phase_ = Phase::kDone;
    stats_.full_kv_bytes =
        static_cast<int64_t>(prompt_.size() + output_.size()) * config_.kv_bytes_per_token();
    ReleaseFullKv();
    DropDraftKv();
    verify_kv_.reset();
    return true;
  }
  return false;
}

absl::Status SpeculativeRequest::AfterPrefill(std::span<const float> last_row) {
  const auto t0 = std::chrono::steady_clock::now();
  stats_.prefill_pass_end = t0;
  const int64_t pos = static_cast<int64_t>(prompt_.size());
  const int32_t first = Choose(last_row, pos, 0);
  if (options_.mode != DecodeMode::kFull && !separate_draft_model()) {
    // Compress the prompt's KV once, right after its prefill.
    VC_RETURN_IF_ERROR(BuildDraftView(*full_kv_));
    if (options_.mode == DecodeMode::kLossy) {
      // The lossy baseline never needs the full KV again.
      ReleaseFullKv();
    }
  }
  stats_.after_prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (Emit({&first, 1})) return absl::OkStatus();
  pending_ = first;
  draft_feed_ = {first};
  if (separate_draft_model()) {
    // The draft model's own KV of the prompt comes next, sized for the
    // target's context (the draft model's may be shorter).
    draft_prompt_kv_ = std::make_unique<PagedKvCache>(
        draft_config_, PagedKvCache::Options{.max_tokens = config_.max_seq_len});
    phase_ = Phase::kDraftPrefill;
  } else if (options_.mode == DecodeMode::kVeriCache) {
    StartRound();
  } else {
    phase_ = Phase::kFullDecode;
  }
  return absl::OkStatus();
}

absl::Status SpeculativeRequest::AfterDraftPrefill() {
  VC_RETURN_IF_ERROR(BuildDraftView(*draft_prompt_kv_));
  draft_prompt_kv_.reset();
  StartRound();
  return absl::OkStatus();
}

absl::Status SpeculativeRequest::BuildDraftView(const PagedKvCache& full) {
  const int32_t prompt_len = static_cast<int32_t>(prompt_.size());
  std::shared_ptr<const CompressedPrefix> prefix;
  if (compressor_ == nullptr) {
    // A separate draft model without a compressor: every prompt row, in f32.
    std::vector<int32_t> all(prompt_len);
    for (int32_t i = 0; i < prompt_len; ++i) all[i] = i;
    const std::vector<std::vector<std::vector<int32_t>>> kept(
        draft_config_.n_layers, std::vector<std::vector<int32_t>>(draft_config_.n_kv_heads, all));
    VC_ASSIGN_OR_RETURN(
        prefix, CompressedPrefix::Build(draft_config_, full, prompt_len, kept, RowCodecSpec::F32(),
                                        RowCodecSpec::F32(), "none"));
  } else {
    const AttentionStats empty_stats(draft_config_, 0, 0);
    const AttentionStats& stats = stats_observer_ ? *stats_observer_ : empty_stats;
    VC_ASSIGN_OR_RETURN(prefix,
                        compressor_->Compress(draft_config_, full, prompt_len, stats, work_pool_));
  }
  stats_.compressed_kv_bytes = prefix->bytes();
  stats_.compression_ratio = prefix->ratio();
  stats_.compressor = compressor_ != nullptr ? compressor_->Describe() : "none";
  if (options_.draft_kv_arena != nullptr) {
    VC_ASSIGN_OR_RETURN(prefix_reservation_, options_.draft_kv_arena->Reserve(prefix->bytes()));
  }
  draft_kv_ = std::make_unique<CompressedSequenceKv>(draft_config_, std::move(prefix),
                                                     config_.max_seq_len, options_.draft_kv_arena);
  stats_.online_update = options_.online_update;
  if (options_.online_update) {  // never without a compressor (Create)
    online_ = compressor_->online_policy();
    if (online_.needs_decode_stats) {
      // Seeded with the prefill's sums, so online eviction continues the
      // ranking the offline selection started.
      decode_stats_ = std::make_unique<DecodeAttentionStats>(draft_config_, config_.max_seq_len,
                                                             stats_observer_.get());
      decode_stats_->SetView(draft_kv_.get());
    }
  }
  NoteDrafterBytes();
  stats_observer_.reset();
  return absl::OkStatus();
}

void SpeculativeRequest::StartRound() {
  const int64_t remaining = options_.max_new_tokens - static_cast<int64_t>(output_.size());
  const int x = static_cast<int>(std::min<int64_t>(x_, remaining - 1));
  drafts_.clear();
  draft_probs_.clear();
  stats_.draft_lengths.push_back(x);
  if (x <= 0) {
    verify_input_ = {pending_};
    phase_ = Phase::kVerify;
  } else {
    drafts_.reserve(x);
    phase_ = Phase::kDraft;
  }
}

absl::Status SpeculativeRequest::AfterDraftStep(std::span<const float> last_row) {
  const int64_t pos = draft_kv_->next_position();
  int32_t d;
  if (options_.sampling_mode == SamplingMode::kRejection) {
    std::vector<double> q;
    d = DrawRejectionDraft(last_row, options_.sampling, pos, &q);
    draft_probs_.push_back(std::move(q));
  } else {
    d = Choose(last_row, pos, 0);
  }
  drafts_.push_back(d);
  draft_feed_ = {d};
  if (static_cast<int>(drafts_.size()) == stats_.draft_lengths.back()) {
    verify_input_.assign(1, pending_);
    verify_input_.insert(verify_input_.end(), drafts_.begin(), drafts_.end());
    phase_ = Phase::kVerify;
  }
  return absl::OkStatus();
}

absl::Status SpeculativeRequest::AfterVerify(std::span<const float> rows) {
  const int x = static_cast<int>(drafts_.size());
  if (rows.size() != static_cast<size_t>(x + 1) * vocab_) {
    return absl::InternalError("verify pass returned the wrong number of rows");
  }
  PagedKvCache& vkv = verify_kv_ ? *verify_kv_ : *full_kv_;
  const int32_t base = vkv.next_position() - (x + 1);  // position of p
  AcceptInputs judge;
  judge.rows = rows;
  judge.vocab = vocab_;
  judge.drafts = drafts_;
  judge.first_position = base + 1;
  judge.choose = [this](std::span<const float> r, int64_t pos) { return Choose(r, pos, 0); };
  judge.rejection = options_.sampling_mode == SamplingMode::kRejection;
  judge.rejection_params = options_.sampling;
  judge.draft_probs = draft_probs_;
  const AcceptDecision decision = AcceptDrafts(judge);
  const int accepted = decision.accepted;
  const int32_t next = decision.next;

  ++stats_.verify_rounds;
  stats_.accept_lengths.push_back(accepted);
  fallback_.RecordRound(accepted);
  stats_.drafted_tokens += x;
  stats_.wasted_drafts += x - accepted;

  // Keep the exact KV of [p, d1..d_accepted]; drop the rest on both sides.
  const int32_t keep_until = base + 1 + accepted;
  vkv.Truncate(keep_until);
  if (verify_kv_ != nullptr) {
    // Write the accepted rows back to the host copy, then free the arena copy.
    VC_RETURN_IF_ERROR(full_kv_->Append(keep_until - full_kv_->next_position()));
    CopyRows(vkv, full_kv_.get(), base, keep_until);
  }
  draft_kv_->Truncate(std::min(draft_kv_->next_position(), keep_until));
  // The drafter may lack K/V for some accepted positions (rounds without
  // drafts, or no refresh): everything from its end up to keep_until.
  const int32_t drafter_end = draft_kv_->next_position();
  draft_feed_.clear();
  if (options_.draft.kv_refresh) {
    // Overwrite the drafter's K/V of accepted tokens with the exact rows.
    if (drafter_end < keep_until) {
      VC_RETURN_IF_ERROR(draft_kv_->Append(keep_until - drafter_end));
    }
    CopyRows(vkv, draft_kv_.get(), std::min(base, drafter_end), keep_until);
  } else {
    // The drafter runs whatever accepted tokens it has no K/V for yet.
    const int32_t prompt_len = static_cast<int32_t>(prompt_.size());
    for (int32_t pos = drafter_end; pos < keep_until; ++pos) {
      // output_ ends with p (at `base`); the accepted drafts follow it.
      const int32_t i = pos - prompt_len;
      draft_feed_.push_back(i < static_cast<int32_t>(output_.size())
                                ? output_[i]
                                : drafts_[pos - base - 1]);
    }
  }
  draft_feed_.push_back(next);
  verify_kv_.reset();
  // Rows at keep_until and beyond were rejected drafts: their attention sums
  // restart. Settled rows: with refresh every accepted row now holds the
  // verifier's exact K/V; without, the drafter's own rows below its end are
  // final (the accepted tokens after it are fed again next round).
  if (decode_stats_ != nullptr) decode_stats_->DiscardFrom(keep_until);
  VC_RETURN_IF_ERROR(
      draft_kv_->Settle(options_.draft.kv_refresh ? keep_until : std::min(drafter_end, keep_until)));
  NoteDrafterBytes();

  std::vector<int32_t> emitted(drafts_.begin(), drafts_.begin() + accepted);
  emitted.push_back(next);
  if (Emit(emitted)) return absl::OkStatus();
  pending_ = next;
  UpdateDraftLength(accepted);
  if (ShouldFallBack()) {
    ++stats_.fallbacks;
    DropDraftKv();  // full-KV decoding from here on
    draft_feed_ = {pending_};
    phase_ = Phase::kFullDecode;
    return absl::OkStatus();
  }
  VC_RETURN_IF_ERROR(MaybeFold());
  StartRound();
  return absl::OkStatus();
}

absl::Status SpeculativeRequest::MaybeFold() {
  if (!options_.online_update || draft_kv_ == nullptr || !ShouldFold(online_, *draft_kv_)) {
    return absl::OkStatus();
  }
  VC_RETURN_IF_ERROR(FoldIntoView(*compressor_, draft_config_, draft_kv_->settled_length(),
                                  decode_stats_.get(), draft_kv_.get(), options_.draft_kv_arena,
                                  &prefix_reservation_));
  ++stats_.online_folds;
  NoteDrafterBytes();
  return absl::OkStatus();
}

void SpeculativeRequest::NoteDrafterBytes() {
  if (draft_kv_ == nullptr) return;
  stats_.drafter_kv_bytes_final = draft_kv_->bytes();
  stats_.drafter_kv_bytes_peak = std::max(stats_.drafter_kv_bytes_peak, draft_kv_->bytes());
}

void SpeculativeRequest::DropDraftKv() {
  NoteDrafterBytes();
  decode_stats_.reset();  // it points at the view
  draft_kv_.reset();
  prefix_reservation_ = KvArena::Reservation();
}

absl::Status SpeculativeRequest::AfterFullStep(std::span<const float> last_row) {
  const SequenceKv& kv = options_.mode == DecodeMode::kLossy
                             ? static_cast<const SequenceKv&>(*draft_kv_)
                             : static_cast<const SequenceKv&>(*full_kv_);
  const int32_t token = Choose(last_row, kv.next_position(), 0);
  if (options_.mode == DecodeMode::kLossy && draft_kv_ != nullptr) {
    // Lossy: nothing is verified or rolled back, so every row the pass wrote
    // is final.
    VC_RETURN_IF_ERROR(draft_kv_->Settle(draft_kv_->next_position()));
    NoteDrafterBytes();
  }
  if (Emit({&token, 1})) return absl::OkStatus();
  pending_ = token;
  draft_feed_ = {token};
  return MaybeFold();
}

int NextDraftLength(int x, int accepted, double* accept_ewma, int min_len, int max_len) {
  *accept_ewma = *accept_ewma < 0 ? accepted : 0.7 * *accept_ewma + 0.3 * accepted;
  // Grow fast while every draft is accepted; otherwise aim a little past the
  // typical accepted run so that a longer run is not cut short.
  const int target = accepted == x ? 2 * std::max(1, x)
                                   : static_cast<int>(std::lround(*accept_ewma * 1.5)) + 1;
  return std::clamp(target, min_len, max_len);
}

void SpeculativeRequest::UpdateDraftLength(int accepted) {
  if (!options_.draft.adaptive) return;
  x_ = NextDraftLength(stats_.draft_lengths.back(), accepted, &accept_ewma_,
                       options_.draft.min_draft_len, options_.draft.max_draft_len);
}

bool SpeculativeRequest::ShouldFallBack() const { return fallback_.ShouldFallBack(); }

absl::StatusOr<BatchResult> RunBatch(Engine& engine,
                                     std::span<const std::unique_ptr<SpeculativeRequest>> requests,
                                     const std::function<void()>& after_step) {
  return RunBatch(engine, nullptr, requests, after_step);
}

absl::StatusOr<BatchResult> RunBatch(Engine& engine, Engine* draft_engine,
                                     std::span<const std::unique_ptr<SpeculativeRequest>> requests,
                                     const std::function<void()>& after_step) {
  if (draft_engine != nullptr &&
      draft_engine->config().vocab_size != engine.config().vocab_size) {
    return absl::InvalidArgumentError("the draft engine's vocabulary differs from the target's");
  }
  const ModelConfig& t = engine.config();
  for (const auto& r : requests) {
    const ModelConfig* dm = r->options().draft_model;
    if (dm != nullptr && (draft_engine == nullptr || &draft_engine->config() != dm)) {
      return absl::InvalidArgumentError(
          "a request with a separate draft model needs a draft engine that runs that model");
    }
    if (dm == nullptr && draft_engine != nullptr && r->options().mode == DecodeMode::kVeriCache) {
      const ModelConfig& d = draft_engine->config();
      if (d.n_layers != t.n_layers || d.n_kv_heads != t.n_kv_heads || d.head_dim != t.head_dim) {
        return absl::InvalidArgumentError(
            "the draft engine's KV shape differs from the target's, and a request without a "
            "separate draft model drafts over the target's KV");
      }
    }
  }
  // Phases whose passes run the drafter's model.
  auto on_drafter = [&](const SpeculativeRequest& r) {
    return draft_engine != nullptr && (r.phase() == SpeculativeRequest::Phase::kDraft ||
                                       r.phase() == SpeculativeRequest::Phase::kDraftPrefill);
  };
  // Between passes the target engine's pool is idle: the requests may use
  // it for their own work (compressing a prompt's KV); only while this
  // RunBatch drives them, so no request keeps a pool it may outlive.
  struct LentPool {
    std::span<const std::unique_ptr<SpeculativeRequest>> requests;
    ~LentPool() {
      for (const auto& r : requests) r->set_work_pool(nullptr);
    }
  } lent{requests};
  for (const auto& r : requests) r->set_work_pool(&engine.backend().pool());
  BatchResult result;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t vocab = engine.config().vocab_size;
  std::vector<SequenceInput> inputs;
  std::vector<SpeculativeRequest*> owners;
  std::vector<float> logits;
  // Runs inputs[begin, end) (all for `e`) packed into Forward calls of at most
  // the engine's batch-token limit (a request that alone exceeds it fails in
  // Forward with a clear error).
  auto run = [&](Engine& e, size_t begin, size_t stop) -> absl::Status {
    while (begin < stop) {
      size_t end = begin;
      int64_t tokens = 0;
      while (end < stop &&
             (end == begin || tokens + static_cast<int64_t>(inputs[end].tokens.size()) <=
                                  e.max_batch_tokens())) {
        tokens += static_cast<int64_t>(inputs[end].tokens.size());
        ++end;
      }
      VC_RETURN_IF_ERROR(e.Forward({inputs.data() + begin, end - begin}, &logits));
      ++result.forward_calls;
      size_t offset = 0;
      for (size_t i = begin; i < end; ++i) {
        const size_t rows = inputs[i].tokens.size() - static_cast<size_t>(inputs[i].first_logit);
        VC_RETURN_IF_ERROR(owners[i]->OnLogits(
            std::span<const float>(logits).subspan(offset, rows * vocab)));
        offset += rows * vocab;
      }
      if (after_step) after_step();
      begin = end;
    }
    return absl::OkStatus();
  };
  for (;;) {
    // Every unfinished request advances one step of its phase; with a draft
    // engine the drafting requests come first, as their own group.
    inputs.clear();
    owners.clear();
    size_t drafting = 0;
    for (const auto& r : requests) {
      if (!r->done() && on_drafter(*r)) {
        inputs.push_back(r->NextInput());
        owners.push_back(r.get());
        ++drafting;
      }
    }
    for (const auto& r : requests) {
      if (!r->done() && !on_drafter(*r)) {
        inputs.push_back(r->NextInput());
        owners.push_back(r.get());
      }
    }
    if (inputs.empty()) break;
    if (drafting > 0) VC_RETURN_IF_ERROR(run(*draft_engine, 0, drafting));
    VC_RETURN_IF_ERROR(run(engine, drafting, inputs.size()));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace vc
