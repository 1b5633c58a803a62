// Mechanics of the draft/verify protocol on small random models: exactness
// with every option (KV refresh on/off, forced fallback, adaptive length),
// the all-accept property when the "compressed" cache is exact, error
// handling, and a statistical test that rejection sampling reproduces the
// full-KV distribution.
#include "common/speculative/draft_verify.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/compress/attention_stats.h"
#include "common/compress/compressor.h"
#include "common/decode/full_decode.h"
#include "common/kv/compressed_kv.h"
#include "common/model/quantized_weights.h"
#include "gtest/gtest.h"
#include "tests/common/sampling/chi_square.h"
#include "tests/sanitizer_scale.h"
#include "tests/small_model_config.h"

namespace vc {
namespace {

ModelConfig SmallConfig(int vocab = 64) {
  return test_support::SmallModelConfig({.vocab_size = vocab, .max_seq_len = 96});
}

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
};

Fixture Make(const ModelConfig& c, uint64_t seed) {
  Fixture f;
  f.model = std::move(Model::CreateRandom(c, seed)).value();
  EngineOptions eo;
  eo.backend.threads = 1;
  f.engine = std::move(Engine::Create(*f.model, eo)).value();
  return f;
}

std::vector<int32_t> RandomPrompt(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p = {1};
  while (static_cast<int>(p.size()) < n) p.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
  return p;
}

std::vector<int32_t> FullTokens(Engine& e, const std::vector<int32_t>& prompt, int64_t n,
                                const SamplingParams& sp = {}) {
  DecodeOptions o;
  o.max_new_tokens = n;
  o.ignore_eos = true;
  o.sampling = sp;
  return std::move(DecodeFull(e, prompt, o)).value().tokens;
}

std::unique_ptr<SpeculativeRequest> MakeRequest(Engine& e, const std::vector<int32_t>& prompt,
                                                RequestOptions ro) {
  auto r = SpeculativeRequest::Create(e, prompt, ro);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

RequestOptions VeriCache(const std::string& compressor, double ratio, int bits, int x, int64_t n) {
  RequestOptions ro;
  ro.mode = DecodeMode::kVeriCache;
  ro.max_new_tokens = n;
  ro.ignore_eos = true;
  ro.compressor.name = compressor;
  ro.compressor.ratio = ratio;
  ro.compressor.bits = bits;
  ro.draft.draft_len = x;
  return ro;
}

TEST(DraftVerifyTest, ExactWithEveryOption) {
  Fixture f = Make(SmallConfig(), 7);
  const auto prompt = RandomPrompt(30, 64, 1);
  const int64_t n = 50;
  const auto expected = FullTokens(*f.engine, prompt, n);
  std::vector<RequestOptions> variants;
  for (int x : {1, 3, 8}) {
    for (bool refresh : {true, false}) {
      RequestOptions ro = VeriCache("streamingllm", 0.3, 0, x, n);
      ro.draft.kv_refresh = refresh;
      variants.push_back(ro);
    }
  }
  RequestOptions adaptive = VeriCache("snapkv", 0.25, 0, 4, n);
  adaptive.draft.adaptive = true;
  variants.push_back(adaptive);
  RequestOptions forced = VeriCache("kivi", 0, 2, 5, n);
  forced.draft.fallback_after_rounds = 2;
  variants.push_back(forced);
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  for (const auto& ro : variants) reqs.push_back(MakeRequest(*f.engine, prompt, ro));
  ASSERT_TRUE(RunBatch(*f.engine, reqs).ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i]->output(), expected) << "variant " << i;
    EXPECT_EQ(reqs[i]->stats().drafter_full_kv_bytes_read, 0);
  }
  EXPECT_EQ(reqs.back()->stats().fallbacks, 1);
  EXPECT_EQ(reqs.back()->stats().verify_rounds, 2);
}

TEST(DraftVerifyTest, LosslessCompressorAcceptsEveryDraft) {
  // Keeping every token in f32 makes the drafter's cache exact, so every
  // draft must be accepted: any rollback/refresh/position bug shows up here.
  Fixture f = Make(SmallConfig(), 11);
  const auto prompt = RandomPrompt(20, 64, 2);
  for (bool refresh : {true, false}) {
    RequestOptions ro = VeriCache("streamingllm", 1.0, 0, 6, 40);
    ro.draft.kv_refresh = refresh;
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    reqs.push_back(MakeRequest(*f.engine, prompt, ro));
    ASSERT_TRUE(RunBatch(*f.engine, reqs).ok());
    const RequestStats& st = reqs[0]->stats();
    ASSERT_EQ(st.accept_lengths.size(), st.draft_lengths.size());
    for (size_t i = 0; i < st.accept_lengths.size(); ++i) {
      EXPECT_EQ(st.accept_lengths[i], st.draft_lengths[i])
          << "round " << i << " refresh " << refresh;
    }
    EXPECT_EQ(reqs[0]->output(), FullTokens(*f.engine, prompt, 40));
  }
}

