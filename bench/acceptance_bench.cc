// vc_acceptance_bench: how well each compressor drafts for the verifier, and
// how far the lossy baseline drifts without one. Prints, per model:
//  1. the acceptance table: mean tokens per verify round (accepted drafts +
//     the corrected/bonus token) per compressor, ratio/bits and draft length
//     x, measured as in ../shared/models/README.md (greedy, KV refresh on, 100
//     generated tokens after natural prompts);
//  2. the lossy baseline's divergence from full KV: the first position where
//     its free-running greedy output differs, and the per-step KL(full ||
//     compressed) with both caches teacher-forced along the full-KV output.
// With --drafters instead: acceptance per compressor x drafter (the target
// with f32, int8 and int4 weights over its compressed KV, and the other test
// model as a separate draft model over its own compressed KV).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "common/base/flags.h"
#include "common/compress/compressor.h"
#include "common/decode/full_decode.h"
#include "common/model/quantized_weights.h"
#include "common/speculative/draft_verify.h"
#include "nlohmann/json.hpp"

namespace vc {
namespace {

struct Config {
  std::string name;
  double ratio = 0;
  int bits = 0;
  std::string Label() const {
    std::string l = name;
    if (ratio > 0) l += " c=" + std::to_string(ratio).substr(0, 4);
    if (bits > 0) l += " b=" + std::to_string(bits);
    return l;
  }
};

std::vector<Config> Configs(bool quick) {
  std::vector<Config> out;
  for (const char* d : {"streamingllm", "h2o", "snapkv", "pyramidkv", "tova"}) {
    for (double r : quick ? std::vector<double>{0.5} : std::vector<double>{0.1, 0.25, 0.5}) {
      out.push_back({d, r, 0});
    }
  }
  out.push_back({"kivi", 0, 2});
  out.push_back({"kivi", 0, 4});
  out.push_back({"int8", 0, 8});
  out.push_back({"snapkv+kivi", 0.5, 4});
  out.push_back({"h2o+int8", 0.5, 8});
  return out;
}

// Natural prompts for a model without a tokenizer: its own sampled text.
std::vector<std::vector<int32_t>> Prompts(Engine& engine, const std::vector<int>& lengths) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < lengths.size(); ++i) {
    DecodeOptions o;
    o.max_new_tokens = lengths[i] - 1;
    o.ignore_eos = true;
    o.sampling = {1.0f, 0, 1.0f, 500 + i};
    std::vector<int32_t> p = {engine.config().bos_id};
    auto r = DecodeFull(engine, p, o);
    if (!r.ok()) std::abort();
    p.insert(p.end(), r->tokens.begin(), r->tokens.end());
    out.push_back(std::move(p));
  }
  return out;
}

CompressorOptions ToOptions(const Config& c) {
  CompressorOptions o;
  o.name = c.name;
  o.ratio = c.ratio;
  o.bits = c.bits;
  return o;
}

struct Acceptance {
  double tokens_per_round = 0;
  double ratio = 0;
  std::vector<std::vector<int32_t>> outputs;  // per prompt
};

// draft_engine (optional) runs the draft steps: a weight-quantised copy of
// the target, or with draft_model set a separate model (KV refresh off).
Acceptance MeasureAcceptance(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                             const Config& c, int x, int64_t new_tokens,
                             Engine* draft_engine = nullptr,
                             const ModelConfig* draft_model = nullptr, bool kv_refresh = true) {
  std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
  for (const auto& p : prompts) {
    RequestOptions ro;
    ro.mode = DecodeMode::kVeriCache;
    ro.max_new_tokens = std::min<int64_t>(new_tokens, engine.config().max_seq_len - p.size());
    ro.ignore_eos = true;
    ro.compressor = ToOptions(c);
    ro.draft.draft_len = x;
    ro.draft.fallback_min_accepted = -1;
    ro.draft_model = draft_model;
    ro.draft.kv_refresh = kv_refresh && draft_model == nullptr;
    reqs.push_back(std::move(SpeculativeRequest::Create(engine, p, ro)).value());
  }
  if (!RunBatch(engine, draft_engine, reqs).ok()) std::abort();
  double rounds = 0, tokens = 0, ratio = 0;
  std::vector<std::vector<int32_t>> outputs;
  for (const auto& r : reqs) {
    rounds += r->stats().verify_rounds;
    for (int a : r->stats().accept_lengths) tokens += a + 1;
    ratio += r->stats().compression_ratio;
    outputs.push_back(r->output());
  }
  return {rounds > 0 ? tokens / rounds : 0, ratio / reqs.size(), std::move(outputs)};
}

