#include "common/compress/compressor.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compress/attention_stats.h"
#include "common/compress/internal/selection.h"
#include "common/engine/kv_cache.h"
#include "common/kv/compressed_kv.h"
#include "common/kv/row_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/compress/tiny_model.h"

namespace vc {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Which = AttentionStats::Which;

using testing::Row;
using testing::TinyConfig;

// Distinct, exactly representable rows: K = 100 l + 10 h + pos + c / 8,
// V = -(K) - 0.5.
float KeyOf(int l, int h, int32_t pos, int c) { return 100.0f * l + 10.0f * h + pos + c / 8.0f; }
float ValueOf(int l, int h, int32_t pos, int c) { return -KeyOf(l, h, pos, c) - 0.5f; }

std::unique_ptr<PagedKvCache> FilledCache(const ModelConfig& config, int32_t n) {
  auto cache = std::make_unique<PagedKvCache>(
      config, PagedKvCache::Options{.block_tokens = 4, .max_tokens = config.max_seq_len});
  EXPECT_TRUE(cache->Append(n).ok());
  std::vector<float> k(config.kv_dim()), v(config.kv_dim());
  for (int l = 0; l < config.n_layers; ++l) {
    for (int32_t p = 0; p < n; ++p) {
      for (int h = 0; h < config.n_kv_heads; ++h) {
        for (int c = 0; c < config.head_dim; ++c) {
          k[h * config.head_dim + c] = KeyOf(l, h, p, c);
          v[h * config.head_dim + c] = ValueOf(l, h, p, c);
        }
      }
      cache->Write(l, p, k.data(), v.data());
    }
  }
  return cache;
}

// Writes one head's K (and V) rows; rows[pos] = head_dim floats.
void WriteHead(const ModelConfig& config, PagedKvCache& cache, int layer, int head,
               const std::vector<std::vector<float>>& keys,
               const std::vector<std::vector<float>>& values) {
  std::vector<float> k(config.kv_dim()), v(config.kv_dim());
  for (size_t p = 0; p < keys.size(); ++p) {
    for (int h = 0; h < config.n_kv_heads; ++h) {
      for (int c = 0; c < config.head_dim; ++c) {
        k[h * config.head_dim + c] = cache.KeyAt(layer, h, static_cast<int32_t>(p))[c];
        v[h * config.head_dim + c] = cache.ValueAt(layer, h, static_cast<int32_t>(p))[c];
      }
    }
    for (int c = 0; c < config.head_dim; ++c) {
      k[head * config.head_dim + c] = keys[p][c];
      v[head * config.head_dim + c] = values[p][c];
    }
    cache.Write(layer, static_cast<int32_t>(p), k.data(), v.data());
  }
}

std::shared_ptr<const CompressedPrefix> MustCompress(const CompressorOptions& options,
                                                     const ModelConfig& config,
                                                     const PagedKvCache& cache, int32_t n,
                                                     const AttentionStats& stats) {
  absl::StatusOr<std::unique_ptr<Compressor>> c = CreateCompressor(options);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const CompressedPrefix>> p =
      (*c)->Compress(config, cache, n, stats);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  EXPECT_EQ((*p)->description(), (*c)->Describe());
  return *p;
}

std::vector<int32_t> Kept(const CompressedPrefix& p, int l, int h) {
  return p.layer(l).heads[h].positions;
}

// Every kept row of a pure dropper is the original f32 row of its position.
void ExpectExactRows(const CompressedPrefix& p, const PagedKvCache& cache, const ModelConfig& c) {
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const CompressedPrefix::Head& head = p.layer(l).heads[h];
      for (size_t i = 0; i < head.positions.size(); ++i) {
        ASSERT_NE(head.keys->RowIfF32(i), nullptr);
        const float* k = cache.KeyAt(l, h, head.positions[i]);
        const float* v = cache.ValueAt(l, h, head.positions[i]);
        EXPECT_THAT(Row(*head.keys, i), ElementsAreArray(k, c.head_dim));
        EXPECT_THAT(Row(*head.values, i), ElementsAreArray(v, c.head_dim));
      }
    }
  }
}

// CompressedPrefix::bytes() of f32 rows with `kept[l]` tokens per head.
int64_t DroppedBytes(const ModelConfig& c, int32_t n, const std::vector<int64_t>& kept) {
  int64_t bytes = 0;
  for (int64_t k : kept) {
    bytes += c.n_kv_heads * (k * 2 * c.head_dim * 4 + (k < n ? 4 * k : 0));
  }
  return bytes;
}

void ExpectInvalid(const absl::Status& s, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& part : parts) EXPECT_THAT(std::string(s.message()), HasSubstr(part));
}

absl::Status CreateStatus(const CompressorOptions& o) { return CreateCompressor(o).status(); }

CompressorOptions Opts(const std::string& name, double ratio = 0.0, int bits = 0) {
  CompressorOptions o;
  o.name = name;
  o.ratio = ratio;
  o.bits = bits;
  return o;
}

// ---------------------------------------------------------------- budgets

