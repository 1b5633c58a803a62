// Runs the real `vericache model` and `vericache simulate` and checks their
// contract: the JSON fields tooling reads, profiles filling fields with
// explicit flags overriding them, readable tables without --json, and exit 2
// with one line naming the bad flag.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/scratch_dir.h"
#include "tests/services/vericache/cli_runner.h"

namespace {

using vc::testing_cli::RunCli;
using vc::testing_cli::RunResult;

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

const char kReviewExample[] =
    "model long-context --weights-gb 48 --hbm-bw 1600 --link-bw 64 --kv-full-gb 5 --batch 6 "
    "--ratio 0.2 --draft-len 25 --acceptance 0.85";

TEST(ModelCliTest, LongContextJsonContract) {
  RunResult r = RunCli(std::string(kReviewExample) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Lines(r.out), 1);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k :
       {"t_gpu_s", "t_xfer_s", "t_iter_s", "bound", "eta", "tokens_per_s", "c_star"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_NEAR(j["t_gpu_s"].get<double>(), 0.0345, 1e-12);
  EXPECT_NEAR(j["t_xfer_s"].get<double>(), 0.01875, 1e-12);
  EXPECT_EQ(j["bound"], "gpu");
  EXPECT_NEAR(j["eta"].get<double>(), 22.25 / 26, 1e-12);
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), 148.83, 0.01);
  EXPECT_NEAR(j["c_star"].get<double>(), -0.64, 1e-12);

  RunResult c = RunCli(std::string(kReviewExample) + " --continuation --json");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NEAR(nlohmann::json::parse(c.out)["eta"].get<double>(), 22.25 / 25, 1e-12);
}

