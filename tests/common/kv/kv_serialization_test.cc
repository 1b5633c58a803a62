// Serialisation seams of the KV formats: RowStore::AppendSerialized /
// Deserialize (every kind, width, group and residual; bit-identical rows,
// equal bytes(), the stored size equal to the header plus bytes() (plus the
// full-precision rows' dtype word), rows rounded to bf16/f16 stored in that
// dtype, every truncation and malformed field rejected) and
// CompressedPrefix::FromParts (equal accounting to Build, every invariant of
// Build enforced).
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/kv/compressed_kv.h"
#include "common/kv/row_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/small_model_config.h"

namespace vc {
namespace {

using ::testing::HasSubstr;
using Kind = RowCodecSpec::Kind;

// Kind, bits, group, residual (u32 each), rows (u64), dim (u32).
constexpr size_t kStoreHeaderBytes = 28;

std::vector<float> RandomRows(int64_t n, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> rows(n * dim);
  for (int64_t i = 0; i < n * dim; ++i) rows[i] = (i % dim == 1 ? 25.0f : 1.0f) * u(rng);
  return rows;
}

std::vector<RowCodecSpec> AllSpecs() {
  std::vector<RowCodecSpec> specs = {RowCodecSpec::F32()};
  for (int bits : {2, 4, 8}) {
    for (int group : {0, 3, 4}) {
      for (int residual : {0, 5}) {
        specs.push_back({Kind::kPerTokenSymmetric, bits, group, residual});
        specs.push_back({Kind::kPerTokenAsymmetric, bits, group, residual});
        specs.push_back({Kind::kPerChannelAsymmetric, bits, group, residual});
      }
    }
  }
  return specs;
}

void ExpectSameStore(const RowStore& a, const RowStore& b, const std::string& what) {
  ASSERT_EQ(a.rows(), b.rows()) << what;
  ASSERT_EQ(a.dim(), b.dim()) << what;
  EXPECT_EQ(a.bytes(), b.bytes()) << what;
  std::vector<float> ra(a.dim()), rb(b.dim());
  for (int64_t i = 0; i < a.rows(); ++i) {
    a.Decode(i, ra.data());
    b.Decode(i, rb.data());
    EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0)
        << what << " row " << i;
    ASSERT_EQ(a.RowIfF32(i) == nullptr, b.RowIfF32(i) == nullptr) << what << " row " << i;
    if (a.RowIfF32(i) != nullptr) {
      EXPECT_EQ(std::memcmp(a.RowIfF32(i), b.RowIfF32(i), a.dim() * sizeof(float)), 0) << what;
    }
  }
}

TEST(RowStoreSerializationTest, EveryFormatRoundTripsBitExactly) {
  int checked = 0;
  for (const RowCodecSpec& spec : AllSpecs()) {
    for (const int dim : {6, 8}) {
      for (const int64_t n : {0, 1, 7, 23}) {
        const std::string what =
            spec.DebugString() + " dim " + std::to_string(dim) + " n " + std::to_string(n);
        const std::vector<float> rows = RandomRows(n, dim, static_cast<uint32_t>(n * 31 + dim));
        auto store = RowStore::Encode(spec, rows.data(), n, dim);
        if (!store.ok()) continue;  // e.g. a channel group wider than dim
        ++checked;
        // Two stores back to back after some leading bytes: offsets advance exactly.
        std::string bytes = "lead";
        (*store)->AppendSerialized(&bytes);
        const size_t first_end = bytes.size();
        // The stored form is the header, the full-precision rows' dtype word
        // and exactly the bytes the store accounts (random rows stay f32).
        EXPECT_EQ(first_end - 4, kStoreHeaderBytes + 4 + static_cast<size_t>((*store)->bytes()))
            << what;
        (*store)->AppendSerialized(&bytes);
        size_t off = 4;
        auto a = RowStore::Deserialize(bytes, &off);
        ASSERT_TRUE(a.ok()) << what << ": " << a.status();
        EXPECT_EQ(off, first_end) << what;
        auto b = RowStore::Deserialize(bytes, &off);
        ASSERT_TRUE(b.ok()) << what << ": " << b.status();
        EXPECT_EQ(off, bytes.size()) << what;
        ExpectSameStore(**store, **a, what);
        ExpectSameStore(**store, **b, what);
        // Serialising the copy gives the same bytes.
        std::string again = "lead";
        (*a)->AppendSerialized(&again);
        EXPECT_EQ(again, bytes.substr(0, first_end)) << what;
      }
    }
  }
  EXPECT_GT(checked, 200);
}

TEST(RowStoreSerializationTest, EveryTruncationIsRejected) {
  for (const RowCodecSpec& spec :
       {RowCodecSpec::F32(), RowCodecSpec{Kind::kPerChannelAsymmetric, 2, 4, 3},
        RowCodecSpec{Kind::kPerTokenAsymmetric, 4, 4, 2},
        RowCodecSpec{Kind::kPerTokenSymmetric, 8, 0, 0}}) {
    const std::vector<float> rows = RandomRows(11, 8, 3);
    auto store = RowStore::Encode(spec, rows.data(), 11, 8);
    ASSERT_TRUE(store.ok());
    std::string bytes;
    (*store)->AppendSerialized(&bytes);
    for (size_t len = 0; len < bytes.size(); ++len) {
      size_t off = 0;
      const auto r = RowStore::Deserialize(std::string_view(bytes).substr(0, len), &off);
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
          << spec.DebugString() << " length " << len;
      EXPECT_EQ(off, 0u) << "offset moved on failure";
    }
  }
}

std::string PutU32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

std::string Header(uint32_t kind, uint32_t bits, uint32_t group, uint32_t residual, uint64_t rows,
                   uint32_t dim) {
  std::string s = PutU32(kind) + PutU32(bits) + PutU32(group) + PutU32(residual);
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(rows >> (8 * i)));
  return s + PutU32(dim);
}

