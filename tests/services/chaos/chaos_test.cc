// The parts of the chaos tool that decide pass or fail, without a cluster:
// the seeded fault schedule (replayable, bounded), which failures count as
// clean, the RSS slope, and the token check against full-KV decoding.
#include "services/chaos/chaos.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/chaos/internal/cluster_ops.h"
#include "tests/scratch_dir.h"

namespace vc::chaos {
namespace {

namespace pb = ::vericache::v1;

const std::vector<std::string> kDaemons = {"kvstore", "verifier",  "verifier-1",
                                           "drafter", "drafter-1", "coordinator"};

TEST(FaultScheduleTest, SameSeedSameScheduleOtherSeedOther) {
  ChaosOptions o;
  o.duration_s = 120;
  const auto a = DrawFaultSchedule(7, o, kDaemons);
  const auto b = DrawFaultSchedule(7, o, kDaemons);
  const auto c = DrawFaultSchedule(8, o, kDaemons);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at_s, b[i].at_s);
    EXPECT_EQ(a[i].type, b[i].type);
    EXPECT_EQ(a[i].target, b[i].target);
    EXPECT_EQ(a[i].down_s, b[i].down_s);
  }
  bool differs = a.size() != c.size();
  for (size_t i = 0; !differs && i < a.size(); ++i)
    differs = a[i].at_s != c[i].at_s || a[i].target != c[i].target;
  EXPECT_TRUE(differs);
}

TEST(FaultScheduleTest, BoundedSequentialAndCoversEveryFault) {
  ChaosOptions o;
  o.duration_s = 600;
  o.max_faults = 100;
  const auto s = DrawFaultSchedule(42, o, kDaemons);
  EXPECT_EQ(s.size(), 100u);  // 600 s hold more than 100 at the default gap
  std::set<FaultType> types;
  std::set<std::string> targets;
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_LT(s[i].at_s, o.duration_s);
    EXPECT_GT(s[i].down_s, 0);
    if (i > 0) {
      EXPECT_GE(s[i].at_s, s[i - 1].at_s + s[i - 1].down_s);  // one at a time
    }
    types.insert(s[i].type);
    targets.insert(s[i].target);
    if (s[i].type == FaultType::kKillDrafter) {
      EXPECT_EQ(s[i].target.rfind("drafter", 0), 0u);
    }
    if (s[i].type == FaultType::kKillVerifier) {
      EXPECT_EQ(s[i].target.rfind("verifier", 0), 0u);
    }
    if (s[i].type == FaultType::kKillStore) {
      EXPECT_EQ(s[i].target, "kvstore");
    }
  }
  EXPECT_TRUE(types.count(FaultType::kKillDrafter));
  EXPECT_TRUE(types.count(FaultType::kKillVerifier));
  EXPECT_TRUE(types.count(FaultType::kKillStore));
  EXPECT_TRUE(types.count(FaultType::kPause));
  EXPECT_TRUE(targets.count("drafter-1"));
  EXPECT_TRUE(targets.count("verifier-1"));

  o.duration_s = 20;
  EXPECT_LE(DrawFaultSchedule(42, o, kDaemons).size(), 10u);
  o.max_faults = 0;
  EXPECT_TRUE(DrawFaultSchedule(42, o, kDaemons).empty());
}

// Without --link-faults a seed must replay the schedule it drew before link
// faults existed: the per-commit smoke's (seed 13, 60 s), as printed then.
TEST(FaultScheduleTest, LinkFaultsOffKeepsTheOldSchedules) {
  ChaosOptions o;
  o.duration_s = 60;
  const auto s = DrawFaultSchedule(13, o, kDaemons);
  const std::vector<std::pair<std::string, std::string>> printed = {
      {"kill_verifier", "verifier"}, {"kill_verifier", "verifier-1"}, {"pause", "drafter"},
      {"pause", "drafter-1"},        {"pause", "verifier-1"},         {"pause", "kvstore"},
      {"pause", "coordinator"},      {"kill_verifier", "verifier"},   {"kill_drafter", "drafter-1"},
      {"kill_store", "kvstore"},     {"kill_verifier", "verifier-1"}, {"kill_drafter", "drafter"},
      {"kill_drafter", "drafter"}};
  ASSERT_EQ(s.size(), printed.size());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(FaultName(s[i].type), printed[i].first) << i;
    EXPECT_EQ(s[i].target, printed[i].second) << i;
  }
  EXPECT_NEAR(s[0].at_s, 2.5, 0.05);
  EXPECT_NEAR(s[12].at_s, 58.3, 0.05);
}

