// Token-dropping stages: StreamingLLM, H2O, SnapKV, PyramidKV and TOVA. Each
// keeps, per layer and KV head, a budget of positions sized by the ratio
// (TokenBudget) and chosen by its published rule; kept rows stay f32 unless a
// quantiser follows. Scores come from AttentionStats, which already sums a
// GQA group's query heads into its KV head. Ties always go to the more recent
// position, so a selection never depends on sort internals.
#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compress/internal/selection.h"
#include "common/compress/internal/stages.h"

namespace vc::compress_internal {
namespace {

CompressorParamInfo RatioParam() {
  return {"--ratio", "(required)",
          "target compression ratio c in (0, 1]: compressed bytes (rows + 4-byte position "
          "indices) / full f32 bytes; the largest per-head token count that does not exceed c "
          "is kept, at least 1"};
}
CompressorParamInfo WindowParam(const CompressorOptions& d) {
  return {"--window", std::to_string(d.window),
          "observation window: the last W prompt queries score the keys, and the last W "
          "positions are always kept (AttentionStats must be gathered with the same window)"};
}
CompressorParamInfo PoolParam(const CompressorOptions& d) {
  return {"--pool-kernel", std::to_string(d.pool_kernel),
          "odd width of the max-pooling over neighbouring positions' scores"};
}

std::vector<int32_t> Range(int32_t first, int32_t last) {
  std::vector<int32_t> out(std::max(0, last - first));
  std::iota(out.begin(), out.end(), first);
  return out;
}

// Scores of positions [0, n) of one (layer, KV head).
template <typename Getter>
std::vector<double> HeadScores(int32_t n, Getter get) {
  std::vector<double> s(std::max(n, 0));
  for (int32_t j = 0; j < n; ++j) s[j] = get(j);
  return s;
}

// The `k` candidates in [begin, end) with the highest score (ties: the more
// recent position), in increasing order.
template <typename Score>
std::vector<int32_t> TopKOf(const std::vector<int32_t>& candidates, size_t begin, size_t end,
                            int32_t k, Score score) {
  std::vector<std::pair<double, int32_t>> ranked;
  ranked.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) ranked.emplace_back(score(candidates[i]), candidates[i]);
  const size_t take = std::min(ranked.size(), static_cast<size_t>(std::max(k, 0)));
  std::partial_sort(ranked.begin(), ranked.begin() + take, ranked.end(),
                    [](const auto& a, const auto& b) {
                      return a.first != b.first ? a.first > b.first : a.second > b.second;
                    });
  std::vector<int32_t> out(take);
  for (size_t i = 0; i < take; ++i) out[i] = ranked[i].second;
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status CheckDecodeStats(const std::string& label, const DecodeAttentionStats* stats,
                              int32_t total_len) {
  if (stats == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": the online rule ranks tokens by decode-time attention; pass the drafter's "
               "DecodeAttentionStats"));
  }
  if (stats->max_len() < total_len) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": decode statistics cover ",
                                                   stats->max_len(), " positions, fold needs ",
                                                   total_len));
  }
  return absl::OkStatus();
}

absl::Status CheckStats(const std::string& label, const AttentionStats& stats, int32_t prefix_len) {
  if (stats.prompt_len() < prefix_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": attention statistics cover ", stats.prompt_len(),
                     " prompt tokens but the prefix to compress has ", prefix_len));
  }
  return absl::OkStatus();
}

absl::Status CheckWindow(const std::string& label, const AttentionStats& stats, int window) {
  if (stats.window() != window) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": attention statistics were gathered over a window of ", stats.window(),
        " queries but --window is ", window, "; gather them with the same window"));
  }
  return absl::OkStatus();
}

class RatioDropper : public Dropper {
 public:
  RatioDropper(std::string label, double ratio) : label_(std::move(label)), ratio_(ratio) {}

 protected:
  std::string label_;
  double ratio_;
};

// StreamingLLM (Xiao et al.): the first `sink_tokens` positions (attention
// sinks) plus the most recent ones. With a budget k below the sink count,
// only the first k sinks are kept.
class StreamingLlm final : public RatioDropper {
 public:
  StreamingLlm(std::string label, double ratio, int sinks)
      : RatioDropper(std::move(label), ratio), sinks_(sinks) {}