// Rows already rounded to bf16 or f16 (a bf16/f16 model's K/V) are written
// as 2-byte values with their dtype, in f32 stores and in a quantised
// store's residual rows alike, and read back bit for bit; rows that are not
// exact in a narrower dtype stay f32. The dtype word is checked: unknown
// dtypes and encodings that are not the canonical (narrowest exact) one are
// refused, so every accepted store re-encodes to the same bytes.
TEST(RowStoreSerializationTest, RowsRoundedToADtypeTravelInIt) {
  constexpr int kDim = 8;
  constexpr int64_t kRows = 11;
  for (const Dtype dtype : {Dtype::kF32, Dtype::kBf16, Dtype::kF16}) {
    std::vector<float> rows = RandomRows(kRows, kDim, 17);
    for (float& x : rows) x = RoundToDtype(x, dtype);
    for (const RowCodecSpec& spec :
         {RowCodecSpec::F32(), RowCodecSpec{Kind::kPerTokenSymmetric, 8, 0, 4},
          RowCodecSpec{Kind::kPerChannelAsymmetric, 2, 4, 3}}) {
      const std::string what = spec.DebugString() + " " + DtypeName(dtype);
      auto store = RowStore::Encode(spec, rows.data(), kRows, kDim);
      ASSERT_TRUE(store.ok()) << what;
      std::string bytes;
      (*store)->AppendSerialized(&bytes);
      // The full-precision rows end the store: dtype word, then the values.
      int64_t full_rows = 0;
      while (full_rows < kRows && (*store)->RowIfF32(kRows - 1 - full_rows) != nullptr) ++full_rows;
      ASSERT_GT(full_rows, 0) << what;
      const size_t values_bytes = static_cast<size_t>(full_rows * kDim * DtypeBytes(dtype));
      ASSERT_GT(bytes.size(), values_bytes + 4);
      uint32_t word;
      std::memcpy(&word, bytes.data() + bytes.size() - values_bytes - 4, 4);
      EXPECT_EQ(word, static_cast<uint32_t>(dtype)) << what;
      const int64_t f32_size =
          static_cast<int64_t>(bytes.size() - values_bytes) + full_rows * kDim * 4;
      EXPECT_EQ(static_cast<int64_t>(bytes.size()),
                f32_size - (dtype == Dtype::kF32 ? 0 : full_rows * kDim * 2))
          << what;
      size_t off = 0;
      auto back = RowStore::Deserialize(bytes, &off);
      ASSERT_TRUE(back.ok()) << what << ": " << back.status();
      EXPECT_EQ(off, bytes.size()) << what;
      ExpectSameStore(**store, **back, what);
      std::string again;
      (*back)->AppendSerialized(&again);
      EXPECT_EQ(again, bytes) << what;

      // Every truncation is refused.
      for (size_t len = 0; len < bytes.size(); ++len) {
        size_t o = 0;
        EXPECT_EQ(RowStore::Deserialize(std::string_view(bytes).substr(0, len), &o).status().code(),
                  absl::StatusCode::kInvalidArgument)
            << what << " length " << len;
      }
      // An unknown dtype word.
      const size_t word_at = bytes.size() - values_bytes - 4;
      std::string bad = bytes;
      bad[word_at] = 3;
      off = 0;
      auto r = RowStore::Deserialize(bad, &off);
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << what;
      EXPECT_THAT(std::string(r.status().message()), HasSubstr("unknown rows dtype 3")) << what;
      if (dtype == Dtype::kBf16) {
        // bf16 values sent as f32 (wider than they need): not canonical.
        std::string wide = bytes.substr(0, word_at);
        const uint32_t f32_word = 0;
        wide.append(reinterpret_cast<const char*>(&f32_word), 4);
        const std::vector<float> tail(rows.end() - full_rows * kDim, rows.end());
        wide.append(reinterpret_cast<const char*>(tail.data()), tail.size() * sizeof(float));
        off = 0;
        r = RowStore::Deserialize(wide, &off);
        EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << what;
        EXPECT_THAT(std::string(r.status().message()), HasSubstr("non-canonical")) << what;
      }
    }
  }
}

