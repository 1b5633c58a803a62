// `vericache local`: the four daemons on loopback, for a laptop or a CI
// machine (services/local/local_cluster.h). Prints one line per endpoint
// once all are healthy, optionally writes them as JSON, and stops them all
// cleanly on Ctrl-C or SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/base/flags.h"
#include "common/base/stop_signals.h"
#include "kernels/kernels.h"
#include "kernels/quantized.h"
#include "services/local/local_cluster.h"
#include "services/vericache/commands.h"

namespace vc::cli {

int RunLocal(int argc, char** argv) {
  const std::string cmd = "local";
  local::LocalClusterOptions o;
  o.model = local::DefaultModelPath();
  o.supervise = true;
  std::string endpoints_file;
  bool no_metrics = false;
  bool no_openai = false;
  FlagSet flags("vericache local",
                "Start vc-kvstore, vc-verifier, vc-drafter and vc-coordinator on loopback (free\n"
                "ports, a temporary data dir), and vc-openai (the OpenAI HTTP API) when the model\n"
                "has a tokenizer; wait until all are healthy, print their endpoints, and stop them\n"
                "all on Ctrl-C or SIGTERM.");
  flags.Add("--model", &o.model, "PATH",
            "llama2.c .bin or Hugging Face checkpoint directory (default: the test model "
            "stories260K)");
  flags.Add("--tokenizer", &o.tokenizer, "PATH",
            "tokenizer for the OpenAI API (vc-openai): tokenizer.json or llama2.c tokenizer.bin "
            "(default: the checkpoint directory's tokenizer.json)");
  flags.Add("--chat-template", &o.chat_template, "FILE",
            "Jinja chat template for /v1/chat/completions (default: tokenizer_config.json's)");
  flags.AddBool("--no-openai", &no_openai, "do not start vc-openai (the OpenAI HTTP API)");
  flags.Add("--data-dir", &o.data_dir, "DIR", "store data dir (default: a temporary dir, removed on exit)");
  flags.Add("--verifiers", &o.verifiers, "N", "verifier workers");
  flags.Add("--drafters", &o.drafters, "N", "drafter workers");
  flags.Add("--data-plane", &o.data_plane, "tcp|ucx", "data plane transport");
  flags.AddBool("--no-metrics", &no_metrics, "do not serve /metrics");
  flags.Add("--worker-threads", &o.worker_threads, "N", "compute threads per worker");
  flags.Add("--worker-backend", &o.worker_backend, "cpu|cuda",
            "every worker's kernel backend (cuda: in builds with the CUDA backend; never changes "
            "tokens)");
  flags.Add("--fast-link-bytes-per-second", &o.fast_link_bytes_per_second, "N",
            "pace store->verifier (0: unpaced)");
  flags.Add("--slow-link-bytes-per-second", &o.slow_link_bytes_per_second, "N",
            "pace store->drafter (0: unpaced)");
  flags.Add("--fast-link-latency-ms", &o.fast_link_latency_ms, "X", "store->verifier latency");
  flags.Add("--slow-link-latency-ms", &o.slow_link_latency_ms, "X", "store->drafter latency");
  flags.Add("--slot-ms", &o.slot_ms, "X", "scheduler slot duration");
  flags.AddBool("--lock-step", &o.lock_step, "ablation: every request verifies in the same slot");
  flags.Add("--chunk-tokens", &o.chunk_tokens, "N", "tokens per stored KV chunk");
  flags.Add("--ingest-variants", &o.ingest_variants, "LIST", "compressed variants made at ingest");
  flags.Add("--draft-len", &o.draft_len, "N", "default draft length x");
  flags.AddBool("--prefix-aware", &o.prefix_aware,
                "prefix-aware verification (--prefix-aware=false disables)");
  flags.Add("--continuation-tokens", &o.continuation_tokens, "N",
            "drafter's speculative continuation (0 off)");
  flags.Add("--warmup-tokens", &o.warmup_tokens, "N",
            "every worker's throwaway forward pass at start, in tokens (0: none; at most the "
            "model's context)");
  flags.Add("--draft-weights", &o.draft_weights, "f32|int8|int4",
            "every drafter drafts with a weight-quantised copy of the model made at load "
            "(verification stays f32 and exact)");
  flags.Add("--draft-model", &o.draft_model, "PATH",
            "a separate draft model of the same vocabulary: every drafter drafts with it and "
            "every verifier makes its prefix variants at ingest (no KV refresh; the remote "
            "baselines are refused)");
  flags.Add("--lossless-check-fraction", &o.lossless_check_fraction, "X",
            "share of vericache requests re-run in full_local and compared");
  flags.AddBool("--supervise", &o.supervise,
                "restart a daemon that exits unexpectedly, on the same addresses, with a "
                "doubling backoff (--supervise=false: leave it dead)");
  flags.Add("--log-dir", &o.log_dir, "DIR", "write each daemon's stderr to DIR/<name>.log");
  flags.Add("--endpoints-file", &endpoints_file, "PATH",
            "write the endpoints as one JSON object once all daemons are healthy");
  flags.Add("--bin-dir", &o.bin_dir, "DIR", "where the daemon binaries are (default: beside vericache)");
  flags.AddBool("--insecure", &o.insecure,
                "plaintext gRPC and no API keys (default: a throwaway CA in the data dir, mutual "
                "TLS between the daemons, TLS on the coordinator's port, tenants tenant-a and "
                "tenant-b with API keys)");
  flags.AddBool("--kv-encryption", &o.kv_encryption,
                "encrypt KV at rest per tenant: a random KV secret in the data dir, "
                "--kv-secret-file on every verifier and drafter (not with --insecure)");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  o.metrics = !no_metrics;
  if (absl::Status s = kernels::CheckBackendName(o.worker_backend); !s.ok()) {
    return BadInput(cmd, "--worker-backend: " + std::string(s.message()));
  }
  if (auto w = kernels::ParseWeightFormat(o.draft_weights); !w.ok()) {
    return BadInput(cmd, "--draft-weights: " + std::string(w.status().message()));
  }
  // The upper bound (the model's context) is the workers' to check: they
  // load the model, and refuse a larger value with exit 2.
  if (o.warmup_tokens < 0) {
    return BadInput(cmd, "--warmup-tokens must be between 0 and the model's context");
  }
  if (!o.draft_model.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(o.draft_model, ec)) {
      return BadInput(cmd, "--draft-model: " + o.draft_model + " does not exist");
    }
  }
  // The OpenAI API needs text: a tokenizer given, or one in the checkpoint.
  {
    std::error_code ec;
    const bool has_tokenizer =
        !o.tokenizer.empty() || std::filesystem::exists(std::filesystem::path(o.model) / "tokenizer.json", ec);
    o.openai = !no_openai && has_tokenizer;
    if (!no_openai && !has_tokenizer) {
      std::fprintf(stderr,
                   "vericache local: no tokenizer for %s (give --tokenizer): the OpenAI API is not "
                   "started\n",
                   o.model.c_str());
    }
  }
  if (o.model.empty()) return BadInput(cmd, "--model is required (the test model was not found)");
  if (o.data_plane != "tcp" && o.data_plane != "ucx") return BadInput(cmd, "--data-plane must be tcp or ucx");
  if (o.verifiers < 1 || o.drafters < 1) return BadInput(cmd, "--verifiers and --drafters must be >= 1");
  if (o.kv_encryption && o.insecure) {
    return BadInput(cmd, "--kv-encryption needs authenticated tenants: drop --insecure");
  }

