#include "common/kv/row_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/kv/internal/int8_encoder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vc {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Kind = RowCodecSpec::Kind;

std::unique_ptr<RowStore> MustEncode(const RowCodecSpec& spec, const std::vector<float>& rows,
                                     int dim) {
  auto s = RowStore::Encode(spec, rows.data(), static_cast<int64_t>(rows.size()) / dim, dim);
  EXPECT_TRUE(s.ok()) << s.status() << " " << spec.DebugString();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<float> Row(const RowStore& store, int64_t i) {
  std::vector<float> out(store.dim());
  store.Decode(i, out.data());
  return out;
}

std::vector<float> RandomRows(int64_t n, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> rows(n * dim);
  for (int64_t i = 0; i < n; ++i) {
    for (int c = 0; c < dim; ++c) {
      // Channel 1 is an outlier channel (as keys have), row 2 a constant row.
      rows[i * dim + c] = i == 2 ? 0.75f : (c == 1 ? 10.0f : 1.0f) * u(rng);
    }
  }
  return rows;
}

// The reference model of a spec: which rows are quantised, each element's
// step (scale), and the exact byte count, all from the format's definition.
struct Reference {
  int64_t n_quant = 0;
  std::vector<float> scale;  // per element of the quantised rows
  std::vector<float> span;   // |lo| + |hi| of each element's group (float error scale)
  int64_t bytes = 0;
};

Reference Model(const RowCodecSpec& spec, const std::vector<float>& rows, int64_t n, int dim) {
  Reference r;
  if (spec.kind == Kind::kF32) {
    r.bytes = n * dim * 4;
    return r;
  }
  const int64_t max_code = (int64_t{1} << spec.bits) - 1;
  const int64_t half = (int64_t{1} << (spec.bits - 1)) - 1;
  int64_t params = 0;  // scales + zero points
  if (spec.kind == Kind::kPerChannelAsymmetric) {
    const int group = spec.group > 0 ? spec.group : 1;
    r.n_quant = std::max<int64_t>(0, n - spec.residual);
    r.n_quant -= r.n_quant % group;
    r.scale.resize(r.n_quant * dim);
    r.span.resize(r.n_quant * dim);
    for (int64_t g = 0; g < r.n_quant / group; ++g) {
      for (int c = 0; c < dim; ++c) {
        float lo = rows[g * group * dim + c], hi = lo;
        for (int k = 0; k < group; ++k) {
          lo = std::min(lo, rows[(g * group + k) * dim + c]);
          hi = std::max(hi, rows[(g * group + k) * dim + c]);
        }
        for (int k = 0; k < group; ++k) {
          r.scale[(g * group + k) * dim + c] = (hi - lo) / max_code;
          r.span[(g * group + k) * dim + c] = std::fabs(lo) + std::fabs(hi);
        }
        params += 2;
      }
    }
  } else {
    const int group = spec.group > 0 ? spec.group : dim;
    r.n_quant = std::max<int64_t>(0, n - spec.residual);
    r.scale.resize(r.n_quant * dim);
    r.span.resize(r.n_quant * dim);
    for (int64_t i = 0; i < r.n_quant; ++i) {
      for (int c0 = 0; c0 < dim; c0 += group) {
        const int c1 = std::min(dim, c0 + group);
        float lo = rows[i * dim + c0], hi = lo, amax = 0.0f;
        for (int c = c0; c < c1; ++c) {
          lo = std::min(lo, rows[i * dim + c]);
          hi = std::max(hi, rows[i * dim + c]);
          amax = std::max(amax, std::fabs(rows[i * dim + c]));
        }
        const bool sym = spec.kind == Kind::kPerTokenSymmetric;
        for (int c = c0; c < c1; ++c) {
          r.scale[i * dim + c] = sym ? amax / half : (hi - lo) / max_code;
          r.span[i * dim + c] = std::fabs(lo) + std::fabs(hi);
        }
        params += sym ? 1 : 2;
      }
    }
  }
  r.bytes = (r.n_quant * dim * spec.bits + 7) / 8 + params * 4 + (n - r.n_quant) * dim * 4;
  return r;
}

// Every element of a quantised row is within half a step of its input (plus
// float rounding of the affine maps); every other row is stored exactly.
void CheckStore(const RowCodecSpec& spec, const std::vector<float>& rows, int dim) {
  SCOPED_TRACE(spec.DebugString());
  const int64_t n = static_cast<int64_t>(rows.size()) / dim;
  auto store = MustEncode(spec, rows, dim);
  ASSERT_NE(store, nullptr);
  const Reference ref = Model(spec, rows, n, dim);
  EXPECT_EQ(store->rows(), n);
  EXPECT_EQ(store->dim(), dim);
  EXPECT_EQ(store->bytes(), ref.bytes);
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float> out = Row(*store, i);
    EXPECT_EQ(out, Row(*store, i));  // deterministic
    if (i >= ref.n_quant) {
      ASSERT_NE(store->RowIfF32(i), nullptr) << "row " << i;
      EXPECT_THAT(out, ElementsAreArray(&rows[i * dim], dim)) << "row " << i;
      EXPECT_EQ(store->RowIfF32(i)[0], rows[i * dim]);
      continue;
    }
    EXPECT_EQ(store->RowIfF32(i), nullptr) << "row " << i;
    for (int c = 0; c < dim; ++c) {
      const float x = rows[i * dim + c];
      const float bound = ref.scale[i * dim + c] / 2 + 1e-6f * (1.0f + ref.span[i * dim + c]);
      EXPECT_LE(std::fabs(out[c] - x), bound) << "row " << i << " channel " << c;
    }
  }
}

