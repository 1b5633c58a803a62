// Model::LoadHuggingFace on small checkpoints written by hf_checkpoint_writer:
// each supported architecture, every dtype, sharding, the config.json
// mapping, and a clear error for every rejected config or corrupt file.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/hf_checkpoint_writer.h"
#include "tests/common/model/status_matchers.h"
#include "tests/scratch_dir.h"

namespace vc {
namespace {

using ::testing::HasSubstr;
using ::vc::testing::FindWeight;
using ::vc::testing::HfCheckpoint;
using ::vc::testing::MakeCheckpoint;
using ::vc::testing::RandomTensor;
using ::vc::testing::ShardName;
using ::vc::testing::StatusIs;
using ::vc::testing::TestTensor;
using ::vc::testing::WireDtype;
using ::vc::testing::WriteOptions;
using Json = nlohmann::json;
using Scaling = RopeConfig::Scaling;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kNotFound = absl::StatusCode::kNotFound;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Every tensor written is in the model, bit for bit.
void ExpectWeightsMatch(const Model& model, const HfCheckpoint& ck) {
  for (const TestTensor& t : ck.tensors) {
    // o_proj.bias is checked to be zero and not exposed; lm_head is ignored
    // when tied (the classifier is the embedding).
    if (EndsWith(t.name, "o_proj.bias")) continue;
    if (t.name == "lm_head.weight" && model.config().tied_embeddings) continue;
    const WeightMatrix w = FindWeight(model, t.name);
    ASSERT_TRUE(w) << t.name;
    for (size_t i = 0; i < t.values.size(); ++i) {
      ASSERT_EQ(Bits(w.At(i)), Bits(t.values[i]))
          << t.name << "[" << i << "]: loaded " << w.At(i) << ", written " << t.values[i];
    }
  }
}

// Two models have identical configs and bitwise-identical weights.
void ExpectSameModel(const Model& a, const Model& b, const HfCheckpoint& ck) {
  const ModelConfig& ca = a.config();
  const ModelConfig& cb = b.config();
  EXPECT_EQ(ca.architecture, cb.architecture);
  EXPECT_EQ(ca.dim, cb.dim);
  EXPECT_EQ(ca.n_layers, cb.n_layers);
  EXPECT_EQ(ca.n_kv_heads, cb.n_kv_heads);
  EXPECT_EQ(ca.rope.theta, cb.rope.theta);
  EXPECT_EQ(ca.qkv_bias, cb.qkv_bias);
  EXPECT_EQ(ca.tied_embeddings, cb.tied_embeddings);
  for (const TestTensor& t : ck.tensors) {
    const WeightMatrix wa = FindWeight(a, t.name);
    const WeightMatrix wb = FindWeight(b, t.name);
    if (!wa && !wb) continue;
    ASSERT_TRUE(wa && wb) << t.name;
    for (size_t i = 0; i < t.values.size(); ++i) {
      ASSERT_EQ(Bits(wa.At(i)), Bits(wb.At(i))) << t.name << "[" << i << "]";
    }
  }
}

// Address ranges at which `path` is mapped into this process.
std::vector<std::pair<uintptr_t, uintptr_t>> MappedRanges(const std::string& path) {
  const std::string real = std::filesystem::canonical(path).string();
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (!EndsWith(line, " " + real)) continue;
    std::istringstream in(line);
    std::string range;
    in >> range;
    const size_t dash = range.find('-');
    ranges.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16),
                        std::stoull(range.substr(dash + 1), nullptr, 16));
  }
  return ranges;
}

bool PointsInto(const void* p, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [lo, hi] : ranges) {
    if (a >= lo && a < hi) return true;
  }
  return false;
}

class HfLoaderTest : public ::testing::Test {
 protected:
  // Writes `ck` into a fresh directory and returns its path.
  std::string Write(const HfCheckpoint& ck, const WriteOptions& options = {}) {
    std::string dir = tmp_.Subdir("ckpt" + std::to_string(next_++));
    WriteCheckpoint(ck, dir, options);
    return dir;
  }
  absl::StatusOr<std::unique_ptr<Model>> WriteAndLoad(const HfCheckpoint& ck,
                                                      const WriteOptions& options = {}) {
    return Model::LoadHuggingFace(Write(ck, options));
  }
  // A checkpoint whose tensors match `config`, loaded.
  absl::StatusOr<std::unique_ptr<Model>> LoadConfig(const Json& config) {
    return WriteAndLoad(MakeCheckpoint(config, WireDtype::kF32, 7));
  }
  // A valid checkpoint from `base`, whose config.json is then replaced by
  // `config` (for configs MakeCheckpoint itself could not read).
  absl::StatusOr<std::unique_ptr<Model>> LoadWithConfig(const Json& base, const Json& config) {
    HfCheckpoint ck = MakeCheckpoint(base, WireDtype::kF32, 7);
    ck.config = config;
    return WriteAndLoad(ck);
  }

  test_support::ScratchDir tmp_{"vc_model_"};
  int next_ = 0;
};

// --- Each architecture, as published ----------------------------------------

