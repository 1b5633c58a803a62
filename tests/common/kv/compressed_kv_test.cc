#include "common/kv/compressed_kv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/base/thread_pool.h"
#include "common/engine/kv_cache.h"
#include "common/kv/kv_arena.h"
#include "common/kv/row_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "tests/small_model_config.h"

namespace vc {
namespace {

using ::testing::HasSubstr;
using Kind = RowCodecSpec::Kind;
using Kept = std::vector<std::vector<std::vector<int32_t>>>;

constexpr int32_t kPrefix = 20;
constexpr int32_t kTail = 6;

ModelConfig Config() {
  return test_support::SmallModelConfig({.vocab_size = 32, .max_seq_len = 64, .hidden_dim = 64});
}

// Writes random K/V rows for positions [first, first + n) of `kv`.
void FillRandom(const ModelConfig& c, SequenceKv& kv, int32_t first, int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int32_t p = first; p < first + n; ++p) {
      for (float& x : k) x = u(rng);
      for (float& x : v) x = u(rng);
      kv.Write(l, p, k.data(), v.data());
    }
  }
}

// Different kept sets per head, the same count per head within a layer.
Kept SomeKept() {
  return {{{0, 3, 4, 7, 11, 12, 18, 19}, {1, 2, 5, 8, 9, 13, 15, 19}},
          {{0, 1, 2, 17, 19}, {4, 10, 16, 18, 19}}};
}

Kept AllKept(const ModelConfig& c) {
  std::vector<int32_t> all(kPrefix);
  for (int32_t i = 0; i < kPrefix; ++i) all[i] = i;
  return Kept(c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads, all));
}

struct Entry {
  int32_t pos;
  std::vector<float> k, v;
};

// The drafter's view of (layer, head) by brute force: the kept rows as the
// prefix decodes them, then the exact tail, in position order.
std::vector<Entry> Visible(const ModelConfig& c, const CompressedPrefix& prefix,
                           const PagedKvCache& tail, int l, int h) {
  std::vector<Entry> out;
  const CompressedPrefix::Head& head = prefix.layer(l).heads[h];
  for (size_t i = 0; i < head.positions.size(); ++i) {
    Entry e{head.positions[i], std::vector<float>(c.head_dim), std::vector<float>(c.head_dim)};
    head.keys->Decode(i, e.k.data());
    head.values->Decode(i, e.v.data());
    out.push_back(std::move(e));
  }
  for (int32_t p = tail.first_position(); p < tail.next_position(); ++p) {
    out.push_back({p, std::vector<float>(tail.KeyAt(l, h, p), tail.KeyAt(l, h, p) + c.head_dim),
                   std::vector<float>(tail.ValueAt(l, h, p), tail.ValueAt(l, h, p) + c.head_dim)});
  }
  return out;
}

