// Runs the real `vc-kvstore` binary (VC_KVSTORE_PATH) as a child process for
// the daemon tests: starts it, reads its "listening on" line, signals and
// reaps it. Every wait is bounded; the destructor kills a daemon that is
// still running.
#pragma once

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace vc::testing {

// A binary run as a child process: its output read through a pipe, up to a
// line with a given mark (bounded), then signalled and reaped (bounded). The
// destructor kills one still running.
class ChildProcess {
 public:
  using Clock = std::chrono::steady_clock;

  ~ChildProcess() { Kill(); }

  // Starts argv (argv[0] the binary) with its stdout (and its stderr too,
  // with `merge_stderr`) on a pipe. False (with *error) if it cannot.
  bool Spawn(std::vector<std::string> argv, bool merge_stderr, std::string* error) {
    int fds[2];
    if (pipe(fds) != 0) {
      *error = "pipe failed";
      return false;
    }
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      if (merge_stderr) dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
    if (pid_ < 0) {
      *error = "fork failed";
      return false;
    }
    return true;
  }

  // Reads the output until a whole line holding `mark` (the first line of
  // all, with an empty mark) and returns everything read up to the end of
  // that line. False (with what was read in *out) when the process closed
  // its output or `timeout` passed first.
  bool ReadThroughLine(const std::string& mark, Clock::duration timeout, std::string* out) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      const size_t at = out->find(mark);
      if (at != std::string::npos) {
        const size_t eol = out->find('\n', at);
        if (eol != std::string::npos) {
          out->resize(eol + 1);
          return true;
        }
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[512];
      const ssize_t n = read(out_fd_, buf, sizeof(buf));
      if (n <= 0) return false;  // exited
      out->append(buf, static_cast<size_t>(n));
    }
  }

  // Sends `sig` and waits up to `timeout` for the exit; the exit code, or
  // -1 (killed by a signal, or still running: Kill() reaps it).
  int SignalAndWait(int sig, Clock::duration timeout) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    const auto deadline = Clock::now() + timeout;
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

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (out_fd_ >= 0) {
      close(out_fd_);
      out_fd_ = -1;
    }
  }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
};

class Daemon {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kStartTimeout = std::chrono::seconds(60);  // ASan + RocksDB open
  static constexpr auto kExitTimeout = std::chrono::seconds(15);

  // Starts the daemon and reads its "listening on" line. False (with
  // *error) on failure or timeout.
  bool Start(const std::vector<std::string>& args, std::string* error) {
    std::vector<std::string> all = {VC_KVSTORE_PATH};
    all.insert(all.end(), args.begin(), args.end());
    if (!process_.Spawn(std::move(all), /*merge_stderr=*/false, error)) return false;
    std::string line;
    if (!process_.ReadThroughLine("", kStartTimeout, &line)) {
      *error = "daemon closed stdout or timed out before its listening line; got: " + line;
      return false;
    }
    // "vc-kvstore listening on HOST:PORT data KIND HOST:PORT [tls|mtls]
    // metrics HOST:PORT", read word by word as the launchers do.
    const std::string kListening = "vc-kvstore listening on ";
    const size_t at = line.find(kListening);
    if (at == std::string::npos) {
      *error = "unexpected listening line: " + line;
      return false;
    }
    std::vector<std::string> words;
    {
      std::istringstream in(line.substr(at, line.find('\n', at) - at));
      for (std::string w; in >> w;) words.push_back(w);
    }
    std::string metrics;
    for (size_t i = 0; i + 1 < words.size(); ++i) {
      if (words[i] == "on" && i == 2) grpc_addr_ = words[i + 1];
      if (words[i] == "data" && i + 2 < words.size()) data_addr_ = words[i + 2];
      if (words[i] == "metrics") metrics = words[i + 1];
    }
    if (data_addr_.empty()) {
      *error = "unexpected listening line: " + line;
      return false;
    }
    const size_t colon = metrics.rfind(':');
    if (colon == std::string::npos || grpc_addr_.find(':') == std::string::npos) {
      *error = "unexpected listening line: " + line;
      return false;
    }
    metrics_host_ = metrics.substr(0, colon);
    metrics_port_ = std::atoi(metrics.c_str() + colon + 1);
    if (metrics_port_ <= 0) {
      *error = "bad metrics port in: " + line;
      return false;
    }
    return true;
  }

  // Sends `sig` and waits (bounded) for exit; the exit code, or -1.
  int SignalAndWait(int sig) { return process_.SignalAndWait(sig, kExitTimeout); }

  void Kill() { process_.Kill(); }

  const std::string& grpc_addr() const { return grpc_addr_; }
  pid_t pid() const { return process_.pid(); }
  const std::string& data_addr() const { return data_addr_; }
  const std::string& metrics_host() const { return metrics_host_; }
  int metrics_port() const { return metrics_port_; }

 private:
  ChildProcess process_;
  std::string grpc_addr_, metrics_host_, data_addr_;
  int metrics_port_ = 0;
};

// The resident set of process `pid` in bytes (VmRSS), or -1.
inline int64_t ResidentBytes(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

}  // namespace vc::testing
