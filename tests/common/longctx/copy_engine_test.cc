// The copy engine: exact copies charged to the destination arena, a token
// bucket that paces to the configured bandwidth (checked with generous
// bounds only: the machine may be loaded), a bounded queue that refuses
// work when full, and shutdown that never waits for the link.
#include "common/longctx/copy_engine.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "tests/small_model_config.h"

namespace vc {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig SmallConfig() { return test_support::SmallModelConfig({.max_seq_len = 256}); }

// A host cache of `tokens` positions with distinct values.
std::unique_ptr<PagedKvCache> Filled(const ModelConfig& c, int tokens, float seed) {
  auto kv = std::make_unique<PagedKvCache>(c);
  EXPECT_TRUE(kv->Append(tokens).ok());
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int pos = 0; pos < tokens; ++pos) {
    for (int l = 0; l < c.n_layers; ++l) {
      for (int i = 0; i < c.kv_dim(); ++i) {
        k[i] = seed + pos * 1000.0f + l * 100.0f + i;
        v[i] = -k[i];
      }
      kv->Write(l, pos, k.data(), v.data());
    }
  }
  return kv;
}

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

std::vector<CopyResult> WaitFor(CopyEngine& engine, size_t n, double timeout) {
  std::vector<CopyResult> all;
  const auto t0 = Clock::now();
  while (all.size() < n && Seconds(t0) < timeout) {
    for (auto& r : engine.WaitForAny(0.1)) all.push_back(std::move(r));
  }
  return all;
}

TEST(TokenBucketTest, PacesToTheRate) {
  TokenBucket b(1000.0, 100.0);             // 1000 B/s, 100 B burst
  EXPECT_DOUBLE_EQ(b.Take(150, 0.0), 100);  // the burst
  EXPECT_DOUBLE_EQ(b.Take(50, 0.0), 0);
  EXPECT_NEAR(b.WaitTime(50, 0.0), 0.05, 1e-12);
  EXPECT_NEAR(b.Take(50, 0.05), 50, 1e-9);
  EXPECT_NEAR(b.Take(1000, 10.0), 100, 1e-9);      // never more than the burst
  EXPECT_NEAR(b.WaitTime(1000, 10.0), 0.1, 1e-9);  // waits for min(want, burst)
  TokenBucket unlimited(0, 1);
  EXPECT_DOUBLE_EQ(unlimited.Take(1e12, 0), 1e12);
  EXPECT_DOUBLE_EQ(unlimited.WaitTime(1e12, 0), 0);
}

TEST(CopyEngineTest, CopiesExactlyIntoTheArena) {
  const ModelConfig c = SmallConfig();
  auto src = Filled(c, 37, 1.0f);
  KvArena device("device", 0);
  CopyEngine engine({});
  ASSERT_TRUE(engine.Submit({.id = 7, .source = src.get(), .arena = &device, .config = &c}).ok());
  auto results = WaitFor(engine, 1, 30);
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0].copy.ok()) << results[0].copy.status();
  EXPECT_EQ(results[0].id, 7);
  const PagedKvCache& copy = **results[0].copy;
  EXPECT_EQ(copy.next_position(), 37);
  EXPECT_EQ(results[0].bytes, src->bytes());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      for (int pos = 0; pos < 37; ++pos) {
        for (int i = 0; i < c.head_dim; ++i) {
          ASSERT_EQ(copy.KeyAt(l, h, pos)[i], src->KeyAt(l, h, pos)[i]);
          ASSERT_EQ(copy.ValueAt(l, h, pos)[i], src->ValueAt(l, h, pos)[i]);
        }
      }
    }
  }
  // Charged to the device arena in whole blocks; the source was not "read"
  // by attention.
  EXPECT_EQ(device.in_use(), 3 * 16 * c.kv_bytes_per_token());
  EXPECT_EQ(src->bytes_read(), 0);
  EXPECT_LE(results[0].submit_time, results[0].start_time);
  EXPECT_LE(results[0].start_time, results[0].done_time);
  results.clear();
  EXPECT_EQ(device.in_use(), 0);
  EXPECT_EQ(engine.stats().completed, 1);
}

