// The split draft/verify protocol: a verifier session and a drafter session
// driven round by round the way the coordinator drives them must produce
// exactly the tokens of plain full-KV decoding, for every prefix length,
// compressor, draft length, lookahead (speculative continuation), KV refresh
// setting and sampling mode, with and without online compressor updates of
// the drafter's view (which must also keep that view bounded); prefix
// sharing across a batch must not change a bit; rejection sampling
// reproduces the full-KV distribution; bad input is rejected.
#include "common/cluster/remote_session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "common/compress/attention_stats.h"
#include "common/compress/compressor.h"
#include "common/decode/full_decode.h"
#include "common/kv/compressed_kv.h"
#include "gtest/gtest.h"
#include "tests/common/sampling/chi_square.h"
#include "tests/sanitizer_scale.h"
#include "tests/small_model_config.h"

namespace vc::cluster {
namespace {

ModelConfig SmallConfig(int vocab = 48) {
  return test_support::SmallModelConfig({.vocab_size = vocab});
}

class RemoteSessionTest : public ::testing::Test {
 protected:
  void SetUp() override { UseModel(SmallConfig(), 11); }
  void UseModel(const ModelConfig& c, uint64_t seed) {
    model_ = std::move(Model::CreateRandom(c, seed)).value();
    EngineOptions eo;
    eo.backend.threads = 1;
    engine_ = std::move(Engine::Create(*model_, eo)).value();
  }
  const ModelConfig& config() const { return model_->config(); }

  std::vector<int32_t> Prompt(int n, uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p = {1};
    while (static_cast<int>(p.size()) < n) {
      p.push_back(3 + static_cast<int32_t>(rng() % (config().vocab_size - 3)));
    }
    return p;
  }

  std::vector<int32_t> Full(const std::vector<int32_t>& prompt, int n, const SessionSampling& s) {
    DecodeOptions o;
    o.max_new_tokens = n;
    o.ignore_eos = true;
    if (s.mode == SamplingMode::kSeeded) o.sampling = s.params;
    return std::move(DecodeFull(*engine_, prompt, o)).value().tokens;
  }

  // Exact K/V of prompt[0, len) (what the store holds) and, optionally, the
  // prefill's attention statistics for compressors.
  std::shared_ptr<PagedKvCache> Prefill(const std::vector<int32_t>& prompt, int32_t len,
                                        AttentionStats* stats = nullptr) {
    auto kv = std::make_shared<PagedKvCache>(config());
    if (len == 0) return kv;
    SequenceInput in;
    in.kv = kv.get();
    in.tokens = std::span<const int32_t>(prompt).first(len);
    in.first_logit = len;
    in.observer = stats;
    std::vector<float> logits;
    EXPECT_TRUE(engine_->Forward({&in, 1}, &logits).ok());
    return kv;
  }

  // The drafter's prefix view: compressed with `compressor`, or the exact
  // prefix when compressor is empty (full_remote).
  std::unique_ptr<SequenceKv> DrafterKv(const std::vector<int32_t>& prompt, int32_t len,
                                        const CompressorOptions& compressor) {
    if (compressor.name.empty() || len == 0) {
      return std::make_unique<PrefixTailKv>(config(), Prefill(prompt, len), len);
    }
    AttentionStats stats(config(), len, compressor.window);
    auto full = Prefill(prompt, len, &stats);
    auto c = std::move(CreateCompressor(compressor)).value();
    auto prefix = c->Compress(config(), *full, len, stats);
    EXPECT_TRUE(prefix.ok()) << prefix.status();
    return std::make_unique<CompressedSequenceKv>(config(), std::move(prefix).value());
  }

  struct RunResult {
    std::vector<int32_t> tokens;
    int64_t rounds = 0;
    int64_t accepted = 0;
    int64_t survived = 0;
    int64_t rejected = 0;  // drafts the verifier did not accept
    // The drafter's KV (online update: its folds).
    int64_t online_folds = 0;
    int64_t kv_bytes_initial = 0;
    int64_t kv_bytes_peak = 0;
    int64_t kv_bytes_final = 0;
  };