void CheckAgainstBruteForce(const ModelConfig& c, const CompressedSequenceKv& kv,
                            const kernels::KernelBackend& backend) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int32_t end = kv.next_position();
  const std::vector<std::pair<int32_t, int32_t>> ranges = {{0, end - 1},
                                                           {0, kPrefix - 1},
                                                           {kPrefix, end - 1},
                                                           {5, kPrefix + 2},
                                                           {kPrefix + 3, kPrefix + 3},
                                                           {7, 3},
                                                           {-5, 2},
                                                           {19, 19},
                                                           {12, 1000},
                                                           {end, end + 5},
                                                           {3, 3}};
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const std::vector<Entry> all = Visible(c, kv.prefix(), kv.tail(), l, h);
      for (const auto& [lo, hi] : ranges) {
        SCOPED_TRACE(testing::Message()
                     << "layer " << l << " head " << h << " [" << lo << ", " << hi << "]");
        int64_t first = -1, count = 0;
        for (size_t i = 0; i < all.size(); ++i) {
          if (all[i].pos < lo || all[i].pos > hi) continue;
          if (first < 0) first = static_cast<int64_t>(i);
          EXPECT_EQ(static_cast<int64_t>(i), first + count) << "visible keys must be contiguous";
          ++count;
        }
        const SequenceKv::KeyRange range = kv.Keys(l, h, lo, hi);
        EXPECT_EQ(range.count, count);
        if (count == 0) continue;
        EXPECT_EQ(range.first, first);

        std::vector<float> q(c.head_dim), p(count), out(c.head_dim), want_out(c.head_dim);
        for (float& x : q) x = u(rng);
        for (float& x : p) x = u(rng);
        for (int d = 0; d < c.head_dim; ++d) out[d] = want_out[d] = 0.25f * d;  // accumulates
        const float scale = 0.35f;
        std::vector<float> scores(count);
        kv.Scores(backend, l, h, range, q.data(), scale, scores.data());
        kv.MixValues(backend, l, h, range, p.data(), out.data());
        std::vector<double> mix(c.head_dim);
        for (int d = 0; d < c.head_dim; ++d) mix[d] = want_out[d];
        for (int64_t j = 0; j < count; ++j) {
          const Entry& e = all[first + j];
          double dot = 0;
          for (int d = 0; d < c.head_dim; ++d) dot += double{q[d]} * e.k[d];
          EXPECT_NEAR(scores[j], dot * scale, 1e-5) << "key " << j;
          // Bit-exact against the canonical kernels over the same rows.
          EXPECT_EQ(scores[j], backend.Dot(q.data(), e.k.data(), c.head_dim) * scale);
          backend.AccumulateValues(&p[j], e.v.data(), 1, c.head_dim, want_out.data());
          for (int d = 0; d < c.head_dim; ++d) mix[d] += double{p[j]} * e.v[d];
        }
        for (int d = 0; d < c.head_dim; ++d) {
          EXPECT_NEAR(out[d], mix[d], 1e-4);
          EXPECT_EQ(out[d], want_out[d]);
        }
      }
    }
  }
}

class CompressedKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    full_ = std::make_unique<PagedKvCache>(config_, PagedKvCache::Options{.block_tokens = 4});
    ASSERT_TRUE(full_->Append(kPrefix).ok());
    FillRandom(config_, *full_, 0, kPrefix, 1);
    auto backend = kernels::CreateBackend({.name = "cpu", .threads = 1, .simd = "scalar"});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    // Every SIMD level this CPU has: the fused kernels run at the backend's.
    for (const char* simd : {"scalar", "avx2", "avx512"}) {
      if (!kernels::ParseSimdLevel(simd).ok()) continue;
      auto b = kernels::CreateBackend({.name = "cpu", .threads = 2, .simd = simd});
      ASSERT_TRUE(b.ok()) << b.status();
      levels_.push_back(std::move(*b));
    }
  }

  // The brute-force check on every level, fused and through the decode path.
  void CheckEveryLevel(CompressedSequenceKv& kv) {
    for (const auto& backend : levels_) {
      for (bool fused : {true, false}) {
        SCOPED_TRACE(backend->name() + (fused ? " fused" : " decoded"));
        kv.set_fused_attention(fused);
        CheckAgainstBruteForce(config_, kv, *backend);
      }
    }
    kv.set_fused_attention(true);
  }

  std::shared_ptr<const CompressedPrefix> MustBuild(const Kept& kept, const RowCodecSpec& k,
                                                    const RowCodecSpec& v) {
    auto p = CompressedPrefix::Build(config_, *full_, kPrefix, kept, k, v, "test");
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }

  ModelConfig config_ = Config();
  std::unique_ptr<PagedKvCache> full_;
  std::unique_ptr<kernels::KernelBackend> backend_;
  std::vector<std::unique_ptr<kernels::KernelBackend>> levels_;
};

