// The long-context runtime on a small random model: VeriCache output equals
// full-KV decoding token for token in the staggered and lock-step schedules,
// the device arena never exceeds its budget, verify passes never read the
// host-tier full KV, the full-KV baseline runs only as many requests as fit,
// paced copies honour the link bandwidth (generous bounds only), and the
// runtime shuts down cleanly mid-run.
#include "common/longctx/long_context_runtime.h"

#include <chrono>
#include <random>
#include <thread>

#include "common/decode/full_decode.h"
#include "gtest/gtest.h"
#include "tests/small_model_config.h"

namespace vc {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig SmallConfig() { return test_support::SmallModelConfig({.max_seq_len = 96}); }

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
};

Fixture Make(uint64_t seed) {
  Fixture f;
  f.model = std::move(Model::CreateRandom(SmallConfig(), seed)).value();
  EngineOptions eo;
  eo.backend.threads = 1;
  f.engine = std::move(Engine::Create(*f.model, eo)).value();
  return f;
}

std::vector<int32_t> RandomPrompt(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p = {1};
  while (static_cast<int>(p.size()) < n) p.push_back(3 + static_cast<int32_t>(rng() % 61));
  return p;
}

constexpr int kPromptLen = 40;
constexpr int64_t kMaxNew = 96 - kPromptLen;  // to the end of the context

RequestOptions Template(int draft_len = 6) {
  RequestOptions ro;
  ro.max_new_tokens = kMaxNew;
  ro.ignore_eos = true;
  ro.compressor.name = "int8";
  ro.draft.draft_len = draft_len;
  return ro;
}

std::vector<std::vector<int32_t>> Prompts(int n) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) p.push_back(RandomPrompt(kPromptLen, 100 + i));
  return p;
}

std::vector<std::vector<int32_t>> FullOutputs(Engine& e,
                                              const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    DecodeOptions o;
    o.max_new_tokens = kMaxNew;
    o.ignore_eos = true;
    out.push_back(std::move(DecodeFull(e, p, o)).value().tokens);
  }
  return out;
}

// Device budget: every request's compressed KV plus `full_copies` full KVs.
int64_t Budget(Engine& e, const std::vector<int32_t>& prompt, int requests, int full_copies) {
  auto f = MeasureKvFootprint(e, prompt, Template());
  EXPECT_TRUE(f.ok()) << f.status();
  EXPECT_LT(f->compressed_resident_bytes, f->full_kv_bytes);
  return requests * f->compressed_resident_bytes + full_copies * f->full_kv_bytes;
}

std::unique_ptr<LongContextRuntime> MakeRuntime(Engine& e, const LongContextOptions& o,
                                                const std::vector<std::vector<int32_t>>& prompts) {
  auto rt = LongContextRuntime::Create(e, o);
  EXPECT_TRUE(rt.ok()) << rt.status();
  for (const auto& p : prompts) EXPECT_TRUE((*rt)->Submit(p).ok());
  return std::move(rt).value();
}

void ExpectLossless(const LongContextRuntime& rt, const std::vector<std::vector<int32_t>>& expected,
                    const std::string& label) {
  ASSERT_TRUE(rt.done()) << label;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(rt.output(static_cast<int>(i)), expected[i]) << label << " request " << i;
  }
  const LongContextStats st = rt.stats();
  EXPECT_LE(st.device_high_water, st.device_budget) << label;
  EXPECT_EQ(st.host_kv_bytes_read_in_decode, 0) << label;
  EXPECT_EQ(st.generated_tokens, static_cast<int64_t>(expected.size()) * kMaxNew) << label;
}

TEST(LongContextRuntimeTest, StaggeredAndLockStepEqualFullDecoding) {
  Fixture f = Make(7);
  const auto prompts = Prompts(6);
  const auto expected = FullOutputs(*f.engine, prompts);
  const int64_t budget = Budget(*f.engine, prompts[0], 6, 2);
  for (auto schedule :
       {LongContextOptions::Schedule::kStaggered, LongContextOptions::Schedule::kLockStep}) {
    const std::string label =
        schedule == LongContextOptions::Schedule::kStaggered ? "staggered" : "lock-step";
    LongContextOptions o;
    o.mode = DecodeMode::kVeriCache;
    o.schedule = schedule;
    o.request = Template();
    o.device_budget_bytes = budget;
    o.copy.bytes_per_second = 20e6;  // a full KV (24 KiB) in ~1 ms
    o.record_trace = true;
    auto rt = MakeRuntime(*f.engine, o, prompts);
    ASSERT_TRUE(rt->Run().ok()) << label;
    ExpectLossless(*rt, expected, label);
    const LongContextStats st = rt->stats();
    EXPECT_EQ(st.max_active, 6) << label;  // all compressed KVs fit at once
    EXPECT_GT(st.verifies, 6) << label;
    EXPECT_EQ(st.reloads, st.verifies) << label;  // one copy per verify
    EXPECT_EQ(rt->copy_stats().completed, st.reloads) << label;
    EXPECT_EQ(rt->copy_stats().failed, 0) << label;
    EXPECT_GT(st.reload_bytes, 0) << label;
    EXPECT_GT(st.device_high_water, 0) << label;
    EXPECT_GT(st.slot_seconds, 0) << label;
    EXPECT_FALSE(rt->trace().empty()) << label;
    // Every booking was released.
    EXPECT_TRUE(rt->scheduler()->bookings().empty()) << label;
    if (schedule == LongContextOptions::Schedule::kStaggered) {
      EXPECT_EQ(st.barrier_seconds, 0) << label;
    }
  }
}