TEST(TokenBudgetTest, LargestCountWithinTheRatio) {
  const ModelConfig c = TinyConfig();
  // 32 tokens: a head's full f32 bytes are 32 x 32 = 1024, a kept token 36.
  using compress_internal::TokenBudget;
  EXPECT_EQ(TokenBudget(c, 32, 0.1), 2);      // 102.4 / 36 = 2.84
  EXPECT_EQ(TokenBudget(c, 32, 0.25), 7);     // 256 / 36 = 7.11
  EXPECT_EQ(TokenBudget(c, 32, 0.5), 14);     // 512 / 36 = 14.2
  EXPECT_EQ(TokenBudget(c, 32, 0.99), 28);    // 1013.76 / 36 = 28.2
  EXPECT_EQ(TokenBudget(c, 32, 1.0), 32);     // all tokens, no index bytes
  EXPECT_EQ(TokenBudget(c, 32, 0.28125), 8);  // 8 x 36 = 288 = 0.28125 x 1024 exactly
  EXPECT_EQ(TokenBudget(c, 32, 0.28124), 7);
  EXPECT_EQ(TokenBudget(c, 32, 1e-6), 1);  // at least one token
  EXPECT_EQ(TokenBudget(c, 1, 0.1), 1);
}

TEST(TokenBudgetTest, PyramidBudgetsFollowTheLinearRule) {
  using compress_internal::PyramidBudgets;
  // Targets 4 x (1.5, 1.1667, 0.8333, 0.5) = 6, 4.67, 3.33, 2; the leftover
  // token goes to the largest fractional part (layer 1).
  EXPECT_THAT(PyramidBudgets(4, 4, 0.5, 100), ElementsAre(6, 5, 3, 2));
  // 7.5 and 2.5: the tie on the fraction goes to the lower layer.
  EXPECT_THAT(PyramidBudgets(5, 2, 0.5, 12), ElementsAre(8, 2));
  EXPECT_THAT(PyramidBudgets(5, 3, 0.0, 12), ElementsAre(5, 5, 5));
  EXPECT_THAT(PyramidBudgets(5, 1, 0.5, 12), ElementsAre(5));
  // Bottom target 15 > 12 tokens: clamped, the rest moves up.
  EXPECT_THAT(PyramidBudgets(10, 2, 0.5, 12), ElementsAre(12, 8));
  // beta 1 gives the top layer 0: raised to 1 token, taken from below.
  EXPECT_THAT(PyramidBudgets(1, 2, 1.0, 12), ElementsAre(1, 1));
  EXPECT_THAT(PyramidBudgets(3, 2, 1.0, 12), ElementsAre(5, 1));
}

TEST(TokenBudgetTest, EveryDropperMeetsTheRatioWithExactBytes) {
  const ModelConfig c = TinyConfig();
  const int32_t n = 32;
  auto cache = FilledCache(c, n);
  AttentionStats stats(c, n, 16);
  for (const double ratio : {0.1, 0.25, 0.5, 1.0}) {
    const int64_t k = compress_internal::TokenBudget(c, n, ratio);
    for (const std::string name : {"streamingllm", "h2o", "snapkv", "tova"}) {
      SCOPED_TRACE(name + " at " + std::to_string(ratio));
      auto p = MustCompress(Opts(name, ratio), c, *cache, n, stats);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(p->kept(0), k);
      EXPECT_EQ(p->kept(1), k);
      const int64_t bytes = DroppedBytes(c, n, {k, k});
      EXPECT_EQ(p->bytes(), bytes);
      EXPECT_EQ(p->full_bytes(), int64_t{n} * 128);
      EXPECT_EQ(p->ratio(), static_cast<double>(bytes) / (n * 128));
      EXPECT_LE(p->ratio(), ratio);
      ExpectExactRows(*p, *cache, c);
    }
    // PyramidKV spends exactly the uniform bytes: its budgets average k.
    auto p = MustCompress(Opts("pyramidkv", ratio), c, *cache, n, stats);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->kept(0) + p->kept(1), 2 * k);
    if (ratio < 1.0) {
      EXPECT_GT(p->kept(0), p->kept(1));
      EXPECT_EQ(p->bytes(), DroppedBytes(c, n, {k, k}));
      EXPECT_LE(p->ratio(), ratio);
    }
  }
}

// --------------------------------------------------------------- droppers

// 12 tokens at ratio 0.5: 0.5 x 384 = 192 bytes per head, 5 x 36 = 180.
constexpr int32_t kN = 12;
constexpr double kHalf = 0.5;

TEST(StreamingLlmTest, KeepsSinksAndTheMostRecent) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, kN);
  AttentionStats stats(c, kN, 16);
  CompressorOptions o = Opts("streamingllm", kHalf);
  o.sink_tokens = 2;
  auto p = MustCompress(o, c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) EXPECT_THAT(Kept(*p, l, h), ElementsAre(0, 1, 9, 10, 11));
  }
  ExpectExactRows(*p, *cache, c);
  EXPECT_EQ(p->bytes(), DroppedBytes(c, kN, {5, 5}));
  EXPECT_EQ(p->description(), "streamingllm(ratio=0.5,sink_tokens=2)");

  o.sink_tokens = 8;  // more sinks than budget: the first k only
  p = MustCompress(o, c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 1, 1), ElementsAre(0, 1, 2, 3, 4));
  o.sink_tokens = 0;  // pure recency
  p = MustCompress(o, c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(7, 8, 9, 10, 11));
}

