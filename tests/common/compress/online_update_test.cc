// Compressor::Update (online compression) against hand-computed applications
// of each method's online rule, and against the offline rule where the two
// must agree (StreamingLLM's window and the quantisers' sliding residual give
// exactly what compressing the longer prefix offline gives); FoldIntoView's
// settled-length invariant and byte accounting.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/compress/attention_stats.h"
#include "common/compress/compressor.h"
#include "common/engine/kv_cache.h"
#include "common/kv/compressed_kv.h"
#include "common/kv/kv_arena.h"
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

// Distinct rows, irregular enough that quantisation is not exact.
float KeyOf(int l, int h, int32_t pos, int c) {
  return 0.37f * l + 0.11f * h + std::sin(0.7f * pos + 1.3f * c) * (1.0f + 0.25f * c);
}
float ValueOf(int l, int h, int32_t pos, int c) {
  return std::cos(0.45f * pos - 0.9f * c + l + 0.5f * h) * 2.0f;
}

void WriteRows(const ModelConfig& c, SequenceKv& kv, int32_t first, int32_t last) {
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int32_t p = first; p < last; ++p) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        for (int d = 0; d < c.head_dim; ++d) {
          k[h * c.head_dim + d] = KeyOf(l, h, p, d);
          v[h * c.head_dim + d] = ValueOf(l, h, p, d);
        }
      }
      kv.Write(l, p, k.data(), v.data());
    }
  }
}

std::unique_ptr<PagedKvCache> FullCache(const ModelConfig& c, int32_t n) {
  auto cache = std::make_unique<PagedKvCache>(c);
  EXPECT_TRUE(cache->Append(n).ok());
  WriteRows(c, *cache, 0, n);
  return cache;
}

CompressorOptions Opts(const std::string& name, double ratio = 0.0, int bits = 0) {
  CompressorOptions o;
  o.name = name;
  o.ratio = ratio;
  o.bits = bits;
  return o;
}

std::unique_ptr<Compressor> Make(const CompressorOptions& o) {
  auto c = CreateCompressor(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(c).value() : nullptr;
}

// The drafter's view after prefill + generation: the prefix compressed
// offline at n0, exact rows [n0, n) in the tail, all of them settled.
std::unique_ptr<CompressedSequenceKv> View(const ModelConfig& c, const Compressor& comp, int32_t n0,
                                           int32_t n, const AttentionStats& stats,
                                           KvArena* arena = nullptr) {
  auto full = FullCache(c, n);
  auto prefix = comp.Compress(c, *full, n0, stats);
  EXPECT_TRUE(prefix.ok()) << prefix.status();
  auto view = std::make_unique<CompressedSequenceKv>(c, *prefix, 0, arena);
  EXPECT_TRUE(view->Append(n - n0).ok());
  WriteRows(c, *view, n0, n);
  EXPECT_TRUE(view->Settle(n).ok());
  return view;
}

std::string Serialized(const RowStore& s) {
  std::string out;
  s.AppendSerialized(&out);
  return out;
}

// Positions and stored rows identical (byte for byte, format included).
void ExpectSamePrefix(const CompressedPrefix& a, const CompressedPrefix& b) {
  ASSERT_EQ(a.prefix_len(), b.prefix_len());
  ASSERT_EQ(a.n_layers(), b.n_layers());
  EXPECT_EQ(a.bytes(), b.bytes());
  for (int l = 0; l < a.n_layers(); ++l) {
    for (size_t h = 0; h < a.layer(l).heads.size(); ++h) {
      SCOPED_TRACE("layer " + std::to_string(l) + " head " + std::to_string(h));
      const auto& x = a.layer(l).heads[h];
      const auto& y = b.layer(l).heads[h];
      EXPECT_EQ(x.positions, y.positions);
      EXPECT_EQ(Serialized(*x.keys), Serialized(*y.keys));
      EXPECT_EQ(Serialized(*x.values), Serialized(*y.values));
    }
  }
}

// Every row of a pure dropper's prefix is the exact row of its position.
void ExpectExactRows(const ModelConfig& c, const CompressedPrefix& p) {
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const auto& head = p.layer(l).heads[h];
      for (size_t i = 0; i < head.positions.size(); ++i) {
        for (int d = 0; d < c.head_dim; ++d) {
          EXPECT_EQ(Row(*head.keys, i)[d], KeyOf(l, h, head.positions[i], d));
          EXPECT_EQ(Row(*head.values, i)[d], ValueOf(l, h, head.positions[i], d));
        }
      }
    }
  }
}

