// Shared by the cluster suites: running a daemon or the CLI as a shell
// command, for the bad-flag checks (exit code and the one line it prints).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace vc::clustertest {

// Runs `command` through the shell; returns its exit code (-1 if it did not
// exit normally) and appends its output, stderr merged, to `output`.
inline int RunCommand(const std::string& command, std::string* output) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace vc::clustertest
