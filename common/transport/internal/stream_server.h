// The data plane server over any backend's Listener: one accept thread, one
// thread per connection (at most max_connections), the framing of wire.h,
// every response paced through its link class's LinkPacer, and every stage
// upload read through it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/data_plane.h"
#include "common/transport/internal/stream.h"

namespace vc::transport::internal {

absl::StatusOr<std::unique_ptr<DataPlaneServer>> StartStreamServer(
    const DataPlaneServerOptions& options, BlobLookup lookup, BlobStager stager,
    std::unique_ptr<Listener> listener);

}  // namespace vc::transport::internal
