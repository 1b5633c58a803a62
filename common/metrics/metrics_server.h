// HTTP endpoint for Prometheus scrapes: serves GET /metrics (text exposition
// format 0.0.4) from a Registry on a background thread; every other path is
// 404. Stop() (or the destructor) shuts it down: it stops accepting at once
// and waits for open connections, which cpp-httplib only notices between
// requests, so it can take up to keep_alive_timeout_s (+ read_timeout_s for a
// client stalled mid-request); the defaults keep that near one second.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace vc::metrics {

struct MetricsServerOptions {
  // Address to bind. Default "127.0.0.1" (loopback only).
  std::string address = "127.0.0.1";
  // TCP port; 0 (the default) picks a free one, see MetricsServer::port().
  int port = 0;
  // Worker threads answering requests. Default 2, must be >= 1.
  int num_threads = 2;
  // Seconds an idle keep-alive connection is held open. Default 1; it bounds
  // how long Stop() waits for an idle client.
  int keep_alive_timeout_s = 1;
  // Seconds to wait for a client to send its request. Default 1.
  int read_timeout_s = 1;
};

class MetricsServer {
 public:
  // Binds and starts serving `registry`, which must outlive the server.
  // InvalidArgument for bad options, Unavailable if the bind fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const Registry* registry,
                                                                            MetricsServerOptions options = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port (the picked one when options.port was 0).
  int port() const;
  // Stops accepting, finishes in-flight requests and joins the threads
  // (see the bound above). Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vc::metrics
