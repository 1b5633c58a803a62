// Private: the group factories of the backends, by name. "cpu" is built in;
// optional backends (nccl) live in their own libraries and add themselves
// with RegisterBackend when a binary that links them asks for it.
#pragma once

#include <string>

#include "common/collective/collective.h"

namespace vc::collective {

using GroupFactory = absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> (*)(
    const CollectiveOptions&);

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateCpuGroup(
    const CollectiveOptions& options);

// Adds (or replaces) a backend; thread-safe.
void RegisterBackend(const std::string& name, GroupFactory factory);

}  // namespace vc::collective
