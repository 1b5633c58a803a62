// Subcommands of the vericache CLI. Each takes the full argv (argv[1] is the
// command name) and returns the process exit code.
#pragma once

namespace vc::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

int RunGenerate(int argc, char** argv);

}  // namespace vc::cli
