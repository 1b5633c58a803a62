// The data plane server over any backend's Listener: one accept thread, one
// readiness watcher and a pool of worker threads (see StreamServer in the
// .cc for the threading model), the framing of wire.h,
// every response paced through its link class's LinkPacer, and every stage
// upload read through it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/data_plane.h"
#include "common/transport/internal/stream.h"

namespace vc::transport::internal {

// A StageSink over a plain stager: no admission, the peer ignored.
std::shared_ptr<StageSink> MakeStagerSink(BlobStager stager);

absl::StatusOr<std::unique_ptr<DataPlaneServer>> StartStreamServer(
    const DataPlaneServerOptions& options, BlobLookup lookup, std::shared_ptr<StageSink> sink,
    std::unique_ptr<Listener> listener);

}  // namespace vc::transport::internal