TEST(LongContextRuntimeTest, OneFullKvOfHeadroomIsEnough) {
  Fixture f = Make(11);
  const auto prompts = Prompts(5);
  const auto expected = FullOutputs(*f.engine, prompts);
  LongContextOptions o;
  o.request = Template(9);
  o.device_budget_bytes = Budget(*f.engine, prompts[0], 5, 1);
  o.copy.bytes_per_second = 10e6;
  o.copy.queue_depth = 1;  // the bounded queue refuses; the runtime retries
  for (auto schedule :
       {LongContextOptions::Schedule::kStaggered, LongContextOptions::Schedule::kLockStep}) {
    o.schedule = schedule;
    auto rt = MakeRuntime(*f.engine, o, prompts);
    ASSERT_TRUE(rt->Run().ok());
    ExpectLossless(*rt, expected, "one full KV");
  }
}

TEST(LongContextRuntimeTest, ContinuousBatchingAdmitsLateArrivals) {
  Fixture f = Make(13);
  const auto prompts = Prompts(6);
  const auto expected = FullOutputs(*f.engine, prompts);
  LongContextOptions o;
  o.request = Template(7);
  auto fp = MeasureKvFootprint(*f.engine, prompts[0], o.request);
  ASSERT_TRUE(fp.ok());
  // Room for four compressed KVs and two full ones: admission keeps one full
  // KV of headroom, so at most (budget - full) / compressed run at once.
  o.device_budget_bytes = 4 * fp->compressed_resident_bytes + 2 * fp->full_kv_bytes;
  const int64_t most = (o.device_budget_bytes - fp->full_kv_bytes) / fp->compressed_resident_bytes;
  ASSERT_LT(most, 6);
  o.copy.bytes_per_second = 20e6;
  auto rt = std::move(LongContextRuntime::Create(*f.engine, o)).value();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(rt->Submit(prompts[i]).ok());
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(rt->Step().ok());
  for (int i = 3; i < 6; ++i) ASSERT_TRUE(rt->Submit(prompts[i]).ok());
  ASSERT_TRUE(rt->Run().ok());
  ExpectLossless(*rt, expected, "late arrivals");
  EXPECT_GE(rt->stats().max_active, 4);
  EXPECT_LE(rt->stats().max_active, most);
}

TEST(LongContextRuntimeTest, SeededSamplingIsExactToo) {
  Fixture f = Make(5);
  const auto prompts = Prompts(4);
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 20;
  sp.seed = 99;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) {
    DecodeOptions d;
    d.max_new_tokens = kMaxNew;
    d.ignore_eos = true;
    d.sampling = sp;
    expected.push_back(std::move(DecodeFull(*f.engine, p, d)).value().tokens);
  }
  LongContextOptions o;
  o.request = Template(5);
  o.request.sampling_mode = SamplingMode::kSeeded;
  o.request.sampling = sp;
  o.device_budget_bytes = Budget(*f.engine, prompts[0], 4, 2);
  auto rt = MakeRuntime(*f.engine, o, prompts);
  ASSERT_TRUE(rt->Run().ok());
  ExpectLossless(*rt, expected, "seeded");
}

TEST(LongContextRuntimeTest, FullBaselineRunsOnlyWhatFits) {
  Fixture f = Make(7);
  const auto prompts = Prompts(6);
  const auto expected = FullOutputs(*f.engine, prompts);
  auto fp = MeasureKvFootprint(*f.engine, prompts[0], Template());
  ASSERT_TRUE(fp.ok());
  LongContextOptions o;
  o.mode = DecodeMode::kFull;
  o.request = Template();
  o.device_budget_bytes = 2 * fp->full_kv_bytes + fp->full_kv_bytes / 2;  // room for two
  auto rt = MakeRuntime(*f.engine, o, prompts);
  ASSERT_TRUE(rt->Run().ok());
  ASSERT_TRUE(rt->done());
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(rt->output(static_cast<int>(i)), expected[i]);
  const LongContextStats st = rt->stats();
  EXPECT_EQ(st.max_active, 2);
  EXPECT_LE(st.device_high_water, st.device_budget);
  EXPECT_EQ(st.reloads, 0);
  EXPECT_EQ(rt->scheduler(), nullptr);
}

