#include "common/metrics/metrics_server.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "common/http/accept_loop.h"
#include "common/http/httplib.h"

namespace vc::metrics {

struct MetricsServer::Impl {
  const Registry* registry = nullptr;
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::mutex stop_mu;
  bool stopped = false;  // guarded by stop_mu
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() { Stop(); }

int MetricsServer::port() const { return impl_->port; }

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Registry* registry,
                                                                    MetricsServerOptions options) {
  if (registry == nullptr) return absl::InvalidArgumentError("MetricsServer: registry is null");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MetricsServer: bad port ", options.port));
  }
  if (options.num_threads < 1) return absl::InvalidArgumentError("MetricsServer: num_threads must be >= 1");
  if (options.keep_alive_timeout_s < 0 || options.read_timeout_s < 0) {
    return absl::InvalidArgumentError("MetricsServer: keep_alive_timeout_s and read_timeout_s must be >= 0");
  }

  auto impl = std::make_unique<Impl>();
  impl->registry = registry;
  httplib::Server& srv = impl->server;
  const size_t threads = static_cast<size_t>(options.num_threads);
  srv.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  srv.set_keep_alive_timeout(options.keep_alive_timeout_s);
  srv.set_read_timeout(options.read_timeout_s, 0);
  // httplib's default sets SO_REUSEPORT, which would let a second daemon bind
  // the same port silently; SO_REUSEADDR alone only allows a quick restart.
  srv.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  srv.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Expose(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // Unmatched routes get httplib's default 404.

  int port = options.port;
  if (port == 0) {
    port = srv.bind_to_any_port(options.address);
    if (port < 0) port = 0;
  } else if (!srv.bind_to_port(options.address, port)) {
    port = 0;
  }
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("MetricsServer: cannot bind ", options.address, ":", options.port));
  }
  impl->port = port;
  if (absl::Status s = http::StartAcceptLoop(srv, &impl->thread, "MetricsServer"); !s.ok()) {
    return s;
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

void MetricsServer::Stop() {
  if (impl_ == nullptr) return;
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace vc::metrics
