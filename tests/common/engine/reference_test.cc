// The engine against the independent float64 reference (tests/reference).
//
// On the three real checkpoints (two llama2.c, one Hugging Face), several
// prompts are teacher-forced over the whole context (the prompt, then the
// reference's own greedy tokens): at every position the engine's f32 logits
// must lie within a tolerance of the reference's, and its argmax must agree
// except at near-ties. A free-running greedy run of the engine may leave the
// reference's stream only at a near-tie (fewer prompts under a sanitizer:
// tests/sanitizer_scale.h). Random models then cover what the checkpoints do
// not: RoPE layouts and scalings, q/k/v biases, GQA ratios, sliding windows
// and an untied classifier.
//
// Tolerance. The engine computes in f32 (24-bit mantissa) through a handful of
// layers; its rounding error grows roughly with the magnitude of the values,
// so logits are compared relative to the row's scale:
//   max_j |engine_j - ref_j| <= kRelTol * max(1, max_j |ref_j|).
// kRelTol = 1e-4. Observed (printed by each test): stories260K up to 8.4e-6
// (9.7e-5 absolute at |logit| ~22), aidreams260K up to 7.4e-7, random models
// up to 2.4e-7; so the bound has >10x headroom. Mistakes it must catch are
// far larger: a wrong RoPE layout, a sliding window, theta 1e4 -> 2e4 or a
// 1% linear RoPE scaling move the logits by 3e-3 to 4e-2 relative
// (ToleranceSeparatesConfigMistakes below).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/reference/llama_ref_f64.h"
#include "tests/sanitizer_scale.h"

