// Runs the `vericache` binary under test (VC_CLI_PATH, set per test target)
// the way a user's shell would, and returns its exit code, stdout and stderr:
// the one runner every CLI test in this folder uses.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/scratch_dir.h"

namespace vc::testing_cli {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// `env` (e.g. "VERICACHE_API_KEY=k") is put in front of the command line.
inline RunResult RunCli(const std::string& args, const std::string& env = "") {
  static const test_support::ScratchDir scratch("vc_cli_");  // goes when the process exits
  const std::string err_path = scratch / "stderr.txt";
  const std::string cmd = env + " " + std::string(VC_CLI_PATH) + " " + args + " 2>" + err_path;
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* e = fopen(err_path.c_str(), "r")) {
    while ((n = fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
    fclose(e);
  }
  return r;
}

inline int CountLines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace vc::testing_cli