TEST(DraftVerifyTest, StopsAtEosUnlessIgnored) {
  Fixture f = Make(SmallConfig(), 3);
  const auto prompt = RandomPrompt(10, 64, 3);
  // Make the EOS id the model's first greedy token so that it stops at once.
  const auto first = FullTokens(*f.engine, prompt, 1);
  ModelConfig c = SmallConfig();
  c.eos_id = first[0];
  auto model = std::move(Model::CreateRandom(c, 3)).value();
  auto engine = std::move(Engine::Create(*model, {})).value();
  RequestOptions ro = VeriCache("int8", 0, 8, 4, 20);
  ro.ignore_eos = false;
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  reqs.push_back(MakeRequest(*engine, prompt, ro));
  ASSERT_TRUE(RunBatch(*engine, reqs).ok());
  EXPECT_TRUE(reqs[0]->stopped_at_eos());
  EXPECT_EQ(reqs[0]->output(), std::vector<int32_t>{c.eos_id});
}

TEST(DraftVerifyTest, StopsAtAnyOfSeveralEosIds) {
  // A Hugging Face model may stop at several ids (generation_config.json's
  // eos_token_id list); every decode path stops at the first of any of them.
  // Untied: a random tied model keeps repeating its last token.
  ModelConfig base = SmallConfig();
  base.tied_embeddings = false;
  Fixture f = Make(base, 4);
  const auto prompt = RandomPrompt(10, 64, 4);
  const SamplingParams sp{1.0f, 0, 1.0f, 11};
  const auto tokens = FullTokens(*f.engine, prompt, 24, sp);
  // The stop id: the first token after the first that did not occur before
  // (so the output must end there, not earlier).
  size_t stop_at = 1;
  while (stop_at < tokens.size() && std::find(tokens.begin(), tokens.begin() + stop_at,
                                              tokens[stop_at]) != tokens.begin() + stop_at) {
    ++stop_at;
  }
  ASSERT_LT(stop_at, tokens.size());
  // An absent id first, so that only membership (not eos_id) can stop it.
  int32_t absent = 3;
  while (std::find(tokens.begin(), tokens.end(), absent) != tokens.end()) ++absent;
  ModelConfig c = base;
  c.eos_id = absent;
  c.eos_ids = {absent, tokens[stop_at]};
  auto model = std::move(Model::CreateRandom(c, 4)).value();
  auto engine = std::move(Engine::Create(*model, {})).value();
  const std::vector<int32_t> expected(tokens.begin(), tokens.begin() + stop_at + 1);

  DecodeOptions o;
  o.max_new_tokens = 24;
  o.sampling = sp;
  auto full = DecodeFull(*engine, prompt, o);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(full->stopped_at_eos);
  EXPECT_EQ(full->tokens, expected);

  RequestOptions ro = VeriCache("int8", 0, 8, 4, 24);
  ro.ignore_eos = false;
  ro.sampling_mode = SamplingMode::kSeeded;
  ro.sampling = sp;
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  reqs.push_back(MakeRequest(*engine, prompt, ro));
  ASSERT_TRUE(RunBatch(*engine, reqs).ok());
  EXPECT_TRUE(reqs[0]->stopped_at_eos());
  EXPECT_EQ(reqs[0]->output(), expected);

  // ignore_eos still runs to max_new_tokens.
  o.ignore_eos = true;
  EXPECT_EQ(std::move(DecodeFull(*engine, prompt, o)).value().tokens, tokens);
}