TEST(H2oTest, HalfHeavyHittersHalfRecent) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, kN);
  AttentionStats stats(c, kN, 16);
  // k = 5: 2 heavy hitters among [0, 9), the 3 most recent (9, 10, 11).
  stats.SetForTest(Which::kAccumulated, 0, 0, 3, 5.0);
  stats.SetForTest(Which::kAccumulated, 0, 0, 7, 4.0);
  stats.SetForTest(Which::kAccumulated, 0, 0, 0, 4.0);     // ties with 7: 7 is more recent
  stats.SetForTest(Which::kAccumulated, 0, 0, 10, 100.0);  // in the recent window anyway
  for (int32_t j = 0; j < kN; ++j) {
    if (j != 0 && j != 3 && j != 7 && j != 10) stats.SetForTest(Which::kAccumulated, 0, 0, j, 0.5);
  }
  stats.SetForTest(Which::kAccumulated, 0, 1, 0, 9.0);
  stats.SetForTest(Which::kAccumulated, 0, 1, 1, 8.0);
  // Only the window of the last queries or the last query: H2O ignores them.
  stats.SetForTest(Which::kWindow, 0, 1, 5, 50.0);
  stats.SetForTest(Which::kLast, 0, 1, 6, 50.0);
  auto p = MustCompress(Opts("h2o", kHalf), c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(3, 7, 9, 10, 11));
  EXPECT_THAT(Kept(*p, 0, 1), ElementsAre(0, 1, 9, 10, 11));
  // All scores zero: the ties go to the most recent positions.
  EXPECT_THAT(Kept(*p, 1, 0), ElementsAre(7, 8, 9, 10, 11));
  ExpectExactRows(*p, *cache, c);
  EXPECT_EQ(p->description(), "h2o(ratio=0.5,heavy_share=0.5)");

  // A budget of one token keeps the last one (the recent half rounds up).
  p = MustCompress(Opts("h2o", 0.05), c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(11));
  // 0.6 x 384 / 36 = 6.4 -> 6: 3 heavy among [0, 9), 3 recent.
  p = MustCompress(Opts("h2o", 0.6), c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(0, 3, 7, 9, 10, 11));
}

TEST(SnapKvTest, WindowPlusPooledTopScores) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, kN);
  AttentionStats stats(c, kN, 3);
  // k = 5, window 3: keeps 9, 10, 11 and the 2 best pooled positions of [0, 9).
  stats.SetForTest(Which::kWindow, 0, 0, 2, 1.0);
  stats.SetForTest(Which::kWindow, 0, 0, 6, 0.8);
  stats.SetForTest(Which::kWindow, 0, 0, 9, 10.0);       // in the window: pooled over [0, 9) only
  stats.SetForTest(Which::kAccumulated, 0, 0, 5, 99.0);  // not SnapKV's score
  stats.SetForTest(Which::kWindow, 0, 1, 0, 0.3);
  stats.SetForTest(Which::kWindow, 0, 1, 8, 0.2);
  CompressorOptions o = Opts("snapkv", kHalf);
  o.window = 3;
  o.pool_kernel = 3;
  auto p = MustCompress(o, c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  // Pooled (kernel 3), head 0: 1,2,3 -> 1.0; 5,6,7 -> 0.8; 8 -> 0 (9 is
  // outside the pooled range). Top 2: 3 and 2 (ties prefer the recent).
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(2, 3, 9, 10, 11));
  // Head 1: 0,1 -> 0.3; 7,8 -> 0.2. Top 2: 1 and 0.
  EXPECT_THAT(Kept(*p, 0, 1), ElementsAre(0, 1, 9, 10, 11));
  EXPECT_THAT(Kept(*p, 1, 0), ElementsAre(7, 8, 9, 10, 11));
  ExpectExactRows(*p, *cache, c);
  EXPECT_EQ(p->description(), "snapkv(ratio=0.5,window=3,pool_kernel=3)");

  o.pool_kernel = 1;  // no pooling: the raw scores
  p = MustCompress(o, c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(2, 6, 9, 10, 11));
  EXPECT_THAT(Kept(*p, 0, 1), ElementsAre(0, 8, 9, 10, 11));

  // A budget inside the window keeps its most recent positions.
  o.ratio = 0.2;  // 76.8 / 36 -> 2
  p = MustCompress(o, c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(10, 11));
}