TEST_F(HfLoaderTest, Llama31MapsConfigAndWeights) {
  const HfCheckpoint ck =
      MakeCheckpoint(vc::testing::Llama31_8BInstructConfig(), WireDtype::kBF16, 1);
  const std::string dir = Write(ck);
  auto model = Model::LoadHuggingFace(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 224);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 320);
  EXPECT_EQ(c.max_seq_len, 131072);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.layout, RopeLayout::kHalfSplit);
  EXPECT_EQ(c.rope.scaling, Scaling::kLlama3);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.bos_id, 256);
  EXPECT_EQ(c.eos_id, 257);  // the first of [257, 264, 265]
  EXPECT_EQ((*model)->source(), dir);
  const ModelWeights& w = (*model)->weights();
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.layers[0].bq, nullptr);
  EXPECT_NE(w.classifier, w.token_embedding);
  ExpectWeightsMatch(**model, ck);
}

TEST_F(HfLoaderTest, Mistral7BMapsSlidingWindow) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Mistral7BV01Config(), WireDtype::kBF16, 2);
  auto model = WriteAndLoad(ck);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.scaling, Scaling::kNone);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.max_seq_len, 32768);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);
  ExpectWeightsMatch(**model, ck);
}

TEST_F(HfLoaderTest, MistralNullWindowIsNoWindowAndAbsentIsTransformersDefault) {
  Json config = vc::testing::Mistral7BV01Config();
  config["sliding_window"] = nullptr;  // as in Mistral-7B-v0.2
  auto model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().sliding_window, 0);

  config.erase("sliding_window");  // MistralConfig's default is 4096
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().sliding_window, 4096);
}

TEST_F(HfLoaderTest, Qwen2_7BHasQkvBiasesAndIgnoresDisabledWindow) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), WireDtype::kF32, 3);
  auto model = WriteAndLoad(ck);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c.dim, 56);
  EXPECT_EQ(c.n_heads, 7);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
  EXPECT_EQ(c.rope.theta, 1000000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.bos_id, 300);
  EXPECT_EQ(c.eos_id, 300);
  for (const LayerWeights& lw : (*model)->weights().layers) {
    EXPECT_NE(lw.bq, nullptr);
    EXPECT_NE(lw.bk, nullptr);
    EXPECT_NE(lw.bv, nullptr);
  }
  ExpectWeightsMatch(**model, ck);
}

TEST_F(HfLoaderTest, Qwen25TiedEmbeddings) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen25_05BConfig(), WireDtype::kBF16, 4);
  auto model = WriteAndLoad(ck);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.n_heads, 14);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.max_seq_len, 32768);
  EXPECT_EQ((*model)->weights().classifier, (*model)->weights().token_embedding);
  ExpectWeightsMatch(**model, ck);
}

TEST_F(HfLoaderTest, TiedModelIgnoresAStoredLmHead) {
  HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen25_05BConfig(), WireDtype::kF32, 5);
  std::mt19937_64 rng(9);
  ck.tensors.push_back(RandomTensor("lm_head.weight", {320, 56}, WireDtype::kF32, 0, 1, rng));
  auto model = WriteAndLoad(ck);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weights().classifier, (*model)->weights().token_embedding);
}

// The tied matrix stored as lm_head.weight only, as safetensors' save_model
// writes it: `alias` adds {"model.embed_tokens.weight": "lm_head.weight"} to
// __metadata__ (the layout of tinystories656K).
HfCheckpoint LmHeadOnly(const HfCheckpoint& tied) {
  HfCheckpoint ck = tied;
  TestTensor embed = ck.Get("model.embed_tokens.weight");
  ck.Remove("model.embed_tokens.weight");
  embed.name = "lm_head.weight";
  ck.tensors.insert(ck.tensors.begin(), embed);
  return ck;
}

WriteOptions EmbedAliasOf(const std::string& stored, int shards = 1) {
  WriteOptions o;
  o.shards = shards;
  const std::string other =
      stored == "lm_head.weight" ? "model.embed_tokens.weight" : "lm_head.weight";
  o.metadata = {{other, stored}};
  return o;
}

TEST_F(HfLoaderTest, TiedLmHeadOnlyWithMetadataAlias) {
  const HfCheckpoint tied = MakeCheckpoint(vc::testing::Qwen25_05BConfig(), WireDtype::kF32, 40);
  const HfCheckpoint ck = LmHeadOnly(tied);
  for (int shards : {1, 3}) {
    auto model = WriteAndLoad(ck, EmbedAliasOf("lm_head.weight", shards));
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE((*model)->config().tied_embeddings);
    EXPECT_EQ((*model)->weights().classifier, (*model)->weights().token_embedding);
    // The same matrix as the embed-only layout, bit for bit.
    auto reference = WriteAndLoad(tied);
    ASSERT_TRUE(reference.ok()) << reference.status();
    ExpectSameModel(**model, **reference, tied);
  }
}

TEST_F(HfLoaderTest, TiedLmHeadOnlyWithoutAliasFollowsTieWordEmbeddings) {
  const HfCheckpoint tied = MakeCheckpoint(vc::testing::Qwen25_05BConfig(), WireDtype::kBF16, 41);
  auto model = WriteAndLoad(LmHeadOnly(tied));
  ASSERT_TRUE(model.ok()) << model.status();
  auto reference = WriteAndLoad(tied);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ((*model)->weights().classifier, (*model)->weights().token_embedding);
  ExpectSameModel(**model, **reference, tied);
}