  absl::StatusOr<KeptPositions> Select(const ModelConfig& config, int32_t prefix_len,
                                       const AttentionStats& /*stats*/) const override {
    const int32_t k = TokenBudget(config, prefix_len, ratio_);
    const int32_t sinks = std::min(k, sinks_);
    std::vector<int32_t> kept = Range(0, sinks);
    const std::vector<int32_t> recent = Range(prefix_len - (k - sinks), prefix_len);
    kept.insert(kept.end(), recent.begin(), recent.end());
    return KeptPositions(config.n_layers,
                         std::vector<std::vector<int32_t>>(config.n_kv_heads, kept));
  }
  std::string Describe() const override {
    return absl::StrCat("streamingllm(ratio=", FormatDouble(ratio_), ",sink_tokens=", sinks_, ")");
  }

  // Online: the same rule at the new length. The budget grows more slowly
  // than the sequence, so the candidates always hold the window, and while
  // the budget covers the sinks the result equals Select at total_len (a
  // sink evicted by a budget below the sink count does not come back).
  bool has_online_rule() const override { return true; }
  absl::StatusOr<std::vector<int32_t>> SelectOnline(
      const ModelConfig& config, int /*layer*/, int /*kv_head*/,
      const std::vector<int32_t>& candidates, int32_t total_len,
      const DecodeAttentionStats* /*stats*/) const override {
    const size_t k = static_cast<size_t>(TokenBudget(config, total_len, ratio_));
    if (candidates.size() <= k) return candidates;
    const size_t sinks = std::min<size_t>(k, static_cast<size_t>(sinks_));
    std::vector<int32_t> kept;
    size_t i = 0;
    for (; i < candidates.size() && candidates[i] < sinks_ && kept.size() < sinks; ++i) {
      kept.push_back(candidates[i]);
    }
    // The most recent non-sink candidates fill the rest of the budget.
    size_t first_recent = candidates.size() - (k - kept.size());
    first_recent = std::max(first_recent, i);
    kept.insert(kept.end(), candidates.begin() + first_recent, candidates.end());
    return kept;
  }

 private:
  int sinks_;
};

// H2O (Zhang et al.): the budget is split half/half between heavy hitters
// (the highest attention accumulated over all prompt queries) and the most
// recent tokens; heavy hitters are chosen among the positions before the
// recent window. An odd budget gives the extra token to the recent window,
// so a budget of 1 keeps the last token.
class H2o final : public RatioDropper {
 public:
  using RatioDropper::RatioDropper;

  absl::StatusOr<KeptPositions> Select(const ModelConfig& config, int32_t prefix_len,
                                       const AttentionStats& stats) const override {
    VC_RETURN_IF_ERROR(CheckStats(label_, stats, prefix_len));
    const int32_t k = TokenBudget(config, prefix_len, ratio_);
    const int32_t heavy = k / 2, recent = k - heavy;
    const int32_t split = prefix_len - recent;
    KeptPositions out(config.n_layers, std::vector<std::vector<int32_t>>(config.n_kv_heads));
    for (int l = 0; l < config.n_layers; ++l) {
      for (int h = 0; h < config.n_kv_heads; ++h) {
        const std::vector<double> score =
            HeadScores(split, [&](int32_t j) { return stats.accumulated(l, h, j); });
        std::vector<int32_t> kept = TopK(score, 0, split, heavy);
        const std::vector<int32_t> tail = Range(split, prefix_len);
        kept.insert(kept.end(), tail.begin(), tail.end());
        out[l][h] = std::move(kept);
      }
    }
    return out;
  }
  std::string Describe() const override {
    return absl::StrCat("h2o(ratio=", FormatDouble(ratio_), ",heavy_share=0.5)");
  }