TEST(PyramidKvTest, SnapKvSelectionWithLinearLayerBudgets) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, kN);
  AttentionStats stats(c, kN, 2);
  // Mean k = 5, beta 0.5: layer 0 keeps 7.5 -> 8 (fraction tie to the lower
  // layer), layer 1 2.5 -> 2.
  const double s[10] = {5, 0, 4, 0, 3, 0, 2, 0, 1, 0};
  for (int32_t j = 0; j < 10; ++j) stats.SetForTest(Which::kWindow, 0, 0, j, s[j]);
  stats.SetForTest(Which::kWindow, 1, 0, 0, 7.0);  // layer 1's budget is the window alone
  CompressorOptions o = Opts("pyramidkv", kHalf);
  o.window = 2;
  o.pool_kernel = 1;
  auto p = MustCompress(o, c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->kept(0), 8);
  EXPECT_EQ(p->kept(1), 2);
  // Window 10, 11 plus the top 6 of [0, 10): 0, 2, 4, 6, 8, then the most
  // recent of the zero ties, 9.
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(0, 2, 4, 6, 8, 9, 10, 11));
  EXPECT_THAT(Kept(*p, 0, 1), ElementsAre(4, 5, 6, 7, 8, 9, 10, 11));
  EXPECT_THAT(Kept(*p, 1, 0), ElementsAre(10, 11));
  EXPECT_THAT(Kept(*p, 1, 1), ElementsAre(10, 11));
  ExpectExactRows(*p, *cache, c);
  EXPECT_EQ(p->bytes(), DroppedBytes(c, kN, {8, 2}));
  EXPECT_EQ(p->bytes(), DroppedBytes(c, kN, {5, 5}));
  EXPECT_EQ(p->description(), "pyramidkv(ratio=0.5,window=2,pool_kernel=1,beta=0.5)");

  // Four layers, 32 tokens: budgets 6, 5, 3, 2 (PyramidBudgets(4, 4, 0.5)).
  const ModelConfig c4 = TinyConfig(4);
  auto cache4 = FilledCache(c4, 32);
  AttentionStats stats4(c4, 32, 2);
  o.ratio = 0.15;  // 0.15 x 1024 / 36 = 4.27 -> 4 per head on average
  p = MustCompress(o, c4, *cache4, 32, stats4);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->kept(0), 6);
  EXPECT_EQ(p->kept(1), 5);
  EXPECT_EQ(p->kept(2), 3);
  EXPECT_EQ(p->kept(3), 2);
  EXPECT_THAT(Kept(*p, 3, 1), ElementsAre(30, 31));
}

TEST(TovaTest, TopByTheLastQuery) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, kN);
  AttentionStats stats(c, kN, 16);
  stats.SetForTest(Which::kLast, 1, 1, 11, 0.5);
  stats.SetForTest(Which::kLast, 1, 1, 0, 0.3);
  stats.SetForTest(Which::kLast, 1, 1, 5, 0.1);
  stats.SetForTest(Which::kLast, 1, 1, 2, 0.05);
  stats.SetForTest(Which::kLast, 1, 1, 6, 0.05);
  stats.SetForTest(Which::kLast, 1, 1, 8, 0.05);        // three-way tie for 2 places: 8, 6
  stats.SetForTest(Which::kAccumulated, 1, 1, 3, 9.0);  // not TOVA's score
  auto p = MustCompress(Opts("tova", kHalf), c, *cache, kN, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 1, 1), ElementsAre(0, 5, 6, 8, 11));
  EXPECT_THAT(Kept(*p, 1, 0), ElementsAre(7, 8, 9, 10, 11));
  ExpectExactRows(*p, *cache, c);
  EXPECT_EQ(p->description(), "tova(ratio=0.5)");
}

TEST(TovaTest, GqaScoresSumTheGroupsQueryHeads) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, 3);
  AttentionStats stats(c, 3, 1);
  // Query heads 0 and 1 share KV head 0. Head 0 prefers position 1 (0.6 vs
  // 0.4), but the group's sum prefers position 2 (0.4 + 0.9 > 0.6 + 0.1).
  const float head0[3] = {0.0f, 0.6f, 0.4f};
  const float head1[3] = {0.0f, 0.1f, 0.9f};
  for (int l = 0; l < 2; ++l) {
    stats.Observe(l, 0, 0, 2, {0, 3}, head0);
    stats.Observe(l, 1, 0, 2, {0, 3}, head1);
  }
  // 3 tokens: 0.4 x 96 / 36 = 1.07 -> 1 token.
  auto p = MustCompress(Opts("tova", 0.4), c, *cache, 3, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(2));
  EXPECT_THAT(Kept(*p, 1, 0), ElementsAre(2));
}

// -------------------------------------------------------------- quantisers