TEST(RowCodecTest, RoundTripsEveryKindAndWidth) {
  const int dim = 8;
  const std::vector<float> rows = RandomRows(13, dim, 7);
  for (const int bits : {2, 4, 8}) {
    for (const int residual : {0, 2, 5, 20}) {
      for (const int group : {0, 3, 8}) {
        CheckStore({Kind::kPerTokenSymmetric, bits, group, residual}, rows, dim);
        CheckStore({Kind::kPerTokenAsymmetric, bits, group, residual}, rows, dim);
      }
      for (const int group : {1, 2, 4, 5, 13, 32}) {
        CheckStore({Kind::kPerChannelAsymmetric, bits, group, residual}, rows, dim);
      }
    }
  }
  CheckStore(RowCodecSpec::F32(), rows, dim);
}

// A plain decoder of the serialised form (row_codec.h: header, packed codes
// LSB first, scales, zero points, the residual rows as a u32 dtype and
// values in it), written from the format alone: Decode, whatever its fast
// paths, must give exactly these values.
std::vector<float> ReferenceDecode(const RowStore& store) {
  std::string bytes;
  store.AppendSerialized(&bytes);
  size_t at = 0;
  auto u32 = [&] {
    uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  };
  const auto kind = static_cast<Kind>(u32());
  const int bits = static_cast<int>(u32());
  int group = static_cast<int>(u32());
  const int residual = static_cast<int>(u32());
  uint64_t n64;
  std::memcpy(&n64, bytes.data() + at, 8);
  at += 8;
  const int64_t n = static_cast<int64_t>(n64);
  const int dim = static_cast<int>(u32());
  std::vector<float> out(static_cast<size_t>(n * dim));
  auto floats = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    if (count > 0) {  // an empty vector's data() may be null
      std::memcpy(v.data(), bytes.data() + at, static_cast<size_t>(count) * sizeof(float));
    }
    at += static_cast<size_t>(count) * sizeof(float);
    return v;
  };
  // Full-precision rows: u32 dtype (0 f32, 1 bf16, 2 f16), then the values.
  auto rows = [&](int64_t count) {
    const uint32_t dtype = u32();
    if (dtype == 0) return floats(count);
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + at, 2);
      at += 2;
      v[static_cast<size_t>(k)] = WidenBits(h, dtype == 1 ? Dtype::kBf16 : Dtype::kF16);
    }
    return v;
  };
  if (kind == Kind::kF32) return rows(n * dim);
  if (group == 0) group = kind == Kind::kPerChannelAsymmetric ? 1 : dim;
  int64_t n_quant = std::max<int64_t>(0, n - residual);
  if (kind == Kind::kPerChannelAsymmetric) n_quant -= n_quant % group;
  const size_t code_bytes = static_cast<size_t>((n_quant * dim * bits + 7) / 8);
  const std::string codes = bytes.substr(at, code_bytes);
  at += code_bytes;
  auto code = [&](int64_t k) {
    const int64_t bit = k * bits;
    return (static_cast<uint8_t>(codes[static_cast<size_t>(bit / 8)]) >> (bit % 8)) &
           ((1 << bits) - 1);
  };
  const int64_t groups_per_row = (dim + group - 1) / group;
  const int64_t n_scales = kind == Kind::kPerChannelAsymmetric ? (n_quant / group) * dim
                                                               : n_quant * groups_per_row;
  const std::vector<float> scale = floats(n_scales);
  const std::vector<float> zero = floats(kind == Kind::kPerTokenSymmetric ? 0 : n_scales);
  const std::vector<float> rest = rows((n - n_quant) * dim);
  const int half = (1 << (bits - 1)) - 1;
  for (int64_t i = 0; i < n; ++i) {
    for (int c = 0; c < dim; ++c) {
      float& o = out[static_cast<size_t>(i * dim + c)];
      if (i >= n_quant) {
        o = rest[static_cast<size_t>((i - n_quant) * dim + c)];
      } else if (kind == Kind::kPerChannelAsymmetric) {
        const size_t g = static_cast<size_t>((i / group) * dim + c);
        o = static_cast<float>(code(i * dim + c)) * scale[g] + zero[g];
      } else {
        const size_t g = static_cast<size_t>(i * groups_per_row + c / group);
        o = kind == Kind::kPerTokenSymmetric
                ? static_cast<float>(code(i * dim + c) - half) * scale[g]
                : static_cast<float>(code(i * dim + c)) * scale[g] + zero[g];
      }
    }
  }
  return out;
}

