// The draft/verify protocol (DESIGN.md section 3) split across two machines:
// a VerifySession lives on a verifier worker, a DraftSession on a drafter
// worker, and the coordinator carries tokens and exact K/V rows between them.
// SpeculativeRequest (common/speculative) runs the same protocol in one
// process; this split form is what the daemons run.
//
// Positions. The prompt P has n tokens; its first L (the stored prefix, a
// whole number of chunks, L <= n - 1) come from the KV store; the rest, the
// suffix P[L:n], is computed by the workers. Both sessions keep the tokens at
// positions [L, ...) themselves.
//
// Verifier. The exact K/V of positions [L, committed) live in the session's
// tail; the prefix's full K/V [0, L) is attached only while a pass runs (it is
// reloaded from the store for each verify, or shared by the requests of one
// prefix-aware batch, or kept resident for plain full-KV decoding). The
// unverified tokens U (the suffix in the first round, then the pending token
// p) are run together with drafts d1..dx in one pass; d_i is accepted while it
// equals the verifier's own choice t_i* at its position; the pass emits
// d1..dj and t_(j+1)* (correction or bonus), keeps the K/V of [U, d1..dj] and
// returns those rows for KV refresh.
//
// Drafter. Attends over a prefix view (compressed for vericache/lossy, full
// for full_remote) plus an exact-precision tail, drafts ahead of the verified
// sequence up to a lookahead (x plus speculative continuation), and on Commit
// keeps the drafts that agree with the verified tokens (all of the next
// window survives when every draft and the bonus matched), rolls back the
// rest, and overwrites (or extends) its tail with the verifier's exact rows.
//
// Online update (DraftSessionOptions::online): the drafter folds settled
// positions of its exact tail into its compressed prefix by the compressor's
// online rule, after each Commit. Settled: with KV refresh, the rows the
// verifier's exact K/V overwrote; without, the verified rows the drafter
// computed itself (their tokens are all verified, so nothing rolls them
// back). Drafts past the verified end are never settled.
//
// Token choice is SampleToken/Argmax at the token's absolute position, as in
// full-KV decoding, so greedy and seeded sampling are bit-identical to it.
// Rejection sampling (distribution-identical, not bit-identical): the
// drafter draws each draft from its own filtered distribution q and keeps q
// with the draft; the verifier receives q with the drafts and accepts d with
// probability min(1, p(d) / q(d)), else draws from the residual (p - q)+.
// Both use the position-keyed streams of DrawRejectionDraft /
// JudgeRejectionDraft, so the split makes the decisions one process would.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compress/attention_stats.h"
#include "common/compress/compressor.h"
#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/kv/compressed_kv.h"
#include "common/kv/kv_arena.h"
#include "common/sampling/sampler.h"
#include "common/speculative/draft_verify.h"

namespace vc::cluster {

// A sequence's KV made of a shared, read-only full prefix [0, L) and the
// sequence's own exact tail [L, ...). Attention over it is bit-identical to
// attention over one PagedKvCache holding both (per-key scores are
// independent; value mixing continues the same FMA chain across the split).
class PrefixTailKv final : public SequenceKv {
 public:
  // `prefix` may be null when prefix_len == 0. The tail is charged to `arena`.
  PrefixTailKv(const ModelConfig& config, std::shared_ptr<const PagedKvCache> prefix,
               int32_t prefix_len, int32_t max_tokens = 0, KvArena* arena = nullptr);

  int32_t next_position() const override { return tail_.next_position(); }
  absl::Status Append(int32_t count) override { return tail_.Append(count); }
  void Truncate(int32_t length) override { tail_.Truncate(length); }
  void Write(int layer, int32_t pos, const float* k, const float* v) override {
    tail_.Write(layer, pos, k, v);
  }
  KeyRange Keys(int layer, int kv_head, int32_t min_pos, int32_t max_pos) const override;
  void Scores(const kernels::KernelBackend& backend, int layer, int kv_head, KeyRange range,
              const float* q, float scale, float* scores) const override;
  void MixValues(const kernels::KernelBackend& backend, int layer, int kv_head, KeyRange range,
                 const float* p, float* out) const override;
  // Split like Scores / MixValues, so both parts read each key once for all
  // the queries of a multi-token verify pass.
  void ScoresBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                   const QueryBatch& batch, float scale) const override;
  void MixValuesBatch(const kernels::KernelBackend& backend, int layer, int kv_head,
                      const QueryBatch& batch, float* out) const override;

  // Swaps the prefix (the verifier attaches it for a pass and drops it after).
  void set_prefix(std::shared_ptr<const PagedKvCache> prefix) { prefix_ = std::move(prefix); }
  bool has_prefix() const { return prefix_len_ == 0 || prefix_ != nullptr; }
  int32_t prefix_len() const { return prefix_len_; }
  PagedKvCache& tail() { return tail_; }
  const PagedKvCache& tail() const { return tail_; }