namespace vc {
namespace {

using reference::GreedyRun;
using reference::ReferenceGreedy;
using reference::TopTwoOf;

constexpr double kRelTol = 1e-4;
// Below this top1-top2 margin of the reference, f32 may pick either token.
constexpr double kNearTie = 1e-4;

std::string ModelPath(const char* file) {
  const char* dir = std::getenv("VC_MODELS_DIR");
  if (dir == nullptr) return "";
  const std::string path = std::string(dir) + "/" + file;
  return std::filesystem::exists(path) ? path : "";
}

std::unique_ptr<Engine> MakeEngine(const Model& model, int threads = 2) {
  EngineOptions options;
  options.backend.threads = threads;
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

int32_t ArgmaxF(const float* row, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return best;
}

// Engine logits of every position of `tokens`: tokens [0, prefill) as one
// prefill pass, then one decode pass per token.
void EngineTeacherForced(Engine& engine, const std::vector<int32_t>& tokens, size_t prefill,
                         std::vector<std::vector<float>>* rows) {
  const int vocab = engine.config().vocab_size;
  PagedKvCache kv(engine.config());
  rows->clear();
  size_t done = 0;
  std::vector<float> logits;
  while (done < tokens.size()) {
    const size_t n = done == 0 ? std::max<size_t>(1, prefill) : 1;
    SequenceInput in;
    in.kv = &kv;
    in.tokens = std::span<const int32_t>(tokens.data() + done, n);
    in.first_logit = 0;
    const absl::Status s = engine.Forward(std::span<const SequenceInput>(&in, 1), &logits);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(logits.size(), n * static_cast<size_t>(vocab));
    for (size_t i = 0; i < n; ++i) {
      rows->emplace_back(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
    }
    done += n;
  }
}

// The engine's own greedy stream: prefill `prompt` (last logit only), then
// decode its argmax until `total` tokens.
void EngineGreedy(Engine& engine, const std::vector<int32_t>& prompt, size_t total,
                  std::vector<int32_t>* out) {
  const int vocab = engine.config().vocab_size;
  PagedKvCache kv(engine.config());
  *out = prompt;
  std::vector<float> logits;
  size_t done = 0;
  while (out->size() < total) {
    SequenceInput in;
    in.kv = &kv;
    in.tokens = std::span<const int32_t>(out->data() + done, out->size() - done);
    in.first_logit = static_cast<int64_t>(in.tokens.size()) - 1;
    const absl::Status s = engine.Forward(std::span<const SequenceInput>(&in, 1), &logits);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(logits.size(), static_cast<size_t>(vocab));
    done = out->size();
    out->push_back(ArgmaxF(logits.data(), vocab));
  }
}

struct Stats {
  double max_abs = 0.0;    // largest |engine - ref| seen
  double max_rel = 0.0;    // largest |engine - ref| / max(1, row scale)
  double max_scale = 0.0;  // largest |ref| seen
  int positions = 0;
  int near_ties = 0;     // reference margin < kNearTie
  int argmax_flips = 0;  // engine argmax != reference argmax (all at near-ties)
  double min_margin = INFINITY;
};

// Compares engine rows to reference rows position by position.
void Compare(const std::string& label, const std::vector<std::vector<double>>& ref,
             const std::vector<std::vector<float>>& eng, Stats* st) {
  ASSERT_EQ(ref.size(), eng.size()) << label;
  for (size_t p = 0; p < ref.size(); ++p) {
    const auto& r = ref[p];
    const auto& e = eng[p];
    ASSERT_EQ(r.size(), e.size());
    double scale = 0.0, diff = 0.0;
    for (size_t j = 0; j < r.size(); ++j) {
      ASSERT_TRUE(std::isfinite(e[j])) << label << " pos " << p << " logit " << j;
      scale = std::max(scale, std::fabs(r[j]));
      diff = std::max(diff, std::fabs(static_cast<double>(e[j]) - r[j]));
    }
    const double rel = diff / std::max(1.0, scale);
    st->max_abs = std::max(st->max_abs, diff);
    st->max_rel = std::max(st->max_rel, rel);
    st->max_scale = std::max(st->max_scale, scale);
    ++st->positions;
    ASSERT_LE(rel, kRelTol) << label << " pos " << p << ": max |engine - ref| = " << diff
                            << " with logit scale " << scale;

    const auto top = TopTwoOf(r);
    st->min_margin = std::min(st->min_margin, top.margin);
    const int32_t got = ArgmaxF(e.data(), static_cast<int>(e.size()));
    if (top.margin < kNearTie) ++st->near_ties;
    if (got != top.top1) {
      ++st->argmax_flips;
      ASSERT_LT(top.margin, kNearTie) << label << " pos " << p << ": engine argmax " << got << " ("
                                      << e[got] << "), reference argmax " << top.top1 << " ("
                                      << r[top.top1] << ") with margin " << top.margin;
    }
  }
}

std::vector<int32_t> RandomPrompt(std::mt19937_64& rng, int length, int vocab, int bos) {
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<int32_t> p(static_cast<size_t>(length));
  for (auto& t : p) t = tok(rng);
  p[0] = bos;
  return p;
}

void PrintStats(const std::string& label, const Stats& st) {
  std::cout << label << ": " << st.positions << " positions, max |diff| " << st.max_abs
            << ", max rel diff " << st.max_rel << " (tol " << kRelTol << "), max |logit| "
            << st.max_scale << ", min ref margin " << st.min_margin << ", near-ties (<" << kNearTie
            << ") " << st.near_ties << ", argmax flips " << st.argmax_flips << "\n";
}

// Teacher-forced comparison over the whole context plus the free-running
// greedy check, for each prompt length.
void CheckModel(const Model& model, const std::vector<int>& prompt_lengths, uint64_t seed) {
  const ModelConfig& c = model.config();
  auto engine = MakeEngine(model);
  ASSERT_NE(engine, nullptr);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : prompt_lengths) {
    ASSERT_LT(len, c.max_seq_len);
    prompts.push_back(RandomPrompt(rng, len, c.vocab_size, c.bos_id));
  }

  // The reference runs are independent; spread them over the cores.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<GreedyRun> runs(prompts.size());
  {
    std::vector<std::thread> workers;
    for (size_t i = 0; i < prompts.size(); ++i) {
      workers.emplace_back([&, i] { runs[i] = ReferenceGreedy(model, prompts[i], c.max_seq_len); });
    }
    for (auto& w : workers) w.join();
  }
  const auto t1 = std::chrono::steady_clock::now();

  Stats total;
  int divergences = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string label =
        model.source() + " prompt " + std::to_string(prompts[i].size()) + " tokens";
    std::vector<std::vector<float>> eng;
    ASSERT_NO_FATAL_FAILURE(EngineTeacherForced(*engine, runs[i].tokens, prompts[i].size(), &eng));
    Stats st;
    ASSERT_NO_FATAL_FAILURE(Compare(label, runs[i].logits, eng, &st));
    PrintStats(label, st);
    total.max_abs = std::max(total.max_abs, st.max_abs);
    total.max_rel = std::max(total.max_rel, st.max_rel);
    total.max_scale = std::max(total.max_scale, st.max_scale);
    total.min_margin = std::min(total.min_margin, st.min_margin);
    total.positions += st.positions;
    total.near_ties += st.near_ties;
    total.argmax_flips += st.argmax_flips;

    // Free-running greedy: the engine's stream may leave the reference's only
    // where the reference itself nearly tied.
    std::vector<int32_t> greedy;
    ASSERT_NO_FATAL_FAILURE(EngineGreedy(*engine, prompts[i], c.max_seq_len, &greedy));
    ASSERT_EQ(greedy.size(), runs[i].tokens.size());
    for (size_t p = prompts[i].size(); p < greedy.size(); ++p) {
      if (greedy[p] == runs[i].tokens[p]) continue;
      const double margin = TopTwoOf(runs[i].logits[p - 1]).margin;
      std::cout << label << ": free-running greedy diverges at position " << p
                << " (reference margin " << margin << ")\n";
      EXPECT_LT(margin, kNearTie) << label << ": greedy diverged at position " << p
                                  << " where the reference margin is " << margin;
      ++divergences;
      break;
    }
  }
  const auto t2 = std::chrono::steady_clock::now();
  PrintStats(model.source() + " (all prompts)", total);
  std::cout << model.source() << ": greedy divergences " << divergences << "/" << prompts.size()
            << "; reference " << std::chrono::duration<double>(t1 - t0).count() << " s, engine "
            << std::chrono::duration<double>(t2 - t1).count() << " s\n";
}

TEST(ReferenceTest, Stories260KMatchesReferenceOverWholeContext) {
  const std::string path = ModelPath("stories260K.bin");
  if (path.empty()) GTEST_SKIP() << "stories260K.bin not found in VC_MODELS_DIR";
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->config().max_seq_len, 512);
  CheckModel(**model, test_support::FullOrUnderSanitizer({1, 13, 100, 257, 400}, {13, 257}), 260);
}

TEST(ReferenceTest, AiDreams260KMatchesReferenceOverWholeContext) {
  const std::string path = ModelPath("aidreams260K.bin");
  if (path.empty()) GTEST_SKIP() << "aidreams260K.bin not found in VC_MODELS_DIR";
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->config().max_seq_len, 128);
  CheckModel(**model, test_support::FullOrUnderSanitizer({1, 6, 31, 77, 127}, {6, 77}), 128);
}

