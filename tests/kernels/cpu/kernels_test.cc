// The CPU kernels against an independent scalar statement of the numerics
// contract (kernels/kernels.h): every SIMD level and thread count must agree
// with it bit for bit.
#include "kernels/kernels.h"

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
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vc::kernels {
namespace {

// ---- The canonical rule, written out independently -------------------------

// 16 logical lanes; element i goes into lane i % 16 with one FMA, in
// increasing i; the last group is padded with zeros (which are FMA'd too);
// then the fixed tree l[k] + l[k+8], + [k+4], + [k+2], + [k+1].
float CanonicalDot(const float* a, const float* b, int64_t n) {
  float lane[16];
  for (float& l : lane) l = 0.0f;
  const int64_t padded = (n + 15) / 16 * 16;
  for (int64_t i = 0; i < padded; ++i) {
    const float x = i < n ? a[i] : 0.0f;
    const float y = i < n ? b[i] : 0.0f;
    lane[i % 16] = std::fma(x, y, lane[i % 16]);
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) lane[k] = lane[k] + lane[k + width];
  }
  return lane[0];
}

// Values spread over many binades with both signs, so that any other
// summation order gives a different float with high probability.
std::vector<float> Spread(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-12, 12);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
  return v;
}

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Every SIMD level this CPU accepts.
std::vector<std::string> Levels() {
  std::vector<std::string> out;
  for (const char* name : {"scalar", "avx2", "avx512"}) {
    if (ParseSimdLevel(name).ok()) out.push_back(name);
  }
  return out;
}

std::unique_ptr<KernelBackend> MakeBackend(const std::string& simd, int threads) {
  BackendOptions options;
  options.name = "cpu";
  options.simd = simd;
  options.threads = threads;
  auto backend = CreateBackend(options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

// The backend's SoftmaxRows over every row of `rows`, in place, in one call.
void SoftmaxRowsInPlace(const KernelBackend& backend, std::vector<std::vector<float>>* rows) {
  std::vector<float*> ptrs;
  std::vector<int64_t> lens;
  for (auto& r : *rows) {
    ptrs.push_back(r.data());
    lens.push_back(static_cast<int64_t>(r.size()));
  }
  backend.SoftmaxRows(ptrs.data(), lens.data(), static_cast<int64_t>(ptrs.size()));
}

TEST(KernelsTest, ScalarLevelIsAlwaysAvailable) {
  ASSERT_FALSE(Levels().empty());
  EXPECT_EQ(Levels().front(), "scalar");
  std::cout << "SIMD levels on this CPU:";
  for (const auto& l : Levels()) std::cout << " " << l;
  std::cout << "\n";
}

TEST(KernelsTest, TestDataIsOrderSensitive) {
  // Sanity check of the test itself: a plain sequential sum disagrees with
  // the canonical rule on most inputs, so bit equality below means something.
  std::mt19937_64 rng(7);
  int differ = 0;
  for (int64_t n = 17; n <= 100; ++n) {
    const auto a = Spread(rng, n), b = Spread(rng, n);
    float seq = 0.0f;
    for (int64_t i = 0; i < n; ++i) seq = std::fma(a[i], b[i], seq);
    if (!SameBits(seq, CanonicalDot(a.data(), b.data(), n))) ++differ;
  }
  EXPECT_GT(differ, 42);  // over half of the 84 lengths
}

TEST(KernelsTest, DotMatchesCanonicalRuleOnEveryLevel) {
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    std::mt19937_64 rng(11);
    for (int64_t n = 0; n <= 100; ++n) {
      for (int rep = 0; rep < 8; ++rep) {
        // Unaligned starts: offset the data inside a larger buffer.
        const int64_t off = rep % 5;
        const auto a = Spread(rng, n + off), b = Spread(rng, n + off);
        const float want = CanonicalDot(a.data() + off, b.data() + off, n);
        const float got = backend->Dot(a.data() + off, b.data() + off, n);
        ASSERT_TRUE(SameBits(want, got))
            << level << " n=" << n << " rep=" << rep << " want=" << want << " got=" << got;
      }
    }
    // Longer lengths around multiples of 16.
    for (int64_t n : {127, 128, 129, 255, 256, 257, 1000, 1024, 4097}) {
      const auto a = Spread(rng, n), b = Spread(rng, n);
      ASSERT_TRUE(
          SameBits(CanonicalDot(a.data(), b.data(), n), backend->Dot(a.data(), b.data(), n)))
          << level << " n=" << n;
    }
  }
}

TEST(KernelsTest, DotOfNothingIsPositiveZero) {
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    const float dummy = 1.0f;
    EXPECT_TRUE(SameBits(backend->Dot(&dummy, &dummy, 0), 0.0f)) << level;
  }
}