  // Online: the budget of the new length, half (rounded up) to the most
  // recent candidates, half to the heavy hitters among the older ones by
  // attention accumulated over the prompt and every drafter query so far.
  bool has_online_rule() const override { return true; }
  bool online_needs_stats() const override { return true; }
  absl::StatusOr<std::vector<int32_t>> SelectOnline(
      const ModelConfig& config, int layer, int kv_head, const std::vector<int32_t>& candidates,
      int32_t total_len, const DecodeAttentionStats* stats) const override {
    VC_RETURN_IF_ERROR(CheckDecodeStats(label_, stats, total_len));
    const int32_t k = TokenBudget(config, total_len, ratio_);
    if (candidates.size() <= static_cast<size_t>(k)) return candidates;
    const int32_t heavy = k / 2, recent = k - heavy;
    const size_t split = candidates.size() - static_cast<size_t>(recent);
    std::vector<int32_t> kept = TopKOf(candidates, 0, split, heavy, [&](int32_t pos) {
      return stats->accumulated(layer, kv_head, pos);
    });
    kept.insert(kept.end(), candidates.begin() + split, candidates.end());
    return kept;
  }
};

// SnapKV's rule for one (layer, KV head) with budget k: the last `window`
// positions are always kept; the rest of the budget goes to the positions
// before the window with the highest max-pooled window attention (pooling
// only over those positions). A budget within the window keeps its most
// recent k positions.
std::vector<int32_t> SnapKvSelect(const AttentionStats& stats, int layer, int kv_head,
                                  int32_t prefix_len, int32_t k, int window, int pool_kernel) {
  if (k >= prefix_len) return Range(0, prefix_len);
  const int32_t w = std::min<int32_t>(window, prefix_len);
  if (k <= w) return Range(prefix_len - k, prefix_len);
  const int32_t outside = prefix_len - w;
  const std::vector<double> score =
      HeadScores(outside, [&](int32_t j) { return stats.windowed(layer, kv_head, j); });
  std::vector<int32_t> kept = TopK(MaxPool(score, outside, pool_kernel), 0, outside, k - w);
  const std::vector<int32_t> tail = Range(outside, prefix_len);
  kept.insert(kept.end(), tail.begin(), tail.end());
  return kept;
}

// SnapKV (Li et al.): the same budget in every layer.
class SnapKv final : public RatioDropper {
 public:
  SnapKv(std::string label, double ratio, int window, int pool_kernel)
      : RatioDropper(std::move(label), ratio), window_(window), pool_kernel_(pool_kernel) {}

  absl::StatusOr<KeptPositions> Select(const ModelConfig& config, int32_t prefix_len,
                                       const AttentionStats& stats) const override {
    VC_RETURN_IF_ERROR(CheckStats(label_, stats, prefix_len));
    VC_RETURN_IF_ERROR(CheckWindow(label_, stats, window_));
    const int32_t k = TokenBudget(config, prefix_len, ratio_);
    KeptPositions out(config.n_layers, std::vector<std::vector<int32_t>>(config.n_kv_heads));
    for (int l = 0; l < config.n_layers; ++l) {
      for (int h = 0; h < config.n_kv_heads; ++h) {
        out[l][h] = SnapKvSelect(stats, l, h, prefix_len, k, window_, pool_kernel_);
      }
    }
    return out;
  }
  std::string Describe() const override {
    return absl::StrCat("snapkv(ratio=", FormatDouble(ratio_), ",window=", window_,
                        ",pool_kernel=", pool_kernel_, ")");
  }

 private:
  int window_, pool_kernel_;
};

// PyramidKV (Cai et al.): SnapKV's selection with budgets decreasing
// linearly from the bottom layer to the top (PyramidBudgets), averaging
// exactly the uniform budget of the ratio.
class PyramidKv final : public RatioDropper {
 public:
  PyramidKv(std::string label, double ratio, int window, int pool_kernel, double beta)
      : RatioDropper(std::move(label), ratio),
        window_(window),
        pool_kernel_(pool_kernel),
        beta_(beta) {}

  absl::StatusOr<KeptPositions> Select(const ModelConfig& config, int32_t prefix_len,
                                       const AttentionStats& stats) const override {
    VC_RETURN_IF_ERROR(CheckStats(label_, stats, prefix_len));
    VC_RETURN_IF_ERROR(CheckWindow(label_, stats, window_));
    const std::vector<int32_t> budget =
        PyramidBudgets(TokenBudget(config, prefix_len, ratio_), config.n_layers, beta_, prefix_len);
    KeptPositions out(config.n_layers, std::vector<std::vector<int32_t>>(config.n_kv_heads));
    for (int l = 0; l < config.n_layers; ++l) {
      for (int h = 0; h < config.n_kv_heads; ++h) {
        out[l][h] = SnapKvSelect(stats, l, h, prefix_len, budget[l], window_, pool_kernel_);
      }
    }
    return out;
  }
  std::string Describe() const override {
    return absl::StrCat("pyramidkv(ratio=", FormatDouble(ratio_), ",window=", window_,
                        ",pool_kernel=", pool_kernel_, ",beta=", FormatDouble(beta_), ")");
  }

