// The lossless draft/verify protocol for one request (DESIGN.md section 3),
// as a state machine that a batcher can interleave with other requests.
//
// S is the accepted sequence (prompt + accepted output) and p the pending
// token: the last token the verifier produced, not yet run through either
// model. Each round the drafter, attending over the compressed prompt KV plus
// the exact tail of generated tokens, feeds p and drafts d1..dx; the verifier
// runs [p, d1..dx] in one pass over the full KV (x+1 logit rows) and accepts
// d1..d(j-1) up to the first draft that differs from its own choice; that
// choice (or the bonus token if all x matched) becomes the new p. The
// verifier keeps the exact K/V of the accepted tokens; the drafter rolls back
// its rejected suffix and, with KV refresh, overwrites its K/V of accepted
// tokens with the verifier's exact rows. With online update the drafter
// then folds settled tokens (accepted, and refreshed when refresh is on)
// into its compressed prefix by the compressor's online rule; rows still
// open to rollback or refresh never are.
//
// With a separate draft model (RequestOptions::draft_model: another model
// with the same vocabulary) the drafter keeps KV of its own model: after the
// target's prefill it prefills the prompt with the draft model, compresses
// that KV with the request's compressor (or keeps it exact without one), and
// drafts from it. There is no KV
// refresh (the verifier's rows belong to another model): after each verify
// the drafter rolls back its rejected rows and runs the accepted tokens and
// p through the draft model in its next step.
//
// Output equals full-KV decoding exactly for greedy and seeded sampling
// (same logits, same keyed noise at the same positions), and is
// distribution-identical for rejection sampling: only the target's logits
// on full KV decide tokens, whatever the drafter runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compress/compressor.h"
#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/kv/compressed_kv.h"
#include "common/model/model.h"
#include "common/sampling/sampler.h"
#include "common/speculative/accept_rule.h"

namespace vc {

enum class DecodeMode {
  kFull,       // plain full-KV decoding (the baseline)
  kVeriCache,  // draft on compressed KV, verify on full KV: lossless
  kLossy,      // compressed KV only, no verification: a benchmark baseline, NOT lossless
};
enum class SamplingMode { kGreedy, kSeeded, kRejection };

absl::StatusOr<DecodeMode> ParseDecodeMode(const std::string& name);
absl::StatusOr<SamplingMode> ParseSamplingMode(const std::string& name);
const char* DecodeModeName(DecodeMode mode);

struct DraftOptions {
  int draft_len = 8;        // x; the first x when adaptive
  bool adaptive = false;    // choose x per round from observed acceptance
  int min_draft_len = 1;    // bounds for adaptive x
  int max_draft_len = 64;
  bool kv_refresh = true;   // send exact K/V of accepted tokens to the drafter
  // Fallback to full-KV decoding when the mean accepted drafts per round over
  // the last `fallback_window` rounds drops below `fallback_min_accepted`
  // (< 0 disables). Test seam: fallback_after_rounds >= 0 forces it.
  int fallback_window = 16;
  double fallback_min_accepted = 0.05;
  int fallback_after_rounds = -1;

