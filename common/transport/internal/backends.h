// The backends' entry points, looked up by name in data_plane.cc.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/data_plane.h"
#include "common/transport/internal/stream.h"

namespace vc::transport::internal {

absl::StatusOr<std::unique_ptr<Listener>> MakeTcpListener(const DataPlaneServerOptions& options);
absl::StatusOr<std::unique_ptr<Connector>> MakeTcpConnector(const DataPlaneClientOptions& options);

// Unavailable (with UCX's reason) if UCX cannot create a context or worker.
absl::StatusOr<std::unique_ptr<Listener>> MakeUcxListener(const DataPlaneServerOptions& options);
absl::StatusOr<std::unique_ptr<Connector>> MakeUcxConnector(const DataPlaneClientOptions& options);

}  // namespace vc::transport::internal