TEST(DraftVerifyTest, RejectsBadOptions) {
  Fixture f = Make(SmallConfig(), 5);
  const auto prompt = RandomPrompt(10, 64, 5);
  RequestOptions zero_x = VeriCache("int8", 0, 8, 0, 10);
  EXPECT_EQ(SpeculativeRequest::Create(*f.engine, prompt, zero_x).status().code(),
            absl::StatusCode::kInvalidArgument);
  RequestOptions unknown = VeriCache("zip", 0, 0, 4, 10);
  EXPECT_EQ(SpeculativeRequest::Create(*f.engine, prompt, unknown).status().code(),
            absl::StatusCode::kInvalidArgument);
  RequestOptions too_long = VeriCache("int8", 0, 8, 4, 1000);
  EXPECT_EQ(SpeculativeRequest::Create(*f.engine, prompt, too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
  RequestOptions seeded_without_t = VeriCache("int8", 0, 8, 4, 10);
  seeded_without_t.sampling_mode = SamplingMode::kSeeded;
  EXPECT_EQ(SpeculativeRequest::Create(*f.engine, prompt, seeded_without_t).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DraftVerifyTest, SeededSamplingIsExact) {
  Fixture f = Make(SmallConfig(), 9);
  const auto prompt = RandomPrompt(25, 64, 9);
  const SamplingParams sp{0.9f, 20, 0.9f, 77};
  const auto expected = FullTokens(*f.engine, prompt, 60, sp);
  RequestOptions ro = VeriCache("h2o", 0.3, 0, 5, 60);
  ro.sampling_mode = SamplingMode::kSeeded;
  ro.sampling = sp;
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  reqs.push_back(MakeRequest(*f.engine, prompt, ro));
  ASSERT_TRUE(RunBatch(*f.engine, reqs).ok());
  EXPECT_EQ(reqs[0]->output(), expected);
}

// The drafter's forward pass over INT8 / KIVI compressed KV (its attention
// runs the fused kernels of kernels/quantized_kv.h at the backend's SIMD
// level) gives the same logits, bit for bit, on every SIMD level, thread
// count and batch shape, and the same as decoding the rows first
// (set_fused_attention(false)). Head dims 8 and 20 (one partial 16-lane
// block; a full block and a partial one); KIVI with groups of 3 tokens /
// channels and f32 residual rows.
TEST(DraftVerifyTest, DrafterOverQuantisedKvIsTheSameOnEverySimdLevelThreadCountAndBatch) {
  ModelConfig wide = SmallConfig();
  wide.dim = 40;
  wide.n_heads = 2;
  wide.n_kv_heads = 2;
  wide.head_dim = 20;
  constexpr int32_t kPrompt = 60;
  std::vector<CompressorOptions> compressors(3);
  compressors[0].name = "int8";
  compressors[1].name = "kivi";
  compressors[1].bits = 2;
  compressors[2].name = "kivi";
  compressors[2].bits = 4;
  compressors[2].quant_group = 3;
  compressors[2].residual = 5;
  const std::vector<int32_t> drafts = {5, 9, 14, 3, 22};
  for (const ModelConfig& c : {SmallConfig(), wide}) {
    auto model = std::move(Model::CreateRandom(c, 31)).value();
    const auto prompt = RandomPrompt(kPrompt, c.vocab_size, 5);
    auto prefiller = std::move(Engine::Create(*model, EngineOptions{})).value();
    PagedKvCache full(c);
    AttentionStats stats(c, kPrompt, 8);
    const SequenceInput prefill{&full, prompt, kPrompt, &stats};
    std::vector<float> ignored;
    ASSERT_TRUE(prefiller->Forward({&prefill, 1}, &ignored).ok());
    for (const CompressorOptions& o : compressors) {
      auto compressor = std::move(CreateCompressor(o)).value();
      auto prefix = compressor->Compress(c, full, kPrompt, stats);
      ASSERT_TRUE(prefix.ok()) << prefix.status();
      // Logits of the drafts run through a fresh view of the prefix: all at
      // once, one at a time, or in a batch beside a second sequence.
      auto run = [&](Engine& e, bool fused, int shape) {
        CompressedSequenceKv kv(c, *prefix), other(c, *prefix);
        kv.set_fused_attention(fused);
        std::vector<float> out, logits;
        if (shape == 0) {
          const SequenceInput in{&kv, drafts, 0};
          EXPECT_TRUE(e.Forward({&in, 1}, &out).ok());
        } else if (shape == 1) {
          for (size_t i = 0; i < drafts.size(); ++i) {
            const SequenceInput in{&kv, std::span<const int32_t>(&drafts[i], 1), 0};
            EXPECT_TRUE(e.Forward({&in, 1}, &logits).ok());
            out.insert(out.end(), logits.begin(), logits.end());
          }
        } else {
          const std::vector<int32_t> two = {7, 8};
          const SequenceInput in[2] = {{&other, two, 0}, {&kv, drafts, 0}};
          EXPECT_TRUE(e.Forward(in, &logits).ok());
          out.assign(logits.begin() + 2 * static_cast<std::ptrdiff_t>(c.vocab_size), logits.end());
        }
        return out;
      };
      std::vector<float> want;
      for (const char* simd : {"scalar", "avx2", "avx512"}) {
        if (!kernels::ParseSimdLevel(simd).ok()) continue;  // the CPU lacks it
        for (int threads : {1, 2}) {
          EngineOptions eo;
          eo.backend.threads = threads;
          eo.backend.simd = simd;
          auto engine = std::move(Engine::Create(*model, eo)).value();
          for (bool fused : {true, false}) {
            for (int shape : {0, 1, 2}) {
              SCOPED_TRACE(::testing::Message()
                           << "head_dim " << c.head_dim << " " << o.name << " bits " << o.bits
                           << " " << simd << " x" << threads << (fused ? " fused" : " decoded")
                           << " shape " << shape);
              const std::vector<float> got = run(*engine, fused, shape);
              ASSERT_EQ(got.size(), drafts.size() * c.vocab_size);
              if (want.empty()) want = got;
              EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
            }
          }
        }
      }
    }
  }
}

// Rejection sampling must draw from the full-KV distribution. Compare the
// empirical joint distribution of the 2nd and 3rd generated tokens (the
// ones the accept/reject rule decides) over many seeds with the exact one,
// computed by enumerating the full model's conditionals.
// Rejection sampling drafted by `drafter` (null: the target engine itself)
// is distributed as full-KV sampling: the joint distribution of the 2nd and
// 3rd generated tokens over 4000 seeded requests (800 under a sanitizer,
// where the same paths are checked for memory errors and the full-size run
// of the optimised build is the statistical test) passes a pooled
// chi-square test against the exact one.
void ExpectRejectionMatchesFull(const char* label, const ModelConfig& c, const Fixture& f,
                                Engine* drafter, RequestOptions ro, uint64_t first_seed) {
  const int vocab = c.vocab_size;
  const auto prompt = RandomPrompt(24, vocab, 4);
  const SamplingParams sp{6.0f, 0, 1.0f, 0};
  auto next_dist = [&](const std::vector<int32_t>& seq) {
    PagedKvCache kv(c);
    std::vector<float> logits;
    SequenceInput in{&kv, seq, static_cast<int64_t>(seq.size()) - 1};
    EXPECT_TRUE(f.engine->Forward({&in, 1}, &logits).ok());
    return FilteredDistribution(logits, sp);
  };
  const auto exact = testing::ExactSecondAndThirdTokens(next_dist, prompt, vocab);
  const int n = test_support::kUnderSanitizer ? 800 : 4000;
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  ro.sampling_mode = SamplingMode::kRejection;
  ro.sampling = sp;
  for (int s = 0; s < n; ++s) {
    ro.sampling.seed = first_seed + s;
    reqs.push_back(MakeRequest(*f.engine, prompt, ro));
  }
  ASSERT_TRUE(RunBatch(*f.engine, drafter, reqs).ok());
  std::map<std::pair<int, int>, int> counts;
  int64_t rejected = 0;
  for (const auto& r : reqs) {
    ASSERT_EQ(r->output().size(), 3u);
    ++counts[{r->output()[1], r->output()[2]}];
    rejected += r->stats().wasted_drafts;
  }
  const testing::ChiSquare chi = testing::PooledChiSquare(exact, counts, n);
  std::printf("rejection sampling%s: chi2 %.1f, dof %d, limit %.1f, drafts rejected %lld\n", label,
              chi.statistic, chi.dof, chi.limit, static_cast<long long>(rejected));
  // Random models attend weakly, so the drafter rarely disagrees; the rule
  // itself is tested with strongly different p and q in
  // tests/common/sampling (SpeculativeAccept).
  EXPECT_GT(rejected, n / 200) << "the drafter must disagree sometimes for this test to mean much";
  EXPECT_LT(chi.statistic, chi.limit);
}

TEST(DraftVerifyTest, RejectionSamplingMatchesFullDistribution) {
  const ModelConfig c = SmallConfig(6);
  const Fixture f = Make(c, 21);
  ExpectRejectionMatchesFull("", c, f, nullptr, VeriCache("streamingllm", 0.25, 0, 2, 3), 1000);
}

}  // namespace
}  // namespace vc

namespace vc {
namespace {

// ---------------------------------------------------------------- online update

RequestOptions Online(const std::string& compressor, double ratio, int bits, int x, int64_t n) {
  RequestOptions ro = VeriCache(compressor, ratio, bits, x, n);
  ro.online_update = true;
  ro.compressor.quant_group = 8;  // small groups so that KIVI folds often here
  ro.compressor.residual = 8;
  ro.draft.fallback_min_accepted = -1;
  return ro;
}

TEST(OnlineUpdateTest, ExactForEveryOnlineMethodWithAndWithoutRefresh) {
  Fixture f = Make(SmallConfig(), 21);
  const auto prompt = RandomPrompt(24, 64, 5);
  const int64_t n = 70;
  const auto expected = FullTokens(*f.engine, prompt, n);
  std::vector<RequestOptions> variants;
  for (const auto& [name, ratio, bits] :
       std::vector<std::tuple<std::string, double, int>>{{"streamingllm", 0.3, 0},
                                                         {"h2o", 0.3, 0},
                                                         {"tova", 0.3, 0},
                                                         {"kivi", 0, 2},
                                                         {"int8", 0, 8},
                                                         {"streamingllm+kivi", 0.5, 4},
                                                         {"h2o+int8", 0.4, 8},
                                                         {"snapkv+kivi", 0.5, 2}}) {
    for (const int x : {1, 5}) {
      for (const bool refresh : {true, false}) {
        RequestOptions ro = Online(name, ratio, bits, x, n);
        ro.draft.kv_refresh = refresh;
        variants.push_back(ro);
      }
    }
  }
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  for (const auto& ro : variants) reqs.push_back(MakeRequest(*f.engine, prompt, ro));
  ASSERT_TRUE(RunBatch(*f.engine, reqs).ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestOptions& ro = variants[i];
    SCOPED_TRACE(ro.compressor.name + " x=" + std::to_string(ro.draft.draft_len) +
                 " refresh=" + std::to_string(ro.draft.kv_refresh));
    EXPECT_EQ(reqs[i]->output(), expected);
    const RequestStats& st = reqs[i]->stats();
    EXPECT_TRUE(st.online_update);
    EXPECT_GT(st.online_folds, 0);
    EXPECT_EQ(st.drafter_full_kv_bytes_read, 0);
    EXPECT_EQ(st.fallbacks, 0);
  }
}

TEST(OnlineUpdateTest, AnExactViewStillAcceptsEveryDraftAfterFolds) {
  // Ratio 1 keeps every token f32, so folding must leave the drafter's view
  // exact: a fold that loses, reorders or misplaces a row shows up as a
  // rejected draft.
  Fixture f = Make(SmallConfig(), 11);
  const auto prompt = RandomPrompt(20, 64, 2);
  for (const bool refresh : {true, false}) {
    RequestOptions ro = Online("streamingllm", 1.0, 0, 6, 60);
    ro.draft.kv_refresh = refresh;
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    reqs.push_back(MakeRequest(*f.engine, prompt, ro));
    ASSERT_TRUE(RunBatch(*f.engine, reqs).ok());
    const RequestStats& st = reqs[0]->stats();
    EXPECT_GT(st.online_folds, 5);
    for (size_t i = 0; i < st.accept_lengths.size(); ++i) {
      EXPECT_EQ(st.accept_lengths[i], st.draft_lengths[i])
          << "round " << i << " refresh " << refresh;
    }
    EXPECT_EQ(reqs[0]->output(), FullTokens(*f.engine, prompt, 60));
  }
}

TEST(OnlineUpdateTest, DrafterViewStaysNearTheBudgetWhileWithoutItTheTailGrows) {
  const ModelConfig c = SmallConfig();
  Fixture f = Make(c, 3);
  const auto prompt = RandomPrompt(16, 64, 9);
  const int64_t n = 78;  // to the end of the context
  const int x = 4;
  const int64_t per_token = c.kv_bytes_per_token();
  const double total = static_cast<double>(prompt.size() + n) * per_token;
  struct Case {
    std::string name;
    double ratio;
    int bits;
    double bound_ratio;    // the method's bytes over full f32 bytes, at most
    int64_t slack_tokens;  // f32 rows it may hold besides: window + tail
  };
  // StreamingLLM: the ratio of the current length, plus the drafts of one
  // round in the tail. KIVI-2 (head_dim 8, groups of 8): 10 of 32 bytes per
  // row, plus residual + group f32 rows, plus the tail.
  for (const Case& cs : {Case{"streamingllm", 0.25, 0, 0.25, x + 1},
                         Case{"kivi", 0, 2, 10.0 / 32, 8 + 8 + 8 + x + 1}}) {
    SCOPED_TRACE(cs.name);
    KvArena arena("device", 0);
    RequestOptions on = Online(cs.name, cs.ratio, cs.bits, x, n);
    on.draft_kv_arena = &arena;
    RequestOptions off = on;
    off.online_update = false;
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    reqs.push_back(MakeRequest(*f.engine, prompt, on));
    reqs.push_back(MakeRequest(*f.engine, prompt, off));
    ASSERT_TRUE(RunBatch(*f.engine, reqs).ok());
    EXPECT_EQ(reqs[0]->output(), reqs[1]->output());
    const RequestStats& with = reqs[0]->stats();
    const RequestStats& without = reqs[1]->stats();
    EXPECT_LE(with.drafter_kv_bytes_peak,
              static_cast<int64_t>(cs.bound_ratio * total) + cs.slack_tokens * per_token);
    // Without online update every generated token stays f32 in the tail.
    EXPECT_FALSE(without.online_update);
    EXPECT_EQ(without.online_folds, 0);
    EXPECT_GE(without.drafter_kv_bytes_final, without.compressed_kv_bytes + (n - 1) * per_token);
    EXPECT_LT(2 * with.drafter_kv_bytes_peak, without.drafter_kv_bytes_peak);
    EXPECT_EQ(arena.in_use(), 0);  // everything returned at the end
  }
}

TEST(OnlineUpdateTest, LossyModeFoldsToo) {
  Fixture f = Make(SmallConfig(), 5);
  const auto prompt = RandomPrompt(16, 64, 4);
  RequestOptions ro = Online("h2o", 0.25, 0, 4, 60);
  ro.mode = DecodeMode::kLossy;
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  reqs.push_back(MakeRequest(*f.engine, prompt, ro));
  ASSERT_TRUE(RunBatch(*f.engine, reqs).ok());
  EXPECT_EQ(reqs[0]->output().size(), 60u);
  EXPECT_GT(reqs[0]->stats().online_folds, 50);
  EXPECT_LE(reqs[0]->stats().drafter_kv_bytes_peak,
            static_cast<int64_t>(0.25 * 76 * SmallConfig().kv_bytes_per_token()) +
                2 * SmallConfig().kv_bytes_per_token());
}

TEST(OnlineUpdateTest, RejectsMethodsWithoutAnOnlineRuleAndFullMode) {
  Fixture f = Make(SmallConfig(), 7);
  const auto prompt = RandomPrompt(10, 64, 1);
  auto r = SpeculativeRequest::Create(*f.engine, prompt, Online("snapkv", 0.5, 0, 4, 10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("snapkv has no online rule"), std::string::npos)
      << r.status();
  RequestOptions full = Online("kivi", 0, 2, 4, 10);
  full.mode = DecodeMode::kFull;
  r = SpeculativeRequest::Create(*f.engine, prompt, full);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("vericache or lossy"), std::string::npos);
}

}  // namespace
}  // namespace vc

namespace vc {
namespace {

// A drafter engine over a weight-quantised copy of the fixture's model.
struct QuantizedDrafter {
  std::unique_ptr<QuantizedWeights> weights;
  std::unique_ptr<Engine> engine;
};

QuantizedDrafter MakeDrafter(const Model& model, kernels::WeightFormat format) {
  QuantizedDrafter d;
  QuantizeOptions qo;
  qo.format = format;
  d.weights = std::move(QuantizedWeights::Create(model, qo)).value();
  EngineOptions eo;
  eo.backend.threads = 1;
  eo.quantized = d.weights.get();
  d.engine = std::move(Engine::Create(model, eo)).value();
  return d;
}

TEST(QuantizedDrafterTest, ExactGreedyAndSeeded) {
  // hidden_dim 40: int4 groups of 32 leave a partial group of 8.
  ModelConfig c = SmallConfig();
  c.hidden_dim = 40;
  Fixture f = Make(c, 9);
  const auto prompt = RandomPrompt(30, 64, 2);
  const int64_t n = 50;
  const SamplingParams seeded{0.9f, 0, 0.95f, 77};
  for (const auto format : {kernels::WeightFormat::kInt8, kernels::WeightFormat::kInt4}) {
    QuantizedDrafter d = MakeDrafter(*f.model, format);
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    for (int x : {1, 4, 8}) {
      reqs.push_back(MakeRequest(*f.engine, prompt, VeriCache("int8", 0, 8, x, n)));
      RequestOptions ro = VeriCache("kivi", 0, 2, x, n);
      ro.sampling_mode = SamplingMode::kSeeded;
      ro.sampling = seeded;
      reqs.push_back(MakeRequest(*f.engine, prompt, ro));
    }
    ASSERT_TRUE(RunBatch(*f.engine, d.engine.get(), reqs).ok());
    const auto greedy = FullTokens(*f.engine, prompt, n);
    const auto sampled = FullTokens(*f.engine, prompt, n, seeded);
    int64_t rounds = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(reqs[i]->output(), i % 2 == 0 ? greedy : sampled)
          << kernels::WeightFormatName(format) << " request " << i;
      rounds += reqs[i]->stats().verify_rounds;
    }
    EXPECT_GT(rounds, 0);
  }
}

TEST(QuantizedDrafterTest, DraftStepsRunOnTheDrafterEngine) {
  // A random model with tied embeddings mostly predicts its input token
  // again, so int4 weights alone rarely change a draft. A drafter made from
  // a random model with its own classifier must show: its drafts are mostly
  // rejected (a path that ignored the draft engine would accept nearly all),
  // and the output is still exact.
  Fixture f = Make(SmallConfig(), 13);
  ModelConfig untied = SmallConfig();
  untied.tied_embeddings = false;
  Fixture other = Make(untied, 14);
  const auto prompt = RandomPrompt(40, 64, 3);
  QuantizedDrafter d = MakeDrafter(*other.model, kernels::WeightFormat::kInt8);
  std::vector<std::unique_ptr<SpeculativeRequest>> own, foreign;
  RequestOptions ro = VeriCache("int8", 0, 8, 8, 50);
  ro.draft.fallback_min_accepted = -1;  // keep drafting however poor
  own.push_back(MakeRequest(*f.engine, prompt, ro));
  foreign.push_back(MakeRequest(*f.engine, prompt, ro));
  ASSERT_TRUE(RunBatch(*f.engine, own).ok());
  ASSERT_TRUE(RunBatch(*f.engine, d.engine.get(), foreign).ok());
  EXPECT_EQ(own[0]->output(), FullTokens(*f.engine, prompt, 50));
  EXPECT_EQ(foreign[0]->output(), own[0]->output());
  EXPECT_GT(foreign[0]->stats().wasted_drafts, own[0]->stats().wasted_drafts + 50);
}

TEST(QuantizedDrafterTest, RejectsMismatchedEngines) {
  Fixture f = Make(SmallConfig(), 5);
  Fixture other = Make(SmallConfig(32), 5);
  QuantizedDrafter d = MakeDrafter(*other.model, kernels::WeightFormat::kInt8);
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  reqs.push_back(MakeRequest(*f.engine, RandomPrompt(10, 64, 1), VeriCache("int8", 0, 8, 4, 5)));
  EXPECT_EQ(RunBatch(*f.engine, d.engine.get(), reqs).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Quantised weights of another shape, or at tensor-parallel degree 2.
  EngineOptions eo;
  eo.quantized = d.weights.get();
  EXPECT_EQ(Engine::Create(*f.model, eo).status().code(), absl::StatusCode::kInvalidArgument);
  QuantizedDrafter mine = MakeDrafter(*f.model, kernels::WeightFormat::kInt8);
  eo.quantized = mine.weights.get();
  eo.tensor_parallel = 2;
  EXPECT_EQ(Engine::Create(*f.model, eo).status().code(), absl::StatusCode::kInvalidArgument);
}

// Rejection sampling with a quantised drafter (int4: drafts that differ from
// the target's often) still draws from the full-KV distribution.
TEST(QuantizedDrafterTest, RejectionSamplingMatchesFullDistribution) {
  const ModelConfig c = SmallConfig(6);
  const Fixture f = Make(c, 21);
  QuantizedDrafter d = MakeDrafter(*f.model, kernels::WeightFormat::kInt4);
  ExpectRejectionMatchesFull(", int4 drafter", c, f, d.engine.get(), VeriCache("int8", 0, 8, 2, 3),
                             5000);
}

}  // namespace
}  // namespace vc

namespace vc {
namespace {

// ---------------------------------------------------------- separate draft model

// A draft model of another shape than SmallConfig (one layer, one KV head,
// its own classifier) with the same vocabulary and a context shorter than
// the sequences below, so the drafter also runs past its trained length.
ModelConfig DraftConfig(int vocab = 64) {
  ModelConfig c = SmallConfig(vocab);
  c.dim = 16;
  c.hidden_dim = 24;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.max_seq_len = 40;
  c.tied_embeddings = false;
  return c;
}

RequestOptions WithDraftModel(RequestOptions ro, const Model& draft) {
  ro.draft_model = &draft.config();
  ro.draft.kv_refresh = false;
  ro.draft.fallback_min_accepted = -1;  // keep drafting however poor
  return ro;
}

TEST(DraftModelTest, ExactGreedyAndSeeded) {
  Fixture f = Make(SmallConfig(), 31);
  Fixture d = Make(DraftConfig(), 32);
  QuantizedDrafter dq = MakeDrafter(*d.model, kernels::WeightFormat::kInt4);
  const auto prompt = RandomPrompt(30, 64, 6);
  const int64_t n = 50;
  const SamplingParams seeded{0.9f, 0, 0.95f, 5};
  const auto greedy = FullTokens(*f.engine, prompt, n);
  const auto sampled = FullTokens(*f.engine, prompt, n, seeded);
  for (Engine* drafter : {d.engine.get(), dq.engine.get()}) {
    std::vector<RequestOptions> variants;
    for (int x : {1, 4, 8}) {
      variants.push_back(WithDraftModel(VeriCache("int8", 0, 8, x, n), *d.model));
      variants.push_back(WithDraftModel(VeriCache("snapkv", 0.5, 0, x, n), *d.model));
    }
    RequestOptions adaptive = WithDraftModel(VeriCache("kivi", 0, 2, 4, n), *d.model);
    adaptive.draft.adaptive = true;
    variants.push_back(adaptive);
    RequestOptions online = WithDraftModel(Online("h2o", 0.25, 0, 4, n), *d.model);
    variants.push_back(online);
    // No compressor: the draft model's exact KV.
    variants.push_back(WithDraftModel(VeriCache("", 0, 0, 4, n), *d.model));
    const size_t greedy_variants = variants.size();
    for (size_t i = 0; i < greedy_variants; ++i) {
      RequestOptions ro = variants[i];
      ro.sampling_mode = SamplingMode::kSeeded;
      ro.sampling = seeded;
      variants.push_back(ro);
    }
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    for (const auto& ro : variants) reqs.push_back(MakeRequest(*f.engine, prompt, ro));
    ASSERT_TRUE(RunBatch(*f.engine, drafter, reqs).ok());
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(reqs[i]->output(), i < greedy_variants ? greedy : sampled) << "variant " << i;
      EXPECT_GT(reqs[i]->stats().verify_rounds, 0) << "variant " << i;
      EXPECT_EQ(reqs[i]->stats().drafter_full_kv_bytes_read, 0) << "variant " << i;
      EXPECT_EQ(reqs[i]->stats().fallbacks, 0) << "variant " << i;
    }
    EXPECT_GT(reqs[greedy_variants - 2]->stats().online_folds, 0);
    EXPECT_EQ(reqs.back()->stats().compressor, "none");
  }
}

// The target itself as a separate draft model over an exact view (no
// compressor, or StreamingLLM keeping every token in f32): the drafter's own
// prefill and its feeding of accepted tokens must reproduce the verifier's
// context, so every draft is accepted.
TEST(DraftModelTest, TargetAsItsOwnDraftModelAcceptsEveryDraft) {
  Fixture f = Make(SmallConfig(), 33);
  EngineOptions eo;
  eo.backend.threads = 1;
  auto drafter = std::move(Engine::Create(*f.model, eo)).value();
  const auto prompt = RandomPrompt(20, 64, 7);
  for (const std::string compressor : {"", "streamingllm"}) {
    const double ratio = compressor.empty() ? 0 : 1.0;
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    reqs.push_back(MakeRequest(*f.engine, prompt,
                               WithDraftModel(VeriCache(compressor, ratio, 0, 6, 40), *f.model)));
    ASSERT_TRUE(RunBatch(*f.engine, drafter.get(), reqs).ok());
    const RequestStats& st = reqs[0]->stats();
    ASSERT_EQ(st.accept_lengths.size(), st.draft_lengths.size());
    for (size_t i = 0; i < st.accept_lengths.size(); ++i) {
      EXPECT_EQ(st.accept_lengths[i], st.draft_lengths[i]) << compressor << " round " << i;
    }
    EXPECT_EQ(reqs[0]->output(), FullTokens(*f.engine, prompt, 40));
  }
}

// Rollback is exact: driving a request pass by pass, every draft step's
// logits equal, bit for bit, those of a fresh prefill of the same tokens by
// the draft model (no compressor: the view keeps every prompt row in f32),
// however many rejected drafts were rolled back before.
TEST(DraftModelTest, DrafterAfterRollbackEqualsAFreshPrefill) {
  Fixture f = Make(SmallConfig(), 34);
  Fixture d = Make(DraftConfig(), 35);
  const auto prompt = RandomPrompt(25, 64, 8);
  auto r = MakeRequest(*f.engine, prompt, WithDraftModel(VeriCache("", 0, 0, 5, 60), *d.model));
  std::vector<int32_t> round_drafts;
  std::vector<float> logits, fresh;
  int64_t checked = 0, wasted_before_check = 0;
  while (!r->done()) {
    const SpeculativeRequest::Phase phase = r->phase();
    const bool drafting = phase == SpeculativeRequest::Phase::kDraft ||
                          phase == SpeculativeRequest::Phase::kDraftPrefill;
    SequenceInput in = r->NextInput();
    ASSERT_TRUE((drafting ? *d.engine : *f.engine).Forward({&in, 1}, &logits).ok());
    if (phase == SpeculativeRequest::Phase::kDraft) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), r->output().begin(), r->output().end());
      seq.insert(seq.end(), round_drafts.begin(), round_drafts.end());
      ASSERT_EQ(r->draft_kv()->next_position(), static_cast<int32_t>(seq.size()));
      PagedKvCache kv(d.model->config(), PagedKvCache::Options{.max_tokens = 96});
      SequenceInput ref{&kv, seq, static_cast<int64_t>(seq.size()) - 1};
      ASSERT_TRUE(d.engine->Forward({&ref, 1}, &fresh).ok());
      ASSERT_EQ(logits.size(), fresh.size());
      ASSERT_EQ(std::memcmp(logits.data(), fresh.data(), logits.size() * sizeof(float)), 0)
          << "draft step at position " << seq.size();
      round_drafts.push_back(Argmax(logits));
      ++checked;
      wasted_before_check = r->stats().wasted_drafts;
    } else if (phase == SpeculativeRequest::Phase::kVerify) {
      round_drafts.clear();
    }
    ASSERT_TRUE(r->OnLogits(logits).ok());
  }
  EXPECT_EQ(r->output(), FullTokens(*f.engine, prompt, 60));
  EXPECT_GT(checked, 20);
  // Rejected drafts were rolled back before later checks.
  EXPECT_GT(wasted_before_check, 5);
}