// Pieces of a llama2.c tokenizer file (int32 max length; then per id: f32
// score, int32 length, bytes), with "<0xNN>" byte pieces turned into bytes.
void ReadPieces(const std::string& path, std::vector<std::string>* pieces) {
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << path;
  int32_t max_len = 0;
  in.read(reinterpret_cast<char*>(&max_len), sizeof(max_len));
  pieces->clear();
  for (int i = 0; i < 512; ++i) {
    float score = 0.0f;
    int32_t len = 0;
    in.read(reinterpret_cast<char*>(&score), sizeof(score));
    in.read(reinterpret_cast<char*>(&len), sizeof(len));
    ASSERT_TRUE(in.good() && len >= 0 && len <= max_len) << path << " piece " << i;
    std::string piece(static_cast<size_t>(len), '\0');
    in.read(piece.data(), len);
    if (piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece[5] == '>') {
      piece = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    }
    pieces->push_back(piece);
  }
}

// BOS, then " I", " d", "re", "a", "m", " of": the tokenizer's BPE encoding of
// "I dream of" with its dummy-prefix space.
const std::vector<int32_t> kIDreamOf = {1, 303, 281, 269, 435, 447, 275};

// The reference itself, anchored to a known output: the aidreams260K README
// says greedy from "I dream of" continues "0.000000. Dimensions unfold, ...".
// The prompt ids below are that text's encoding (BOS, then the pieces of
// " I dream of"); the continuation is decoded with the tokenizer file.
TEST(ReferenceTest, ReferenceReproducesKnownAiDreamsContinuation) {
  const std::string model_path = ModelPath("aidreams260K.bin");
  const std::string tok_path = ModelPath("aidreams260K.tok512.bin");
  if (model_path.empty() || tok_path.empty()) GTEST_SKIP() << "aidreams260K files not found";
  auto model = Model::Load(model_path);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> pieces;
  ASSERT_NO_FATAL_FAILURE(ReadPieces(tok_path, &pieces));
  ASSERT_EQ(pieces.size(), 512u);
  const std::vector<int32_t> prompt = kIDreamOf;
  std::string prompt_text;
  for (size_t i = 1; i < prompt.size(); ++i) prompt_text += pieces[prompt[i]];
  ASSERT_EQ(prompt_text, " I dream of");
  const GreedyRun run = ReferenceGreedy(**model, prompt, static_cast<int32_t>(prompt.size()) + 24);
  std::string text;
  for (size_t i = prompt.size(); i < run.tokens.size(); ++i) text += pieces[run.tokens[i]];
  std::cout << "reference greedy: \"" << text << "\"\n";
  EXPECT_EQ(text.rfind(" 0.000000. Dimensions unfold", 0), 0u) << text;
}

