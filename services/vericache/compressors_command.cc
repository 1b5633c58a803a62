#include <cstdio>
#include <iostream>

#include "common/base/flags.h"
#include "common/compress/compressor.h"
#include "nlohmann/json.hpp"
#include "services/vericache/commands.h"

namespace vc::cli {

int RunCompressors(int argc, char** argv) {
  bool json = false;
  FlagSet flags("vericache compressors", "List the KV compressors and their parameters.");
  flags.AddBool("--json", &json, "print a JSON array instead of a table");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail("compressors", s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  const std::vector<CompressorInfo> all = ListCompressors();
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const CompressorInfo& c : all) {
      nlohmann::json params = nlohmann::json::array();
      for (const auto& p : c.params) {
        params.push_back({{"name", p.name}, {"default", p.default_value}, {"description", p.description}});
      }
      out.push_back({{"name", c.name},
                     {"family", c.family},
                     {"description", c.description},
                     {"takes_ratio", c.takes_ratio},
                     {"takes_bits", c.takes_bits},
                     {"needs_attention_stats", c.needs_attention_stats},
                     {"online", OnlinePolicyKindName(c.online)},
                     {"online_rule", c.online_rule},
                     {"params", params}});
    }
    std::cout << out.dump(2) << std::endl;
    return kExitOk;
  }
  for (const CompressorInfo& c : all) {
    std::printf("%-20s %-15s %s\n", c.name.c_str(), c.family.c_str(), c.description.c_str());
    for (const auto& p : c.params) {
      std::printf("    %-16s %s (default: %s)\n", p.name.c_str(), p.description.c_str(),
                  p.default_value.c_str());
    }
    std::printf("    %-16s %s\n", "online update:", c.online_rule.c_str());
  }
  return kExitOk;
}

}  // namespace vc::cli
