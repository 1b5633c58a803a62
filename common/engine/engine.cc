#include "common/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"

namespace vc {
namespace {

// Inverse frequencies of the rotary pairs, with the config's scaling rule.
std::vector<double> RopeInverseFrequencies(const RopeConfig& rope, int head_dim) {
  const int pairs = head_dim / 2;
  std::vector<double> inv(pairs);
  constexpr double kPi = 3.14159265358979323846;
  for (int i = 0; i < pairs; ++i) {
    double f = std::pow(rope.theta, -2.0 * i / head_dim);
    switch (rope.scaling) {
      case RopeConfig::Scaling::kNone:
        break;
      case RopeConfig::Scaling::kLinear:
        f /= rope.factor;
        break;
      case RopeConfig::Scaling::kLlama3: {
        const double low_wavelen = rope.original_max_position / rope.low_freq_factor;
        const double high_wavelen = rope.original_max_position / rope.high_freq_factor;
        const double wavelen = 2 * kPi / f;
        if (wavelen > low_wavelen) {
          f /= rope.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) /
                                (rope.high_freq_factor - rope.low_freq_factor);
          f = (1 - smooth) * f / rope.factor + smooth * f;
        }
        break;
      }
    }
    inv[i] = f;
  }
  return inv;
}

}  // namespace

// Activations of one pass, grown on demand and reused across calls.
struct Engine::Scratch {
  std::vector<float> x, xb, q, k, v, att, proj, gate, up, cos_sin, final_norm;
  std::vector<int32_t> row_pos, row_token;
  std::vector<int32_t> row_entry;
  std::vector<double> inv_freq;
};

Engine::Engine(const Model& model, std::unique_ptr<kernels::KernelBackend> backend,
               const EngineOptions& options)
    : model_(model), backend_(std::move(backend)), options_(options),
      scratch_(std::make_unique<Scratch>()) {
  scratch_->inv_freq = RopeInverseFrequencies(model.config().rope, model.config().head_dim);
}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Model& model,
                                                       const EngineOptions& options) {
  VC_RETURN_IF_ERROR(model.config().Validate());
  if (options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError("max_batch_tokens must be >= 1");
  }
  VC_ASSIGN_OR_RETURN(auto backend, kernels::CreateBackend(options.backend));
  return std::unique_ptr<Engine>(new Engine(model, std::move(backend), options));
}

