#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "common/decode/full_decode.h"
#include "common/engine/engine.h"
#include "common/model/model.h"
#include "common/tokenizer/tokenizer.h"
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
  int threads = 0;
  std::string simd = "auto";
  std::string backend = "cpu";
  bool json = false;
};

int BadInput(const std::string& msg) {
  std::fprintf(stderr, "vericache generate: %s\n", msg.c_str());
  return kExitBadInput;
}

// Status codes that mean "the input was wrong" map to exit 2.
int ExitFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "vericache generate: %s\n", std::string(s.message()).c_str());
  return ExitFor(s);
}

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

}  // namespace

int RunGenerate(int argc, char** argv) {
  GenerateFlags f;
  FlagSet flags("vericache generate",
                "Generate tokens with the exact full-KV engine (greedy by default).");
  flags.Add("--model", &f.model, "PATH", "llama2.c checkpoint file or Hugging Face directory (required)");
  flags.Add("--prompt-ids", &f.prompt_ids, "\"ID ID ...\"",
            "prompt as token ids, used exactly as given (no BOS added)");
  flags.Add("--prompt", &f.prompt, "TEXT", "prompt text (needs --tokenizer; BOS is added)");
  flags.Add("--tokenizer", &f.tokenizer, "PATH", "llama2.c tokenizer.bin for --prompt and text output");
  flags.Add("--max-new-tokens", &f.max_new_tokens, "N", "tokens to generate at most");
  flags.AddBool("--ignore-eos", &f.ignore_eos, "do not stop at EOS: exactly --max-new-tokens come out");
  flags.Add("--temperature", &f.temperature, "T", "0 = greedy; > 0 samples with keyed Gumbel noise");
  flags.Add("--top-k", &f.top_k, "K", "keep the K most likely tokens when sampling (0 = all)");
  flags.Add("--top-p", &f.top_p, "P", "nucleus filter when sampling (1 = off)");
  flags.Add("--seed", &f.seed, "S", "sampling seed; noise is keyed by (seed, position, token)");
  flags.Add("--threads", &f.threads, "N", "compute threads (0 = all cores); never changes results");
  flags.Add("--simd", &f.simd, "LEVEL", "scalar | avx2 | avx512 | auto; never changes results");
  flags.Add("--backend", &f.backend, "NAME", "kernel backend");
  flags.AddBool("--json", &f.json, "print one JSON object on stdout instead of text");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (f.model.empty()) return BadInput("--model is required");
  if (f.prompt_ids.empty() == f.prompt.empty()) {
    return BadInput("give exactly one of --prompt-ids or --prompt");
  }
  if (!f.prompt.empty() && f.tokenizer.empty()) return BadInput("--prompt needs --tokenizer");
  if (f.temperature == 0.0f &&
      (flags.was_set("--top-k") || flags.was_set("--top-p") || flags.was_set("--seed"))) {
    return BadInput("--top-k/--top-p/--seed need --temperature > 0");
  }

  auto model = Model::Load(f.model);
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& config = (*model)->config();

  std::optional<Tokenizer> tokenizer;
  if (!f.tokenizer.empty()) {
    auto tok = Tokenizer::Load(f.tokenizer, config.vocab_size);
    if (!tok.ok()) return Fail(tok.status());
    tokenizer = std::move(tok).value();
  }
  std::vector<int32_t> prompt;
  if (!f.prompt.empty()) {
    auto ids = tokenizer->Encode(f.prompt, /*add_bos=*/true);
    if (!ids.ok()) return Fail(ids.status());
    prompt = std::move(ids).value();
  } else {
    auto ids = ParseIds(f.prompt_ids);
    if (!ids.ok()) return Fail(ids.status());
    prompt = std::move(ids).value();
  }
  if (absl::Status s = ValidateRequest(config, prompt, f.max_new_tokens); !s.ok()) return Fail(s);

  DecodeOptions options;
  options.max_new_tokens = f.max_new_tokens;
  options.ignore_eos = f.ignore_eos;
  options.sampling = {f.temperature, f.top_k, f.top_p, f.seed};
  if (absl::Status s = options.sampling.Validate(); !s.ok()) return Fail(s);

  EngineOptions engine_options;
  engine_options.backend.name = f.backend;
  engine_options.backend.threads = f.threads;
  engine_options.backend.simd = f.simd;
  auto engine = Engine::Create(**model, engine_options);
  if (!engine.ok()) return Fail(engine.status());

  int32_t prev = prompt.back();
  if (!f.json) {
    if (tokenizer) {
      auto text = tokenizer->Decode(prompt);
      if (text.ok()) std::fputs(text->c_str(), stdout);
      options.on_token = [&](int32_t id) {
        auto piece = tokenizer->DecodePiece(prev, id);
        if (piece.ok()) std::fputs(piece->c_str(), stdout);
        std::fflush(stdout);
        prev = id;
      };
    } else {
      options.on_token = [](int32_t id) {
        std::printf("%d ", id);
        std::fflush(stdout);
      };
    }
  }
  auto result = DecodeFull(**engine, prompt, options);
  if (!result.ok()) return Fail(result.status());
  const double total = result->prefill_seconds + result->decode_seconds;
  const double tps = total > 0 ? result->tokens.size() / total : 0.0;
  const double decode_tps =
      result->decode_seconds > 0 ? (result->tokens.size() - 1) / result->decode_seconds : 0.0;
  if (f.json) {
    nlohmann::json j;
    j["mode"] = "full";
    j["prompt_tokens"] = prompt.size();
    j["tokens"] = result->tokens;
    j["tokens_per_s"] = tps;
    j["decode_tokens_per_s"] = decode_tps;
    j["prefill_seconds"] = result->prefill_seconds;
    j["decode_seconds"] = result->decode_seconds;
    j["stopped_at_eos"] = result->stopped_at_eos;
    j["backend"] = (*engine)->backend().name();
    j["threads"] = (*engine)->backend().threads();
    if (tokenizer) {
      auto text = tokenizer->Decode(result->tokens);
      if (text.ok()) j["text"] = *text;
    }
    std::cout << j.dump() << std::endl;
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr,
                 "[%zu prompt + %zu generated tokens; prefill %.3f s; %.1f tokens/s overall, "
                 "%.1f tokens/s decode; %s, %d threads]\n",
                 prompt.size(), result->tokens.size(), result->prefill_seconds, tps, decode_tps,
                 (*engine)->backend().name().c_str(), (*engine)->backend().threads());
  }
  return kExitOk;
}

}  // namespace vc::cli
