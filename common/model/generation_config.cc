#include "common/model/generation_config.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/internal/json_file.h"
#include "common/model/model.h"

namespace vc {
namespace {

using Json = nlohmann::json;
using model_internal::DumpShort;

// generation_config.json holds a few dozen scalars; a megabyte is no longer one.
constexpr size_t kMaxFileBytes = size_t{1} << 20;

absl::Status FieldError(const std::string& path, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": field '", key, "' ", what));
}

// A token id: an integer in [0, 2^31). Whether it is inside the vocabulary is
// for the caller, which knows the vocabulary.
absl::StatusOr<int32_t> TokenId(const std::string& path, const std::string& key, const Json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return static_cast<int32_t>(v);
    }
  } else if (!j.is_number_integer()) {
    return FieldError(path, key, absl::StrCat("must be an integer token id, found ", DumpShort(j)));
  }
  return FieldError(path, key,
                    absl::StrCat("must be a token id in [0, 2^31), found ", DumpShort(j)));
}

// An optional single id; null counts as absent, as in transformers.
absl::StatusOr<std::optional<int32_t>> OptionalId(const std::string& path, const Json& root,
                                                  const char* key) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return std::optional<int32_t>();
  VC_ASSIGN_OR_RETURN(int32_t id, TokenId(path, key, *it));
  return std::optional<int32_t>(id);
}

}  // namespace

absl::StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& checkpoint_dir) {
  const std::string path = model_internal::JoinPath(checkpoint_dir, "generation_config.json");
  VC_ASSIGN_OR_RETURN(Json root, model_internal::ReadJsonFile(path, kMaxFileBytes));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  GenerationConfig out;
  // eos_token_id: an int, or a list of them (Llama 3 stops at both
  // <|end_of_text|> and <|eot_id|>); null or absent: none given here.
  if (auto it = root.find("eos_token_id"); it != root.end() && !it->is_null()) {
    if (it->is_array()) {
      if (it->empty()) return FieldError(path, "eos_token_id", "is an empty list");
      if (it->size() > ModelConfig::kMaxEosIds) {
        return FieldError(path, "eos_token_id",
                          absl::StrCat("lists ", it->size(), " ids (at most ",
                                       ModelConfig::kMaxEosIds, ")"));
      }
      for (size_t i = 0; i < it->size(); ++i) {
        VC_ASSIGN_OR_RETURN(int32_t id,
                            TokenId(path, absl::StrCat("eos_token_id[", i, "]"), (*it)[i]));
        out.eos_token_ids.push_back(id);
      }
    } else {
      VC_ASSIGN_OR_RETURN(int32_t id, TokenId(path, "eos_token_id", *it));
      out.eos_token_ids.push_back(id);
    }
  }
  VC_ASSIGN_OR_RETURN(out.bos_token_id, OptionalId(path, root, "bos_token_id"));
  VC_ASSIGN_OR_RETURN(out.pad_token_id, OptionalId(path, root, "pad_token_id"));
  return out;
}

}  // namespace vc