// A Hugging Face checkpoint directory under VC_MODELS_DIR, or "".
std::string ModelDir(const char* name) {
  const std::string path = ModelPath(name);
  return !path.empty() && std::filesystem::is_directory(path) ? path : "";
}

// tinystories656K: a Hugging Face checkpoint (half-split RoPE, GQA 8/4, tied
// embeddings stored as lm_head.weight only, RMSNorm eps 1e-6).
TEST(ReferenceTest, TinyStories656KMatchesReferenceOverWholeContext) {
  const std::string dir = ModelDir("tinystories656K");
  if (dir.empty()) GTEST_SKIP() << "tinystories656K not found in VC_MODELS_DIR";
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ASSERT_EQ(c.max_seq_len, 512);
  ASSERT_EQ(c.rope.layout, RopeLayout::kHalfSplit);
  ASSERT_TRUE(c.tied_embeddings);
  CheckModel(**model, test_support::FullOrUnderSanitizer({1, 6, 200}, {200}), 656);
}

// The id -> text pieces of a tokenizer.json's BPE vocabulary, with the
// SentencePiece word marker turned back into a space: enough to read this
// model's output without a tokenizer implementation.
void ReadHfPieces(const std::string& path, std::vector<std::string>* pieces) {
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << path;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("model") && j["model"].contains("vocab")) << path;
  const auto& vocab = j["model"]["vocab"];
  pieces->assign(vocab.size(), "");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const size_t id = it.value().get<size_t>();
    ASSERT_LT(id, pieces->size());
    const std::string& raw = it.key();
    std::string piece;
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw.compare(k, 3, "\xe2\x96\x81") == 0) {
        piece.push_back(' ');
        k += 2;
      } else {
        piece.push_back(raw[k]);
      }
    }
    (*pieces)[id] = std::move(piece);
  }
}