TEST(RowStoreSerializationTest, MalformedHeadersAreRejectedWithoutAllocating) {
  const std::string payload(4096, '\0');
  struct Case {
    std::string header;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Header(4, 4, 0, 0, 1, 8), "unknown kind"},
      {Header(1, 3, 0, 0, 1, 8), "bits"},
      {Header(1, 8, 9, 0, 1, 8), "channel group"},
      {Header(0, 32, 0, 1, 1, 8), "f32"},
      {Header(0, 32, 0, 0, 1, 0), "bad shape"},
      {Header(0, 32, 0, 0, uint64_t{1} << 40, 8), "bad shape"},
      {Header(3, 2, 0xffffffffu, 0, 1, 8), "out of range"},
      // A plausible header whose payload would be ~8 GiB: refused by size.
      {Header(0, 32, 0, 0, (uint64_t{1} << 31) - 1, 1024), "need more"},
      {Header(2, 8, 0, 0, (uint64_t{1} << 31) - 1, 1 << 20), "needs"},
  };
  for (const Case& c : cases) {
    const std::string bytes = c.header + payload;
    size_t off = 0;
    const auto r = RowStore::Deserialize(bytes, &off);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  // An offset past the end is a truncated header, not a crash.
  size_t off = 100;
  EXPECT_EQ(RowStore::Deserialize("abc", &off).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- CompressedPrefix::FromParts ----

constexpr int32_t kPrefix = 20;

ModelConfig Config() {
  return test_support::SmallModelConfig({.vocab_size = 32, .max_seq_len = 64, .hidden_dim = 64});
}

std::unique_ptr<PagedKvCache> RandomCache(const ModelConfig& c) {
  auto cache = std::make_unique<PagedKvCache>(c);
  PagedKvCache& kv = *cache;
  EXPECT_TRUE(kv.Append(kPrefix).ok());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int32_t p = 0; p < kPrefix; ++p) {
      for (float& x : k) x = u(rng);
      for (float& x : v) x = u(rng);
      kv.Write(l, p, k.data(), v.data());
    }
  }
  return cache;
}

std::unique_ptr<RowStore> Copy(const RowStore& s) {
  std::string bytes;
  s.AppendSerialized(&bytes);
  size_t off = 0;
  return std::move(RowStore::Deserialize(bytes, &off)).value();
}

std::vector<CompressedPrefix::Layer> PartsOf(const CompressedPrefix& p) {
  std::vector<CompressedPrefix::Layer> layers(p.n_layers());
  for (int l = 0; l < p.n_layers(); ++l) {
    for (const CompressedPrefix::Head& h : p.layer(l).heads) {
      CompressedPrefix::Head copy;
      copy.positions = h.positions;
      copy.keys = Copy(*h.keys);
      copy.values = Copy(*h.values);
      layers[l].heads.push_back(std::move(copy));
    }
  }
  return layers;
}

