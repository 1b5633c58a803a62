#include "common/cluster/remote_session.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvstore/chunk_codec.h"
#include "common/speculative/accept_rule.h"

namespace vc::cluster {
namespace {

absl::Status CheckIds(const ModelConfig& config, std::span<const int32_t> ids, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(what, " token ", i, " has id ", ids[i],
                                                     ", outside the vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// Rejection sampling judges draft d by p(d) / q(d): q must be a distribution
// over the vocabulary that could have produced d.
absl::Status CheckDraftProbs(const ModelConfig& config, std::span<const int32_t> drafts,
                             std::span<const std::vector<double>> probs) {
  if (probs.size() != drafts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rejection sampling needs one draft distribution per draft: ",
                                                   drafts.size(), " drafts, ", probs.size(),
                                                   " distributions"));
  }
  for (size_t i = 0; i < probs.size(); ++i) {
    if (static_cast<int64_t>(probs[i].size()) != config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("draft distribution ", i, " has ",
                                                     probs[i].size(), " entries, expected ",
                                                     config.vocab_size));
    }
    for (double q : probs[i]) {
      if (!std::isfinite(q) || q < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("draft distribution ", i, " has a negative or non-finite entry"));
      }
    }
    if (!(probs[i][static_cast<size_t>(drafts[i])] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "draft ", i, " (token ", drafts[i], ") has probability 0 in its own distribution"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ------------------------------------------------------------- PrefixTailKv

PrefixTailKv::PrefixTailKv(const ModelConfig& config, std::shared_ptr<const PagedKvCache> prefix,
                           int32_t prefix_len, int32_t max_tokens, KvArena* arena)
    : prefix_(std::move(prefix)),
      prefix_len_(prefix_len),
      tail_(config, PagedKvCache::Options{.block_tokens = 16,
                                          .max_tokens = max_tokens,
                                          .first_position = prefix_len,
                                          .arena = arena}) {}

// Stored index = absolute position: [0, L) in the prefix, [L, ...) in the tail.
SequenceKv::KeyRange PrefixTailKv::Keys(int /*layer*/, int /*kv_head*/, int32_t min_pos,
                                        int32_t max_pos) const {
  const int32_t first = std::max(0, min_pos);
  const int32_t last = std::min(max_pos, next_position() - 1);
  return {first, std::max(0, last - first + 1)};
}

void PrefixTailKv::Scores(const kernels::KernelBackend& backend, int layer, int kv_head,
                          KeyRange range, const float* q, float scale, float* scores) const {
  const int64_t in_prefix = std::clamp<int64_t>(prefix_len_ - range.first, 0, range.count);
  if (in_prefix > 0) {
    VC_CHECK(prefix_ != nullptr, "attention over a detached prefix");
    prefix_->Scores(backend, layer, kv_head, {range.first, in_prefix}, q, scale, scores);
  }
  if (range.count > in_prefix) {
    tail_.Scores(backend, layer, kv_head,
                 {range.first + in_prefix - prefix_len_, range.count - in_prefix}, q, scale,
                 scores + in_prefix);
  }
}

void PrefixTailKv::MixValues(const kernels::KernelBackend& backend, int layer, int kv_head,
                             KeyRange range, const float* p, float* out) const {
  const int64_t in_prefix = std::clamp<int64_t>(prefix_len_ - range.first, 0, range.count);
  if (in_prefix > 0) {
    VC_CHECK(prefix_ != nullptr, "attention over a detached prefix");
    prefix_->MixValues(backend, layer, kv_head, {range.first, in_prefix}, p, out);
  }
  if (range.count > in_prefix) {
    tail_.MixValues(backend, layer, kv_head,
                    {range.first + in_prefix - prefix_len_, range.count - in_prefix},
                    p + in_prefix, out);
  }
}

// The batch cut at the prefix boundary: fn runs on the prefix's part (same
// stored indices, same base) when a query reads the prefix, then on the
// tail's (indices and base shifted by L), so every query's keys stay in
// order across the split.
void PrefixTailKv::ForEachPart(
    const QueryBatch& b, absl::FunctionRef<void(const PagedKvCache&, const QueryBatch&)> fn) const {
  thread_local std::vector<KeyRange> ranges;
  ranges.resize(2 * b.count);
  bool reads_prefix = false;
  for (int64_t t = 0; t < b.count; ++t) {
    const KeyRange& r = b.ranges[t];
    const int64_t in_prefix = std::clamp<int64_t>(prefix_len_ - r.first, 0, r.count);
    ranges[t] = {r.first, in_prefix};
    reads_prefix = reads_prefix || in_prefix > 0;
    ranges[b.count + t] = r.count > in_prefix
                              ? KeyRange{r.first + in_prefix - prefix_len_, r.count - in_prefix}
                              : KeyRange{0, 0};
  }
  QueryBatch part = b;
  if (reads_prefix) {
    VC_CHECK(prefix_ != nullptr, "attention over a detached prefix");
    part.ranges = ranges.data();
    fn(*prefix_, part);
  }
  part.ranges = ranges.data() + b.count;
  part.base = b.base - prefix_len_;
  fn(tail_, part);
}

void PrefixTailKv::ScoresBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                               const QueryBatch& b, float scale) const {
  ForEachPart(b, [&](const PagedKvCache& kv, const QueryBatch& part) {
    kv.ScoresBatch(backend, layer, kv_head, part, scale);
  });
}

void PrefixTailKv::MixValuesBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                                  const QueryBatch& b, float* out) const {
  ForEachPart(b, [&](const PagedKvCache& kv, const QueryBatch& part) {
    kv.MixValuesBatch(backend, layer, kv_head, part, out);
  });
}

// ----------------------------------------------------------- SessionSampling

absl::Status SessionSampling::Validate() const {
  if (mode == SamplingMode::kGreedy) return absl::OkStatus();
  VC_RETURN_IF_ERROR(params.Validate());
  if (params.temperature <= 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        mode == SamplingMode::kSeeded ? "seeded" : "rejection",
        " sampling needs a temperature > 0"));
  }
  return absl::OkStatus();
}