TEST(CopyEngineTest, ReportsArenaExhaustion) {
  const ModelConfig c = SmallConfig();
  auto src = Filled(c, 40, 0.0f);
  KvArena device("device", 2 * 16 * c.kv_bytes_per_token());  // two of the three blocks
  CopyEngine engine({});
  ASSERT_TRUE(engine.Submit({.id = 1, .source = src.get(), .arena = &device, .config = &c}).ok());
  auto results = WaitFor(engine, 1, 30);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].copy.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(device.high_water(), 2 * 16 * c.kv_bytes_per_token());  // never more than the budget
  EXPECT_EQ(engine.stats().failed, 1);
}

TEST(CopyEngineTest, PacesToTheBandwidth) {
  const ModelConfig c = SmallConfig();
  auto src = Filled(c, 200, 0.0f);  // 200 tokens x 256 B = 51200 B
  KvArena device("device", 0);
  const double rate = 400e3;  // 400 KB/s: ~0.128 s per copy
  CopyEngine engine({.bytes_per_second = rate, .burst_bytes = 4096, .queue_depth = 8});
  const auto t0 = Clock::now();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(engine.Submit({.id = i, .source = src.get(), .arena = &device, .config = &c}).ok());
  }
  auto results = WaitFor(engine, 4, 60);
  const double elapsed = Seconds(t0);
  ASSERT_EQ(results.size(), 4u);
  const double bytes = 4.0 * src->bytes();
  // Never faster than the link (minus the bucket's initial burst) ...
  EXPECT_GE(elapsed, (bytes - 4096) / rate * 0.95);
  const CopyEngineStats st = engine.stats();
  EXPECT_EQ(st.bytes, static_cast<int64_t>(bytes));
  EXPECT_GE(st.busy_seconds, (bytes - 4 * 4096) / rate * 0.95);
  // ... and in FIFO order, one at a time.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results[i].id, i);
  for (int i = 1; i < 4; ++i) EXPECT_GE(results[i].start_time, results[i - 1].done_time);
  // Generous upper bound: a loaded machine may be slow, but not 20x.
  EXPECT_LT(elapsed, 20 * bytes / rate + 5);
}

TEST(CopyEngineTest, BoundedQueueRejectsWhenFull) {
  const ModelConfig c = SmallConfig();
  auto src = Filled(c, 64, 0.0f);  // 16 KiB
  KvArena device("device", 0);
  // 1 KB/s: the first copy paces for ~16 s, so the queue cannot drain.
  CopyEngine engine({.bytes_per_second = 1000, .burst_bytes = 1024, .queue_depth = 2});
  ASSERT_TRUE(engine.Submit({.id = 0, .source = src.get(), .arena = &device, .config = &c}).ok());
  // Wait until the worker has picked it up.
  const auto t0 = Clock::now();
  while (device.in_use() == 0 && Seconds(t0) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(engine.Submit({.id = 1, .source = src.get(), .arena = &device, .config = &c}).ok());
  ASSERT_TRUE(engine.Submit({.id = 2, .source = src.get(), .arena = &device, .config = &c}).ok());
  const absl::Status full =
      engine.Submit({.id = 3, .source = src.get(), .arena = &device, .config = &c});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(engine.stats().rejected, 1);
  EXPECT_EQ(engine.in_flight(), 3);
  EXPECT_EQ(engine.Submit({.id = 4}).code(), absl::StatusCode::kInvalidArgument);
  // Shutting down cancels the queue and interrupts the paced copy at once.
  const auto s0 = Clock::now();
  engine.Shutdown();
  EXPECT_LT(Seconds(s0), 2.0);
  EXPECT_EQ(engine.Submit({.id = 5, .source = src.get(), .arena = &device, .config = &c}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(device.in_use(), 0);
}

TEST(CopyEngineTest, DestroyedMidCopyDoesNotHang) {
  const ModelConfig c = SmallConfig();
  auto src = Filled(c, 128, 0.0f);
  KvArena device("device", 0);
  const auto t0 = Clock::now();
  {
    CopyEngine engine({.bytes_per_second = 100, .burst_bytes = 64, .queue_depth = 4});
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(
          engine.Submit({.id = i, .source = src.get(), .arena = &device, .config = &c}).ok());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(Seconds(t0), 3.0);
  EXPECT_EQ(device.in_use(), 0);
}

}  // namespace
}  // namespace vc