TEST(RowCodecTest, DecodeEqualsThePlainDecoderOfTheStoredForm) {
  // Odd widths put rows off byte boundaries for 2- and 4-bit codes.
  for (const int dim : {5, 7, 8, 9, 64}) {
    const std::vector<float> rows = RandomRows(23, dim, 100 + dim);
    for (const int bits : {2, 4, 8}) {
      std::vector<RowCodecSpec> specs;
      for (const int group : {0, 3, 8}) {
        if (group > dim) continue;  // a channel group must fit the row
        specs.push_back({Kind::kPerTokenSymmetric, bits, group, 2});
        specs.push_back({Kind::kPerTokenAsymmetric, bits, group, 0});
      }
      for (const int group : {1, 4, 5}) specs.push_back({Kind::kPerChannelAsymmetric, bits, group, 3});
      for (const RowCodecSpec& spec : specs) {
        auto store = MustEncode(spec, rows, dim);
        ASSERT_NE(store, nullptr);
        const std::vector<float> expected = ReferenceDecode(*store);
        // Runs of rows (crossing into the f32 residual) decode as row by row.
        for (int64_t first = 0; first < store->rows(); first += 3) {
          const int64_t n = std::min<int64_t>(7, store->rows() - first);
          std::vector<float> run(static_cast<size_t>(n * dim));
          store->DecodeRows(first, n, run.data());
          for (int64_t k = 0; k < n * dim; ++k) {
            ASSERT_EQ(std::bit_cast<uint32_t>(run[static_cast<size_t>(k)]),
                      std::bit_cast<uint32_t>(expected[static_cast<size_t>(first * dim + k)]))
                << spec.DebugString() << " dim " << dim << " run at " << first;
          }
        }
        for (int64_t i = 0; i < store->rows(); ++i) {
          const std::vector<float> got = Row(*store, i);
          for (int c = 0; c < dim; ++c) {
            ASSERT_EQ(std::bit_cast<uint32_t>(got[c]),
                      std::bit_cast<uint32_t>(expected[static_cast<size_t>(i * dim + c)]))
                << spec.DebugString() << " dim " << dim << " row " << i << " channel " << c;
          }
        }
      }
    }
  }
}

TEST(RowCodecTest, ErrorShrinksWithMoreBits) {
  const int dim = 16;
  const std::vector<float> rows = RandomRows(64, dim, 11);
  double previous = 1e30;
  for (const int bits : {2, 4, 8}) {
    auto store = MustEncode({Kind::kPerTokenAsymmetric, bits, 0, 0}, rows, dim);
    ASSERT_NE(store, nullptr);
    double err = 0;
    for (int64_t i = 0; i < 64; ++i) {
      const std::vector<float> out = Row(*store, i);
      for (int c = 0; c < dim; ++c) err += std::fabs(out[c] - rows[i * dim + c]);
    }
    EXPECT_LT(err, previous / 3) << bits;
    previous = err;
  }
}

