// The data plane client over any backend's Connector: a bounded pool of
// connections (one fetch at a time on each), the framing of wire.h, and
// every read bounded by the fetch's deadline.
#pragma once

#include <memory>

#include "common/transport/data_plane.h"
#include "common/transport/internal/stream.h"

namespace vc::transport::internal {

std::unique_ptr<DataPlaneClient> MakeStreamClient(const DataPlaneClientOptions& options,
                                                  std::unique_ptr<Connector> connector);

}  // namespace vc::transport::internal
