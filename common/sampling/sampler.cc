#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace vc {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top-k must be >= 0, got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top-p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

double GumbelNoise(uint64_t seed, int64_t position, int32_t token) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(position)) ^
                                static_cast<uint64_t>(static_cast<uint32_t>(token)));
  // 53 random bits -> u in (0, 1), never 0 or 1.
  const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
  return -std::log(-std::log(u));
}

namespace {

// The tokens that survive top-k then top-p, most likely first.
std::vector<int32_t> Candidates(std::span<const float> logits, const SamplingParams& params) {
  const size_t n = logits.size();
  // Candidates in logit order, ties to the lower id (a strict total order).
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const size_t k = params.top_k > 0 ? std::min<size_t>(params.top_k, n) : n;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    by_logit);
  order.resize(k);
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  size_t keep = k;
  if (params.top_p < 1.0f) {
    const double top = logits[order[0]] * inv_t;
    std::vector<double> p(k);
    double sum = 0.0;
    for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp(logits[order[i]] * inv_t - top);
    double cum = 0.0;
    for (size_t i = 0; i < k; ++i) {
      cum += p[i] / sum;
      if (cum >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  order.resize(keep);
  return order;
}

}  // namespace

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params,
                    int64_t position) {
  if (params.greedy() || logits.empty()) return Argmax(logits);
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  const std::vector<int32_t> candidates = Candidates(logits, params);
  int32_t best = candidates[0];
  double best_score = -INFINITY;
  for (const int32_t t : candidates) {
    const double score = logits[t] * inv_t + GumbelNoise(params.seed, position, t);
    if (score > best_score) {
      best_score = score;
      best = t;
    }
  }
  return best;
}

std::vector<double> FilteredDistribution(std::span<const float> logits,
                                         const SamplingParams& params) {
  std::vector<double> probs(logits.size(), 0.0);
  if (logits.empty()) return probs;
  if (params.greedy()) {
    probs[Argmax(logits)] = 1.0;
    return probs;
  }
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  const std::vector<int32_t> candidates = Candidates(logits, params);
  const double top = logits[candidates[0]] * inv_t;
  double sum = 0.0;
  for (const int32_t t : candidates) sum += probs[t] = std::exp(logits[t] * inv_t - top);
  for (const int32_t t : candidates) probs[t] /= sum;
  return probs;
}

int32_t SampleFromDistribution(std::span<const double> probs, uint64_t seed, int64_t position) {
  int32_t best = -1;
  double best_score = -INFINITY;
  for (size_t t = 0; t < probs.size(); ++t) {
    if (!(probs[t] > 0.0)) continue;
    const double score = std::log(probs[t]) + GumbelNoise(seed, position, static_cast<int32_t>(t));
    if (score > best_score) {
      best_score = score;
      best = static_cast<int32_t>(t);
    }
  }
  return best < 0 ? 0 : best;
}

double KeyedUniform(uint64_t seed, int64_t position) {
  const uint64_t h = SplitMix64(SplitMix64(seed ^ 0x6A09E667F3BCC909ull) ^
                                static_cast<uint64_t>(position));
  return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
}

int32_t SpeculativeAccept(std::span<const double> p, std::span<const double> q, int32_t d,
                          double u, uint64_t residual_seed, int64_t position, bool* accepted) {
  if (q[d] > 0 && u * q[d] < p[d]) {
    *accepted = true;
    return d;
  }
  *accepted = false;
  std::vector<double> residual(p.size());
  double mass = 0;
  for (size_t t = 0; t < p.size(); ++t) mass += residual[t] = std::max(0.0, p[t] - q[t]);
  return mass > 0 ? SampleFromDistribution(residual, residual_seed, position)
                  : SampleFromDistribution(p, residual_seed, position);
}

namespace {
// Independent noise streams for rejection sampling (seeded sampling uses the
// seed itself, so a drafter and a verifier draw identically there).
constexpr uint64_t kDraftStream = 0xD1B54A32D192ED03ull;
constexpr uint64_t kAcceptStream = 0x8CB92BA72F3D8DD7ull;
constexpr uint64_t kResidualStream = 0xABC98388FB8FAC03ull;
}  // namespace

int32_t DrawRejectionDraft(std::span<const float> draft_logits, const SamplingParams& params,
                           int64_t position, std::vector<double>* q) {
  *q = FilteredDistribution(draft_logits, params);
  return SampleFromDistribution(*q, params.seed ^ kDraftStream, position);
}

int32_t JudgeRejectionDraft(std::span<const float> target_logits, std::span<const double> q,
                            int32_t d, const SamplingParams& params, int64_t position,
                            bool* accepted) {
  const std::vector<double> p = FilteredDistribution(target_logits, params);
  const double u = KeyedUniform(params.seed ^ kAcceptStream, position);
  return SpeculativeAccept(p, q, d, u, params.seed ^ kResidualStream, position, accepted);
}

}  // namespace vc