int32_t SessionSampling::Choose(std::span<const float> logits, int64_t position) const {
  if (mode == SamplingMode::kGreedy) return Argmax(logits);
  return SampleToken(logits, params, position);
}

// ------------------------------------------------------------- VerifySession

VerifySession::VerifySession(const ModelConfig& config, std::vector<int32_t> prompt,
                             int32_t prefix_len, const VerifySessionOptions& options)
    : config_(config),
      prompt_(std::move(prompt)),
      options_(options),
      kv_(config, nullptr, prefix_len, 0, options.tail_arena),
      unverified_(prompt_.begin() + prefix_len, prompt_.end()) {}

absl::StatusOr<std::unique_ptr<VerifySession>> VerifySession::Create(
    const ModelConfig& config, std::vector<int32_t> prompt, int32_t prefix_len,
    const VerifySessionOptions& options) {
  const int32_t n = static_cast<int32_t>(prompt.size());
  if (n == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (n > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", n,
                                                   " tokens, more than the context length ",
                                                   config.max_seq_len));
  }
  if (prefix_len < 0 || prefix_len > n - 1) {
    return absl::InvalidArgumentError(absl::StrCat("stored prefix of ", prefix_len,
                                                   " tokens must be in [0, ", n - 1, "]"));
  }
  VC_RETURN_IF_ERROR(CheckIds(config, prompt, "prompt"));
  VC_RETURN_IF_ERROR(options.sampling.Validate());
  return std::unique_ptr<VerifySession>(
      new VerifySession(config, std::move(prompt), prefix_len, options));
}

absl::Status VerifySession::AttachPrefix(std::shared_ptr<const PagedKvCache> prefix) {
  if (prefix == nullptr || prefix->first_position() != 0 ||
      prefix->next_position() != kv_.prefix_len()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix KV must hold exactly positions [0, ", kv_.prefix_len(), "), got [",
        prefix ? prefix->first_position() : 0, ", ", prefix ? prefix->next_position() : 0, ")"));
  }
  kv_.set_prefix(std::move(prefix));
  return absl::OkStatus();
}