TEST(KernelsTest, DotSpecialValues) {
  // Cancellation, signed zeros, infinities and NaN follow the same sequence
  // of IEEE operations on every level.
  std::vector<float> a(37, 0.0f), b(37, 0.0f);
  a[0] = 1e30f;
  b[0] = 1e8f;  // 1e38: near FLT_MAX; lane 0 then cancels it with element 16
  a[16] = -1e30f;
  b[16] = 1e8f;
  a[5] = -0.0f;
  b[5] = 3.0f;
  a[36] = 2.5f;
  b[36] = -4.0f;
  std::vector<float> c(33, -0.0f), d(33, 1.0f);
  std::vector<float> e(20, 1.0f), f(20, 1.0f);
  e[3] = std::numeric_limits<float>::infinity();
  f[19] = 0.0f;
  e[19] = std::numeric_limits<float>::infinity();  // inf * 0 = NaN
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    EXPECT_TRUE(
        SameBits(CanonicalDot(a.data(), b.data(), 37), backend->Dot(a.data(), b.data(), 37)))
        << level;
    EXPECT_TRUE(
        SameBits(CanonicalDot(c.data(), d.data(), 33), backend->Dot(c.data(), d.data(), 33)))
        << level;
    EXPECT_TRUE(std::isnan(backend->Dot(e.data(), f.data(), 20))) << level;
  }
}

struct MatmulShape {
  int64_t tokens, in, out;
};

TEST(KernelsTest, MatmulMatchesCanonicalRuleOnEveryLevelAndThreadCount) {
  const std::vector<MatmulShape> shapes = {
      {1, 1, 1},    {1, 7, 3},    {2, 15, 17},  {3, 16, 16},    {5, 17, 33},
      {1, 64, 512}, {7, 64, 172}, {4, 172, 64}, {17, 100, 100}, {33, 257, 300},
      {1, 33, 1},   {9, 1, 40},   {2, 0, 5},    {0, 8, 8},      {64, 64, 64},
  };
  for (const auto& level : Levels()) {
    for (int threads : {1, 2, 3, 4}) {
      auto backend = MakeBackend(level, threads);
      ASSERT_NE(backend, nullptr);
      EXPECT_EQ(backend->threads(), threads);
      std::mt19937_64 rng(23);
      for (const auto& s : shapes) {
        const auto x = Spread(rng, s.tokens * s.in);
        const auto w = Spread(rng, s.out * s.in);
        const auto bias = Spread(rng, s.out);
        for (bool with_bias : {false, true}) {
          std::vector<float> want(static_cast<size_t>(s.tokens * s.out));
          for (int64_t t = 0; t < s.tokens; ++t) {
            for (int64_t o = 0; o < s.out; ++o) {
              const float dot = CanonicalDot(x.data() + t * s.in, w.data() + o * s.in, s.in);
              want[static_cast<size_t>(t * s.out + o)] = with_bias ? bias[o] + dot : dot;
            }
          }
          // Poison the output so unwritten elements show up.
          std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
          backend->Matmul(x.data(), s.tokens, w.data(), with_bias ? bias.data() : nullptr, s.in,
                          s.out, got.data());
          ASSERT_TRUE(SameBits(want, got))
              << level << " threads=" << threads << " tokens=" << s.tokens << " in=" << s.in
              << " out=" << s.out << " bias=" << with_bias;
        }
      }
    }
  }
}

// bf16/f16 weights: MatmulTyped equals Matmul on the widened matrix, bit
// for bit, on every level and thread count (the CPU backend's blockwise
// widening), and so does the backend-independent default (KernelBackend's
// own MatmulTyped, which a backend without a fused path inherits).
class DefaultTypedBackend final : public KernelBackend {
 public:
  explicit DefaultTypedBackend(std::unique_ptr<KernelBackend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "default-typed"; }
  int threads() const override { return inner_->threads(); }
  ThreadPool& pool() override { return inner_->pool(); }
  float Dot(const float* a, const float* b, int64_t n) const override { return inner_->Dot(a, b, n); }
  void Matmul(const float* x, int64_t tokens, const float* w, const float* bias, int64_t in,
              int64_t out, float* y) override {
    inner_->Matmul(x, tokens, w, bias, in, out, y);
  }
  void AttentionScores(const float* q, const float* k, int64_t n, int64_t head_dim, float scale,
                       float* scores) const override {
    inner_->AttentionScores(q, k, n, head_dim, scale, scores);
  }
  void AccumulateValues(const float* p, const float* v, int64_t n, int64_t head_dim,
                        float* out) const override {
    inner_->AccumulateValues(p, v, n, head_dim, out);
  }

 private:
  std::unique_ptr<KernelBackend> inner_;
};

