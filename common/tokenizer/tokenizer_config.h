// tokenizer_config.json: the special-token strings, BOS/EOS policy, decode
// clean-up and chat template that a Hugging Face checkpoint ships next to its
// tokenizer.json. Every field is optional in the file; absent fields keep the
// defaults below (the reference libraries' defaults).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace vc {

struct TokenizerConfig {
  // Special-token strings (a plain string or an AddedToken object's
  // "content" in the file).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // Decoding removes the space before punctuation and contractions when on;
  // on when the file or key is absent.
  bool clean_up_tokenization_spaces = true;
  // The Jinja chat template (the "default" entry when the file has a list).
  std::optional<std::string> chat_template;
};

// Parses tokenizer_config.json at `path`. NotFound when the file is missing,
// InvalidArgument naming the key when a field has the wrong type.
[[nodiscard]] absl::StatusOr<TokenizerConfig> LoadTokenizerConfig(const std::string& path);

}  // namespace vc
