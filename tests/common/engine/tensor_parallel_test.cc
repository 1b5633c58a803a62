// Tensor parallelism changes no bit (docs/numerics.md, "Tensor
// parallelism"): on random models with GQA ratios 1, 2, 4 and 8, an engine at
// degree T = 2, 4, 8 gives memcmp-identical logits to T = 1 over mixed
// batches of prefill, 1-token decode and multi-token verify passes; degrees
// that do not divide the block count B or n_kv_heads are clear errors.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "gtest/gtest.h"

namespace vc {
namespace {

ModelConfig Shape(int dim, int hidden, int layers, int heads, int kv_heads, int head_dim, int vocab,
                  bool bias) {
  ModelConfig c;
  c.architecture = "random";
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = vocab;
  c.max_seq_len = 64;
  c.qkv_bias = bias;
  return c;
}

// A fixed schedule of passes over two sequences: A prefills alone; then B
// prefills while A decodes; then A verifies a 4-token draft while B decodes;
// then both decode. Returns every logit row in order.
std::vector<float> RunSchedule(const Model& model, int degree, uint64_t seed) {
  EngineOptions options;
  options.backend.threads = 2;
  options.tensor_parallel = degree;
  auto engine_or = Engine::Create(model, options);
  EXPECT_TRUE(engine_or.ok()) << engine_or.status();
  if (!engine_or.ok()) return {};
  Engine& engine = **engine_or;
  const ModelConfig& c = model.config();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
  };
  PagedKvCache::Options ko;
  ko.block_tokens = 4;
  PagedKvCache a(c, ko), b(c, ko);
  std::vector<float> all, logits;
  auto pass = [&](std::vector<std::pair<PagedKvCache*, std::vector<int32_t>>> entries) {
    std::vector<SequenceInput> batch;
    for (auto& [kv, t] : entries) {
      SequenceInput in;
      in.kv = kv;
      in.tokens = t;
      in.first_logit = 0;
      batch.push_back(in);
    }
    const absl::Status s = engine.Forward(batch, &logits);
    EXPECT_TRUE(s.ok()) << s;
    all.insert(all.end(), logits.begin(), logits.end());
  };
  pass({{&a, tokens(9)}});
  pass({{&b, tokens(5)}, {&a, tokens(1)}});
  pass({{&a, tokens(4)}, {&b, tokens(1)}});
  for (int i = 0; i < 3; ++i) pass({{&b, tokens(1)}, {&a, tokens(1)}});
  // Roll A back over a rejected part of a draft and verify again.
  a.Truncate(a.next_position() - 2);
  pass({{&a, tokens(3)}});
  return all;
}

size_t FirstDifference(const std::vector<float>& x, const std::vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return i;
  }
  return x.size();
}

struct Spec {
  std::string name;
  ModelConfig config;
  std::vector<int> degrees;  // beyond 1
};

TEST(TensorParallelTest, LogitsAreBitIdenticalAcrossDegrees) {
  std::vector<Spec> specs;
  // GQA 1, 2, 4, 8 with 8 KV heads, so every degree up to 8 is valid (B = 8).
  specs.push_back({"gqa1_bias", Shape(48, 64, 2, 8, 8, 6, 101, true), {2, 4, 8}});
  specs.push_back({"gqa2", Shape(40, 72, 2, 16, 8, 4, 67, false), {2, 4, 8}});
  {
    Spec s{"gqa4_llama3_bias", Shape(64, 96, 2, 32, 8, 4, 90, true), {2, 4, 8}};
    s.config.rope.layout = RopeLayout::kHalfSplit;
    s.config.rope.scaling = RopeConfig::Scaling::kLlama3;
    s.config.rope.factor = 8.0;
    s.config.rope.original_max_position = 256;
    specs.push_back(s);
  }
  {
    Spec s{"gqa8_window_untied", Shape(32, 80, 2, 16, 2, 4, 77, false), {2}};
    s.config.sliding_window = 5;
    s.config.tied_embeddings = false;
    specs.push_back(s);
  }
  specs.push_back({"gqa8_kv8", Shape(32, 48, 1, 64, 8, 2, 50, false), {2, 4, 8}});
  // B = 4 (hidden_dim 36 is not a multiple of 8), GQA 2.
  specs.push_back({"b4_gqa2", Shape(24, 36, 2, 8, 4, 6, 61, true), {2, 4}});
  uint64_t seed = 1000;
  for (const Spec& s : specs) {
    SCOPED_TRACE(s.name);
    auto model = Model::CreateRandom(s.config, ++seed);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<float> want = RunSchedule(**model, 1, seed);
    ASSERT_FALSE(want.empty());
    for (int degree : s.degrees) {
      const std::vector<float> got = RunSchedule(**model, degree, seed);
      ASSERT_EQ(got.size(), want.size()) << "degree " << degree;
      const size_t i = FirstDifference(want, got);
      EXPECT_EQ(i, want.size()) << "degree " << degree << ": first difference at element " << i
                                << ": " << want[i] << " vs " << got[i];
    }
  }
}

TEST(TensorParallelTest, ReductionBlocksIsTheLargestCommonPowerOfTwoUpTo8) {
  EXPECT_EQ(ReductionBlocks(Shape(48, 64, 1, 8, 8, 6, 10, false)), 8);
  EXPECT_EQ(ReductionBlocks(Shape(24, 36, 1, 8, 4, 6, 10, false)), 4);   // 36 = 4 * 9
  EXPECT_EQ(ReductionBlocks(Shape(24, 70, 1, 4, 4, 6, 10, false)), 2);   // 70 = 2 * 35
  EXPECT_EQ(ReductionBlocks(Shape(24, 64, 1, 3, 3, 5, 10, false)), 1);   // q_dim 15
  EXPECT_EQ(ReductionBlocks(Shape(20, 64, 1, 5, 5, 4, 10, false)), 4);   // q_dim 20
}

TEST(TensorParallelTest, InvalidDegreesAreClearErrors) {
  struct Case {
    ModelConfig config;
    int degree;
  };
  const std::vector<Case> cases = {
      {Shape(48, 64, 1, 8, 8, 6, 30, false), 3},   // does not divide B = 8
      {Shape(48, 64, 1, 8, 8, 6, 30, false), 16},  // larger than B
      {Shape(24, 36, 1, 8, 4, 6, 30, false), 8},   // B = 4
      {Shape(48, 64, 1, 8, 2, 6, 30, false), 4},   // n_kv_heads = 2
      {Shape(48, 64, 1, 8, 8, 6, 30, false), 0},
      {Shape(48, 64, 1, 8, 8, 6, 30, false), -2},
  };
  for (const Case& k : cases) {
    auto model = Model::CreateRandom(k.config, 5);
    ASSERT_TRUE(model.ok()) << model.status();
    EngineOptions options;
    options.backend.threads = 1;
    options.tensor_parallel = k.degree;
    auto engine = Engine::Create(**model, options);
    ASSERT_FALSE(engine.ok()) << "degree " << k.degree;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("tensor-parallel degree"), std::string::npos)
        << engine.status();
  }
  // An unknown collective backend is an error too.
  auto model = Model::CreateRandom(Shape(48, 64, 1, 8, 8, 6, 30, false), 5);
  ASSERT_TRUE(model.ok());
  EngineOptions options;
  options.tensor_parallel = 2;
  options.collective = "carrier-pigeon";
  auto engine = Engine::Create(**model, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("carrier-pigeon"), std::string::npos);
}

}  // namespace
}  // namespace vc