TEST(KernelsTest, MatmulTypedEqualsMatmulOnWidenedWeights) {
  const std::vector<MatmulShape> shapes = {
      {1, 1, 1}, {1, 7, 3}, {2, 15, 17}, {3, 16, 16}, {5, 17, 33}, {1, 64, 512}, {7, 64, 172},
      {4, 172, 64}, {33, 257, 300}, {1, 33, 1}, {9, 1, 40}, {2, 0, 5}, {0, 8, 8},
  };
  for (const auto& level : Levels()) {
    for (int threads : {1, 2}) {
      for (bool use_default : {false, true}) {
        std::unique_ptr<KernelBackend> backend = MakeBackend(level, threads);
        ASSERT_NE(backend, nullptr);
        if (use_default) backend = std::make_unique<DefaultTypedBackend>(std::move(backend));
        std::mt19937_64 rng(29);
        for (const auto& s : shapes) {
          const auto x = Spread(rng, s.tokens * s.in);
          const auto wf = Spread(rng, s.out * s.in);
          const auto bias = Spread(rng, s.out);
          for (Dtype dtype : {Dtype::kBf16, Dtype::kF16}) {
            std::vector<uint16_t> narrow(wf.size());
            std::vector<float> wide(wf.size());
            for (size_t i = 0; i < wf.size(); ++i) {
              narrow[i] = NarrowBits(wf[i], dtype);
              wide[i] = WidenBits(narrow[i], dtype);
            }
            for (bool with_bias : {false, true}) {
              const float* b = with_bias ? bias.data() : nullptr;
              std::vector<float> want(static_cast<size_t>(s.tokens * s.out), 0.0f);
              std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
              backend->Matmul(x.data(), s.tokens, wide.data(), b, s.in, s.out, want.data());
              backend->MatmulTyped(x.data(), s.tokens, narrow.data(), dtype, b, s.in, s.out,
                                   got.data());
              ASSERT_TRUE(SameBits(want, got))
                  << level << " threads=" << threads << " default=" << use_default
                  << " dtype=" << DtypeName(dtype) << " tokens=" << s.tokens << " in=" << s.in
                  << " out=" << s.out << " bias=" << with_bias;
            }
          }
        }
      }
    }
  }
}

// MatmulBlocks (the engine's row-parallel products as one call): every
// element of every block is the canonical Dot of that block's x row and
// weight row, for f32 and widened bf16/f16 weights, on every level and
// thread count, in the CPU backend's one-pass form (whose threads' runs of
// rows cross the blocks' boundaries) and the default loop.
TEST(KernelsTest, MatmulBlocksEqualsTheCanonicalDotOfEachBlock) {
  const std::vector<MatmulShape> shapes = {
      {1, 128, 64},  {9, 16, 33}, {5, 44, 100}, {33, 24, 17},
      {2, 0, 5},     {0, 8, 8},   {9, 352, 70}, {50, 16, 20},  // spans of 48 tokens
      {50, 256, 70},                                           // arranged (copied) x
      {9, 64, 500},  // runs split over threads and across block boundaries
  };
  std::vector<std::pair<std::string, std::unique_ptr<KernelBackend>>> backends;
  for (const auto& level : Levels()) {
    for (int threads : {1, 2, 3}) {
      for (bool use_default : {false, true}) {
        std::unique_ptr<KernelBackend> backend = MakeBackend(level, threads);
        ASSERT_NE(backend, nullptr);
        if (use_default) backend = std::make_unique<DefaultTypedBackend>(std::move(backend));
        backends.emplace_back(absl::StrCat(level, " threads=", threads, " default=", use_default),
                              std::move(backend));
      }
    }
  }
  std::mt19937_64 rng(31);
  for (const auto& s : shapes) {
    for (int64_t blocks : {1, 2, 8}) {
      const auto x = Spread(rng, blocks * s.tokens * s.in);
      const auto wf = Spread(rng, blocks * s.out * s.in);
      for (Dtype dtype : {Dtype::kF32, Dtype::kBf16, Dtype::kF16}) {
        std::vector<uint16_t> narrow(wf.size());
        std::vector<float> wide = wf;
        if (dtype != Dtype::kF32) {
          for (size_t i = 0; i < wf.size(); ++i) {
            narrow[i] = NarrowBits(wf[i], dtype);
            wide[i] = WidenBits(narrow[i], dtype);
          }
        }
        std::vector<float> want(static_cast<size_t>(blocks * s.tokens * s.out));
        for (int64_t b = 0; b < blocks; ++b) {
          for (int64_t t = 0; t < s.tokens; ++t) {
            for (int64_t o = 0; o < s.out; ++o) {
              want[static_cast<size_t>((b * s.tokens + t) * s.out + o)] = CanonicalDot(
                  x.data() + (b * s.tokens + t) * s.in, wide.data() + (b * s.out + o) * s.in, s.in);
            }
          }
        }
        const void* w = dtype == Dtype::kF32 ? static_cast<const void*>(wf.data())
                                             : static_cast<const void*>(narrow.data());
        for (const auto& [name, backend] : backends) {
          std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
          backend->MatmulBlocks(x.data(), s.tokens, w, dtype, blocks, s.in, s.out, got.data());
          ASSERT_TRUE(SameBits(want, got))
              << name << " dtype=" << DtypeName(dtype) << " blocks=" << blocks
              << " tokens=" << s.tokens << " in=" << s.in << " out=" << s.out;
        }
      }
    }
  }
}

TEST(KernelsTest, MatmulRowIsIndependentOfTokenCount) {
  // The batch-invariance property in its smallest form: row t of a
  // multi-token matmul equals the one-token matmul of that row.
  std::mt19937_64 rng(29);
  const int64_t in = 72, out = 90, tokens = 13;
  const auto x = Spread(rng, tokens * in), w = Spread(rng, out * in), bias = Spread(rng, out);
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 2);
    ASSERT_NE(backend, nullptr);
    std::vector<float> all(static_cast<size_t>(tokens * out));
    backend->Matmul(x.data(), tokens, w.data(), bias.data(), in, out, all.data());
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> one(static_cast<size_t>(out));
      backend->Matmul(x.data() + t * in, 1, w.data(), bias.data(), in, out, one.data());
      ASSERT_EQ(std::memcmp(one.data(), all.data() + t * out, out * sizeof(float)), 0)
          << level << " t=" << t;
    }
  }
}