TEST_F(HfLoaderTest, UntiedConfigWithAliasIsOneMatrix) {
  // config.json says untied, but the file says the two names are one tensor:
  // either direction of the alias loads, and the model is tied in fact.
  Json config = vc::testing::Qwen25_05BConfig();
  config["tie_word_embeddings"] = false;
  const HfCheckpoint untied = MakeCheckpoint(config, WireDtype::kF32, 42);
  HfCheckpoint embed_only = untied;
  embed_only.Remove("lm_head.weight");
  auto model = WriteAndLoad(embed_only, EmbedAliasOf("model.embed_tokens.weight"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->config().tied_embeddings);
  EXPECT_EQ((*model)->weights().classifier, (*model)->weights().token_embedding);
  EXPECT_EQ(std::memcmp((*model)->weights().classifier.f32(),
                        embed_only.Get("model.embed_tokens.weight").values.data(), 320 * 56 * 4),
            0);

  HfCheckpoint head_only = untied;
  head_only.Remove("model.embed_tokens.weight");
  model = WriteAndLoad(head_only, EmbedAliasOf("lm_head.weight"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weights().classifier, (*model)->weights().token_embedding);
  EXPECT_EQ(std::memcmp((*model)->weights().token_embedding.f32(),
                        head_only.Get("lm_head.weight").values.data(), 320 * 56 * 4),
            0);
}

TEST_F(HfLoaderTest, RejectsInconsistentTiedLayouts) {
  Json config = vc::testing::Qwen25_05BConfig();
  config["tie_word_embeddings"] = false;
  const HfCheckpoint untied = MakeCheckpoint(config, WireDtype::kF32, 43);
  // Untied, one matrix, no alias: the other is missing, and the error says why.
  HfCheckpoint embed_only = untied;
  embed_only.Remove("lm_head.weight");
  EXPECT_THAT(WriteAndLoad(embed_only),
              StatusIs(kInvalid, {"missing tensor 'lm_head.weight'", "tie_word_embeddings",
                                  "__metadata__"}));
  HfCheckpoint head_only = untied;
  head_only.Remove("model.embed_tokens.weight");
  EXPECT_THAT(WriteAndLoad(head_only),
              StatusIs(kInvalid, {"missing tensor 'model.embed_tokens.weight'"}));

  // Tied, neither stored.
  HfCheckpoint neither = MakeCheckpoint(vc::testing::Qwen25_05BConfig(), WireDtype::kF32, 44);
  neither.Remove("model.embed_tokens.weight");
  EXPECT_THAT(WriteAndLoad(neither),
              StatusIs(kInvalid, {"tie_word_embeddings", "neither", "'lm_head.weight'"}));

  // An alias for a name that is also stored: which one is meant?
  EXPECT_THAT(WriteAndLoad(untied, EmbedAliasOf("lm_head.weight")),
              StatusIs(kInvalid, {"__metadata__", "'model.embed_tokens.weight'", "also stored"}));

  // An alias to a tensor of the wrong shape.
  HfCheckpoint wrong = LmHeadOnly(MakeCheckpoint(vc::testing::Qwen25_05BConfig(), WireDtype::kF32, 45));
  std::mt19937_64 rng(46);
  wrong.Get("lm_head.weight") = RandomTensor("lm_head.weight", {300, 56}, WireDtype::kF32, 0, 1, rng);
  EXPECT_THAT(WriteAndLoad(wrong, EmbedAliasOf("lm_head.weight")),
              StatusIs(kInvalid, {"'model.embed_tokens.weight'", "[300, 56]", "[320, 56]"}));

  // An alias whose target is absent is only free-form metadata: the tensor
  // is still missing.
  HfCheckpoint dangling = untied;
  dangling.Remove("model.embed_tokens.weight");
  WriteOptions o;
  o.metadata = {{"model.embed_tokens.weight", "lm_head.weigth"}};
  EXPECT_THAT(WriteAndLoad(dangling, o),
              StatusIs(kInvalid, {"missing tensor 'model.embed_tokens.weight'"}));
}

// The shared Hugging Face checkpoint, as published: lm_head.weight only, with
// the __metadata__ alias naming model.embed_tokens.weight.
TEST_F(HfLoaderTest, Tinystories656KLoadsAsPublished) {
  const char* models = std::getenv("VC_MODELS_DIR");
  if (models == nullptr) GTEST_SKIP() << "VC_MODELS_DIR is not set";
  const std::string dir = std::string(models) + "/tinystories656K";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " not found";
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.hidden_dim, 384);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 2048);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.rope.layout, RopeLayout::kHalfSplit);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.num_parameters(), 656000);  // the model card's count
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(c.IsEos(2));
  const ModelWeights& w = (*model)->weights();
  EXPECT_EQ(w.classifier, w.token_embedding);
  // In place from the mapping: the f32 lm_head.weight is the embedding.
  EXPECT_TRUE(PointsInto(w.token_embedding.data, MappedRanges(dir + "/model.safetensors")));
}

// --- End-of-sequence ids: config.json and generation_config.json ----------------

TEST_F(HfLoaderTest, EosIdsFromConfigList) {
  // Llama 3.1's config.json lists [257, 264, 265] (scaled): all stop.
  auto model = LoadConfig(vc::testing::Llama31_8BInstructConfig());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{257, 264, 265}));
  for (int32_t id : {257, 264, 265}) EXPECT_TRUE(c.IsEos(id)) << id;
  EXPECT_FALSE(c.IsEos(256));
  EXPECT_FALSE(c.IsEos(2));
}

