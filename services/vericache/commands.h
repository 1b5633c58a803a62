// Subcommands of the vericache CLI. Each takes the full argv (argv[1] is the
// command name) and returns the process exit code.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace vc::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

int RunGenerate(int argc, char** argv);
int RunCompressors(int argc, char** argv);
int RunClient(int argc, char** argv);
int RunIngest(int argc, char** argv);
int RunPrefix(int argc, char** argv);
int RunLocal(int argc, char** argv);
int RunDemo(int argc, char** argv);
int RunModel(int argc, char** argv);
int RunSimulate(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunDetokenize(int argc, char** argv);
int RunChatTemplate(int argc, char** argv);
int RunChaos(int argc, char** argv);
int RunSoak(int argc, char** argv);

// One line "vericache <command>: <msg>" on stderr; returns kExitBadInput.
int BadInput(const std::string& command, const std::string& msg);
// Prints the status' message the same way; exit 2 for input errors
// (InvalidArgument, NotFound, ...), 1 otherwise.
int Fail(const std::string& command, const absl::Status& status);

}  // namespace vc::cli
