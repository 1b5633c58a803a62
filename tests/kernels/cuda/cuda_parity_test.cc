// The CUDA backend against the CPU oracle (the scalar path): every primitive
// must agree bit for bit (memcmp) on random inputs, and on special values up
// to NaN payloads (CUDA produces the canonical NaN, x86 its default NaN).
// Without a GPU every parity test skips; the factory test then checks that
// asking for "cuda" is a clean FailedPrecondition.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/internal/cuda_kernels.h"
#include "kernels/kernels.h"

namespace vc::kernels {
namespace {

using ::testing::HasSubstr;

// Values spread over many binades with both signs, so that any other
// summation order gives a different float with high probability.
std::vector<float> Spread(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-12, 12);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
  return v;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Exact equality, except that any two NaNs are equal.
bool SameValueBits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return Bits(a) == Bits(b);
}

// memcmp, with the first difference spelled out when there is one.
::testing::AssertionResult SameBits(const std::vector<float>& want, const std::vector<float>& got) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure() << "sizes " << want.size() << " vs " << got.size();
  }
  if (want.empty() || std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) {
    return ::testing::AssertionSuccess();
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (Bits(want[i]) != Bits(got[i])) {
      std::ostringstream os;
      os << "first difference at " << i << ": cpu " << want[i] << " (0x" << std::hex
         << Bits(want[i]) << ") cuda " << std::dec << got[i] << " (0x" << std::hex << Bits(got[i])
         << ")";
      return ::testing::AssertionFailure() << os.str();
    }
  }
  return ::testing::AssertionFailure() << "memcmp differs";  // unreachable
}

std::unique_ptr<KernelBackend> MakeCpu() {
  BackendOptions options;
  options.name = "cpu";
  options.threads = 1;
  options.simd = "scalar";
  auto backend = CreateBackend(options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

TEST(CudaBackendTest, IsRegistered) {
  const std::vector<std::string> names = RegisteredBackends();
  EXPECT_THAT(names, ::testing::Contains("cuda"));
  EXPECT_THAT(names, ::testing::Contains("cpu"));
}

TEST(CudaBackendTest, NoDeviceIsFailedPrecondition) {
  BackendOptions options;
  options.name = "cuda";
  auto backend = CreateBackend(options);
  if (backend.ok()) {
    GTEST_SKIP() << "a CUDA device is present (" << (*backend)->name() << ")";
  }
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("no CUDA device"));
  // A failed factory leaves the registry usable.
  EXPECT_NE(MakeCpu(), nullptr);
}

class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.name = "cuda";
    auto backend = CreateBackend(options);
    if (!backend.ok()) {
      if (backend.status().code() == absl::StatusCode::kFailedPrecondition) {
        GTEST_SKIP() << backend.status();
      }
      FAIL() << "creating the CUDA backend: " << backend.status();
    }
    cuda_ = std::move(*backend);
    cpu_ = MakeCpu();
    ASSERT_NE(cpu_, nullptr);
  }

  std::unique_ptr<KernelBackend> cuda_;
  std::unique_ptr<KernelBackend> cpu_;
};

TEST_F(CudaParityTest, NameAndThreads) {
  EXPECT_EQ(cuda_->name().rfind("cuda/", 0), 0u) << cuda_->name();
  EXPECT_GT(cuda_->name().size(), 5u);
  EXPECT_EQ(cuda_->threads(), 1);
  EXPECT_EQ(cuda_->pool().num_threads(), 1);
  std::cout << "CUDA backend: " << cuda_->name() << "\n";
}

TEST_F(CudaParityTest, Dot) {
  std::mt19937_64 rng(11);
  for (int64_t n = 0; n <= 100; ++n) {
    for (int rep = 0; rep < 4; ++rep) {
      const int64_t off = rep % 3;  // unaligned starts
      const auto a = Spread(rng, n + off), b = Spread(rng, n + off);
      const float want = cpu_->Dot(a.data() + off, b.data() + off, n);
      const float got = cuda_->Dot(a.data() + off, b.data() + off, n);
      ASSERT_EQ(Bits(want), Bits(got)) << "n=" << n << " want=" << want << " got=" << got;
    }
  }
  for (int64_t n : {127, 128, 129, 255, 256, 257, 1000, 1024, 4097, 100003}) {
    const auto a = Spread(rng, n), b = Spread(rng, n);
    ASSERT_EQ(Bits(cpu_->Dot(a.data(), b.data(), n)), Bits(cuda_->Dot(a.data(), b.data(), n)))
        << "n=" << n;
  }
  const float dummy = 1.0f;
  EXPECT_EQ(Bits(cuda_->Dot(&dummy, &dummy, 0)), Bits(0.0f));
}

