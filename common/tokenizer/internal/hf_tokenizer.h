// A TextTokenizer over a Hugging Face tokenizer.json: added tokens are split
// out of the input first (raw, then again after normalisation for the
// "normalized" ones), the rest goes normaliser -> pre-tokenizer -> model, and
// the post-processor adds the template's special tokens. Decoding maps ids to
// their strings, runs the decoder chain and applies tokenizer_config.json's
// clean_up_tokenization_spaces.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/text_tokenizer.h"

namespace vc::tokenizer_internal {

// Parses tokenizer.json text; `name` is used in error messages.
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadHfTokenizerFromString(const std::string& json_text,
                                                                          const std::string& name,
                                                                          TokenizerConfig config);

// transformers' clean_up_tokenization (spaces before punctuation and
// contractions).
std::string CleanUpTokenizationSpaces(std::string text);

// The normaliser alone (tests compare it with the reference's); `text` is
// normalised as one section. Fails for a tokenizer that is not tokenizer.json.
absl::StatusOr<std::string> NormalizeForTest(const TextTokenizer& tokenizer, const std::string& text);

}  // namespace vc::tokenizer_internal
