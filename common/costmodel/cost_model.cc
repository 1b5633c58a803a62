#include "common/costmodel/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace vc::costmodel {
namespace {

bool Positive(double v) { return v > 0 && std::isfinite(v); }

absl::Status NeedPositive(const char* what, double v) {
  if (Positive(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " must be > 0, got ", v));
}

absl::Status NeedFraction(const char* what, double v, bool allow_zero) {
  if (std::isfinite(v) && (allow_zero ? v >= 0 : v > 0) && v <= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be in ", allow_zero ? "[0, 1]" : "(0, 1]", ", got ", v));
}

struct Iteration {
  double t_gpu = 0, t_xfer = 0;
  double t_iter() const { return std::max(t_gpu, t_xfer); }
};

Iteration LongContextIteration(const LongContextInputs& in, int batch) {
  const double bk = batch * in.full_kv_bytes;
  Iteration it;
  it.t_gpu = (in.weight_bytes + bk * (in.ratio + 1.0 / in.draft_len)) / in.hbm_bytes_per_second;
  it.t_xfer = bk / (in.draft_len * in.link_bytes_per_second);
  return it;
}

// Reload span in iterations and full-KV copies resident at once (staggered).
void TransientCopies(const LongContextInputs& in, int batch, double t_iter, int* span,
                     int* copies) {
  const double transfer = in.full_kv_bytes / in.link_bytes_per_second;
  *span = std::max(1, static_cast<int>(std::ceil(transfer / t_iter - 1e-9)));
  // Each request verifies once per x+1 iterations (x with continuation), and
  // each verify holds its copy for S reload iterations plus the verify one.
  const int period = in.continuation ? in.draft_len : in.draft_len + 1;
  *copies = std::max(
      1, static_cast<int>(std::ceil(static_cast<double>(batch) * (*span + 1) / period - 1e-9)));
}

double VeriCacheHbm(const LongContextInputs& in, int batch) {
  const Iteration it = LongContextIteration(in, batch);
  int span = 0, copies = 0;
  TransientCopies(in, batch, it.t_iter(), &span, &copies);
  return in.weight_bytes + batch * in.ratio * in.full_kv_bytes + copies * in.full_kv_bytes;
}

double FullTokensPerSecond(const LongContextInputs& in, int batch) {
  if (batch <= 0) return 0;
  return batch * in.hbm_bytes_per_second / (in.weight_bytes + batch * in.full_kv_bytes);
}

double VeriCacheTokensPerSecond(const LongContextInputs& in, int batch) {
  if (batch <= 0) return 0;
  return batch * Eta(in.acceptance, in.draft_len, in.continuation) /
         LongContextIteration(in, batch).t_iter();
}

}  // namespace

const std::vector<HardwareProfile>& HardwareProfiles() {
  // Nominal datasheet figures. Link bandwidths are one direction; the fast
  // and slow links are the paper's testbed (40 and 1.2 GB/s) on every GPU.
  static const auto* profiles = new std::vector<HardwareProfile>{
      {"h100-nvl", "NVIDIA H100 NVL: 94 GB HBM3 at 3.9 TB/s, PCIe Gen5 x16", 94 * kGB, 3900 * kGB,
       64 * kGB, 40 * kGB, 1.2 * kGB, 835e12},
      {"h200", "NVIDIA H200: 141 GB HBM3e at 4.8 TB/s, PCIe Gen5 x16", 141 * kGB, 4800 * kGB,
       64 * kGB, 40 * kGB, 1.2 * kGB, 989e12},
      {"rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell: 96 GB GDDR7 at 1.79 TB/s, PCIe Gen5 x16",
       96 * kGB, 1792 * kGB, 64 * kGB, 40 * kGB, 1.2 * kGB, 500e12},
      {"gh200", "NVIDIA GH200: 96 GB HBM3 at 4.0 TB/s, NVLink-C2C 450 GB/s per direction", 96 * kGB,
       4000 * kGB, 450 * kGB, 40 * kGB, 1.2 * kGB, 989e12},
  };
  return *profiles;
}

const std::vector<ModelProfile>& ModelProfiles() {
  // Shapes of the public checkpoints; BF16 weights and KV.
  static const auto* profiles = new std::vector<ModelProfile>{
      {"llama-3.1-8b", "Llama-3.1-8B: 32 layers, 8 KV heads x 128", 8.03e9, 16.06 * kGB, 32, 8, 128,
       2},
      {"mistral-24b", "Mistral-Small-24B: 40 layers, 8 KV heads x 128", 23.57e9, 47.14 * kGB, 40, 8,
       128, 2},
      {"qwen-32b", "Qwen2.5-32B: 64 layers, 8 KV heads x 128", 32.76e9, 65.53 * kGB, 64, 8, 128, 2},
      {"llama-70b", "Llama-3.1-70B: 80 layers, 8 KV heads x 128", 70.55e9, 141.1 * kGB, 80, 8, 128,
       2},
  };
  return *profiles;
}

absl::StatusOr<HardwareProfile> FindHardwareProfile(const std::string& name) {
  std::string known;
  for (const HardwareProfile& p : HardwareProfiles()) {
    if (p.name == name) return p;
    absl::StrAppend(&known, known.empty() ? "" : "|", p.name);
  }
  return absl::NotFoundError(absl::StrCat("unknown hardware profile '", name, "' (", known, ")"));
}

absl::StatusOr<ModelProfile> FindModelProfile(const std::string& name) {
  std::string known;
  for (const ModelProfile& p : ModelProfiles()) {
    if (p.name == name) return p;
    absl::StrAppend(&known, known.empty() ? "" : "|", p.name);
  }
  return absl::NotFoundError(absl::StrCat("unknown model profile '", name, "' (", known, ")"));
}

double Eta(double gamma, int draft_len, bool continuation) {
  const double tokens = gamma * draft_len + 1;
  return continuation ? tokens / draft_len : tokens / (draft_len + 1);
}

double MeanAcceptedGeometric(double p, int draft_len) {
  if (p >= 1) return draft_len;
  if (p <= 0) return 0;
  // sum_{k=1..x} p^k
  return p * (1 - std::pow(p, draft_len)) / (1 - p);
}

double PerTokenFromFraction(double gamma, int draft_len) {
  if (gamma >= 1) return 1;
  if (gamma <= 0) return 0;
  double lo = 0, hi = 1;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (MeanAcceptedGeometric(mid, draft_len) / draft_len < gamma ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

absl::Status LongContextInputs::Validate() const {
  if (!(std::isfinite(weight_bytes) && weight_bytes >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("weights must be >= 0, got ", weight_bytes));
  }
  if (auto s = NeedPositive("HBM bandwidth", hbm_bytes_per_second); !s.ok()) return s;
  if (auto s = NeedPositive("link bandwidth", link_bytes_per_second); !s.ok()) return s;
  if (auto s = NeedPositive("full KV size", full_kv_bytes); !s.ok()) return s;
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  if (auto s = NeedFraction("ratio", ratio, false); !s.ok()) return s;
  if (draft_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("draft length must be >= 1, got ", draft_len));
  }
  if (auto s = NeedFraction("acceptance", acceptance, true); !s.ok()) return s;
  if (!(std::isfinite(hbm_bytes) && hbm_bytes >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("HBM size must be >= 0, got ", hbm_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<LongContextEstimate> EstimateLongContext(const LongContextInputs& in) {
  if (absl::Status s = in.Validate(); !s.ok()) return s;
  LongContextEstimate e;
  const Iteration it = LongContextIteration(in, in.batch);
  e.t_gpu_s = it.t_gpu;
  e.t_xfer_s = it.t_xfer;
  e.t_iter_s = it.t_iter();
  e.gpu_bound = it.t_gpu >= it.t_xfer;
  e.eta = Eta(in.acceptance, in.draft_len, in.continuation);
  e.tokens_per_s = in.batch * e.eta / e.t_iter_s;
  e.tokens_per_s_per_request = e.eta / e.t_iter_s;
  e.rho = in.hbm_bytes_per_second / in.link_bytes_per_second;
  e.c_star = (e.rho - 1) / in.draft_len - in.weight_bytes / (in.batch * in.full_kv_bytes);
  TransientCopies(in, in.batch, e.t_iter_s, &e.reload_iterations, &e.transient_copies);
  e.hbm_needed_bytes = in.weight_bytes + in.batch * in.ratio * in.full_kv_bytes +
                       e.transient_copies * in.full_kv_bytes;
  e.lock_step_hbm_bytes = in.weight_bytes + in.batch * (in.ratio + 1) * in.full_kv_bytes;
  e.full_t_iter_s = (in.weight_bytes + in.batch * in.full_kv_bytes) / in.hbm_bytes_per_second;
  e.full_tokens_per_s = in.batch / e.full_t_iter_s;
  e.speedup_same_batch = e.tokens_per_s / e.full_tokens_per_s;
  if (in.hbm_bytes > 0) {
    const double free_bytes = in.hbm_bytes - in.weight_bytes;
    e.max_batch_full =
        free_bytes > 0 ? static_cast<int>(std::floor(free_bytes / in.full_kv_bytes + 1e-9)) : 0;
    // More requests only add resident and transient bytes, so the first
    // batch that does not fit ends the search.
    const double bound = free_bytes / (in.ratio * in.full_kv_bytes);
    const int limit = static_cast<int>(std::min(1e6, std::max(0.0, bound)));
    int b = 0;
    while (b < limit && VeriCacheHbm(in, b + 1) <= in.hbm_bytes * (1 + 1e-12)) ++b;
    e.max_batch_vericache = b;
    e.full_tokens_per_s_at_max = FullTokensPerSecond(in, e.max_batch_full);
    e.tokens_per_s_at_max = VeriCacheTokensPerSecond(in, e.max_batch_vericache);
    e.speedup_at_max =
        e.full_tokens_per_s_at_max > 0 ? e.tokens_per_s_at_max / e.full_tokens_per_s_at_max : 0;
  }
  return e;
}

double BreakEvenAcceptance(const LongContextInputs& in, double baseline_tokens_per_s) {
  const double t_iter = LongContextIteration(in, in.batch).t_iter();
  const double eta = baseline_tokens_per_s * t_iter / in.batch;
  const double x = in.draft_len;
  return in.continuation ? (eta * x - 1) / x : (eta * (x + 1) - 1) / x;
}

absl::Status RemotePrefixInputs::Validate() const {
  if (!(std::isfinite(weight_bytes) && weight_bytes >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("weights must be >= 0, got ", weight_bytes));
  }
  if (auto s = NeedPositive("HBM bandwidth", hbm_bytes_per_second); !s.ok()) return s;
  if (auto s = NeedPositive("fast link bandwidth", fast_link_bytes_per_second); !s.ok()) return s;
  if (auto s = NeedPositive("slow link bandwidth", slow_link_bytes_per_second); !s.ok()) return s;
  if (auto s = NeedPositive("full KV size", full_kv_bytes); !s.ok()) return s;
  if (output_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("output tokens must be >= 1, got ", output_tokens));
  }
  if (auto s = NeedFraction("ratio", ratio, false); !s.ok()) return s;
  if (draft_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("draft length must be >= 1, got ", draft_len));
  }
  if (auto s = NeedFraction("acceptance", acceptance, true); !s.ok()) return s;
  for (const auto& [what, v] : {std::pair<const char*, double>{"rtt", rtt_s},
                                {"t_decode", t_decode_s},
                                {"t_fwd", t_fwd_s},
                                {"params", params},
                                {"flops", flops}}) {
    if (!(std::isfinite(v) && v >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " must be >= 0, got ", v));
    }
  }
  if (remote_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote batch must be >= 1, got ", remote_batch));
  }
  if (full_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("full batch must be >= 1, got ", full_batch));
  }
  if (remote_gpus < 0 || local_gpus < 0) {
    return absl::InvalidArgumentError("pool sizes must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<RemotePrefixEstimate> EstimateRemotePrefix(const RemotePrefixInputs& in) {
  if (absl::Status s = in.Validate(); !s.ok()) return s;
  RemotePrefixEstimate e;
  const double m = in.weight_bytes, k = in.full_kv_bytes, bw = in.hbm_bytes_per_second;
  const int x = in.draft_len;
  e.t_decode_s = in.t_decode_s > 0 ? in.t_decode_s : (m + in.remote_batch * in.ratio * k) / bw;
  e.t_fwd_s = in.t_fwd_s;
  if (e.t_fwd_s <= 0) {
    e.t_fwd_s = (m + k) / bw;
    if (in.params > 0 && in.flops > 0) {
      e.t_fwd_s = std::max(e.t_fwd_s, 2 * in.params * (x + 1) / in.flops);
    }
  }
  e.t_startup_s = in.ratio * k / in.slow_link_bytes_per_second;
  e.rounds = in.output_tokens / (in.acceptance * x + 1);
  e.t_load_s = k / in.fast_link_bytes_per_second;
  const double drafting = x * e.t_decode_s;
  e.t_cycle_s = in.continuation ? std::max({drafting, e.t_load_s, e.t_fwd_s + in.rtt_s})
                                : std::max(drafting, e.t_load_s) + e.t_fwd_s + in.rtt_s;
  e.t_req_s = e.t_startup_s + e.rounds * e.t_cycle_s;
  e.full_t_decode_s = (m + k) / bw;
  e.full_t_req_remote_s = k / in.slow_link_bytes_per_second + in.output_tokens * e.full_t_decode_s;
  e.full_t_req_local_s = e.t_load_s + in.output_tokens * e.full_t_decode_s;
  e.latency_speedup_remote = e.full_t_req_remote_s / e.t_req_s;
  // A verifier's link and its GPU are separate resources: staggered loads
  // overlap the previous verify's forward pass, so whichever is slower sets
  // its rate.
  e.local_seconds_per_request = e.rounds * std::max(e.t_load_s, e.t_fwd_s);
  e.local_rate_per_gpu = 1 / e.local_seconds_per_request;
  // A drafter holds B_R requests for T_req each, and its slow link moves one
  // compressed KV per request.
  e.remote_rate_per_gpu =
      std::min(in.remote_batch / e.t_req_s, in.slow_link_bytes_per_second / (in.ratio * k));
  e.best_remote_to_local_ratio = e.local_rate_per_gpu / e.remote_rate_per_gpu;
  if (in.remote_gpus > 0 && in.local_gpus > 0) {
    // Full KV: each GPU decodes full_batch requests at a time, each loaded
    // over the GPU's own link (which caps the rate at BW/K).
    const double full_step = (m + in.full_batch * k) / bw;
    auto full_rate = [&](double link_bps) {
      const double t = k / link_bps + in.output_tokens * full_step;
      return std::min(in.full_batch / t, link_bps / k);
    };
    const double full_remote = full_rate(in.slow_link_bytes_per_second);
    const double full_local = full_rate(in.fast_link_bytes_per_second);
    // VeriCache: the matched part runs draft/verify; the spare capacity of
    // the larger pool serves full KV as the cluster would without VeriCache.
    const double remote_rate = in.remote_gpus * e.remote_rate_per_gpu;
    const double local_rate = in.local_gpus * e.local_rate_per_gpu;
    double spare = 0;
    if (remote_rate < local_rate) {
      spare = (1 - remote_rate / local_rate) * in.local_gpus * full_local;
    } else {
      spare = (1 - local_rate / remote_rate) * in.remote_gpus * full_remote;
    }
    e.requests_per_s = std::min(remote_rate, local_rate) + spare;
    e.full_requests_per_s = in.local_gpus * full_local + in.remote_gpus * full_remote;
    e.cluster_speedup = e.requests_per_s / e.full_requests_per_s;
  }
  return e;
}

}  // namespace vc::costmodel