absl::StatusOr<SequenceInput> VerifySession::BeginPass(
    std::span<const int32_t> drafts, std::span<const std::vector<double>> draft_probs) {
  if (in_pass_) return absl::FailedPreconditionError("a verify pass is already in flight");
  if (!kv_.has_prefix()) {
    return absl::FailedPreconditionError("the prefix KV is not loaded for this verify");
  }
  VC_RETURN_IF_ERROR(CheckIds(config_, drafts, "draft"));
  if (options_.sampling.mode == SamplingMode::kRejection) {
    VC_RETURN_IF_ERROR(CheckDraftProbs(config_, drafts, draft_probs));
    // The acceptance rule compares p(d) with q(d) as probabilities; a draw
    // by Gumbel-max does not depend on the scale of q, so normalising here
    // judges the draft by the distribution it was really drawn from.
    pass_probs_.assign(draft_probs.begin(), draft_probs.end());
    for (std::vector<double>& q : pass_probs_) {
      double sum = 0;
      for (double v : q) sum += v;
      for (double& v : q) v /= sum;
    }
  } else if (!draft_probs.empty()) {
    return absl::InvalidArgumentError("draft distributions are only for rejection sampling");
  }
  const int64_t end = int64_t{committed()} + static_cast<int64_t>(unverified_.size()) +
                      static_cast<int64_t>(drafts.size());
  if (end > config_.max_seq_len) {
    return absl::OutOfRangeError(absl::StrCat("verify pass would reach position ", end,
                                              ", past the context length ", config_.max_seq_len));
  }
  pass_input_ = unverified_;
  pass_input_.insert(pass_input_.end(), drafts.begin(), drafts.end());
  in_pass_ = true;
  SequenceInput in;
  in.kv = &kv_;
  in.tokens = pass_input_;
  in.first_logit = static_cast<int64_t>(unverified_.size()) - 1;
  return in;
}

void VerifySession::AbortPass() {
  // Engine::Forward validates before touching any KV: nothing to undo.
  in_pass_ = false;
}

absl::StatusOr<VerifyOutcome> VerifySession::FinishPass(std::span<const float> rows) {
  if (!in_pass_) return absl::FailedPreconditionError("no verify pass in flight");
  in_pass_ = false;
  const int32_t u = static_cast<int32_t>(unverified_.size());
  const int32_t k = static_cast<int32_t>(pass_input_.size()) - u;
  const int64_t vocab = config_.vocab_size;
  if (static_cast<int64_t>(rows.size()) != int64_t{k + 1} * vocab) {
    return absl::InternalError(absl::StrCat("verify pass returned ", rows.size() / vocab,
                                            " logit rows, expected ", k + 1));
  }
  // The pass appended [U, drafts]; positions start at `base`.
  const int32_t base = kv_.next_position() - static_cast<int32_t>(pass_input_.size());
  AcceptInputs judge;
  judge.rows = rows;
  judge.vocab = vocab;
  judge.drafts = std::span<const int32_t>(pass_input_).subspan(static_cast<size_t>(u));
  judge.first_position = int64_t{base} + u;
  judge.choose = [this](std::span<const float> row, int64_t position) {
    return options_.sampling.Choose(row, position);
  };
  judge.rejection = options_.sampling.mode == SamplingMode::kRejection;
  judge.rejection_params = options_.sampling.params;
  judge.draft_probs = pass_probs_;
  const AcceptDecision decision = AcceptDrafts(judge);
  VerifyOutcome out;
  out.accepted = decision.accepted;
  out.tokens.assign(judge.drafts.begin(), judge.drafts.begin() + decision.accepted);
  out.tokens.push_back(decision.next);
  const int32_t next = decision.next;
  // Keep the exact K/V of [U, d1..dj]; the rejected drafts' rows go.
  const int32_t keep = base + u + out.accepted;
  kv_.Truncate(keep);
  out.refresh_first = base;
  out.refresh_count = keep - base;
  unverified_.assign(1, next);
  pass_probs_.clear();
  return out;
}

absl::StatusOr<std::string> VerifySession::EncodeRows(int32_t first, int32_t count) const {
  return kvstore::EncodeChunk(kv_.tail(), first, count);
}

