// The quantised-weight products against an independent scalar statement of
// their definition (kernels/quantized.h): every SIMD level, thread count and
// batch shape must agree with it bit for bit; and the quantisers' formats.
#include "kernels/quantized.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/base/thread_pool.h"
#include "gtest/gtest.h"

namespace vc::kernels {
namespace {

// The weight the definition uses for element (o, i): float(q) (int8) or
// float(q) * scale rounded to f32 (int4); 0 in the padding.
int DecodeCode(const QuantizedMatrix& w, int64_t o, int64_t i) {
  if (w.format == WeightFormat::kInt8) {
    return static_cast<int8_t>(w.data[o * w.padded_in + i]);
  }
  const uint8_t byte = w.data[o * (w.padded_in / 2) + (i / 16) * 8 + (i % 16) % 8];
  return ((i % 16) < 8 ? (byte & 0x0F) : (byte >> 4)) - 8;
}

float Reference(const QuantizedMatrix& w, const float* x, int64_t o, const float* bias) {
  float lane[16];
  for (float& l : lane) l = 0.0f;
  for (int64_t i = 0; i < w.padded_in; ++i) {
    const float xi = i < w.in ? x[i] : 0.0f;
    float wi = static_cast<float>(DecodeCode(w, o, i));
    if (w.format == WeightFormat::kInt4) wi = wi * w.scales[o * w.groups + i / w.group];
    lane[i % 16] = std::fma(xi, wi, lane[i % 16]);
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) lane[k] = lane[k] + lane[k + width];
  }
  float v = lane[0];
  if (w.format == WeightFormat::kInt8) v = w.scales[o] * v;
  if (bias != nullptr) v = v + bias[o];
  return v;
}

// Values over many binades with both signs, so that another summation order
// gives another float with high probability.
std::vector<float> Spread(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-10, 10);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
  return v;
}

std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> out;
  for (const char* name : {"scalar", "avx2", "avx512"}) {
    if (auto l = ParseSimdLevel(name); l.ok()) out.push_back(*l);
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  int64_t out, in;
};

class QuantizedMatmulTest : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(QuantizedMatmulTest, EveryLevelThreadCountAndBatchShapeMatchesTheDefinition) {
  const WeightFormat format = GetParam();
  std::mt19937_64 rng(42);
  // 172 = stories260K's FFN width (not a multiple of 16 or 32); 1 and 5
  // outputs leave every tile partial; 300 outputs split over threads.
  for (const Shape shape : {Shape{1, 16}, Shape{5, 172}, Shape{37, 64}, Shape{300, 263},
                            Shape{70, 48}, Shape{33, 1}}) {
    const std::vector<float> weights = Spread(rng, shape.out * shape.in);
    const std::vector<float> bias = Spread(rng, shape.out);
    auto w = Quantize(weights.data(), shape.out, shape.in, format);
    ASSERT_TRUE(w.ok()) << w.status();
    for (int64_t tokens : {1, 2, 3, 5, 9, 17, 32}) {
      const std::vector<float> x = Spread(rng, tokens * shape.in);
      for (const bool with_bias : {false, true}) {
        const float* b = with_bias ? bias.data() : nullptr;
        std::vector<float> want(static_cast<size_t>(tokens * shape.out));
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t o = 0; o < shape.out; ++o) {
            want[t * shape.out + o] = Reference(*w, &x[t * shape.in], o, b);
          }
        }
        for (const SimdLevel level : Levels()) {
          for (const int threads : {1, 2, 3}) {
            ThreadPool pool(threads);
            std::vector<float> got(want.size(), -1.0f);
            QuantizedMatmul(level, &pool, x.data(), tokens, *w, b, got.data());
            ASSERT_TRUE(SameBits(want, got))
                << WeightFormatName(format) << " " << SimdLevelName(level) << " threads=" << threads
                << " out=" << shape.out << " in=" << shape.in << " tokens=" << tokens;
          }
          // Batch invariance: each token alone gives its row of the batch.
          for (int64_t t = 0; t < tokens; ++t) {
            std::vector<float> one(static_cast<size_t>(shape.out));
            QuantizedMatmul(level, nullptr, &x[t * shape.in], 1, *w, b, one.data());
            ASSERT_EQ(0, std::memcmp(one.data(), &want[t * shape.out], one.size() * sizeof(float)))
                << SimdLevelName(level) << " token " << t << " of " << tokens;
          }
        }
      }
    }
  }
}