// ------------------------------------------------------------ StreamingLLM

TEST(OnlineStreamingLlmTest, OldestNonSinksLeaveAndTheBudgetFollowsTheLength) {
  const ModelConfig c = TinyConfig();
  CompressorOptions o = Opts("streamingllm", 0.5);
  o.sink_tokens = 2;
  auto comp = Make(o);
  ASSERT_NE(comp, nullptr);
  EXPECT_EQ(comp->online_policy().kind, OnlinePolicy::Kind::kEveryToken);
  EXPECT_FALSE(comp->online_policy().needs_decode_stats);
  AttentionStats stats(c, 12, 16);
  auto view = View(c, *comp, 12, 16, stats);
  EXPECT_THAT(view->prefix().layer(0).heads[0].positions, ElementsAre(0, 1, 9, 10, 11));
  // 16 tokens: 0.5 x 512 / 36 = 7.1 -> 7 = the 2 sinks + the 5 most recent.
  auto next = comp->Update(c, view->prefix(), view->tail(), 16, nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      EXPECT_THAT((*next)->layer(l).heads[h].positions, ElementsAre(0, 1, 11, 12, 13, 14, 15));
    }
  }
  EXPECT_EQ((*next)->prefix_len(), 16);
  ExpectExactRows(c, **next);
  EXPECT_EQ((*next)->bytes(), 2 * 2 * 7 * 36);
  // A partial fold: 14 tokens -> 0.5 x 448 / 36 = 6.2 -> 6.
  next = comp->Update(c, view->prefix(), view->tail(), 14, nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT((*next)->layer(1).heads[1].positions, ElementsAre(0, 1, 10, 11, 12, 13));
}

TEST(OnlineStreamingLlmTest, StepByStepEqualsCompressingTheLongerPrefix) {
  const ModelConfig c = TinyConfig();
  // Budgets of at least the 4 sinks (below that an evicted sink cannot come
  // back when the budget grows, so online and offline differ by design).
  for (const double ratio : {0.25, 0.5, 0.8}) {
    auto comp = Make(Opts("streamingllm", ratio));
    ASSERT_NE(comp, nullptr);
    AttentionStats stats(c, 0, 0);
    auto view = View(c, *comp, 20, 60, stats);
    for (int32_t n = 21; n <= 60; n += 3) {
      ASSERT_TRUE(FoldIntoView(*comp, c, n, nullptr, view.get(), nullptr, nullptr).ok());
      auto full = FullCache(c, n);
      auto offline = comp->Compress(c, *full, n, stats);
      ASSERT_TRUE(offline.ok());
      SCOPED_TRACE("ratio " + std::to_string(ratio) + " n " + std::to_string(n));
      ExpectSamePrefix(view->prefix(), **offline);
    }
  }
}

// ------------------------------------------------------------ quantisers

TEST(OnlineQuantizerTest, SlidingResidualEqualsEncodingTheLongerPrefix) {
  const ModelConfig c = TinyConfig();
  std::vector<CompressorOptions> cases = {Opts("kivi", 0, 2), Opts("kivi", 0, 4),
                                          Opts("int8", 0, 8)};
  cases[0].quant_group = 4;
  cases[0].residual = 3;
  cases[1].quant_group = 8;
  cases[1].residual = 0;
  for (const CompressorOptions& o : cases) {
    auto comp = Make(o);
    ASSERT_NE(comp, nullptr);
    EXPECT_EQ(comp->online_policy().kind, OnlinePolicy::Kind::kPerGroup);
    AttentionStats stats(c, 0, 0);
    auto view = View(c, *comp, 7, 50, stats);
    for (const int32_t n : {8, 11, 12, 20, 33, 50}) {
      ASSERT_TRUE(FoldIntoView(*comp, c, n, nullptr, view.get(), nullptr, nullptr).ok());
      auto full = FullCache(c, n);
      auto offline = comp->Compress(c, *full, n, stats);
      ASSERT_TRUE(offline.ok());
      SCOPED_TRACE(comp->Describe() + " n " + std::to_string(n));
      ExpectSamePrefix(view->prefix(), **offline);
    }
  }
}

