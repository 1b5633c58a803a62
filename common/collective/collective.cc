#include "common/collective/collective.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/collective/internal/registry.h"

namespace vc::collective {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, GroupFactory> factories{{"cpu", &CreateCpuGroup}};
};

Registry& GetRegistry() {
  static auto* registry = new Registry();
  return *registry;
}

}  // namespace

void RegisterBackend(const std::string& name, GroupFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = factory;
}

std::vector<std::string> RegisteredBackends() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateGroup(
    const CollectiveOptions& options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective group size must be >= 1, got ", options.size));
  }
  GroupFactory factory = nullptr;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(options.backend);
    if (it != r.factories.end()) factory = it->second;
  }
  if (factory == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown collective backend '", options.backend,
                                                   "' (registered: ",
                                                   absl::StrJoin(RegisteredBackends(), ", "), ")"));
  }
  return factory(options);
}

}  // namespace vc::collective