TEST(KernelsTest, AttentionScoresMatchCanonicalRule) {
  std::mt19937_64 rng(31);
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    for (int64_t head_dim : {2, 8, 12, 16, 24, 32, 40, 64, 80, 128}) {
      for (int64_t n : {0, 1, 2, 5, 16, 31, 100}) {
        const auto q = Spread(rng, head_dim);
        const auto k = Spread(rng, n * head_dim);
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        std::vector<float> want(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) {
          want[static_cast<size_t>(j)] =
              CanonicalDot(q.data(), k.data() + j * head_dim, head_dim) * scale;
        }
        std::vector<float> got(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
        backend->AttentionScores(q.data(), k.data(), n, head_dim, scale, got.data());
        ASSERT_TRUE(SameBits(want, got)) << level << " head_dim=" << head_dim << " n=" << n;
      }
    }
  }
}

TEST(KernelsTest, AccumulateValuesMatchesSequentialFma) {
  std::mt19937_64 rng(37);
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    for (int64_t head_dim : {1, 2, 7, 8, 12, 15, 16, 17, 24, 33, 64, 100, 128}) {
      for (int64_t n : {0, 1, 2, 3, 17, 64, 101}) {
        const auto p = Spread(rng, n);
        const auto v = Spread(rng, n * head_dim);
        const auto init = Spread(rng, head_dim);
        std::vector<float> want = init;
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t d = 0; d < head_dim; ++d) {
            want[static_cast<size_t>(d)] =
                std::fma(p[static_cast<size_t>(j)], v[static_cast<size_t>(j * head_dim + d)],
                         want[static_cast<size_t>(d)]);
          }
        }
        std::vector<float> got = init;
        backend->AccumulateValues(p.data(), v.data(), n, head_dim, got.data());
        ASSERT_TRUE(SameBits(want, got)) << level << " head_dim=" << head_dim << " n=" << n;
      }
    }
  }
}

// A verify pass of T tokens must equal T one-token steps bit for bit: row t
// of a T-token Matmul equals the 1-token Matmul of row t, for every T a pass
// can have (1..33) and past one span of tokens (48 + 2), every level and
// thread count, and widths that take the kernels' different paths (tails,
// the packed copy of x at multiples of 512, rows shorter and longer than
// the AVX-512 tiles' L1 prefetch distance of 192).
TEST(KernelsTest, MatmulOfTTokensEqualsTOneTokenMatmuls) {
  constexpr int64_t kMaxTokens = 50;
  std::mt19937_64 rng(41);
  for (const auto& level : Levels()) {
    for (int threads : {1, 2, 3}) {
      auto backend = MakeBackend(level, threads);
      ASSERT_NE(backend, nullptr);
      for (const auto& [in, out] :
           {std::pair<int64_t, int64_t>{64, 37}, {100, 20}, {512, 24}, {200, 9}, {417, 13}}) {
        const auto x = Spread(rng, kMaxTokens * in), w = Spread(rng, out * in),
                   bias = Spread(rng, out);
        std::vector<float> one(static_cast<size_t>(kMaxTokens * out));
        for (int64_t t = 0; t < kMaxTokens; ++t) {
          backend->Matmul(x.data() + t * in, 1, w.data(), bias.data(), in, out,
                          one.data() + t * out);
        }
        for (int64_t tokens = 1; tokens <= kMaxTokens; ++tokens) {
          std::vector<float> all(static_cast<size_t>(tokens * out),
                                 std::numeric_limits<float>::quiet_NaN());
          backend->Matmul(x.data(), tokens, w.data(), bias.data(), in, out, all.data());
          ASSERT_EQ(std::memcmp(all.data(), one.data(), all.size() * sizeof(float)), 0)
              << level << " threads=" << threads << " tokens=" << tokens << " in=" << in;
        }
      }
    }
  }
}

