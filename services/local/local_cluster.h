// Starts the four VeriCache daemons as child processes on loopback (free
// ports, a temporary data dir), waits until every one answers
// grpc.health.v1, and stops them all (SIGTERM, then SIGKILL after a grace
// period). Used by `vericache local`, the cluster integration tests and the
// cluster benchmark. The daemons are the real binaries, found next to the
// calling executable unless bin_dir says otherwise.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/rpc.h"
#include "services/local/cluster_credentials.h"

namespace vc::local {

struct LocalClusterOptions {
  std::string bin_dir;  // where vc-kvstore etc. live; "" = the running executable's dir
  // Secure by default: a throwaway CA and certificates (mutual TLS on every
  // daemon's gRPC port, server TLS on the coordinator's public port) and two
  // tenants with API keys, in <data_dir>/tls. true: plaintext and no
  // authentication (the --insecure setup).
  bool insecure = false;
  std::string model;     // required
  std::string data_dir;  // "" = a fresh temporary dir, removed by Stop()
  int verifiers = 1;
  int drafters = 1;
  std::string data_plane = "tcp";
  bool metrics = true;     // every daemon serves /metrics on a free port
  int worker_threads = 1;  // compute threads per worker
  // Every worker's --backend (cpu, or cuda in builds with the CUDA backend).
  std::string worker_backend = "cpu";
  // Link pacing at the store and at the verifiers' peer data planes (0 =
  // unpaced) and what the scheduler books.
  double fast_link_bytes_per_second = 0;
  double slow_link_bytes_per_second = 0;
  double fast_link_latency_ms = 0;
  double slow_link_latency_ms = 0;
  double slot_ms = 0;  // 0: the coordinator calibrates it
  bool lock_step = false;
  int chunk_tokens = 64;
  std::string ingest_variants = "snapkv:0.25";
  int draft_len = 8;
  bool prefix_aware = true;
  // The coordinator's --peer-rounds: verifiers and drafters run each round
  // between themselves (false: the coordinator relays drafts and rows).
  bool peer_rounds = true;
  // The coordinator's --leases: with peer rounds, each request's rounds on
  // one stream to its verifier (false: one Round call per round).
  bool leases = true;
  int continuation_tokens = 8;
  // Every worker's --warmup-tokens: the tokens of the engine's throwaway
  // pass at start (1, the workers' default; 0: none). The workers bound it
  // by the model's context and refuse more.
  int64_t warmup_tokens = 1;
  // Every drafter's --draft-weights: f32, or a weight-quantised copy of the
  // model made at load (int8, int4). Verifiers always run f32.
  std::string draft_weights = "f32";
  // A separate draft model (same vocabulary as `model`), given to every
  // verifier (it makes the draft model's variants at ingest) and drafter
  // (it drafts with it) as --draft-model; "" = the drafters run `model`.
  std::string draft_model;
  double lossless_check_fraction = 0;
  int max_active_requests = 64;
  // Seal KV entries (docs/security.md "Sealed KV"): a throwaway Ed25519 key
  // pair is made in the data dir; the verifiers seal what they ingest, the
  // store checks seals on commit and disk reads, workers before use.
  bool seal_kv = true;
  // Encrypt KV at rest (docs/security.md "Encryption of KV at rest"): a
  // random 32-byte KV secret is written to <data_dir>/kv-secret (mode 0600)
  // and every verifier and drafter gets --kv-secret-file. Needs the secure
  // setup (not `insecure`).
  bool kv_encryption = false;
  // Extra flags per daemon ("vc-coordinator" -> {"--flag=value", ...}).
  std::map<std::string, std::vector<std::string>> extra_flags;
  // CPU affinity per role ("kvstore", "verifier", "drafter", "coordinator"):
  // the children of that role run on these CPUs only. Lets one machine stand
  // in for separate local and remote pools (each pool its own cores).
  std::map<std::string, std::vector<int>> cpus;
  // vc-openai, the OpenAI HTTP gateway, in front of the coordinator (started
  // last, stopped first). It needs the model's tokenizer: `tokenizer` or a
  // checkpoint directory holding a tokenizer.json. Endpoint name "openai".
  bool openai = false;
  std::string tokenizer;      // --tokenizer of vc-openai ("" = the checkpoint's)
  std::string chat_template;  // --chat-template FILE ("" = tokenizer_config.json's)
  // Children's stderr goes here (one file per daemon) if set; else inherited.
  std::string log_dir;
  std::chrono::seconds start_timeout{60};
  // Supervision: restart a daemon that exited unexpectedly (crash, kill -9,
  // Kill()) on the same addresses with the same flags. The delay before a
  // restart doubles from restart_backoff up to restart_backoff_max while a
  // daemon keeps dying (like Kubernetes' CrashLoopBackOff) and goes back to
  // restart_backoff once it has run for restart_backoff_reset. Off by default
  // so fault tests can keep a killed daemon dead; `vericache local` turns it on.
  bool supervise = false;
  std::chrono::milliseconds restart_backoff{500};
  std::chrono::milliseconds restart_backoff_max{30000};
  std::chrono::milliseconds restart_backoff_reset{60000};
};

struct Endpoint {
  std::string name;       // "kvstore", "verifier", "verifier-1", "drafter", "coordinator"
  std::string address;    // gRPC HOST:PORT
  std::string metrics;    // HOST:PORT of /metrics, "" if off
  std::string data;       // the store's data plane HOST:PORT
  std::string peer_data;  // a verifier's peer data plane HOST:PORT (peer rounds)
  std::string url;        // HTTP endpoints (vc-openai): the API's base URL (https unless insecure)
  pid_t pid = -1;
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();  // Stop()