// The reference anchored to the model card's known output: greedy from
// "<|start_story|>Once upon a time" continues ", a little girl named Lily
// lived in a small house with her mom, dad, and her dog, Spot, ...".
TEST(ReferenceTest, ReferenceReproducesKnownTinyStoriesContinuation) {
  const std::string dir = ModelDir("tinystories656K");
  if (dir.empty()) GTEST_SKIP() << "tinystories656K not found in VC_MODELS_DIR";
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> pieces;
  ASSERT_NO_FATAL_FAILURE(ReadHfPieces(dir + "/tokenizer.json", &pieces));
  ASSERT_EQ(pieces.size(), 2048u);
  const std::vector<int32_t> prompt = {1, 80, 147, 201, 282, 57};
  std::string prompt_text;
  for (int32_t id : prompt) prompt_text += pieces[static_cast<size_t>(id)];
  ASSERT_EQ(prompt_text, "<|start_story|> Once upon a time");
  const GreedyRun run = ReferenceGreedy(**model, prompt, static_cast<int32_t>(prompt.size()) + 30);
  std::string text;
  for (size_t i = prompt.size(); i < run.tokens.size(); ++i)
    text += pieces[static_cast<size_t>(run.tokens[i])];
  std::cout << "reference greedy: \"" << text << "\"\n";
  EXPECT_EQ(
      text.rfind(
          ", a little girl named Lily lived in a small house with her mom, dad, and her dog, Spot",
          0),
      0u)
      << text;
  // And the engine, free-running, produces the same tokens.
  auto engine = MakeEngine(**model);
  ASSERT_NE(engine, nullptr);
  std::vector<int32_t> greedy;
  ASSERT_NO_FATAL_FAILURE(EngineGreedy(*engine, prompt, run.tokens.size(), &greedy));
  EXPECT_EQ(greedy, run.tokens);
}

// Random models for what the checkpoints do not exercise.
struct RandomCase {
  const char* name;
  ModelConfig config;
};

ModelConfig BaseConfig() {
  ModelConfig c;
  c.architecture = "random";
  c.dim = 48;
  c.hidden_dim = 100;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 12;
  c.vocab_size = 97;
  c.max_seq_len = 96;
  return c;
}

std::vector<RandomCase> RandomCases() {
  std::vector<RandomCase> cases;
  {
    RandomCase rc{"interleaved_gqa2", BaseConfig()};
    cases.push_back(rc);
  }
  {
    RandomCase rc{"halfsplit_bias_mha", BaseConfig()};
    rc.config.n_kv_heads = 4;
    rc.config.rope.layout = RopeLayout::kHalfSplit;
    rc.config.qkv_bias = true;
    rc.config.rope.theta = 500.0;
    cases.push_back(rc);
  }
  {
    RandomCase rc{"linear_scaling_gqa8_untied", BaseConfig()};
    rc.config.dim = 40;
    rc.config.n_heads = 8;
    rc.config.n_kv_heads = 1;
    rc.config.head_dim = 8;
    rc.config.tied_embeddings = false;
    rc.config.rope.scaling = RopeConfig::Scaling::kLinear;
    rc.config.rope.factor = 4.0;
    cases.push_back(rc);
  }
  {
    // head_dim 16, theta 1e4: wavelengths 6.3 .. 2e4, so with an original
    // context of 1024 the pairs take all three branches of the Llama 3 rule.
    RandomCase rc{"llama3_scaling_halfsplit_gqa4", BaseConfig()};
    rc.config.dim = 64;
    rc.config.n_heads = 8;
    rc.config.n_kv_heads = 2;
    rc.config.head_dim = 16;
    rc.config.rope.layout = RopeLayout::kHalfSplit;
    rc.config.rope.scaling = RopeConfig::Scaling::kLlama3;
    rc.config.rope.factor = 8.0;
    rc.config.rope.low_freq_factor = 1.0;
    rc.config.rope.high_freq_factor = 4.0;
    rc.config.rope.original_max_position = 1024;
    cases.push_back(rc);
  }
  {
    RandomCase rc{"sliding_window_bias", BaseConfig()};
    rc.config.sliding_window = 9;
    rc.config.qkv_bias = true;
    rc.config.rms_norm_eps = 1e-6f;
    cases.push_back(rc);
  }
  {
    RandomCase rc{"head_dim24_q_dim_ne_dim", BaseConfig()};
    rc.config.dim = 40;
    rc.config.n_heads = 3;
    rc.config.n_kv_heads = 3;
    rc.config.head_dim = 24;
    rc.config.rope.theta = 1e6;
    cases.push_back(rc);
  }
  return cases;
}