 private:
  void ForEachPart(const QueryBatch& b,
                   absl::FunctionRef<void(const PagedKvCache&, const QueryBatch&)> fn) const;

  std::shared_ptr<const PagedKvCache> prefix_;
  int32_t prefix_len_;
  PagedKvCache tail_;
};

struct SessionSampling {
  SamplingMode mode = SamplingMode::kGreedy;
  SamplingParams params;
  // InvalidArgument for bad parameters, or seeded/rejection without a
  // temperature > 0.
  absl::Status Validate() const;
  // The token full-KV decoding picks from `logits` at absolute `position`
  // (rejection sampling's full-KV form is plain seeded sampling).
  int32_t Choose(std::span<const float> logits, int64_t position) const;
};

// ---------------------------------------------------------------- verifier

struct VerifySessionOptions {
  SessionSampling sampling;
  KvArena* tail_arena = nullptr;  // charged for the exact tail
};

struct VerifyOutcome {
  int32_t accepted = 0;         // j
  std::vector<int32_t> tokens;  // d1..dj, then the correction or bonus token
  int32_t refresh_first = 0;    // positions whose exact K/V the pass kept
  int32_t refresh_count = 0;
};

class VerifySession {
 public:
  // InvalidArgument for an empty prompt, prefix_len outside [0, n - 1], ids
  // outside the vocabulary, or a prompt longer than the context.
  static absl::StatusOr<std::unique_ptr<VerifySession>> Create(const ModelConfig& config,
                                                               std::vector<int32_t> prompt,
                                                               int32_t prefix_len,
                                                               const VerifySessionOptions& options);

  // The prefix's full K/V for the next pass(es); must hold exactly [0, L).
  absl::Status AttachPrefix(std::shared_ptr<const PagedKvCache> prefix);
  void DetachPrefix() { kv_.set_prefix(nullptr); }
  bool has_prefix() const { return kv_.has_prefix(); }

  // The pass input for [U, drafts] (drafts may be empty: one full-KV decode
  // step). Rejection sampling needs `draft_probs`: the distribution each
  // draft was drawn from (vocab_size entries each, normalised here).
  // FailedPrecondition
  // without an attached prefix or with a pass in flight; InvalidArgument for
  // ids outside the vocabulary or missing/malformed distributions (negative,
  // not finite, or zero at the draft); OutOfRange past the context. The
  // returned input points into the session.
  absl::StatusOr<SequenceInput> BeginPass(std::span<const int32_t> drafts,
                                          std::span<const std::vector<double>> draft_probs = {});
  // Consumes the pass's logit rows (|drafts| + 1 rows, in order).
  absl::StatusOr<VerifyOutcome> FinishPass(std::span<const float> rows);
  // Rolls back a pass whose Forward failed.
  void AbortPass();

  // Encodes the exact K/V of positions [first, first + count) in the chunk
  // wire format (common/kvstore/chunk_codec.h).
  absl::StatusOr<std::string> EncodeRows(int32_t first, int32_t count) const;

  int32_t prefix_len() const { return kv_.prefix_len(); }
  int32_t prompt_len() const { return static_cast<int32_t>(prompt_.size()); }
  // Positions with exact K/V (one past the last).
  int32_t committed() const { return kv_.next_position(); }
  const std::vector<int32_t>& unverified() const { return unverified_; }
  int64_t tail_bytes() const { return kv_.tail().bytes(); }

 private:
  VerifySession(const ModelConfig& config, std::vector<int32_t> prompt, int32_t prefix_len,
                const VerifySessionOptions& options);

  const ModelConfig& config_;
  std::vector<int32_t> prompt_;
  VerifySessionOptions options_;
  PrefixTailKv kv_;
  std::vector<int32_t> unverified_;  // U: tokens at [committed, ...) not yet run
  std::vector<int32_t> pass_input_;  // [U, drafts] of the pass in flight
  std::vector<std::vector<double>> pass_probs_;  // rejection sampling: q of each draft
  bool in_pass_ = false;
};

// Runs one verify pass for several sessions in a single Forward call (their
// prefixes must be attached). Results are per session, in order; a session
// whose input is invalid fails alone, the others still run. `draft_probs`
// is empty, or holds each session's draft distributions (rejection
// sampling; an empty entry for a session that does not use it).
std::vector<absl::StatusOr<VerifyOutcome>> RunVerifyPass(
    Engine& engine, std::span<VerifySession* const> sessions,
    std::span<const std::vector<int32_t>> drafts,
    std::span<const std::vector<std::vector<double>>> draft_probs = {});

// ----------------------------------------------------------------- drafter

// Online compressor update of the drafter's compressed view.
struct DraftOnlineOptions {
  // The compressor the view's prefix was made with (its Describe() must
  // equal the prefix's description, so the online rule continues the same
  // method and parameters); it must have an online rule. Null: off.
  std::shared_ptr<const Compressor> compressor;
  // Charged for the folded prefixes (the first prefix is charged by whoever
  // made the view). Null: not accounted.
  KvArena* arena = nullptr;
};