TEST(ModelCliTest, LinkBoundSide) {
  // rho = 60, tiny weights: c* = 59/25 - 1/60 > c, so the link binds.
  RunResult r = RunCli(
      "model long-context --weights-gb 1 --hbm-bw 3840 --link-bw 64 --kv-full-gb 10 --batch 6 "
      "--ratio 0.2 --draft-len 25 --acceptance 0.85 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bound"], "link");
  EXPECT_GT(j["c_star"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(j["t_iter_s"].get<double>(), j["t_xfer_s"].get<double>());
}

TEST(ModelCliTest, ProfilesFillFieldsAndFlagsOverride) {
  RunResult r = RunCli(
      "model long-context --hw rtx-pro-6000 --model-profile mistral-24b --context-tokens 32768 "
      "--batch 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(j["inputs"]["weights_gb"].get<double>(), 47.14, 1e-9);
  EXPECT_NEAR(j["inputs"]["hbm_bw_gbps"].get<double>(), 1792, 1e-9);
  EXPECT_NEAR(j["inputs"]["link_bw_gbps"].get<double>(), 64, 1e-9);
  EXPECT_NEAR(j["inputs"]["kv_full_gb"].get<double>(), 32768.0 * 163840 / 1e9, 1e-9);
  EXPECT_NEAR(j["inputs"]["hbm_gb"].get<double>(), 96, 1e-9);
  EXPECT_TRUE(j.contains("max_batch_full"));
  EXPECT_TRUE(j.contains("speedup_at_max"));

  RunResult o = RunCli(
      "model long-context --hw rtx-pro-6000 --model-profile mistral-24b --weights-gb 48 "
      "--hbm-bw 1600 --kv-full-gb 5 --batch 6 --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto k = nlohmann::json::parse(o.out);
  EXPECT_NEAR(k["inputs"]["weights_gb"].get<double>(), 48, 1e-12);
  EXPECT_NEAR(k["t_gpu_s"].get<double>(), 0.0345, 1e-12);

  RunResult tp = RunCli(
      "model long-context --hw h100-nvl --tp 2 --model-profile llama-70b --kv-full-gb 10 --batch 4 "
      "--json");
  ASSERT_EQ(tp.exit_code, 0) << tp.err;
  EXPECT_NEAR(nlohmann::json::parse(tp.out)["inputs"]["hbm_bw_gbps"].get<double>(), 7800, 1e-9);
}

TEST(ModelCliTest, RemotePrefixJsonContract) {
  RunResult r = RunCli(
      "model remote-prefix --weights-gb 100 --hbm-bw 1000 --fast-bw 40 --slow-bw 1.2 "
      "--kv-full-gb 10 --output-tokens 330 --ratio 0.25 --draft-len 40 --acceptance 0.8 "
      "--rtt-ms 10 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Lines(r.out), 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(j["t_cycle_s"].get<double>(), 4.22, 1e-9);
  EXPECT_NEAR(j["t_req_s"].get<double>(), 2.5 / 1.2 + 42.2, 1e-9);
  EXPECT_NEAR(j["best_remote_to_local_ratio"].get<double>(), (2.5 / 1.2 + 42.2) / 2.5, 1e-9);

  RunResult c = RunCli(
      "model remote-prefix --hw h100-nvl --tp 2 --model-profile llama-70b --context-tokens 32768 "
      "--remote-gpus 4 --local-gpus 1 --json");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  auto k = nlohmann::json::parse(c.out);
  EXPECT_NEAR(k["inputs"]["slow_bw_gbps"].get<double>(), 1.2, 1e-12);
  EXPECT_GT(k["cluster"]["requests_per_s"].get<double>(), 0);
}

TEST(ModelCliTest, TablesWithoutJson) {
  RunResult r = RunCli(kReviewExample);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("T_iter"), std::string::npos);
  EXPECT_NE(r.out.find("gpu"), std::string::npos);
  EXPECT_GT(Lines(r.out), 5);
  RunResult p = RunCli("model profiles");
  ASSERT_EQ(p.exit_code, 0);
  for (const char* name : {"h100-nvl", "h200", "rtx-pro-6000", "gh200", "llama-3.1-8b",
                           "mistral-24b", "qwen-32b", "llama-70b"}) {
    EXPECT_NE(p.out.find(name), std::string::npos) << name;
  }
}

TEST(ModelCliTest, BadFlagsExitTwoWithOneLineNamingTheFlag) {
  const std::pair<std::string, std::string> cases[] = {
      {std::string(kReviewExample) + " --ratio 0", "--ratio"},
      {std::string(kReviewExample) + " --ratio abc", "--ratio"},
      {std::string(kReviewExample) + " --draft-len 0", "--draft-len"},
      {std::string(kReviewExample) + " --acceptance 1.5", "--acceptance"},
      {std::string(kReviewExample) + " --batch 0", "--batch"},
      {std::string(kReviewExample) + " --bogus 1", "--bogus"},
      {"model long-context --hbm-bw 1600 --link-bw 64 --kv-full-gb 5 --batch 6", "--weights-gb"},
      {"model long-context --weights-gb 48 --hbm-bw 1600 --link-bw 64 --batch 6", "--kv-full-gb"},
      {"model long-context --weights-gb 48 --link-bw 64 --kv-full-gb 5 --batch 6", "--hbm-bw"},
      {"model long-context --hw a100 --model-profile llama-70b --kv-full-gb 5 --batch 6", "--hw"},
      {"model remote-prefix --hw h200 --model-profile qwen-32b --kv-full-gb 5 --slow-bw 0",
       "--slow-bw"},
      {"model nonsense", "nonsense"},
      {"simulate", "--config"},
      {"simulate --config /nonexistent.json", "--config"},
      {"simulate --config " VC_SOURCE_DIR "/bench/sim/long_context_mistral24b.json --ratio 2",
       "ratio"},
      {"simulate --config " VC_SOURCE_DIR "/bench/sim/long_context_mistral24b.json --schedule x",
       "--schedule"},
      {"simulate --config " VC_SOURCE_DIR
       "/bench/sim/long_context_mistral24b.json --shared-prefixes -1",
       "--shared-prefixes"},
      {"simulate --config " VC_SOURCE_DIR
       "/bench/sim/long_context_mistral24b.json --prefix-sharing maybe",
       "--prefix-sharing"},
  };
  for (const auto& [args, flag] : cases) {
    RunResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_EQ(Lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

TEST(SimulateCliTest, JsonAndTimeseries) {
  const vc::test_support::ScratchDir scratch("vc_sim_ts_");
  const std::string csv = scratch / "timeseries.csv";
  RunResult r = RunCli("simulate --config " VC_SOURCE_DIR
                       "/bench/sim/fig6_lockstep_vs_staggered.json --json --timeseries " +
                       csv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Lines(r.out), 1);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"tokens_per_s", "ttft_s", "tpot_s", "verify_stall_s", "links", "gpus"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["requests"], 10);
  EXPECT_EQ(j["output_tokens"], 3100);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(j["schedule"], "staggered");
  EXPECT_DOUBLE_EQ(j["links"][0]["overrun_s"].get<double>(), 0);
  std::ifstream in(csv);
  std::string header;
  ASSERT_TRUE(std::getline(in, header));
  EXPECT_EQ(header.rfind("t_s,active,waiting,link_busy:pcie0", 0), 0u) << header;
  int rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  EXPECT_GT(rows, 10);

  // The override flips the schedule: lock-step books beyond the link.
  RunResult l = RunCli("simulate --config " VC_SOURCE_DIR
                       "/bench/sim/fig6_lockstep_vs_staggered.json --schedule lock-step --json");
  ASSERT_EQ(l.exit_code, 0) << l.err;
  auto k = nlohmann::json::parse(l.out);
  EXPECT_EQ(k["schedule"], "lock-step");
  EXPECT_GT(k["links"][0]["overrun_s"].get<double>(), 0);
  EXPECT_GT(k["verify_stall_s"].get<double>(), j["verify_stall_s"].get<double>());
}

// The same workload over 4 stored prefixes with sharing off and on: the JSON
// reports the joins and the bytes moved, and sharing moves fewer.
TEST(SimulateCliTest, PrefixSharingOffAndOn) {
  nlohmann::json out[2];
  for (int on = 0; on < 2; ++on) {
    RunResult r = RunCli(std::string("simulate --config " VC_SOURCE_DIR
                                     "/bench/sim/remote_prefix_llama70b.json --requests 16 "
                                     "--shared-prefixes 4 --json --prefix-sharing ") +
                         (on ? "on" : "off"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    out[on] = nlohmann::json::parse(r.out);
    EXPECT_EQ(out[on]["prefix_sharing"]["shared_prefixes"], 4);
    EXPECT_EQ(out[on]["prefix_sharing"]["sharing"], on == 1);
  }
  EXPECT_EQ(out[0]["prefix_sharing"]["joins"], 0);
  EXPECT_GT(out[1]["prefix_sharing"]["joins"].get<int>(), 0);
  EXPECT_GT(out[1]["prefix_sharing"]["resident_shared"].get<int>(), 0);
  EXPECT_EQ(out[0]["output_tokens"], out[1]["output_tokens"]);
  EXPECT_LT(out[1]["reload_bytes"].get<double>(), out[0]["reload_bytes"].get<double>());
  EXPECT_LT(out[1]["startup_bytes"].get<double>(), out[0]["startup_bytes"].get<double>());
}

TEST(SimulateCliTest, EveryExampleConfigRuns) {
  for (const char* name :
       {"fig6_lockstep_vs_staggered", "long_context_mistral24b", "long_context_poisson",
        "remote_prefix_llama70b", "empirical_acceptance"}) {
    RunResult r = RunCli(std::string("simulate --config " VC_SOURCE_DIR "/bench/sim/") + name +
                         ".json --requests 8");
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << name;
  }
}

}  // namespace
