// The engine's warm-up pass at creation (EngineOptions::warmup_tokens) is
// invisible to callers: every logit afterwards is bit-identical to an engine
// created without one, for plain, tensor-parallel and weight-quantised
// engines, and a bad option is a clear error. (Whether it makes a fresh
// process's first passes cheap is a speed property, measured by
// vc_single_node_bench, not here.)
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "gtest/gtest.h"
#include "tests/common/engine/small_random_model.h"

namespace vc {
namespace {

std::vector<float> Logits(const Model& model, const EngineOptions& options, uint64_t seed) {
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  return engine_testing::RunPasses(**engine, seed, {9, 1, 1, 1, 5});
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Engines made from `options` with each of `warmups` give the logits of one
// made without a warm-up pass, bit for bit.
void ExpectWarmupInvisible(const Model& model, EngineOptions options,
                           std::initializer_list<int64_t> warmups, uint64_t seed) {
  options.warmup_tokens = 0;
  const std::vector<float> want = Logits(model, options, seed);
  ASSERT_FALSE(want.empty());
  for (int64_t warm : warmups) {
    SCOPED_TRACE(warm);
    options.warmup_tokens = warm;
    EXPECT_TRUE(SameBits(Logits(model, options, seed), want));
  }
}

TEST(WarmupTest, LogitsDoNotDependOnTheWarmupPass) {
  auto model = Model::CreateRandom(engine_testing::SmallRandomConfig(), 3);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.backend.threads = 2;
  // 1000 is larger than max_batch_tokens and than the context: clamped.
  o.max_batch_tokens = 32;
  ExpectWarmupInvisible(**model, o, {1, 7, 1000}, 11);
}

TEST(WarmupTest, TensorParallelAndQuantisedEnginesToo) {
  auto model = Model::CreateRandom(engine_testing::SmallRandomConfig(), 4);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions tp;
  tp.backend.threads = 2;
  tp.tensor_parallel = 2;
  ExpectWarmupInvisible(**model, tp, {3}, 12);

  QuantizeOptions qo;
  qo.format = kernels::WeightFormat::kInt8;
  auto quantized = QuantizedWeights::Create(**model, qo);
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  EngineOptions q;
  q.quantized = quantized->get();
  ExpectWarmupInvisible(**model, q, {3}, 13);
}

TEST(WarmupTest, NegativeWarmupIsAnError) {
  auto model = Model::CreateRandom(engine_testing::SmallRandomConfig(), 5);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.warmup_tokens = -1;
  auto engine = Engine::Create(**model, o);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("warmup_tokens"), std::string::npos) << engine.status();
}

}  // namespace
}  // namespace vc
