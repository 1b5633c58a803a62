// Closed-form throughput models of DESIGN.md section 6, and the hardware and
// model profiles they are evaluated on. Used by `vericache model` (a
// calculator), by the simulator (to size its default slot and to report what
// the closed form predicts next to what it simulated), and by the benchmark
// harness. Everything is in SI units: bytes, seconds, bytes per second.
//
// Long-context decoding on one GPU (compressed KV resident, full KV swapped
// in over the host link for each verify):
//   T_gpu  = (M + B*K*(c + 1/x)) / BW_hbm       HBM bytes per iteration
//   T_xfer = B*K / (x * BW_link)                 link bytes per iteration
//   T_iter = max(T_gpu, T_xfer)
//   eta    = (gamma*x + 1) / (x + 1)             tokens per request per iteration
//            (gamma*x + 1) / x                   with speculative continuation
//   tokens/s = B * eta / T_iter
//   c*     = (rho - 1)/x - M/(B*K), rho = BW_hbm/BW_link: the ratio at which
//            T_gpu == T_xfer; for c > c* the GPU side binds, below it the link.
// (M = weight bytes, K = one request's full-KV bytes, B = batch, c =
// compression ratio, x = draft length, gamma = fraction of drafts accepted.)
//
// Remote prefix caching (drafters behind a slow link, verifiers on a fast
// one; docs/results.md derives the pool ratio):
//   T_req   = c*K/BW_slow + n * T_cycle,   n = K_out / (gamma*x + 1) rounds
//   T_cycle = max(x*T_decode, K/BW_fast) + T_fwd(x) + RTT
//             (with speculative continuation the verify and the round trip
//             are hidden: T_cycle = max(x*T_decode, K/BW_fast, T_fwd(x) + RTT))
//   best G_R/G_L = r_L / r_R: the pool sizes at which both pools serve the
//   same request rate, with a verifier's rate r_L = 1/(n*max(K/BW_fast,
//   T_fwd(x))) and a drafter's r_R = min(B_R/T_req, BW_slow/(c*K)).
//   (B_R = 1: T_req / (n * max(K/BW_fast, T_fwd(x))).)
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vc::costmodel {

inline constexpr double kGB = 1e9;  // sizes and bandwidths use decimal GB

struct HardwareProfile {
  std::string name;
  std::string description;
  double hbm_bytes = 0;                           // GPU memory capacity
  double hbm_bytes_per_second = 0;                // GPU memory bandwidth
  double host_link_bytes_per_second = 0;          // host -> GPU (PCIe, C2C), one direction
  double fast_link_bytes_per_second = 40 * kGB;   // store -> verifier (paper testbed)
  double slow_link_bytes_per_second = 1.2 * kGB;  // store -> drafter (paper testbed)
  double flops = 0;                               // dense BF16 FLOP/s
};

struct ModelProfile {
  std::string name;
  std::string description;
  double params = 0;        // parameter count
  double weight_bytes = 0;  // bytes of weights read per forward pass
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int kv_dtype_bytes = 2;

  // K and V of one token over all layers.
  double kv_bytes_per_token() const { return 2.0 * layers * kv_heads * head_dim * kv_dtype_bytes; }
};

// Built-in profiles (nominal datasheet figures; see docs/operations.md).
const std::vector<HardwareProfile>& HardwareProfiles();
const std::vector<ModelProfile>& ModelProfiles();
// NotFound naming the known profiles.
absl::StatusOr<HardwareProfile> FindHardwareProfile(const std::string& name);
absl::StatusOr<ModelProfile> FindModelProfile(const std::string& name);

// Tokens per request per iteration (see the header comment).
double Eta(double gamma, int draft_len, bool continuation);
// Mean accepted drafts per round of x drafts when each draft is accepted
// with probability p independently until the first rejection.
double MeanAcceptedGeometric(double p, int draft_len);
// The per-token p whose MeanAcceptedGeometric(p, x) / x equals gamma.
double PerTokenFromFraction(double gamma, int draft_len);

struct LongContextInputs {
  double weight_bytes = 0;           // M
  double hbm_bytes_per_second = 0;   // BW_hbm
  double link_bytes_per_second = 0;  // BW_link (host -> GPU)
  double full_kv_bytes = 0;          // K, per request
  int batch = 1;                     // B
  double ratio = 0.2;                // c
  int draft_len = 25;                // x
  double acceptance = 0.85;          // gamma
  bool continuation = false;
  // Optional: GPU memory capacity; > 0 adds the memory-limited batch sizes
  // and the speedup at those (full KV keeps B*K resident, VeriCache B*c*K
  // plus the transient full KV of the verifies in flight).
  double hbm_bytes = 0;

  absl::Status Validate() const;
};

struct LongContextEstimate {
  double t_gpu_s = 0;
  double t_xfer_s = 0;
  double t_iter_s = 0;
  bool gpu_bound = true;  // T_gpu >= T_xfer
  double eta = 0;
  double tokens_per_s = 0;  // all B requests together
  double tokens_per_s_per_request = 0;
  double c_star = 0;
  double rho = 0;
  // Staggered schedule: reload span S in iterations and the full KV copies
  // resident at once on average, ceil(B*(S+1)/(x+1)) (at least 1).
  int reload_iterations = 0;
  int transient_copies = 0;
  double hbm_needed_bytes = 0;     // M + B*c*K + transient_copies*K
  double lock_step_hbm_bytes = 0;  // M + B*c*K + B*K
  // Full-KV decoding at the same batch: one token per request per iteration
  // of (M + B*K)/BW_hbm.
  double full_t_iter_s = 0;
  double full_tokens_per_s = 0;
  double speedup_same_batch = 0;
  // Only when hbm_bytes > 0 (0 otherwise): largest batches that fit and the
  // throughput of each at its own largest batch.
  int max_batch_full = 0;
  int max_batch_vericache = 0;
  double full_tokens_per_s_at_max = 0;
  double tokens_per_s_at_max = 0;
  double speedup_at_max = 0;
};

absl::StatusOr<LongContextEstimate> EstimateLongContext(const LongContextInputs& in);

// The smallest acceptance gamma at which VeriCache (estimate `in`, its
// acceptance ignored) matches `baseline_tokens_per_s`; > 1 when no gamma
// does (returned as is so callers can see by how much).
double BreakEvenAcceptance(const LongContextInputs& in, double baseline_tokens_per_s);

struct RemotePrefixInputs {
  double weight_bytes = 0;
  double hbm_bytes_per_second = 0;
  double fast_link_bytes_per_second = 40 * kGB;
  double slow_link_bytes_per_second = 1.2 * kGB;
  double full_kv_bytes = 0;  // K: the stored prefix's full KV
  int output_tokens = 256;   // K_out
  double ratio = 0.25;       // c
  int draft_len = 40;        // x
  double acceptance = 0.8;   // gamma
  bool continuation = false;
  double rtt_s = 0;  // drafter <-> verifier round trip
  // <= 0: derived. T_decode = (M + c*K)/BW_hbm (one drafting request reads
  // the weights and its compressed KV); T_fwd(x) = max((M + K)/BW_hbm,
  // 2*params*(x+1)/flops).
  double t_decode_s = 0;
  double t_fwd_s = 0;
  double params = 0;  // for the FLOP term of T_fwd (0: ignored)
  double flops = 0;
  int remote_batch = 1;  // B_R: requests one drafter GPU drafts at once
  // Optional pool sizes (both > 0): adds the cluster throughput estimate,
  // against full-KV serving on the same GPUs with `full_batch` requests per
  // GPU (each GPU loads full KV over its own link).
  int remote_gpus = 0;
  int local_gpus = 0;
  int full_batch = 1;

  absl::Status Validate() const;
};

struct RemotePrefixEstimate {
  double t_startup_s = 0;  // c*K/BW_slow
  double rounds = 0;       // n = K_out/(gamma*x + 1)
  double t_decode_s = 0;
  double t_fwd_s = 0;
  double t_load_s = 0;  // K/BW_fast
  double t_cycle_s = 0;
  double t_req_s = 0;
  // Full-KV baselines, one request at a time: the whole full KV over the
  // slow (remote GPU) or fast (local GPU) link, then K_out decode steps of
  // (M + K)/BW_hbm.
  double full_t_decode_s = 0;
  double full_t_req_remote_s = 0;
  double full_t_req_local_s = 0;
  double latency_speedup_remote = 0;  // full_t_req_remote / t_req
  // Local (verifier) GPU seconds per request: n * max(K/BW_fast, T_fwd).
  double local_seconds_per_request = 0;
  // Requests per second one GPU of each pool sustains.
  double remote_rate_per_gpu = 0;
  double local_rate_per_gpu = 0;
  double best_remote_to_local_ratio = 0;
  // Only with remote_gpus and local_gpus > 0: requests per second.
  double requests_per_s = 0;
  double full_requests_per_s = 0;
  double cluster_speedup = 0;
};

absl::StatusOr<RemotePrefixEstimate> EstimateRemotePrefix(const RemotePrefixInputs& in);

}  // namespace vc::costmodel