TEST_F(CudaParityTest, DotSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<std::pair<std::vector<float>, std::vector<float>>> cases;
  {  // cancellation of huge products, signed zeros
    std::vector<float> a(37, 0.0f), b(37, 0.0f);
    a[0] = 1e30f, b[0] = 1e8f, a[16] = -1e30f, b[16] = 1e8f;
    a[5] = -0.0f, b[5] = 3.0f, a[36] = 2.5f, b[36] = -4.0f;
    cases.emplace_back(a, b);
  }
  cases.emplace_back(std::vector<float>(33, -0.0f), std::vector<float>(33, 1.0f));
  cases.emplace_back(std::vector<float>(16, -0.0f), std::vector<float>(16, 1.0f));
  {  // infinities and inf * 0 = NaN
    std::vector<float> a(20, 1.0f), b(20, 1.0f);
    a[3] = inf;
    a[19] = inf;
    b[19] = 0.0f;
    cases.emplace_back(a, b);
    a[19] = 1.0f;
    cases.emplace_back(a, b);
  }
  {  // subnormal products and sums: nothing may be flushed to zero
    std::vector<float> a(45), b(45);
    for (int i = 0; i < 45; ++i) {
      a[i] = std::ldexp(1.0f + static_cast<float>(i) / 64.0f, -70 - i % 7);
      b[i] = std::ldexp(i % 2 == 0 ? 1.5f : -1.25f, -60 - i % 5);
    }
    cases.emplace_back(a, b);
    cases.emplace_back(std::vector<float>(19, tiny), std::vector<float>(19, 1.0f));
    cases.emplace_back(std::vector<float>(19, tiny), std::vector<float>(19, 0.5f));
  }
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& [a, b] = cases[c];
    const int64_t n = static_cast<int64_t>(a.size());
    const float want = cpu_->Dot(a.data(), b.data(), n);
    const float got = cuda_->Dot(a.data(), b.data(), n);
    EXPECT_TRUE(SameValueBits(want, got))
        << "case " << c << " want=" << want << " (0x" << std::hex << Bits(want) << ") got=" << got
        << " (0x" << Bits(got) << ")";
  }
}

struct MatmulShape {
  int64_t in, out;
};

void ExpectMatmulParity(KernelBackend& cpu, KernelBackend& cuda, std::mt19937_64& rng,
                        int64_t tokens, int64_t in, int64_t out) {
  const auto x = Spread(rng, tokens * in);
  const auto w = Spread(rng, out * in);
  const auto bias = Spread(rng, out);
  for (bool with_bias : {false, true}) {
    const float* b = with_bias ? bias.data() : nullptr;
    std::vector<float> want(static_cast<size_t>(tokens * out), -1.0f);
    std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
    cpu.Matmul(x.data(), tokens, w.data(), b, in, out, want.data());
    cuda.Matmul(x.data(), tokens, w.data(), b, in, out, got.data());
    ASSERT_TRUE(SameBits(want, got))
        << "tokens=" << tokens << " in=" << in << " out=" << out << " bias=" << with_bias;
  }
}

TEST_F(CudaParityTest, MatmulOddShapesAndTokenCounts) {
  const std::vector<MatmulShape> shapes = {
      {1, 1}, {7, 3}, {15, 17}, {16, 16}, {17, 33}, {33, 1}, {64, 9}, {100, 100}, {257, 65},
  };
  std::mt19937_64 rng(23);
  for (int64_t tokens = 1; tokens <= 40; ++tokens) {
    for (const auto& s : shapes) {
      ASSERT_NO_FATAL_FAILURE(ExpectMatmulParity(*cpu_, *cuda_, rng, tokens, s.in, s.out));
    }
  }
}

TEST_F(CudaParityTest, MatmulModelSizedShapes) {
  std::mt19937_64 rng(29);
  // Projection-, MLP- and classifier-like shapes (the last one spans many
  // blocks), and degenerate ones.
  const struct {
    int64_t tokens, in, out;
  } shapes[] = {
      {1, 288, 288},  {7, 288, 768}, {5, 768, 288}, {1, 288, 32000},
      {3, 4096, 300}, {64, 64, 64},  {2, 0, 5},     {9, 1, 40},
  };
  for (const auto& s : shapes) {
    ASSERT_NO_FATAL_FAILURE(ExpectMatmulParity(*cpu_, *cuda_, rng, s.tokens, s.in, s.out));
  }
  // No tokens or no outputs: nothing is written.
  std::vector<float> y(4, 5.0f);
  const float one = 1.0f;
  cuda_->Matmul(&one, 0, &one, nullptr, 1, 1, y.data());
  cuda_->Matmul(&one, 1, &one, nullptr, 1, 0, y.data());
  EXPECT_EQ(y, std::vector<float>(4, 5.0f));
}

