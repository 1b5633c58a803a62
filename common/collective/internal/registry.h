// Private: the group factories of the built backends, by name.
#pragma once

#include "common/collective/collective.h"

namespace vc::collective {

using GroupFactory = absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> (*)(
    const CollectiveOptions&);

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateCpuGroup(
    const CollectiveOptions& options);
#ifdef VC_HAVE_NCCL
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    const CollectiveOptions& options);
#endif

}  // namespace vc::collective