TEST(KiviTest, KeysPerChannelValuesPerTokenResidualExact) {
  const ModelConfig c = TinyConfig();
  const int32_t n = 6;
  auto cache = FilledCache(c, n);
  // Layer 0, head 0. quant_group 4, residual 1: key rows 0-3 form one token
  // group, row 4 does not fill a group and row 5 is the residual (both f32);
  // value rows 0-4 are quantised per token (4 channels = the whole row).
  const std::vector<std::vector<float>> keys = {
      {0, 0, -1, 1},    {1, 0.5f, -1, 0.2f},      {2, 2.9f, -1, 0.4f},
      {3, 6, -1, 0.8f}, {7.7f, 7.7f, 7.7f, 7.7f}, {1.1f, 2.2f, 3.3f, 4.4f}};
  const std::vector<std::vector<float>> values = {{0, 1, 2, 3},       {0, 0.5f, 2.9f, 6},
                                                  {-3, -1, 1, 3},     {5, 5, 5, 5},
                                                  {0, 0.9f, 0.2f, 3}, {1.5f, -2.5f, 3.25f, 9}};
  WriteHead(c, *cache, 0, 0, keys, values);
  AttentionStats stats(c, n, 16);
  CompressorOptions o = Opts("kivi", 0.0, 2);
  o.quant_group = 4;
  o.residual = 1;
  auto p = MustCompress(o, c, *cache, n, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->description(), "kivi(bits=2,group=4,residual=1)");
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) EXPECT_THAT(Kept(*p, l, h), ElementsAre(0, 1, 2, 3, 4, 5));
  }
  const CompressedPrefix::Head& head = p->layer(0).heads[0];
  // 2 bits: 3 steps per range. Channel 0: [0, 3] -> scale 1, zero 0, codes
  // 0..3, exact. Channel 1: [0, 6] -> scale 2: 0.5 -> code 0, 2.9 -> 1 (2),
  // 6 -> 3. Channel 2: constant -> scale 0, exact. Channel 3: [0.2, 1] ->
  // scale 0.8 / 3, codes 3, 0, 1 (0.75), 2 (2.25).
  const float s3 = (1.0f - 0.2f) / 3.0f;
  EXPECT_THAT(Row(*head.keys, 0), ElementsAre(0, 0, -1, 3 * s3 + 0.2f));
  EXPECT_THAT(Row(*head.keys, 1), ElementsAre(1, 0, -1, 0.2f));
  EXPECT_THAT(Row(*head.keys, 2), ElementsAre(2, 2, -1, s3 + 0.2f));
  EXPECT_THAT(Row(*head.keys, 3), ElementsAre(3, 6, -1, 2 * s3 + 0.2f));
  EXPECT_EQ(head.keys->RowIfF32(3), nullptr);
  ASSERT_NE(head.keys->RowIfF32(4), nullptr);
  EXPECT_THAT(Row(*head.keys, 4), ElementsAreArray(keys[4]));
  EXPECT_THAT(Row(*head.keys, 5), ElementsAreArray(keys[5]));
  // Values per token: [0,1,2,3] -> scale 1 zero 0 codes 0..3; [0,.5,2.9,6] ->
  // scale 2, codes 0,0,1,3; [-3,-1,1,3] -> scale 2 zero -3, exact; constant
  // -> exact; [0,.9,.2,3] -> scale 1, codes 0,1,0,3.
  EXPECT_THAT(Row(*head.values, 0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Row(*head.values, 1), ElementsAre(0, 0, 2, 6));
  EXPECT_THAT(Row(*head.values, 2), ElementsAre(-3, -1, 1, 3));
  EXPECT_THAT(Row(*head.values, 3), ElementsAre(5, 5, 5, 5));
  EXPECT_THAT(Row(*head.values, 4), ElementsAre(0, 1, 0, 3));
  EXPECT_EQ(head.values->RowIfF32(4), nullptr);
  EXPECT_THAT(Row(*head.values, 5), ElementsAreArray(values[5]));
  // Bytes per head: keys 16 codes x 2 bits = 4, 4 channels x (scale, zero) =
  // 32, 2 f32 rows = 32 -> 68; values 20 codes = 5, 5 x 8 = 40, 1 f32 row =
  // 16 -> 61. No index bytes: every token is kept.
  EXPECT_EQ(p->bytes(), 4 * (68 + 61));
  EXPECT_EQ(p->full_bytes(), n * 128);
  EXPECT_EQ(p->ratio(), 516.0 / 768.0);

  // 4 bits (the default) of [0, .5, 2.9, 6]: scale 0.4, codes 0, 1, 7, 15.
  o.bits = 0;
  p = MustCompress(o, c, *cache, n, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->description(), "kivi(bits=4,group=4,residual=1)");
  const float s = 6.0f / 15.0f;
  EXPECT_THAT(Row(*p->layer(0).heads[0].values, 1), ElementsAre(0, s, 7 * s, 15 * s));
}

TEST(KiviTest, ValueGroupsAreCappedAtHeadDimAndSplitRows) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, 2);
  WriteHead(c, *cache, 1, 1, {{0, 3, 10, 13}, {0, 0, 0, 0}}, {{0, 3, 10, 13}, {0, 0, 0, 0}});
  AttentionStats stats(c, 2, 16);
  CompressorOptions o = Opts("kivi", 0.0, 2);
  o.residual = 0;
  o.quant_group = 2;  // value groups of 2 channels: [0, 3] and [10, 13], scale 1 each
  auto p = MustCompress(o, c, *cache, 2, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(Row(*p->layer(1).heads[1].values, 0), ElementsAre(0, 3, 10, 13));
  o.quant_group = 64;  // capped at head_dim 4: one group [0, 13], scale 13/3
  p = MustCompress(o, c, *cache, 2, stats);
  ASSERT_NE(p, nullptr);
  const float s = 13.0f / 3.0f;
  // 3 / s = 0.69 -> 1, 10 / s = 2.31 -> 2.
  EXPECT_THAT(Row(*p->layer(1).heads[1].values, 0), ElementsAre(0, s, 2 * s, 3 * s));
}