// Reference per-channel asymmetric quantisation of one group (independent of
// the codec): decoded value of rows[r][ch].
std::vector<std::vector<float>> RefPerChannel(const std::vector<std::vector<float>>& rows,
                                              int bits) {
  const float max_code = static_cast<float>((1 << bits) - 1);
  std::vector<std::vector<float>> out = rows;
  for (size_t ch = 0; ch < rows[0].size(); ++ch) {
    float lo = rows[0][ch], hi = rows[0][ch];
    for (const auto& r : rows) {
      lo = std::min(lo, r[ch]);
      hi = std::max(hi, r[ch]);
    }
    const float scale = (hi - lo) / max_code;
    for (size_t i = 0; i < rows.size(); ++i) {
      const float code = scale > 0 ? std::nearbyint((rows[i][ch] - lo) / scale) : 0.0f;
      out[i][ch] = code * scale + lo;
    }
  }
  return out;
}

TEST(OnlineQuantizerTest, KiviQuantisesTheOldestGroupOnceResidualPlusGroupAreExact) {
  const ModelConfig c = TinyConfig();
  CompressorOptions o = Opts("kivi", 0, 2);
  o.quant_group = 4;
  o.residual = 2;
  auto comp = Make(o);
  ASSERT_NE(comp, nullptr);
  EXPECT_EQ(comp->online_policy().interval, 4);
  AttentionStats stats(c, 0, 0);
  // Offline at 6 tokens: key group rows 0-3 quantised, rows 4, 5 f32 (the
  // residual); values 0-3 quantised per token, 4, 5 f32.
  auto view = View(c, *comp, 6, 12, stats);
  const auto& before = view->prefix().layer(1).heads[0];
  std::vector<std::vector<float>> old_keys;
  for (int i = 0; i < 4; ++i) old_keys.push_back(Row(*before.keys, i));
  EXPECT_EQ(before.keys->RowIfF32(3), nullptr);
  EXPECT_NE(before.keys->RowIfF32(4), nullptr);
  // 9 tokens: 4 + 2 + 3 -> still short of residual + group beyond group 0.
  auto p9 = comp->Update(c, view->prefix(), view->tail(), 9, nullptr);
  ASSERT_TRUE(p9.ok());
  EXPECT_NE((*p9)->layer(1).heads[0].keys->RowIfF32(4), nullptr);
  // 10 tokens = group 0 + residual 2 + group 4: rows 4-7 become group 1.
  auto p10 = comp->Update(c, view->prefix(), view->tail(), 10, nullptr);
  ASSERT_TRUE(p10.ok());
  const auto& after = (*p10)->layer(1).heads[0];
  EXPECT_THAT(after.positions, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Row(*after.keys, i), old_keys[i]) << "codes kept";
  std::vector<std::vector<float>> group1;
  for (int32_t p = 4; p < 8; ++p) {
    std::vector<float> r(4);
    for (int d = 0; d < 4; ++d) r[d] = KeyOf(1, 0, p, d);
    group1.push_back(r);
  }
  const auto expected = RefPerChannel(group1, 2);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(after.keys->RowIfF32(4 + i), nullptr);
    EXPECT_THAT(Row(*after.keys, 4 + i), ElementsAreArray(expected[i]));
  }
  // Rows 8, 9: the residual window, exact.
  for (int i = 8; i < 10; ++i) {
    ASSERT_NE(after.keys->RowIfF32(i), nullptr);
    ASSERT_NE(after.values->RowIfF32(i), nullptr);
    for (int d = 0; d < 4; ++d) EXPECT_EQ(Row(*after.keys, i)[d], KeyOf(1, 0, i, d));
  }
  // Values per token: every row but the last 2 quantised.
  EXPECT_EQ(after.values->RowIfF32(7), nullptr);
}

TEST(OnlineQuantizerTest, Int8QuantisesEachTokenOnItsOwn) {
  const ModelConfig c = TinyConfig();
  auto comp = Make(Opts("int8"));
  ASSERT_NE(comp, nullptr);
  EXPECT_EQ(comp->online_policy().interval, 16);
  AttentionStats stats(c, 0, 0);
  auto view = View(c, *comp, 5, 9, stats);
  auto next = comp->Update(c, view->prefix(), view->tail(), 9, nullptr);
  ASSERT_TRUE(next.ok());
  const auto& head = (*next)->layer(0).heads[1];
  for (int32_t p = 0; p < 9; ++p) {
    EXPECT_EQ(head.values->RowIfF32(p), nullptr);
    // Symmetric: scale = absmax / 127, code = round(x / scale).
    float amax = 0;
    for (int d = 0; d < 4; ++d) amax = std::max(amax, std::fabs(ValueOf(0, 1, p, d)));
    const float scale = amax / 127.0f;
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(Row(*head.values, p)[d], std::nearbyint(ValueOf(0, 1, p, d) / scale) * scale);
    }
  }
}

