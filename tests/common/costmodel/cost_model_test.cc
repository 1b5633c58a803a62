// The closed-form models against hand-computed cases: the seed review's
// worked examples (with the corrected eta), c* as the point where the two
// terms of T_iter meet, memory-limited batches against a brute-force count,
// and the remote-prefix T_req / pool ratio.
#include "common/costmodel/cost_model.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace vc::costmodel {
namespace {

// Mistral-24B on an RTX PRO 6000 as the review sets it up: M = 48 GB,
// BW_hbm = 1.6 TB/s, PCIe 64 GB/s, K = 5 GB, B = 6, c = 0.2, x = 25,
// gamma = 0.85.
LongContextInputs ReviewMistral() {
  LongContextInputs in;
  in.weight_bytes = 48 * kGB;
  in.hbm_bytes_per_second = 1600 * kGB;
  in.link_bytes_per_second = 64 * kGB;
  in.full_kv_bytes = 5 * kGB;
  in.batch = 6;
  in.ratio = 0.2;
  in.draft_len = 25;
  in.acceptance = 0.85;
  return in;
}

TEST(CostModelTest, ReviewMistralExampleWithCorrectedEta) {
  auto e = EstimateLongContext(ReviewMistral());
  ASSERT_TRUE(e.ok()) << e.status();
  // HBM bytes per iteration: 48 + 6*5*(0.2 + 1/25) = 55.2 GB.
  EXPECT_NEAR(e->t_gpu_s, 55.2 / 1600, 1e-12);
  // Link: 6*5/(25*64) = 0.01875 s.
  EXPECT_NEAR(e->t_xfer_s, 0.01875, 1e-12);
  EXPECT_TRUE(e->gpu_bound);
  EXPECT_DOUBLE_EQ(e->t_iter_s, e->t_gpu_s);
  // eta = (0.85*25 + 1)/26 = 22.25/26.
  EXPECT_NEAR(e->eta, 22.25 / 26, 1e-12);
  // 6 * 0.8558 / 0.0345 = 148.8 tokens/s, not the review's ~312.
  EXPECT_NEAR(e->tokens_per_s, 6 * (22.25 / 26) / 0.0345, 1e-9);
  EXPECT_NEAR(e->tokens_per_s, 148.83, 0.01);
  const double review_eta = 1 + 0.85 * 25.0 / 26;
  EXPECT_NEAR(6 * review_eta / 0.0345, 316.1, 0.1);  // the review's figure (it rounds T to 35 ms)
  // c* = (25 - 1)/25 - 48/30 = -0.64: every c is above it, so the GPU binds.
  EXPECT_NEAR(e->rho, 25, 1e-12);
  EXPECT_NEAR(e->c_star, 0.96 - 1.6, 1e-12);
  // Upper bound: one token per request per iteration without continuation.
  EXPECT_LE(e->tokens_per_s, 6 / e->t_iter_s);
}

TEST(CostModelTest, ReviewQwenExample) {
  LongContextInputs in = ReviewMistral();
  in.weight_bytes = 64 * kGB;
  auto e = EstimateLongContext(in);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->t_gpu_s, 71.2 / 1600, 1e-12);
  EXPECT_NEAR(e->tokens_per_s, 6 * (22.25 / 26) / (71.2 / 1600), 1e-9);  // 115.4
}

TEST(CostModelTest, ContinuationEta) {
  EXPECT_DOUBLE_EQ(Eta(0.85, 25, false), 22.25 / 26);
  EXPECT_DOUBLE_EQ(Eta(0.85, 25, true), 22.25 / 25);
  EXPECT_DOUBLE_EQ(Eta(1.0, 8, false), 1.0);  // all accepted: one token per iteration
  EXPECT_DOUBLE_EQ(Eta(0.0, 8, false), 1.0 / 9);
}

TEST(CostModelTest, CriticalRatioIsWhereTheTermsMeet) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  int tested = 0;
  for (int i = 0; i < 2000 && tested < 200; ++i) {
    LongContextInputs in;
    in.weight_bytes = (1 + 150 * u(rng)) * kGB;
    in.hbm_bytes_per_second = (500 + 5000 * u(rng)) * kGB;
    in.link_bytes_per_second = (8 + 500 * u(rng)) * kGB;
    in.full_kv_bytes = (0.1 + 20 * u(rng)) * kGB;
    in.batch = 1 + static_cast<int>(64 * u(rng));
    in.draft_len = 1 + static_cast<int>(48 * u(rng));
    in.ratio = 0.5;
    auto probe = EstimateLongContext(in);
    ASSERT_TRUE(probe.ok());
    const double c_star = probe->c_star;
    if (!(c_star > 0.01 && c_star < 0.99)) continue;  // not a valid ratio here
    ++tested;
    in.ratio = c_star;
    auto at = EstimateLongContext(in);
    ASSERT_TRUE(at.ok());
    EXPECT_NEAR(at->t_gpu_s, at->t_xfer_s, 1e-9 * at->t_xfer_s);
    in.ratio = c_star * 1.01;
    EXPECT_TRUE(EstimateLongContext(in)->gpu_bound) << "above c* the GPU side binds";
    in.ratio = c_star * 0.99;
    EXPECT_FALSE(EstimateLongContext(in)->gpu_bound) << "below c* the link binds";
  }
  EXPECT_GE(tested, 50);
}