struct Divergence {
  double first_divergence = 0;  // mean over prompts; == generated length if none
  double mean_kl = 0;           // nats per step
  double max_kl = 0;
};

std::vector<double> Softmax(std::span<const float> logits) {
  double m = logits[0];
  for (float l : logits) m = std::max(m, double{l});
  std::vector<double> p(logits.size());
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += p[i] = std::exp(logits[i] - m);
  for (double& v : p) v /= s;
  return p;
}

Divergence MeasureLossy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                        const Config& c, int64_t new_tokens) {
  const ModelConfig& mc = engine.config();
  auto compressor = std::move(CreateCompressor(ToOptions(c))).value();
  Divergence d;
  double kl_sum = 0;
  int64_t kl_steps = 0;
  for (const auto& prompt : prompts) {
    const int64_t n = std::min<int64_t>(new_tokens, mc.max_seq_len - prompt.size());
    DecodeOptions o;
    o.max_new_tokens = n;
    o.ignore_eos = true;
    const std::vector<int32_t> full = std::move(DecodeFull(engine, prompt, o)).value().tokens;
    // Free-running lossy output.
    RequestOptions ro;
    ro.mode = DecodeMode::kLossy;
    ro.max_new_tokens = n;
    ro.ignore_eos = true;
    ro.compressor = ToOptions(c);
    std::vector<std::unique_ptr<SpeculativeRequest>> reqs;
    reqs.push_back(std::move(SpeculativeRequest::Create(engine, prompt, ro)).value());
    if (!RunBatch(engine, reqs).ok()) std::abort();
    int64_t first = n;
    for (int64_t i = 0; i < n; ++i) {
      if (reqs[0]->output()[i] != full[i]) {
        first = i;
        break;
      }
    }
    d.first_divergence += static_cast<double>(first) / prompts.size();
    // Teacher-forced KL along the full-KV trajectory.
    PagedKvCache full_kv(mc);
    AttentionStats stats(mc, static_cast<int32_t>(prompt.size()), 16);
    std::vector<float> lf, lc;
    SequenceInput pre{&full_kv, prompt, static_cast<int64_t>(prompt.size()) - 1, &stats};
    if (!engine.Forward({&pre, 1}, &lf).ok()) std::abort();
    auto prefix = std::move(compressor->Compress(mc, full_kv, static_cast<int32_t>(prompt.size()), stats)).value();
    CompressedSequenceKv ckv(mc, prefix);
    lc = lf;  // the first token's logits come from the exact prefill on both sides
    for (int64_t i = 0; i < n; ++i) {
      if (i > 0) {
        const std::vector<double> p = Softmax(lf), q = Softmax(lc);
        double kl = 0;
        for (size_t t = 0; t < p.size(); ++t) {
          if (p[t] > 0) kl += p[t] * (std::log(p[t]) - std::log(std::max(q[t], 1e-300)));
        }
        kl_sum += kl;
        d.max_kl = std::max(d.max_kl, kl);
        ++kl_steps;
      }
      if (i + 1 == n) break;
      SequenceInput a{&full_kv, {&full[i], 1}, 0};
      SequenceInput b{&ckv, {&full[i], 1}, 0};
      if (!engine.Forward({&a, 1}, &lf).ok() || !engine.Forward({&b, 1}, &lc).ok()) std::abort();
    }
  }
  d.mean_kl = kl_steps > 0 ? kl_sum / kl_steps : 0;
  return d;
}

// The --drafters table for one target: rows are compressors, columns
// drafters, cells tokens per verify round at draft length x.
struct Drafter {
  std::string label;
  std::unique_ptr<Model> model;  // a separate draft model, or null
  std::unique_ptr<QuantizedWeights> weights;
  std::unique_ptr<Engine> engine;  // null: the target's f32 engine
  bool kv_refresh = true;          // off for a separate model anyway
};