// Where the weights and activations start must not matter: the engine's
// weight rows usually begin part-way into a cache line (std::vector storage,
// tensors after a file header), and so may its activations, which the AVX-512
// path then copies to aligned rows when enough weight rows follow (64 here,
// one call with 1 thread). Every offset of w and x within a 64-byte line
// gives the canonical values, for a 1-token and a multi-token product, with
// rows of a multiple of 16 elements (all rows share the offset) and not.
TEST(KernelsTest, MatmulIsTheSameAtEveryAlignment) {
  std::mt19937_64 rng(43);
  constexpr int64_t kTokens = 9, kOut = 80;
  for (const auto& level : Levels()) {
    for (int threads : {1, 2}) {
      auto backend = MakeBackend(level, threads);
      ASSERT_NE(backend, nullptr);
      for (int64_t in : {256, 264}) {
        const auto x0 = Spread(rng, kTokens * in), w0 = Spread(rng, kOut * in);
        std::vector<float> want(static_cast<size_t>(kTokens * kOut));
        for (int64_t t = 0; t < kTokens; ++t) {
          for (int64_t o = 0; o < kOut; ++o) {
            want[static_cast<size_t>(t * kOut + o)] =
                CanonicalDot(x0.data() + t * in, w0.data() + o * in, in);
          }
        }
        // 64-byte-aligned storage with room for 16 floats of offset.
        std::vector<float> xbuf(x0.size() + 32), wbuf(w0.size() + 32);
        auto line = [](std::vector<float>& v) {
          const auto addr = reinterpret_cast<uintptr_t>(v.data());
          return v.data() + (64 - addr % 64) % 64 / sizeof(float);
        };
        for (int offset = 0; offset < 16; ++offset) {
          float* x = line(xbuf) + (offset * 7) % 16;
          float* w = line(wbuf) + offset;
          std::copy(x0.begin(), x0.end(), x);
          std::copy(w0.begin(), w0.end(), w);
          for (int64_t tokens : {int64_t{1}, kTokens}) {
            std::vector<float> got(static_cast<size_t>(tokens * kOut),
                                   std::numeric_limits<float>::quiet_NaN());
            backend->Matmul(x, tokens, w, nullptr, in, kOut, got.data());
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << level << " threads=" << threads << " in=" << in << " offset=" << offset
                << " tokens=" << tokens;
          }
        }
      }
    }
  }
}

// The multi-query attention primitives of head-major attention: each query's
// scores, softmax and value sums equal the single-query primitives' bit for
// bit, whatever the number of queries (value sums in near-equal groups of up
// to 6 rows, softmax in groups of 8 rows and a remainder), keys (scores in
// 8-key tiles with a prefetch 16 keys ahead, and a remainder) and head dims
// (scores kernels for multiples of 16 up to 128, the matmul path otherwise).
TEST(KernelsTest, MultiQueryAttentionPrimitivesEqualSingleQueryOnes) {
  std::mt19937_64 rng(43);
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    for (int64_t head_dim : {8, 12, 16, 32, 64, 96, 100, 128, 130, 144}) {
      for (int64_t nq : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 19, 33}) {
        for (int64_t n : {1, 5, 8, 16, 37, 64}) {
          SCOPED_TRACE(::testing::Message()
                       << level << " head_dim=" << head_dim << " nq=" << nq << " n=" << n);
          const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
          const auto q = Spread(rng, nq * head_dim), k = Spread(rng, n * head_dim);
          const int64_t ld = n + 3;
          std::vector<float> got(static_cast<size_t>(nq * ld), -1.0f), want = got;
          // The rows read next, more or fewer than n of them: a hint that
          // must not change a value.
          const int64_t ahead_count = nq % 2 == 0 ? n + 3 : n / 2;
          const auto ahead_rows = Spread(rng, ahead_count * head_dim);
          const RowsAhead ahead{.rows = ahead_rows.data(), .count = ahead_count};
          backend->AttentionScoresMulti(q.data(), nq, k.data(), n, head_dim, scale, got.data(), ld,
                                        ahead);
          for (int64_t t = 0; t < nq; ++t) {
            backend->AttentionScores(q.data() + t * head_dim, k.data(), n, head_dim, scale,
                                     want.data() + t * ld);
          }
          ASSERT_TRUE(SameBits(want, got)) << "scores";

          // Softmax over rows of different lengths (a causal pass's rows).
          std::vector<float*> rows(static_cast<size_t>(nq));
          std::vector<int64_t> lens(static_cast<size_t>(nq));
          for (int64_t t = 0; t < nq; ++t) {
            rows[t] = got.data() + t * ld;
            lens[t] = std::max<int64_t>(0, n - (t * 7) % 4);
          }
          backend->SoftmaxRows(rows.data(), lens.data(), nq);
          for (int64_t t = 0; t < nq; ++t) backend->Softmax(want.data() + t * ld, lens[t]);
          ASSERT_TRUE(SameBits(want, got)) << "softmax";

          const auto v = Spread(rng, n * head_dim), init = Spread(rng, nq * head_dim);
          std::vector<float> out_got = init, out_want = init;
          backend->AccumulateValuesMulti(got.data(), ld, nq, v.data(), n, head_dim, out_got.data(),
                                         ahead);
          for (int64_t t = 0; t < nq; ++t) {
            backend->AccumulateValues(want.data() + t * ld, v.data(), n, head_dim,
                                      out_want.data() + t * head_dim);
          }
          ASSERT_TRUE(SameBits(out_want, out_got)) << "values";
        }
      }
    }
  }
}

// ---- Exp / Silu ------------------------------------------------------------

// Distance in units in the last place between two positive finite floats.
int64_t UlpDistance(float a, float b) {
  const int64_t ia = std::bit_cast<int32_t>(a), ib = std::bit_cast<int32_t>(b);
  return ia > ib ? ia - ib : ib - ia;
}