struct DraftSessionOptions {
  SessionSampling sampling;
  // Drafts never land at positions >= end_position (prompt + max new tokens);
  // 0: the context length.
  int32_t end_position = 0;
  int lookahead = 8;  // drafts kept ready beyond the verified sequence
  DraftOnlineOptions online;
};

struct CommitOutcome {
  int32_t surviving_drafts = 0;  // drafts kept past the committed tokens
  int32_t rolled_back = 0;       // drafts thrown away
  int32_t refreshed_rows = 0;    // rows overwritten or appended from the refresh
  bool folded = false;           // online update folded settled rows into the prefix
};

class DraftSession {
 public:
  // `kv` holds the prefix view [0, prefix_len) and nothing else yet.
  // InvalidArgument also for online update on a view that is not a
  // CompressedSequenceKv (full_remote, or no stored prefix), a compressor
  // without an online rule, or one other than the view's.
  static absl::StatusOr<std::unique_ptr<DraftSession>> Create(const ModelConfig& config,
                                                              std::vector<int32_t> prompt,
                                                              std::unique_ptr<SequenceKv> kv,
                                                              int32_t prefix_len,
                                                              const DraftSessionOptions& options);

  // True when a draft step would add a draft (below the lookahead and the
  // end position).
  bool wants_step() const;
  // The next step's input: every known token not yet in the KV, logits for
  // the last one. Only when wants_step().
  SequenceInput BeginStep();
  absl::Status FinishStep(std::span<const float> last_row);
  void AbortStep();

  // Drafts after the verified sequence, and the position of the first.
  std::span<const int32_t> drafts() const;
  // Rejection sampling: the distribution each of drafts() was drawn from
  // (same order and count); empty in the other modes.
  std::span<const std::vector<double>> draft_probs() const { return draft_probs_; }
  int32_t verified_end() const { return verified_end_; }
  void set_lookahead(int lookahead) { options_.lookahead = lookahead; }
  int lookahead() const { return options_.lookahead; }

  // Extends the verified sequence by `tokens` (the verifier's accepted drafts
  // and its correction/bonus token). `refresh` (may be empty) is the exact
  // K/V of consecutive verified positions in the chunk wire format.
  // With online update, then settles and folds (see the top comment); a
  // refresh reaching below the settled length is FailedPrecondition (send
  // the refresh with every commit or with none). A failed fold (e.g. the
  // arena is full) is returned after the tokens were committed: the view is
  // unchanged and the session stays usable.
  absl::StatusOr<CommitOutcome> Commit(std::span<const int32_t> tokens, const std::string& refresh);

  int32_t prefix_len() const { return prefix_len_; }
  int32_t kv_next_position() const { return kv_->next_position(); }
  SequenceKv& kv() { return *kv_; }
  // The compressed view (null for a PrefixTailKv).
  const CompressedSequenceKv* compressed_view() const { return compressed_; }
  // Bytes the drafter's KV holds for this session: the compressed prefix
  // plus the exact tail, or the tail alone over a shared full prefix.
  int64_t kv_bytes() const;
  bool online_update() const { return options_.online.compressor != nullptr; }
  int64_t online_folds() const { return online_folds_; }

 private:
  DraftSession(const ModelConfig& config, std::vector<int32_t> prompt,
               std::unique_ptr<SequenceKv> kv, int32_t prefix_len,
               const DraftSessionOptions& options);
  absl::Status CheckRefresh(const std::string& refresh, int32_t verified_end) const;
  // Rows written, and the first of them.
  absl::StatusOr<int32_t> ApplyRefresh(const std::string& refresh, int32_t* first);
  absl::Status SettleAndFold(int32_t settle_to, CommitOutcome* out);
  int32_t known_end() const { return prefix_len_ + static_cast<int32_t>(seq_.size()); }

  const ModelConfig& config_;
  std::unique_ptr<SequenceKv> kv_;
  int32_t prefix_len_;
  DraftSessionOptions options_;
  // Tokens at positions [L, ...): prompt suffix, verified output, then drafts.
  std::vector<int32_t> seq_;
  std::vector<std::vector<double>> draft_probs_;  // rejection sampling, parallel to drafts()
  int32_t verified_end_;  // absolute position one past the verified tokens
  std::vector<int32_t> step_input_;
  bool in_step_ = false;
  // Online update.
  CompressedSequenceKv* compressed_ = nullptr;  // kv_ when it is one
  OnlinePolicy online_policy_;
  // H2O/TOVA rank by the drafter's decode-time attention. There are no
  // prefill statistics on a drafter (the variant was made at ingest), so the
  // sums start empty: the first folds rank the prefix's kept tokens only by
  // the attention the suffix and the drafts gave them.
  std::unique_ptr<DecodeAttentionStats> decode_stats_;
  KvArena::Reservation prefix_reservation_;  // folded prefixes' bytes
  int64_t online_folds_ = 0;
};

}  // namespace vc::cluster
