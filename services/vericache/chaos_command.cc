// `vericache chaos` and `vericache soak` (services/chaos/chaos.h): a local
// cluster under a seeded fault schedule or a fixed request rate, checked
// token for token against full-KV decoding. Exit 0 only when nothing was
// wrong: no wrong token, every failure a clean status, nothing leaked.
#include <cctype>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "common/base/flags.h"
#include "services/chaos/chaos.h"
#include "services/local/local_cluster.h"
#include "services/vericache/commands.h"

namespace vc::cli {
namespace {

void AddSetupFlags(FlagSet& flags, chaos::ClusterSetup* s, bool* insecure) {
  flags.Add("--model", &s->model, "PATH", "llama2.c .bin or HF checkpoint dir");
  flags.Add("--bin-dir", &s->bin_dir, "DIR",
            "where the daemon binaries are (default: beside vericache)");
  flags.AddBool("--insecure", insecure, "plaintext and no API keys (default: mTLS + API keys)");
  flags.Add("--verifiers", &s->verifiers, "N", "verifier workers");
  flags.Add("--drafters", &s->drafters, "N", "drafter workers");
  flags.Add("--concurrency", &s->concurrency, "N", "requests in flight at most");
  flags.Add("--max-new-tokens", &s->max_new_tokens, "N",
            "largest max_new_tokens drawn for a request");
  flags.Add("--drain-seconds", &s->drain_seconds, "S",
            "how long daemons get to release everything after the run");
  flags.Add("--session-idle-seconds", &s->session_idle_seconds, "N",
            "workers release sessions untouched this long (below --drain-seconds)");
  flags.Add("--max-cancel-seconds", &s->max_cancel_seconds, "S",
            "a cancel that lands mid-request must end its stream within this");
  flags.Add("--log-dir", &s->log_dir, "DIR",
            "daemon logs (default: a temporary dir, removed on success, kept on failure)");
}

absl::Status CheckSetup(const chaos::ClusterSetup& s) {
  if (s.model.empty())
    return absl::InvalidArgumentError("--model is required (the test model was not found)");
  if (s.verifiers < 1 || s.drafters < 1)
    return absl::InvalidArgumentError("--verifiers and --drafters must be >= 1");
  if (s.concurrency < 1 || s.concurrency > 256)
    return absl::InvalidArgumentError("--concurrency must be 1..256");
  if (s.max_new_tokens < 4 || s.max_new_tokens > 256) {
    return absl::InvalidArgumentError("--max-new-tokens must be 4..256");
  }
  if (s.drain_seconds <= 0 || s.drain_seconds > 3600) {
    return absl::InvalidArgumentError("--drain-seconds must be in (0, 3600]");
  }
  if (!(s.max_cancel_seconds > 0) || s.max_cancel_seconds > 3600) {
    return absl::InvalidArgumentError("--max-cancel-seconds must be in (0, 3600]");
  }
  if (s.session_idle_seconds < 1 || s.session_idle_seconds > 86400) {
    return absl::InvalidArgumentError("--session-idle-seconds must be 1..86400");
  }
  return absl::OkStatus();
}

}  // namespace

int RunChaos(int argc, char** argv) {
  const std::string cmd = "chaos";
  chaos::ChaosOptions o;
  o.setup.model = local::DefaultModelPath();
  bool insecure = false;
  FlagSet flags("vericache chaos",
                "Start a local cluster (2 verifiers, 2 drafters, secure) and run a mixed workload\n"
                "(every lossless mode, compressors, greedy/seeded/rejection sampling, shared and\n"
                "distinct prefixes, client cancels) while a fault schedule drawn from --seed\n"
                "kill -9s and restarts drafters, verifiers and the store and pauses daemons\n"
                "(SIGSTOP/SIGCONT); with --link-faults it also cuts and throttles links. Every\n"
                "completed request is compared with full-KV decoding; every failure must carry\n"
                "a clean status; every daemon must be idle afterwards.\n"
                "Prints one summary line; exit 0 pass, 1 a violation, 2 bad input.");
  AddSetupFlags(flags, &o.setup, &insecure);
  flags.Add("--seed", &o.seed, "N", "fault schedule and workload seed (0: a fresh one, printed)");
  flags.Add("--duration", &o.duration_s, "S", "seconds of faults and requests");
  flags.Add("--faults", &o.max_faults, "N", "at most this many faults");
  flags.Add("--requests", &o.max_requests, "N", "at most this many requests");
  flags.Add("--min-faults", &o.min_faults, "N", "fail unless at least N faults were injected");
  flags.Add("--min-requests", &o.min_requests, "N", "fail unless at least N requests ran");
  flags.Add("--fault-gap", &o.mean_fault_gap_s, "S", "mean seconds between two faults");
  flags.Add("--cancel-fraction", &o.setup.cancel_fraction, "X",
            "share of requests the client cancels, at a point drawn inside the request's "
            "expected life (after a random share of its tokens streamed)");
  flags.AddBool("--link-faults", &o.link_faults,
                "also cut and throttle the store's and workers' links (root, ip and tc; the "
                "cluster runs in a network namespace of its own) (default off)");
  flags.Add("--throttle-rate", &o.throttle_rate, "RATE", "tc rate of a throttled link");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  o.setup.insecure = insecure;
  {
    // Digits, an optional fraction and a tc unit; checked here so a typo
    // fails before any cluster starts.
    const std::string& r = o.throttle_rate;
    size_t i = 0;
    while (i < r.size() && (std::isdigit(static_cast<unsigned char>(r[i])) || r[i] == '.')) ++i;
    const std::string unit = r.substr(i);
    if (i == 0 || (unit != "bit" && unit != "kbit" && unit != "mbit" && unit != "gbit" &&
                   unit != "bps" && unit != "kbps" && unit != "mbps")) {
      return BadInput(cmd, "--throttle-rate must be a tc rate such as 1mbit or 500kbit");
    }
  }
  if (absl::Status s = CheckSetup(o.setup); !s.ok()) return Fail(cmd, s);
  if (o.duration_s <= 0 || o.duration_s > 86400)
    return BadInput(cmd, "--duration must be in (0, 86400]");
  if (o.max_faults < 0 || o.max_requests < 1)
    return BadInput(cmd, "--faults must be >= 0 and --requests >= 1");
  if (o.mean_fault_gap_s <= 0) return BadInput(cmd, "--fault-gap must be > 0");
  if (o.setup.cancel_fraction < 0 || o.setup.cancel_fraction > 1) {
    return BadInput(cmd, "--cancel-fraction must be in [0, 1]");
  }
  // The namespace first: StopClustersOnSignal starts a thread, and a
  // thread that runs before unshare stays outside the namespace (which
  // LinkFaultNamespace refuses).
  std::unique_ptr<chaos::LinkFaultNamespace> links;
  if (o.link_faults) {
    absl::StatusOr<std::unique_ptr<chaos::LinkFaultNamespace>> entered =
        chaos::LinkFaultNamespace::Enter();
    if (!entered.ok()) return Fail(cmd, entered.status());
    links = std::move(*entered);
  }
  local::StopClustersOnSignal("vericache " + cmd);
  absl::StatusOr<chaos::ChaosReport> r = chaos::RunChaos(o, std::cerr, links.get());
  if (!r.ok()) return Fail(cmd, r.status());
  std::printf("%s\n", chaos::SummaryLine(*r).c_str());
  std::fflush(stdout);
  return r->ok() ? kExitOk : kExitFailure;
}

int RunSoak(int argc, char** argv) {
  const std::string cmd = "soak";
  chaos::SoakOptions o;
  o.setup.model = local::DefaultModelPath();
  bool insecure = false;
  FlagSet flags(
      "vericache soak",
      "Start a local cluster and send requests at a fixed rate for --duration: RSS of\n"
      "every daemon sampled (least-squares slope after --warmup, MiB per 10 minutes),\n"
      "p50/p99 TTFT and tokens/s per window, --cancels random cancels during the run,\n"
      "then serial cancel probes (Cancel -> every worker idle). Every completed request is\n"
      "compared with full-KV decoding. Exit 0 pass, 1 a violation, 2 bad input.");
  AddSetupFlags(flags, &o.setup, &insecure);
  flags.Add("--seed", &o.seed, "N", "workload seed (0: a fresh one, printed)");
  flags.Add("--duration", &o.duration_s, "S", "seconds at the fixed rate");
  flags.Add("--rate", &o.rate, "R", "requests started per second");
  flags.Add("--window", &o.window_s, "S", "TTFT / tokens/s window");
  flags.Add("--rss-interval", &o.rss_interval_s, "S", "RSS sampling period");
  flags.Add("--warmup", &o.warmup_s, "S", "RSS samples before this are left out of the slope");
  flags.Add("--cancels", &o.cancels, "N",
            "cancels spread over the run, each after a random share of its request's expected "
            "tokens");
  flags.Add("--cancel-probes", &o.cancel_probes, "N",
            "serial cancel-to-freed measurements after the run");
  flags.Add("--max-rss-slope", &o.max_rss_slope, "X",
            "fail when a daemon other than the store grows faster than X MiB per 10 min (0: "
            "report only)");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  o.setup.insecure = insecure;
  if (absl::Status s = CheckSetup(o.setup); !s.ok()) return Fail(cmd, s);
  if (o.max_rss_slope < 0) return BadInput(cmd, "--max-rss-slope must be >= 0");
  if (o.duration_s <= 0 || o.duration_s > 7 * 86400)
    return BadInput(cmd, "--duration must be in (0, 604800]");
  if (o.rate <= 0 || o.rate > 1000) return BadInput(cmd, "--rate must be in (0, 1000]");
  if (o.window_s <= 0 || o.rss_interval_s <= 0 || o.warmup_s < 0) {
    return BadInput(cmd, "--window and --rss-interval must be > 0, --warmup >= 0");
  }
  if (o.cancels < 0 || o.cancel_probes < 0 || o.cancel_probes > 100000) {
    return BadInput(cmd, "--cancels and --cancel-probes must be >= 0");
  }
  local::StopClustersOnSignal("vericache " + cmd);
  absl::StatusOr<chaos::SoakReport> r = chaos::RunSoak(o, std::cerr);
  if (!r.ok()) return Fail(cmd, r.status());
  std::printf("%s\n", chaos::SummaryLine(*r).c_str());
  std::fflush(stdout);
  return r->ok() ? kExitOk : kExitFailure;
}

}  // namespace vc::cli