TEST(Int8Test, PerTokenSymmetric) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, 3);
  WriteHead(c, *cache, 0, 1, {{1, -2, 0.5f, 127}, {0.3f, -0.6f, 1.27f, 0}, {0, 0, 0, 0}},
            {{-127, 63.5f, 2.5f, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}});
  AttentionStats stats(c, 3, 16);
  auto p = MustCompress(Opts("int8"), c, *cache, 3, stats);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->description(), "int8(per_token_symmetric)");
  const CompressedPrefix::Head& head = p->layer(0).heads[1];
  // absmax 127 -> scale 1; 0.5 rounds half to even -> 0.
  EXPECT_THAT(Row(*head.keys, 0), ElementsAre(1, -2, 0, 127));
  // absmax 1.27 -> scale 0.01: codes 30, -60, 127, 0.
  const float s = 1.27f / 127.0f;
  EXPECT_THAT(Row(*head.keys, 1), ElementsAre(30 * s, -60 * s, 127 * s, 0));
  EXPECT_THAT(Row(*head.keys, 2), ElementsAre(0, 0, 0, 0));
  // 63.5 and 2.5 round half to even: 64 and 2.
  EXPECT_THAT(Row(*head.values, 0), ElementsAre(-127, 64, 2, 0));
  const float one = 127 * (1.0f / 127.0f);  // absmax 1: code 127, scale 1/127
  EXPECT_THAT(Row(*head.values, 1), ElementsAre(one, one, one, one));
  // Per row and head: 4 code bytes + a 4-byte scale, for K and V: half of f32.
  EXPECT_EQ(p->bytes(), 3 * 2 * 2 * 2 * 8);
  EXPECT_EQ(p->ratio(), 0.5);
  EXPECT_EQ(p->kept(0), 3);
}

// --------------------------------------------------------------- composites

TEST(CompositeTest, KeepsTheDroppersPositionsAndQuantisesThem) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, kN);
  AttentionStats stats(c, kN, 3);
  stats.SetForTest(Which::kWindow, 0, 0, 2, 1.0);
  stats.SetForTest(Which::kWindow, 0, 0, 6, 0.8);
  CompressorOptions drop = Opts("snapkv", kHalf);
  drop.window = 3;
  drop.pool_kernel = 1;
  CompressorOptions both = drop;
  both.name = "snapkv+kivi";
  both.bits = 2;
  both.quant_group = 2;
  both.residual = 1;
  auto dropped = MustCompress(drop, c, *cache, kN, stats);
  auto p = MustCompress(both, c, *cache, kN, stats);
  ASSERT_NE(dropped, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->description(),
            "snapkv(ratio=0.5,window=3,pool_kernel=1)+kivi(bits=2,group=2,residual=1)");
  const RowCodecSpec key_spec{RowCodecSpec::Kind::kPerChannelAsymmetric, 2, 2, 1};
  const RowCodecSpec value_spec{RowCodecSpec::Kind::kPerTokenAsymmetric, 2, 2, 1};
  int64_t bytes = 0;
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      const std::vector<int32_t> pos = Kept(*p, l, h);
      EXPECT_EQ(pos, Kept(*dropped, l, h));
      // The kept rows, quantised on their own, exactly as stored.
      std::vector<float> k_rows, v_rows;
      for (int32_t q : pos) {
        k_rows.insert(k_rows.end(), cache->KeyAt(l, h, q), cache->KeyAt(l, h, q) + 4);
        v_rows.insert(v_rows.end(), cache->ValueAt(l, h, q), cache->ValueAt(l, h, q) + 4);
      }
      auto k_store = RowStore::Encode(key_spec, k_rows.data(), pos.size(), 4);
      auto v_store = RowStore::Encode(value_spec, v_rows.data(), pos.size(), 4);
      ASSERT_TRUE(k_store.ok() && v_store.ok());
      const CompressedPrefix::Head& head = p->layer(l).heads[h];
      for (size_t i = 0; i < pos.size(); ++i) {
        EXPECT_EQ(Row(*head.keys, i), Row(**k_store, i));
        EXPECT_EQ(Row(*head.values, i), Row(**v_store, i));
      }
      // The last kept row is KIVI's residual: exact.
      EXPECT_THAT(Row(*head.keys, pos.size() - 1),
                  ElementsAreArray(cache->KeyAt(l, h, pos.back()), 4));
      bytes += (*k_store)->bytes() + (*v_store)->bytes() + 4 * static_cast<int64_t>(pos.size());
    }
  }
  EXPECT_THAT(Kept(*p, 0, 0), ElementsAre(2, 6, 9, 10, 11));
  // (At head_dim 4 KIVI's scales and zero points cost about what its codes
  // save, so only the exact count is checked here; H2oPlusInt8Bytes shrinks.)
  EXPECT_EQ(p->bytes(), bytes);
}