TEST(KernelsTest, ExpIsAccurateOverTheNormalRange) {
  // Inputs whose result is a normal float: [-87.3, 88.72].
  int64_t max_ulp = 0;
  float worst_x = 0.0f;
  int64_t count = 0;
  for (float x = -87.3f; x <= 88.72f; x += 0.00731f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float got = Exp(x);
    ASSERT_FALSE(std::isnan(got)) << x;
    const int64_t ulp = UlpDistance(want, got);
    if (ulp > max_ulp) {
      max_ulp = ulp;
      worst_x = x;
    }
    ++count;
  }
  // Also every float in [-1, 1] at a finer stride, where softmax lives.
  for (float x = -1.0f; x <= 1.0f; x = std::nextafter(x, 2.0f) + 1e-6f) {
    const int64_t ulp = UlpDistance(static_cast<float>(std::exp(static_cast<double>(x))), Exp(x));
    if (ulp > max_ulp) {
      max_ulp = ulp;
      worst_x = x;
    }
    ++count;
  }
  std::cout << "Exp: " << count << " points, max error " << max_ulp << " ulp at x=" << worst_x
            << "\n";
  EXPECT_LE(max_ulp, 3);
}

TEST(KernelsTest, ExpEdgeCases) {
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-0.0f), 1.0f);
  EXPECT_EQ(Exp(-104.0f), 0.0f);
  EXPECT_EQ(Exp(-1000.0f), 0.0f);
  EXPECT_EQ(Exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(Exp(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Exp(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Exp(std::numeric_limits<float>::quiet_NaN())));
  // The subnormal tail is finite, non-negative, non-increasing toward -inf
  // and close to the true value in absolute terms.
  float prev = Exp(-87.0f);
  for (float x = -87.0f; x >= -110.0f; x -= 0.01f) {
    const float y = Exp(x);
    ASSERT_FALSE(std::isnan(y)) << x;
    ASSERT_GE(y, 0.0f) << x;
    ASSERT_LE(y, prev * 1.0001f + 1e-45f) << x;
    ASSERT_NEAR(y, std::exp(static_cast<double>(x)),
                4e-45 + 4e-7 * std::exp(static_cast<double>(x)))
        << x;
    prev = y;
  }
  // exp(1) and exp(-1) to within an ulp or two.
  EXPECT_LE(UlpDistance(Exp(1.0f), static_cast<float>(std::exp(1.0))), 2);
  EXPECT_LE(UlpDistance(Exp(-1.0f), static_cast<float>(std::exp(-1.0))), 2);
}

TEST(KernelsTest, SiluIsXTimesSigmoid) {
  double max_rel = 0.0;
  for (float x = -30.0f; x <= 30.0f; x += 0.0137f) {
    const double want = x / (1.0 + std::exp(-static_cast<double>(x)));
    const float got = Silu(x);
    ASSERT_FALSE(std::isnan(got)) << x;
    if (std::fabs(want) > 1e-30)
      max_rel = std::max(max_rel, std::fabs(got - want) / std::fabs(want));
  }
  std::cout << "Silu max relative error " << max_rel << "\n";
  EXPECT_LT(max_rel, 1e-6);
  EXPECT_EQ(Silu(0.0f), 0.0f);
  EXPECT_EQ(Silu(-200.0f), -0.0f);  // x / inf
  EXPECT_EQ(Silu(200.0f), 200.0f);
}

// ---- Options and registry --------------------------------------------------

TEST(KernelsTest, ParseSimdLevel) {
  auto bad = ParseSimdLevel("avx9");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSimdLevel("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSimdLevel("AVX2x").status().code(), absl::StatusCode::kInvalidArgument);

  auto scalar = ParseSimdLevel("scalar");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(*scalar, SimdLevel::kScalar);

  auto automatic = ParseSimdLevel("auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(*automatic, DetectSimdLevel());

  // A level above the detected one is rejected; levels at or below accepted.
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    auto parsed = ParseSimdLevel(SimdLevelName(level));
    if (static_cast<int>(level) <= static_cast<int>(DetectSimdLevel())) {
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, level);
    } else {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(KernelsTest, BackendNamesItsLevel) {
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    EXPECT_EQ(backend->name(), "cpu/" + level);
  }
}

TEST(KernelsTest, CreateBackendRejectsUnknownNames) {
  BackendOptions options;
  options.name = "no-such-backend";
  auto backend = CreateBackend(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);

  options.name = "cpu";
  options.simd = "avx9";
  backend = CreateBackend(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);

  bool has_cpu = false;
  for (const auto& name : RegisteredBackends()) has_cpu |= name == "cpu";
  EXPECT_TRUE(has_cpu);
}

// The backends vectorise softmax's exps; they must reproduce kernels::Exp and
// kernels::Softmax bit for bit, including the ranges where Exp saturates,
// goes subnormal or sees NaN.
TEST(KernelsTest, BackendSoftmaxEqualsReferenceOnEveryLevel) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> u(-120.0f, 5.0f);
  for (const auto& level : Levels()) {
    auto be = MakeBackend(level, 1);
    for (int64_t n : {1, 2, 7, 8, 15, 16, 17, 33, 100, 513}) {
      std::vector<float> s(static_cast<size_t>(n));
      for (float& x : s) x = u(rng);
      std::vector<float> ref = s;
      Softmax(ref.data(), n);
      be->Softmax(s.data(), n);
      EXPECT_TRUE(SameBits(s, ref)) << level << " n=" << n;
    }
    // Exp across every regime, through softmax's input domain and beyond:
    // n = 1 makes the result Exp(0) = 1, so probe Exp via scores whose max is
    // a chosen value: s = {x, 0} -> exps {Exp(x), 1}.
    for (float x : {-200.0f, -103.5f, -103.0f, -100.0f, -90.0f, -87.5f, -87.3f, -50.0f, -1e-30f,
                    0.0f, -0.0f, -1.0f, -0.5f, -88.0f, -87.33654f, -87.0f}) {
      std::vector<float> s = {x, 0.0f}, ref = s;
      Softmax(ref.data(), 2);
      be->Softmax(s.data(), 2);
      EXPECT_TRUE(SameBits(s, ref)) << level << " x=" << x;
    }
  }
}

// The vector Exps take a short path when every lane of a vector lies in
// [-87, 88]: around both ends, with vectors whose lanes are all inside, all
// outside or mixed, softmax (inputs <= 0) and SwiGLU (Exp(-g), inputs of
// both signs) must still equal the scalar definition bit for bit.
TEST(KernelsTest, VectorExpAroundItsShortPathBoundsEqualsTheReference) {
  std::vector<float> xs;
  for (float x = -89.0f; x <= -85.0f; x += 0.00071f) xs.push_back(x);
  for (float x = -87.0f; x >= -87.01f; x = std::nextafter(x, -100.0f)) xs.push_back(x);
  for (float x = -87.0f; x <= -86.99f; x = std::nextafter(x, 0.0f)) xs.push_back(x);
  std::vector<float> g;  // SwiGLU gates: Exp(-g) around +88 and -87
  for (float x = -89.0f; x <= -86.0f; x += 0.00071f) g.push_back(x);
  for (float x = 86.0f; x <= 89.0f; x += 0.00071f) g.push_back(x);
  for (float x = -88.0f; x <= -87.99f; x = std::nextafter(x, 0.0f)) g.push_back(x);
  for (const auto& level : Levels()) {
    auto be = MakeBackend(level, 1);
    ASSERT_NE(be, nullptr);
    // Rows of 40 scores ending in 0 (the max): exps of the 39 others as given.
    for (size_t at = 0; at + 39 <= xs.size(); at += 13) {
      std::vector<float> s(xs.begin() + static_cast<std::ptrdiff_t>(at),
                           xs.begin() + static_cast<std::ptrdiff_t>(at + 39));
      s.push_back(0.0f);
      std::vector<float> ref = s;
      Softmax(ref.data(), static_cast<int64_t>(ref.size()));
      be->Softmax(s.data(), static_cast<int64_t>(s.size()));
      ASSERT_TRUE(SameBits(s, ref)) << level << " from x=" << xs[at];
    }
    std::vector<float> gate = g, up(g.size(), 1.5f), want(g.size());
    for (size_t i = 0; i < g.size(); ++i) want[i] = Silu(g[i]) * up[i];
    be->SwiGlu(gate.data(), up.data(), static_cast<int64_t>(gate.size()));
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(SameBits(gate[i], want[i])) << level << " g=" << g[i];
    }
  }
}

// SoftmaxRows exponentiates and sums a group's rows block by block over
// their common length, then each row's tail: rows of unequal lengths across
// several blocks, in groups of every size, equal Softmax on each row alone.
TEST(KernelsTest, SoftmaxRowsOverLongUnequalRowsEqualsSoftmaxAlone) {
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> u(-30.0f, 4.0f);
  for (const auto& level : Levels()) {
    auto be = MakeBackend(level, 1);
    ASSERT_NE(be, nullptr);
    for (int64_t count : {1, 3, 9, 16, 17, 33}) {
      std::vector<std::vector<float>> rows(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        // Causal rows (one key more each) around block edges, an empty row
        // and a short one among them.
        const int64_t n = i == 2 ? 0 : i == 4 ? 5 : 1021 + i * (i % 3 == 0 ? 1 : 37);
        rows[i].resize(static_cast<size_t>(n));
        for (float& x : rows[i]) x = u(rng);
      }
      std::vector<std::vector<float>> got = rows;
      SoftmaxRowsInPlace(*be, &got);
      for (int64_t i = 0; i < count; ++i) {
        // The definition written out: max, Exp of the shifted scores, their
        // sum in key order, then times its reciprocal.
        std::vector<float> ref = rows[i];
        if (!ref.empty()) {
          float m = ref[0], sum = 0.0f;
          for (float x : ref) m = std::max(m, x);
          for (float& x : ref) x = Exp(x - m);
          for (float x : ref) sum += x;
          const float inv = 1.0f / sum;
          for (float& x : ref) x *= inv;
        }
        ASSERT_TRUE(SameBits(got[i], ref)) << level << " count=" << count << " row " << i;
      }
    }
  }
}

// SwiGLU's elementwise step with the levels' vectorised Exp: bit for bit the
// scalar Silu(g) * u, across the ranges where Exp saturates, goes subnormal
// or sees NaN and infinities, at lengths around the backend's block of 256,
// on one thread and split over two (16 blocks and more).
TEST(KernelsTest, BackendSwiGluEqualsSiluTimesUpOnEveryLevel) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {0.0f,   -0.0f,   nan,    -nan,    inf,    -inf,
                                       88.0f,  89.0f,   -88.0f, -89.0f,  103.0f, -103.0f,
                                       104.0f, -104.0f, 200.0f, -200.0f, 1e-30f, -1e-30f,
                                       1e-45f, -1e-45f, 3e38f,  -3e38f,  0.5f,   -0.5f};
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f);
  for (const auto& level : Levels()) {
    for (const int threads : {1, 2}) {
      auto be = MakeBackend(level, threads);
      ASSERT_NE(be, nullptr);
      for (int64_t n : {0, 1, 15, 16, 17, 255, 256, 257, 600, 4095, 4096, 4097, 9000}) {
        std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          g[i] = i < static_cast<int64_t>(specials.size()) && n >= 255 ? specials[i] : wide(rng);
          u[i] = i % 7 == 3 ? specials[i % specials.size()] : wide(rng) / 8.0f;
        }
        std::vector<float> want(g.size());
        for (int64_t i = 0; i < n; ++i) want[i] = Silu(g[i]) * u[i];
        be->SwiGlu(g.data(), u.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const bool both_nan = std::isnan(g[i]) && std::isnan(want[i]);
          EXPECT_TRUE(both_nan || SameBits(g[i], want[i]))
              << level << " threads=" << threads << " n=" << n << " i=" << i << ": " << g[i]
              << " vs " << want[i];
        }
      }
    }
  }
}

