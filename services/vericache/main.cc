// `vericache`: the command-line front end (generate; more subcommands as the
// system grows). Exit codes: 0 ok, 1 runtime failure, 2 bad input.
#include <cstdio>
#include <cstring>
#include <string>

#include "services/vericache/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: vericache <command> [flags]\n"
    "\n"
    "VeriCache: lossless decoding over compressed KV caches.\n"
    "\n"
    "commands:\n"
    "  generate     generate tokens: full KV, lossless VeriCache, or the lossy baseline\n"
    "  compressors  list the KV compressors and their parameters\n"
    "\n"
    "Run 'vericache <command> --help' for the flags of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "generate") return vc::cli::RunGenerate(argc, argv);
  if (command == "compressors") return vc::cli::RunCompressors(argc, argv);
  std::fprintf(stderr, "vericache: unknown command '%s' (see vericache --help)\n", command.c_str());
  return 2;
}
