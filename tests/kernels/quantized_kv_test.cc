// The fused attention kernels over quantised K/V rows against independent
// statements of their definition (kernels/quantized_kv.h): a plain scalar
// reference that must match every SIMD level bit for bit, and a float64
// computation that bounds the error. Codes sit in buffers of exactly their
// stored size, so a read past them fails under ASan.
#include "kernels/quantized_kv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace vc::kernels {
namespace {

using Layout = QuantizedKvRows::Layout;

// A block of stored rows in the row codec's layout, with random codes,
// scales and zero points.
struct Stored {
  QuantizedKvRows view;
  std::vector<uint8_t> codes;
  std::vector<float> scales, zeros;
};

Stored MakeRows(std::mt19937_64& rng, Layout layout, int bits, int dim, int group, int64_t rows) {
  Stored s;
  s.view.layout = layout;
  s.view.bits = bits;
  s.view.dim = dim;
  s.view.group = group;
  s.view.rows = rows;
  s.codes.resize(static_cast<size_t>((rows * dim * bits + 7) / 8));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : s.codes) b = static_cast<uint8_t>(byte(rng));
  const int64_t params = layout == Layout::kPerChannelAsymmetric
                             ? (rows / group) * dim
                             : rows * ((dim + group - 1) / group);
  std::uniform_real_distribution<float> scale(0.001f, 0.5f), zero(-2.0f, 2.0f);
  s.scales.resize(static_cast<size_t>(params));
  for (float& x : s.scales) x = scale(rng);
  if (layout != Layout::kPerTokenSymmetric) {
    s.zeros.resize(s.scales.size());
    for (float& x : s.zeros) x = zero(rng);
  }
  s.view.codes = s.codes.data();
  s.view.scales = s.scales.data();
  s.view.zeros = s.zeros.empty() ? nullptr : s.zeros.data();
  return s;
}

struct Format {
  Layout layout;
  int bits;
  int group;  // 0: the whole row (per-token) / 1 token (per-channel)
};

// 96 rows (a multiple of every per-channel group) of format f; a per-token
// group is at most the row.
Stored MakeRows(std::mt19937_64& rng, const Format& f, int dim) {
  const bool channel = f.layout == Layout::kPerChannelAsymmetric;
  const int group =
      f.group == 0 ? (channel ? 1 : dim) : (channel ? f.group : std::min(f.group, dim));
  return MakeRows(rng, f.layout, f.bits, dim, group, 96);
}

// Element (r, c) as the definition states it, from the stored bytes.
float Element(const QuantizedKvRows& x, int64_t r, int c) {
  const int64_t bit = (r * x.dim + c) * x.bits;
  const int u = (x.codes[bit / 8] >> (bit % 8)) & ((1 << x.bits) - 1);
  int64_t g;
  if (x.layout == Layout::kPerChannelAsymmetric) {
    g = (r / x.group) * x.dim + c;
  } else {
    g = r * ((x.dim + x.group - 1) / x.group) + c / x.group;
  }
  if (x.layout == Layout::kPerTokenSymmetric) {
    const float centred = static_cast<float>(u - ((1 << (x.bits - 1)) - 1));
    return centred * x.scales[g];
  }
  const float product = static_cast<float>(u) * x.scales[g];
  return product + x.zeros[g];
}

// The 16-lane canonical dot product written out plainly.
float ReferenceScore(const float* q, const QuantizedKvRows& k, int64_t r, float scale) {
  float lane[16] = {};
  const int padded = (k.dim + 15) / 16 * 16;
  for (int c = 0; c < padded; ++c) {
    const float a = c < k.dim ? q[c] : 0.0f;
    const float b = c < k.dim ? Element(k, r, c) : 0.0f;
    lane[c % 16] = std::fma(a, b, lane[c % 16]);
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) lane[i] = lane[i] + lane[i + width];
  }
  return lane[0] * scale;
}