TEST(CostModelTest, LockStepVsStaggeredHbmOnReviewExample) {
  // Figure 6 setting: B = 10, K = 4 GB, KV_comp = 1 GB (c = 0.25), x = 30,
  // PCIe 64 GB/s; M = 50 GB so that the staggered peak is the review's 64 GB;
  // BW_hbm chosen so that an iteration takes 35 ms.
  LongContextInputs in;
  in.weight_bytes = 50 * kGB;
  in.full_kv_bytes = 4 * kGB;
  in.batch = 10;
  in.ratio = 0.25;
  in.draft_len = 30;
  in.link_bytes_per_second = 64 * kGB;
  in.hbm_bytes_per_second = (50 + 40 * (0.25 + 1.0 / 30)) * kGB / 0.035;
  auto e = EstimateLongContext(in);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->t_iter_s, 0.035, 1e-12);
  // 62.5 ms transfer = 2 iterations; 10 requests * 3 slots / 31 < 1 copy.
  EXPECT_EQ(e->reload_iterations, 2);
  EXPECT_EQ(e->transient_copies, 1);
  EXPECT_NEAR(e->hbm_needed_bytes / kGB, 64, 1e-9);
  // Lock-step holds every full KV at once: 50 + 10 + 40.
  EXPECT_NEAR(e->lock_step_hbm_bytes / kGB, 100, 1e-9);
}

TEST(CostModelTest, MaxBatchMatchesBruteForce) {
  LongContextInputs in = ReviewMistral();
  in.hbm_bytes = 96 * kGB;
  auto e = EstimateLongContext(in);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->max_batch_full, 9);  // floor(48 / 5)
  // Brute force: the largest B with M + B*c*K + copies(B)*K <= HBM.
  int best = 0;
  for (int b = 1; b < 1000; ++b) {
    LongContextInputs t = in;
    t.batch = b;
    t.hbm_bytes = 0;
    auto eb = EstimateLongContext(t);
    if (eb->hbm_needed_bytes <= in.hbm_bytes) best = b;
  }
  EXPECT_EQ(e->max_batch_vericache, best);
  EXPECT_GT(best, 9);
  EXPECT_NEAR(e->full_tokens_per_s_at_max, 9 * 1600 / (48 + 45.0), 1e-9);
  EXPECT_NEAR(e->speedup_at_max, e->tokens_per_s_at_max / e->full_tokens_per_s_at_max, 1e-12);
}

TEST(CostModelTest, BreakEvenAcceptance) {
  LongContextInputs in = ReviewMistral();
  const double target = 120;
  const double gamma = BreakEvenAcceptance(in, target);
  ASSERT_GT(gamma, 0);
  ASSERT_LT(gamma, 1);
  in.acceptance = gamma;
  EXPECT_NEAR(EstimateLongContext(in)->tokens_per_s, target, 1e-9);
  in.continuation = true;
  const double gamma_c = BreakEvenAcceptance(in, target);
  in.acceptance = gamma_c;
  EXPECT_NEAR(EstimateLongContext(in)->tokens_per_s, target, 1e-9);
  EXPECT_LT(gamma_c, gamma);  // continuation needs less acceptance
}

TEST(CostModelTest, GeometricAcceptance) {
  EXPECT_DOUBLE_EQ(MeanAcceptedGeometric(1.0, 10), 10);
  EXPECT_NEAR(MeanAcceptedGeometric(0.5, 3), 0.5 + 0.25 + 0.125, 1e-15);
  const double p = PerTokenFromFraction(0.85, 25);
  EXPECT_NEAR(MeanAcceptedGeometric(p, 25) / 25, 0.85, 1e-9);
}

TEST(CostModelTest, RejectsBadInputWithTheField) {
  LongContextInputs in = ReviewMistral();
  in.ratio = 0;
  auto e = EstimateLongContext(in);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("ratio"), absl::string_view::npos);
  in = ReviewMistral();
  in.draft_len = 0;
  EXPECT_NE(EstimateLongContext(in).status().message().find("draft length"),
            absl::string_view::npos);
  in = ReviewMistral();
  in.acceptance = 1.5;
  EXPECT_EQ(EstimateLongContext(in).status().code(), absl::StatusCode::kInvalidArgument);
}

// M = 100 GB, 1 TB/s, K = 10 GB, K_out = 330, c = 0.25, x = 40, gamma = 0.8
// (33 tokens per round, so exactly 10 rounds), RTT 10 ms:
//   T_decode = (100 + 2.5)/1000 = 0.1025 s, x*T_decode = 4.1 s
//   K/BW_fast = 0.25 s, T_fwd = 110/1000 = 0.11 s
//   T_cycle = 4.1 + 0.11 + 0.01 = 4.22 s; startup = 2.5/1.2 s
//   T_req = 2.5/1.2 + 10*4.22; verifier seconds = 10*0.25 = 2.5 s.
RemotePrefixInputs HandRemote() {
  RemotePrefixInputs in;
  in.weight_bytes = 100 * kGB;
  in.hbm_bytes_per_second = 1000 * kGB;
  in.full_kv_bytes = 10 * kGB;
  in.output_tokens = 330;
  in.ratio = 0.25;
  in.draft_len = 40;
  in.acceptance = 0.8;
  in.rtt_s = 0.01;
  return in;
}