TEST(FaultScheduleTest, LinkFaultsCutAndThrottleTheStoreAndWorkers) {
  ChaosOptions o;
  o.duration_s = 600;
  o.max_faults = 100;
  o.link_faults = true;
  const auto s = DrawFaultSchedule(42, o, kDaemons);
  std::set<FaultType> types;
  std::set<std::string> link_targets;
  for (const Fault& f : s) {
    types.insert(f.type);
    if (f.type == FaultType::kCutLink || f.type == FaultType::kThrottleLink) {
      link_targets.insert(f.target);
      EXPECT_GE(f.down_s, 0.5);
      EXPECT_LE(f.down_s, 3.0);
    }
  }
  EXPECT_TRUE(types.count(FaultType::kCutLink));
  EXPECT_TRUE(types.count(FaultType::kThrottleLink));
  EXPECT_TRUE(types.count(FaultType::kKillStore));  // the other faults remain
  EXPECT_TRUE(types.count(FaultType::kPause));
  EXPECT_TRUE(link_targets.count("kvstore"));
  EXPECT_FALSE(link_targets.count("coordinator"));  // the client's link stays
  o.link_faults = false;
  for (const Fault& f : DrawFaultSchedule(42, o, kDaemons)) {
    EXPECT_NE(f.type, FaultType::kCutLink);
    EXPECT_NE(f.type, FaultType::kThrottleLink);
  }
}