TEST_F(CompressedKvTest, ViewMatchesBruteForceForEveryFormat) {
  const std::vector<std::pair<RowCodecSpec, RowCodecSpec>> formats = {
      {RowCodecSpec::F32(), RowCodecSpec::F32()},
      {{Kind::kPerChannelAsymmetric, 2, 3, 2}, {Kind::kPerTokenAsymmetric, 2, 4, 2}},
      {{Kind::kPerChannelAsymmetric, 4, 4, 0}, {Kind::kPerTokenAsymmetric, 4, 0, 0}},
      {{Kind::kPerTokenSymmetric, 8, 0, 0}, {Kind::kPerTokenSymmetric, 8, 0, 0}},
      // Residual f32 rows after the quantised ones, groups narrower than a row.
      {{Kind::kPerTokenSymmetric, 8, 3, 5}, {Kind::kPerTokenSymmetric, 4, 0, 5}},
      {{Kind::kPerChannelAsymmetric, 2, 4, 4}, {Kind::kPerTokenAsymmetric, 4, 3, 7}},
  };
  for (const Kept& kept : {SomeKept(), AllKept(config_)}) {
    for (const auto& [ks, vs] : formats) {
      SCOPED_TRACE(ks.DebugString() + " / " + vs.DebugString());
      auto prefix = MustBuild(kept, ks, vs);
      ASSERT_NE(prefix, nullptr);
      CompressedSequenceKv kv(config_, prefix);
      EXPECT_EQ(kv.next_position(), kPrefix);
      EXPECT_EQ(kv.Keys(0, 0, 0, 1000).count, static_cast<int64_t>(kept[0][0].size()));
      ASSERT_TRUE(kv.Append(kTail).ok());
      FillRandom(config_, kv, kPrefix, kTail, 2);
      CheckEveryLevel(kv);
      // Rolling back part of the tail (rejected drafts) shrinks the view.
      kv.Truncate(kPrefix + 2);
      EXPECT_EQ(kv.next_position(), kPrefix + 2);
      CheckEveryLevel(kv);
      kv.Truncate(kPrefix);
      CheckEveryLevel(kv);
    }
  }
}

// Built on a pool (the units in any order, on any thread) the prefix is the
// one built on the calling thread: the same positions, bytes and rows, bit
// for bit; and a unit whose format fails still fails the whole build.
TEST_F(CompressedKvTest, BuildingOnAPoolGivesTheSamePrefix) {
  ThreadPool pool(3);
  const RowCodecSpec int8{Kind::kPerTokenSymmetric, 8, 0, 0};
  const RowCodecSpec kivi{Kind::kPerChannelAsymmetric, 2, 4, 3};
  for (const Kept& kept : {SomeKept(), AllKept(config_)}) {
    auto serial = CompressedPrefix::Build(config_, *full_, kPrefix, kept, int8, kivi, "s");
    auto pooled = CompressedPrefix::Build(config_, *full_, kPrefix, kept, int8, kivi, "s", &pool);
    ASSERT_TRUE(serial.ok()) << serial.status();
    ASSERT_TRUE(pooled.ok()) << pooled.status();
    EXPECT_EQ((*pooled)->bytes(), (*serial)->bytes());
    std::vector<float> a(config_.head_dim), b(config_.head_dim);
    for (int l = 0; l < config_.n_layers; ++l) {
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        const auto& x = (*serial)->layer(l).heads[h];
        const auto& y = (*pooled)->layer(l).heads[h];
        ASSERT_EQ(x.positions, y.positions);
        for (int64_t i = 0; i < x.keys->rows(); ++i) {
          for (const auto& [sx, sy] :
               {std::pair{x.keys.get(), y.keys.get()}, std::pair{x.values.get(), y.values.get()}}) {
            sx->Decode(i, a.data());
            sy->Decode(i, b.data());
            ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
                << "layer " << l << " head " << h << " row " << i;
          }
        }
      }
    }
  }
  const RowCodecSpec bad{Kind::kPerTokenSymmetric, 3, 0, 0};  // 3-bit codes do not exist
  auto failed =
      CompressedPrefix::Build(config_, *full_, kPrefix, SomeKept(), int8, bad, "b", &pool);
  EXPECT_FALSE(failed.ok());
}

