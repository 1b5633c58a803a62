// vc-verifier's and vc-drafter's --warmup-tokens (issue 15), and `vericache
// local`'s, which forwards it to every worker: a bad value stops the daemon
// with exit 2 and one line naming the bound; a good one (0 disables the
// warm-up pass, the bound itself runs the largest) starts a worker against
// a real vc-kvstore that then drains on SIGTERM with exit 0.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/services/cluster/cluster_test_command.h"
#include "tests/services/kvstore/kvstore_daemon.h"

namespace vc {
namespace {

using Clock = std::chrono::steady_clock;

std::string ModelPath() {
  const char* dir = std::getenv("VC_MODELS_DIR");
  return std::string(dir ? dir : "../shared/models") + "/stories260K.bin";
}

using clustertest::RunCommand;

// A worker daemon as a child process: started, its "listening on" line read
// (bounded), then SIGTERM and its exit code (bounded); killed if still
// running when destroyed.
class Worker {
 public:
  ~Worker() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
  }

  // The listening line, or "" (with what it printed in *error) when it
  // exited or printed none within a minute.
  std::string Start(const std::vector<std::string>& args, std::string* error) {
    int fds[2];
    if (pipe(fds) != 0) return "";
    std::vector<std::string> all = args;
    std::vector<char*> argv;
    argv.reserve(all.size() + 1);
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    std::string out;
    while (Clock::now() < deadline) {
      const size_t at = out.find(" listening on ");
      if (at != std::string::npos && out.find('\n', at) != std::string::npos) {
        const size_t begin = out.rfind('\n', at);
        return out.substr(begin == std::string::npos ? 0 : begin + 1);
      }
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      const ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;  // exited
      out.append(buf, static_cast<size_t>(n));
    }
    *error = out;
    return "";
  }

  // SIGTERM, then the exit code within 30 s (-1 otherwise).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
};

class WorkerFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(ModelPath()).good()) GTEST_SKIP() << "test model not found: " << ModelPath();
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
    for (const Case& c : cases) {
      // The store is never reached: flags are checked before it is.
      const std::string command =
          std::string(daemon) + " --model " + ModelPath() + " --kvstore 127.0.0.1:1 " + c.args;
      std::string out;
      EXPECT_EQ(RunCommand(command, &out), 2) << command << "\n" << out;
      EXPECT_NE(out.find(c.expect), std::string::npos) << command << "\n" << out;
      EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << command << "\n" << out;
    }
  }
  std::string out;
  const std::string local = std::string(VC_CLI_PATH) + " local --warmup-tokens -1";
  EXPECT_EQ(RunCommand(local, &out), 2) << local << "\n" << out;
  EXPECT_NE(out.find("--warmup-tokens must be between 0 and "), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << local << "\n" << out;
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
                                     "--model=" + ModelPath(), "--kvstore=" + store.grpc_addr()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Worker worker;
    std::string printed;
    const std::string line = worker.Start(args, &printed);
    EXPECT_NE(line, "") << c.daemon << " " << c.args.back() << " did not start:\n" << printed;
    if (line.empty()) continue;
    EXPECT_EQ(worker.Stop(), 0) << c.daemon << " " << c.args.back();
  }
  store.SignalAndWait(SIGTERM);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vc