  // The coordinator's loop for one request, in process. `online`: the
  // drafter folds settled tokens by `compressor`'s online rule.
  RunResult Run(const std::vector<int32_t>& prompt, int32_t prefix_len, int n,
                const CompressorOptions& compressor, int x, int lookahead, bool refresh,
                const SessionSampling& sampling, bool online = false) {
    VerifySessionOptions vo;
    vo.sampling = sampling;
    auto vs = std::move(VerifySession::Create(config(), prompt, prefix_len, vo)).value();
    DraftSessionOptions dopt;
    dopt.sampling = sampling;
    dopt.lookahead = lookahead;
    dopt.end_position = static_cast<int32_t>(prompt.size()) + n;
    if (online) dopt.online.compressor = std::move(CreateCompressor(compressor)).value();
    auto ds = std::move(DraftSession::Create(config(), prompt, DrafterKv(prompt, prefix_len, compressor),
                                             prefix_len, dopt))
                  .value();
    auto verifier_prefix = Prefill(prompt, prefix_len);
    RunResult r;
    r.kv_bytes_initial = r.kv_bytes_peak = ds->kv_bytes();
    while (static_cast<int>(r.tokens.size()) < n) {
      while (ds->wants_step() && static_cast<int>(ds->drafts().size()) < lookahead) {
        SequenceInput in = ds->BeginStep();
        std::vector<float> logits;
        EXPECT_TRUE(engine_->Forward({&in, 1}, &logits).ok());
        EXPECT_TRUE(ds->FinishStep(logits).ok());
        r.kv_bytes_peak = std::max(r.kv_bytes_peak, ds->kv_bytes());
      }
      const int remaining = n - static_cast<int>(r.tokens.size());
      const int take = std::min<int>({x, static_cast<int>(ds->drafts().size()), remaining - 1});
      std::vector<int32_t> drafts(ds->drafts().begin(), ds->drafts().begin() + take);
      // Rejection sampling: the distributions travel with the drafts.
      const std::vector<std::vector<double>> probs(
          ds->draft_probs().begin(), ds->draft_probs().begin() + (ds->draft_probs().empty() ? 0 : take));
      EXPECT_TRUE(vs->AttachPrefix(verifier_prefix).ok());
      VerifySession* one = vs.get();
      auto results = RunVerifyPass(*engine_, {&one, 1}, {&drafts, 1}, {&probs, 1});
      vs->DetachPrefix();
      EXPECT_TRUE(results[0].ok()) << results[0].status();
      const VerifyOutcome& o = *results[0];
      std::string rows;
      if (refresh) rows = std::move(vs->EncodeRows(o.refresh_first, o.refresh_count)).value();
      auto c = ds->Commit(o.tokens, rows);
      EXPECT_TRUE(c.ok()) << c.status();
      if (!c.ok()) return r;
      r.kv_bytes_peak = std::max(r.kv_bytes_peak, ds->kv_bytes());
      r.kv_bytes_final = ds->kv_bytes();
      r.online_folds = ds->online_folds();
      r.survived += c->surviving_drafts;
      r.accepted += o.accepted;
      r.rejected += take - o.accepted;
      ++r.rounds;
      for (int32_t t : o.tokens) {
        if (static_cast<int>(r.tokens.size()) < n) r.tokens.push_back(t);
      }
    }
    return r;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
};

SessionSampling Greedy() { return {}; }
SessionSampling Seeded(uint64_t seed) {
  SessionSampling s;
  s.mode = SamplingMode::kSeeded;
  s.params.temperature = 0.8f;
  s.params.top_k = 20;
  s.params.top_p = 0.95f;
  s.params.seed = seed;
  return s;
}

TEST_F(RemoteSessionTest, ExactDrafterAcceptsEverythingAndContinues) {
  const auto prompt = Prompt(40, 1);
  const int n = 30;
  const RunResult r = Run(prompt, 32, n, {}, 4, 8, true, Greedy());
  EXPECT_EQ(r.tokens, Full(prompt, n, Greedy()));
  // An exact drafter agrees with every verify: each round accepts all drafts,
  // and the continuation drafted past the window survives.
  EXPECT_GE(r.accepted + r.rounds, n);
  EXPECT_GT(r.survived, 0);
  EXPECT_LE(r.rounds, (n + 4) / 5 + 1);
}

struct Case {
  const char* compressor;
  double ratio;
  int bits;
};

// Small windows and groups, so that short prompts exercise every stage.
CompressorOptions Options(const Case& c) {
  CompressorOptions co;
  co.name = c.compressor;
  co.ratio = c.ratio;
  co.bits = c.bits;
  co.window = 8;
  co.residual = 8;
  co.quant_group = 8;
  return co;
}

// A bf16 model's refresh rows are bf16 (the chunk codec writes the KV dtype):
// the drafter must read them as such. An exact drafter given the verifier's
// exact rows then accepts every draft; rows read as f32 would read past the
// payload and make garbage K/V (and rejections).
TEST_F(RemoteSessionTest, RefreshRowsOfABf16ModelAreReadInItsDtype) {
  ModelConfig c = SmallConfig();
  c.dtype = Dtype::kBf16;
  UseModel(c, 5);
  const std::vector<int32_t> prompt = Prompt(24, 3);
  const RunResult r = Run(prompt, 16, 24, CompressorOptions{}, 4, 4, /*refresh=*/true, Greedy());
  EXPECT_EQ(r.tokens, Full(prompt, 24, Greedy()));
  EXPECT_GT(r.accepted, 0);
  EXPECT_EQ(r.rejected, 0);
}

TEST_F(RemoteSessionTest, RefreshRowsOfAnotherDtypeAreRefused) {
  // f32 rows from a verifier of the f32 model, committed to a drafter of
  // the same shape in bf16.
  const std::vector<int32_t> prompt = Prompt(12, 4);
  auto vs = std::move(VerifySession::Create(config(), prompt, 0, {})).value();
  VerifySession* one = vs.get();
  const std::vector<int32_t> none;
  auto results = RunVerifyPass(*engine_, {&one, 1}, {&none, 1}, {});
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  const std::string rows =
      std::move(vs->EncodeRows(results[0]->refresh_first, results[0]->refresh_count)).value();
  ModelConfig c = SmallConfig();
  c.dtype = Dtype::kBf16;
  auto ds =
      std::move(DraftSession::Create(c, prompt, std::make_unique<PrefixTailKv>(c, nullptr, 0, 0), 0,
                                     DraftSessionOptions{}))
          .value();
  auto out = ds->Commit(results[0]->tokens, rows);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("refresh rows are f32"), std::string::npos) << out.status();
}

TEST_F(RemoteSessionTest, EqualsFullDecodingForEveryConfiguration) {
  const std::vector<Case> cases = {{"streamingllm", 0.25, 0}, {"snapkv", 0.3, 0},
                                   {"h2o", 0.5, 0},           {"kivi", 0, 2},
                                   {"int8", 0, 8},            {"snapkv+kivi", 0.5, 4}};
  int combos = 0;
  for (const Case& c : cases) {
    const CompressorOptions co = Options(c);
    for (int32_t prefix_len : {0, 16, 48}) {
      for (int x : {1, 3, 8}) {
        const bool refresh = (x + prefix_len) % 2 == 0;
        const int lookahead = x + (prefix_len == 16 ? 4 : 0);
        for (const SessionSampling& s : {Greedy(), Seeded(5 + x)}) {
          const auto prompt = Prompt(prefix_len + 7, 100 + prefix_len + x);
          const int n = 24;
          const RunResult r = Run(prompt, prefix_len, n, co, x, lookahead, refresh, s);
          ASSERT_EQ(r.tokens, Full(prompt, n, s))
              << c.compressor << " L=" << prefix_len << " x=" << x << " refresh=" << refresh
              << " seeded=" << (s.mode == SamplingMode::kSeeded);
          ++combos;
        }
      }
    }
  }
  EXPECT_EQ(combos, 6 * 3 * 3 * 2);
}

// Every method with an online rule ('vericache compressors').
std::vector<CompressorOptions> OnlineMethods() {
  const std::vector<Case> cases = {{"streamingllm", 0.25, 0},
                                   {"h2o", 0.5, 0},
                                   {"tova", 0.4, 0},
                                   {"kivi", 0, 2},
                                   {"kivi", 0, 4},
                                   {"int8", 0, 8},
                                   {"snapkv+kivi", 0.5, 4},
                                   {"h2o+int8", 0.5, 8}};
  std::vector<CompressorOptions> out;
  for (const Case& c : cases) out.push_back(Options(c));
  return out;
}

std::string Name(const CompressorOptions& co) {
  return co.name + ":" + std::to_string(co.ratio) + ":" + std::to_string(co.bits);
}

TEST_F(RemoteSessionTest, OnlineUpdateStillEqualsFullDecoding) {
  int combos = 0;
  for (const CompressorOptions& co : OnlineMethods()) {
    int64_t folds = 0;
    for (int32_t prefix_len : {16, 48}) {
      for (int x : {1, 3, 8}) {
        const bool refresh = (x + prefix_len / 16) % 2 == 0;
        const int lookahead = x + (prefix_len == 16 ? 4 : 0);
        for (const SessionSampling& s : {Greedy(), Seeded(7 + x)}) {
          const auto prompt = Prompt(prefix_len + 5, 300 + prefix_len + x);
          const int n = 40;
          const RunResult r = Run(prompt, prefix_len, n, co, x, lookahead, refresh, s, true);
          ASSERT_EQ(r.tokens, Full(prompt, n, s))
              << Name(co) << " L=" << prefix_len << " x=" << x << " refresh=" << refresh
              << " seeded=" << (s.mode == SamplingMode::kSeeded);
          folds += r.online_folds;
          ++combos;
        }
      }
    }
    EXPECT_GT(folds, 0) << Name(co) << " never folded";
  }
  EXPECT_EQ(combos, 8 * 2 * 3 * 2);
}

TEST_F(RemoteSessionTest, OnlineUpdateKeepsTheDrafterViewBounded) {
  // 48 stored tokens, then 256 generated: without online update every
  // generated token stays in the drafter's tail in f32.
  ModelConfig c = SmallConfig();
  c.max_seq_len = 320;
  UseModel(c, 11);
  const auto prompt = Prompt(49, 41);
  const int n = 256;
  const std::vector<int32_t> reference = Full(prompt, n, Greedy());
  for (const CompressorOptions& co : OnlineMethods()) {
    for (const bool refresh : {true, false}) {
      const RunResult plain = Run(prompt, 48, n, co, 4, 8, refresh, Greedy(), false);
      const RunResult online = Run(prompt, 48, n, co, 4, 8, refresh, Greedy(), true);
      ASSERT_EQ(plain.tokens, reference) << Name(co);
      ASSERT_EQ(online.tokens, reference) << Name(co);
      EXPECT_EQ(plain.online_folds, 0);
      EXPECT_GT(online.online_folds, 0) << Name(co);
      const int64_t plain_growth = plain.kv_bytes_peak - plain.kv_bytes_initial;
      const int64_t online_growth = online.kv_bytes_peak - online.kv_bytes_initial;
      std::printf("online %-22s refresh=%d: %lld folds, drafter KV +%lld bytes (plain +%lld)\n",
                  Name(co).c_str(), refresh, static_cast<long long>(online.online_folds),
                  static_cast<long long>(online_growth), static_cast<long long>(plain_growth));
      // The plain tail holds about one f32 row per generated token.
      EXPECT_GE(plain_growth, int64_t{n} * config().kv_bytes_per_token()) << Name(co);
      // Online, the view grows at the method's budget (INT8 on 8-dim heads
      // keeps 0.375 of f32, the others less) plus a window of exact rows.
      EXPECT_LT(online_growth * 10, plain_growth * 6)
          << Name(co) << " refresh=" << refresh << ": plain +" << plain_growth << " online +"
          << online_growth;
    }
  }
}

TEST_F(RemoteSessionTest, OnlineUpdateRejectsBadInput) {
  const auto prompt = Prompt(24, 5);
  CompressorOptions kivi;
  kivi.name = "kivi";
  kivi.bits = 4;
  DraftSessionOptions dopt;
  dopt.online.compressor = std::move(CreateCompressor(kivi)).value();
  // A full (PrefixTailKv) view has nothing to fold into.
  auto full = DraftSession::Create(config(), prompt, DrafterKv(prompt, 16, {}), 16, dopt);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(full.status().message().find("compressed view"), std::string::npos) << full.status();
  // SnapKV compresses once after prefill: no online rule.
  CompressorOptions snap;
  snap.name = "snapkv";
  snap.ratio = 0.5;
  snap.window = 8;
  DraftSessionOptions snap_opt;
  snap_opt.online.compressor = std::move(CreateCompressor(snap)).value();
  auto none = DraftSession::Create(config(), prompt, DrafterKv(prompt, 16, snap), 16, snap_opt);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no online rule"), std::string::npos) << none.status();
  // Not the compressor the view was made with.
  CompressorOptions kivi2 = kivi;
  kivi2.bits = 2;
  auto other = DraftSession::Create(config(), prompt, DrafterKv(prompt, 16, kivi2), 16, dopt);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("kivi(bits=2"), std::string::npos) << other.status();