TEST(RowCodecTest, HandComputedRows) {
  // Asymmetric 2-bit of [0, 1, 2, 3]: scale 1, zero 0, codes 0..3, exact;
  // one code byte plus a scale and a zero point.
  auto a = MustEncode({Kind::kPerTokenAsymmetric, 2, 0, 0}, {0, 1, 2, 3}, 4);
  ASSERT_NE(a, nullptr);
  EXPECT_THAT(Row(*a, 0), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(a->bytes(), 1 + 8);
  // [1, 2, 4, 8] in 2 bits: scale 7/3, codes 0, 0 (0.43), 1 (1.29), 3.
  auto b = MustEncode({Kind::kPerTokenAsymmetric, 2, 0, 0}, {1, 2, 4, 8}, 4);
  ASSERT_NE(b, nullptr);
  const float s = 7.0f / 3.0f;
  EXPECT_THAT(Row(*b, 0), ElementsAre(1, 1, s + 1, 3 * s + 1));
  // Symmetric 8-bit: absmax 127 -> scale 1; 0.5 rounds half to even.
  auto c = MustEncode({Kind::kPerTokenSymmetric, 8, 0, 0}, {1, -2, 0.5f, 127}, 4);
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(Row(*c, 0), ElementsAre(1, -2, 0, 127));
  EXPECT_EQ(c->bytes(), 4 + 4);
  // Symmetric 2-bit: codes -1, 0, 1 times absmax.
  auto d = MustEncode({Kind::kPerTokenSymmetric, 2, 0, 0}, {-2, -0.9f, 0.4f, 2}, 4);
  ASSERT_NE(d, nullptr);
  EXPECT_THAT(Row(*d, 0), ElementsAre(-2, 0, 0, 2));
  // Symmetric 4-bit, groups of 2 channels: [7, -3.5] -> scale 1, [0.7, 0.1]
  // -> scale 0.1 (codes 7, 1).
  auto e = MustEncode({Kind::kPerTokenSymmetric, 4, 2, 0}, {7, -3.5f, 0.7f, 0.1f}, 4);
  ASSERT_NE(e, nullptr);
  const float t = 0.7f / 7.0f;
  EXPECT_THAT(Row(*e, 0), ElementsAre(7, -4, 7 * t, 1 * t));  // -3.5 -> -4 (half to even)
  EXPECT_EQ(e->bytes(), 2 + 2 * 4);
  // Per-channel 2-bit over 3 tokens: channel 0 = [0, 1.4, 3] (scale 1),
  // channel 1 = [5, 5, 5] (exact).
  auto f = MustEncode({Kind::kPerChannelAsymmetric, 2, 3, 0}, {0, 5, 1.4f, 5, 3, 5}, 2);
  ASSERT_NE(f, nullptr);
  EXPECT_THAT(Row(*f, 0), ElementsAre(0, 5));
  EXPECT_THAT(Row(*f, 1), ElementsAre(1, 5));
  EXPECT_THAT(Row(*f, 2), ElementsAre(3, 5));
  EXPECT_EQ(f->bytes(), 2 + 2 * 2 * 4);  // 12 bits of codes, 2 channels x (scale, zero)
}

TEST(RowCodecTest, ResidualRowsAreExactAndInPlace) {
  const std::vector<float> rows = RandomRows(6, 4, 3);
  for (const Kind kind :
       {Kind::kPerTokenSymmetric, Kind::kPerTokenAsymmetric, Kind::kPerChannelAsymmetric}) {
    // Per-channel groups of 3 tokens so that rows 0-2 fill one whole group.
    auto store = MustEncode({kind, 2, kind == Kind::kPerChannelAsymmetric ? 3 : 2, 3}, rows, 4);
    ASSERT_NE(store, nullptr);
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(store->RowIfF32(i), nullptr);
    for (int64_t i = 3; i < 6; ++i) {
      ASSERT_NE(store->RowIfF32(i), nullptr);
      EXPECT_THAT(std::vector<float>(store->RowIfF32(i), store->RowIfF32(i) + 4),
                  ElementsAreArray(&rows[i * 4], 4));
    }
  }
  // A residual longer than the rows keeps everything f32.
  auto all = MustEncode({Kind::kPerTokenAsymmetric, 4, 0, 10}, rows, 4);
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->bytes(), 6 * 4 * 4);
  for (int64_t i = 0; i < 6; ++i) EXPECT_NE(all->RowIfF32(i), nullptr);
}

TEST(RowCodecTest, PerChannelPartialGroupsStayF32) {
  const std::vector<float> rows = RandomRows(7, 4, 5);
  // Groups of 3 tokens: rows 0-5 quantised, row 6 alone stays f32.
  auto a = MustEncode({Kind::kPerChannelAsymmetric, 4, 3, 0}, rows, 4);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->RowIfF32(5), nullptr);
  ASSERT_NE(a->RowIfF32(6), nullptr);
  EXPECT_THAT(Row(*a, 6), ElementsAreArray(&rows[24], 4));
  EXPECT_EQ(a->bytes(), (6 * 4 * 4) / 8 + 2 * 4 * 2 * 4 + 4 * 4);
  // With 2 residual rows, 5 remain: one group (rows 0-2); rows 3-6 are f32.
  auto b = MustEncode({Kind::kPerChannelAsymmetric, 4, 3, 2}, rows, 4);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->RowIfF32(2), nullptr);
  for (int64_t i = 3; i < 7; ++i) ASSERT_NE(b->RowIfF32(i), nullptr) << i;
  EXPECT_EQ(b->bytes(), (3 * 4 * 4) / 8 + 4 * 2 * 4 + 4 * 4 * 4);
}