TEST(CompressedPrefixFromPartsTest, RebuildsWithBuildsAccounting) {
  const ModelConfig c = Config();
  const std::unique_ptr<PagedKvCache> full_ptr = RandomCache(c);
  const PagedKvCache& full = *full_ptr;
  using Kept = std::vector<std::vector<std::vector<int32_t>>>;
  std::vector<int32_t> all(kPrefix);
  for (int32_t i = 0; i < kPrefix; ++i) all[i] = i;
  const Kept dropped = {{{0, 3, 4, 7, 11, 12, 18, 19}, {1, 2, 5, 8, 9, 13, 15, 19}},
                        {{0, 1, 2, 17, 19}, {4, 10, 16, 18, 19}}};
  const Kept kept_all(c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads, all));
  for (const Kept* kept : {&dropped, &kept_all}) {
    for (const RowCodecSpec& spec :
         {RowCodecSpec::F32(), RowCodecSpec{Kind::kPerChannelAsymmetric, 2, 4, 3}}) {
      auto built = CompressedPrefix::Build(c, full, kPrefix, *kept, spec,
                                           RowCodecSpec{Kind::kPerTokenSymmetric, 8, 0, 0}, "desc");
      ASSERT_TRUE(built.ok()) << built.status();
      auto rebuilt = CompressedPrefix::FromParts(c, kPrefix, PartsOf(**built), "desc");
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
      EXPECT_EQ((*rebuilt)->bytes(), (*built)->bytes());
      EXPECT_EQ((*rebuilt)->full_bytes(), (*built)->full_bytes());
      EXPECT_EQ((*rebuilt)->ratio(), (*built)->ratio());
      EXPECT_EQ((*rebuilt)->prefix_len(), kPrefix);
      EXPECT_EQ((*rebuilt)->description(), "desc");
      for (int l = 0; l < c.n_layers; ++l) {
        EXPECT_EQ((*rebuilt)->kept(l), (*built)->kept(l));
        for (int h = 0; h < c.n_kv_heads; ++h) {
          EXPECT_EQ((*rebuilt)->layer(l).heads[h].positions, (*built)->layer(l).heads[h].positions);
          ExpectSameStore(*(*built)->layer(l).heads[h].keys, *(*rebuilt)->layer(l).heads[h].keys,
                          "k");
          ExpectSameStore(*(*built)->layer(l).heads[h].values,
                          *(*rebuilt)->layer(l).heads[h].values, "v");
        }
      }
    }
  }
}

TEST(CompressedPrefixFromPartsTest, EnforcesBuildsInvariants) {
  const ModelConfig c = Config();
  const std::unique_ptr<PagedKvCache> full_ptr = RandomCache(c);
  const PagedKvCache& full = *full_ptr;
  const std::vector<std::vector<std::vector<int32_t>>> kept = {{{0, 3, 4, 19}, {1, 2, 5, 19}},
                                                               {{0, 1, 2, 19}, {4, 10, 16, 19}}};
  auto built = CompressedPrefix::Build(c, full, kPrefix, kept, RowCodecSpec::F32(),
                                       RowCodecSpec::F32(), "d");
  ASSERT_TRUE(built.ok());
  auto expect_bad = [&](std::vector<CompressedPrefix::Layer> parts, int32_t prefix_len,
                        const std::string& message, const ModelConfig& config) {
    const auto r = CompressedPrefix::FromParts(config, prefix_len, std::move(parts), "d");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(message));
  };
  ASSERT_TRUE(CompressedPrefix::FromParts(c, kPrefix, PartsOf(**built), "d").ok());
  expect_bad(PartsOf(**built), 0, ">= 1 token", c);
  {
    auto p = PartsOf(**built);
    p.pop_back();
    expect_bad(std::move(p), kPrefix, "1 layers, model has 2", c);
  }
  {
    auto p = PartsOf(**built);
    p[1].heads.pop_back();
    expect_bad(std::move(p), kPrefix, "layer 1: 1 KV heads", c);
  }
  {
    auto p = PartsOf(**built);
    p[0].heads[1].positions.pop_back();
    expect_bad(std::move(p), kPrefix, "different counts", c);
  }
  {
    auto p = PartsOf(**built);
    p[0].heads[0].positions = {0, 4, 3, 19};
    expect_bad(std::move(p), kPrefix, "increasing", c);
  }
  // Position 19 is outside a 19-token prefix.
  expect_bad(PartsOf(**built), 19, "inside [0, 19)", c);
  {
    auto p = PartsOf(**built);
    p[1].heads[0].values.reset();
    expect_bad(std::move(p), kPrefix, "missing", c);
  }
  {
    auto p = PartsOf(**built);
    const std::vector<float> rows = RandomRows(3, 8, 1);
    p[1].heads[1].keys =
        std::move(RowStore::Encode(RowCodecSpec::F32(), rows.data(), 3, 8)).value();
    expect_bad(std::move(p), kPrefix, "must be 4 x 8", c);
  }
  ModelConfig wider = c;
  wider.head_dim = 16;
  expect_bad(PartsOf(**built), kPrefix, "must be 4 x 16", wider);
}

}  // namespace
}  // namespace vc