 private:
  int window_, pool_kernel_;
  double beta_;
};

// TOVA (Oren et al.): the positions the last prompt query attends to most,
// per KV head. Applied once to the whole prefix, TOVA's one-token-at-a-time
// eviction of the lowest-scored token reduces to keeping the top k.
class Tova final : public RatioDropper {
 public:
  using RatioDropper::RatioDropper;

  absl::StatusOr<KeptPositions> Select(const ModelConfig& config, int32_t prefix_len,
                                       const AttentionStats& stats) const override {
    VC_RETURN_IF_ERROR(CheckStats(label_, stats, prefix_len));
    const int32_t k = TokenBudget(config, prefix_len, ratio_);
    KeptPositions out(config.n_layers, std::vector<std::vector<int32_t>>(config.n_kv_heads));
    for (int l = 0; l < config.n_layers; ++l) {
      for (int h = 0; h < config.n_kv_heads; ++h) {
        const std::vector<double> score =
            HeadScores(prefix_len, [&](int32_t j) { return stats.last(l, h, j); });
        out[l][h] = TopK(score, 0, prefix_len, k);
      }
    }
    return out;
  }
  std::string Describe() const override {
    return absl::StrCat("tova(ratio=", FormatDouble(ratio_), ")");
  }

  // Online: the budget of the new length goes to the candidates the most
  // recent drafter query attended to most. Candidates after that query's
  // position (tokens it could not see, e.g. a bonus token the verifier
  // refreshed) rank first, as the newest tokens would in TOVA's own loop.
  bool has_online_rule() const override { return true; }
  bool online_needs_stats() const override { return true; }
  absl::StatusOr<std::vector<int32_t>> SelectOnline(
      const ModelConfig& config, int layer, int kv_head, const std::vector<int32_t>& candidates,
      int32_t total_len, const DecodeAttentionStats* stats) const override {
    VC_RETURN_IF_ERROR(CheckDecodeStats(label_, stats, total_len));
    const int32_t k = TokenBudget(config, total_len, ratio_);
    if (candidates.size() <= static_cast<size_t>(k)) return candidates;
    const int32_t last_query = stats->last_query_pos();
    return TopKOf(candidates, 0, candidates.size(), k, [&](int32_t pos) {
      return pos > last_query ? std::numeric_limits<double>::infinity()
                              : stats->last(layer, kv_head, pos);
    });
  }
};

absl::Status CheckPositive(const std::string& label, const char* flag, int value, int min) {
  if (value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", flag, " must be >= ", min, ", got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckSnapParams(const std::string& label, const CompressorOptions& o) {
  VC_RETURN_IF_ERROR(CheckPositive(label, "--window", o.window, 0));
  if (o.pool_kernel < 1 || o.pool_kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": --pool-kernel must be odd and >= 1 (centred pooling), got ", o.pool_kernel));
  }
  return absl::OkStatus();
}

absl::Status CheckRatio(const CompressorOptions& o, const std::string& label) {
  if (!(o.ratio > 0.0 && o.ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": --ratio must be in (0, 1] (compressed / full bytes), got ",
                     FormatDouble(o.ratio), o.ratio == 0.0 ? " (not given)" : ""));
  }
  return absl::OkStatus();
}

// A table row's CompressorInfo for a dropper: what every dropper shares
// (family, --ratio) plus its own text and parameters.
CompressorInfo DropperRowInfo(const char* name, const char* description, bool needs_stats,
                              const char* online_rule, std::vector<CompressorParamInfo> extra) {
  CompressorInfo info;
  info.name = name;
  info.family = "token-dropping";
  info.description = description;
  info.takes_ratio = true;
  info.needs_attention_stats = needs_stats;
  info.params.push_back(RatioParam());
  info.params.insert(info.params.end(), extra.begin(), extra.end());
  info.online = online_rule != nullptr ? OnlinePolicy::Kind::kEveryToken : OnlinePolicy::Kind::kNone;
  info.online_rule = online_rule != nullptr
                         ? online_rule
                         : "none: the published rule compresses once after prefill; generated "
                           "tokens stay exact";
  return info;
}

}  // namespace

