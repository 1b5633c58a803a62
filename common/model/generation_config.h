// generation_config.json: the generation defaults a Hugging Face checkpoint
// ships, of which VeriCache uses the end-of-sequence ids (a model may have
// several: generation stops at any of them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vc {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // "eos_token_id": an int or a list
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> pad_token_id;
};

// Reads `checkpoint_dir`/generation_config.json. NotFound when it is absent;
// InvalidArgument naming the key when a field has the wrong type or range.
[[nodiscard]] absl::StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& checkpoint_dir);

}  // namespace vc