// ------------------------------------------------------------ H2O / TOVA

TEST(OnlineH2oTest, HeavyHittersByDecodeAttentionHalfRecent) {
  const ModelConfig c = TinyConfig();
  auto comp = Make(Opts("h2o", 0.5));
  ASSERT_NE(comp, nullptr);
  EXPECT_TRUE(comp->online_policy().needs_decode_stats);
  AttentionStats prefill(c, 12, 16);
  // Offline at 12 (k = 5): heavy 3 and 7, recent 9, 10, 11 in (0, 0).
  prefill.SetForTest(Which::kAccumulated, 0, 0, 3, 5.0);
  prefill.SetForTest(Which::kAccumulated, 0, 0, 7, 4.0);
  auto view = View(c, *comp, 12, 16, prefill);
  ASSERT_THAT(view->prefix().layer(0).heads[0].positions, ElementsAre(3, 7, 9, 10, 11));
  DecodeAttentionStats decode(c, c.max_seq_len, &prefill);
  EXPECT_EQ(decode.accumulated(0, 0, 3), 5.0);  // seeded from the prefill
  decode.SetForTest(Which::kAccumulated, 0, 0, 9, 10.0);
  decode.SetForTest(Which::kAccumulated, 0, 0, 11, 2.0);
  decode.SetForTest(Which::kAccumulated, 0, 0, 10, 1.0);
  decode.SetForTest(Which::kAccumulated, 0, 0, 14, 50.0);  // recent anyway
  // 16 tokens: k = 7, recent 4 (12-15), heavy 3 among {3, 7, 9, 10, 11}:
  // 9 (10), 3 (5), 7 (4, from the prefill); 11 (2) and 10 (1) leave.
  auto next = comp->Update(c, view->prefix(), view->tail(), 16, &decode);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT((*next)->layer(0).heads[0].positions, ElementsAre(3, 7, 9, 12, 13, 14, 15));
  // Decode attention changes the ranking: 11 overtakes 7.
  decode.SetForTest(Which::kAccumulated, 0, 0, 11, 4.5);
  next = comp->Update(c, view->prefix(), view->tail(), 16, &decode);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT((*next)->layer(0).heads[0].positions, ElementsAre(3, 9, 11, 12, 13, 14, 15));
  // No scores: ties go to the more recent candidates.
  EXPECT_THAT((*next)->layer(1).heads[1].positions, ElementsAre(9, 10, 11, 12, 13, 14, 15));
  ExpectExactRows(c, **next);
  // The rule needs the statistics.
  auto missing = comp->Update(c, view->prefix(), view->tail(), 16, nullptr);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("DecodeAttentionStats"));
}

TEST(OnlineTovaTest, KeepsWhatTheLatestQueryAttendedAndTokensItCouldNotSee) {
  const ModelConfig c = TinyConfig();
  auto comp = Make(Opts("tova", 0.5));
  ASSERT_NE(comp, nullptr);
  AttentionStats prefill(c, 12, 16);
  auto view = View(c, *comp, 12, 16, prefill);
  ASSERT_THAT(view->prefix().layer(0).heads[0].positions, ElementsAre(7, 8, 9, 10, 11));
  DecodeAttentionStats decode(c, c.max_seq_len, nullptr);
  decode.SetLastQueryPosForTest(14);  // position 15 was never seen: kept
  decode.SetForTest(Which::kLast, 0, 0, 8, 0.9);
  decode.SetForTest(Which::kLast, 0, 0, 12, 0.5);
  decode.SetForTest(Which::kLast, 0, 0, 7, 0.3);
  // k = 7: 15 (unseen), 8, 12, 7, then ties among zeros: 14, 13, 11.
  auto next = comp->Update(c, view->prefix(), view->tail(), 16, &decode);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT((*next)->layer(0).heads[0].positions, ElementsAre(7, 8, 11, 12, 13, 14, 15));
  ExpectExactRows(c, **next);
}