absl::Status Engine::Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();

  // ---- Validate everything before touching any KV. ----
  int64_t n_rows = 0, n_logit_rows = 0;
  std::unordered_set<const SequenceKv*> seen;
  for (size_t e = 0; e < batch.size(); ++e) {
    const SequenceInput& in = batch[e];
    if (in.kv == nullptr) return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, ": no KV"));
    if (!seen.insert(in.kv).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry ", e, ": the same sequence appears twice in one batch"));
    }
    if (in.first_logit < 0 || in.first_logit > static_cast<int64_t>(in.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, ": first_logit ",
                                                     in.first_logit, " outside [0, ",
                                                     in.tokens.size(), "]"));
    }
    for (int32_t t : in.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, ": token id ", t,
                                                       " outside the vocabulary [0, ",
                                                       c.vocab_size, ")"));
      }
    }
    n_rows += static_cast<int64_t>(in.tokens.size());
    n_logit_rows += static_cast<int64_t>(in.tokens.size()) - in.first_logit;
  }
  if (n_rows > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", n_rows,
                                                   " tokens exceeds max_batch_tokens ",
                                                   options_.max_batch_tokens));
  }
  logits->assign(static_cast<size_t>(n_logit_rows * c.vocab_size), 0.0f);
  if (n_rows == 0) return absl::OkStatus();

  // Reserve the positions; undo the ones already made if one fails.
  std::vector<int32_t> old_len(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    old_len[e] = batch[e].kv->next_position();
    absl::Status s = batch[e].kv->Append(static_cast<int32_t>(batch[e].tokens.size()));
    if (!s.ok()) {
      for (size_t u = 0; u < e; ++u) batch[u].kv->Truncate(old_len[u]);
      return s;
    }
  }

  Scratch& s = *scratch_;
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  const int hd = c.head_dim, pairs = c.head_dim / 2;
  s.row_pos.resize(n_rows);
  s.row_token.resize(n_rows);
  s.row_entry.resize(n_rows);
  {
    int64_t r = 0;
    for (size_t e = 0; e < batch.size(); ++e) {
      for (size_t i = 0; i < batch[e].tokens.size(); ++i, ++r) {
        s.row_pos[r] = old_len[e] + static_cast<int32_t>(i);
        s.row_token[r] = batch[e].tokens[i];
        s.row_entry[r] = static_cast<int32_t>(e);
      }
    }
  }
  s.x.resize(n_rows * dim);
  s.xb.resize(n_rows * dim);
  s.q.resize(n_rows * qd);
  s.k.resize(n_rows * kvd);
  s.v.resize(n_rows * kvd);
  s.att.resize(n_rows * qd);
  s.proj.resize(n_rows * dim);
  s.gate.resize(n_rows * hid);
  s.up.resize(n_rows * hid);
  s.cos_sin.resize(n_rows * pairs * 2);

  // RoPE angles per row: computed in double, rounded once to float.
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int i = 0; i < pairs; ++i) {
      const double angle = static_cast<double>(s.row_pos[r]) * s.inv_freq[i];
      s.cos_sin[(r * pairs + i) * 2] = static_cast<float>(std::cos(angle));
      s.cos_sin[(r * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  auto rope = [&](float* vec, int64_t r, int heads) {
    const float* cs = &s.cos_sin[r * pairs * 2];
    for (int h = 0; h < heads; ++h) {
      float* head = vec + int64_t{h} * hd;
      for (int i = 0; i < pairs; ++i) {
        const int a = c.rope.layout == RopeLayout::kInterleaved ? 2 * i : i;
        const int b = c.rope.layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + pairs;
        const float x0 = head[a], x1 = head[b], cs0 = cs[2 * i], sn = cs[2 * i + 1];
        head[a] = x0 * cs0 - x1 * sn;
        head[b] = x0 * sn + x1 * cs0;
      }
    }
  };

  for (int64_t r = 0; r < n_rows; ++r) {
    std::copy_n(w.token_embedding + int64_t{s.row_token[r]} * dim, dim, &s.x[r * dim]);
  }

  kernels::KernelBackend& be = *backend_;
  ThreadPool& pool = be.pool();
  const int group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    for (int64_t r = 0; r < n_rows; ++r) {
      kernels::RmsNorm(be, &s.x[r * dim], lw.rms_att, dim, c.rms_norm_eps, &s.xb[r * dim]);
    }
    be.Matmul(s.xb.data(), n_rows, lw.wq, lw.bq, dim, qd, s.q.data());
    be.Matmul(s.xb.data(), n_rows, lw.wk, lw.bk, dim, kvd, s.k.data());
    be.Matmul(s.xb.data(), n_rows, lw.wv, lw.bv, dim, kvd, s.v.data());
    for (int64_t r = 0; r < n_rows; ++r) {
      rope(&s.q[r * qd], r, c.n_heads);
      rope(&s.k[r * kvd], r, c.n_kv_heads);
      batch[s.row_entry[r]].kv->Write(l, s.row_pos[r], &s.k[r * kvd], &s.v[r * kvd]);
    }
    // Attention: every (row, head) is independent; the key order inside one
    // is fixed by its KV representation.
    const int64_t units = n_rows * c.n_heads;
    const int64_t work_per_unit = std::max<int64_t>(1, int64_t{s.row_pos[n_rows - 1] + 1} * hd * 2);
    pool.ParallelFor(units, std::max<int64_t>(1, 32768 / work_per_unit), [&](int64_t u0, int64_t u1) {
      thread_local std::vector<float> scores;
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t r = u / c.n_heads;
        const int h = static_cast<int>(u % c.n_heads);
        const int kvh = h / group;
        const SequenceKv& kv = *batch[s.row_entry[r]].kv;
        const int32_t pos = s.row_pos[r];
        const int32_t min_pos = c.sliding_window > 0 ? pos - c.sliding_window + 1 : 0;
        const SequenceKv::KeyRange range = kv.Keys(l, kvh, min_pos, pos);
        scores.resize(std::max<int64_t>(1, range.count));
        kv.Scores(be, l, kvh, range, &s.q[r * qd + int64_t{h} * hd], scale, scores.data());
        be.Softmax(scores.data(), range.count);
        if (AttentionObserver* obs = batch[s.row_entry[r]].observer) {
          obs->Observe(l, h, kvh, pos, range, scores.data());
        }
        float* out = &s.att[r * qd + int64_t{h} * hd];
        std::fill_n(out, hd, 0.0f);
        kv.MixValues(be, l, kvh, range, scores.data(), out);
      }
    });
    be.Matmul(s.att.data(), n_rows, lw.wo, nullptr, qd, dim, s.proj.data());
    for (int64_t i = 0; i < n_rows * dim; ++i) s.x[i] = s.x[i] + s.proj[i];

    for (int64_t r = 0; r < n_rows; ++r) {
      kernels::RmsNorm(be, &s.x[r * dim], lw.rms_ffn, dim, c.rms_norm_eps, &s.xb[r * dim]);
    }
    be.Matmul(s.xb.data(), n_rows, lw.w1, nullptr, dim, hid, s.gate.data());
    be.Matmul(s.xb.data(), n_rows, lw.w3, nullptr, dim, hid, s.up.data());
    for (int64_t i = 0; i < n_rows * hid; ++i) s.gate[i] = kernels::Silu(s.gate[i]) * s.up[i];
    be.Matmul(s.gate.data(), n_rows, lw.w2, nullptr, hid, dim, s.proj.data());
    for (int64_t i = 0; i < n_rows * dim; ++i) s.x[i] = s.x[i] + s.proj[i];
  }

  // Final norm and classifier for the requested rows only.
  s.final_norm.resize(n_logit_rows * dim);
  {
    int64_t out_row = 0, r = 0;
    for (size_t e = 0; e < batch.size(); ++e) {
      const int64_t len = static_cast<int64_t>(batch[e].tokens.size());
      for (int64_t i = 0; i < len; ++i, ++r) {
        if (i < batch[e].first_logit) continue;
        kernels::RmsNorm(be, &s.x[r * dim], w.rms_final, dim, c.rms_norm_eps,
                         &s.final_norm[out_row * dim]);
        ++out_row;
      }
    }
  }
  if (n_logit_rows > 0) {
    be.Matmul(s.final_norm.data(), n_logit_rows, w.classifier, nullptr, dim, c.vocab_size,
              logits->data());
  }
  return absl::OkStatus();
}

}  // namespace vc