  // SIGTERM every child (coordinator first), wait up to `grace`, then SIGKILL.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  const Endpoint* Find(const std::string& name) const;
  std::string coordinator() const;
  const std::string& data_dir() const { return data_dir_; }
  // How a client of the public API reaches the coordinator as `tenant`
  // ("tenant-a" or "tenant-b"): address, CA and API key (plaintext and no
  // key when insecure).
  rpc::ClientConfig client(const std::string& tenant = "tenant-a") const;
  // How an internal client (a test poking the store or a worker) reaches
  // `address`: the CA and a client certificate (plaintext when insecure).
  rpc::ClientConfig internal(const std::string& address) const;
  // The throwaway credentials; null when insecure.
  const ClusterCredentials* credentials() const { return creds_ ? &*creds_ : nullptr; }
  // The endpoints as one JSON object: {"coordinator": "127.0.0.1:PORT", ...,
  // "coordinator_metrics": "127.0.0.1:PORT", ..., "kvstore_data":
  // "HOST:PORT", "openai": "https://127.0.0.1:PORT/v1"} and, when secure,
  // "tls_ca": PATH (it verifies the coordinator's public port and the
  // openai URL) and "api_keys": {"tenant-a": KEY, "tenant-b": KEY}; when
  // insecure the openai URL is http.
  std::string EndpointsJson() const;

  // Fault injection (tests, chaos tooling): kill -9 the daemon `name`
  // ("kvstore", "verifier-1", "coordinator", "openai", ...) and reap it.
  // With supervise on, the supervisor restarts it after its backoff.
  absl::Status Kill(const std::string& name);
  // Start `name` again now on the same addresses, data dir and flags (killed
  // first if it is still running). Its Endpoint keeps its addresses and gets
  // the new pid.
  absl::Status Restart(const std::string& name);
  absl::Status RestartKvStore() { return Restart("kvstore"); }
  // Restarts done by the supervisor so far (all daemons), counted once the
  // new process is healthy.
  int supervisor_restarts() const { return supervisor_restarts_.load(); }

 private:
  LocalCluster() = default;
  // `grpc_health`: ready means grpc.health.v1 SERVING; vc-openai (HTTP) is
  // ready once it printed its listening line (it binds before printing).
  // Replaces the endpoint of the same name in place (a restart) or appends
  // one; remembers how it was started, with "127.0.0.1:0" listen flags
  // pinned to the ports it got, so that a restart comes back on them.
  absl::StatusOr<Endpoint> Spawn(const std::string& name, const std::string& role,
                                 const std::string& binary, const std::vector<std::string>& args,
                                 bool grpc_health = true);
  // Kills (if running) and starts endpoint i again; mu_ held.
  absl::Status RestartLocked(size_t i);
  void Supervise();
  // Waits until GET url/health answers 200 (HTTPS verified by the cluster CA
  // when secure), up to the start timeout.
  absl::Status WaitHttpHealthy(const std::string& url) const;

  // How each endpoint (same index) was started, and its supervision state.
  struct Child {
    std::string role;
    std::string binary;
    std::vector<std::string> args;
    bool grpc_health = true;
    std::chrono::steady_clock::time_point started;
    int crashes = 0;  // consecutive short-lived runs: the backoff exponent
    bool restart_pending = false;
    std::chrono::steady_clock::time_point restart_at;
    std::string exit_reason;
  };
  // Books the next restart of a child that died at `died` (a zero time
  // point: a failed restart); returns the backoff chosen.
  std::chrono::milliseconds ScheduleRestart(Child* child,
                                            std::chrono::steady_clock::time_point died);

  LocalClusterOptions options_;
  std::string bin_dir_;
  std::string data_dir_;
  bool own_data_dir_ = false;
  std::vector<Endpoint> endpoints_;
  std::vector<Child> children_;
  std::optional<ClusterCredentials> creds_;
  // Serialises Kill/Restart/Stop and the supervisor's reaping and restarts.
  // The endpoints vector never changes size after Start(); a restart only
  // changes the pid of its entry.
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> supervisor_restarts_{0};
  std::thread supervisor_;
};

// For a tool that runs clusters to completion (`vericache chaos`, `soak`,
// `demo`, the cluster bench), whose daemons would otherwise outlive it when
// it alone is signalled (a `kill`, a CI timeout; Ctrl-C reaches the whole
// process group anyway): on SIGTERM, SIGINT or SIGHUP, a thread of its own
// prints one line naming `tool` and the signal, sends every daemon of every
// LocalCluster in the process SIGTERM (and SIGCONT, for a paused one), waits
// up to `grace` for them, SIGKILLs the rest, removes the clusters' temporary
// data dirs and ends the process with status 128 + the signal. Call it once,
// before the process starts any other thread: it blocks those signals in the
// calling thread, and threads started later inherit the mask.
void StopClustersOnSignal(std::string tool,
                          std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

// Default model for `vericache local`: $VC_MODELS_DIR/stories260K.bin, else
// ../shared/models/stories260K.bin beside the repository the binary was built
// in. "" if none exists.
std::string DefaultModelPath();

}  // namespace vc::local
