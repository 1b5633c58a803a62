#include "common/decode/full_decode.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace vc {

absl::Status ValidateRequest(const ModelConfig& config, std::span<const int32_t> prompt,
                             int64_t max_new_tokens) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " = ", prompt[i],
                                                     " is outside the vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  if (max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max-new-tokens must be >= 1, got ", max_new_tokens));
  }
  const int64_t ctx = config.max_seq_len;
  if (static_cast<int64_t>(prompt.size()) > ctx) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", prompt.size(),
                                                   " tokens is longer than the model's context of ",
                                                   ctx));
  }
  if (static_cast<int64_t>(prompt.size()) + max_new_tokens > ctx) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", prompt.size(), " tokens) + max-new-tokens (", max_new_tokens,
        ") exceeds the model's context of ", ctx, "; at most ",
        ctx - static_cast<int64_t>(prompt.size()), " new tokens fit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DecodeResult> DecodeFull(Engine& engine, std::span<const int32_t> prompt,
                                        const DecodeOptions& options) {
  const ModelConfig& c = engine.config();
  VC_RETURN_IF_ERROR(ValidateRequest(c, prompt, options.max_new_tokens));
  VC_RETURN_IF_ERROR(options.sampling.Validate());
  using Clock = std::chrono::steady_clock;
  PagedKvCache kv(c);
  DecodeResult result;
  std::vector<float> logits;
  const auto t0 = Clock::now();
  SequenceInput in{&kv, prompt, static_cast<int64_t>(prompt.size()) - 1};
  VC_RETURN_IF_ERROR(engine.Forward({&in, 1}, &logits));
  const auto t1 = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int64_t pos = kv.next_position();  // position of the token being chosen
    const int32_t token = SampleToken(logits, options.sampling, pos);
    result.tokens.push_back(token);
    if (options.on_token) options.on_token(token);
    if (c.IsEos(token) && !options.ignore_eos) {
      result.stopped_at_eos = true;
      break;
    }
    if (i + 1 == options.max_new_tokens) break;
    SequenceInput step{&kv, {&result.tokens.back(), 1}, 0};
    VC_RETURN_IF_ERROR(engine.Forward({&step, 1}, &logits));
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return result;
}

}  // namespace vc
