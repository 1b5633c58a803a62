#include "common/collective/collective.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/collective/internal/registry.h"

namespace vc::collective {
namespace {

// The registry: every backend compiled into this binary, by name.
const std::vector<std::pair<std::string, GroupFactory>>& Registry() {
  static const auto* registry = new std::vector<std::pair<std::string, GroupFactory>>{
      {"cpu", &CreateCpuGroup},
#ifdef VC_HAVE_NCCL
      {"nccl", &CreateNcclGroup},
#endif
  };
  return *registry;
}

}  // namespace

std::vector<std::string> RegisteredBackends() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Registry()) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateGroup(
    const CollectiveOptions& options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective group size must be >= 1, got ", options.size));
  }
  for (const auto& [name, factory] : Registry()) {
    if (name == options.backend) return factory(options);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown collective backend '", options.backend,
                                                 "' (registered: ",
                                                 absl::StrJoin(RegisteredBackends(), ", "), ")"));
}

}  // namespace vc::collective