TEST(DraftModelTest, RejectsBadCombinations) {
  Fixture f = Make(SmallConfig(), 36);
  Fixture d = Make(DraftConfig(), 37);
  Fixture other_vocab = Make(DraftConfig(32), 38);
  const auto prompt = RandomPrompt(10, 64, 9);
  auto create = [&](const RequestOptions& ro) {
    return SpeculativeRequest::Create(*f.engine, prompt, ro).status().code();
  };
  const RequestOptions good = WithDraftModel(VeriCache("int8", 0, 8, 4, 10), *d.model);
  EXPECT_EQ(create(good), absl::StatusCode::kOk);
  RequestOptions refresh = good;
  refresh.draft.kv_refresh = true;
  EXPECT_EQ(create(refresh), absl::StatusCode::kInvalidArgument);
  RequestOptions lossy = good;
  lossy.mode = DecodeMode::kLossy;
  EXPECT_EQ(create(lossy), absl::StatusCode::kInvalidArgument);
  RequestOptions full = good;
  full.mode = DecodeMode::kFull;
  EXPECT_EQ(create(full), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(WithDraftModel(good, *other_vocab.model)), absl::StatusCode::kInvalidArgument);
  RequestOptions exact_online = WithDraftModel(Online("", 0, 0, 4, 10), *d.model);
  EXPECT_EQ(create(exact_online), absl::StatusCode::kInvalidArgument);
  RequestOptions no_compressor = good;
  no_compressor.draft_model = nullptr;
  no_compressor.compressor.name = "";
  EXPECT_EQ(create(no_compressor), absl::StatusCode::kInvalidArgument);

  // RunBatch: the draft engine must run the request's draft model, and a
  // request without one cannot draft on an engine of another KV shape.
  auto run = [&](Engine* drafter, const RequestOptions& ro) {
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    reqs.push_back(MakeRequest(*f.engine, prompt, ro));
    return RunBatch(*f.engine, drafter, reqs).status().code();
  };
  EXPECT_EQ(run(nullptr, good), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run(f.engine.get(), good), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run(d.engine.get(), VeriCache("int8", 0, 8, 4, 10)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run(d.engine.get(), good), absl::StatusCode::kOk);

  // Vocabulary check of loaded models: random models are llama2.c-like and
  // match on vocab_size.
  EXPECT_TRUE(CheckDraftVocabulary(*f.model, *d.model).ok());
  const absl::Status s = CheckDraftVocabulary(*f.model, *other_vocab.model);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocabulary of 32 tokens"), std::string::npos) << s;
}

// Rejection sampling drafted by another model (which disagrees with the
// target often) still draws from the full-KV distribution.
TEST(DraftModelTest, RejectionSamplingMatchesFullDistribution) {
  const ModelConfig c = SmallConfig(6);
  const Fixture f = Make(c, 21);
  const Fixture d = Make(DraftConfig(6), 22);
  ExpectRejectionMatchesFull(", separate draft model", c, f, d.engine.get(),
                             WithDraftModel(VeriCache("int8", 0, 8, 2, 3), *d.model), 9000);
}

}  // namespace
}  // namespace vc