TEST_F(CompressedKvTest, F32RowsAreTheOriginalRows) {
  auto prefix = MustBuild(SomeKept(), RowCodecSpec::F32(), RowCodecSpec::F32());
  ASSERT_NE(prefix, nullptr);
  const CompressedPrefix::Head& head = prefix->layer(1).heads[1];
  for (size_t i = 0; i < head.positions.size(); ++i) {
    ASSERT_NE(head.keys->RowIfF32(i), nullptr);
    for (int d = 0; d < config_.head_dim; ++d) {
      EXPECT_EQ(head.keys->RowIfF32(i)[d], full_->KeyAt(1, 1, head.positions[i])[d]);
      EXPECT_EQ(head.values->RowIfF32(i)[d], full_->ValueAt(1, 1, head.positions[i])[d]);
    }
  }
}

TEST_F(CompressedKvTest, BytesAreExact) {
  const int64_t row = config_.head_dim * 4;
  // Dropped, f32: per head, K and V rows plus a 4-byte index per kept token.
  auto dropped = MustBuild(SomeKept(), RowCodecSpec::F32(), RowCodecSpec::F32());
  ASSERT_NE(dropped, nullptr);
  EXPECT_EQ(dropped->bytes(), 2 * (8 * (2 * row + 4)) + 2 * (5 * (2 * row + 4)));
  EXPECT_EQ(dropped->full_bytes(), kPrefix * config_.kv_bytes_per_token());
  EXPECT_EQ(dropped->ratio(),
            static_cast<double>(dropped->bytes()) / (kPrefix * config_.kv_bytes_per_token()));
  EXPECT_EQ(dropped->kept(0), 8);
  EXPECT_EQ(dropped->kept(1), 5);
  EXPECT_EQ(dropped->prefix_len(), kPrefix);
  EXPECT_EQ(dropped->description(), "test");
  // Everything kept: no index bytes; f32 gives ratio 1.
  auto all = MustBuild(AllKept(config_), RowCodecSpec::F32(), RowCodecSpec::F32());
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->bytes(), all->full_bytes());
  EXPECT_EQ(all->ratio(), 1.0);
  // Quantised: the sum of the row stores' bytes (plus indices when dropped).
  const RowCodecSpec int8{Kind::kPerTokenSymmetric, 8, 0, 0};
  auto q = MustBuild(SomeKept(), int8, int8);
  ASSERT_NE(q, nullptr);
  // int8 row: head_dim code bytes + one scale.
  EXPECT_EQ(q->bytes(), 2 * (8 * (2 * (8 + 4) + 4)) + 2 * (5 * (2 * (8 + 4) + 4)));
  // The drafter view adds its exact tail.
  CompressedSequenceKv kv(config_, q);
  ASSERT_TRUE(kv.Append(3).ok());
  EXPECT_EQ(kv.bytes(), q->bytes() + 3 * config_.kv_bytes_per_token());
}

