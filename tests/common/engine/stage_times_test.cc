// The engine's stage clock (Engine::set_stage_times): it counts every pass
// run while set and none after, its stages add up to no more than the
// passes' wall time, the stages that do the work get time, and it changes no
// logit, for plain, tensor-parallel and weight-quantised engines.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/engine/engine.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "gtest/gtest.h"
#include "tests/common/engine/small_random_model.h"

namespace vc {
namespace {

// RunPasses (a 9-token prefill, two 1-token steps, a 5-token pass) with
// `times` set for all of them (null: unset); *wall gets their wall time.
std::vector<float> TimedPasses(Engine& engine, StageTimes* times, double* wall) {
  engine.set_stage_times(times);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = engine_testing::RunPasses(engine, 21, {9, 1, 1, 5});
  *wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine.set_stage_times(nullptr);
  return logits;
}

void ExpectStagesCounted(const Model& model, const EngineOptions& options) {
  auto engine = Engine::Create(model, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  double wall = 0;
  const std::vector<float> plain = TimedPasses(**engine, nullptr, &wall);
  StageTimes times;
  const std::vector<float> timed = TimedPasses(**engine, &times, &wall);
  ASSERT_EQ(plain.size(), timed.size());
  EXPECT_EQ(std::memcmp(plain.data(), timed.data(), plain.size() * sizeof(float)), 0);
  EXPECT_EQ(times.passes, 4);
  double sum = 0;
  for (int st = 0; st < StageTimes::kCount; ++st) {
    EXPECT_GE(times.seconds[st], 0.0) << StageTimes::Name(st);
    sum += times.seconds[st];
  }
  EXPECT_LE(sum, wall);
  for (const StageTimes::Stage st :
       {StageTimes::kQkv, StageTimes::kAttention, StageTimes::kGateUp, StageTimes::kClassifier}) {
    EXPECT_GT(times.seconds[st], 0.0) << StageTimes::Name(st);
  }
  // Unset again: a further pass adds nothing.
  const StageTimes before = times;
  double ignored = 0;
  TimedPasses(**engine, nullptr, &ignored);
  EXPECT_EQ(times.passes, before.passes);
  for (int st = 0; st < StageTimes::kCount; ++st) {
    EXPECT_EQ(times.seconds[st], before.seconds[st]) << StageTimes::Name(st);
  }
}

TEST(StageTimesTest, CountsEveryTimedPassAndChangesNoLogit) {
  auto model = Model::CreateRandom(engine_testing::SmallRandomConfig(), 7);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.backend.threads = 2;
  ExpectStagesCounted(**model, o);
}

TEST(StageTimesTest, TensorParallelAndQuantisedEnginesToo) {
  auto model = Model::CreateRandom(engine_testing::SmallRandomConfig(), 8);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions tp;
  tp.backend.threads = 2;
  tp.tensor_parallel = 2;
  ExpectStagesCounted(**model, tp);

  QuantizeOptions qo;
  qo.format = kernels::WeightFormat::kInt4;
  auto quantized = QuantizedWeights::Create(**model, qo);
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  EngineOptions q;
  q.quantized = quantized->get();
  ExpectStagesCounted(**model, q);
}

TEST(StageTimesTest, EveryStageHasAName) {
  for (int st = 0; st < StageTimes::kCount; ++st) {
    EXPECT_STRNE(StageTimes::Name(st), "?") << st;
  }
  EXPECT_STREQ(StageTimes::Name(StageTimes::kCount), "?");
  EXPECT_STREQ(StageTimes::Name(-1), "?");
}

}  // namespace
}  // namespace vc