std::vector<absl::StatusOr<VerifyOutcome>> RunVerifyPass(
    Engine& engine, std::span<VerifySession* const> sessions,
    std::span<const std::vector<int32_t>> drafts,
    std::span<const std::vector<std::vector<double>>> draft_probs) {
  std::vector<absl::StatusOr<VerifyOutcome>> results(sessions.size(),
                                                     absl::InternalError("not run"));
  if (!draft_probs.empty() && draft_probs.size() != sessions.size()) {
    for (auto& r : results) {
      r = absl::InvalidArgumentError("draft distributions must be given for every session or none");
    }
    return results;
  }
  std::vector<SequenceInput> batch;
  std::vector<size_t> member;  // batch entry -> session index
  for (size_t i = 0; i < sessions.size(); ++i) {
    absl::StatusOr<SequenceInput> in =
        draft_probs.empty() ? sessions[i]->BeginPass(drafts[i])
                            : sessions[i]->BeginPass(drafts[i], draft_probs[i]);
    if (!in.ok()) {
      results[i] = in.status();
      continue;
    }
    batch.push_back(*in);
    member.push_back(i);
  }
  if (batch.empty()) return results;
  std::vector<float> logits;
  if (absl::Status s = engine.Forward(batch, &logits); !s.ok()) {
    // Forward validates before touching any KV, so nothing to roll back.
    for (size_t b = 0; b < member.size(); ++b) {
      sessions[member[b]]->AbortPass();
      results[member[b]] = s;
    }
    return results;
  }
  const int64_t vocab = engine.config().vocab_size;
  int64_t row = 0;
  for (size_t b = 0; b < member.size(); ++b) {
    const int64_t rows = static_cast<int64_t>(batch[b].tokens.size()) - batch[b].first_logit;
    results[member[b]] = sessions[member[b]]->FinishPass(
        std::span<const float>(logits).subspan(row * vocab, rows * vocab));
    row += rows;
  }
  return results;
}

// -------------------------------------------------------------- DraftSession

DraftSession::DraftSession(const ModelConfig& config, std::vector<int32_t> prompt,
                           std::unique_ptr<SequenceKv> kv, int32_t prefix_len,
                           const DraftSessionOptions& options)
    : config_(config),
      kv_(std::move(kv)),
      prefix_len_(prefix_len),
      options_(options),
      seq_(prompt.begin() + prefix_len, prompt.end()),
      verified_end_(static_cast<int32_t>(prompt.size())) {
  if (options_.end_position <= 0 || options_.end_position > config.max_seq_len) {
    options_.end_position = config.max_seq_len;
  }
  if (options_.online.compressor != nullptr) {
    compressed_ = dynamic_cast<CompressedSequenceKv*>(kv_.get());
    online_policy_ = options_.online.compressor->online_policy();
    if (online_policy_.needs_decode_stats) {
      // Keys never reach end_position: sized by it rather than the context.
      decode_stats_ =
          std::make_unique<DecodeAttentionStats>(config, options_.end_position, nullptr);
      decode_stats_->SetView(compressed_);
    }
  }
}

absl::StatusOr<std::unique_ptr<DraftSession>> DraftSession::Create(
    const ModelConfig& config, std::vector<int32_t> prompt, std::unique_ptr<SequenceKv> kv,
    int32_t prefix_len, const DraftSessionOptions& options) {
  const int32_t n = static_cast<int32_t>(prompt.size());
  if (n == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (n > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", n,
                                                   " tokens, more than the context length ",
                                                   config.max_seq_len));
  }
  if (prefix_len < 0 || prefix_len > n - 1) {
    return absl::InvalidArgumentError(absl::StrCat("stored prefix of ", prefix_len,
                                                   " tokens must be in [0, ", n - 1, "]"));
  }
  if (kv == nullptr || kv->next_position() != prefix_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("the drafter's KV must hold exactly the prefix [0, ", prefix_len, ")"));
  }
  if (options.lookahead < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lookahead must be >= 1, got ", options.lookahead));
  }
  VC_RETURN_IF_ERROR(CheckIds(config, prompt, "prompt"));
  VC_RETURN_IF_ERROR(options.sampling.Validate());
  if (const Compressor* c = options.online.compressor.get(); c != nullptr) {
    const auto* view = dynamic_cast<const CompressedSequenceKv*>(kv.get());
    if (view == nullptr) {
      return absl::InvalidArgumentError(
          "online update folds into a compressed view, and this drafter's KV is not one "
          "(full_remote, or a prompt without a stored prefix)");
    }
    if (c->online_policy().kind == OnlinePolicy::Kind::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("online update: ", c->info().name,
                       " has no online rule (its published rule compresses once after prefill)"));
    }
    // The online rule must continue the method (and parameters) the stored
    // variant was made with.
    if (c->Describe() != view->prefix().description()) {
      return absl::InvalidArgumentError(
          absl::StrCat("online update: the compressor ", c->Describe(),
                       " is not the one the drafter's compressed prefix was made with (",
                       view->prefix().description(), ")"));
    }
  }
  return std::unique_ptr<DraftSession>(
      new DraftSession(config, std::move(prompt), std::move(kv), prefix_len, options));
}

