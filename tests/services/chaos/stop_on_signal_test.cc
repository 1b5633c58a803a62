// `vericache chaos` signalled on its own (a `kill`, a CI timeout: not Ctrl-C,
// which reaches the daemons too) stops its cluster before it exits
// (local::StopClustersOnSignal): no daemon outlives it, its temporary data
// dir is gone, it exits with 128 + the signal and says why in one line.
// Before, the daemons ran on, reparented to init.
//
// The test makes itself a child subreaper, so that whatever the tool leaves
// behind is reparented here and can be counted (and cleaned up).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/scratch_dir.h"

namespace vc::chaos {
namespace {

using Clock = std::chrono::steady_clock;

class StopOnSignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("VC_MODELS_DIR");
    model_ = std::string(dir ? dir : "/work/shared/models") + "/stories260K.bin";
    if (!std::filesystem::exists(model_)) GTEST_SKIP() << "test model not found: " << model_;
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }

  void TearDown() override {
    // Whatever is left (a failed run): killed, so that nothing outlives us.
    for (pid_t pid : ChildrenOf(getpid())) kill(pid, SIGKILL);
    while (waitpid(-1, nullptr, 0) > 0) {
    }
  }

  // Starts `vericache chaos` (TMPDIR = tmp_, daemon logs in logs_) with its
  // stderr on a pipe.
  void StartChaos() {
    int err[2];
    ASSERT_EQ(pipe(err), 0);
    const std::string tool = std::string(VC_DAEMON_DIR) + "/vericache";
    const std::string tmpdir = "TMPDIR=" + tmp_.path();
    tool_ = fork();
    ASSERT_GE(tool_, 0);
    if (tool_ == 0) {
      dup2(err[1], STDERR_FILENO);
      close(err[0]);
      close(err[1]);
      putenv(const_cast<char*>(tmpdir.c_str()));
      execl(tool.c_str(), tool.c_str(), "chaos", "--insecure", "--verifiers", "1", "--drafters",
            "1", "--seed", "5", "--duration", "600", "--model", model_.c_str(), "--log-dir",
            logs_.path().c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(err[1]);
    err_ = err[0];
  }

  // Reads the tool's stderr until a line holding `what` (true) or the tool
  // closed it or `timeout` passed (false).
  bool WaitForLine(const std::string& what, std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (size_t nl = output_.find('\n', scanned_); nl != std::string::npos) {
        const bool found = output_.substr(scanned_, nl - scanned_).find(what) != std::string::npos;
        scanned_ = nl + 1;
        if (found) return true;
        continue;
      }
      pollfd p{err_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(err_, buf, sizeof(buf));
      if (n <= 0) return false;
      output_.append(buf, static_cast<size_t>(n));
    }
    return false;
  }

  // The rest of the tool's stderr, up to its end.
  void ReadToEnd() {
    char buf[4096];
    ssize_t n;
    while ((n = read(err_, buf, sizeof(buf))) > 0) output_.append(buf, static_cast<size_t>(n));
    close(err_);
  }

  // Live processes whose parent is `parent` (the tool's orphans land here,
  // in this process).
  static std::vector<pid_t> ChildrenOf(pid_t parent) {
    std::vector<pid_t> pids;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      FILE* f = std::fopen((entry.path() / "stat").c_str(), "r");
      if (f == nullptr) continue;
      int pid = 0, ppid = 0;
      char state = 0;
      // pid (comm) state ppid: comm has no ')' for our binaries.
      const int got = std::fscanf(f, "%d %*[^)]) %c %d", &pid, &state, &ppid);
      std::fclose(f);
      if (got == 3 && ppid == parent && state != 'Z') pids.push_back(pid);
    }
    return pids;
  }

  // Signals the tool alone, waits for it, and checks that it stopped its
  // cluster: exit 128 + sig, its line, no daemon left, no data dir left.
  void SignalAndCheck(int sig) {
    ASSERT_EQ(kill(tool_, sig), 0);
    int status = 0;
    ASSERT_EQ(waitpid(tool_, &status, 0), tool_);
    ReadToEnd();
    ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << output_;
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << output_;
    EXPECT_NE(output_.find("vericache chaos: signal " + std::to_string(sig)), std::string::npos)
        << output_;
    // Its daemons got SIGTERM and, by the time it exited, had ended (or
    // were killed): reparented here as zombies at most.
    std::vector<pid_t> left = ChildrenOf(getpid());
    EXPECT_TRUE(left.empty()) << left.size() << " daemon(s) outlived vericache chaos:\n" << output_;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(tmp_.path(), ec)) {
      ADD_FAILURE() << "left behind: " << entry.path();
    }
  }

  std::string model_;
  test_support::ScratchDir logs_{"stop-on-signal-logs-"};
  test_support::ScratchDir tmp_{"stop-on-signal-tmp-"};
  pid_t tool_ = -1;
  int err_ = -1;
  std::string output_;
  size_t scanned_ = 0;
};

// Mid-run: requests and faults under way.
TEST_F(StopOnSignalTest, SigtermMidRunStopsEveryDaemon) {
  ASSERT_NO_FATAL_FAILURE(StartChaos());
  ASSERT_TRUE(WaitForLine("faults scheduled", std::chrono::seconds(180))) << output_;
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(ChildrenOf(tool_).size(), 4u);  // the store, a verifier, a drafter, the coordinator
  SignalAndCheck(SIGTERM);
}

// While the cluster starts: daemons spawned but not all healthy yet.
TEST_F(StopOnSignalTest, SigintWhileTheClusterStartsStopsEveryDaemon) {
  ASSERT_NO_FATAL_FAILURE(StartChaos());
  ASSERT_TRUE(WaitForLine("starting the cluster", std::chrono::seconds(120))) << output_;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  SignalAndCheck(SIGINT);
}

}  // namespace
}  // namespace vc::chaos