// The vector max of the SIMD levels (any order: the same value up to the
// sign of a zero, which changes no result; a NaN sends the row to the
// sequential chain) against the scalar definition, on rows with NaNs in
// every position, infinities and signed zeros, alone and as SoftmaxRows.
TEST(KernelsTest, SoftmaxWithNaNsInfinitiesAndSignedZerosEqualsTheReference) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> cases = {
      {-0.0f, 0.0f, -0.0f},
      {0.0f, -0.0f},
      {-0.0f, -1.0f, 0.0f, -2.0f},
      {-inf, -inf, -inf},
      {inf, 1.0f, 2.0f},
      {1.0f, -inf, 3.0f},
      {-0.0f, -0.0f, -0.0f, 0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f,
       -0.0f, -0.0f, -0.0f, 0.0f, -0.0f}};
  for (int64_t n : {1, 2, 16, 17, 40}) {
    for (int64_t at = 0; at < n; at += std::max<int64_t>(1, n / 5)) {
      std::vector<float> row(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) row[j] = static_cast<float>((j * 7) % 11) - 5.0f;
      row[at] = nan;
      cases.push_back(row);
      row[at] = -nan;  // the other sign's payload
      cases.push_back(row);
    }
  }
  for (const auto& level : Levels()) {
    auto be = MakeBackend(level, 1);
    ASSERT_NE(be, nullptr);
    std::vector<std::vector<float>> got = cases;
    SoftmaxRowsInPlace(*be, &got);
    for (size_t i = 0; i < cases.size(); ++i) {
      std::vector<float> ref = cases[i], one = cases[i];
      Softmax(ref.data(), static_cast<int64_t>(ref.size()));
      be->Softmax(one.data(), static_cast<int64_t>(one.size()));
      EXPECT_TRUE(SameBits(one, ref)) << level << " case " << i << " (Softmax)";
      EXPECT_TRUE(SameBits(got[i], ref)) << level << " case " << i << " (SoftmaxRows)";
    }
  }
}