TEST_F(HfLoaderTest, GenerationConfigEosIdsWin) {
  // As Llama-3-8B-Instruct: config.json says one EOS, generation_config.json
  // adds the end-of-turn token; generate() stops at both.
  Json config = vc::testing::Llama31_8BInstructConfig();
  config["eos_token_id"] = 257;
  const std::string dir = Write(MakeCheckpoint(config, WireDtype::kF32, 47));
  vc::testing::WriteFile(dir + "/generation_config.json",
                         R"({"bos_token_id": 256, "eos_token_id": [257, 266], "do_sample": true})");
  auto model = Model::LoadHuggingFace(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().eos_id, 257);
  EXPECT_EQ((*model)->config().eos_ids, (std::vector<int32_t>{257, 266}));
  EXPECT_TRUE((*model)->config().IsEos(266));

  // Without eos_token_id there, config.json's stands.
  vc::testing::WriteFile(dir + "/generation_config.json", R"({"eos_token_id": null})");
  model = Model::LoadHuggingFace(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().eos_ids, (std::vector<int32_t>{257}));

  // Ids outside the vocabulary (320) or of the wrong type are refused.
  vc::testing::WriteFile(dir + "/generation_config.json", R"({"eos_token_id": [257, 320]})");
  EXPECT_THAT(Model::LoadHuggingFace(dir),
              StatusIs(kInvalid, {"generation_config.json", "eos_token_id", "320", "vocabulary"}));
  vc::testing::WriteFile(dir + "/generation_config.json", R"({"eos_token_id": "257"})");
  EXPECT_THAT(Model::LoadHuggingFace(dir),
              StatusIs(kInvalid, {"generation_config.json", "'eos_token_id'", "integer"}));
}

// --- Dtypes, sharding, memory mapping -----------------------------------------

TEST_F(HfLoaderTest, EveryDtypeWidensExactly) {
  for (WireDtype dtype : {WireDtype::kF32, WireDtype::kF16, WireDtype::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), dtype, 11);
    auto model = WriteAndLoad(ck);
    ASSERT_TRUE(model.ok()) << model.status();
    ExpectWeightsMatch(**model, ck);
  }
}

TEST_F(HfLoaderTest, F16AndBf16SpecialValues) {
  struct Case {
    uint16_t bits;
    float value;
  };
  const float inf = std::numeric_limits<float>::infinity();
  // f16: 1, -2, max, smallest normal, smallest and largest subnormal, +-0, +-inf.
  const Case f16[] = {{0x3c00, 1.0f},     {0xc000, -2.0f},           {0x7bff, 65504.0f},
                      {0x0400, 0x1p-14f}, {0x0001, 0x1p-24f},        {0x03ff, 1023 * 0x1p-24f},
                      {0x0000, 0.0f},     {0x8000, -0.0f},           {0x7c00, inf},
                      {0xfc00, -inf},     {0x3555, 0.333251953125f}, {0x8001, -0x1p-24f}};
  // bf16: the top half of the f32 bit pattern.
  const Case bf16[] = {{0x3f80, 1.0f},         {0xc000, -2.0f}, {0x7f7f, 0x1.fep127f},
                       {0x0001, 0x1p-133f},    {0x8000, -0.0f}, {0x7f80, inf},
                       {0x3eab, 0.333984375f}, {0xff80, -inf}};
  for (const auto& [dtype, cases, n] : {std::tuple{std::string("F16"), f16, std::size(f16)},
                                        std::tuple{std::string("BF16"), bf16, std::size(bf16)}}) {
    SCOPED_TRACE(dtype);
    HfCheckpoint ck = MakeCheckpoint(vc::testing::Mistral7BV01Config(), WireDtype::kF32, 12);
    std::vector<uint16_t> bits(64, 0);  // model.norm.weight has dim = 64 entries
    for (size_t i = 0; i < n; ++i) bits[i] = cases[i].bits;
    bits[n] = dtype == "F16" ? 0x7e00 : 0x7fc0;  // a quiet NaN
    ck.Get("model.norm.weight") = vc::testing::HalfBitsTensor("model.norm.weight", dtype, bits);
    auto model = WriteAndLoad(ck);
    ASSERT_TRUE(model.ok()) << model.status();
    const float* w = (*model)->weights().rms_final;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(Bits(w[i]), Bits(cases[i].value))
          << "bits 0x" << std::hex << cases[i].bits << ": got " << w[i];
    }
    EXPECT_TRUE(std::isnan(w[n]));
  }
}

TEST_F(HfLoaderTest, ShardedEqualsSingleFile) {
  for (WireDtype dtype : {WireDtype::kF32, WireDtype::kBF16}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    const HfCheckpoint ck = MakeCheckpoint(vc::testing::Llama31_8BInstructConfig(), dtype, 13);
    auto single = WriteAndLoad(ck);
    ASSERT_TRUE(single.ok()) << single.status();
    const std::string sharded_dir = Write(ck, {.shards = 3});
    ASSERT_TRUE(std::filesystem::exists(sharded_dir + "/" + ShardName(2, 3)));
    ASSERT_FALSE(std::filesystem::exists(sharded_dir + "/model.safetensors"));
    auto sharded = Model::LoadHuggingFace(sharded_dir);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ExpectSameModel(**single, **sharded, ck);
    ExpectWeightsMatch(**sharded, ck);
  }
}

