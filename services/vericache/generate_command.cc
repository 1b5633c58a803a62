#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "common/engine/engine.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "common/speculative/draft_verify.h"
#include <filesystem>

#include "common/tokenizer/text_tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/vericache/commands.h"

namespace vc::cli {
namespace {

struct GenerateFlags {
  std::string model;
  std::string prompt_ids;
  std::string prompt;
  std::string tokenizer;
  int64_t max_new_tokens = 64;
  bool ignore_eos = false;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::string sampling;  // "" = greedy, or seeded when --temperature > 0
  std::string mode = "full";
  std::string compressor;  // "" = int8 for vericache/lossy
  double ratio = 0.0;
  int bits = 0;
  std::string draft_len = "8";
  int max_draft_len = 64;
  std::string draft_weights = "f32";
  std::string draft_model;
  bool no_kv_refresh = false;
  bool online_update = false;
  int threads = 0;
  int tensor_parallel = 1;
  std::string simd = "auto";
  std::string backend = "cpu";
  bool json = false;
  CompressorOptions compressor_defaults;
};

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError("--prompt-ids: '" + std::string(piece) +
                                        "' is not an integer token id");
    }
    ids.push_back(id);
  }
  return ids;
}

// Maps the flags onto the request options; InvalidArgument for bad
// combinations.
absl::StatusOr<RequestOptions> BuildRequestOptions(const GenerateFlags& f, const FlagSet& flags) {
  RequestOptions o;
  auto mode = ParseDecodeMode(f.mode);
  if (!mode.ok()) return mode.status();
  o.mode = *mode;
  o.max_new_tokens = f.max_new_tokens;
  o.ignore_eos = f.ignore_eos;
  o.sampling = {f.temperature, f.top_k, f.top_p, f.seed};
  if (f.temperature < 0) {
    return absl::InvalidArgumentError("--temperature must be >= 0, got " +
                                      std::to_string(f.temperature));
  }
  std::string sampling = f.sampling.empty() ? (f.temperature > 0 ? "seeded" : "greedy") : f.sampling;
  auto sampling_mode = ParseSamplingMode(sampling);
  if (!sampling_mode.ok()) return sampling_mode.status();
  o.sampling_mode = *sampling_mode;
  if (o.sampling_mode == SamplingMode::kGreedy &&
      (f.temperature > 0 || flags.was_set("--top-k") || flags.was_set("--top-p") ||
       flags.was_set("--seed"))) {
    return absl::InvalidArgumentError(
        "--temperature/--top-k/--top-p/--seed need --sampling seeded or rejection "
        "(or --temperature > 0)");
  }
  if (o.sampling_mode != SamplingMode::kGreedy && !(f.temperature > 0)) {
    return absl::InvalidArgumentError("--sampling " + sampling + " needs --temperature > 0");
  }
  if (o.mode == DecodeMode::kFull) {
    for (const char* flag :
         {"--compressor", "--ratio", "--bits", "--draft-len", "--no-kv-refresh", "--online-update"}) {
      if (flags.was_set(flag)) {
        return absl::InvalidArgumentError(std::string(flag) +
                                          " applies to --mode vericache or lossy, not full");
      }
    }
    return o;
  }
  o.compressor = f.compressor_defaults;
  // A separate draft model without --compressor drafts from its exact KV
  // (name ""); otherwise the default is int8.
  o.compressor.name = !f.compressor.empty() ? f.compressor : f.draft_model.empty() ? "int8" : "";
  if (o.compressor.name.empty()) {
    for (const char* flag : {"--ratio", "--bits", "--online-update"}) {
      if (flags.was_set(flag)) {
        return absl::InvalidArgumentError(std::string(flag) +
                                          " needs --compressor (with --draft-model and no "
                                          "--compressor the drafter keeps its exact KV)");
      }
    }
  }
  o.compressor.ratio = f.ratio;
  o.compressor.bits = f.bits;
  if (flags.was_set("--ratio") && !(f.ratio > 0.0 && f.ratio <= 1.0)) {
    return absl::InvalidArgumentError("--ratio must be in (0, 1], got " + std::to_string(f.ratio));
  }
  if (f.draft_len == "auto") {
    o.draft.adaptive = true;
    o.draft.draft_len = 8;
  } else {
    int x;
    if (!absl::SimpleAtoi(f.draft_len, &x)) {
      return absl::InvalidArgumentError("--draft-len must be an integer >= 1 or 'auto', got '" +
                                        f.draft_len + "'");
    }
    o.draft.draft_len = x;
  }
  o.draft.max_draft_len = f.max_draft_len;
  // A separate draft model keeps KV of its own: nothing to refresh.
  o.draft.kv_refresh = !f.no_kv_refresh && f.draft_model.empty();
  if (absl::Status s = o.draft.Validate(); !s.ok()) return s;
  o.online_update = f.online_update;
  return o;
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  GenerateFlags f;
  FlagSet flags("vericache generate",
                "Generate tokens: exact full-KV decoding, lossless VeriCache (draft on compressed\n"
                "KV, verify on full KV), or the lossy compressed-KV baseline.");
  flags.Add("--model", &f.model, "PATH", "llama2.c checkpoint file or Hugging Face directory (required)");
  flags.Add("--prompt-ids", &f.prompt_ids, "\"ID ID ...\"",
            "prompt as token ids, used exactly as given (no BOS added)");
  flags.Add("--prompt", &f.prompt, "TEXT",
            "prompt text, encoded with the tokenizer's special tokens (e.g. BOS)");
  flags.Add("--tokenizer", &f.tokenizer, "PATH",
            "tokenizer.json or llama2.c tokenizer.bin for --prompt and text output (default: the "
            "tokenizer.json of a checkpoint directory --model)");
  flags.Add("--max-new-tokens", &f.max_new_tokens, "N", "tokens to generate at most");
  flags.AddBool("--ignore-eos", &f.ignore_eos, "do not stop at EOS: exactly --max-new-tokens come out");
  flags.Add("--mode", &f.mode, "MODE",
            "full | vericache | lossy (lossy = compressed KV without verification: a baseline, "
            "not lossless)");
  flags.Add("--compressor", &f.compressor, "NAME",
            "KV compressor for vericache/lossy (default int8; see 'vericache compressors')");
  flags.Add("--ratio", &f.ratio, "C", "token-dropping compression ratio c in (0, 1]");
  flags.Add("--bits", &f.bits, "B", "quantiser bits (2, 4 or 8)");
  flags.Add("--draft-len", &f.draft_len, "X|auto", "drafts per verify round, or auto (adaptive)");
  flags.Add("--max-draft-len", &f.max_draft_len, "N", "upper bound for --draft-len auto");
  flags.Add("--draft-weights", &f.draft_weights, "FORMAT",
            "f32 | int8 | int4: the drafter runs a copy of the model with weights quantised at "
            "load (int8 per output row, int4 in groups of 32 inputs; docs/numerics.md); "
            "verification always uses the f32 model, so the output is unchanged");
  flags.Add("--draft-model", &f.draft_model, "PATH",
            "vericache: draft with another model of the same vocabulary (llama2.c file: equal "
            "vocab_size; Hugging Face directory: identical tokenizer.json). It prefills the "
            "prompt itself, its KV compressed by --compressor if given (else kept exact); no KV "
            "refresh; --draft-weights applies to it. Verification still runs --model on full "
            "KV: the output is unchanged");
  flags.AddBool("--no-kv-refresh", &f.no_kv_refresh,
                "do not send the exact K/V of accepted tokens back to the drafter");
  flags.AddBool("--online-update", &f.online_update,
                "vericache/lossy: fold accepted tokens into the drafter's compressed KV by the "
                "compressor's online rule (see 'vericache compressors'), so its view stays near "
                "the budget instead of keeping every generated token exact");
  flags.Add("--window", &f.compressor_defaults.window, "N", "SnapKV/PyramidKV observation window");
  flags.Add("--sink-tokens", &f.compressor_defaults.sink_tokens, "N", "StreamingLLM attention sinks");
  flags.Add("--quant-group", &f.compressor_defaults.quant_group, "N", "KIVI group size");
  flags.Add("--residual", &f.compressor_defaults.residual, "N",
            "KIVI recent tokens kept in full precision");
  flags.Add("--sampling", &f.sampling, "MODE",
            "greedy | seeded | rejection (default: greedy, or seeded with --temperature > 0)");
  flags.Add("--temperature", &f.temperature, "T", "sampling temperature (> 0 for seeded/rejection)");
  flags.Add("--top-k", &f.top_k, "K", "keep the K most likely tokens when sampling (0 = all)");
  flags.Add("--top-p", &f.top_p, "P", "nucleus filter when sampling (1 = off)");
  flags.Add("--seed", &f.seed, "S", "sampling seed; noise is keyed by (seed, position, token)");
  flags.Add("--threads", &f.threads, "N", "compute threads (0 = all cores); never changes results");
  flags.Add("--tensor-parallel", &f.tensor_parallel, "N",
            "tensor-parallel degree (ranks as threads); must divide the model's reduction block "
            "count and n_kv_heads; never changes results");
  flags.Add("--simd", &f.simd, "LEVEL", "scalar | avx2 | avx512 | auto; never changes results");
  flags.Add("--backend", &f.backend, "NAME", "kernel backend");
  flags.AddBool("--json", &f.json, "print one JSON object on stdout instead of text");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail("generate", s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (f.model.empty()) return BadInput("generate", "--model is required");
  if (f.prompt_ids.empty() == f.prompt.empty()) {
    return BadInput("generate", "give exactly one of --prompt-ids or --prompt");
  }
  if (f.tokenizer.empty()) {
    // A Hugging Face checkpoint directory carries its tokenizer.
    std::error_code ec;
    if (std::filesystem::is_directory(f.model, ec) &&
        std::filesystem::exists(std::filesystem::path(f.model) / "tokenizer.json", ec)) {
      f.tokenizer = f.model;
    }
  }
  if (!f.prompt.empty() && f.tokenizer.empty()) {
    return BadInput("generate", "--prompt needs --tokenizer (or a --model directory with a tokenizer.json)");
  }
  auto request_options = BuildRequestOptions(f, flags);
  if (!request_options.ok()) return Fail("generate", request_options.status());
  auto draft_weights = kernels::ParseWeightFormat(f.draft_weights);
  if (!draft_weights.ok()) return Fail("generate", draft_weights.status());
  if (*draft_weights != kernels::WeightFormat::kF32 &&
      request_options->mode != DecodeMode::kVeriCache) {
    return BadInput("generate", "--draft-weights int8/int4 applies to --mode vericache");
  }
  if (!f.draft_model.empty() && request_options->mode != DecodeMode::kVeriCache) {
    return BadInput("generate", "--draft-model applies to --mode vericache");
  }
  if (request_options->mode != DecodeMode::kFull && !request_options->compressor.name.empty()) {
    // Validate the compressor before the (possibly large) model loads.
    auto c = CreateCompressor(request_options->compressor);
    if (!c.ok()) return Fail("generate", c.status());
    if (request_options->online_update &&
        (*c)->online_policy().kind == OnlinePolicy::Kind::kNone) {
      return BadInput("generate", "--online-update: " + (*c)->info().name +
                                      " has no online rule (it compresses once after prefill); "
                                      "see 'vericache compressors'");
    }
  }

  auto model = Model::Load(f.model);
  if (!model.ok()) return Fail("generate", model.status());
  const ModelConfig& config = (*model)->config();

  std::unique_ptr<TextTokenizer> tokenizer;
  if (!f.tokenizer.empty()) {
    TextTokenizerOptions tok_options;
    tok_options.llama2c_vocab_size = config.vocab_size;
    auto tok = LoadTextTokenizer(f.tokenizer, tok_options);
    if (!tok.ok()) return Fail("generate", tok.status());
    tokenizer = std::move(tok).value();
    if (tokenizer->vocab_size() > config.vocab_size) {
      return BadInput("generate", "--tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                                      " ids but the model only " + std::to_string(config.vocab_size));
    }
  }
  std::vector<int32_t> prompt;
  if (!f.prompt.empty()) {
    auto ids = tokenizer->Encode(f.prompt, /*add_special_tokens=*/true);
    if (!ids.ok()) return Fail("generate", ids.status());
    prompt = std::move(ids).value();
  } else {
    auto ids = ParseIds(f.prompt_ids);
    if (!ids.ok()) return Fail("generate", ids.status());
    prompt = std::move(ids).value();
  }

  EngineOptions engine_options;
  engine_options.backend.name = f.backend;
  engine_options.backend.threads = f.threads;
  engine_options.backend.simd = f.simd;
  engine_options.tensor_parallel = f.tensor_parallel;
  auto engine = Engine::Create(**model, engine_options);
  if (!engine.ok()) return Fail("generate", engine.status());
  // The drafter's model: --draft-model, or the target itself.
  std::unique_ptr<Model> draft_model;
  if (!f.draft_model.empty()) {
    auto dm = Model::Load(f.draft_model);
    if (!dm.ok()) {
      return Fail("generate", absl::Status(dm.status().code(),
                                           "--draft-model: " + std::string(dm.status().message())));
    }
    if (absl::Status s = CheckDraftVocabulary(**model, **dm); !s.ok()) return Fail("generate", s);
    draft_model = std::move(dm).value();
    request_options->draft_model = &draft_model->config();
  }
  const Model& drafter_model = draft_model ? *draft_model : **model;
  // The drafter's engine: over a weight-quantised copy (made here, at load)
  // and/or over the separate draft model.
  std::unique_ptr<QuantizedWeights> quantized;
  std::unique_ptr<Engine> draft_engine;
  if (*draft_weights != kernels::WeightFormat::kF32 || draft_model) {
    EngineOptions draft_options = engine_options;
    if (*draft_weights != kernels::WeightFormat::kF32) {
      QuantizeOptions qo;
      qo.format = *draft_weights;
      auto q = QuantizedWeights::Create(drafter_model, qo);
      if (!q.ok()) return Fail("generate", q.status());
      quantized = std::move(q).value();
      draft_options.quantized = quantized.get();
    }
    auto de = Engine::Create(drafter_model, draft_options);
    if (!de.ok() && draft_model) {
      return Fail("generate", absl::Status(de.status().code(),
                                           "--draft-model: " + std::string(de.status().message())));
    }
    if (!de.ok()) return Fail("generate", de.status());
    draft_engine = std::move(de).value();
  }

  auto request = SpeculativeRequest::Create(**engine, prompt, *request_options);
  if (!request.ok()) return Fail("generate", request.status());
  std::vector<std::unique_ptr<SpeculativeRequest>> batch;
  batch.push_back(std::move(request).value());
  SpeculativeRequest& r = *batch[0];

  // Stream tokens as they are accepted (text mode only).
  // The prompt goes through the detokenizer first, so the output's text is
  // decoded in its context (word-initial spaces, multi-byte characters).
  size_t printed = 0;
  std::optional<IncrementalDetokenizer> detok;
  std::function<void()> print;
  if (!f.json) {
    if (tokenizer) {
      detok.emplace(*tokenizer, /*skip_special_tokens=*/true);
      for (int32_t id : prompt) {
        if (auto piece = detok->Push(id); piece.ok()) std::fputs(piece->c_str(), stdout);
      }
    }
    print = [&] {
      for (; printed < r.output().size(); ++printed) {
        const int32_t id = r.output()[printed];
        if (detok) {
          if (auto piece = detok->Push(id); piece.ok()) std::fputs(piece->c_str(), stdout);
        } else {
          std::printf("%d ", id);
        }
      }
      std::fflush(stdout);
    };
  }
  // Decode time starts where the prompt's prefill pass ends
  // (RequestStats::prefill_pass_end), in every mode alike.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  auto run = RunBatch(**engine, draft_engine.get(), batch, print);
  const Clock::time_point end = Clock::now();
  if (!run.ok()) return Fail("generate", run.status());
  const RequestStats& st = r.stats();
  const double total = run->seconds;
  const double tps = total > 0 ? r.output().size() / total : 0.0;
  const double prefill_seconds =
      std::max(0.0, std::chrono::duration<double>(st.prefill_pass_end - start).count());
  const double decode_seconds =
      std::max(0.0, std::chrono::duration<double>(end - st.prefill_pass_end).count());
  const double decode_tps = decode_seconds > 0 ? r.output().size() / decode_seconds : 0.0;
  const bool speculative = request_options->mode == DecodeMode::kVeriCache;
  const double mean_accept =
      st.accept_lengths.empty()
          ? 0.0
          : std::accumulate(st.accept_lengths.begin(), st.accept_lengths.end(), 0.0) /
                st.accept_lengths.size();
  if (f.json) {
    nlohmann::json j;
    j["mode"] = DecodeModeName(request_options->mode);
    j["prompt_tokens"] = prompt.size();
    j["tokens"] = r.output();
    j["tokens_per_s"] = tps;
    j["seconds"] = total;
    j["prefill_seconds"] = prefill_seconds;
    j["decode_seconds"] = decode_seconds;
    j["decode_tokens_per_s"] = decode_tps;
    j["mean_accepted"] = mean_accept;
    j["draft_weights"] = std::string(kernels::WeightFormatName(*draft_weights));
    // The separate draft model's path; null when the target drafts.
    j["draft_model"] = draft_model ? nlohmann::json(f.draft_model) : nlohmann::json(nullptr);
    j["stopped_at_eos"] = r.stopped_at_eos();
    j["backend"] = (*engine)->backend().name();
    j["threads"] = (*engine)->backend().threads();
    if (request_options->mode != DecodeMode::kFull) {
      j["compressor"] = st.compressor;
      j["compression_ratio"] = st.compression_ratio;
      j["kv_bytes"] = {{"full", static_cast<int64_t>(prompt.size()) * config.kv_bytes_per_token()},
                       {"compressed", st.compressed_kv_bytes}};
      j["online_update"] = st.online_update;
      j["online_folds"] = st.online_folds;
      j["drafter_kv_bytes_peak"] = st.drafter_kv_bytes_peak;
      j["drafter_kv_bytes_final"] = st.drafter_kv_bytes_final;
    }
    if (request_options->mode == DecodeMode::kLossy) j["lossy"] = true;
    if (speculative) {
      j["accept_lengths"] = st.accept_lengths;
      j["draft_lengths"] = st.draft_lengths;
      j["verify_rounds"] = st.verify_rounds;
      j["fallbacks"] = st.fallbacks;
      j["drafted_tokens"] = st.drafted_tokens;
      j["wasted_drafts"] = st.wasted_drafts;
      j["drafter_full_kv_bytes_read"] = st.drafter_full_kv_bytes_read;
      j["kv_refresh"] = request_options->draft.kv_refresh;
    }
    if (tokenizer) {
      if (auto text = tokenizer->Decode(r.output(), /*skip_special_tokens=*/true); text.ok()) j["text"] = *text;
    }
    std::cout << j.dump() << std::endl;
  } else {
    if (detok) {
      if (auto rest = detok->Finish(); rest.ok()) std::fputs(rest->c_str(), stdout);
    }
    std::printf("\n");
    std::fflush(stdout);
    std::string extra;
    if (request_options->mode != DecodeMode::kFull) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "; %s c=%.4f", st.compressor.c_str(), st.compression_ratio);
      extra += buf;
      if (st.online_update) {
        std::snprintf(buf, sizeof buf, ", online update (%lld folds, drafter KV peak %lld bytes)",
                      static_cast<long long>(st.online_folds),
                      static_cast<long long>(st.drafter_kv_bytes_peak));
        extra += buf;
      }
    }
    if (speculative) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "; %lld verify rounds, %.2f accepted drafts/round, %lld fallbacks",
                    static_cast<long long>(st.verify_rounds), mean_accept,
                    static_cast<long long>(st.fallbacks));
      extra += buf;
      if (draft_model) extra += "; draft model " + f.draft_model;
    }
    if (request_options->mode == DecodeMode::kLossy) extra += "; LOSSY (unverified)";
    std::fprintf(stderr, "[%s: %zu prompt + %zu generated tokens, %.1f tokens/s%s; %s, %d threads]\n",
                 DecodeModeName(request_options->mode), prompt.size(), r.output().size(), tps,
                 extra.c_str(), (*engine)->backend().name().c_str(),
                 (*engine)->backend().threads());
  }
  return kExitOk;
}

}  // namespace vc::cli