// The kernels follow a row's int4 groups by counting blocks (one group
// state per row, renewed at each boundary): groups of 1, 3, 4 and 8 blocks,
// rows ending inside a group or shorter than one, at every level.
TEST(QuantizedMatmulInt4Test, EveryGroupSizeMatchesTheDefinition) {
  std::mt19937_64 rng(7);
  for (const int group : {16, 48, 64, 128}) {
    for (const Shape shape : {Shape{9, 172}, Shape{20, 300}, Shape{8, 40}}) {
      const std::vector<float> weights = Spread(rng, shape.out * shape.in);
      auto w = Quantize(weights.data(), shape.out, shape.in, WeightFormat::kInt4, group);
      ASSERT_TRUE(w.ok()) << w.status();
      for (int64_t tokens : {1, 3}) {
        const std::vector<float> x = Spread(rng, tokens * shape.in);
        std::vector<float> want(static_cast<size_t>(tokens * shape.out));
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t o = 0; o < shape.out; ++o) {
            want[t * shape.out + o] = Reference(*w, &x[t * shape.in], o, nullptr);
          }
        }
        for (const SimdLevel level : Levels()) {
          ThreadPool pool(2);
          std::vector<float> got(want.size(), -1.0f);
          QuantizedMatmul(level, &pool, x.data(), tokens, *w, nullptr, got.data());
          EXPECT_TRUE(SameBits(want, got))
              << SimdLevelName(level) << " group=" << group << " out=" << shape.out
              << " in=" << shape.in << " tokens=" << tokens;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedMatmulTest,
                         ::testing::Values(WeightFormat::kInt8, WeightFormat::kInt4),
                         [](const auto& info) { return std::string(WeightFormatName(info.param)); });

TEST(QuantizeTest, Int8IsPerRowSymmetricAndWithinHalfAStep) {
  std::mt19937_64 rng(1);
  const int64_t out = 7, in = 45;
  std::vector<float> w = Spread(rng, out * in);
  for (int64_t i = 0; i < in; ++i) w[2 * in + i] = 0.0f;  // an all-zero row
  auto q = Quantize(w.data(), out, in, WeightFormat::kInt8);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->padded_in, 48);
  EXPECT_EQ(q->data.size(), static_cast<size_t>(out * 48));
  EXPECT_EQ(q->scales[2], 0.0f);
  for (int64_t o = 0; o < out; ++o) {
    float maxabs = 0;
    for (int64_t i = 0; i < in; ++i) maxabs = std::max(maxabs, std::fabs(w[o * in + i]));
    EXPECT_EQ(q->scales[o], maxabs / 127.0f);
    for (int64_t i = 0; i < 48; ++i) {
      const int c = DecodeCode(*q, o, i);
      if (i >= in) {
        EXPECT_EQ(c, 0);
        continue;
      }
      EXPECT_LE(std::abs(c), 127);
      EXPECT_LE(std::fabs(c * q->scales[o] - w[o * in + i]), 0.5001f * q->scales[o] + 1e-30f);
    }
  }
}

TEST(QuantizeTest, Int4GroupsHandleWidthsThatAreNotAMultipleOfTheGroup) {
  std::mt19937_64 rng(2);
  for (const int group : {32, 64}) {
    const int64_t out = 3, in = 172;  // stories260K's FFN width
    const std::vector<float> w = Spread(rng, out * in);
    auto q = Quantize(w.data(), out, in, WeightFormat::kInt4, group);
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(q->padded_in, 176);
    EXPECT_EQ(q->groups, (172 + group - 1) / group);
    EXPECT_EQ(q->data.size(), static_cast<size_t>(out * 88));
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t g = 0; g < q->groups; ++g) {
        const int64_t i0 = g * group, i1 = std::min<int64_t>(in, i0 + group);
        float maxabs = 0;
        for (int64_t i = i0; i < i1; ++i) maxabs = std::max(maxabs, std::fabs(w[o * in + i]));
        const float s = q->scales[o * q->groups + g];
        EXPECT_EQ(s, maxabs / 7.0f) << "group " << g;  // the partial last group's own range
        for (int64_t i = i0; i < i1; ++i) {
          const int c = DecodeCode(*q, o, i);
          EXPECT_GE(c, -8);
          EXPECT_LE(c, 7);
          EXPECT_LE(std::fabs(c * s - w[o * in + i]), 0.5001f * s) << "o=" << o << " i=" << i;
        }
      }
      for (int64_t i = in; i < q->padded_in; ++i) EXPECT_EQ(DecodeCode(*q, o, i), 0);
    }
  }
}

TEST(QuantizeTest, RejectsBadArguments) {
  const std::vector<float> w(64, 1.0f);
  EXPECT_EQ(Quantize(w.data(), 2, 32, WeightFormat::kInt4, 24).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quantize(w.data(), 2, 32, WeightFormat::kInt4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quantize(w.data(), 0, 32, WeightFormat::kInt8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quantize(w.data(), 2, 32, WeightFormat::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWeightFormat("int3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseWeightFormat("int4"), WeightFormat::kInt4);
}

TEST(QuantizedMatmulTest, ApproximatesTheF32Product) {
  // The point of the formats: close to the f32 product (relative to the
  // product of norms), int8 much closer than int4.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t out = 64, in = 256;
  std::vector<float> w(out * in), x(in);
  for (float& v : w) v = u(rng);
  for (float& v : x) v = u(rng);
  for (const WeightFormat f : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    auto q = Quantize(w.data(), out, in, f);
    ASSERT_TRUE(q.ok());
    std::vector<float> y(out);
    QuantizedMatmul(SimdLevel::kScalar, nullptr, x.data(), 1, *q, nullptr, y.data());
    double err = 0, norm = 0;
    for (int64_t o = 0; o < out; ++o) {
      double exact = 0;
      for (int64_t i = 0; i < in; ++i) exact += double{w[o * in + i]} * x[i];
      err += (y[o] - exact) * (y[o] - exact);
      norm += exact * exact;
    }
    EXPECT_LT(std::sqrt(err / norm), f == WeightFormat::kInt8 ? 0.02 : 0.2) << WeightFormatName(f);
  }
}

}  // namespace
}  // namespace vc::kernels