const std::vector<StageEntry<Dropper>>& DropperTable() {
  using Made = absl::StatusOr<std::unique_ptr<Dropper>>;
  const CompressorOptions d;
  static const auto* table = new std::vector<StageEntry<Dropper>>{
      {DropperRowInfo(
           "streamingllm",
           "StreamingLLM: keeps the first --sink-tokens positions (attention sinks) and the most "
           "recent ones",
           /*needs_stats=*/false,
           "every settled token: keep the sinks and the most recent tokens, the budget of --ratio "
           "at the current length (the oldest non-sink tokens leave)",
           {{"--sink-tokens", std::to_string(d.sink_tokens),
             "leading positions always kept (fewer if the budget is smaller)"}}),
       [](const CompressorOptions& o, const std::string& label) -> Made {
         VC_RETURN_IF_ERROR(CheckRatio(o, label));
         VC_RETURN_IF_ERROR(CheckPositive(label, "--sink-tokens", o.sink_tokens, 0));
         return std::make_unique<StreamingLlm>(label, o.ratio, o.sink_tokens);
       }},
      {DropperRowInfo(
           "h2o",
           "H2O: half the budget to heavy hitters (highest attention accumulated over all prompt "
           "queries), half (rounded up) to the most recent tokens",
           /*needs_stats=*/true,
           "every settled token: the budget of --ratio at the current length, half to the most "
           "recent tokens, half to the heavy hitters by attention accumulated over the prompt and "
           "the drafter's decode queries",
           {}),
       [](const CompressorOptions& o, const std::string& label) -> Made {
         VC_RETURN_IF_ERROR(CheckRatio(o, label));
         return std::make_unique<H2o>(label, o.ratio);
       }},
      {DropperRowInfo(
           "snapkv",
           "SnapKV: keeps the observation window plus the positions before it with the highest "
           "window attention, max-pooled over neighbouring positions; same budget in every layer",
           /*needs_stats=*/true, /*online_rule=*/nullptr, {WindowParam(d), PoolParam(d)}),
       [](const CompressorOptions& o, const std::string& label) -> Made {
         VC_RETURN_IF_ERROR(CheckRatio(o, label));
         VC_RETURN_IF_ERROR(CheckSnapParams(label, o));
         return std::make_unique<SnapKv>(label, o.ratio, o.window, o.pool_kernel);
       }},
      {DropperRowInfo(
           "pyramidkv",
           "PyramidKV: SnapKV's selection with per-layer budgets falling linearly from "
           "(1 + beta) x the mean at the bottom layer to (1 - beta) x at the top; the mean is the "
           "uniform budget of --ratio",
           /*needs_stats=*/true, /*online_rule=*/nullptr,
           {WindowParam(d), PoolParam(d),
            {"--pyramid-beta", FormatDouble(d.pyramid_beta), "budget slope beta in [0, 1]"}}),
       [](const CompressorOptions& o, const std::string& label) -> Made {
         VC_RETURN_IF_ERROR(CheckRatio(o, label));
         VC_RETURN_IF_ERROR(CheckSnapParams(label, o));
         if (!(o.pyramid_beta >= 0.0 && o.pyramid_beta <= 1.0)) {
           return absl::InvalidArgumentError(absl::StrCat(
               label, ": --pyramid-beta must be in [0, 1], got ", FormatDouble(o.pyramid_beta)));
         }
         return std::make_unique<PyramidKv>(label, o.ratio, o.window, o.pool_kernel,
                                            o.pyramid_beta);
       }},
      {DropperRowInfo(
           "tova", "TOVA: keeps the positions the last prompt query attends to most (per KV head)",
           /*needs_stats=*/true,
           "every settled token: the budget of --ratio at the current length goes to the tokens "
           "the drafter's latest query attended to most",
           {}),
       [](const CompressorOptions& o, const std::string& label) -> Made {
         VC_RETURN_IF_ERROR(CheckRatio(o, label));
         return std::make_unique<Tova>(label, o.ratio);
       }},
  };
  return *table;
}

}  // namespace vc::compress_internal