int DrafterTable(const std::string& models_dir, const char* target_file, const char* draft_file,
                 const std::vector<int>& prompt_lengths, int x, int64_t new_tokens,
                 nlohmann::json* out, bool json) {
  auto model = Model::Load(models_dir + "/" + target_file);
  auto other = Model::Load(models_dir + "/" + draft_file);
  for (const auto* m : {&model, &other}) {
    if (!m->ok()) {
      std::fprintf(stderr, "vc_acceptance_bench: %s\n", std::string(m->status().message()).c_str());
      return 2;
    }
  }
  if (absl::Status s = CheckDraftVocabulary(**model, **other); !s.ok()) {
    std::fprintf(stderr, "vc_acceptance_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  auto engine = std::move(Engine::Create(**model, {})).value();
  std::vector<Drafter> drafters;
  drafters.push_back({"target f32", nullptr, nullptr, nullptr});
  // The target without refresh: what a separate draft model is limited to.
  drafters.push_back({"f32 no-refresh", nullptr, nullptr, nullptr, false});
  for (const auto format : {kernels::WeightFormat::kInt8, kernels::WeightFormat::kInt4}) {
    Drafter d;
    d.label = "target " + std::string(kernels::WeightFormatName(format));
    QuantizeOptions qo;
    qo.format = format;
    d.weights = std::move(QuantizedWeights::Create(**model, qo)).value();
    EngineOptions eo;
    eo.quantized = d.weights.get();
    d.engine = std::move(Engine::Create(**model, eo)).value();
    drafters.push_back(std::move(d));
  }
  Drafter sep;
  sep.label = draft_file;
  sep.model = std::move(other).value();
  sep.engine = std::move(Engine::Create(*sep.model, {})).value();
  drafters.push_back(std::move(sep));
  const auto prompts = Prompts(*engine, prompt_lengths);
  // Every drafter's output must be full-KV decoding's.
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) {
    DecodeOptions o;
    o.max_new_tokens = std::min<int64_t>(new_tokens, engine->config().max_seq_len - p.size());
    o.ignore_eos = true;
    expected.push_back(std::move(DecodeFull(*engine, p, o)).value().tokens);
  }
  if (!json) {
    std::printf("\n%s: %zu prompts of %d-%d tokens, %lld new tokens, greedy, x=%d\n", target_file,
                prompts.size(), prompt_lengths.front(), prompt_lengths.back(),
                static_cast<long long>(new_tokens), x);
    std::printf("%-22s", "compressor");
    for (const Drafter& d : drafters) std::printf(" %18s", d.label.c_str());
    std::printf("\n");
  }
  for (const Config& c : std::vector<Config>{{"int8", 0, 8}, {"kivi", 0, 4}, {"snapkv", 0.5, 0}}) {
    nlohmann::json row = {{"compressor", c.name}, {"ratio", c.ratio}, {"bits", c.bits}};
    if (!json) std::printf("%-22s", c.Label().c_str());
    for (const Drafter& d : drafters) {
      const Acceptance a = MeasureAcceptance(*engine, prompts, c, x, new_tokens, d.engine.get(),
                                             d.model ? &d.model->config() : nullptr, d.kv_refresh);
      if (a.outputs != expected) {
        std::fprintf(stderr,
                     "vc_acceptance_bench: %s drafting with %s (%s): output differs from "
                     "full-KV decoding\n",
                     target_file, d.label.c_str(), c.Label().c_str());
        return 1;
      }
      row["tokens_per_round"][d.label] = a.tokens_per_round;
      if (!json) std::printf(" %18.2f", a.tokens_per_round);
      std::fflush(stdout);
    }
    if (!json) std::printf("\n");
    (*out)[target_file].push_back(row);
  }
  return 0;
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) {
  using namespace vc;
  std::string models_dir = std::getenv("VC_MODELS_DIR") ? std::getenv("VC_MODELS_DIR") : "";
  bool quick = false, json = false, drafters = false;
  int drafter_x = 8;
  int64_t new_tokens = 100;
  FlagSet flags("vc_acceptance_bench",
                "Acceptance per compressor/ratio/draft length, and the lossy baseline's divergence.");
  flags.Add("--models-dir", &models_dir, "DIR", "directory with stories260K.bin and aidreams260K.bin");
  flags.Add("--new-tokens", &new_tokens, "N", "tokens generated per prompt");
  flags.AddBool("--quick", &quick, "fewer configurations (CI smoke)");
  flags.AddBool("--json", &json, "print one JSON object instead of tables");
  flags.AddBool("--drafters", &drafters,
                "instead: acceptance per compressor (int8, kivi-4, snapkv 0.5) x drafter (the "
                "target with f32/int8/int4 weights, KV refresh on; the other test model as "
                "--draft-model, its own KV, no refresh)");
  flags.Add("--draft-len", &drafter_x, "X", "draft length for --drafters");
  if (auto s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "vc_acceptance_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  struct ModelSpec {
    const char* file;
    std::vector<int> prompt_lengths;
    std::vector<int> draft_lengths;
  };
  const std::vector<ModelSpec> specs = {
      {"stories260K.bin", {200, 260, 330, 400}, quick ? std::vector<int>{32} : std::vector<int>{4, 16, 32}},
      {"aidreams260K.bin", {48, 56, 64, 72, 80}, quick ? std::vector<int>{16} : std::vector<int>{4, 16}},
  };
  nlohmann::json out;
  if (drafters) {
    if (int rc = DrafterTable(models_dir, "stories260K.bin", "aidreams260K.bin",
                              {200, 260, 330, 400}, drafter_x, new_tokens, &out, json);
        rc != 0) {
      return rc;
    }
    if (int rc = DrafterTable(models_dir, "aidreams260K.bin", "stories260K.bin",
                              {48, 56, 64, 72, 80}, drafter_x, new_tokens, &out, json);
        rc != 0) {
      return rc;
    }
    if (json) std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  for (const ModelSpec& spec : specs) {
    auto model = Model::Load(models_dir + "/" + spec.file);
    if (!model.ok()) {
      std::fprintf(stderr, "vc_acceptance_bench: %s\n", std::string(model.status().message()).c_str());
      return 2;
    }
    EngineOptions eo;
    auto engine = std::move(Engine::Create(**model, eo)).value();
    const auto prompts = Prompts(*engine, spec.prompt_lengths);
    if (!json) {
      std::printf("\n%s: %zu prompts of %d-%d tokens, %lld new tokens, greedy, KV refresh on\n",
                  spec.file, prompts.size(), spec.prompt_lengths.front(),
                  spec.prompt_lengths.back(), static_cast<long long>(new_tokens));
      std::printf("%-22s %8s", "compressor", "c");
      for (int x : spec.draft_lengths) std::printf("   tok/round x=%-3d", x);
      std::printf("   lossy: first-diverge  mean-KL    max-KL\n");
    }
    for (const Config& c : Configs(quick)) {
      nlohmann::json row = {{"compressor", c.name}, {"ratio", c.ratio}, {"bits", c.bits}};
      double achieved = 0;
      std::vector<double> per_x;
      for (int x : spec.draft_lengths) {
        const Acceptance a = MeasureAcceptance(*engine, prompts, c, x, new_tokens);
        achieved = a.ratio;
        per_x.push_back(a.tokens_per_round);
        row["tokens_per_round"][std::to_string(x)] = a.tokens_per_round;
      }
      const Divergence d = MeasureLossy(*engine, prompts, c, new_tokens);
      row["achieved_ratio"] = achieved;
      row["lossy_first_divergence"] = d.first_divergence;
      row["lossy_mean_kl"] = d.mean_kl;
      row["lossy_max_kl"] = d.max_kl;
      out[spec.file].push_back(row);
      if (!json) {
        std::printf("%-22s %8.4f", c.Label().c_str(), achieved);
        for (double v : per_x) std::printf("   %16.2f", v);
        std::printf("   %18.1f  %8.4f  %8.4f\n", d.first_divergence, d.mean_kl, d.max_kl);
        std::fflush(stdout);
      }
    }
  }
  if (json) std::printf("%s\n", out.dump().c_str());
  return 0;
}