TEST_F(HfLoaderTest, AlignedF32IsUsedInPlaceFromTheMapping) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), WireDtype::kF32, 14);
  const std::string dir = Write(ck);
  auto model = Model::LoadHuggingFace(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto ranges = MappedRanges(dir + "/model.safetensors");
  ASSERT_FALSE(ranges.empty()) << "the f32 checkpoint should stay mapped";
  EXPECT_TRUE(PointsInto((*model)->weights().token_embedding.data, ranges));
  EXPECT_TRUE(PointsInto((*model)->weights().layers[1].w2.data, ranges));
}

TEST_F(HfLoaderTest, Bf16MatricesStayNarrowInPlace) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), WireDtype::kBF16, 15);
  const std::string dir = Write(ck);
  auto model = Model::LoadHuggingFace(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().dtype, Dtype::kBf16);
  const auto ranges = MappedRanges(dir + "/model.safetensors");
  ASSERT_FALSE(ranges.empty()) << "bf16 matrices are used in place";
  EXPECT_EQ((*model)->weights().layers[1].w2.dtype, Dtype::kBf16);
  EXPECT_TRUE(PointsInto((*model)->weights().layers[1].w2.data, ranges));
  ExpectWeightsMatch(**model, ck);
}

TEST_F(HfLoaderTest, Bf16WidenedAtLoadUnmapsTheFile) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), WireDtype::kBF16, 15);
  const std::string dir = Write(ck);
  LoadOptions lo;
  lo.widen_weights = true;
  auto model = Model::LoadHuggingFace(dir, lo);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().dtype, Dtype::kBf16);  // the KV dtype stays the model's
  EXPECT_EQ((*model)->weights().layers[1].w2.dtype, Dtype::kF32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*model)->weights().layers[1].w2.data) % 64, 0u);
  // Nothing points into the file, so keeping it mapped would only waste memory.
  EXPECT_TRUE(MappedRanges(dir + "/model.safetensors").empty());
  ExpectWeightsMatch(**model, ck);
}

TEST_F(HfLoaderTest, MisalignedF32IsCopied) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), WireDtype::kF32, 16);
  // Two extra header bytes leave every f32 tensor 2 bytes off alignment.
  const std::string dir = Write(ck, {.extra_header_padding = 2});
  auto model = Model::LoadHuggingFace(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  for (const LayerWeights& lw : (*model)->weights().layers) {
    // Copied to a cache line, not just to float alignment.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(lw.wq.data) % 64, 0u);
  }
  ExpectWeightsMatch(**model, ck);
}

TEST_F(HfLoaderTest, LoadDispatchesDirectoriesToHuggingFace) {
  const std::string dir =
      Write(MakeCheckpoint(vc::testing::Mistral7BV01Config(), WireDtype::kF32, 17));
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().architecture, "MistralForCausalLM");
}

// --- Config mapping ----------------------------------------------------------------

TEST_F(HfLoaderTest, ExplicitHeadDimOverridesHiddenOverHeads) {
  Json config = vc::testing::Llama31_8BInstructConfig();
  config["head_dim"] = 32;  // q_dim = 4 * 32 = 128, twice hidden_size
  const HfCheckpoint ck = MakeCheckpoint(config, WireDtype::kF32, 18);
  EXPECT_EQ(ck.tensors[2].shape, (std::vector<int64_t>{128, 64}));  // q_proj
  auto model = WriteAndLoad(ck);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().head_dim, 32);
  EXPECT_EQ((*model)->config().q_dim(), 128);
  ExpectWeightsMatch(**model, ck);

  config["head_dim"] = nullptr;  // null means hidden_size / num_attention_heads
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().head_dim, 16);
}

TEST_F(HfLoaderTest, AbsentOrNullKvHeadsFollowTransformers) {
  // LlamaConfig and every null: plain multi-head attention.
  Json config = vc::testing::Llama31_8BInstructConfig();
  config.erase("num_key_value_heads");
  auto model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().n_kv_heads, 4);

  config = vc::testing::Mistral7BV01Config();
  config["num_key_value_heads"] = nullptr;
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().n_kv_heads, 4);

  // MistralConfig would silently pick 8 and Qwen2Config 32.
  for (const Json& base : {vc::testing::Mistral7BV01Config(), vc::testing::Qwen2_7BConfig()}) {
    config = base;
    config.erase("num_key_value_heads");
    EXPECT_THAT(LoadWithConfig(base, config),
                StatusIs(kInvalid, {"'num_key_value_heads'", "missing"}));
  }
}

TEST_F(HfLoaderTest, RopeScalingVariants) {
  Json config = vc::testing::Llama31_8BInstructConfig();
  config["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // older spelling
  auto model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().rope.scaling, Scaling::kLinear);
  EXPECT_EQ((*model)->config().rope.factor, 2.0);

  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4}};
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().rope.factor, 4.0);

  config["rope_scaling"] = {{"rope_type", "default"}};
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().rope.scaling, Scaling::kNone);

  config["rope_scaling"] = nullptr;
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().rope.scaling, Scaling::kNone);
  EXPECT_EQ((*model)->config().rope.theta, 500000.0);

  config.erase("rope_theta");  // transformers' default
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().rope.theta, 10000.0);
}

