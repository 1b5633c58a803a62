// vc-verifier's and vc-drafter's --warmup-tokens (issue 15), and `vericache
// local`'s, which forwards it to every worker: a bad value stops the daemon
// with exit 2 and one line naming the bound; a good one (0 disables the
// warm-up pass, the bound itself runs the largest) starts a worker against
// a real vc-kvstore that then drains on SIGTERM with exit 0.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/services/cluster/cluster_test_command.h"
#include "tests/services/cluster/cluster_test_text.h"
#include "tests/services/kvstore/kvstore_daemon.h"

namespace vc {
namespace {

using clustertest::RunCommand;

// A worker daemon as a child process (stdout and stderr): the line it
// printed " listening on " in, or "" (with what it printed in *error) when it
// exited or printed none within a minute.
std::string StartWorker(testing::ChildProcess& worker, const std::vector<std::string>& args,
                        std::string* error) {
  if (!worker.Spawn(args, /*merge_stderr=*/true, error)) return "";
  std::string out;
  if (!worker.ReadThroughLine(" listening on ", std::chrono::seconds(60), &out)) {
    *error = out;
    return "";
  }
  const size_t at = out.find(" listening on ");
  const size_t begin = out.rfind('\n', at);
  return out.substr(begin == std::string::npos ? 0 : begin + 1);
}

// `daemon` with the test model, a store nobody answers at (flags are checked
// before it is reached) and `args`: exit 2 and one line containing `expect`.
void ExpectBadFlags(const std::string& daemon, const std::string& args, const std::string& expect) {
  const std::string command =
      daemon + " --model " + clustertest::StoriesModelPath() + " --kvstore 127.0.0.1:1 " + args;
  std::string out;
  EXPECT_EQ(RunCommand(command, &out), 2) << command << "\n" << out;
  EXPECT_NE(out.find(expect), std::string::npos) << command << "\n" << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << command << "\n" << out;
}

class WorkerFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(clustertest::StoriesModelPath()).good())
      GTEST_SKIP() << "test model not found: " << clustertest::StoriesModelPath();
  }
};

TEST_F(WorkerFlagsTest, BadWarmupTokensExitTwoWithOneLine) {
  struct Case {
    std::string args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"--warmup-tokens -1", "--warmup-tokens must be between 0 and "},
      {"--warmup-tokens 1000000", "--warmup-tokens must be between 0 and "},
      // --max-batch-tokens bounds it below the context (256 for stories260K).
      {"--max-batch-tokens 8 --warmup-tokens 9", "--warmup-tokens must be between 0 and 8 "},
      {"--warmup-tokens many", "--warmup-tokens"},
  };
  for (const char* daemon : {VC_VERIFIER_PATH, VC_DRAFTER_PATH}) {
    for (const Case& c : cases) ExpectBadFlags(daemon, c.args, c.expect);
  }
  std::string out;
  const std::string local = std::string(VC_CLI_PATH) + " local --warmup-tokens -1";
  EXPECT_EQ(RunCommand(local, &out), 2) << local << "\n" << out;
  EXPECT_NE(out.find("--warmup-tokens must be between 0 and "), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << local << "\n" << out;
}

// --backend names a registered kernel backend, checked before the model
// loads: an unknown one stops either worker with exit 2 and one line naming
// what this build has; quantised drafting needs the cpu backend (in a build
// without CUDA, cuda is refused as unknown).
TEST_F(WorkerFlagsTest, BadBackendExitsTwoWithOneLine) {
  for (const char* daemon : {VC_VERIFIER_PATH, VC_DRAFTER_PATH}) {
    ExpectBadFlags(daemon, "--backend tpu", "--backend: unknown kernel backend 'tpu' (available: ");
  }
  const std::string command = std::string(VC_DRAFTER_PATH) + " --model " +
                              clustertest::StoriesModelPath() +
                              " --kvstore 127.0.0.1:1 --backend cuda --draft-weights int4";
  std::string out;
  EXPECT_EQ(RunCommand(command, &out), 2) << command << "\n" << out;
  EXPECT_TRUE(out.find("--draft-weights int4 needs --backend cpu") != std::string::npos ||
              out.find("unknown kernel backend 'cuda'") != std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << command << "\n" << out;
  for (const char* command : {" local --worker-backend tpu", " demo --worker-backend tpu"}) {
    const std::string cli = std::string(VC_CLI_PATH) + command;
    std::string said;  // RunCommand appends
    EXPECT_EQ(RunCommand(cli, &said), 2) << cli << "\n" << said;
    EXPECT_NE(said.find("--worker-backend: unknown kernel backend 'tpu'"), std::string::npos)
        << said;
    EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << cli << "\n" << said;
  }
}

// The verifier's peer data plane (peer rounds) must be reachable by
// drafters: a wildcard address without an advertised one, or a malformed
// address, stops it with exit 2 and one line, before the model loads.
TEST_F(WorkerFlagsTest, BadPeerDataAddressesExitTwoWithOneLine) {
  struct Case {
    std::string args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"--listen 0.0.0.0:0", "--peer-data-advertise HOST:PORT"},
      {"--peer-data-listen 0.0.0.0:0", "--peer-data-advertise HOST:PORT"},
      {"--peer-data-listen nowhere", "--peer-data-listen"},
      {"--peer-data-listen 127.0.0.1:0 --peer-data-advertise :7", "--peer-data-advertise"},
      {"--peer-data-listen off --peer-data-advertise 10.0.0.1:7411",
       "--peer-data-advertise needs --peer-data-listen"},
  };
  for (const Case& c : cases) ExpectBadFlags(VC_VERIFIER_PATH, c.args, c.expect);
}

TEST_F(WorkerFlagsTest, GoodWarmupTokensStartAndDrain) {
  const std::string dir = ::testing::TempDir() + "/vc_worker_flags_" + std::to_string(getpid());
  testing::Daemon store;
  std::string error;
  ASSERT_TRUE(store.Start({"--listen=127.0.0.1:0", "--data-listen=127.0.0.1:0",
                           "--metrics-listen=127.0.0.1:0", "--data-dir=" + dir},
                          &error))
      << error;
  struct Case {
    const char* daemon;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {VC_VERIFIER_PATH, {"--warmup-tokens=0"}},
      {VC_DRAFTER_PATH, {"--warmup-tokens=0"}},
      // The largest allowed: a pass of --max-batch-tokens tokens.
      {VC_VERIFIER_PATH, {"--max-batch-tokens=64", "--warmup-tokens=64"}},
      {VC_DRAFTER_PATH, {"--warmup-tokens=16"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {c.daemon, "--listen=127.0.0.1:0", "--threads=1",
                                     "--model=" + clustertest::StoriesModelPath(),
                                     "--kvstore=" + store.grpc_addr()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    testing::ChildProcess worker;
    std::string printed;
    const std::string line = StartWorker(worker, args, &printed);
    EXPECT_NE(line, "") << c.daemon << " " << c.args.back() << " did not start:\n" << printed;
    if (line.empty()) continue;
    EXPECT_EQ(worker.SignalAndWait(SIGTERM, std::chrono::seconds(30)), 0)
        << c.daemon << " " << c.args.back();
  }
  store.SignalAndWait(SIGTERM);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vc