TEST(DecodeAttentionStatsTest, MapsTheViewsStoredOrderToPositions) {
  const ModelConfig c = TinyConfig();
  auto comp = Make(Opts("streamingllm", 0.5));
  AttentionStats prefill(c, 0, 0);
  CompressorOptions o = Opts("streamingllm", 0.5);
  o.sink_tokens = 2;
  comp = Make(o);
  auto view = View(c, *comp, 12, 14, prefill);  // stored: 0, 1, 9, 10, 11 | 12, 13
  DecodeAttentionStats decode(c, c.max_seq_len, nullptr);
  decode.SetView(view.get());
  decode.BeginPass(13);
  const float probs[7] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.015625f};
  decode.Observe(1, 2, 1, 13, {0, 7}, probs);
  decode.Observe(1, 3, 1, 13, {0, 7}, probs);  // the group's other query head
  decode.Observe(1, 2, 1, 12, {2, 3}, probs);  // not the last query: accumulated only
  EXPECT_EQ(decode.accumulated(1, 1, 0), 1.0);
  EXPECT_EQ(decode.accumulated(1, 1, 9), 0.25 + 0.5);
  EXPECT_EQ(decode.accumulated(1, 1, 13), 0.03125);
  EXPECT_EQ(decode.last(1, 1, 9), 0.25);
  EXPECT_EQ(decode.last(1, 1, 2), 0.0);
  decode.DiscardFrom(13);  // rolled back
  EXPECT_EQ(decode.accumulated(1, 1, 13), 0.0);
  EXPECT_EQ(decode.accumulated(1, 1, 12), 0.015625 * 2);
  decode.BeginPass(14);
  EXPECT_EQ(decode.last(1, 1, 9), 0.0);
}

// ------------------------------------------------------------ no online rule, composites

TEST(OnlineRuleTest, OnceAfterPrefillMethodsHaveNone) {
  const ModelConfig c = TinyConfig();
  for (const std::string name : {"snapkv", "pyramidkv"}) {
    auto comp = Make(Opts(name, 0.5));
    ASSERT_NE(comp, nullptr);
    EXPECT_EQ(comp->online_policy().kind, OnlinePolicy::Kind::kNone);
    AttentionStats stats(c, 12, 16);
    auto view = View(c, *comp, 12, 16, stats);
    auto next = comp->Update(c, view->prefix(), view->tail(), 16, nullptr);
    EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << name;
    EXPECT_THAT(std::string(next.status().message()), HasSubstr("no online rule"));
    EXPECT_FALSE(ShouldFold(comp->online_policy(), *view));
  }
}

