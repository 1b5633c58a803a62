#include "tests/reference/llama_ref_f64.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numbers>

namespace vc::reference {
namespace {

[[noreturn]] void Die(const char* what) {
  std::cerr << "llama_ref_f64: " << what << "\n";
  std::abort();
}

}  // namespace

ReferenceLlama::ReferenceLlama(const Model& model)
    : model_(model),
      cfg_(model.config()),
      k_(static_cast<size_t>(cfg_.n_layers)),
      v_(static_cast<size_t>(cfg_.n_layers)) {
  if (cfg_.head_dim % 2 != 0 || cfg_.n_kv_heads <= 0 || cfg_.n_heads % cfg_.n_kv_heads != 0) {
    Die("unsupported model shape");
  }
  const RopeConfig& rope = cfg_.rope;
  const int half = cfg_.head_dim / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // theta^(-2i / head_dim)
    double freq = std::pow(rope.theta, -2.0 * i / static_cast<double>(cfg_.head_dim));
    if (rope.scaling == RopeConfig::Scaling::kLlama3) {
      const double orig = static_cast<double>(rope.original_max_position);
      const double low_wavelen = orig / rope.low_freq_factor;
      const double high_wavelen = orig / rope.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / freq;
      if (wavelen > low_wavelen) {
        freq = freq / rope.factor;
      } else if (wavelen < high_wavelen) {
        // unchanged
      } else {
        const double smooth = (orig / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        freq = (1.0 - smooth) * freq / rope.factor + smooth * freq;
      }
    }
    inv_freq_[static_cast<size_t>(i)] = freq;
  }
  if (rope.scaling == RopeConfig::Scaling::kLinear) position_scale_ = 1.0 / rope.factor;
}

void ReferenceLlama::MatVec(const WeightMatrix& w, const float* bias, const double* x, int in,
                            int out, double* y) const {
  for (int o = 0; o < out; ++o) {
    const int64_t row = static_cast<int64_t>(o) * in;
    double acc = 0.0;
    for (int i = 0; i < in; ++i) acc += static_cast<double>(w.At(row + i)) * x[i];
    if (bias != nullptr) acc += static_cast<double>(bias[o]);
    y[o] = acc;
  }
}

double RoundToSignificand(double x, Dtype dtype) {
  if (dtype == Dtype::kF32 || x == 0.0 || !std::isfinite(x)) return x;
  // bf16: 8 significant bits, f32's exponent range. f16: 11 bits, steps
  // never finer than 2^-24 (subnormals), at most 65504.
  const int bits = dtype == Dtype::kBf16 ? 8 : 11;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  int step_exp = e - bits;
  if (dtype == Dtype::kF16) step_exp = std::max(step_exp, -24);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -step_exp)), step_exp);
  if (dtype == Dtype::kF16 && std::fabs(r) > 65504.0) return std::copysign(INFINITY, x);
  return r;
}

void ReferenceLlama::RmsNorm(const double* x, const float* g, double* out) const {
  const int n = cfg_.dim;
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double r = 1.0 / std::sqrt(ss / n + static_cast<double>(cfg_.rms_norm_eps));
  for (int i = 0; i < n; ++i) out[i] = static_cast<double>(g[i]) * x[i] * r;
}

void ReferenceLlama::Rope(double* head, int32_t pos) const {
  const int half = cfg_.head_dim / 2;
  const double p = static_cast<double>(pos) * position_scale_;
  for (int i = 0; i < half; ++i) {
    const double angle = p * inv_freq_[static_cast<size_t>(i)];
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    int a, b;
    if (cfg_.rope.layout == RopeLayout::kInterleaved) {
      a = 2 * i;
      b = 2 * i + 1;
    } else {
      a = i;
      b = i + half;
    }
    const double x0 = head[a];
    const double x1 = head[b];
    head[a] = x0 * c - x1 * s;
    head[b] = x0 * s + x1 * c;
  }
}