TEST_F(CudaParityTest, MatmulRowIsIndependentOfTokenCount) {
  std::mt19937_64 rng(31);
  const int64_t in = 72, out = 90, tokens = 13;
  const auto x = Spread(rng, tokens * in), w = Spread(rng, out * in), bias = Spread(rng, out);
  std::vector<float> all(static_cast<size_t>(tokens * out));
  cuda_->Matmul(x.data(), tokens, w.data(), bias.data(), in, out, all.data());
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> one(static_cast<size_t>(out));
    cuda_->Matmul(x.data() + t * in, 1, w.data(), bias.data(), in, out, one.data());
    ASSERT_EQ(std::memcmp(one.data(), all.data() + t * out, out * sizeof(float)), 0) << "t=" << t;
  }
}

TEST_F(CudaParityTest, MatmulSeesWeightsChangedAtTheSameAddress) {
  // The backend keeps device copies of weights; a changed or reallocated
  // host array must never be served from a stale copy.
  std::mt19937_64 rng(37);
  const int64_t tokens = 3, in = 50, out = 21;
  const auto x = Spread(rng, tokens * in);
  std::vector<float> w = Spread(rng, out * in);
  for (int round = 0; round < 4; ++round) {
    std::vector<float> want(static_cast<size_t>(tokens * out)), got(want.size());
    for (int again = 0; again < 2; ++again) {  // the second call hits the cache
      cpu_->Matmul(x.data(), tokens, w.data(), nullptr, in, out, want.data());
      cuda_->Matmul(x.data(), tokens, w.data(), nullptr, in, out, got.data());
      ASSERT_TRUE(SameBits(want, got)) << "round " << round << " call " << again;
    }
    // Change one element in place (same address, same size).
    w[static_cast<size_t>(round * 97 % (out * in))] += 1.0f;
  }
  // Free and allocate arrays of the same size many times: the allocator
  // often hands back the same address with new contents.
  for (int round = 0; round < 8; ++round) {
    const std::vector<float> w2 = Spread(rng, out * in);
    std::vector<float> want(static_cast<size_t>(tokens * out)), got(want.size());
    cpu_->Matmul(x.data(), tokens, w2.data(), nullptr, in, out, want.data());
    cuda_->Matmul(x.data(), tokens, w2.data(), nullptr, in, out, got.data());
    ASSERT_TRUE(SameBits(want, got)) << "reallocated round " << round;
  }
}

// A device array for the launcher-level test below (the backend's own
// buffers are private).
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(size_, 1) * sizeof(float)), cudaSuccess);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(p_, host.data(), size_ * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ~DeviceFloats() { (void)cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* Ptr() const { return p_; }
  std::vector<float> ToHost() const {
    std::vector<float> host(size_);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), p_, size_ * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }

 private:
  float* p_ = nullptr;
  size_t size_;
};

