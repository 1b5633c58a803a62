// What every VeriCache daemon's main() does around its services: flag
// checks for the common flags, signal handling (SIGTERM/SIGINT drain),
// the Prometheus endpoint, a gRPC server with grpc.health.v1, one "listening"
// line on stdout, and a drain with a deadline on shutdown.
// Exit codes: 0 ok (drained), 1 runtime failure, 2 bad flags.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/flags.h"
#include "common/metrics/metrics.h"
#include "common/rpc/rpc.h"
#include "grpcpp/grpcpp.h"

namespace vc::daemon {

struct ServerOptions {
  std::string name;     // e.g. "vc-verifier" (prefix of every message)
  std::string version;  // build_info label
  std::string listen;   // gRPC HOST:PORT (port 0 picks one)
  std::string metrics_listen;  // HOST:PORT, empty: no /metrics
  int64_t max_message_bytes = int64_t{64} << 20;
  int shutdown_deadline_seconds = 5;
  // While it waits for a signal, the daemon hands the heap's free pages
  // back to the kernel this often (glibc's malloc_trim); 0: never. Freed
  // memory otherwise stays resident in glibc's per-thread arenas, and a
  // long run's RSS creeps up with no live allocation behind it.
  int heap_trim_seconds = 60;
  // TLS of the gRPC port (--tls-cert/--tls-key/--tls-ca); empty: plaintext.
  // Internal daemons require a client certificate signed by the CA (mTLS);
  // the coordinator's public port sets kNone (its callers use API keys).
  rpc::TlsFiles tls;
  rpc::ClientCerts client_certs = rpc::ClientCerts::kRequire;
  // Words the listening line carries right after the gRPC address, e.g. the
  // store's "data tcp HOST:PORT" (launchers read it word by word).
  std::string listening_note;
};

// Registers --tls-cert, --tls-key and --tls-ca (the same files serve this
// daemon's port and its calls to other daemons).
void AddTlsFlags(FlagSet& flags, rpc::TlsFiles* tls);

// "name: message (see name --help)" on stderr; returns 2.
int BadFlags(const std::string& name, const std::string& message);
// "name: message" on stderr; returns 1.
int Fail(const std::string& name, const std::string& message);

// Checks the common flags; InvalidArgument naming the flag.
absl::Status ValidateServerOptions(const ServerOptions& options);

// Call first in main(), before any thread starts: blocks SIGTERM/SIGINT in
// every thread (the daemon waits for them with sigwait) and ignores SIGPIPE.
void BlockDrainSignals();
// Waits for SIGTERM or SIGINT (blocked by BlockDrainSignals); returns it.
int WaitForDrainSignal();

// Call at the top of main(): a crash (SIGSEGV, SIGABRT from a failed
// assertion, SIGBUS, SIGFPE, SIGILL) prints the signal and the faulting
// thread's stack, symbolised from `argv0`'s symbol table, to stderr (the
// daemon's log) before the process dies with the signal as before. Without
// it a daemon's log ended with a bare assertion message.
void InstallCrashReporter(const char* argv0);

// Metric registration for daemons: the names are fixed at compile time, so a
// failure is a programming error and aborts with the metric's name.
metrics::CounterFamily* MustCounter(metrics::Registry* registry, const std::string& name,
                                    const std::string& help, std::vector<std::string> labels = {});
metrics::GaugeFamily* MustGauge(metrics::Registry* registry, const std::string& name,
                                const std::string& help, std::vector<std::string> labels = {});
metrics::HistogramFamily* MustHistogram(metrics::Registry* registry, const std::string& name,
                                        const std::string& help, std::vector<std::string> labels,
                                        std::vector<double> buckets);
// Exponential seconds buckets from 100 us to ~100 s.
std::vector<double> SecondsBuckets();

class Server {
 public:
  // Registers build info in `registry`, starts /metrics, builds and starts
  // the gRPC server with `services` and health SERVING. Prints
  // "<name> listening on HOST:PORT [note] [tls|mtls] metrics HOST:PORT" (or
  // "metrics disabled").
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       const std::vector<grpc::Service*>& services,
                                                       metrics::Registry* registry);
  ~Server();

  int port() const { return port_; }
  int metrics_port() const;

  // Waits for SIGTERM/SIGINT (trimming the heap every heap_trim_seconds
  // meanwhile), then drains: health NOT_SERVING, `before_stop`
  // (e.g. fail queued work), gRPC shutdown with the deadline, /metrics stop.
  // Returns 0.
  int WaitForSignalAndDrain(const std::function<void()>& before_stop = nullptr);

 private:
  Server() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace vc::daemon
