#include "common/speculative/accept_rule.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "gtest/gtest.h"

namespace vc {
namespace {

// Independent reference for greedy acceptance: the longest prefix of drafts
// equal to each row's argmax (ties to the lowest id), then that row's argmax.
AcceptDecision ReferenceGreedy(const std::vector<float>& rows, int vocab,
                               const std::vector<int32_t>& drafts) {
  auto argmax = [&](int r) {
    int best = 0;
    for (int v = 1; v < vocab; ++v) {
      if (rows[r * vocab + v] > rows[r * vocab + best]) best = v;
    }
    return best;
  };
  AcceptDecision d;
  while (d.accepted < static_cast<int>(drafts.size()) && drafts[d.accepted] == argmax(d.accepted)) {
    ++d.accepted;
  }
  d.next = argmax(d.accepted);
  return d;
}

TEST(AcceptDraftsTest, GreedyMatchesTheReferenceOnRandomPasses) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int vocab = 2 + static_cast<int>(rng() % 6);  // small: drafts often match
    const int x = static_cast<int>(rng() % 9);
    std::vector<float> rows(static_cast<size_t>((x + 1) * vocab));
    for (float& v : rows) v = static_cast<float>(rng() % 5);  // ties on purpose
    std::vector<int32_t> drafts(static_cast<size_t>(x));
    for (int32_t& d : drafts) d = static_cast<int32_t>(rng() % vocab);
    AcceptInputs in;
    in.rows = rows;
    in.vocab = vocab;
    in.drafts = drafts;
    in.first_position = 100;
    std::vector<int64_t> positions;
    in.choose = [&](std::span<const float> row, int64_t position) {
      positions.push_back(position);
      return Argmax(row);
    };
    const AcceptDecision got = AcceptDrafts(in);
    const AcceptDecision want = ReferenceGreedy(rows, vocab, drafts);
    ASSERT_EQ(got.accepted, want.accepted) << "trial " << trial;
    ASSERT_EQ(got.next, want.next) << "trial " << trial;
    // Row r is judged at first_position + r, in order, each row once.
    ASSERT_EQ(positions.size(), static_cast<size_t>(got.accepted + 1));
    for (size_t i = 0; i < positions.size(); ++i) EXPECT_EQ(positions[i], 100 + int64_t(i));
  }
}

TEST(AcceptDraftsTest, RejectionKeepsADraftTheTargetIsSureOfAndReplacesAnImpossibleOne) {
  const int vocab = 4;
  // Row 0 puts (nearly) all mass on token 2, row 1 none on token 3.
  std::vector<float> rows = {0, 0, 50, 0,   //
                             0, 0, 0, -INFINITY,  //
                             0, 0, 0, 0};
  std::vector<int32_t> drafts = {2, 3};
  std::vector<std::vector<double>> q = {{0, 0, 1, 0}, {0, 0, 0, 1}};
  AcceptInputs in;
  in.rows = rows;
  in.vocab = vocab;
  in.drafts = drafts;
  in.first_position = 10;
  in.choose = [](std::span<const float> row, int64_t) { return Argmax(row); };
  in.rejection = true;
  in.rejection_params.temperature = 1.0f;
  in.rejection_params.seed = 3;
  in.draft_probs = q;
  const AcceptDecision got = AcceptDrafts(in);
  EXPECT_EQ(got.accepted, 1);
  EXPECT_NE(got.next, 3);
  EXPECT_GE(got.next, 0);
  EXPECT_LT(got.next, vocab);
}

TEST(AcceptDraftsTest, NoDraftsGivesTheTargetsChoice) {
  std::vector<float> rows = {0, 3, 1};
  AcceptInputs in;
  in.rows = rows;
  in.vocab = 3;
  in.choose = [](std::span<const float> row, int64_t) { return Argmax(row); };
  const AcceptDecision got = AcceptDrafts(in);
  EXPECT_EQ(got.accepted, 0);
  EXPECT_EQ(got.next, 1);
}

TEST(FallbackPolicyTest, FallsBackWhenTheWindowMeanDropsBelowTheMinimum) {
  FallbackPolicy p(FallbackOptions{.window = 4, .min_accepted = 1.0, .after_rounds = -1});
  for (int a : {3, 3, 0}) {
    p.RecordRound(a);
    EXPECT_FALSE(p.ShouldFallBack()) << "window not full yet";
  }
  p.RecordRound(0);  // mean 1.5
  EXPECT_FALSE(p.ShouldFallBack());
  p.RecordRound(0);  // window {3, 0, 0, 0}: mean 0.75
  EXPECT_TRUE(p.ShouldFallBack());
  p.RecordRound(8);  // {0, 0, 0, 8}: mean 2
  EXPECT_FALSE(p.ShouldFallBack());
  EXPECT_EQ(p.rounds(), 6);
}

TEST(FallbackPolicyTest, NegativeMinimumDisablesAndAfterRoundsForces) {
  FallbackPolicy off(FallbackOptions{.window = 2, .min_accepted = -1, .after_rounds = -1});
  for (int i = 0; i < 10; ++i) off.RecordRound(0);
  EXPECT_FALSE(off.ShouldFallBack());
  FallbackPolicy forced(FallbackOptions{.window = 16, .min_accepted = 0.05, .after_rounds = 2});
  forced.RecordRound(8);
  EXPECT_FALSE(forced.ShouldFallBack());
  forced.RecordRound(8);
  EXPECT_TRUE(forced.ShouldFallBack());
}

}  // namespace
}  // namespace vc