// transformers 5 writes rope_theta and the scaling as one rope_parameters object.
TEST_F(HfLoaderTest, RopeParametersSpelling) {
  Json config = vc::testing::Llama31_8BInstructConfig();
  Json params = config["rope_scaling"];
  params["rope_theta"] = 500000.0;
  config.erase("rope_scaling");
  config.erase("rope_theta");
  config["rope_parameters"] = params;
  auto model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().rope.theta, 500000.0);
  EXPECT_EQ((*model)->config().rope.scaling, Scaling::kLlama3);
  EXPECT_EQ((*model)->config().rope.factor, 8.0);

  config["rope_theta"] = 10000.0;  // two answers to one question
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"rope_parameters.rope_theta", "disagrees"}));

  config.erase("rope_theta");
  config["rope_parameters"] = {{"full_attention", {{"rope_theta", 1e6}}},
                               {"sliding_attention", {{"rope_theta", 1e4}}}};
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"rope_parameters", "per-layer-type"}));
}

TEST_F(HfLoaderTest, LlamaAttentionBias) {
  Json config = vc::testing::Llama31_8BInstructConfig();
  config["attention_bias"] = true;
  HfCheckpoint ck = MakeCheckpoint(config, WireDtype::kBF16, 19);
  auto model = WriteAndLoad(ck);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->config().qkv_bias);
  EXPECT_NE((*model)->weights().layers[1].bv, nullptr);
  ExpectWeightsMatch(**model, ck);

  // transformers' LlamaAttention also biases o_proj; the engine has no such
  // bias, so a non-zero one must be refused rather than dropped.
  std::mt19937_64 rng(20);
  ck.Get("model.layers.1.self_attn.o_proj.bias") =
      RandomTensor("model.layers.1.self_attn.o_proj.bias", {64}, WireDtype::kBF16, 0, 1, rng);
  EXPECT_THAT(WriteAndLoad(ck),
              StatusIs(kInvalid, {"model.layers.1.self_attn.o_proj.bias", "non-zero"}));
}

TEST_F(HfLoaderTest, Qwen2SlidingWindowFollowsTransformers) {
  Json config = vc::testing::Qwen2_7BConfig();
  config["use_sliding_window"] = true;
  config["sliding_window"] = 1024;
  // The first max_window_layers layers use full attention: with all of them
  // below it, no layer has a window.
  config["max_window_layers"] = 2;
  auto model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().sliding_window, 0);

  config["max_window_layers"] = 0;  // every layer slides
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().sliding_window, 1024);

  config["max_window_layers"] = 1;  // layer 0 full, layer 1 windowed
  EXPECT_THAT(LoadConfig(config),
              StatusIs(kInvalid, {"use_sliding_window", "max_window_layers", "1 of 2"}));

  config["layer_types"] = {"sliding_attention", "sliding_attention"};  // overrides
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().sliding_window, 1024);

  config["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"1 of 2"}));

  config["layer_types"] = {"full_attention", "chunked_attention"};
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"layer_types", "chunked_attention"}));

  config.erase("layer_types");
  config["max_window_layers"] = 0;
  config["sliding_window"] = nullptr;  // use_sliding_window without a window
  model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().sliding_window, 0);
}

TEST_F(HfLoaderTest, LlamaIgnoresSlidingWindowField) {
  Json config = vc::testing::Llama31_8BInstructConfig();
  config["sliding_window"] = 128;  // LlamaAttention never reads it
  auto model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().sliding_window, 0);
}

TEST_F(HfLoaderTest, SingleEosId) {
  Json config = vc::testing::Llama31_8BInstructConfig();
  config["eos_token_id"] = 300;
  auto model = LoadConfig(config);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().eos_id, 300);
}

// --- Rejected configs ---------------------------------------------------------------

TEST_F(HfLoaderTest, RejectsUnsupportedRopeScaling) {
  const Json llama = vc::testing::Llama31_8BInstructConfig();
  for (const char* type : {"yarn", "dynamic", "longrope", "su"}) {
    Json config = llama;
    config["rope_scaling"] = {
        {"rope_type", type}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
    EXPECT_THAT(LoadConfig(config),
                StatusIs(kInvalid, {"config.json", "rope_scaling", std::string("'") + type + "'",
                                    "not supported"}));
  }
  Json config = llama;
  config["rope_scaling"] = {{"factor", 4.0}};
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"rope_scaling.rope_type", "missing"}));
  config["rope_scaling"] = {{"rope_type", "linear"}, {"type", "yarn"}, {"factor", 2.0}};
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"rope_scaling.type", "yarn"}));
  config["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"rope_scaling.factor", "missing"}));
  config["rope_scaling"] = llama["rope_scaling"];
  config["rope_scaling"].erase("low_freq_factor");
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"rope_scaling.low_freq_factor"}));
  config["rope_scaling"] = llama["rope_scaling"];
  config["rope_scaling"]["high_freq_factor"] = 0.5;
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"high_freq_factor", "low_freq_factor"}));
  config["rope_scaling"] = "llama3";
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"rope_scaling", "object"}));
  config = llama;
  config["partial_rotary_factor"] = 0.5;
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"partial_rotary_factor"}));
}