TEST(RowCodecTest, F32StoreAndEmptyStores) {
  const std::vector<float> rows = RandomRows(3, 5, 1);
  auto f = MustEncode(RowCodecSpec::F32(), rows, 5);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes(), 3 * 5 * 4);
  for (int64_t i = 0; i < 3; ++i) EXPECT_THAT(Row(*f, i), ElementsAreArray(&rows[i * 5], 5));
  for (const Kind kind : {Kind::kF32, Kind::kPerTokenAsymmetric, Kind::kPerChannelAsymmetric}) {
    auto empty = RowStore::Encode({kind, kind == Kind::kF32 ? 32 : 4, 2, 1}, nullptr, 0, 4);
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ((*empty)->rows(), 0);
    EXPECT_EQ((*empty)->bytes(), 0);
  }
  // Codes pack across rows: 3 rows x 3 channels x 2 bits = 18 bits = 3 bytes.
  auto packed = MustEncode({Kind::kPerTokenSymmetric, 2, 0, 0}, RandomRows(3, 3, 2), 3);
  ASSERT_NE(packed, nullptr);
  EXPECT_EQ(packed->bytes(), 3 + 3 * 4);
}

TEST(RowCodecTest, RejectsBadSpecs) {
  const float row[4] = {0, 1, 2, 3};
  auto expect_invalid = [&](const RowCodecSpec& spec, int dim, const std::string& part) {
    auto s = RowStore::Encode(spec, row, 1, dim);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << spec.DebugString();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(part));
  };
  expect_invalid({Kind::kPerTokenAsymmetric, 3, 0, 0}, 4, "bits must be 2, 4 or 8, got 3");
  expect_invalid({Kind::kPerChannelAsymmetric, 16, 2, 0}, 4, "got 16");
  expect_invalid({Kind::kPerTokenSymmetric, 1, 0, 0}, 4, "got 1");
  expect_invalid({Kind::kPerTokenAsymmetric, 4, -1, 0}, 4, "group must be >= 0");
  expect_invalid({Kind::kPerTokenSymmetric, 4, 5, 0}, 4,
                 "channel group 5 is larger than head_dim 4");
  expect_invalid({Kind::kPerChannelAsymmetric, 4, 2, -1}, 4, "residual must be >= 0");
  expect_invalid({Kind::kPerTokenAsymmetric, 4, 0, 0}, 0, "bad shape");
  EXPECT_TRUE(RowCodecSpec::F32().Validate(4).ok());
  // Per-channel groups count tokens, so they may exceed head_dim.
  EXPECT_TRUE((RowCodecSpec{Kind::kPerChannelAsymmetric, 4, 64, 0}.Validate(4).ok()));
}

TEST(RowCodecTest, NonFiniteInputsStayInTheirGroup) {
  // A NaN or infinity poisons only its own group (its codes are defined: a
  // NaN quotient becomes code 0 instead of an undefined float-to-int cast).
  const float nan = std::nanf(""), inf = INFINITY;
  for (const Kind kind : {Kind::kPerTokenSymmetric, Kind::kPerTokenAsymmetric}) {
    auto s = MustEncode({kind, 4, 2, 0}, {nan, inf, 7, 7, inf, 1, -7, -7}, 4);
    ASSERT_NE(s, nullptr);
    const std::vector<float> r0 = Row(*s, 0), r1 = Row(*s, 1);
    EXPECT_EQ(r0[2], 7.0f);  // symmetric 4-bit: absmax 7 -> scale 1, exact
    EXPECT_EQ(r0[3], 7.0f);
    EXPECT_EQ(r1[2], -7.0f);
    EXPECT_EQ(r1[3], -7.0f);
  }
}