  // Wait for the stop signals with sigwait; children get a clean mask.
  const sigset_t stop = BlockSignals({SIGTERM, SIGINT});
  signal(SIGPIPE, SIG_IGN);

  std::fprintf(stderr, "vericache local: starting the cluster (model %s)...\n", o.model.c_str());
  auto cluster = local::LocalCluster::Start(o);
  if (!cluster.ok()) return Fail(cmd, cluster.status());
  for (const auto& name : {"coordinator", "kvstore"}) {
    if (const auto* ep = (*cluster)->Find(name)) std::printf("%s: %s\n", name, ep->address.c_str());
  }
  if (const auto* ep = (*cluster)->Find("openai")) std::printf("openai: %s\n", ep->url.c_str());
  for (const auto& ep : (*cluster)->endpoints()) {
    if (ep.name != "coordinator" && ep.name != "kvstore" && ep.name != "openai") {
      std::printf("%s: %s\n", ep.name.c_str(), ep.address.c_str());
    }
  }
  for (const auto& ep : (*cluster)->endpoints()) {
    if (!ep.metrics.empty()) {
      std::printf("metrics: http://%s/metrics (%s)\n", ep.metrics.c_str(), ep.name.c_str());
    }
  }
  // Where the credentials are, never the keys themselves.
  if (const local::ClusterCredentials* creds = (*cluster)->credentials()) {
    std::printf("tls_ca: %s\n", creds->ca.c_str());
    std::printf("api_keys_file: %s (tenants tenant-a, tenant-b)\n", creds->api_keys_file.c_str());
  }
  std::fflush(stdout);
  if (!endpoints_file.empty()) {
    // It holds API keys: mode 0600 from the start, written whole, renamed
    // into place so readers never see half a file.
    const std::string tmp = endpoints_file + ".tmp";
    const std::string json = (*cluster)->EndpointsJson() + "\n";
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && fchmod(fd, 0600) == 0 &&
              write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size());
    if (fd >= 0) ok = close(fd) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), endpoints_file.c_str()) != 0) {
      (*cluster)->Stop();
      return Fail(cmd, absl::InternalError("cannot write " + endpoints_file));
    }
  }
  const int sig = WaitForSignal(stop);
  std::fprintf(stderr, "vericache local: signal %d, stopping the cluster\n", sig);
  (*cluster)->Stop();
  return kExitOk;
}

}  // namespace vc::cli