std::span<const int32_t> DraftSession::drafts() const {
  return std::span<const int32_t>(seq_).subspan(verified_end_ - prefix_len_);
}

bool DraftSession::wants_step() const {
  return !in_step_ && static_cast<int64_t>(drafts().size()) < options_.lookahead &&
         known_end() < options_.end_position;
}

SequenceInput DraftSession::BeginStep() {
  VC_CHECK(wants_step(), "BeginStep without work");
  const int32_t from = kv_->next_position() - prefix_len_;
  step_input_.assign(seq_.begin() + from, seq_.end());
  in_step_ = true;
  SequenceInput in;
  in.kv = kv_.get();
  in.tokens = step_input_;
  in.first_logit = static_cast<int64_t>(step_input_.size()) - 1;
  if (decode_stats_ != nullptr) {
    decode_stats_->BeginPass(kv_->next_position() + static_cast<int32_t>(step_input_.size()) - 1);
    in.observer = decode_stats_.get();
  }
  return in;
}

int64_t DraftSession::kv_bytes() const {
  if (compressed_ != nullptr) return compressed_->bytes();
  if (const auto* c = dynamic_cast<const CompressedSequenceKv*>(kv_.get())) return c->bytes();
  if (const auto* p = dynamic_cast<const PrefixTailKv*>(kv_.get())) return p->tail().bytes();
  return 0;
}

absl::Status DraftSession::FinishStep(std::span<const float> last_row) {
  if (!in_step_) return absl::FailedPreconditionError("no draft step in flight");
  in_step_ = false;
  if (static_cast<int64_t>(last_row.size()) != config_.vocab_size) {
    return absl::InternalError("draft step returned a wrong number of logits");
  }
  if (options_.sampling.mode == SamplingMode::kRejection) {
    std::vector<double> q;
    seq_.push_back(DrawRejectionDraft(last_row, options_.sampling.params, known_end(), &q));
    draft_probs_.push_back(std::move(q));
  } else {
    seq_.push_back(options_.sampling.Choose(last_row, known_end()));
  }
  return absl::OkStatus();
}

void DraftSession::AbortStep() { in_step_ = false; }

absl::StatusOr<CommitOutcome> DraftSession::Commit(std::span<const int32_t> tokens,
                                                   const std::string& refresh) {
  if (in_step_) return absl::FailedPreconditionError("commit while a draft step is in flight");
  if (tokens.empty()) return absl::InvalidArgumentError("commit of no tokens");
  VC_RETURN_IF_ERROR(CheckIds(config_, tokens, "committed"));
  if (int64_t{verified_end_} + static_cast<int64_t>(tokens.size()) > options_.end_position) {
    return absl::OutOfRangeError(absl::StrCat("commit past the end position ",
                                              options_.end_position));
  }
  // Validate the refresh before changing anything: a bad one leaves the
  // session as it was.
  if (!refresh.empty()) {
    VC_RETURN_IF_ERROR(CheckRefresh(refresh, verified_end_ + static_cast<int32_t>(tokens.size())));
  }
  const std::span<const int32_t> d = drafts();
  size_t agree = 0;
  while (agree < tokens.size() && agree < d.size() && d[agree] == tokens[agree]) ++agree;
  CommitOutcome out;
  if (agree == tokens.size()) {
    out.surviving_drafts = static_cast<int32_t>(d.size() - agree);
    // The committed drafts' distributions are no longer needed.
    const size_t drop = std::min(agree, draft_probs_.size());
    draft_probs_.erase(draft_probs_.begin(), draft_probs_.begin() + static_cast<std::ptrdiff_t>(drop));
  } else {
    draft_probs_.clear();
    out.rolled_back = static_cast<int32_t>(d.size() - agree);
    // K/V rows depend on every token at or before their position: keep only
    // the positions whose tokens all agree with the verified sequence.
    const int32_t keep_tokens_end = verified_end_ + static_cast<int32_t>(agree);
    if (kv_->next_position() > keep_tokens_end) {
      kv_->Truncate(keep_tokens_end);
      // The rolled-back keys' attention sums restart with their new rows.
      if (decode_stats_ != nullptr) decode_stats_->DiscardFrom(keep_tokens_end);
    }
    seq_.resize(static_cast<size_t>(keep_tokens_end - prefix_len_));
    seq_.insert(seq_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(agree), tokens.end());
  }
  verified_end_ += static_cast<int32_t>(tokens.size());
  // Settled rows: with refresh, the ones the verifier's exact rows replaced
  // (the next refresh starts where this one ended); without, the drafter's
  // own rows of verified tokens. -1: nothing new.
  int32_t settle_to = -1;
  if (!refresh.empty()) {
    int32_t first = 0;
    VC_ASSIGN_OR_RETURN(out.refreshed_rows, ApplyRefresh(refresh, &first));
    if (out.refreshed_rows > 0) settle_to = first + out.refreshed_rows;
  } else {
    settle_to = std::min(kv_->next_position(), verified_end_);
  }
  if (compressed_ != nullptr && online_update()) VC_RETURN_IF_ERROR(SettleAndFold(settle_to, &out));
  return out;
}