// The 8-bit symmetric codes (the INT8 compressor's, encoded by a vectorised
// loop) against the definition written plainly: code = clamp(nearbyint(x /
// scale), -127, 127) + 127, a NaN quotient or a scale that is not > 0 giving
// code 127; seen through Decode, which maps a code to float(code - 127) *
// scale. Rows with scale 1 exercise every tie (k + 0.5 rounds to even).
// The INT8 encoder's loops exist once per SIMD level (the widest one the CPU
// has encodes): every level this CPU runs gives the plain statement's amax
// and codes for rows of every length up to a few vectors, with NaNs,
// infinities, signed zeros, subnormals, ties and values past the clamp, at
// every scale including 0, negative, infinite and NaN ones.
TEST(RowCodecTest, Int8EncoderIsThePlainStatementAtEveryLevel) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float nan = std::nanf(""), inf = INFINITY, tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> specials = {nan,   -nan,  inf,    -inf, 0.0f,  -0.0f, tiny,
                                       -tiny, 3e38f, -3e38f, 0.5f, -2.5f, 1e-30f};
  int levels = 0;
  for (const kernels::SimdLevel level :
       {kernels::SimdLevel::kScalar, kernels::SimdLevel::kAvx2, kernels::SimdLevel::kAvx512}) {
    const kv_internal::Int8Encoder* enc = kv_internal::Int8EncoderFor(level);
    if (enc == nullptr) continue;
    ++levels;
    for (int n = 1; n <= 70; ++n) {
      for (int trial = 0; trial < 4; ++trial) {
        std::vector<float> x(static_cast<size_t>(n));
        const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
        for (float& v : x) v = u(rng) * mag;
        if (trial > 0) x[rng() % n] = specials[rng() % specials.size()];
        if (trial > 1) x[rng() % n] = specials[rng() % specials.size()];
        float want_amax = 0.0f;
        for (const float v : x) want_amax = std::max(want_amax, std::fabs(v));
        const float amax = enc->abs_max(x.data(), n);
        ASSERT_EQ(std::bit_cast<uint32_t>(amax), std::bit_cast<uint32_t>(want_amax))
            << kernels::SimdLevelName(level) << " n=" << n << " trial=" << trial;
        for (const float scale : {want_amax / 127.0f, 0.0f, -1.0f, inf, nan, mag / 300.0f}) {
          std::vector<uint8_t> got(static_cast<size_t>(n) + 1, 0xAB);
          enc->encode(x.data(), n, scale, 127, got.data());
          for (int c = 0; c < n; ++c) {
            float q = scale > 0.0f ? std::nearbyint(x[c] / scale) : 0.0f;
            if (std::isnan(q)) q = 0.0f;
            const int want = static_cast<int>(std::clamp(q, -127.0f, 127.0f)) + 127;
            ASSERT_EQ(got[c], want) << kernels::SimdLevelName(level) << " n=" << n << " c=" << c
                                    << " x=" << x[c] << " scale=" << scale;
          }
          ASSERT_EQ(got[n], 0xAB) << "wrote past the group";
        }
      }
    }
  }
  EXPECT_GE(levels, 1);
}

// KIVI's asymmetric codes, as the format defines them: per group, lo and hi
// are the sequential std::min / std::max chains from the group's first value
// (keys: down each channel's rows; values: along each row's channels),
// scale = (hi - lo) / (2^bits - 1), code = nearbyint((x - lo) / scale)
// clamped to [0, 2^bits - 1], 0 for a NaN quotient or a scale that is not
// > 0; decoded as float(code) * scale + lo. Groups with a constant channel
// or row (scale 0), infinities (scale inf or NaN), NaNs first and later,
// signed zeros and ties; every decoded value equals the plain statement's.
TEST(RowCodecTest, AsymmetricCodesAreTheNearestIntegerOfTheQuotient) {
  const int dim = 37;
  const int group = 4;  // keys: rows per group; values: channels per group
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<float> rows;
  for (int i = 0; i < 16; ++i) {
    std::vector<float> r(dim);
    const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (float& x : r) x = u(rng) * mag;
    r[0] = 0.25f;                                                // a constant key channel
    r[1] = i == 5 ? inf : r[1];                                  // an infinity in a key channel
    r[2] = i == 8 ? nan : r[2];                                  // a NaN first in a key group
    r[3] = i == 10 ? nan : r[3];                                 // a NaN inside a key group
    r[4] = (i % 2 == 0) ? 0.0f : -0.0f;                          // signed zeros
    if (i == 3) std::fill(r.begin() + 8, r.begin() + 12, 1.5f);  // a constant value group
    rows.insert(rows.end(), r.begin(), r.end());
  }
  const int64_t n = static_cast<int64_t>(rows.size()) / dim;
  for (const Kind kind : {Kind::kPerChannelAsymmetric, Kind::kPerTokenAsymmetric}) {
    for (const int bits : {2, 4}) {
      const RowCodecSpec spec{kind, bits, group, 0};
      auto store = MustEncode(spec, rows, dim);
      ASSERT_NE(store, nullptr);
      const float top = static_cast<float>((1 << bits) - 1);
      auto want_of = [&](float x, float lo, float hi) {
        const float scale = (hi - lo) / top;
        float q = scale > 0.0f ? std::nearbyint((x - lo) / scale) : 0.0f;
        if (std::isnan(q)) q = 0.0f;
        return static_cast<float>(static_cast<int>(std::clamp(q, 0.0f, top))) * scale + lo;
      };
      for (int64_t i = 0; i < n; ++i) {
        const std::vector<float> got = Row(*store, i);
        for (int c = 0; c < dim; ++c) {
          float lo, hi;
          if (kind == Kind::kPerChannelAsymmetric) {
            const int64_t r0 = i / group * group;
            lo = hi = rows[r0 * dim + c];
            for (int64_t r = r0; r < r0 + group; ++r) {
              lo = std::min(lo, rows[r * dim + c]);
              hi = std::max(hi, rows[r * dim + c]);
            }
          } else {
            const int c0 = c / group * group, c1 = std::min(dim, c0 + group);
            lo = hi = rows[i * dim + c0];
            for (int k = c0; k < c1; ++k) {
              lo = std::min(lo, rows[i * dim + k]);
              hi = std::max(hi, rows[i * dim + k]);
            }
          }
          const float want = want_of(rows[i * dim + c], lo, hi);
          const float have = got[static_cast<size_t>(c)];
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(have)) << bits << " bits row " << i << " channel " << c;
          } else {
            EXPECT_EQ(std::bit_cast<uint32_t>(have), std::bit_cast<uint32_t>(want))
                << (kind == Kind::kPerChannelAsymmetric ? "keys " : "values ") << bits
                << " bits row " << i << " channel " << c << ": x " << rows[i * dim + c];
          }
        }
      }
    }
  }
}

