// Child processes for the data plane's process-level tests (a probe server
// to kill, commands inside network namespaces). posix_spawn only, so it is
// safe in a process that already runs UCX threads.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

extern char** environ;

namespace vc::transport::testing {

class Subprocess {
 public:
  // Starts argv[0] (a path) with stdout+stderr on a pipe. pid() < 0 on failure.
  explicit Subprocess(const std::vector<std::string>& argv) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    out_fd_ = fds[0];
  }
  ~Subprocess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
    if (out_fd_ >= 0) ::close(out_fd_);
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Reads output until a line containing `needle` has arrived (true) or
  // `seconds` pass or the output ends (false).
  bool WaitForLine(const std::string& needle, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (output_.find(needle) == std::string::npos ||
           output_.find('\n', output_.find(needle)) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !ReadSome(static_cast<int>(left.count()))) return false;
    }
    return true;
  }

  // Reads the rest of the output, then reaps the process; its exit status
  // (128 + signal if killed). Gives up (and kills it) after `seconds`.
  int Finish(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        ::kill(pid_, SIGKILL);
        break;
      }
      if (!ReadSome(static_cast<int>(left.count()))) break;
    }
    return Wait();
  }

  void Signal(int sig) { ::kill(pid_, sig); }
  const std::string& output() const { return output_; }

 private:
  bool ReadSome(int timeout_ms) {
    pollfd p{out_fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool exited_ = false;
  std::string output_;
};

// Runs a command to completion; returns (exit status, output).
inline std::pair<int, std::string> RunCommand(const std::vector<std::string>& argv,
                                              double seconds = 60) {
  Subprocess p(argv);
  if (p.pid() < 0) return {-1, "cannot start " + argv[0]};
  const int rc = p.Finish(seconds);
  return {rc, p.output()};
}

}  // namespace vc::transport::testing