TEST_F(HfLoaderTest, RejectsMathChangingFields) {
  Json config = vc::testing::Llama31_8BInstructConfig();
  config["hidden_act"] = "gelu";
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"hidden_act", "gelu"}));

  config = vc::testing::Qwen2_7BConfig();
  config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"quantization_config", "gptq"}));

  config = vc::testing::Llama31_8BInstructConfig();
  config["mlp_bias"] = true;
  EXPECT_THAT(LoadConfig(config), StatusIs(kInvalid, {"mlp_bias"}));
}

TEST_F(HfLoaderTest, RejectsUnknownArchitecture) {
  const Json base = vc::testing::Llama31_8BInstructConfig();
  Json config = base;
  config["architectures"] = {"GPTNeoXForCausalLM"};
  EXPECT_THAT(LoadWithConfig(base, config),
              StatusIs(kInvalid, {"'GPTNeoXForCausalLM'",
                                  "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"}));
  config["architectures"] = Json::array();
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"architectures"}));
  config.erase("architectures");
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"'architectures'", "missing"}));
}

TEST_F(HfLoaderTest, RejectsMissingOrMistypedFields) {
  const Json base = vc::testing::Mistral7BV01Config();
  for (const char* field :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "vocab_size", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id"}) {
    Json config = base;
    config.erase(field);
    EXPECT_THAT(LoadWithConfig(base, config),
                StatusIs(kInvalid, {"config.json", std::string("'") + field + "'", "missing"}));
  }
  Json config = base;
  config["hidden_size"] = "64";
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"'hidden_size'", "integer"}));
  config = base;
  config["num_hidden_layers"] = -2;
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"'num_hidden_layers'", "-2"}));
  config = base;
  config["rms_norm_eps"] = 0;
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"'rms_norm_eps'", "positive"}));
  config = base;
  config["tie_word_embeddings"] = "no";
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"'tie_word_embeddings'"}));
  config = base;
  config["eos_token_id"] = Json::array();
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"'eos_token_id'", "empty"}));
  config = base;
  config["bos_token_id"] = 256;  // vocab_size is 256
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"bos_id=256"}));
  config = base;
  config["num_attention_heads"] = 3;  // 64 is not a multiple of 3
  EXPECT_THAT(LoadWithConfig(base, config), StatusIs(kInvalid, {"hidden_size", "divisible"}));
}

TEST_F(HfLoaderTest, RejectsUnreadableConfig) {
  const std::string dir =
      Write(MakeCheckpoint(vc::testing::Mistral7BV01Config(), WireDtype::kF32, 21));
  vc::testing::WriteFile(dir + "/config.json", "{\"architectures\": [\"LlamaForCausalLM\",");
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kInvalid, {"config.json", "JSON"}));
  vc::testing::WriteFile(dir + "/config.json", "[1, 2]");
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kInvalid, {"config.json", "object"}));
  std::filesystem::remove(dir + "/config.json");
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kNotFound, {"config.json"}));
}

// --- Rejected weights ---------------------------------------------------------------

TEST_F(HfLoaderTest, RejectsMissingTensor) {
  HfCheckpoint ck = MakeCheckpoint(vc::testing::Llama31_8BInstructConfig(), WireDtype::kF32, 22);
  ck.Remove("model.layers.1.mlp.up_proj.weight");
  EXPECT_THAT(
      WriteAndLoad(ck),
      StatusIs(kInvalid, {"missing tensor 'model.layers.1.mlp.up_proj.weight'", "[224, 64]"}));
  // Untied models need lm_head.
  ck = MakeCheckpoint(vc::testing::Llama31_8BInstructConfig(), WireDtype::kF32, 22);
  ck.Remove("lm_head.weight");
  EXPECT_THAT(WriteAndLoad(ck), StatusIs(kInvalid, {"'lm_head.weight'"}));
  // Qwen2 needs its biases.
  ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), WireDtype::kF32, 22);
  ck.Remove("model.layers.0.self_attn.k_proj.bias");
  EXPECT_THAT(WriteAndLoad(ck), StatusIs(kInvalid, {"'model.layers.0.self_attn.k_proj.bias'"}));
}

TEST_F(HfLoaderTest, RejectsWrongShape) {
  HfCheckpoint ck = MakeCheckpoint(vc::testing::Llama31_8BInstructConfig(), WireDtype::kBF16, 23);
  std::mt19937_64 rng(24);
  // kv_dim is 1 head * 16; a multi-head k_proj does not fit this config.
  ck.Get("model.layers.0.self_attn.k_proj.weight") =
      RandomTensor("model.layers.0.self_attn.k_proj.weight", {64, 64}, WireDtype::kBF16, 0, 1, rng);
  EXPECT_THAT(WriteAndLoad(ck),
              StatusIs(kInvalid, {"model.safetensors", "'model.layers.0.self_attn.k_proj.weight'",
                                  "has shape [64, 64]", "implies [16, 64]"}));
}