std::vector<double> ReferenceLlama::Step(int32_t token) {
  const ModelWeights& w = model_.weights();
  const int dim = cfg_.dim, hd = cfg_.head_dim, hidden = cfg_.hidden_dim;
  const int q_dim = cfg_.q_dim(), kv_dim = cfg_.kv_dim();
  const int group = cfg_.n_heads / cfg_.n_kv_heads;
  if (token < 0 || token >= cfg_.vocab_size) Die("token id outside the vocabulary");
  const int32_t pos = length_;

  std::vector<double> x(static_cast<size_t>(dim));
  for (int i = 0; i < dim; ++i) {
    x[i] = static_cast<double>(w.token_embedding.At(static_cast<int64_t>(token) * dim + i));
  }
  std::vector<double> xb(static_cast<size_t>(dim)), q(static_cast<size_t>(q_dim));
  std::vector<double> k(static_cast<size_t>(kv_dim)), v(static_cast<size_t>(kv_dim));
  std::vector<double> att(static_cast<size_t>(q_dim)), proj(static_cast<size_t>(dim));
  std::vector<double> h1(static_cast<size_t>(hidden)), h3(static_cast<size_t>(hidden));
  std::vector<double> scores(static_cast<size_t>(pos) + 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const int32_t first_key =
      cfg_.sliding_window > 0 ? std::max<int32_t>(0, pos - cfg_.sliding_window + 1) : 0;

  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    RmsNorm(x.data(), lw.rms_att, xb.data());
    MatVec(lw.wq, lw.bq, xb.data(), dim, q_dim, q.data());
    MatVec(lw.wk, lw.bk, xb.data(), dim, kv_dim, k.data());
    MatVec(lw.wv, lw.bv, xb.data(), dim, kv_dim, v.data());
    for (int h = 0; h < cfg_.n_heads; ++h) Rope(q.data() + h * hd, pos);
    for (int h = 0; h < cfg_.n_kv_heads; ++h) Rope(k.data() + h * hd, pos);
    // KV in the model's dtype: K after RoPE and V as projected, before this
    // position attends to them.
    for (int i = 0; i < kv_dim; ++i) {
      k[i] = RoundToSignificand(k[i], cfg_.dtype);
      v[i] = RoundToSignificand(v[i], cfg_.dtype);
    }

    std::vector<double>& kc = k_[static_cast<size_t>(l)];
    std::vector<double>& vc = v_[static_cast<size_t>(l)];
    kc.resize(static_cast<size_t>(pos) * kv_dim);
    vc.resize(static_cast<size_t>(pos) * kv_dim);
    kc.insert(kc.end(), k.begin(), k.end());
    vc.insert(vc.end(), v.begin(), v.end());

    for (int h = 0; h < cfg_.n_heads; ++h) {
      const int kvh = h / group;
      const double* qh = q.data() + h * hd;
      double max_score = -INFINITY;
      for (int32_t t = first_key; t <= pos; ++t) {
        const double* kt = kc.data() + static_cast<int64_t>(t) * kv_dim + kvh * hd;
        double dot = 0.0;
        for (int d = 0; d < hd; ++d) dot += qh[d] * kt[d];
        scores[static_cast<size_t>(t)] = dot * scale;
        max_score = std::max(max_score, dot * scale);
      }
      double sum = 0.0;
      for (int32_t t = first_key; t <= pos; ++t) {
        const double e = std::exp(scores[static_cast<size_t>(t)] - max_score);
        scores[static_cast<size_t>(t)] = e;
        sum += e;
      }
      double* out = att.data() + h * hd;
      for (int d = 0; d < hd; ++d) out[d] = 0.0;
      for (int32_t t = first_key; t <= pos; ++t) {
        const double p = scores[static_cast<size_t>(t)] / sum;
        const double* vt = vc.data() + static_cast<int64_t>(t) * kv_dim + kvh * hd;
        for (int d = 0; d < hd; ++d) out[d] += p * vt[d];
      }
    }
    MatVec(lw.wo, nullptr, att.data(), q_dim, dim, proj.data());
    for (int i = 0; i < dim; ++i) x[i] += proj[i];

    RmsNorm(x.data(), lw.rms_ffn, xb.data());
    MatVec(lw.w1, nullptr, xb.data(), dim, hidden, h1.data());
    MatVec(lw.w3, nullptr, xb.data(), dim, hidden, h3.data());
    for (int i = 0; i < hidden; ++i) {
      const double g = h1[i] / (1.0 + std::exp(-h1[i]));  // SiLU
      h1[i] = g * h3[i];
    }
    MatVec(lw.w2, nullptr, h1.data(), hidden, dim, proj.data());
    for (int i = 0; i < dim; ++i) x[i] += proj[i];
  }

  RmsNorm(x.data(), w.rms_final, xb.data());
  std::vector<double> logits(static_cast<size_t>(cfg_.vocab_size));
  MatVec(w.classifier, nullptr, xb.data(), dim, cfg_.vocab_size, logits.data());
  ++length_;
  return logits;
}

void ReferenceLlama::Truncate(int32_t length) {
  if (length < 0 || length > length_) Die("Truncate past the end");
  length_ = length;
  for (auto& kc : k_) kc.resize(static_cast<size_t>(length) * cfg_.kv_dim());
  for (auto& vc : v_) vc.resize(static_cast<size_t>(length) * cfg_.kv_dim());
}

std::vector<std::vector<double>> ReferenceLogits(const Model& model,
                                                 std::span<const int32_t> tokens) {
  ReferenceLlama ref(model);
  std::vector<std::vector<double>> rows;
  rows.reserve(tokens.size());
  for (int32_t t : tokens) rows.push_back(ref.Step(t));
  return rows;
}

GreedyRun ReferenceGreedy(const Model& model, std::span<const int32_t> prompt,
                          int32_t total_length) {
  if (prompt.empty() || total_length < static_cast<int32_t>(prompt.size())) {
    Die("ReferenceGreedy: empty prompt or total_length shorter than the prompt");
  }
  ReferenceLlama ref(model);
  GreedyRun run;
  run.tokens.assign(prompt.begin(), prompt.end());
  run.logits.reserve(static_cast<size_t>(total_length));
  for (size_t i = 0; i < static_cast<size_t>(total_length); ++i) {
    run.logits.push_back(ref.Step(run.tokens[i]));
    if (i + 1 == run.tokens.size() && run.tokens.size() < static_cast<size_t>(total_length)) {
      run.tokens.push_back(TopTwoOf(run.logits.back()).top1);
    }
  }
  return run;
}

TopTwo TopTwoOf(std::span<const double> logits) {
  TopTwo r;
  double best = -INFINITY, second = -INFINITY;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double x = logits[i];
    if (r.top1 < 0 || x > best) {
      second = best;
      best = x;
      r.top1 = static_cast<int32_t>(i);
    } else if (x > second) {
      second = x;
    }
  }
  r.margin = logits.size() < 2 ? INFINITY : best - second;
  return r;
}

}  // namespace vc::reference