TEST(CompositeTest, H2oPlusInt8Bytes) {
  const ModelConfig c = TinyConfig();
  const int32_t n = 32;
  auto cache = FilledCache(c, n);
  AttentionStats stats(c, n, 16);
  for (const double ratio : {0.1, 0.25, 0.5, 1.0}) {
    const int64_t k = compress_internal::TokenBudget(c, n, ratio);
    auto p = MustCompress(Opts("h2o+int8", ratio, 8), c, *cache, n, stats);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->kept(0), k);
    // Per kept token and head: 2 x (4 code bytes + 4 scale bytes) + a 4-byte
    // index unless every token is kept.
    const int64_t bytes = 2 * 2 * (k * 16 + (k < n ? 4 * k : 0));
    EXPECT_EQ(p->bytes(), bytes);
    EXPECT_EQ(p->ratio(), static_cast<double>(bytes) / (n * 128));
    EXPECT_LT(p->bytes(), DroppedBytes(c, n, {k, k}));  // smaller than h2o alone
  }
  for (const std::string name : {"streamingllm+kivi", "pyramidkv+int8", "tova+kivi"}) {
    auto p = MustCompress(Opts(name, 0.5, name.ends_with("int8") ? 8 : 2), c, *cache, n, stats);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->kept(0) + p->kept(1), 2 * compress_internal::TokenBudget(c, n, 0.5));
  }
}

// ------------------------------------------------------------ registry

