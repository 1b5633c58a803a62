#include "services/common/daemon.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/stop_signals.h"
#include "common/metrics/metrics_server.h"
#include "common/rpc/rpc.h"
#include "grpcpp/health_check_service_interface.h"

namespace vc::daemon {

namespace {

// Returns the free pages of every malloc arena to the kernel (not only the
// top of the main heap, which glibc's own threshold trims).
void TrimHeap() {
#if defined(__GLIBC__)
  (void)malloc_trim(0);
#endif
}

}  // namespace

int BadFlags(const std::string& name, const std::string& message) {
  std::fprintf(stderr, "%s: %s (see %s --help)\n", name.c_str(), message.c_str(), name.c_str());
  return 2;
}

int Fail(const std::string& name, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", name.c_str(), message.c_str());
  return 1;
}

absl::Status ValidateServerOptions(const ServerOptions& options) {
  std::string host;
  int port = 0;
  if (absl::Status s = rpc::SplitHostPort("--listen", options.listen, &host, &port); !s.ok()) {
    return s;
  }
  if (!options.metrics_listen.empty()) {
    if (absl::Status s = rpc::SplitHostPort("--metrics-listen", options.metrics_listen, &host, &port);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = rpc::ValidateTlsFiles(options.tls, /*need_identity=*/true); !s.ok()) {
    return s;
  }
  if (options.max_message_bytes <= 0 || options.max_message_bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-message-bytes must be in [1, ", INT_MAX, "]"));
  }
  if (options.heap_trim_seconds < 0) {
    return absl::InvalidArgumentError("heap_trim_seconds must be >= 0 (0: never)");
  }
  return absl::OkStatus();
}

void AddTlsFlags(FlagSet& flags, rpc::TlsFiles* tls) {
  flags.Add("--tls-cert", &tls->cert, "PATH",
            "PEM certificate chain of this daemon (gRPC port and calls to other daemons); "
            "re-read when it changes");
  flags.Add("--tls-key", &tls->key, "PATH", "PEM private key of --tls-cert");
  flags.Add("--tls-ca", &tls->ca, "PATH",
            "PEM CA bundle that peers' certificates must chain to; empty (with --tls-cert and "
            "--tls-key empty): plaintext gRPC");
}

metrics::CounterFamily* MustCounter(metrics::Registry* registry, const std::string& name,
                                    const std::string& help, std::vector<std::string> labels) {
  auto f = registry->AddCounter(name, help, std::move(labels));
  VC_CHECK(f.ok(), name.c_str());
  return *f;
}

metrics::GaugeFamily* MustGauge(metrics::Registry* registry, const std::string& name,
                                const std::string& help, std::vector<std::string> labels) {
  auto f = registry->AddGauge(name, help, std::move(labels));
  VC_CHECK(f.ok(), name.c_str());
  return *f;
}

metrics::HistogramFamily* MustHistogram(metrics::Registry* registry, const std::string& name,
                                        const std::string& help, std::vector<std::string> labels,
                                        std::vector<double> buckets) {
  auto f = registry->AddHistogram(name, help, std::move(labels), std::move(buckets));
  VC_CHECK(f.ok(), name.c_str());
  return *f;
}

std::vector<double> SecondsBuckets() {
  std::vector<double> b;
  for (double v = 1e-4; v < 200; v *= 2.5) b.push_back(v);
  return b;
}

namespace {
constexpr std::initializer_list<int> kDrainSignals = {SIGTERM, SIGINT};

// Little more than async-signal-safe work in the handler (snprintf of
// integers and strings, which takes no lock): write(2), glibc's backtrace()
// (unwinds by the .eh_frame tables, so through glibc's abort() and the
// signal frame, which keep no frame pointers; preloaded at install time, as
// its first call may allocate) and absl::Symbolize (reads the ELF symbol
// tables, local symbols included, without allocating).
void WriteString(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void OnCrash(int sig) {
  char line[1024];
  const char* abbrev = sigabbrev_np(sig);
  std::snprintf(line, sizeof(line), "*** SIG%s (signal %d) received; stack, innermost first:\n",
                abbrev != nullptr ? abbrev : "?", sig);
  WriteString(line);
  void* pcs[64];
  const int n = ::backtrace(pcs, 64);
  for (int i = 0; i < n; ++i) {
    char name[512];
    // A return address is one past its call: look up the call's byte.
    void* pc = i == 0 ? pcs[i] : static_cast<char*>(pcs[i]) - 1;
    if (!absl::Symbolize(pc, name, sizeof(name))) std::snprintf(name, sizeof(name), "(unknown)");
    std::snprintf(line, sizeof(line), "    @ %p  %s\n", pcs[i], name);
    WriteString(line);
  }
  // SA_RESETHAND restored the default action: die of the signal itself.
  ::raise(sig);
}

}  // namespace

void InstallCrashReporter(const char* argv0) {
  absl::InitializeSymbolizer(argv0);
  void* warm[1];
  ::backtrace(warm, 1);
  struct sigaction sa {};
  sa.sa_handler = OnCrash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (const int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

void BlockDrainSignals() {
  (void)BlockSignals(kDrainSignals);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForDrainSignal() { return WaitForSignal(BlockSignals(kDrainSignals)); }

struct Server::Impl {
  ServerOptions options;
  std::unique_ptr<metrics::MetricsServer> metrics;
  std::unique_ptr<grpc::Server> grpc;
  std::string host;
};

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      const std::vector<grpc::Service*>& services,
                                                      metrics::Registry* registry) {
  if (absl::Status s = ValidateServerOptions(options); !s.ok()) return s;
  auto server = std::unique_ptr<Server>(new Server());
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.options = options;
  if (absl::Status s = metrics::RegisterBuildInfo(*registry, options.version); !s.ok()) return s;
  std::string metrics_host;
  if (!options.metrics_listen.empty()) {
    int metrics_port = 0;
    (void)rpc::SplitHostPort("--metrics-listen", options.metrics_listen, &metrics_host,
                             &metrics_port);
    metrics::MetricsServerOptions mopts;
    mopts.address = metrics_host;
    mopts.port = metrics_port;
    auto started = metrics::MetricsServer::Start(registry, mopts);
    if (!started.ok()) return started.status();
    impl.metrics = std::move(*started);
  }
  int listen_port = 0;
  (void)rpc::SplitHostPort("--listen", options.listen, &impl.host, &listen_port);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second daemon (or a restarted one
  // whose port another process took meanwhile) would bind the same port
  // silently and the kernel would split connections between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(
      options.listen, rpc::ServerCredentials(options.tls, options.client_certs), &server->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  for (grpc::Service* s : services) builder.RegisterService(s);
  impl.grpc = builder.BuildAndStart();
  if (impl.grpc == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  if (auto* health = impl.grpc->GetHealthCheckService()) health->SetServingStatus(true);
  std::string line = absl::StrCat(options.name, " listening on ", impl.host, ":", server->port_);
  // Extra words go after the address and before "metrics" (launchers parse
  // "on ADDR", "data KIND ADDR" and "metrics ADDR").
  if (!options.listening_note.empty()) absl::StrAppend(&line, " ", options.listening_note);
  if (options.tls.enabled()) {
    absl::StrAppend(&line, options.client_certs == rpc::ClientCerts::kRequire ? " mtls" : " tls");
  }
  if (impl.metrics) {
    absl::StrAppend(&line, " metrics ", metrics_host, ":", impl.metrics->port());
  } else {
    absl::StrAppend(&line, " metrics disabled");
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return server;
}

Server::~Server() {
  if (impl_ && impl_->grpc) {
    impl_->grpc->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    impl_->grpc->Wait();
  }
  if (impl_ && impl_->metrics) impl_->metrics->Stop();
}

int Server::metrics_port() const { return impl_->metrics ? impl_->metrics->port() : 0; }

int Server::WaitForSignalAndDrain(const std::function<void()>& before_stop) {
  const sigset_t set = BlockSignals(kDrainSignals);
  const int trim_seconds = impl_->options.heap_trim_seconds;
  int sig = 0;
  while (true) {
    if (trim_seconds <= 0) {
      sig = WaitForSignal(set);
      break;
    }
    const timespec period{trim_seconds, 0};
    const int got = sigtimedwait(&set, nullptr, &period);
    if (got > 0) {
      sig = got;
      break;
    }
    if (errno == EAGAIN) TrimHeap();  // else EINTR: wait again
  }
  const std::string& name = impl_->options.name;
  std::fprintf(stderr, "%s: signal %d, draining\n", name.c_str(), sig);
  const auto start = std::chrono::steady_clock::now();
  if (auto* health = impl_->grpc->GetHealthCheckService()) health->SetServingStatus(false);
  if (before_stop) before_stop();
  impl_->grpc->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(impl_->options.shutdown_deadline_seconds));
  impl_->grpc->Wait();
  impl_->grpc.reset();
  if (impl_->metrics) impl_->metrics->Stop();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)
          .count();
  std::fprintf(stderr, "%s: stopped after %lld ms\n", name.c_str(), static_cast<long long>(ms));
  return 0;
}

}  // namespace vc::daemon