  // A refresh after a commit without one reaches below the settled length.
  dopt.lookahead = 4;
  auto ds = std::move(DraftSession::Create(config(), prompt, DrafterKv(prompt, 16, kivi), 16, dopt))
                .value();
  while (ds->wants_step()) {
    SequenceInput in = ds->BeginStep();
    std::vector<float> logits;
    ASSERT_TRUE(engine_->Forward({&in, 1}, &logits).ok());
    ASSERT_TRUE(ds->FinishStep(logits).ok());
  }
  // The drafter's own tokens (as in lossy_remote): all final without refresh.
  const std::vector<int32_t> three(ds->drafts().begin(), ds->drafts().begin() + 3);
  ASSERT_TRUE(ds->Commit(three, "").ok());
  EXPECT_EQ(ds->compressed_view()->settled_length(), 24 + 3);
  auto vs = std::move(VerifySession::Create(config(), prompt, 16, {})).value();
  ASSERT_TRUE(vs->AttachPrefix(Prefill(prompt, 16)).ok());
  VerifySession* one = vs.get();
  const std::vector<int32_t> none_drafted;
  ASSERT_TRUE(RunVerifyPass(*engine_, {&one, 1}, {&none_drafted, 1})[0].ok());
  const std::string rows = std::move(vs->EncodeRows(16, 8)).value();  // [16, 24)
  const std::vector<int32_t> fourth(ds->drafts().begin(), ds->drafts().begin() + 1);
  const auto mixed = ds->Commit(fourth, rows);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition) << mixed.status();
  EXPECT_NE(mixed.status().message().find("settled length"), std::string::npos);
}