TEST(LongContextRuntimeTest, LossyBaselineRuns) {
  Fixture f = Make(7);
  const auto prompts = Prompts(6);
  LongContextOptions o;
  o.mode = DecodeMode::kLossy;
  o.request = Template();
  o.device_budget_bytes = Budget(*f.engine, prompts[0], 6, 0);  // compressed KV only
  auto rt = MakeRuntime(*f.engine, o, prompts);
  ASSERT_TRUE(rt->Run().ok());
  const LongContextStats st = rt->stats();
  EXPECT_EQ(st.max_active, 6);
  EXPECT_EQ(st.generated_tokens, 6 * kMaxNew);
  EXPECT_LE(st.device_high_water, st.device_budget);
  EXPECT_EQ(st.host_kv_bytes_read_in_decode, 0);
  EXPECT_EQ(st.verifies, 0);
  EXPECT_EQ(rt->host_arena().in_use(), 0);  // the full KV was dropped after prefill
}

TEST(LongContextRuntimeTest, RejectsWhatCanNeverFit) {
  Fixture f = Make(7);
  const auto prompts = Prompts(1);
  LongContextOptions o;
  o.request = Template();
  o.device_budget_bytes = Budget(*f.engine, prompts[0], 1, 0);  // no room for a full KV
  auto rt = LongContextRuntime::Create(*f.engine, o);
  ASSERT_TRUE(rt.ok());
  EXPECT_EQ((*rt)->Submit(prompts[0]).status().code(), absl::StatusCode::kResourceExhausted);
  o.request.compressor.name = "";
  EXPECT_FALSE(LongContextRuntime::Create(*f.engine, o).ok());
}

TEST(LongContextRuntimeTest, PacedCopiesHonourTheBandwidth) {
  Fixture f = Make(3);
  const auto prompts = Prompts(4);
  const auto expected = FullOutputs(*f.engine, prompts);
  LongContextOptions o;
  o.request = Template(8);
  o.device_budget_bytes = Budget(*f.engine, prompts[0], 4, 2);
  const double rate = 2e6;  // ~12 ms per full KV
  o.copy.bytes_per_second = rate;
  o.copy.burst_bytes = 4096;
  auto rt = MakeRuntime(*f.engine, o, prompts);
  const auto t0 = Clock::now();
  ASSERT_TRUE(rt->Run().ok());
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  ExpectLossless(*rt, expected, "paced");
  const CopyEngineStats cs = rt->copy_stats();
  const LongContextStats st = rt->stats();
  EXPECT_EQ(cs.bytes, st.reload_bytes);
  // The link is never faster than its rate (less one burst per copy) ...
  EXPECT_GE(cs.busy_seconds, (cs.bytes - cs.completed * 4096) / rate * 0.95);
  EXPECT_GE(elapsed, (cs.bytes - 4096) / rate * 0.95);
  // ... and copies mostly overlap with drafting: generous bound only.
  EXPECT_LT(cs.busy_seconds, 20 * cs.bytes / rate + 5);
}

TEST(LongContextRuntimeTest, DestroyedMidRunDoesNotHang) {
  Fixture f = Make(7);
  const auto prompts = Prompts(4);
  LongContextOptions o;
  o.request = Template(4);
  o.device_budget_bytes = Budget(*f.engine, prompts[0], 4, 2);
  o.copy.bytes_per_second = 2000;  // 2 KB/s: every copy takes seconds
  const auto t0 = Clock::now();
  {
    auto rt = MakeRuntime(*f.engine, o, prompts);
    // Step until copies are in flight.
    for (int i = 0; i < 200 && rt->stats().reloads < 2; ++i) ASSERT_TRUE(rt->Step().ok());
    EXPECT_GE(rt->stats().reloads, 1);
    EXPECT_FALSE(rt->done());
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}

TEST(LongContextRuntimeTest, StopFromAnotherThread) {
  Fixture f = Make(7);
  const auto prompts = Prompts(4);
  LongContextOptions o;
  o.request = Template(4);
  o.device_budget_bytes = Budget(*f.engine, prompts[0], 4, 2);
  o.copy.bytes_per_second = 5000;  // slow: the run cannot finish quickly
  auto rt = MakeRuntime(*f.engine, o, prompts);
  absl::Status result;
  const auto t0 = Clock::now();
  std::thread runner([&] { result = rt->Run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  rt->Stop();
  runner.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  rt.reset();  // with copies possibly in flight
}

}  // namespace
}  // namespace vc
