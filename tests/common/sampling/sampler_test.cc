#include "common/sampling/sampler.h"

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace vc {
namespace {

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(Argmax(logits), 1);
  EXPECT_EQ(SampleToken(logits, SamplingParams{}, 5), 1);
}

TEST(SamplerTest, NoiseIsAPureFunctionOfSeedPositionToken) {
  EXPECT_EQ(GumbelNoise(7, 100, 3), GumbelNoise(7, 100, 3));
  EXPECT_NE(GumbelNoise(7, 100, 3), GumbelNoise(8, 100, 3));
  EXPECT_NE(GumbelNoise(7, 100, 3), GumbelNoise(7, 101, 3));
  EXPECT_NE(GumbelNoise(7, 100, 3), GumbelNoise(7, 100, 4));
}

TEST(SamplerTest, GumbelNoiseHasTheRightMean) {
  // E[Gumbel(0,1)] = Euler-Mascheroni constant 0.5772; sd = pi/sqrt(6).
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) sum += GumbelNoise(1, i, i % 17);
  const double sd_of_mean = 1.2825 / std::sqrt(n);
  EXPECT_NEAR(sum / n, 0.57722, 5 * sd_of_mean);
}

TEST(SamplerTest, SamplingMatchesSoftmaxDistribution) {
  // Gumbel-max over logits/T draws from softmax(logits/T). Chi-square test
  // over positions (each position is an independent draw).
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  const int n = 60000;
  std::vector<int> counts(logits.size());
  for (int pos = 0; pos < n; ++pos) ++counts[SampleToken(logits, p, pos)];
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double expected = n * std::exp(logits[i] / 0.7) / z;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  EXPECT_LT(chi2, 18.47);  // chi-square, 4 dof, p = 0.001
}

TEST(SamplerTest, TopKAndTopPFilter) {
  const std::vector<float> logits = {5.0f, 4.9f, 0.0f, -1.0f, 4.8f};
  SamplingParams k2;
  k2.temperature = 1.0f;
  k2.top_k = 2;
  SamplingParams p_small;
  p_small.temperature = 1.0f;
  p_small.top_p = 0.01f;  // only the top token survives
  for (int pos = 0; pos < 2000; ++pos) {
    const int32_t t = SampleToken(logits, k2, pos);
    EXPECT_TRUE(t == 0 || t == 1) << t;
    EXPECT_EQ(SampleToken(logits, p_small, pos), 0);
  }
}

TEST(SamplerTest, SameLogitsSamePositionSameToken) {
  // The property the draft/verify protocol relies on.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> logits(512);
  for (auto& l : logits) l = nd(rng);
  SamplingParams p{0.9f, 40, 0.95f, 1234};
  for (int pos = 0; pos < 100; ++pos) {
    std::vector<float> copy = logits;
    EXPECT_EQ(SampleToken(logits, p, pos), SampleToken(copy, p, pos));
  }
}

TEST(SamplerTest, ValidateRejectsBadParams) {
  EXPECT_EQ((SamplingParams{-1.0f, 0, 1.0f, 0}).Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((SamplingParams{1.0f, -2, 1.0f, 0}).Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((SamplingParams{1.0f, 0, 0.0f, 0}).Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((SamplingParams{1.0f, 0, 1.5f, 0}).Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((SamplingParams{0.0f, 0, 1.0f, 0}).Validate().ok());
}

TEST(SamplerTest, SpeculativeAcceptReproducesTargetDistribution) {
  // Drafts from q, accept/resample against p: the outcome must follow p
  // exactly even when q is far from p (chi-square, 5 dof, p = 0.001).
  const std::vector<double> p = {0.05, 0.40, 0.10, 0.30, 0.15, 0.0};
  const std::vector<double> q = {0.30, 0.10, 0.30, 0.05, 0.05, 0.20};
  const int n = 100000;
  std::vector<int> counts(p.size());
  int rejected = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t d = SampleFromDistribution(q, 11, i);
    bool accepted = false;
    const int32_t t = SpeculativeAccept(p, q, d, KeyedUniform(12, i), 13, i, &accepted);
    rejected += !accepted;
    ++counts[t];
  }
  EXPECT_EQ(counts[5], 0);  // p = 0 is never produced, even though q drafts it
  double chi2 = 0;
  for (size_t t = 0; t < 5; ++t) {
    const double e = p[t] * n;
    chi2 += (counts[t] - e) * (counts[t] - e) / e;
  }
  EXPECT_LT(chi2, 20.52);
  // Rejection rate is 1 - sum min(p, q) = 1 - 0.35 = 0.65.
  EXPECT_NEAR(static_cast<double>(rejected) / n, 0.65, 0.01);
}

TEST(SamplerTest, FilteredDistributionMatchesSampling) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f, -1.0f};
  SamplingParams sp{0.5f, 2, 1.0f, 3};
  const std::vector<double> d = FilteredDistribution(logits, sp);
  EXPECT_EQ(d[0], 0.0);
  EXPECT_EQ(d[3], 0.0);
  EXPECT_NEAR(d[1] + d[2], 1.0, 1e-12);
  EXPECT_NEAR(d[1] / d[2], std::exp((3.0 - 2.5) / 0.5), 1e-9);
  SamplingParams greedy;
  const std::vector<double> g = FilteredDistribution(logits, greedy);
  EXPECT_EQ(g[1], 1.0);
}

}  // namespace
}  // namespace vc