TEST_F(RemoteSessionTest, SharedPrefixBatchIsBitIdenticalToSeparatePasses) {
  // Three requests over one stored prefix, different suffixes and drafts:
  // one pass with the shared prefix vs each alone with its own copy.
  const auto base = Prompt(48, 7);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    auto p = base;
    for (int j = 0; j <= i; ++j) p.push_back(5 + i * 3 + j);
    prompts.push_back(p);
  }
  const std::vector<std::vector<int32_t>> drafts = {{4, 9}, {}, {7, 7, 7, 7}};
  auto shared = Prefill(base, 32);
  std::vector<std::unique_ptr<VerifySession>> together, alone;
  for (const auto& p : prompts) {
    together.push_back(std::move(VerifySession::Create(config(), p, 32, {})).value());
    alone.push_back(std::move(VerifySession::Create(config(), p, 32, {})).value());
    ASSERT_TRUE(together.back()->AttachPrefix(shared).ok());
    ASSERT_TRUE(alone.back()->AttachPrefix(Prefill(base, 32)).ok());
  }
  std::vector<VerifySession*> ptrs;
  for (auto& s : together) ptrs.push_back(s.get());
  const auto batched = RunVerifyPass(*engine_, ptrs, drafts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    VerifySession* one = alone[i].get();
    const auto single = RunVerifyPass(*engine_, {&one, 1}, {&drafts[i], 1});
    ASSERT_TRUE(batched[i].ok() && single[0].ok());
    EXPECT_EQ(batched[i]->tokens, single[0]->tokens);
    const std::string a = std::move(together[i]->EncodeRows(32, together[i]->committed() - 32)).value();
    const std::string b = std::move(alone[i]->EncodeRows(32, alone[i]->committed() - 32)).value();
    EXPECT_EQ(a, b) << "exact K/V differs for request " << i;
  }
}