  absl::Status Validate() const;
};

struct RequestOptions {
  DecodeMode mode = DecodeMode::kFull;
  int64_t max_new_tokens = 64;
  bool ignore_eos = false;
  SamplingMode sampling_mode = SamplingMode::kGreedy;
  SamplingParams sampling;  // temperature/top-k/top-p/seed for seeded and rejection
  CompressorOptions compressor;  // vericache and lossy
  DraftOptions draft;
  // Long-context placement. staged_verify: the full KV lives in a host tier
  // and each verify pass runs on an arena copy that the runtime supplies with
  // StageVerifyKv; accepted rows are written back to the host copy.
  bool staged_verify = false;
  KvArena* full_kv_arena = nullptr;   // where full KV is charged (host tier, or device when not staged)
  KvArena* draft_kv_arena = nullptr;  // where the compressed view is charged (device)
  // Tokens per block of the request's full KV (PagedKvCache::Options).
  int full_kv_block_tokens = PagedKvCache::Options{}.block_tokens;
  // Online compression of the drafter's view (vericache and lossy; the
  // compressor must have an online rule): after each verify round (each step
  // in lossy mode) settled tokens are folded into the compressed prefix as
  // the compressor's online_policy() says, so the view stays near the
  // method's budget instead of keeping every generated token exact. Default
  // off: the drafter's tail of generated tokens stays exact and grows.
  bool online_update = false;
  // A separate draft model: the config of the draft engine's model
  // (Model::config() of the model that RunBatch's draft_engine runs; RunBatch
  // checks that it is). Its vocabulary must equal the target's; any shape
  // and context length will do (the drafter's KV holds the target's context
  // and RoPE extends past the draft model's trained length). Needs mode
  // vericache and kv_refresh off. With an empty compressor name the drafter
  // keeps its prompt KV exact (every row in f32, no online update). Null: the
  // drafter runs the target model
  // (or a weight-quantised copy of it) over the target's compressed KV.
  const ModelConfig* draft_model = nullptr;
};

// Whether `draft` may draft for `target`: their vocabularies must match.
// llama2.c checkpoints (and random models) match when vocab_size is equal;
// Hugging Face checkpoints when, in addition, their tokenizer.json files are
// identical. A llama2.c and a Hugging Face checkpoint never match (nothing
// says their ids mean the same pieces). InvalidArgument with a one-line
// reason otherwise.
absl::Status CheckDraftVocabulary(const Model& target, const Model& draft);

struct RequestStats {
  std::vector<int32_t> accept_lengths;  // accepted drafts per verify round
  std::vector<int32_t> draft_lengths;   // x per round
  int64_t verify_rounds = 0;
  int64_t fallbacks = 0;
  int64_t drafted_tokens = 0;
  int64_t wasted_drafts = 0;
  int64_t drafter_full_kv_bytes_read = 0;  // must stay 0 in vericache mode
  int64_t full_kv_bytes = 0;        // full KV of prompt + output
  int64_t compressed_kv_bytes = 0;  // compressed prompt KV
  double compression_ratio = 1.0;   // achieved c of the prompt KV
  std::string compressor;           // Describe() of the compressor used
  // The work after the prompt's prefill pass, inside OnLogits: choosing the
  // first token and (vericache, lossy) compressing the prompt's KV.
  double after_prefill_seconds = 0;
  // When the prompt's prefill pass ended (its logits arrived): where decode
  // time starts, in every mode alike, so that everything VeriCache adds
  // after it (compressing the prompt's KV, drafting, verifying) is decode.
  std::chrono::steady_clock::time_point prefill_pass_end{};
  // The drafter's view (compressed prefix + exact tail, bytes as
  // CompressedSequenceKv::bytes()), sampled after every pass and fold: its
  // high-water mark and its size when the request finished (or fell back).
  bool online_update = false;
  int64_t online_folds = 0;           // Compressor::Update calls applied
  int64_t drafter_kv_bytes_peak = 0;
  int64_t drafter_kv_bytes_final = 0;
};

// One request's state. Not thread-safe; a batcher drives many of these.
class SpeculativeRequest {
 public:
  // kDraftPrefill: a separate draft model's prefill of the prompt (on the
  // draft engine, no logits), between kPrefill and the first kDraft.
  enum class Phase { kPrefill, kDraftPrefill, kDraft, kVerify, kFullDecode, kDone };

  // Validates options against the engine's model.
  static absl::StatusOr<std::unique_ptr<SpeculativeRequest>> Create(const Engine& engine,
                                                                   std::vector<int32_t> prompt,
                                                                   const RequestOptions& options);

  Phase phase() const { return phase_; }
  bool done() const { return phase_ == Phase::kDone; }

  // The input this request contributes to the next Forward call of its phase
  // (prefill, one draft step, a verify pass, or a full decode step).
  SequenceInput NextInput();
  // A pool the request may run its own work on between passes (compressing
  // the prompt's KV after its prefill), idle whenever OnLogits runs; RunBatch
  // lends the target engine's. Null: that work runs on the calling thread.
  void set_work_pool(ThreadPool* pool) { work_pool_ = pool; }
  // Consumes the logit rows the Forward call returned for that input.
  absl::Status OnLogits(std::span<const float> rows);

  const std::vector<int32_t>& prompt() const { return prompt_; }
  const std::vector<int32_t>& output() const { return output_; }
  bool stopped_at_eos() const { return stopped_at_eos_; }
  const RequestStats& stats() const { return stats_; }
  const RequestOptions& options() const { return options_; }
  // Draft length of the round about to start (adaptive x).
  int current_draft_len() const { return x_; }

  // Staged verification: true when the request waits for StageVerifyKv
  // before its verify pass can run.
  bool awaiting_verify_kv() const {
    return phase_ == Phase::kVerify && options_.staged_verify && verify_kv_ == nullptr;
  }
  // Hands over the arena copy of the full KV for the next verify pass (a copy
  // of full_kv(), e.g. made by PagedKvCache::CopyFrom). Allowed at any time
  // before that pass, also while still drafting: full_kv() only changes in
  // a verify. InvalidArgument if the copy does not cover exactly full_kv().
  absl::Status StageVerifyKv(std::unique_ptr<PagedKvCache> copy);

  // The verifier's full KV (exact) and the drafter's compressed view; for the
  // long-context runtime that moves them between tiers.
  PagedKvCache& full_kv() { return *full_kv_; }
  CompressedSequenceKv* draft_kv() { return draft_kv_.get(); }