TEST(CleanFailureTest, KnownCodeAndMessage) {
  EXPECT_TRUE(IsCleanFailure(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "verifier 1.2.3.4: Socket closed")));
  EXPECT_TRUE(IsCleanFailure(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")));
  EXPECT_TRUE(IsCleanFailure(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline")));
  EXPECT_FALSE(IsCleanFailure(grpc::Status::OK));
  EXPECT_FALSE(IsCleanFailure(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")));
  EXPECT_FALSE(IsCleanFailure(grpc::Status(grpc::StatusCode::UNKNOWN, "boom")));
  EXPECT_FALSE(IsCleanFailure(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad prompt")));
}

TEST(SlopeTest, LeastSquares) {
  EXPECT_DOUBLE_EQ(LeastSquaresSlope({0, 1, 2, 3}, {1, 3, 5, 7}), 2.0);
  EXPECT_DOUBLE_EQ(LeastSquaresSlope({0, 1, 2}, {5, 5, 5}), 0.0);
  EXPECT_DOUBLE_EQ(LeastSquaresSlope({1}, {5}), 0.0);
  EXPECT_DOUBLE_EQ(LeastSquaresSlope({2, 2}, {1, 9}), 0.0);
  EXPECT_NEAR(LeastSquaresSlope({0, 1, 2, 3}, {0, 1.1, 1.9, 3.0}), 0.98, 1e-9);
}

TEST(SummaryTest, FailsOnAnyViolation) {
  ChaosReport r;
  r.seed = 5;
  EXPECT_TRUE(r.ok());
  EXPECT_NE(SummaryLine(r).find("PASS seed=5"), std::string::npos);
  r.wrong_tokens = 1;
  EXPECT_FALSE(r.ok());
  EXPECT_NE(SummaryLine(r).find("FAIL"), std::string::npos);
  r.wrong_tokens = 0;
  r.leaks = "verifier holds 1 sessions";
  EXPECT_FALSE(r.ok());
  r.leaks.clear();
  r.crashes = {"coordinator.log: *** SIGABRT (signal 6) received; stack, innermost first:"};
  EXPECT_FALSE(r.ok());
  EXPECT_NE(SummaryLine(r).find("crashes=1"), std::string::npos);
  r.crashes.clear();
  r.below_minimum = true;
  EXPECT_FALSE(r.ok());
  SoakReport soak;
  EXPECT_TRUE(soak.ok());
  soak.crashes = {"verifier.log: x.cc:7:3: runtime error: load of null pointer"};
  EXPECT_FALSE(soak.ok());
  EXPECT_NE(SummaryLine(soak).find("crashes=1"), std::string::npos);
}

// Every kind of crash report in a daemon log is found, in file order, and
// the lines a healthy daemon writes (failures it reports, a kill -9's
// silence, its stack lines) are not.
TEST(CrashReportsTest, FindsEachKindOfReportAndNothingElse) {
  test_support::ScratchDir dir("chaos-crash-logs-");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  write("kvstore.log",
        "vc-kvstore: listening on 127.0.0.1:4000\n"
        "vc-kvstore: signal 15, draining\n"
        "Commit failed: the store's disk is full\n");
  write("coordinator.log",
        "vc-coordinator: listening\n"
        "vc-coordinator: tpp.c:86: __pthread_tpp_change_priority: Assertion `new_prio == -1' "
        "failed.\n"
        "*** SIGABRT (signal 6) received; stack, innermost first:\n"
        "    @ 0x7f00 abort\n");
  write("verifier-1.log",
        "a.cc:754:13: runtime error: member access within address 0x1 which does not point to "
        "an object of type 'X'\n"
        "==12==ERROR: AddressSanitizer: heap-use-after-free on address 0x2\n"
        "WARNING: ThreadSanitizer: data race (pid=3)\n"
        "terminate called after throwing an instance of 'std::bad_alloc'\n"
        "Fatal glibc error: malloc.c:4302 (_int_malloc): assertion failed\n" +
            std::string(1000, 'x') + "==1==ERROR: LeakSanitizer: detected memory leaks\n");
  write("notes.txt", "*** SIGSEGV (signal 11) received\n");  // not a daemon log
  const std::vector<std::string> reports = internal::CrashReports(dir.path());
  ASSERT_EQ(reports.size(), 8u) << ::testing::PrintToString(reports);
  EXPECT_EQ(reports[0].rfind("coordinator.log: vc-coordinator: tpp.c:86", 0), 0u);
  EXPECT_EQ(reports[1],
            "coordinator.log: *** SIGABRT (signal 6) received; stack, innermost first:");
  EXPECT_NE(reports[2].find("runtime error: member access"), std::string::npos);
  EXPECT_NE(reports[3].find("heap-use-after-free"), std::string::npos);
  EXPECT_NE(reports[4].find("ThreadSanitizer"), std::string::npos);
  EXPECT_NE(reports[5].find("terminate called"), std::string::npos);
  EXPECT_NE(reports[6].find("Fatal glibc error"), std::string::npos);
  // A long line is cut, not copied whole.
  EXPECT_LT(reports[7].size(), 400u);
  EXPECT_EQ(reports[7].rfind("verifier-1.log: xxx", 0), 0u);
  EXPECT_TRUE(internal::CrashReports(dir / "missing").empty());
}

// Where a cancel landed is read from how its request ended; a mid-request
// cancel whose stream ended after the bound is slow, and slow fails a run.
TEST(CancelTallyTest, ClassifiesByTheEndingStatus) {
  CancelTally t;
  t.Add(grpc::StatusCode::CANCELLED, 12, 1000);
  t.Add(grpc::StatusCode::CANCELLED, 30, 1000);
  t.Add(grpc::StatusCode::OK, 5, 1000);
  t.Add(grpc::StatusCode::UNAVAILABLE, 5, 1000);
  EXPECT_EQ(t.sent, 4);
  EXPECT_EQ(t.mid_request, 2);
  EXPECT_EQ(t.after_end, 1);
  EXPECT_EQ(t.other, 1);
  EXPECT_EQ(t.slow, 0);
  EXPECT_EQ(t.to_end_ms, (std::vector<double>{12, 30}));
  EXPECT_NE(CancelSummary(t).find("cancels=4 (mid-request 2, after the end 1, other 1, slow 0)"),
            std::string::npos)
      << CancelSummary(t);
  ChaosReport r;
  r.cancels = t;
  EXPECT_TRUE(r.ok());
  r.cancels.Add(grpc::StatusCode::CANCELLED, 1500, 1000);
  EXPECT_EQ(r.cancels.slow, 1);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(SummaryLine(r).find("max_cancel_to_end_ms="), std::string::npos);
  SoakReport soak;
  soak.cancels = r.cancels;
  EXPECT_FALSE(soak.ok());
}

class WorkloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("VC_MODELS_DIR");
    setup_.model = std::string(dir ? dir : "/work/shared/models") + "/stories260K.bin";
    if (!std::filesystem::exists(setup_.model))
      GTEST_SKIP() << "test model not found: " << setup_.model;
    auto w = internal::MixedWorkload::Create(setup_, 99);
    ASSERT_TRUE(w.ok()) << w.status();
    workload_ = std::move(*w);
  }
  ClusterSetup setup_;
  std::unique_ptr<internal::MixedWorkload> workload_;
};

TEST_F(WorkloadTest, DrawIsReplayableAndMixesEverything) {
  std::set<int> modes, samplings;
  std::set<std::string> compressors;
  int shared = 0, cancels = 0;
  for (int i = 0; i < 300; ++i) {
    const internal::RequestSpec a = workload_->Draw(i);
    const internal::RequestSpec b = workload_->Draw(i);
    ASSERT_EQ(a.request.SerializeAsString(), b.request.SerializeAsString());
    ASSERT_EQ(a.shape, b.shape);
    modes.insert(a.request.mode());
    samplings.insert(a.request.sampling().mode());
    if (!a.request.compressor().empty()) compressors.insert(a.request.compressor());
    if (a.prompt.size() > 96) ++shared;
    if (a.cancel) ++cancels;
    EXPECT_GE(a.cancel_point, 0);
    EXPECT_LT(a.cancel_point, 1);
    EXPECT_LE(a.request.max_new_tokens(), setup_.max_new_tokens);
    EXPECT_EQ(a.exact, !(a.request.mode() == pb::MODE_VERICACHE &&
                         a.request.sampling().mode() == pb::SamplingConfig::REJECTION));
  }
  EXPECT_EQ(modes, (std::set<int>{pb::MODE_VERICACHE, pb::MODE_FULL_REMOTE, pb::MODE_FULL_LOCAL}));
  EXPECT_EQ(samplings.size(), 3u);
  EXPECT_EQ(compressors, (std::set<std::string>{"snapkv", "int8", "kivi", "streamingllm"}));
  EXPECT_GT(shared, 50);
  EXPECT_GT(cancels, 10);
}

// The cancel point is measured against the tokens a request will stream:
// its full-KV reference's length (shorter than max_new_tokens at an EOS,
// which this small model rarely emits within 32 tokens).
TEST_F(WorkloadTest, ExpectedTokensIsTheReferenceLength) {
  for (int i = 0; i < 200; ++i) {
    const internal::RequestSpec spec = workload_->Draw(i);
    const int64_t expected = workload_->ExpectedTokens(spec);
    EXPECT_GE(expected, 1);
    EXPECT_LE(expected, spec.request.max_new_tokens());
    if (spec.request.ignore_eos()) {
      EXPECT_EQ(expected, spec.request.max_new_tokens());
    }
  }
}

TEST_F(WorkloadTest, CheckCatchesWrongTokens) {
  // Find an exact request and make its reference.
  internal::RequestSpec spec;
  for (int i = 0;; ++i) {
    spec = workload_->Draw(i);
    if (spec.exact && spec.request.ignore_eos()) break;
  }
  internal::Outcome out;
  out.status = grpc::Status::OK;
  // An outcome that is right by construction: ask the checker for the
  // reference via a failed outcome with nothing streamed (a valid prefix).
  out.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "x");
  EXPECT_EQ(workload_->Check(spec, out), "");
  // Full length but wrong: every token shifted by one.
  out.status = grpc::Status::OK;
  out.tokens.assign(spec.request.max_new_tokens(), 5);
  out.streamed = out.tokens;
  const std::string wrong = workload_->Check(spec, out);
  EXPECT_NE(wrong.find("first difference"), std::string::npos) << wrong;
  // Streamed tokens that disagree with the final ones.
  out.streamed.pop_back();
  EXPECT_NE(workload_->Check(spec, out).find("differ from the streamed"), std::string::npos);
  // A token outside the vocabulary.
  out.streamed = {1 << 30};
  out.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "x");
  EXPECT_NE(workload_->Check(spec, out).find("outside the vocabulary"), std::string::npos);
}

TEST_F(WorkloadTest, CheckAcceptsFullKvTokensAndTheirPrefixes) {
  internal::RequestSpec spec;
  for (int i = 0;; ++i) {
    spec = workload_->Draw(i);
    if (spec.exact && spec.request.ignore_eos() && spec.request.sampling().mode() != 0) break;
  }
  // The reference itself, found by walking a failed outcome's streamed
  // prefix one token at a time (the checker accepts exactly its prefixes).
  internal::Outcome out;
  out.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "x");
  const int vocab = 512;
  for (int64_t pos = 0; pos < spec.request.max_new_tokens(); ++pos) {
    bool found = false;
    for (int t = 0; t < vocab && !found; ++t) {
      out.streamed.push_back(t);
      if (workload_->Check(spec, out).empty()) {
        found = true;
      } else {
        out.streamed.pop_back();
      }
    }
    ASSERT_TRUE(found) << "no token continues the reference at " << pos;
  }
  out.status = grpc::Status::OK;
  out.tokens = out.streamed;
  EXPECT_EQ(workload_->Check(spec, out), "");
  out.tokens.pop_back();
  out.streamed.pop_back();
  EXPECT_NE(workload_->Check(spec, out), "");  // too short for an OK request
}

}  // namespace
}  // namespace vc::chaos
