// `vericache`: the command-line front end (generate, the local cluster, the
// cluster client, models and simulation). Exit codes: 0 ok, 1 runtime
// failure, 2 bad input.
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
    "  tokenize     text -> token ids (tokenizer.json or llama2.c tokenizer.bin)\n"
    "  detokenize   token ids -> text\n"
    "  model        closed-form throughput models: long-context, remote-prefix, profiles\n"
    "  simulate     discrete-event simulation of a deployment under the ring scheduler\n"
    "  local        start the four daemons on loopback (a local cluster)\n"
    "  demo         local cluster + shared prefixes + a demo workload, with a report\n"
    "  client       talk to a cluster: client generate | client status\n"
    "  ingest       register a prefix with a cluster (store its full and compressed KV)\n"
    "  prefix       pin, unpin or delete a registered prefix\n"
    "  chat-template  render a conversation with a model's chat template\n"
    "  chaos        local cluster under seeded kill -9 / restart / pause faults, checked\n"
    "  soak         local cluster at a fixed rate: RSS slopes, TTFT, cancel latency\n"
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
  if (command == "tokenize") return vc::cli::RunTokenize(argc, argv);
  if (command == "detokenize") return vc::cli::RunDetokenize(argc, argv);
  if (command == "model") return vc::cli::RunModel(argc, argv);
  if (command == "simulate") return vc::cli::RunSimulate(argc, argv);
  if (command == "local") return vc::cli::RunLocal(argc, argv);
  if (command == "demo") return vc::cli::RunDemo(argc, argv);
  if (command == "client") return vc::cli::RunClient(argc, argv);
  if (command == "ingest") return vc::cli::RunIngest(argc, argv);
  if (command == "prefix") return vc::cli::RunPrefix(argc, argv);
  if (command == "chat-template") return vc::cli::RunChatTemplate(argc, argv);
  if (command == "chaos") return vc::cli::RunChaos(argc, argv);
  if (command == "soak") return vc::cli::RunSoak(argc, argv);
  std::fprintf(stderr, "vericache: unknown command '%s' (see vericache --help)\n", command.c_str());
  return 2;
}