TEST(RowCodecTest, Int8CodesAreTheNearestIntegerOfTheQuotient) {
  const int dim = 37;  // not a multiple of any vector width
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> rows;
  auto add_row = [&](std::vector<float> r) {
    r.resize(dim, 0.0f);
    rows.insert(rows.end(), r.begin(), r.end());
  };
  add_row({127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, 126.5f, -126.5f, -127.0f, 63.5f, -0.0f,
           0.49999997f, -1.5000001f});
  add_row({});  // all zeros: scale 0
  const float nan = std::nanf(""), inf = INFINITY, tiny = std::numeric_limits<float>::denorm_min();
  add_row({nan, 1.0f, -2.0f});
  add_row({inf, 1.0f, -inf, 0.0f});
  add_row({tiny, -tiny, 3 * tiny, 0.0f});
  add_row({3e38f, -3e38f, 1e-30f, 1.0f});
  for (int i = 0; i < 40; ++i) {
    std::vector<float> r(dim);
    const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
    for (float& x : r) x = u(rng) * mag;
    add_row(r);
  }
  const int64_t n = static_cast<int64_t>(rows.size()) / dim;
  for (const int group : {0, 8, 16}) {
    const RowCodecSpec spec{Kind::kPerTokenSymmetric, 8, group, 0};
    auto store = MustEncode(spec, rows, dim);
    ASSERT_NE(store, nullptr);
    const int g = group == 0 ? dim : group;
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float> got = Row(*store, i);
      for (int c0 = 0; c0 < dim; c0 += g) {
        const int c1 = std::min(dim, c0 + g);
        float amax = 0.0f;
        for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(rows[i * dim + c]));
        const float scale = amax / 127.0f;
        for (int c = c0; c < c1; ++c) {
          float q = scale > 0.0f ? std::nearbyint(rows[i * dim + c] / scale) : 0.0f;
          if (std::isnan(q)) q = 0.0f;
          const int code = static_cast<int>(std::clamp(q, -127.0f, 127.0f)) + 127;
          const float want = static_cast<float>(code - 127) * scale;
          const float have = got[static_cast<size_t>(c)];
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(have)) << "group " << group << " row " << i << " channel " << c;
          } else {
            EXPECT_EQ(std::bit_cast<uint32_t>(have), std::bit_cast<uint32_t>(want))
                << "group " << group << " row " << i << " channel " << c << ": x "
                << rows[i * dim + c] << " scale " << scale;
          }
        }
      }
    }
  }
}

TEST(RowCodecTest, DebugStrings) {
  EXPECT_EQ(RowCodecSpec::F32().DebugString(), "f32");
  EXPECT_EQ((RowCodecSpec{Kind::kPerTokenSymmetric, 8, 0, 0}.DebugString()),
            "int8-per-token(group=0,residual=0)");
  EXPECT_EQ((RowCodecSpec{Kind::kPerChannelAsymmetric, 2, 32, 16}.DebugString()),
            "uint2-per-channel(group=32,residual=16)");
}

}  // namespace
}  // namespace vc