TEST(CostModelTest, RemotePrefixHandComputed) {
  auto e = EstimateRemotePrefix(HandRemote());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->rounds, 10, 1e-12);
  EXPECT_NEAR(e->t_decode_s, 0.1025, 1e-12);
  EXPECT_NEAR(e->t_fwd_s, 0.11, 1e-12);
  EXPECT_NEAR(e->t_load_s, 0.25, 1e-12);
  EXPECT_NEAR(e->t_cycle_s, 4.22, 1e-12);
  EXPECT_NEAR(e->t_startup_s, 2.5 / 1.2, 1e-12);
  EXPECT_NEAR(e->t_req_s, 2.5 / 1.2 + 42.2, 1e-9);
  EXPECT_NEAR(e->local_seconds_per_request, 2.5, 1e-12);
  EXPECT_NEAR(e->best_remote_to_local_ratio, (2.5 / 1.2 + 42.2) / 2.5, 1e-9);
  EXPECT_NEAR(e->remote_rate_per_gpu, 1 / (2.5 / 1.2 + 42.2), 1e-12);
  EXPECT_NEAR(e->local_rate_per_gpu, 1 / 2.5, 1e-12);
  // Full KV over the slow link: 10/1.2 s + 330 * 0.11 s.
  EXPECT_NEAR(e->full_t_req_remote_s, 10 / 1.2 + 330 * 0.11, 1e-9);

  RemotePrefixInputs c = HandRemote();
  c.continuation = true;
  EXPECT_NEAR(EstimateRemotePrefix(c)->t_cycle_s, 4.1, 1e-12);  // verify and RTT hidden
}

TEST(CostModelTest, BestPoolRatioBalancesThePools) {
  RemotePrefixInputs in = HandRemote();
  // A slow link slow enough that full KV over it loses to VeriCache.
  in.slow_link_bytes_per_second = 0.1 * kGB;
  const double ratio = EstimateRemotePrefix(in)->best_remote_to_local_ratio;
  // At G_R/G_L = ratio both pools serve the same request rate; either side
  // of it the cluster speedup is lower.
  in.local_gpus = 10;
  in.remote_gpus = static_cast<int>(std::lround(ratio * 10));
  auto at = EstimateRemotePrefix(in);
  const double remote_rate = in.remote_gpus / at->t_req_s;
  const double local_rate = in.local_gpus / at->local_seconds_per_request;
  EXPECT_NEAR(remote_rate / local_rate, 1, 0.03);
  EXPECT_GT(at->cluster_speedup, 1);
  in.remote_gpus = static_cast<int>(ratio * 10 / 3);
  const double below = EstimateRemotePrefix(in)->cluster_speedup;
  in.remote_gpus = static_cast<int>(ratio * 10 * 3);
  const double above = EstimateRemotePrefix(in)->cluster_speedup;
  EXPECT_GT(at->cluster_speedup, below);
  EXPECT_GT(at->cluster_speedup, above);
}

TEST(CostModelTest, PoolRatioGrowsWithTheBandwidthGap) {
  RemotePrefixInputs in = HandRemote();
  double prev = 0;
  for (double slow : {4.8, 2.4, 1.2, 0.6, 0.3}) {
    in.slow_link_bytes_per_second = slow * kGB;
    const double r = EstimateRemotePrefix(in)->best_remote_to_local_ratio;
    EXPECT_GT(r, prev) << "slow link " << slow << " GB/s";
    prev = r;
  }
}

TEST(CostModelTest, Profiles) {
  auto h = FindHardwareProfile("h100-nvl");
  ASSERT_TRUE(h.ok());
  EXPECT_NEAR(h->hbm_bytes_per_second / h->host_link_bytes_per_second, 60.9, 0.1);
  auto g = FindHardwareProfile("gh200");
  ASSERT_TRUE(g.ok());
  EXPECT_LT(g->hbm_bytes_per_second / g->host_link_bytes_per_second, 10);
  auto m = FindModelProfile("llama-70b");
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->kv_bytes_per_token(), 327680);  // 320 KiB, as DESIGN.md says
  for (const char* name : {"llama-3.1-8b", "mistral-24b", "qwen-32b"}) {
    EXPECT_TRUE(FindModelProfile(name).ok()) << name;
  }
  for (const char* name : {"h200", "rtx-pro-6000"})
    EXPECT_TRUE(FindHardwareProfile(name).ok()) << name;
  auto bad = FindHardwareProfile("a100");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("h100-nvl"), absl::string_view::npos);
}

}  // namespace
}  // namespace vc::costmodel