TEST(KernelsTest, RmsNormAndSoftmaxFollowTheirFormulas) {
  std::mt19937_64 rng(41);
  for (const auto& level : Levels()) {
    auto backend = MakeBackend(level, 1);
    ASSERT_NE(backend, nullptr);
    for (int64_t n : {1, 8, 17, 64, 100}) {
      const auto x = Spread(rng, n), g = Spread(rng, n);
      const float eps = 1e-5f;
      const float r =
          1.0f / std::sqrt(CanonicalDot(x.data(), x.data(), n) / static_cast<float>(n) + eps);
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want[i] = g[i] * (x[i] * r);
      RmsNorm(*backend, x.data(), g.data(), n, eps, got.data());
      ASSERT_TRUE(SameBits(want, got)) << level << " n=" << n;
    }
  }
  for (int64_t n : {1, 2, 9, 100}) {
    std::vector<float> s = Spread(rng, n);
    std::vector<float> want = s;
    float m = want[0];
    for (float v : want) m = std::max(m, v);
    float sum = 0.0f;
    for (float& v : want) {
      v = Exp(v - m);
      sum += v;
    }
    const float inv = 1.0f / sum;
    for (float& v : want) v *= inv;
    Softmax(s.data(), n);
    ASSERT_TRUE(SameBits(want, s)) << "n=" << n;
  }
}

}  // namespace
}  // namespace vc::kernels