namespace vc {
namespace {

std::string SerializedStore(const RowStore& s) {
  std::string out;
  s.AppendSerialized(&out);
  return out;
}

std::vector<int64_t> AllRows(int64_t n) {
  std::vector<int64_t> keep(n);
  for (int64_t i = 0; i < n; ++i) keep[i] = i;
  return keep;
}

// Appending rows (keeping every old one) gives exactly the store that encodes
// all rows at once: quantised rows keep their codes and the f32 window slides.
TEST(RowStoreRebuildTest, AppendOnlyEqualsEncodingEverything) {
  const int dim = 8;
  const std::vector<float> rows = RandomRows(40, dim, 11);
  std::vector<RowCodecSpec> specs = {RowCodecSpec::F32()};
  for (const int bits : {2, 4, 8}) {
    for (const int residual : {0, 3, 9}) {
      specs.push_back({Kind::kPerTokenSymmetric, bits, 4, residual});
      specs.push_back({Kind::kPerTokenAsymmetric, bits, 0, residual});
      specs.push_back({Kind::kPerChannelAsymmetric, bits, 4, residual});
      specs.push_back({Kind::kPerChannelAsymmetric, bits, 7, residual});
    }
  }
  for (const RowCodecSpec& spec : specs) {
    for (const auto& [n0, n] : std::vector<std::pair<int, int>>{{0, 5}, {5, 6}, {7, 19}, {13, 40}}) {
      SCOPED_TRACE(spec.DebugString() + " " + std::to_string(n0) + " -> " + std::to_string(n));
      auto base = RowStore::Encode(spec, rows.data(), n0, dim);
      ASSERT_TRUE(base.ok());
      auto grown = RowStore::Rebuild(**base, AllRows(n0), &rows[n0 * dim], n - n0, spec);
      ASSERT_TRUE(grown.ok()) << grown.status();
      auto direct = RowStore::Encode(spec, rows.data(), n, dim);
      ASSERT_TRUE(direct.ok());
      EXPECT_EQ(SerializedStore(**grown), SerializedStore(**direct));
      EXPECT_EQ((*grown)->bytes(), (*direct)->bytes());
    }
  }
}

TEST(RowStoreRebuildTest, DroppedRowsKeepTheSurvivorsCodes) {
  const int dim = 4;
  const std::vector<float> rows = RandomRows(12, dim, 3);
  const std::vector<float> more = RandomRows(2, dim, 4);
  const std::vector<int64_t> keep = {0, 2, 3, 7, 8, 11};
  // Per token: every kept quantised row decodes as before, wherever it moves.
  const RowCodecSpec per_token{Kind::kPerTokenAsymmetric, 2, 0, 3};
  auto src = MustEncode(per_token, rows, dim);  // rows 0-8 quantised, 9-11 f32
  auto out = RowStore::Rebuild(*src, keep, more.data(), 2, per_token);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ((*out)->rows(), 8);
  for (size_t i = 0; i < keep.size(); ++i) EXPECT_EQ(Row(**out, i), Row(*src, keep[i])) << i;
  // 8 rows, residual 3: the 5 kept quantised rows, then row 11 and the two
  // new rows as the f32 window.
  EXPECT_EQ((*out)->RowIfF32(4), nullptr);
  EXPECT_NE((*out)->RowIfF32(5), nullptr);
  EXPECT_THAT(Row(**out, 5), ElementsAreArray(&rows[11 * dim], dim));
  EXPECT_THAT(Row(**out, 7), ElementsAreArray(&more[dim], dim));
  // Quantised rows never turn back into f32: 5 rows with a window of 3 keep
  // all 5 quantised.
  const std::vector<int64_t> quantised_only = {0, 2, 3, 7, 8};
  auto shrunk = RowStore::Rebuild(*src, quantised_only, nullptr, 0, per_token);
  ASSERT_TRUE(shrunk.ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*shrunk)->RowIfF32(i), nullptr) << i;
  // A rebuilt store is a regular store: it serialises and reads back.
  const std::string bytes = SerializedStore(**shrunk);
  size_t offset = 0;
  auto back = RowStore::Deserialize(bytes, &offset);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(offset, bytes.size());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Row(**back, i), Row(**shrunk, i));
  // Per channel: group 0 (rows 0-3) lost row 1, so it is re-formed from the
  // decoded survivors; no kept group comes before it to carry over.
  const RowCodecSpec per_channel{Kind::kPerChannelAsymmetric, 4, 4, 0};
  auto keys = MustEncode(per_channel, rows, dim);
  auto regrouped = RowStore::Rebuild(*keys, keep, more.data(), 2, per_channel);
  ASSERT_TRUE(regrouped.ok());
  EXPECT_EQ((*regrouped)->rows(), 8);
  EXPECT_EQ((*regrouped)->RowIfF32(7), nullptr);  // 8 rows = 2 whole groups
  // Keeping group 0 whole carries its codes over bit for bit.
  const std::vector<int64_t> keep_group = {0, 1, 2, 3, 5, 9};
  auto carried = RowStore::Rebuild(*keys, keep_group, nullptr, 0, per_channel);
  ASSERT_TRUE(carried.ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Row(**carried, i), Row(*keys, i));
  EXPECT_NE((*carried)->RowIfF32(4), nullptr);  // 2 rows: short of a group
  // Bad indices.
  const std::vector<int64_t> unsorted = {3, 2};
  EXPECT_EQ(RowStore::Rebuild(*keys, unsorted, nullptr, 0, per_channel).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> outside = {12};
  EXPECT_EQ(RowStore::Rebuild(*keys, outside, nullptr, 0, per_channel).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vc