std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> out;
  for (const char* name : {"scalar", "avx2", "avx512"}) {
    if (auto l = ParseSimdLevel(name); l.ok()) out.push_back(*l);  // skip what the CPU lacks
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string Name(const Format& f, int dim) {
  const char* layout = f.layout == Layout::kPerTokenSymmetric    ? "sym"
                       : f.layout == Layout::kPerTokenAsymmetric ? "asym"
                                                                 : "channel";
  return std::string(layout) + " bits=" + std::to_string(f.bits) +
         " group=" + std::to_string(f.group) + " dim=" + std::to_string(dim);
}

// Every layout and width, groups that divide the row, do not, or are
// narrower than a 16-lane block; per-channel groups of 1, 3 and 32 tokens.
std::vector<Format> Formats() {
  std::vector<Format> out;
  for (int bits : {2, 4, 8}) {
    for (int group : {0, 3, 16, 32}) {
      out.push_back({Layout::kPerTokenSymmetric, bits, group});
      out.push_back({Layout::kPerTokenAsymmetric, bits, group});
    }
    for (int group : {1, 3, 32}) out.push_back({Layout::kPerChannelAsymmetric, bits, group});
  }
  return out;
}

// Head dims: below one block, odd, one block and a bit, several 64-channel
// value passes (130); rows of whole 16-lane blocks (16, 64, 80, 96, 128) take
// the kernels' whole-block path, 8 rows of scores at a time.
constexpr int kDims[] = {1, 5, 8, 13, 16, 17, 31, 64, 80, 96, 128, 130};

// fn(rows, rng) for random rows of every format and head dim.
template <typename Fn>
void ForEveryFormatAndDim(uint64_t seed, Fn fn) {
  std::mt19937_64 rng(seed);
  for (const Format& f : Formats()) {
    for (int dim : kDims) {
      SCOPED_TRACE(Name(f, dim));
      fn(MakeRows(rng, f, dim), rng);
    }
  }
}

TEST(QuantizedKvTest, ScoresMatchTheDefinitionOnEveryLevel) {
  ForEveryFormatAndDim(7, [](const Stored& s, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int dim = s.view.dim;
    const int64_t rows = s.view.rows;
    std::vector<float> q(static_cast<size_t>(dim));
    for (float& x : q) x = u(rng);
    const float scale = 0.37f;
    // Runs that start at odd rows put 2- and 4-bit rows off byte boundaries.
    for (const auto& [first, n] :
         std::vector<std::pair<int64_t, int64_t>>{{0, rows}, {1, 7}, {3, 40}, {95, 1}}) {
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) want[j] = ReferenceScore(q.data(), s.view, first + j, scale);
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0, mag = 0;
        for (int c = 0; c < dim; ++c) {
          const double e = Element(s.view, first + j, c);
          dot += double{q[c]} * e;
          mag += std::fabs(double{q[c]} * e);
        }
        ASSERT_NEAR(want[j], dot * scale, 1e-6 * (mag + 1.0) * dim) << "row " << first + j;
      }
      for (SimdLevel level : Levels()) {
        std::vector<float> got(static_cast<size_t>(n), -1.0f);
        QuantizedScores(level, q.data(), s.view, first, n, scale, got.data());
        EXPECT_TRUE(SameBits(got, want))
            << SimdLevelName(level) << " rows [" << first << ", " << first + n << ")";
      }
    }
  });
}

TEST(QuantizedKvTest, ValueSumsMatchTheDefinitionOnEveryLevel) {
  ForEveryFormatAndDim(8, [](const Stored& s, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int dim = s.view.dim;
    const int64_t rows = s.view.rows;
    std::vector<float> p(static_cast<size_t>(rows)), init(static_cast<size_t>(dim));
    for (float& x : p) x = u(rng);
    for (float& x : init) x = u(rng);  // the kernel accumulates onto out
    for (const auto& [first, n] :
         std::vector<std::pair<int64_t, int64_t>>{{0, rows}, {1, 7}, {3, 40}, {95, 1}}) {
      std::vector<float> want = init;
      std::vector<double> exact(init.begin(), init.end());
      for (int64_t j = 0; j < n; ++j) {
        for (int d = 0; d < dim; ++d) {
          const float e = Element(s.view, first + j, d);
          want[d] = std::fma(p[j], e, want[d]);
          exact[d] += double{p[j]} * e;
        }
      }
      for (int d = 0; d < dim; ++d) ASSERT_NEAR(want[d], exact[d], 1e-5 * (n + 1)) << d;
      for (SimdLevel level : Levels()) {
        // A guard after out: lanes past dim must never be written.
        std::vector<float> got = init;
        got.push_back(12345.0f);
        QuantizedAccumulate(level, p.data(), s.view, first, n, got.data());
        EXPECT_EQ(got.back(), 12345.0f) << SimdLevelName(level) << " wrote past out";
        got.pop_back();
        EXPECT_TRUE(SameBits(got, want))
            << SimdLevelName(level) << " rows [" << first << ", " << first + n << ")";
      }
    }
  });
}

// Extreme codes and scales (all-zero and all-ones bytes, zero scales, large
// magnitudes) agree bit for bit too, including the sign of zero results.
TEST(QuantizedKvTest, EdgeValuesAgreeBitForBit) {
  std::mt19937_64 rng(9);
  for (const Format& f :
       {Format{Layout::kPerTokenSymmetric, 8, 0}, Format{Layout::kPerTokenAsymmetric, 2, 0},
        Format{Layout::kPerChannelAsymmetric, 4, 2}}) {
    for (int dim : {8, 16, 19}) {
      SCOPED_TRACE(Name(f, dim));
      const int group = f.layout == Layout::kPerChannelAsymmetric ? f.group : dim;
      for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t{0x7F}}) {
        Stored s = MakeRows(rng, f.layout, f.bits, dim, group, 8);
        std::fill(s.codes.begin(), s.codes.end(), fill);
        for (size_t i = 0; i < s.scales.size(); ++i) s.scales[i] = i % 3 == 0 ? 0.0f : 1e30f;
        for (float& z : s.zeros) z = -0.0f;
        std::vector<float> q(static_cast<size_t>(dim), -0.0f);
        q[0] = 1e-30f;
        std::vector<float> want(8);
        for (int64_t j = 0; j < 8; ++j) want[j] = ReferenceScore(q.data(), s.view, j, 1.0f);
        for (SimdLevel level : Levels()) {
          std::vector<float> got(8);
          QuantizedScores(level, q.data(), s.view, 0, 8, 1.0f, got.data());
          EXPECT_TRUE(SameBits(got, want)) << SimdLevelName(level) << " fill " << int{fill};
        }
      }
    }
  }
}

}  // namespace
}  // namespace vc::kernels