 private:
  SpeculativeRequest(const Engine& engine, std::vector<int32_t> prompt,
                     const RequestOptions& options, std::unique_ptr<Compressor> compressor);
  absl::Status AfterPrefill(std::span<const float> last_row);
  absl::Status AfterDraftPrefill();
  // Compresses the prompt's KV in `full` (of the drafter's model) into the
  // drafter's view.
  absl::Status BuildDraftView(const PagedKvCache& full);
  bool separate_draft_model() const { return options_.draft_model != nullptr; }
  absl::Status AfterDraftStep(std::span<const float> last_row);
  absl::Status AfterVerify(std::span<const float> rows);
  absl::Status AfterFullStep(std::span<const float> last_row);
  // Appends generated tokens, handling EOS and max_new_tokens; returns true
  // when the request is finished.
  bool Emit(std::span<const int32_t> tokens);
  void StartRound();
  void ReleaseFullKv();
  int32_t Choose(std::span<const float> logits, int64_t position, uint64_t stream) const;
  void UpdateDraftLength(int accepted);
  bool ShouldFallBack() const;
  // Online update: folds settled tokens into the drafter's view when the
  // compressor's policy says so.
  absl::Status MaybeFold();
  void NoteDrafterBytes();
  void DropDraftKv();

  const ModelConfig& config_;
  // The drafter's model: *options.draft_model, or the target's config_.
  const ModelConfig& draft_config_;
  const int vocab_;
  std::vector<int32_t> prompt_;
  RequestOptions options_;
  std::unique_ptr<Compressor> compressor_;
  Phase phase_ = Phase::kPrefill;
  std::unique_ptr<PagedKvCache> full_kv_;
  std::unique_ptr<CompressedSequenceKv> draft_kv_;
  // A separate draft model's exact KV of the prompt, until it is compressed.
  std::unique_ptr<PagedKvCache> draft_prompt_kv_;
  std::unique_ptr<PagedKvCache> verify_kv_;  // staged arena copy for one verify
  KvArena::Reservation prefix_reservation_;   // compressed prefix charged to draft_kv_arena
  std::unique_ptr<AttentionStats> stats_observer_;
  ThreadPool* work_pool_ = nullptr;
  OnlinePolicy online_;                                  // with options_.online_update
  std::unique_ptr<DecodeAttentionStats> decode_stats_;  // online H2O/TOVA
  std::vector<int32_t> output_;
  bool stopped_at_eos_ = false;
  int32_t pending_ = -1;               // p
  std::vector<int32_t> draft_feed_;    // tokens the drafter must run next
  std::vector<int32_t> drafts_;        // d1..dx of this round
  std::vector<std::vector<double>> draft_probs_;  // rejection sampling: q_i
  std::vector<int32_t> verify_input_;  // [p, d1..dx]
  int x_ = 1;
  double accept_ewma_ = -1;
  RequestStats stats_;
  int64_t full_kv_read_mark_ = 0;
  FallbackPolicy fallback_;
};

// Adaptive draft length: the x of the next round after a round of `x` drafts
// that accepted `accepted`. `accept_ewma` (< 0 before the first round) keeps
// the running mean of accepted drafts. Shared by SpeculativeRequest and the
// cluster coordinator.
int NextDraftLength(int x, int accepted, double* accept_ewma, int min_len, int max_len);

struct BatchResult {
  int64_t forward_calls = 0;
  double seconds = 0;
};

// Runs requests to completion, lock-step: all drafting requests step
// together, then every request due for verification is verified in one pass.
// `after_step`, if set, runs after each Forward call's logits are consumed
// (e.g. to stream newly accepted tokens).
absl::StatusOr<BatchResult> RunBatch(Engine& engine,
                                     std::span<const std::unique_ptr<SpeculativeRequest>> requests,
                                     const std::function<void()>& after_step = nullptr);
// The same with the draft steps run on `draft_engine` (one with
// weight-quantised copies of the model, EngineOptions::quantized, or a
// separate draft model's engine), and the prefill, verify and full-decode
// passes on `engine`. A request with a separate draft model needs this
// engine to run that model (its draft prefill goes there too); requests
// without one need a draft engine of the target's KV shape (they draft over
// the target's KV). Draft steps and the other passes then go into separate
// Forward calls. The output is unchanged: only the verifier's logits decide
// tokens. Null: everything on `engine`.
absl::StatusOr<BatchResult> RunBatch(Engine& engine, Engine* draft_engine,
                                     std::span<const std::unique_ptr<SpeculativeRequest>> requests,
                                     const std::function<void()>& after_step = nullptr);

}  // namespace vc
