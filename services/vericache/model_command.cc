// `vericache model`: the closed-form throughput models of DESIGN.md section 6
// as a calculator (common/costmodel). Subcommands: long-context,
// remote-prefix, profiles.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/costmodel/cost_model.h"
#include "nlohmann/json.hpp"
#include "services/vericache/commands.h"

namespace vc::cli {
namespace {

using costmodel::kGB;

constexpr char kUsage[] =
    "usage: vericache model <long-context|remote-prefix|profiles> [flags]\n"
    "\n"
    "Closed-form throughput models (DESIGN.md section 6).\n"
    "  long-context   T_iter, the binding side, eta, tokens/s, c* for one GPU swapping full KV\n"
    "  remote-prefix  T_req, T_cycle and the best remote-to-local pool ratio G_R/G_L\n"
    "  profiles       the built-in hardware and model profiles\n"
    "\n"
    "Run 'vericache model <subcommand> --help' for its flags.\n";

// Flags shared by both models. Sizes in GB (1e9 bytes), bandwidths in GB/s;
// a negative value means "not given" so profiles can fill it.
struct CommonFlags {
  std::string hw;
  std::string model_profile;
  double weights_gb = -1;
  double hbm_bw = -1;
  double kv_full_gb = -1;
  int64_t context_tokens = -1;
  double kv_bytes_per_token = -1;
  double ratio = -1;
  int draft_len = -1;
  double acceptance = -1;
  bool continuation = false;
  bool json = false;
  int tp = 1;
};

void AddCommon(FlagSet& flags, CommonFlags& f) {
  flags.Add("--hw", &f.hw, "NAME", "hardware profile: h100-nvl | h200 | rtx-pro-6000 | gh200");
  flags.Add(
      "--tp", &f.tp, "N",
      "tensor-parallel GPUs of --hw acting as one (HBM size and bandwidth, host link, FLOPs x N)");
  flags.Add("--model-profile", &f.model_profile, "NAME",
            "model profile: llama-3.1-8b | mistral-24b | qwen-32b | llama-70b");
  flags.Add("--weights-gb", &f.weights_gb, "M", "weight bytes read per forward pass, GB");
  flags.Add("--hbm-bw", &f.hbm_bw, "B", "GPU memory bandwidth, GB/s");
  flags.Add("--kv-full-gb", &f.kv_full_gb, "K", "one request's full KV, GB");
  flags.Add("--context-tokens", &f.context_tokens, "N",
            "context length; with the model's KV bytes per token gives --kv-full-gb");
  flags.Add("--kv-bytes-per-token", &f.kv_bytes_per_token, "N",
            "KV bytes per token (default: from --model-profile)");
  flags.Add("--ratio", &f.ratio, "C", "compression ratio c in (0, 1]");
  flags.Add("--draft-len", &f.draft_len, "X", "draft length x >= 1");
  flags.Add("--acceptance", &f.acceptance, "G", "fraction of drafts accepted, gamma in [0, 1]");
  flags.AddBool("--continuation", &f.continuation,
                "speculative continuation: the verify is hidden behind the next drafts");
  flags.AddBool("--json", &f.json, "print one JSON object instead of a table");
}

// Resolves profiles and checks the shared flags; the error names the flag.
absl::Status ResolveCommon(CommonFlags& f, costmodel::HardwareProfile* hw, double default_ratio,
                           int default_draft_len, double default_acceptance, double* params) {
  *hw = {};
  if (!f.hw.empty()) {
    auto p = costmodel::FindHardwareProfile(f.hw);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("--hw: ", p.status().message()));
    *hw = *p;
  }
  if (f.tp < 1 || f.tp > 64) return absl::InvalidArgumentError("--tp must be in [1, 64]");
  if (f.tp > 1 && f.hw.empty())
    return absl::InvalidArgumentError("--tp scales --hw; give a profile");
  hw->hbm_bytes *= f.tp;
  hw->hbm_bytes_per_second *= f.tp;
  hw->host_link_bytes_per_second *= f.tp;
  hw->flops *= f.tp;
  *params = 0;
  if (!f.model_profile.empty()) {
    auto p = costmodel::FindModelProfile(f.model_profile);
    if (!p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--model-profile: ", p.status().message()));
    }
    if (f.weights_gb < 0) f.weights_gb = p->weight_bytes / kGB;
    if (f.kv_bytes_per_token < 0) f.kv_bytes_per_token = p->kv_bytes_per_token();
    *params = p->params;
  }
  if (f.hbm_bw < 0 && hw->hbm_bytes_per_second > 0) f.hbm_bw = hw->hbm_bytes_per_second / kGB;
  if (f.weights_gb < 0)
    return absl::InvalidArgumentError("--weights-gb (or --model-profile) is required");
  if (!std::isfinite(f.weights_gb))
    return absl::InvalidArgumentError("--weights-gb must be finite");
  if (!(f.hbm_bw > 0)) {
    return absl::InvalidArgumentError(f.hbm_bw < 0 ? "--hbm-bw (or --hw) is required"
                                                   : "--hbm-bw must be > 0");
  }
  if (f.kv_full_gb < 0) {
    if (f.context_tokens > 0 && f.kv_bytes_per_token > 0) {
      f.kv_full_gb = f.context_tokens * f.kv_bytes_per_token / kGB;
    } else if (f.context_tokens >= 0) {
      return absl::InvalidArgumentError(
          "--context-tokens needs --kv-bytes-per-token or --model-profile (and must be > 0)");
    } else {
      return absl::InvalidArgumentError("--kv-full-gb (or --context-tokens) is required");
    }
  }
  if (!(f.kv_full_gb > 0)) return absl::InvalidArgumentError("--kv-full-gb must be > 0");
  if (f.ratio < 0) f.ratio = default_ratio;
  if (!(f.ratio > 0 && f.ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--ratio must be in (0, 1], got ", f.ratio));
  }
  if (f.draft_len < 0) f.draft_len = default_draft_len;
  if (f.draft_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-len must be >= 1, got ", f.draft_len));
  }
  if (f.acceptance < 0) f.acceptance = default_acceptance;
  if (!(f.acceptance >= 0 && f.acceptance <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--acceptance must be in [0, 1], got ", f.acceptance));
  }
  return absl::OkStatus();
}

void PrintRows(const std::vector<std::pair<std::string, std::string>>& rows) {
  for (const auto& [k, v] : rows) std::printf("%-38s %s\n", k.c_str(), v.c_str());
}

std::string Num(double v, const char* fmt = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

int RunLongContext(int argc, char** argv) {
  const std::string cmd = "model long-context";
  CommonFlags f;
  double link_bw = -1, hbm_gb = -1;
  int batch = -1;
  FlagSet flags(
      "vericache model long-context",
      "Long-context decoding on one GPU: compressed KV resident, full KV swapped in over\n"
      "the host link for each verify (DESIGN.md section 6).");
  AddCommon(flags, f);
  flags.Add("--link-bw", &link_bw, "L", "host-to-GPU link bandwidth, GB/s (default: from --hw)");
  flags.Add("--hbm-gb", &hbm_gb, "H",
            "GPU memory capacity, GB (default: from --hw; adds the memory-limited batch sizes)");
  flags.Add("--batch", &batch, "N", "requests decoding at once, B (required)");
  if (absl::Status s = flags.Parse(argc, argv, 3); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  costmodel::HardwareProfile hw;
  double params = 0;
  if (absl::Status s = ResolveCommon(f, &hw, 0.2, 25, 0.85, &params); !s.ok()) return Fail(cmd, s);
  if (link_bw < 0 && hw.host_link_bytes_per_second > 0)
    link_bw = hw.host_link_bytes_per_second / kGB;
  if (!(link_bw > 0)) {
    return BadInput(cmd, link_bw < 0 ? "--link-bw (or --hw) is required" : "--link-bw must be > 0");
  }
  if (hbm_gb < 0) hbm_gb = hw.hbm_bytes / kGB;
  if (batch < 0) return BadInput(cmd, "--batch is required");
  if (batch < 1) return BadInput(cmd, absl::StrCat("--batch must be >= 1, got ", batch));

  costmodel::LongContextInputs in;
  in.weight_bytes = f.weights_gb * kGB;
  in.hbm_bytes_per_second = f.hbm_bw * kGB;
  in.link_bytes_per_second = link_bw * kGB;
  in.full_kv_bytes = f.kv_full_gb * kGB;
  in.batch = batch;
  in.ratio = f.ratio;
  in.draft_len = f.draft_len;
  in.acceptance = f.acceptance;
  in.continuation = f.continuation;
  in.hbm_bytes = hbm_gb * kGB;
  auto e = costmodel::EstimateLongContext(in);
  if (!e.ok()) return Fail(cmd, e.status());

  nlohmann::json j;
  j["model"] = "long-context";
  j["inputs"] = {{"weights_gb", f.weights_gb},
                 {"hbm_bw_gbps", f.hbm_bw},
                 {"link_bw_gbps", link_bw},
                 {"kv_full_gb", f.kv_full_gb},
                 {"batch", batch},
                 {"ratio", f.ratio},
                 {"draft_len", f.draft_len},
                 {"acceptance", f.acceptance},
                 {"continuation", f.continuation},
                 {"hbm_gb", hbm_gb}};
  if (!f.hw.empty()) j["inputs"]["hw"] = f.hw;
  if (f.tp > 1) j["inputs"]["tp"] = f.tp;
  if (!f.model_profile.empty()) j["inputs"]["model_profile"] = f.model_profile;
  j["t_gpu_s"] = e->t_gpu_s;
  j["t_xfer_s"] = e->t_xfer_s;
  j["t_iter_s"] = e->t_iter_s;
  j["bound"] = e->gpu_bound ? "gpu" : "link";
  j["eta"] = e->eta;
  j["tokens_per_s"] = e->tokens_per_s;
  j["tokens_per_s_per_request"] = e->tokens_per_s_per_request;
  j["c_star"] = e->c_star;
  j["rho"] = e->rho;
  j["reload_iterations"] = e->reload_iterations;
  j["transient_copies"] = e->transient_copies;
  j["hbm_needed_gb"] = e->hbm_needed_bytes / kGB;
  j["lock_step_hbm_gb"] = e->lock_step_hbm_bytes / kGB;
  j["full_kv"] = {{"t_iter_s", e->full_t_iter_s}, {"tokens_per_s", e->full_tokens_per_s}};
  j["speedup_same_batch"] = e->speedup_same_batch;
  if (in.hbm_bytes > 0) {
    j["max_batch_full"] = e->max_batch_full;
    j["max_batch_vericache"] = e->max_batch_vericache;
    j["full_tokens_per_s_at_max"] = e->full_tokens_per_s_at_max;
    j["tokens_per_s_at_max"] = e->tokens_per_s_at_max;
    // null when full KV does not fit even one request.
    j["speedup_at_max"] =
        e->max_batch_full > 0 ? nlohmann::json(e->speedup_at_max) : nlohmann::json();
  }
  if (f.json) {
    std::cout << j.dump() << std::endl;
    return kExitOk;
  }
  std::vector<std::pair<std::string, std::string>> rows = {
      {"T_gpu (HBM) [s]", Num(e->t_gpu_s)},
      {"T_xfer (link) [s]", Num(e->t_xfer_s)},
      {"T_iter [s]", Num(e->t_iter_s)},
      {"bound", e->gpu_bound ? "gpu" : "link"},
      {"rho = BW_hbm / BW_link", Num(e->rho)},
      {"c* (GPU binds above it)", Num(e->c_star)},
      {"eta [tokens/request/iteration]", Num(e->eta)},
      {"tokens/s (all requests)", Num(e->tokens_per_s, "%.2f")},
      {"tokens/s per request", Num(e->tokens_per_s_per_request, "%.3f")},
      {"full KV at the same batch, tokens/s", Num(e->full_tokens_per_s, "%.2f")},
      {"speedup at the same batch", Num(e->speedup_same_batch, "%.3f")},
      {"reload span [iterations]", Num(e->reload_iterations)},
      {"full-KV copies in flight", Num(e->transient_copies)},
      {"HBM needed, staggered [GB]", Num(e->hbm_needed_bytes / kGB, "%.2f")},
      {"HBM needed, lock-step [GB]", Num(e->lock_step_hbm_bytes / kGB, "%.2f")},
  };
  if (in.hbm_bytes > 0) {
    rows.push_back({"max batch, full KV", Num(e->max_batch_full)});
    rows.push_back({"max batch, VeriCache", Num(e->max_batch_vericache)});
    rows.push_back({"tokens/s at max batch, full KV", Num(e->full_tokens_per_s_at_max, "%.2f")});
    rows.push_back({"tokens/s at max batch, VeriCache", Num(e->tokens_per_s_at_max, "%.2f")});
    rows.push_back({"speedup at max batch", e->max_batch_full > 0 ? Num(e->speedup_at_max, "%.3f")
                                                                  : "full KV does not fit"});
  }
  PrintRows(rows);
  return kExitOk;
}

int RunRemotePrefix(int argc, char** argv) {
  const std::string cmd = "model remote-prefix";
  CommonFlags f;
  double fast_bw = -1, slow_bw = -1, rtt_ms = 0, t_decode_ms = 0, t_fwd_ms = 0, tflops = -1;
  int output_tokens = 256, remote_batch = 1, remote_gpus = 0, local_gpus = 0;
  FlagSet flags(
      "vericache model remote-prefix",
      "Remote prefix caching: drafters behind a slow link get the compressed KV, verifiers\n"
      "on a fast link load the full KV for each verify (DESIGN.md section 6).");
  AddCommon(flags, f);
  flags.Add("--fast-bw", &fast_bw, "GBPS", "store-to-verifier bandwidth, GB/s (default: --hw, 40)");
  flags.Add("--slow-bw", &slow_bw, "GBPS", "store-to-drafter bandwidth, GB/s (default: --hw, 1.2)");
  flags.Add("--output-tokens", &output_tokens, "N", "tokens generated per request, K_out");
  flags.Add("--rtt-ms", &rtt_ms, "MS", "drafter <-> verifier round trip");
  flags.Add("--t-decode-ms", &t_decode_ms, "MS", "drafter step time (0: (M + B_R*c*K)/BW_hbm)");
  flags.Add("--t-fwd-ms", &t_fwd_ms, "MS",
            "verify forward time (0: max((M + K)/BW_hbm, 2*params*(x+1)/FLOP/s))");
  flags.Add("--tflops", &tflops, "T", "GPU dense TFLOP/s for T_fwd (default: from --hw)");
  flags.Add("--remote-batch", &remote_batch, "B_R", "requests one drafter GPU drafts at once");
  flags.Add("--remote-gpus", &remote_gpus, "G_R", "with --local-gpus: cluster throughput estimate");
  flags.Add("--local-gpus", &local_gpus, "G_L", "with --remote-gpus: cluster throughput estimate");
  if (absl::Status s = flags.Parse(argc, argv, 3); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  costmodel::HardwareProfile hw;
  double params = 0;
  if (absl::Status s = ResolveCommon(f, &hw, 0.25, 40, 0.8, &params); !s.ok()) return Fail(cmd, s);
  if (fast_bw < 0) fast_bw = hw.fast_link_bytes_per_second / kGB;
  if (slow_bw < 0) slow_bw = hw.slow_link_bytes_per_second / kGB;
  if (tflops < 0) tflops = hw.flops / 1e12;
  if (!(fast_bw > 0)) return BadInput(cmd, "--fast-bw must be > 0");
  if (!(slow_bw > 0)) return BadInput(cmd, "--slow-bw must be > 0");
  if (output_tokens < 1) return BadInput(cmd, "--output-tokens must be >= 1");
  if (!(rtt_ms >= 0)) return BadInput(cmd, "--rtt-ms must be >= 0");
  if (!(t_decode_ms >= 0)) return BadInput(cmd, "--t-decode-ms must be >= 0");
  if (!(t_fwd_ms >= 0)) return BadInput(cmd, "--t-fwd-ms must be >= 0");
  if (remote_batch < 1) return BadInput(cmd, "--remote-batch must be >= 1");
  if (remote_gpus < 0) return BadInput(cmd, "--remote-gpus must be >= 0");
  if (local_gpus < 0) return BadInput(cmd, "--local-gpus must be >= 0");
  if ((remote_gpus > 0) != (local_gpus > 0)) {
    return BadInput(cmd, "--remote-gpus and --local-gpus go together");
  }

  costmodel::RemotePrefixInputs in;
  in.weight_bytes = f.weights_gb * kGB;
  in.hbm_bytes_per_second = f.hbm_bw * kGB;
  in.fast_link_bytes_per_second = fast_bw * kGB;
  in.slow_link_bytes_per_second = slow_bw * kGB;
  in.full_kv_bytes = f.kv_full_gb * kGB;
  in.output_tokens = output_tokens;
  in.ratio = f.ratio;
  in.draft_len = f.draft_len;
  in.acceptance = f.acceptance;
  in.continuation = f.continuation;
  in.rtt_s = rtt_ms / 1e3;
  in.t_decode_s = t_decode_ms / 1e3;
  in.t_fwd_s = t_fwd_ms / 1e3;
  in.params = params;
  in.flops = tflops * 1e12;
  in.remote_batch = remote_batch;
  in.remote_gpus = remote_gpus;
  in.local_gpus = local_gpus;
  auto e = costmodel::EstimateRemotePrefix(in);
  if (!e.ok()) return Fail(cmd, e.status());

  nlohmann::json j;
  j["model"] = "remote-prefix";
  j["inputs"] = {{"weights_gb", f.weights_gb}, {"hbm_bw_gbps", f.hbm_bw},
                 {"fast_bw_gbps", fast_bw},    {"slow_bw_gbps", slow_bw},
                 {"kv_full_gb", f.kv_full_gb}, {"output_tokens", output_tokens},
                 {"ratio", f.ratio},           {"draft_len", f.draft_len},
                 {"acceptance", f.acceptance}, {"continuation", f.continuation},
                 {"rtt_ms", rtt_ms},           {"remote_batch", remote_batch}};
  if (!f.hw.empty()) j["inputs"]["hw"] = f.hw;
  if (f.tp > 1) j["inputs"]["tp"] = f.tp;
  if (!f.model_profile.empty()) j["inputs"]["model_profile"] = f.model_profile;
  j["t_startup_s"] = e->t_startup_s;
  j["rounds"] = e->rounds;
  j["t_decode_s"] = e->t_decode_s;
  j["t_fwd_s"] = e->t_fwd_s;
  j["t_load_s"] = e->t_load_s;
  j["t_cycle_s"] = e->t_cycle_s;
  j["t_req_s"] = e->t_req_s;
  j["full_kv"] = {{"t_decode_s", e->full_t_decode_s},
                  {"t_req_remote_s", e->full_t_req_remote_s},
                  {"t_req_local_s", e->full_t_req_local_s}};
  j["latency_speedup_vs_remote_full"] = e->latency_speedup_remote;
  j["local_seconds_per_request"] = e->local_seconds_per_request;
  j["best_remote_to_local_ratio"] = e->best_remote_to_local_ratio;
  j["slow_to_fast_ratio"] = slow_bw / fast_bw;
  if (remote_gpus > 0) {
    j["cluster"] = {{"remote_gpus", remote_gpus},
                    {"local_gpus", local_gpus},
                    {"requests_per_s", e->requests_per_s},
                    {"full_requests_per_s", e->full_requests_per_s},
                    {"speedup", e->cluster_speedup}};
  }
  if (f.json) {
    std::cout << j.dump() << std::endl;
    return kExitOk;
  }
  std::vector<std::pair<std::string, std::string>> rows = {
      {"startup c*K/BW_slow [s]", Num(e->t_startup_s)},
      {"rounds K_out/(gamma*x+1)", Num(e->rounds)},
      {"T_decode [s]", Num(e->t_decode_s)},
      {"T_fwd(x) [s]", Num(e->t_fwd_s)},
      {"K/BW_fast [s]", Num(e->t_load_s)},
      {"T_cycle [s]", Num(e->t_cycle_s)},
      {"T_req [s]", Num(e->t_req_s)},
      {"full KV over the slow link [s]", Num(e->full_t_req_remote_s)},
      {"full KV over the fast link [s]", Num(e->full_t_req_local_s)},
      {"latency speedup vs slow full KV", Num(e->latency_speedup_remote, "%.3f")},
      {"verifier seconds per request", Num(e->local_seconds_per_request)},
      {"best G_R/G_L", Num(e->best_remote_to_local_ratio, "%.3f")},
  };
  if (remote_gpus > 0) {
    rows.push_back({"cluster requests/s, VeriCache", Num(e->requests_per_s)});
    rows.push_back({"cluster requests/s, full KV", Num(e->full_requests_per_s)});
    rows.push_back({"cluster speedup", Num(e->cluster_speedup, "%.3f")});
  }
  PrintRows(rows);
  return kExitOk;
}

int RunProfiles(int argc, char** argv) {
  bool json = false;
  FlagSet flags("vericache model profiles", "The built-in hardware and model profiles.");
  flags.AddBool("--json", &json, "print one JSON object");
  if (absl::Status s = flags.Parse(argc, argv, 3); !s.ok()) return Fail("model profiles", s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  nlohmann::json j;
  for (const auto& p : costmodel::HardwareProfiles()) {
    j["hardware"].push_back({{"name", p.name},
                             {"description", p.description},
                             {"hbm_gb", p.hbm_bytes / kGB},
                             {"hbm_bw_gbps", p.hbm_bytes_per_second / kGB},
                             {"host_link_gbps", p.host_link_bytes_per_second / kGB},
                             {"fast_link_gbps", p.fast_link_bytes_per_second / kGB},
                             {"slow_link_gbps", p.slow_link_bytes_per_second / kGB},
                             {"tflops", p.flops / 1e12}});
  }
  for (const auto& p : costmodel::ModelProfiles()) {
    j["models"].push_back({{"name", p.name},
                           {"description", p.description},
                           {"params_b", p.params / 1e9},
                           {"weights_gb", p.weight_bytes / kGB},
                           {"layers", p.layers},
                           {"kv_heads", p.kv_heads},
                           {"head_dim", p.head_dim},
                           {"kv_bytes_per_token", p.kv_bytes_per_token()}});
  }
  if (json) {
    std::cout << j.dump() << std::endl;
    return kExitOk;
  }
  std::printf("%-14s %8s %10s %10s %10s  %s\n", "hardware", "HBM GB", "HBM GB/s", "host GB/s",
              "TFLOP/s", "description");
  for (const auto& p : costmodel::HardwareProfiles()) {
    std::printf("%-14s %8.0f %10.0f %10.0f %10.0f  %s\n", p.name.c_str(), p.hbm_bytes / kGB,
                p.hbm_bytes_per_second / kGB, p.host_link_bytes_per_second / kGB, p.flops / 1e12,
                p.description.c_str());
  }
  std::printf("\n%-14s %8s %11s %12s  %s\n", "model", "params", "weights GB", "KV B/token",
              "description");
  for (const auto& p : costmodel::ModelProfiles()) {
    std::printf("%-14s %7.2fB %11.2f %12.0f  %s\n", p.name.c_str(), p.params / 1e9,
                p.weight_bytes / kGB, p.kv_bytes_per_token(), p.description.c_str());
  }
  return kExitOk;
}

}  // namespace

int RunModel(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h") {
    std::fputs(kUsage, argc < 3 ? stderr : stdout);
    return argc < 3 ? kExitBadInput : kExitOk;
  }
  const std::string sub = argv[2];
  if (sub == "long-context") return RunLongContext(argc, argv);
  if (sub == "remote-prefix") return RunRemotePrefix(argc, argv);
  if (sub == "profiles") return RunProfiles(argc, argv);
  return BadInput("model", "unknown model '" + sub + "' (long-context | remote-prefix | profiles)");
}

}  // namespace vc::cli
