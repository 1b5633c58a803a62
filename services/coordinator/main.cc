// `vc-coordinator`: the public gRPC API, admission, the multi-pool ring
// scheduler and routing (DESIGN.md section 7). See coordinator_service.h.
// Exit codes: 0 ok (drained), 1 runtime failure, 2 bad flags.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "services/common/daemon.h"
#include "services/coordinator/coordinator_service.h"

namespace {

constexpr char kName[] = "vc-coordinator";

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    out.emplace_back(part);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  vc::daemon::ServerOptions server;
  server.name = kName;
  server.version = "0.2.0";
  server.listen = "127.0.0.1:7430";
  vc::coordinator::CoordinatorOptions o;
  std::string verifiers, drafters;
  double slot_ms = 20;
  int64_t rpc_timeout_ms = 10000;
  int64_t startup_timeout_ms = 60000;
  bool no_kv_refresh = false;
  vc::FlagSet flags(kName,
                    "VeriCache coordinator: public API, admission, ring scheduler, routing.");
  flags.Add("--listen", &server.listen, "HOST:PORT", "public gRPC address (port 0 picks one)");
  flags.Add("--kvstore", &o.kvstore, "HOST:PORT", "vc-kvstore gRPC address (required)");
  flags.Add("--verifiers", &verifiers, "LIST", "comma-separated vc-verifier addresses (required)");
  flags.Add("--drafters", &drafters, "LIST", "comma-separated vc-drafter addresses (required)");
  flags.Add("--metrics-listen", &server.metrics_listen, "HOST:PORT",
            "Prometheus /metrics address (empty: off)");
  flags.Add("--max-active-requests", &o.max_active_requests, "N", "requests running at once");
  flags.Add("--max-queued-requests", &o.max_queued_requests, "N",
            "requests waiting for a place; beyond, RESOURCE_EXHAUSTED");
  flags.Add("--slot-ms", &slot_ms, "X",
            "scheduler slot duration (about one draft step); 0: calibrate from the drafters' "
            "measured step time");
  flags.Add("--window-slots", &o.window_slots, "N", "scheduler lookahead W in slots (>= 3)");
  flags.AddBool("--lock-step", &o.lock_step,
                "ablation: every request verifies in the same slot (links may be oversubscribed)");
  bool no_packing = false;
  flags.AddBool("--no-reload-packing", &no_packing,
                "ablation: a reload books only whole free slots (the paper's model) instead of "
                "also using the leftover of partly booked ones");
  flags.Add("--fast-link-bytes-per-second", &o.fast_link_bytes_per_second, "N",
            "store->verifier bandwidth the scheduler books (0: unlimited)");
  flags.Add("--slow-link-bytes-per-second", &o.slow_link_bytes_per_second, "N",
            "store->drafter bandwidth (0: unlimited)");
  flags.Add("--verifier-memory-bytes", &o.verifier_memory_bytes, "N",
            "transient full-KV capacity per verifier");
  flags.Add("--chunk-tokens", &o.chunk_tokens, "N", "tokens per stored KV chunk");
  flags.Add("--ingest-variants", &o.ingest_variants, "LIST",
            "compressed variants made at ingest, e.g. snapkv:0.25,kivi:4 (the first is the default)");
  flags.Add("--draft-len", &o.draft_len, "N", "default draft length x (the first x when adaptive)");
  flags.Add("--max-draft-len", &o.max_draft_len, "N",
            "adapt x per request up to N from its acceptance (<= --draft-len: fixed x); a "
            "request that sets its draft_len keeps it");
  flags.AddBool("--no-kv-refresh", &no_kv_refresh,
                "do not send the exact K/V of accepted tokens back to the drafter");
  flags.AddBool("--peer-rounds", &o.peer_rounds,
                "run each vericache round between the verifier and the drafter (the verifier "
                "takes the drafts and commits to the drafter, whose refresh rows cross the slow "
                "link from the verifier's peer data plane); --peer-rounds=false relays drafts "
                "and rows through the coordinator");
  flags.AddBool("--leases", &o.leases,
                "with --peer-rounds, grant each request's rounds on one stream to its verifier, "
                "the next round granted while the one before runs (no coordinator call between "
                "rounds); --leases=false sends one Round call per round");
  flags.Add("--draft-model-id", &o.draft_model_id, "auto|none|HEX",
            "the drafter pool's separate draft model: auto takes the first worker's, none "
            "requires drafters of the target, 64 hex digits that draft model (workers print "
            "theirs at start); every worker must report the same one. With a draft model, "
            "refresh rows are never made or sent and the remote baselines are refused");
  flags.Add("--fallback-window", &o.fallback_window, "N",
            "rounds over which acceptance collapse is judged");
  flags.Add("--fallback-min-accepted", &o.fallback_min_accepted, "X",
            "fall back to full-KV decoding below this mean of accepted drafts per round");
  flags.Add("--rpc-timeout-ms", &rpc_timeout_ms, "N", "deadline of each call to a worker or the store");
  flags.Add("--startup-timeout-ms", &startup_timeout_ms, "N",
            "how long to wait for the store and every worker at startup");
  flags.Add("--lossless-check-fraction", &o.lossless_check_fraction, "X",
            "fraction of vericache requests re-run in full_local mode and compared");
  flags.Add("--max-message-bytes", &server.max_message_bytes, "N",
            "largest gRPC message sent or received");
  vc::daemon::AddTlsFlags(flags, &server.tls);
  flags.Add("--api-keys-file", &o.auth.api_keys_file, "PATH",
            "API keys of the tenants ('TENANT KEY' lines or a JSON map; re-read when it "
            "changes); callers send 'authorization: Bearer KEY'. Empty: no authentication");
  flags.Add("--cluster-secret-file", &o.auth.cluster_secret_file, "PATH",
            "secret (>= 16 bytes) keying the tenants' KV salts; required with --api-keys-file");
  int64_t stream_write_timeout_ms = 30000;
  flags.Add("--stream-write-timeout-ms", &stream_write_timeout_ms, "N",
            "end a Generate stream whose reader has not taken a message for this long");
  flags.Add("--max-requests-per-tenant", &o.max_requests_per_tenant, "N",
            "requests one tenant may have running or queued");
  flags.Add("--max-pins-per-tenant", &o.max_pins_per_tenant, "N",
            "prefixes one tenant may pin (0-4095; counted from the store's pins)");
  flags.Add("--max-stored-bytes-per-tenant", &o.max_stored_bytes_per_tenant, "N",
            "KV bytes of one tenant's ingests the store may hold (what it evicted is given "
            "back), charged in a ledger in the store that outlives a restart (0: no limit)");
  int64_t health_check_interval_ms = 1000;
  int64_t health_check_timeout_ms = 2000;
  flags.Add("--health-check-interval-ms", &health_check_interval_ms, "N",
            "probe every worker's Info this often; a failed probe marks it down (placement "
            "skips it) until one succeeds");
  flags.Add("--health-check-timeout-ms", &health_check_timeout_ms, "N", "deadline of one health probe");
  flags.Add("--max-worker-retries", &o.max_worker_retries, "N",
            "times a request whose worker died is re-established on live workers");
  flags.Add("--release-retry-attempts", &o.release_retry_attempts, "N",
            "retries of a session Release that failed at a request's end (off the request "
            "path); 0: leave such sessions to the workers' idle timeouts");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    return vc::daemon::BadFlags(kName, std::string(s.message()));
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  o.verifiers = SplitList(verifiers);
  o.drafters = SplitList(drafters);
  if (o.kvstore.empty()) return vc::daemon::BadFlags(kName, "--kvstore is required");
  if (o.verifiers.empty()) return vc::daemon::BadFlags(kName, "--verifiers is required");
  if (o.drafters.empty()) return vc::daemon::BadFlags(kName, "--drafters is required");
  if (!(slot_ms >= 0)) return vc::daemon::BadFlags(kName, "--slot-ms must be >= 0");
  if (rpc_timeout_ms < 1 || startup_timeout_ms < 1) {
    return vc::daemon::BadFlags(kName, "timeouts must be >= 1 ms");
  }
  if (o.draft_len < 1) return vc::daemon::BadFlags(kName, "--draft-len must be >= 1");
  if (o.fallback_window < 1) return vc::daemon::BadFlags(kName, "--fallback-window must be >= 1");
  if (o.fast_link_bytes_per_second < 0 || o.slow_link_bytes_per_second < 0) {
    return vc::daemon::BadFlags(kName, "link bandwidths must be >= 0");
  }
  if (o.verifier_memory_bytes < 1) {
    return vc::daemon::BadFlags(kName, "--verifier-memory-bytes must be >= 1");
  }
  if (stream_write_timeout_ms < 1) {
    return vc::daemon::BadFlags(kName, "--stream-write-timeout-ms must be >= 1");
  }
  o.stream_write_timeout = std::chrono::milliseconds(stream_write_timeout_ms);
  if (health_check_interval_ms < 1 || health_check_timeout_ms < 1 || o.max_worker_retries < 0 ||
      o.release_retry_attempts < 0) {
    return vc::daemon::BadFlags(kName,
                                "--health-check-interval-ms and --health-check-timeout-ms must be "
                                ">= 1, --max-worker-retries and --release-retry-attempts >= 0");
  }
  o.health_check_interval = std::chrono::milliseconds(health_check_interval_ms);
  o.health_check_timeout = std::chrono::milliseconds(health_check_timeout_ms);
  o.pack_reloads = !no_packing;
  // The public port: TLS that asks for, but never requires, a client
  // certificate (callers present an API key, or a certificate from the
  // cluster CA whose subject CN names their tenant); the same certificate is
  // this daemon's identity towards the store and the workers.
  server.client_certs = vc::rpc::ClientCerts::kRequest;
  o.tls = server.tls;
  if (absl::Status s = vc::daemon::ValidateServerOptions(server); !s.ok()) {
    return vc::daemon::BadFlags(kName, std::string(s.message()));
  }
  o.auto_slot = slot_ms == 0;
  o.slot_seconds = o.auto_slot ? 0.002 : slot_ms / 1000.0;
  o.kv_refresh = !no_kv_refresh;
  o.rpc_timeout = std::chrono::milliseconds(rpc_timeout_ms);
  o.startup_timeout = std::chrono::milliseconds(startup_timeout_ms);
  o.max_message_bytes = static_cast<int>(server.max_message_bytes);
  vc::daemon::InstallCrashReporter(argv[0]);
  vc::daemon::BlockDrainSignals();

  vc::metrics::Registry registry;
  auto service = vc::coordinator::CoordinatorService::Create(o, &registry);
  if (!service.ok()) {
    const bool bad_input = service.status().code() == absl::StatusCode::kInvalidArgument;
    return bad_input ? vc::daemon::BadFlags(kName, std::string(service.status().message()))
                     : vc::daemon::Fail(kName, service.status().ToString());
  }
  auto started = vc::daemon::Server::Start(server, {service->get()}, &registry);
  if (!started.ok()) return vc::daemon::Fail(kName, started.status().ToString());
  return (*started)->WaitForSignalAndDrain([&] { (*service)->Shutdown(); });
}