TEST_F(RemoteSessionTest, RejectsBadInput) {
  const auto prompt = Prompt(20, 3);
  EXPECT_EQ(VerifySession::Create(config(), {}, 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifySession::Create(config(), prompt, 20, {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // no suffix token left
  auto bad = prompt;
  bad[3] = 999;
  EXPECT_EQ(VerifySession::Create(config(), bad, 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  VerifySessionOptions rej;
  rej.sampling.mode = SamplingMode::kRejection;  // without a temperature
  EXPECT_EQ(VerifySession::Create(config(), prompt, 0, rej).status().code(),
            absl::StatusCode::kInvalidArgument);
  {
    // Rejection sampling needs one valid distribution per draft.
    rej.sampling.params.temperature = 1.0f;
    auto rs = std::move(VerifySession::Create(config(), prompt, 16, rej)).value();
    ASSERT_TRUE(rs->AttachPrefix(Prefill(prompt, 16)).ok());
    const std::vector<int32_t> two = {4, 5};
    const std::vector<double> uniform(config().vocab_size, 1.0);
    std::vector<double> zero_at_draft = uniform;
    zero_at_draft[5] = 0;
    std::vector<double> negative = uniform;
    negative[7] = -0.5;
    const std::vector<std::vector<double>> one_only = {uniform};
    const std::vector<std::vector<double>> zero = {uniform, zero_at_draft};
    const std::vector<std::vector<double>> neg = {uniform, negative};
    const std::vector<std::vector<double>> short_q = {uniform, std::vector<double>(3, 1.0)};
    for (const auto& probs : {one_only, zero, neg, short_q}) {
      EXPECT_EQ(rs->BeginPass(two, probs).status().code(), absl::StatusCode::kInvalidArgument);
    }
    const std::vector<std::vector<double>> good = {uniform, uniform};
    EXPECT_TRUE(rs->BeginPass(two, good).ok());
    rs->AbortPass();
    // Distributions are refused outside rejection sampling.
    EXPECT_EQ(VerifySession::Create(config(), prompt, 16, {}).value()->BeginPass(two, good).status().code(),
              absl::StatusCode::kFailedPrecondition);  // no prefix attached: checked first
  }

  auto vs = std::move(VerifySession::Create(config(), prompt, 16, {})).value();
  const std::vector<int32_t> d = {4};
  EXPECT_EQ(vs->BeginPass(d).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(vs->AttachPrefix(Prefill(prompt, 8)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(vs->AttachPrefix(Prefill(prompt, 16)).ok());
  const std::vector<int32_t> bad_draft = {-1};
  EXPECT_EQ(vs->BeginPass(bad_draft).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> too_long(200, 4);
  EXPECT_EQ(vs->BeginPass(too_long).status().code(), absl::StatusCode::kOutOfRange);

  DraftSessionOptions dopt;
  auto ds = std::move(DraftSession::Create(config(), prompt, DrafterKv(prompt, 16, {}), 16, dopt))
                .value();
  EXPECT_EQ(ds->Commit({}, "").status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> t = {4, 5};
  EXPECT_EQ(ds->Commit(t, "garbage").status().code(), absl::StatusCode::kDataLoss);
  // Rows of positions that are not verified.
  auto other = std::move(VerifySession::Create(config(), Prompt(40, 9), 16, {})).value();
  ASSERT_TRUE(other->AttachPrefix(Prefill(Prompt(40, 9), 16)).ok());
  VerifySession* o = other.get();
  const std::vector<int32_t> none;
  ASSERT_TRUE(RunVerifyPass(*engine_, {&o, 1}, {&none, 1})[0].ok());
  const std::string rows = std::move(other->EncodeRows(16, 24)).value();
  EXPECT_EQ(ds->Commit(t, rows).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DraftSession::Create(config(), prompt, DrafterKv(prompt, 8, {}), 16, dopt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RemoteSessionTest, RejectionSamplingMatchesFullDistribution) {
  // A 6-token vocabulary makes the exact distribution of (t2, t3) cheap to
  // enumerate; a hot temperature makes the compressed drafter disagree often
  // enough that the accept/residual path is exercised.
  const int vocab = 6;
  UseModel(SmallConfig(vocab), 21);
  std::mt19937_64 rng(4);
  std::vector<int32_t> prompt = {1};
  while (prompt.size() < 24) prompt.push_back(static_cast<int32_t>(rng() % vocab));
  SessionSampling sampling;
  sampling.mode = SamplingMode::kRejection;
  sampling.params.temperature = 6.0f;

  auto next_dist = [&](const std::vector<int32_t>& seq) {
    PagedKvCache kv(config());
    std::vector<float> logits;
    SequenceInput in{&kv, seq, static_cast<int64_t>(seq.size()) - 1};
    EXPECT_TRUE(engine_->Forward({&in, 1}, &logits).ok());
    return FilteredDistribution(logits, sampling.params);
  };
  const auto exact = testing::ExactSecondAndThirdTokens(next_dist, prompt, vocab);
  CompressorOptions co;
  co.name = "streamingllm";
  co.ratio = 0.25;
  co.sink_tokens = 2;
  co.window = 4;
  // Under a sanitizer the same paths run over fewer seeds: there memory
  // errors are the point, and the optimised build runs the full test.
  const int n = test_support::kUnderSanitizer ? 600 : 3000;
  std::map<std::pair<int, int>, int> counts;
  int64_t rejected = 0;
  for (int s = 0; s < n; ++s) {
    sampling.params.seed = 1000 + s;
    // Stored prefix of 16 tokens, x = 2 with one draft of continuation.
    const RunResult r = Run(prompt, 16, 3, co, 2, 3, true, sampling);
    ASSERT_EQ(r.tokens.size(), 3u);
    ++counts[{r.tokens[1], r.tokens[2]}];
    rejected += r.rejected;
  }
  const testing::ChiSquare chi = testing::PooledChiSquare(exact, counts, n);
  std::printf("split rejection sampling: chi2 %.1f, dof %d, limit %.1f, drafts rejected %lld\n",
              chi.statistic, chi.dof, chi.limit, static_cast<long long>(rejected));
  EXPECT_GT(rejected, n / 200) << "the drafter must disagree sometimes for this test to mean much";
  EXPECT_LT(chi.statistic, chi.limit);
}

TEST_F(RemoteSessionTest, VerifierJudgesAnyDraftDistributionExactly) {
  // The split drafter above rarely disagrees (random models attend weakly).
  // Here the drafts come from a distribution far from the target's (most
  // mass on the tokens p likes least), so many are rejected: the token the verifier emits at the
  // draft's position must still follow p exactly.
  const int vocab = 6;
  UseModel(SmallConfig(vocab), 21);
  std::vector<int32_t> prompt = {1, 3, 4, 0, 5, 2, 2, 3};
  SessionSampling sampling;
  sampling.mode = SamplingMode::kRejection;
  sampling.params.temperature = 6.0f;
  PagedKvCache kv(config());
  std::vector<float> logits;
  SequenceInput in{&kv, prompt, static_cast<int64_t>(prompt.size()) - 1};
  ASSERT_TRUE(engine_->Forward({&in, 1}, &logits).ok());
  const std::vector<double> p = FilteredDistribution(logits, sampling.params);
  // Skewed towards the ids p likes least.
  std::vector<double> q(vocab);
  std::vector<int> order(vocab);
  for (int t = 0; t < vocab; ++t) order[t] = t;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] < p[b]; });
  for (int i = 0; i < vocab; ++i) q[order[i]] = std::pow(0.4, i);
  std::discrete_distribution<int32_t> draw_q(q.begin(), q.end());
  std::mt19937_64 rng(8);
  const int n = 3000;
  std::map<int, double> exact;
  for (int t = 0; t < vocab; ++t) exact[t] = p[t];
  std::map<int, int> counts;
  int rejected = 0;
  const auto prefix = Prefill(prompt, 0);
  for (int s = 0; s < n; ++s) {
    VerifySessionOptions vo;
    vo.sampling = sampling;
    vo.sampling.params.seed = 7000 + s;
    auto vs = std::move(VerifySession::Create(config(), prompt, 0, vo)).value();
    ASSERT_TRUE(vs->AttachPrefix(prefix).ok());
    const std::vector<int32_t> drafts = {draw_q(rng)};
    const std::vector<std::vector<double>> probs = {q};
    VerifySession* one = vs.get();
    const auto out = RunVerifyPass(*engine_, {&one, 1}, {&drafts, 1}, {&probs, 1});
    ASSERT_TRUE(out[0].ok()) << out[0].status();
    ++counts[out[0]->tokens[0]];
    rejected += out[0]->accepted == 0;
  }
  const testing::ChiSquare chi = testing::PooledChiSquare(exact, counts, n);
  std::printf("verifier judge: chi2 %.1f, dof %d, limit %.1f, drafts rejected %d of %d\n",
              chi.statistic, chi.dof, chi.limit, rejected, n);
  EXPECT_GT(rejected, n / 10);
  EXPECT_LT(chi.statistic, chi.limit);
}

}  // namespace
}  // namespace vc::cluster