TEST(OnlineRuleTest, CompositeKeepsNewTokensOfAOnceDropperAndQuantisesThem) {
  const ModelConfig c = TinyConfig();
  CompressorOptions o = Opts("snapkv+int8", 0.5, 8);
  o.window = 3;
  auto comp = Make(o);
  ASSERT_NE(comp, nullptr);
  EXPECT_EQ(comp->online_policy().kind, OnlinePolicy::Kind::kPerGroup);
  AttentionStats stats(c, 12, 3);
  auto view = View(c, *comp, 12, 16, stats);
  const std::vector<int32_t> old = view->prefix().layer(0).heads[0].positions;
  auto next = comp->Update(c, view->prefix(), view->tail(), 16, nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  std::vector<int32_t> expected = old;
  for (int32_t p = 12; p < 16; ++p) expected.push_back(p);
  const auto& head = (*next)->layer(0).heads[0];
  EXPECT_EQ(head.positions, expected);
  // Old rows keep their codes; new rows are quantised too.
  for (size_t i = 0; i < old.size(); ++i) {
    EXPECT_EQ(Row(*head.values, i), Row(*view->prefix().layer(0).heads[0].values, i));
  }
  EXPECT_EQ(head.keys->RowIfF32(expected.size() - 1), nullptr);
}

TEST(OnlineRuleTest, CompositeDropsThenQuantisesKeepingSurvivorsCodes) {
  const ModelConfig c = TinyConfig();
  CompressorOptions o = Opts("streamingllm+int8", 0.5, 8);
  o.sink_tokens = 2;
  auto comp = Make(o);
  ASSERT_NE(comp, nullptr);
  EXPECT_EQ(comp->online_policy().kind, OnlinePolicy::Kind::kEveryToken);
  AttentionStats stats(c, 0, 0);
  auto view = View(c, *comp, 12, 16, stats);
  const auto& before = view->prefix().layer(1).heads[1];
  ASSERT_THAT(before.positions, ElementsAre(0, 1, 9, 10, 11));
  auto next = comp->Update(c, view->prefix(), view->tail(), 16, nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  const auto& after = (*next)->layer(1).heads[1];
  EXPECT_THAT(after.positions, ElementsAre(0, 1, 11, 12, 13, 14, 15));
  EXPECT_EQ(Row(*after.keys, 0), Row(*before.keys, 0));
  EXPECT_EQ(Row(*after.keys, 2), Row(*before.keys, 4));  // position 11
  for (int i = 0; i < 7; ++i) EXPECT_EQ(after.keys->RowIfF32(i), nullptr);
}

TEST(OnlineRuleTest, EveryMethodListsItsRule) {
  for (const CompressorInfo& info : ListCompressors()) {
    SCOPED_TRACE(info.name);
    EXPECT_FALSE(info.online_rule.empty());
    const bool drops_online = info.name.starts_with("streamingllm") ||
                              info.name.starts_with("h2o") || info.name.starts_with("tova");
    const bool quantises = info.family != "token-dropping";
    EXPECT_EQ(info.online, drops_online ? OnlinePolicy::Kind::kEveryToken
                           : quantises  ? OnlinePolicy::Kind::kPerGroup
                                        : OnlinePolicy::Kind::kNone);
  }
  EXPECT_STREQ(OnlinePolicyKindName(OnlinePolicy::Kind::kPerGroup), "per-group");
}

// ------------------------------------------------------------ FoldIntoView

TEST(FoldIntoViewTest, OnlySettledTokensFold) {
  const ModelConfig c = TinyConfig();
  auto comp = Make(Opts("streamingllm", 0.5));
  ASSERT_NE(comp, nullptr);
  AttentionStats stats(c, 0, 0);
  auto view = View(c, *comp, 12, 20, stats);
  ASSERT_TRUE(view->Settle(16).ok());  // 16..19: drafts not yet verified
  absl::Status s = FoldIntoView(*comp, c, 18, nullptr, view.get(), nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("beyond the settled length 16"));
  EXPECT_EQ(view->prefix().prefix_len(), 12);  // unchanged
  // A rollback lowers the settled length.
  view->Truncate(14);
  EXPECT_EQ(view->settled_length(), 14);
  s = FoldIntoView(*comp, c, 15, nullptr, view.get(), nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  s = FoldIntoView(*comp, c, 11, nullptr, view.get(), nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("below the compressed prefix length 12"));
  EXPECT_EQ(view->Settle(15).code(), absl::StatusCode::kInvalidArgument);
  // Update on its own rejects a fold past the tail.
  EXPECT_EQ(comp->Update(c, view->prefix(), view->tail(), 15, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FoldIntoViewTest, RebasesTheTailAndMovesTheArenaCharge) {
  const ModelConfig c = TinyConfig();
  auto comp = Make(Opts("streamingllm", 0.5));
  ASSERT_NE(comp, nullptr);
  KvArena arena("device", 0);
  AttentionStats stats(c, 0, 0);
  auto view = View(c, *comp, 12, 40, stats, &arena);
  KvArena::Reservation prefix_charge = std::move(arena.Reserve(view->prefix().bytes())).value();
  ASSERT_TRUE(view->Settle(37).ok());
  ASSERT_TRUE(ShouldFold(comp->online_policy(), *view));
  ASSERT_TRUE(FoldIntoView(*comp, c, 37, nullptr, view.get(), &arena, &prefix_charge).ok());
  EXPECT_EQ(view->prefix().prefix_len(), 37);
  EXPECT_EQ(view->tail().first_position(), 37);
  EXPECT_EQ(view->next_position(), 40);
  EXPECT_EQ(view->settled_length(), 37);
  EXPECT_FALSE(ShouldFold(comp->online_policy(), *view));
  EXPECT_EQ(view->tail().bytes(), 3 * c.kv_bytes_per_token());
  EXPECT_EQ(prefix_charge.bytes(), view->prefix().bytes());
  // The arena holds the new prefix plus one 16-token block of the tail.
  EXPECT_EQ(arena.in_use(), view->prefix().bytes() + 16 * c.kv_bytes_per_token());
  // Tail rows kept their values.
  for (int32_t p = 37; p < 40; ++p) EXPECT_EQ(view->tail().KeyAt(1, 1, p)[2], KeyOf(1, 1, p, 2));
}

}  // namespace
}  // namespace vc