// The backend uses one tiling per token count (cuda::DefaultDotRowsTiling);
// the bench sweeps them all. Every one must give the CPU's bits, including
// row counts that leave a half-warp's last rows empty and token counts that
// split into unequal tiles.
TEST_F(CudaParityTest, EveryDotRowsTilingGivesTheCpuBits) {
  std::mt19937_64 rng(39);
  const MatmulShape shapes[] = {{1, 1},   {4, 5},    {15, 17},  {16, 3},    {33, 9},
                                {64, 40}, {100, 37}, {257, 65}, {288, 300}, {1024, 24}};
  for (int64_t tokens : {1, 2, 3, 5, 8, 9, 16, 17, 33}) {
    for (const auto& s : shapes) {
      const auto x = Spread(rng, tokens * s.in), w = Spread(rng, s.out * s.in),
                 bias = Spread(rng, s.out);
      std::vector<float> want(static_cast<size_t>(tokens * s.out));
      cpu_->Matmul(x.data(), tokens, w.data(), bias.data(), s.in, s.out, want.data());
      const DeviceFloats dx(x), dw(w), db(bias);
      for (int k = 0; k < cuda::DotRowsTilingCount(); ++k) {
        const cuda::DotRowsTiling tiling = cuda::DotRowsTilingAt(k);
        const DeviceFloats dy(std::vector<float>(want.size(), -7.0f));
        ASSERT_EQ(cuda::LaunchDotRowsTiled(tiling, dx.Ptr(), tokens, dw.Ptr(), db.Ptr(), s.in,
                                           s.out, /*scaled=*/false, 1.0f, dy.Ptr(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(SameBits(want, dy.ToHost()))
            << "tiling " << tiling.rows << "x" << tiling.tokens << "/" << tiling.loads << ", "
            << tokens << " tokens, " << s.in << " -> " << s.out;
      }
    }
  }
  // A tiling without a kernel is refused, not launched.
  EXPECT_EQ(cuda::LaunchDotRowsTiled({3, 3, 16}, nullptr, 1, nullptr, nullptr, 1, 1, false, 1.0f,
                                     nullptr, nullptr),
            cudaErrorInvalidValue);
}

TEST_F(CudaParityTest, AttentionScores) {
  std::mt19937_64 rng(41);
  for (int64_t head_dim : {1, 2, 8, 12, 16, 24, 32, 40, 64, 80, 128}) {
    for (int64_t n : {0, 1, 2, 5, 16, 31, 100, 1000}) {
      const auto q = Spread(rng, head_dim);
      const auto k = Spread(rng, n * head_dim);
      for (float scale : {1.0f / std::sqrt(static_cast<float>(head_dim)), -0.37f}) {
        std::vector<float> want(static_cast<size_t>(n), -1.0f);
        std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
        cpu_->AttentionScores(q.data(), k.data(), n, head_dim, scale, want.data());
        cuda_->AttentionScores(q.data(), k.data(), n, head_dim, scale, got.data());
        ASSERT_TRUE(SameBits(want, got))
            << "head_dim=" << head_dim << " n=" << n << " scale=" << scale;
      }
    }
  }
}

TEST_F(CudaParityTest, AccumulateValues) {
  std::mt19937_64 rng(43);
  for (int64_t head_dim : {1, 2, 7, 8, 12, 15, 16, 17, 24, 33, 64, 100, 128, 300}) {
    for (int64_t n : {0, 1, 2, 3, 17, 64, 101, 1000}) {
      const auto p = Spread(rng, n);
      const auto v = Spread(rng, n * head_dim);
      const auto init = Spread(rng, head_dim);
      std::vector<float> want = init, got = init;
      cpu_->AccumulateValues(p.data(), v.data(), n, head_dim, want.data());
      cuda_->AccumulateValues(p.data(), v.data(), n, head_dim, got.data());
      ASSERT_TRUE(SameBits(want, got)) << "head_dim=" << head_dim << " n=" << n;
    }
  }
  // Subnormal products must not be flushed.
  const std::vector<float> p = {1e-20f, -3e-21f, 7e-22f};
  const std::vector<float> v = {1e-20f, 2e-19f, -5e-21f, 4e-20f, 1e-19f, -1e-18f};
  std::vector<float> want = {0.0f, -0.0f}, got = want;
  cpu_->AccumulateValues(p.data(), v.data(), 3, 2, want.data());
  cuda_->AccumulateValues(p.data(), v.data(), 3, 2, got.data());
  EXPECT_TRUE(SameBits(want, got));
  EXPECT_NE(want[0], 0.0f);  // the test really exercises subnormals
}

TEST_F(CudaParityTest, ConcurrentCallersGetTheirOwnResults) {
  // The const primitives may be called from several threads at once.
  std::mt19937_64 rng(47);
  constexpr int kThreads = 4;
  constexpr int kCalls = 50;
  std::vector<std::vector<float>> qs, ks;
  for (int i = 0; i < kThreads; ++i) {
    qs.push_back(Spread(rng, 64));
    ks.push_back(Spread(rng, 64 * 37));
  }
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> want(37), got(37);
      cpu_->AttentionScores(qs[i].data(), ks[i].data(), 37, 64, 0.125f, want.data());
      for (int c = 0; c < kCalls; ++c) {
        cuda_->AttentionScores(qs[i].data(), ks[i].data(), 37, 64, 0.125f, got.data());
        if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) ++bad[i];
        if (cuda_->Dot(qs[i].data(), qs[i].data(), 64) !=
            cpu_->Dot(qs[i].data(), qs[i].data(), 64)) {
          ++bad[i];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(bad[i], 0) << "thread " << i;
}

TEST_F(CudaParityTest, RmsNormThroughTheBackend) {
  std::mt19937_64 rng(53);
  const int64_t n = 288;
  const auto x = Spread(rng, n), g = Spread(rng, n);
  std::vector<float> want(n), got(n);
  RmsNorm(*cpu_, x.data(), g.data(), n, 1e-5f, want.data());
  RmsNorm(*cuda_, x.data(), g.data(), n, 1e-5f, got.data());
  EXPECT_TRUE(SameBits(want, got));
}

}  // namespace
}  // namespace vc::kernels