void CheckRandomCase(const RandomCase& rc, uint64_t seed) {
  auto model = Model::CreateRandom(rc.config, seed);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = MakeEngine(**model);
  ASSERT_NE(engine, nullptr);
  std::mt19937_64 rng(seed);
  Stats st;
  for (int len : {1, 20, 70}) {
    const auto prompt = RandomPrompt(rng, len, rc.config.vocab_size, rc.config.bos_id);
    const GreedyRun run = ReferenceGreedy(**model, prompt, rc.config.max_seq_len);
    std::vector<std::vector<float>> eng;
    ASSERT_NO_FATAL_FAILURE(EngineTeacherForced(*engine, run.tokens, prompt.size(), &eng));
    ASSERT_NO_FATAL_FAILURE(
        Compare(std::string(rc.name) + " prompt " + std::to_string(len), run.logits, eng, &st));
  }
  PrintStats(rc.name, st);
}

TEST(ReferenceTest, RandomModelsMatchReference) {
  uint64_t seed = 1000;
  for (const auto& rc : RandomCases()) {
    SCOPED_TRACE(rc.name);
    CheckRandomCase(rc, ++seed);  // a failing case does not stop the others
  }
}

// Mutating the config must move the reference by far more than kRelTol: the
// tolerance is tight enough to catch the bugs it is meant to catch.
TEST(ReferenceTest, ToleranceSeparatesConfigMistakes) {
  ModelConfig base = BaseConfig();
  base.qkv_bias = true;
  base.sliding_window = 0;
  std::vector<ModelConfig> variants;
  auto v = base;
  v.rope.layout = RopeLayout::kHalfSplit;
  variants.push_back(v);
  v = base;
  v.rope.theta = 20000.0;
  variants.push_back(v);
  v = base;
  v.sliding_window = 40;
  variants.push_back(v);
  v = base;
  v.rope.scaling = RopeConfig::Scaling::kLinear;
  v.rope.factor = 1.01;
  variants.push_back(v);
  auto model = Model::CreateRandom(base, 7);
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937_64 rng(7);
  const auto tokens = RandomPrompt(rng, 60, base.vocab_size, base.bos_id);
  const auto want = reference::ReferenceLogits(**model, tokens);
  for (size_t i = 0; i < variants.size(); ++i) {
    auto other = Model::CreateRandom(variants[i], 7);  // same weights: same shapes, same seed
    ASSERT_TRUE(other.ok()) << other.status();
    const auto got = reference::ReferenceLogits(**other, tokens);
    double worst = 0.0;
    for (size_t p = 0; p < got.size(); ++p) {
      double scale = 0.0, diff = 0.0;
      for (size_t j = 0; j < got[p].size(); ++j) {
        scale = std::max(scale, std::fabs(want[p][j]));
        diff = std::max(diff, std::fabs(got[p][j] - want[p][j]));
      }
      worst = std::max(worst, diff / std::max(1.0, scale));
    }
    std::cout << "variant " << i << ": max rel change " << worst << "\n";
    EXPECT_GT(worst, 10 * kRelTol) << "variant " << i;
  }
}

}  // namespace
}  // namespace vc
