// `vericache simulate`: runs the discrete-event simulator (common/sim) on a
// JSON configuration (bench/sim/README.md), with flags that override its key
// fields, and prints the result as JSON or a readable summary.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/costmodel/cost_model.h"
#include "common/sim/simulator.h"
#include "services/vericache/commands.h"

namespace vc::cli {
namespace {

using costmodel::kGB;

struct SimulateFlags {
  std::string config;
  std::string timeseries;
  bool json = false;
  // Overrides; "not given" is tracked with FlagSet::was_set.
  std::string mode, schedule;
  int64_t requests = 0;
  double rate = 0;
  int concurrency = 0;
  double ratio = 0;
  int draft_len = 0;
  double acceptance_p = 0;
  std::string acceptance_csv;
  int acceptance_csv_draft_len = 0;
  bool continuation = false;
  double slot_ms = 0;
  int window_slots = 0;
  int gpus = 0, drafters = 0, verifiers = 0, max_batch = 0;
  int shared_prefixes = 0;
  std::string prefix_sharing;
  double prompt_tokens = 0, output_tokens = 0;
  double hbm_gb = 0, hbm_bw = 0, link_bw = 0, fast_bw = 0, slow_bw = 0, rtt_ms = 0;
  uint64_t seed = 0;
};

absl::Status ApplyOverrides(const SimulateFlags& f, const FlagSet& flags, sim::SimConfig& c) {
  if (flags.was_set("--mode")) {
    if (f.mode == "vericache") {
      c.mode = sim::SimConfig::Mode::kVeriCache;
    } else if (f.mode == "full") {
      c.mode = sim::SimConfig::Mode::kFull;
    } else {
      return absl::InvalidArgumentError("--mode must be vericache or full, got '" + f.mode + "'");
    }
  }
  if (flags.was_set("--schedule")) {
    if (f.schedule == "staggered") {
      c.schedule = sim::SimConfig::Schedule::kStaggered;
    } else if (f.schedule == "lock-step") {
      c.schedule = sim::SimConfig::Schedule::kLockStep;
    } else {
      return absl::InvalidArgumentError("--schedule must be staggered or lock-step, got '" +
                                        f.schedule + "'");
    }
  }
  if (flags.was_set("--rate") && flags.was_set("--concurrency")) {
    return absl::InvalidArgumentError(
        "--rate (Poisson) and --concurrency (closed loop) exclude each other");
  }
  // The config was valid, so whatever fails after an override is that
  // flag's fault: name it.
  auto check = [&c](const char* flag) -> absl::Status {
    if (absl::Status s = c.Validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
    }
    return absl::OkStatus();
  };
  if (flags.was_set("--requests")) {
    c.requests = f.requests;
    VC_RETURN_IF_ERROR(check("--requests"));
  }
  if (flags.was_set("--rate")) {
    c.arrival = sim::SimConfig::Arrival::kPoisson;
    c.arrival_rate = f.rate;
    VC_RETURN_IF_ERROR(check("--rate"));
  }
  if (flags.was_set("--concurrency")) {
    c.arrival = sim::SimConfig::Arrival::kClosed;
    c.concurrency = f.concurrency;
    VC_RETURN_IF_ERROR(check("--concurrency"));
  }
  if (flags.was_set("--ratio")) {
    c.ratio = f.ratio;
    VC_RETURN_IF_ERROR(check("--ratio"));
  }
  if (flags.was_set("--draft-len")) {
    c.draft_len = f.draft_len;
    VC_RETURN_IF_ERROR(check("--draft-len"));
  }
  if (flags.was_set("--acceptance-p") && flags.was_set("--acceptance-csv")) {
    return absl::InvalidArgumentError("--acceptance-p and --acceptance-csv exclude each other");
  }
  if (flags.was_set("--acceptance-p")) {
    c.acceptance = {};
    c.acceptance.kind = sim::AcceptanceModel::Kind::kPerToken;
    c.acceptance.per_token = f.acceptance_p;
    VC_RETURN_IF_ERROR(check("--acceptance-p"));
  }
  if (flags.was_set("--acceptance-csv")) {
    auto m = sim::LoadEmpiricalAcceptance(f.acceptance_csv, f.acceptance_csv_draft_len);
    if (!m.ok())
      return absl::InvalidArgumentError(absl::StrCat("--acceptance-csv: ", m.status().message()));
    c.acceptance = *m;
  }
  if (flags.was_set("--continuation")) {
    c.continuation = f.continuation;
    VC_RETURN_IF_ERROR(check("--continuation"));
  }
  if (flags.was_set("--slot-ms")) {
    c.slot_seconds = f.slot_ms / 1e3;
    VC_RETURN_IF_ERROR(check("--slot-ms"));
  }
  if (flags.was_set("--window-slots")) {
    c.window_slots = f.window_slots;
    VC_RETURN_IF_ERROR(check("--window-slots"));
  }
  if (flags.was_set("--gpus")) {
    c.gpus = f.gpus;
    VC_RETURN_IF_ERROR(check("--gpus"));
  }
  if (flags.was_set("--drafters")) {
    c.drafters = f.drafters;
    VC_RETURN_IF_ERROR(check("--drafters"));
  }
  if (flags.was_set("--verifiers")) {
    c.verifiers = f.verifiers;
    VC_RETURN_IF_ERROR(check("--verifiers"));
  }
  if (flags.was_set("--max-batch")) {
    c.max_batch = f.max_batch;
    VC_RETURN_IF_ERROR(check("--max-batch"));
  }
  if (flags.was_set("--shared-prefixes")) {
    c.shared_prefixes = f.shared_prefixes;
    VC_RETURN_IF_ERROR(check("--shared-prefixes"));
  }
  if (flags.was_set("--prefix-sharing")) {
    if (f.prefix_sharing != "on" && f.prefix_sharing != "off") {
      return absl::InvalidArgumentError("--prefix-sharing must be on or off, got '" +
                                        f.prefix_sharing + "'");
    }
    c.prefix_sharing = f.prefix_sharing == "on";
  }
  if (flags.was_set("--prompt-tokens")) {
    c.prompt_tokens = sim::Distribution::Fixed(f.prompt_tokens);
    VC_RETURN_IF_ERROR(check("--prompt-tokens"));
  }
  if (flags.was_set("--output-tokens")) {
    c.output_tokens = sim::Distribution::Fixed(f.output_tokens);
    VC_RETURN_IF_ERROR(check("--output-tokens"));
  }
  if (flags.was_set("--hbm-gb")) {
    c.hbm_bytes = f.hbm_gb * kGB;
    VC_RETURN_IF_ERROR(check("--hbm-gb"));
  }
  if (flags.was_set("--hbm-bw")) {
    c.hbm_bytes_per_second = f.hbm_bw * kGB;
    VC_RETURN_IF_ERROR(check("--hbm-bw"));
  }
  if (flags.was_set("--link-bw")) {
    c.host_link_bytes_per_second = f.link_bw * kGB;
    VC_RETURN_IF_ERROR(check("--link-bw"));
  }
  if (flags.was_set("--fast-bw")) {
    c.fast_link_bytes_per_second = f.fast_bw * kGB;
    VC_RETURN_IF_ERROR(check("--fast-bw"));
  }
  if (flags.was_set("--slow-bw")) {
    c.slow_link_bytes_per_second = f.slow_bw * kGB;
    VC_RETURN_IF_ERROR(check("--slow-bw"));
  }
  if (flags.was_set("--rtt-ms")) {
    c.rtt_s = f.rtt_ms / 1e3;
    VC_RETURN_IF_ERROR(check("--rtt-ms"));
  }
  if (flags.was_set("--seed")) {
    c.seed = f.seed;
    VC_RETURN_IF_ERROR(check("--seed"));
  }
  return absl::OkStatus();
}

void PrintSummary(const sim::SimConfig& c, const sim::SimResult& r) {
  const bool vc = c.mode == sim::SimConfig::Mode::kVeriCache;
  std::printf(
      "%s, %s%s: %lld requests, %lld output tokens in %.3f s (virtual)\n",
      c.topology == sim::SimConfig::Topology::kLongContext ? "long-context" : "remote-prefix",
      vc ? "vericache" : "full KV",
      vc ? (c.schedule == sim::SimConfig::Schedule::kStaggered ? " staggered" : " lock-step") : "",
      static_cast<long long>(r.requests), static_cast<long long>(r.output_tokens), r.makespan_s);
  std::printf("%-28s %.2f tokens/s, %.4f requests/s\n", "throughput", r.tokens_per_s,
              r.requests_per_s);
  auto pct = [](const char* name, const sim::Percentiles& p) {
    std::printf("%-28s p50 %.4g  p90 %.4g  p99 %.4g  max %.4g\n", name, p.p50, p.p90, p.p99, p.max);
  };
  pct("TTFT [s]", r.ttft_s);
  pct("TPOT [s]", r.tpot_s);
  pct("latency [s]", r.latency_s);
  std::printf("%-28s %.4g s (mean %.4g s; slot %.4g s)\n", "iteration", r.mean_iteration_s,
              r.mean_iteration_s, r.slot_seconds);
  if (vc) {
    std::printf("%-28s %lld verifies, %.2f accepted drafts/round, %.2f tokens/round\n", "verify",
                static_cast<long long>(r.verifies), r.mean_accepted, r.tokens_per_round);
    std::printf("%-28s %.4g request-seconds (booking wait %.4g)\n", "verify stall",
                r.verify_stall_s, r.booking_wait_s);
    std::printf("%-28s admitted %lld, queued %lld, beyond window %lld, max offset %lld\n",
                "scheduler", static_cast<long long>(r.admitted), static_cast<long long>(r.queued),
                static_cast<long long>(r.beyond_window), static_cast<long long>(r.max_offset));
    std::printf("%-28s startup %.4g GB, reloads %.4g GB, peak booked %.4g GB on one GPU\n",
                "bytes moved", r.startup_bytes / kGB, r.reload_bytes / kGB,
                static_cast<double>(r.peak_memory_booked_bytes) / kGB);
    if (r.lock_step_rounds > 0) {
      std::printf("%-28s %lld rounds, %.4g link seconds per round\n", "lock-step",
                  static_cast<long long>(r.lock_step_rounds), r.link_seconds_per_round);
    }
  }
  if (c.topology == sim::SimConfig::Topology::kRemotePrefix) {
    // Request-seconds waiting for the slow-link ring: startup fetches from
    // admission to their booked slot, refreshes from the result to landing.
    std::printf("%-28s startup wait %.4g s; refresh %.4g GB, wait %.4g s\n", "slow link booking",
                r.startup_wait_s, r.refresh_bytes / kGB, r.refresh_wait_s);
  }
  if (c.shared_prefixes > 0) {
    std::printf(
        "%-28s %d prefixes, sharing %s: %lld joined rounds, %lld admissions found "
        "their prefix resident\n",
        "prefix sharing", c.shared_prefixes, c.prefix_sharing ? "on" : "off",
        static_cast<long long>(r.shared_joins), static_cast<long long>(r.shared_resident));
  }
  for (const sim::LinkReport& l : r.links) {
    std::printf(
        "link %-23s %.1f%% busy, %.4g GB in %lld transfers, peak booked %.4g s/slot, overrun %.4g "
        "s, unbooked %.4g s\n",
        l.name.c_str(), 100 * l.utilisation, l.bytes / kGB, static_cast<long long>(l.transfers),
        l.booked_peak_slot_s, l.overrun_s, l.unbooked_s);
  }
  for (const sim::GpuReport& g : r.gpus) {
    std::printf(
        "gpu %-24s %s: %lld iterations, mean %.4g s, peak HBM %.2f GB (transient %.2f GB)\n",
        g.name.c_str(), g.role.c_str(), static_cast<long long>(g.iterations), g.mean_iteration_s,
        g.peak_hbm_bytes / kGB, g.peak_transient_bytes / kGB);
  }
}

}  // namespace

int RunSimulate(int argc, char** argv) {
  const std::string cmd = "simulate";
  SimulateFlags f;
  FlagSet flags("vericache simulate",
                "Discrete-event simulation of a VeriCache deployment (virtual clock) running the\n"
                "ring scheduler over simulated GPUs and links. Input: a JSON config\n"
                "(bench/sim/README.md); the flags below override its fields.");
  flags.Add("--config", &f.config, "PATH", "JSON configuration (required)");
  flags.AddBool("--json", &f.json, "print one JSON object instead of a summary");
  flags.Add("--timeseries", &f.timeseries, "PATH",
            "write link/memory utilisation over time as CSV");
  flags.Add("--mode", &f.mode, "MODE", "vericache | full");
  flags.Add("--schedule", &f.schedule, "S", "staggered | lock-step");
  flags.Add("--requests", &f.requests, "N", "requests to simulate");
  flags.Add("--rate", &f.rate, "R", "Poisson arrivals at R requests/s");
  flags.Add("--concurrency", &f.concurrency, "N", "closed loop with N requests in the system");
  flags.Add("--ratio", &f.ratio, "C", "compression ratio c");
  flags.Add("--draft-len", &f.draft_len, "X", "draft length x");
  flags.Add("--acceptance-p", &f.acceptance_p, "P", "per-token acceptance probability");
  flags.Add("--acceptance-csv", &f.acceptance_csv, "PATH", "empirical accepted-per-round CSV");
  flags.Add("--acceptance-csv-draft-len", &f.acceptance_csv_draft_len, "X",
            "draft length the CSV was measured at (if it has no draft_len column)");
  flags.AddBool("--continuation", &f.continuation, "speculative continuation");
  flags.Add("--slot-ms", &f.slot_ms, "MS", "scheduler slot duration (0: estimated)");
  flags.Add("--window-slots", &f.window_slots, "W", "scheduler lookahead window");
  flags.Add("--gpus", &f.gpus, "N", "long-context GPUs");
  flags.Add("--drafters", &f.drafters, "N", "remote-prefix drafter GPUs (G_R)");
  flags.Add("--verifiers", &f.verifiers, "N", "remote-prefix verifier GPUs (G_L)");
  flags.Add("--max-batch", &f.max_batch, "N", "requests per GPU at once (0: memory decides)");
  flags.Add("--shared-prefixes", &f.shared_prefixes, "N",
            "prompts drawn from N stored prefixes (0: each request its own)");
  flags.Add("--prefix-sharing", &f.prefix_sharing, "on|off",
            "requests over one prefix share its resident copy and reloads");
  flags.Add("--prompt-tokens", &f.prompt_tokens, "N", "fixed prompt length");
  flags.Add("--output-tokens", &f.output_tokens, "N", "fixed output length");
  flags.Add("--hbm-gb", &f.hbm_gb, "GB", "GPU memory capacity (0: unlimited)");
  flags.Add("--hbm-bw", &f.hbm_bw, "GBPS", "GPU memory bandwidth");
  flags.Add("--link-bw", &f.link_bw, "GBPS", "long-context host link bandwidth (0: unlimited)");
  flags.Add("--fast-bw", &f.fast_bw, "GBPS", "store-to-verifier bandwidth (0: unlimited)");
  flags.Add("--slow-bw", &f.slow_bw, "GBPS", "store-to-drafter bandwidth (0: unlimited)");
  flags.Add("--rtt-ms", &f.rtt_ms, "MS", "drafter <-> verifier round trip");
  flags.Add("--seed", &f.seed, "S", "random seed");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (f.config.empty()) return BadInput(cmd, "--config is required");
  std::ifstream in(f.config);
  if (!in) return BadInput(cmd, "--config: cannot read '" + f.config + "'");
  std::stringstream text;
  text << in.rdbuf();
  const size_t slash = f.config.find_last_of('/');
  const std::string base_dir = slash == std::string::npos ? "." : f.config.substr(0, slash);
  auto config = sim::ParseSimConfig(text.str(), base_dir);
  if (!config.ok())
    return BadInput(cmd, absl::StrCat("--config ", f.config, ": ", config.status().message()));
  if (absl::Status s = ApplyOverrides(f, flags, *config); !s.ok()) return Fail(cmd, s);
  auto result = sim::Simulate(*config);
  if (!result.ok()) return Fail(cmd, result.status());
  if (!f.timeseries.empty()) {
    std::ofstream out(f.timeseries);
    out << sim::TimeseriesCsv(*result);
    if (!out) return BadInput(cmd, "--timeseries: cannot write '" + f.timeseries + "'");
  }
  if (f.json) {
    std::cout << sim::ResultToJson(*config, *result) << std::endl;
  } else {
    PrintSummary(*config, *result);
  }
  return kExitOk;
}

}  // namespace vc::cli
