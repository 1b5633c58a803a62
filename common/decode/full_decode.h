// Plain full-KV autoregressive decoding of one request: prefill the prompt,
// then one token per step. This is the baseline every other mode must match
// token for token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/sampling/sampler.h"

namespace vc {

struct DecodeOptions {
  int64_t max_new_tokens = 64;
  bool ignore_eos = false;  // true: exactly max_new_tokens come out
  SamplingParams sampling;
  // Called with each generated token as soon as it is known (may be empty).
  std::function<void(int32_t)> on_token;
};

struct DecodeResult {
  std::vector<int32_t> tokens;  // generated ids only
  bool stopped_at_eos = false;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // from the first to the last generated token
};

// InvalidArgument if the prompt is empty, holds ids outside the vocabulary, or
// prompt + max_new_tokens exceeds the model's context.
absl::StatusOr<DecodeResult> DecodeFull(Engine& engine, std::span<const int32_t> prompt,
                                        const DecodeOptions& options);

// The checks DecodeFull makes before running, shared with the CLI.
absl::Status ValidateRequest(const ModelConfig& config, std::span<const int32_t> prompt,
                             int64_t max_new_tokens);

}  // namespace vc