TEST_F(HfLoaderTest, RejectsUnsupportedDtypes) {
  for (const auto& [dtype, size] : {std::pair{"I8", 1}, std::pair{"F64", 8}}) {
    HfCheckpoint ck = MakeCheckpoint(vc::testing::Mistral7BV01Config(), WireDtype::kF32, 25);
    TestTensor& t = ck.Get("model.layers.1.self_attn.v_proj.weight");
    t.dtype = dtype;
    t.bytes.assign(size_t{16} * 64 * size, '\0');
    EXPECT_THAT(WriteAndLoad(ck),
                StatusIs(kInvalid, {"'model.layers.1.self_attn.v_proj.weight'",
                                    std::string("dtype ") + dtype, "F32, F16 and BF16"}));
  }
}

TEST_F(HfLoaderTest, RejectsTensorsTheConfigDoesNotExplain) {
  // q/k/v biases in a Mistral checkpoint: config and weights disagree.
  HfCheckpoint ck = MakeCheckpoint(vc::testing::Mistral7BV01Config(), WireDtype::kF32, 26);
  std::mt19937_64 rng(27);
  ck.tensors.push_back(
      RandomTensor("model.layers.0.self_attn.q_proj.bias", {64}, WireDtype::kF32, 0, 1, rng));
  EXPECT_THAT(WriteAndLoad(ck),
              StatusIs(kInvalid, {"unexpected", "'model.layers.0.self_attn.q_proj.bias'"}));

  // A cached RoPE table is harmless: RoPE is recomputed from the config.
  ck.Remove("model.layers.0.self_attn.q_proj.bias");
  ck.tensors.push_back(RandomTensor("model.layers.0.self_attn.rotary_emb.inv_freq", {8},
                                    WireDtype::kF32, 0, 1, rng));
  auto model = WriteAndLoad(ck);
  ASSERT_TRUE(model.ok()) << model.status();
}

// --- Corrupt or missing files ---------------------------------------------------------

TEST_F(HfLoaderTest, RejectsTruncatedSafetensors) {
  const std::string dir =
      Write(MakeCheckpoint(vc::testing::Llama31_8BInstructConfig(), WireDtype::kBF16, 28));
  const std::string path = dir + "/model.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  // lm_head.weight is written last, so it is the tensor cut short.
  EXPECT_THAT(Model::LoadHuggingFace(dir),
              StatusIs(kInvalid, {path, "truncated", "'lm_head.weight'"}));
}

TEST_F(HfLoaderTest, RejectsCorruptHeader) {
  const std::string dir =
      Write(MakeCheckpoint(vc::testing::Mistral7BV01Config(), WireDtype::kF32, 29));
  const std::string path = dir + "/model.safetensors";
  const std::string good = vc::testing::ReadFile(path);

  std::string bad = good;
  bad[8 + bad.substr(8).find(':')] = ';';
  vc::testing::WriteFile(path, bad);
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kInvalid, {path, "not valid JSON"}));

  bad = good;
  const uint64_t huge = good.size() + 1000;
  std::memcpy(bad.data(), &huge, 8);
  vc::testing::WriteFile(path, bad);
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kInvalid, {path, "header length"}));

  vc::testing::WriteFile(path, "abc");
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kInvalid, {path, "too short"}));
}

TEST_F(HfLoaderTest, RejectsMissingOrInconsistentShards) {
  const HfCheckpoint ck = MakeCheckpoint(vc::testing::Qwen2_7BConfig(), WireDtype::kBF16, 30);
  std::string dir = Write(ck, {.shards = 3});
  std::filesystem::remove(dir + "/" + ShardName(1, 3));
  EXPECT_THAT(Model::LoadHuggingFace(dir),
              StatusIs(kNotFound, {"model.safetensors.index.json", ShardName(1, 3)}));

  // The index names a shard for a tensor that lives elsewhere.
  dir = Write(ck, {.shards = 3});
  Json index = Json::parse(vc::testing::ReadFile(dir + "/model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = ShardName(0, 3);
  vc::testing::WriteFile(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_THAT(Model::LoadHuggingFace(dir),
              StatusIs(kInvalid, {"'model.norm.weight'", ShardName(0, 3), "does not contain"}));

  index["weight_map"] = Json::array();
  vc::testing::WriteFile(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kInvalid, {"weight_map"}));

  vc::testing::WriteFile(dir + "/model.safetensors.index.json", "{");
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kInvalid, {"index.json", "JSON"}));
}

TEST_F(HfLoaderTest, RejectsMissingPaths) {
  EXPECT_THAT(Model::LoadHuggingFace(tmp_.path() + "/does-not-exist"),
              StatusIs(kNotFound, {"does-not-exist"}));
  EXPECT_THAT(Model::Load(tmp_.path() + "/does-not-exist"), StatusIs(kNotFound));

  // config.json but no weights.
  const std::string dir = tmp_.Subdir("config-only");
  vc::testing::WriteFile(dir + "/config.json", vc::testing::Mistral7BV01Config().dump());
  EXPECT_THAT(Model::LoadHuggingFace(dir),
              StatusIs(kNotFound, {"model.safetensors", "model.safetensors.index.json"}));
  vc::testing::WriteFile(dir + "/pytorch_model.bin", "x");
  EXPECT_THAT(Model::LoadHuggingFace(dir), StatusIs(kNotFound, {"convert them to safetensors"}));

  // A file is not a checkpoint directory.
  EXPECT_THAT(Model::LoadHuggingFace(dir + "/config.json"),
              StatusIs(kInvalid, {"not a directory"}));
}

}  // namespace
}  // namespace vc