TEST(RegistryTest, ListsEveryMethodWithItsParams) {
  const std::vector<CompressorInfo> all = ListCompressors();
  std::set<std::string> names;
  for (const CompressorInfo& info : all) {
    names.insert(info.name);
    EXPECT_FALSE(info.description.empty()) << info.name;
    std::set<std::string> params;
    for (const CompressorParamInfo& p : info.params) {
      params.insert(p.name);
      EXPECT_FALSE(p.description.empty()) << info.name << " " << p.name;
    }
    EXPECT_EQ(params.count("--ratio") > 0, info.takes_ratio) << info.name;
    EXPECT_EQ(params.count("--bits") > 0, info.takes_bits) << info.name;
    // Every listed method can be built with its own kind of options.
    CompressorOptions o = Opts(info.name, info.takes_ratio ? 0.5 : 0.0);
    auto made = CreateCompressor(o);
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_EQ((*made)->info().name, info.name);
    EXPECT_EQ((*made)->info().family, info.family);
  }
  EXPECT_EQ(all.size(), names.size());
  for (const char* name : {"streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "kivi", "int8",
                           "snapkv+kivi", "h2o+kivi", "streamingllm+kivi", "snapkv+int8"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  EXPECT_EQ(all[0].name, "streamingllm");
  EXPECT_EQ(all[0].family, "token-dropping");
  EXPECT_FALSE(all[0].needs_attention_stats);
  auto snap = CreateCompressor(Opts("snapkv+kivi", 0.5));
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ((*snap)->info().family, "composite");
  EXPECT_TRUE((*snap)->info().needs_attention_stats);
  EXPECT_TRUE((*snap)->info().takes_ratio && (*snap)->info().takes_bits);
  auto kivi = CreateCompressor(Opts("kivi"));
  ASSERT_TRUE(kivi.ok());
  EXPECT_EQ((*kivi)->info().family, "quantization");
  EXPECT_EQ((*kivi)->Describe(), "kivi(bits=4,group=32,residual=32)");
}

TEST(RegistryTest, DescribeIsStableAndDistinguishesParams) {
  auto a = CreateCompressor(Opts("snapkv", 0.1));
  auto b = CreateCompressor(Opts("snapkv", 0.1));
  auto d = CreateCompressor(Opts("snapkv", 0.1000001));
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  EXPECT_EQ((*a)->Describe(), "snapkv(ratio=0.1,window=16,pool_kernel=7)");
  EXPECT_EQ((*a)->Describe(), (*b)->Describe());
  EXPECT_NE((*a)->Describe(), (*d)->Describe());
  CompressorOptions o = Opts("pyramidkv", 0.25);
  o.pyramid_beta = 0.3;
  auto p = CreateCompressor(o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->Describe(), "pyramidkv(ratio=0.25,window=16,pool_kernel=7,beta=0.3)");
  auto s = CreateCompressor(Opts("streamingllm+int8", 1.0));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Describe(), "streamingllm(ratio=1,sink_tokens=4)+int8(per_token_symmetric)");
}

TEST(RegistryTest, RejectsBadOptionsWithClearMessages) {
  ExpectInvalid(CreateStatus(Opts("foo", 0.5)),
                {"unknown compressor 'foo'", "streamingllm", "h2o", "snapkv", "pyramidkv", "tova",
                 "kivi", "int8", "<dropper>+<quantiser>"});
  ExpectInvalid(CreateStatus(Opts("kivi+snapkv", 0.5)), {"unknown compressor 'kivi+snapkv'"});
  ExpectInvalid(CreateStatus(Opts("snapkv+", 0.5)), {"unknown compressor"});
  ExpectInvalid(CreateStatus(Opts("snapkv+kivi+int8", 0.5)), {"unknown compressor"});
  ExpectInvalid(CreateStatus(Opts("", 0.5)), {"unknown compressor ''"});
  // Ratio outside (0, 1] for every dropper and composite; not given = 0.
  for (const std::string name :
       {"streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "snapkv+kivi"}) {
    ExpectInvalid(CreateStatus(Opts(name, 0.0)), {name, "--ratio must be in (0, 1]", "not given"});
    ExpectInvalid(CreateStatus(Opts(name, 1.5)), {"--ratio must be in (0, 1]", "1.5"});
    ExpectInvalid(CreateStatus(Opts(name, -0.1)), {"--ratio must be in (0, 1]"});
    ExpectInvalid(CreateStatus(Opts(name, std::numeric_limits<double>::quiet_NaN())),
                  {"--ratio must be in (0, 1]"});
  }
  ExpectInvalid(CreateStatus(Opts("kivi", 0.5)), {"kivi", "takes no --ratio", "snapkv+kivi"});
  ExpectInvalid(CreateStatus(Opts("int8", 0.25, 8)), {"int8", "takes no --ratio"});
  ExpectInvalid(CreateStatus(Opts("snapkv", 0.5, 4)), {"snapkv", "takes no --bits", "snapkv+kivi"});
  ExpectInvalid(CreateStatus(Opts("tova", 0.5, 8)), {"tova", "takes no --bits"});
  ExpectInvalid(CreateStatus(Opts("kivi", 0.0, 8)), {"kivi supports --bits 2 or 4, got 8"});
  ExpectInvalid(CreateStatus(Opts("kivi", 0.0, 3)), {"kivi supports --bits 2 or 4, got 3"});
  ExpectInvalid(CreateStatus(Opts("snapkv+kivi", 0.5, 8)),
                {"snapkv+kivi", "kivi supports --bits 2 or 4"});
  ExpectInvalid(CreateStatus(Opts("int8", 0.0, 4)), {"int8 supports only --bits 8, got 4"});
  ExpectInvalid(CreateStatus(Opts("h2o+int8", 0.5, 2)), {"int8 supports only --bits 8"});
  EXPECT_TRUE(CreateStatus(Opts("int8", 0.0, 8)).ok());
  EXPECT_TRUE(CreateStatus(Opts("kivi", 0.0, 2)).ok());

  CompressorOptions o = Opts("snapkv", 0.5);
  o.pool_kernel = 4;
  ExpectInvalid(CreateStatus(o), {"--pool-kernel must be odd", "got 4"});
  o.pool_kernel = 0;
  ExpectInvalid(CreateStatus(o), {"--pool-kernel must be odd and >= 1", "got 0"});
  o.name = "pyramidkv+kivi";
  ExpectInvalid(CreateStatus(o), {"pyramidkv+kivi", "--pool-kernel"});
  o = Opts("pyramidkv", 0.5);
  o.window = -1;
  ExpectInvalid(CreateStatus(o), {"--window must be >= 0, got -1"});
  o = Opts("pyramidkv", 0.5);
  o.pyramid_beta = 1.5;
  ExpectInvalid(CreateStatus(o), {"--pyramid-beta must be in [0, 1]"});
  o = Opts("streamingllm", 0.5);
  o.sink_tokens = -1;
  ExpectInvalid(CreateStatus(o), {"--sink-tokens must be >= 0, got -1"});
  o = Opts("kivi");
  o.quant_group = 0;
  ExpectInvalid(CreateStatus(o), {"--quant-group must be >= 1, got 0"});
  o = Opts("kivi");
  o.residual = -2;
  ExpectInvalid(CreateStatus(o), {"--residual must be >= 0, got -2"});
  // Parameters a method does not use are ignored, as the interface says.
  o = Opts("tova", 0.5);
  o.pool_kernel = 4;
  o.quant_group = 0;
  EXPECT_TRUE(CreateStatus(o).ok());
}

TEST(RegistryTest, CompressRejectsMismatchedInputs) {
  const ModelConfig c = TinyConfig();
  auto cache = FilledCache(c, kN);
  AttentionStats stats(c, kN, 8);
  auto snap = CreateCompressor(Opts("snapkv", 0.5));  // window 16
  ASSERT_TRUE(snap.ok());
  ExpectInvalid((*snap)->Compress(c, *cache, kN, stats).status(),
                {"snapkv", "window of 8", "--window is 16"});
  auto h2o = CreateCompressor(Opts("h2o", 0.5));
  ASSERT_TRUE(h2o.ok());
  AttentionStats short_stats(c, 4, 8);
  ExpectInvalid((*h2o)->Compress(c, *cache, kN, short_stats).status(),
                {"h2o", "cover 4 prompt tokens", "has 12"});
  ExpectInvalid((*h2o)->Compress(c, *cache, 0, stats).status(), {">= 1 token"});
  auto kivi = CreateCompressor(Opts("kivi"));
  ASSERT_TRUE(kivi.ok());
  ExpectInvalid((*kivi)->Compress(c, *cache, kN + 1, stats).status(), {"full KV holding them"});
  // Statistics over a longer prompt (prefix + suffix) are fine.
  AttentionStats long_stats(c, kN + 4, 8);
  EXPECT_TRUE((*h2o)->Compress(c, *cache, kN, long_stats).ok());
}

}  // namespace
}  // namespace vc
