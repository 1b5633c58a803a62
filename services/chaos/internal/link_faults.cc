#include "services/chaos/internal/link_faults.h"

#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/chaos/internal/cluster_ops.h"

extern char** environ;

namespace vc::chaos::internal {
namespace {

constexpr const char* kFaultClass = "1:4";
// The unshaped classes' rate: far above what loopback carries here.
constexpr const char* kUnshaped = "100gbit";

bool OnPath(const std::string& tool) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/sbin:/usr/bin:/sbin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string file = dirs.substr(start, end - start) + "/" + tool;
    if (end > start && access(file.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

absl::Status Tc(std::vector<std::string> args) {
  args.insert(args.begin(), "tc");
  return RunTool(args);
}

}  // namespace

absl::Status RunTool(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string output;
  if (rc == 0) {
    char buf[4096];
    ssize_t n;
    // Bounded: only the start of a tool's complaint is worth reporting.
    while ((n = read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0 && output.size() < 2000) output.append(buf, static_cast<size_t>(n));
    }
  }
  close(fds[0]);
  const std::string command = absl::StrJoin(argv, " ");
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat(command, ": ", std::strerror(rc)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    for (char& c : output) {
      if (c == '\n') c = ' ';
    }
    return absl::InternalError(absl::StrCat(command, " failed: ", output.substr(0, 300)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LinkFaults>> LinkFaults::Enter() {
  const std::string what = "--link-faults: ";
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        what + "needs root (a network namespace of the run's own, shaped with tc)");
  }
  for (const char* tool : {"ip", "tc"}) {
    if (!OnPath(tool)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, "'", tool, "' not found on the PATH (Debian package iproute2)"));
    }
  }
  if (const int threads = ThreadCount(getpid()).value_or(-1); threads != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "the process already runs ", threads,
                     " threads; the network namespace must be entered before any starts"));
  }
  if (unshare(CLONE_NEWNET) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "unshare(CLONE_NEWNET): ", std::strerror(errno)));
  }
  auto faults = std::unique_ptr<LinkFaults>(new LinkFaults());
  for (const std::vector<std::string>& step : std::vector<std::vector<std::string>>{
           {"ip", "link", "set", "lo", "up"},
           {"tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1"},
           {"tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate",
            kUnshaped, "quantum", "200000"}}) {
    if (absl::Status s = RunTool(step); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(what, s.message()));
    }
  }
  // The kernel must also have what a fault uses (u32, pfifo): try one now
  // rather than fail at the first fault.
  if (absl::Status s = faults->Throttle({1}, "1mbit"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, s.message()));
  }
  if (absl::Status s = faults->Clear(); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, s.message()));
  }
  return faults;
}

LinkFaults::~LinkFaults() { (void)Clear(); }

absl::Status LinkFaults::Cut(const std::vector<int>& ports) { return Apply(ports, "8bit", 1); }

absl::Status LinkFaults::Throttle(const std::vector<int>& ports, const std::string& rate) {
  return Apply(ports, rate, 1000);
}

absl::Status LinkFaults::Apply(const std::vector<int>& ports, const std::string& rate,
                               int queue_packets) {
  if (absl::Status s = Clear(); !s.ok()) return s;
  active_ = true;
  absl::Status s = Tc({"class", "add", "dev", "lo", "parent", "1:", "classid", kFaultClass, "htb",
                       "rate", rate, "ceil", rate, "burst", "256kb", "cburst", "256kb"});
  if (s.ok()) {
    s = Tc({"qdisc", "add", "dev", "lo", "parent", kFaultClass, "handle", "40:", "pfifo", "limit",
            absl::StrCat(queue_packets)});
  }
  for (size_t i = 0; s.ok() && i < ports.size(); ++i) {
    for (const char* side : {"dport", "sport"}) {
      if (!s.ok()) break;
      s = Tc({"filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
              "match", "ip", side, absl::StrCat(ports[i]), "0xffff", "flowid", kFaultClass});
    }
  }
  if (!s.ok()) (void)Clear();
  return s;
}

absl::Status LinkFaults::Clear() {
  if (!active_) return absl::OkStatus();
  // Filters first (they point at the class); a fresh class per fault, so no
  // token debt of a cut carries over to the next one.
  absl::Status filters = Tc({"filter", "del", "dev", "lo", "parent", "1:", "prio", "1"});
  absl::Status cls = Tc({"class", "del", "dev", "lo", "classid", kFaultClass});
  active_ = false;
  // Deleting what is not there (a fault that failed half-way) is fine.
  if (!cls.ok() && cls.message().find("find") == std::string::npos &&
      cls.message().find("No such") == std::string::npos) {
    return cls;
  }
  (void)filters;
  return absl::OkStatus();
}

}  // namespace vc::chaos::internal