absl::Status DraftSession::SettleAndFold(int32_t settle_to, CommitOutcome* out) {
  if (settle_to > compressed_->settled_length()) VC_RETURN_IF_ERROR(compressed_->Settle(settle_to));
  if (!ShouldFold(online_policy_, *compressed_)) return absl::OkStatus();
  VC_RETURN_IF_ERROR(FoldIntoView(*options_.online.compressor, config_,
                                  compressed_->settled_length(), decode_stats_.get(), compressed_,
                                  options_.online.arena, &prefix_reservation_));
  ++online_folds_;
  out->folded = true;
  return absl::OkStatus();
}

absl::Status DraftSession::CheckRefresh(const std::string& refresh, int32_t verified_end) const {
  VC_ASSIGN_OR_RETURN(const kvstore::ChunkHeader h, kvstore::VerifyChunk(refresh));
  if (static_cast<int>(h.layers) != config_.n_layers ||
      static_cast<int>(h.kv_heads) != config_.n_kv_heads ||
      static_cast<int>(h.head_dim) != config_.head_dim) {
    return absl::InvalidArgumentError("refresh rows have another model's shape");
  }
  if (static_cast<Dtype>(h.dtype) != config_.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("refresh rows are ", DtypeName(static_cast<Dtype>(h.dtype)),
                     ", the model's KV is ", DtypeName(config_.dtype)));
  }
  const int64_t end = int64_t{h.first_position} + h.tokens;
  if (h.first_position < prefix_len_ || end > verified_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refresh rows [", h.first_position, ", ", end,
        ") are not verified positions of this session (verified: [", prefix_len_, ", ",
        verified_end, "))"));
  }
  if (compressed_ != nullptr && online_update() &&
      h.first_position < compressed_->settled_length()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refresh rows start at ", h.first_position, ", below the drafter's settled length ",
        compressed_->settled_length(),
        " (rows there are final and may be folded into its compressed prefix): with online "
        "update, send the refresh with every commit or with none"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> DraftSession::ApplyRefresh(const std::string& refresh, int32_t* first_out) {
  VC_ASSIGN_OR_RETURN(const kvstore::ChunkHeader h, kvstore::VerifyChunk(refresh));
  const int32_t first = h.first_position;
  const int32_t count = static_cast<int32_t>(h.tokens);
  *first_out = first;
  // Rows overwrite positions already in the KV and extend it when they start
  // at or before its end; rows past the end (a gap) are left to be drafted.
  if (first > kv_->next_position()) return 0;
  const int32_t end = first + count;
  if (end > kv_->next_position()) VC_RETURN_IF_ERROR(kv_->Append(end - kv_->next_position()));
  // The chunk's own dtype (CheckRefresh refused one other than the model's).
  kvstore::ForEachChunkRow(refresh, h,
                           [&](int layer, int32_t position, const float* k, const float* v) {
                             kv_->Write(layer, position, k, v);
                           });
  return end - first;
}

}  // namespace vc::cluster