TEST_F(CompressedKvTest, TailCapacityFollowsMaxTokens) {
  auto prefix = MustBuild(SomeKept(), RowCodecSpec::F32(), RowCodecSpec::F32());
  ASSERT_NE(prefix, nullptr);
  CompressedSequenceKv kv(config_, prefix, kPrefix + 4);
  EXPECT_TRUE(kv.Append(4).ok());
  EXPECT_EQ(kv.Append(1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.next_position(), kPrefix + 4);
}

// Online compression's swap: a prefix over [0, kPrefix + 4) built from the
// same rows replaces the old one; the tail keeps only the rows after it, the
// view reads exactly the new prefix then the remaining tail, and the arena
// is charged for the smaller tail.
TEST_F(CompressedKvTest, RebaseDropsFoldedTailRowsAndKeepsTheRest) {
  auto prefix = MustBuild(SomeKept(), RowCodecSpec::F32(), RowCodecSpec::F32());
  ASSERT_NE(prefix, nullptr);
  KvArena arena("device", 0);
  CompressedSequenceKv kv(config_, prefix, 0, &arena);
  ASSERT_TRUE(kv.Append(kTail + 14).ok());  // 20 rows: two 16-token blocks
  FillRandom(config_, kv, kPrefix, kTail + 14, 5);
  EXPECT_EQ(kv.settled_length(), kPrefix);
  // The longer full sequence, for building the next prefix.
  const int32_t fold = kPrefix + 17;
  PagedKvCache longer(config_);
  ASSERT_TRUE(longer.Append(fold).ok());
  std::vector<float> k(config_.kv_dim()), v(config_.kv_dim());
  for (int l = 0; l < config_.n_layers; ++l) {
    for (int32_t p = 0; p < fold; ++p) {
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        const PagedKvCache& src = p < kPrefix ? *full_ : kv.tail();
        std::copy_n(src.KeyAt(l, h, p), config_.head_dim, &k[h * config_.head_dim]);
        std::copy_n(src.ValueAt(l, h, p), config_.head_dim, &v[h * config_.head_dim]);
      }
      longer.Write(l, p, k.data(), v.data());
    }
  }
  Kept kept = SomeKept();
  for (auto& layer : kept) {
    for (auto& head : layer) head.push_back(fold - 1);
  }
  auto next = CompressedPrefix::Build(config_, longer, fold, kept, RowCodecSpec::F32(),
                                      RowCodecSpec::F32(), "next");
  ASSERT_TRUE(next.ok()) << next.status();
  // Not settled yet: refused, nothing changes.
  absl::Status s = kv.Rebase(*next);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("beyond the settled length 20"));
  EXPECT_EQ(kv.prefix().prefix_len(), kPrefix);
  ASSERT_TRUE(kv.Settle(fold + 1).ok());
  const float last_key = kv.tail().KeyAt(1, 1, kPrefix + 19)[3];
  const int64_t in_use_before = arena.in_use();
  ASSERT_TRUE(kv.Rebase(*next).ok());
  EXPECT_EQ(kv.prefix().prefix_len(), fold);
  EXPECT_EQ(kv.tail().first_position(), fold);
  EXPECT_EQ(kv.next_position(), kPrefix + 20);
  EXPECT_EQ(kv.tail().KeyAt(1, 1, kPrefix + 19)[3], last_key);
  EXPECT_EQ(kv.bytes(), (*next)->bytes() + 3 * config_.kv_bytes_per_token());
  EXPECT_LT(arena.in_use(), in_use_before);  // one block instead of two
  CheckAgainstBruteForce(config_, kv, *backend_);
  // Folding backwards is refused.
  EXPECT_EQ(kv.CheckFold(fold - 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CompressedKvTest, BuildRejectsBadInput) {
  auto expect_invalid = [&](const Kept& kept, int32_t prefix_len, const std::string& part) {
    auto p = CompressedPrefix::Build(config_, *full_, prefix_len, kept, RowCodecSpec::F32(),
                                     RowCodecSpec::F32(), "x");
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(part));
  };
  expect_invalid(SomeKept(), kPrefix + 1, "needs a full KV holding them");
  expect_invalid(SomeKept(), 0, "needs a full KV holding them");
  expect_invalid(Kept(1, SomeKept()[0]), kPrefix, "every layer");
  Kept k = SomeKept();
  k[1].pop_back();
  expect_invalid(k, kPrefix, "heads, model has 2");
  k = SomeKept();
  k[0][1].pop_back();
  expect_invalid(k, kPrefix, "the same count per head");
  k = SomeKept();
  std::swap(k[0][0][1], k[0][0][2]);
  expect_invalid(k, kPrefix, "increasing");
  k = SomeKept();
  k[1][0][4] = kPrefix;
  expect_invalid(k, kPrefix, "inside [0, 20)");
  k = SomeKept();
  k[1][0][0] = -1;
  expect_invalid(k, kPrefix, "increasing");
  auto bad_spec =
      CompressedPrefix::Build(config_, *full_, kPrefix, SomeKept(),
                              {Kind::kPerTokenAsymmetric, 3, 0, 0}, RowCodecSpec::F32(), "x");
  EXPECT_EQ(bad_spec.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vc
