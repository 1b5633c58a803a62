#include "common/tokenizer/tokenizer_config.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace vc {
namespace {

using Json = nlohmann::json;

// A special token is a plain string or an AddedToken object {"content": ...}.
absl::Status ReadTokenString(const Json& j, const char* key, const std::string& path,
                             std::optional<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return absl::OkStatus();
  }
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) {
      *out = c->get<std::string>();
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": \"", key, "\" must be a string or an object with a string \"content\""));
}

absl::Status ReadBool(const Json& j, const char* key, const std::string& path, std::optional<bool>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return absl::InvalidArgumentError(absl::StrCat(path, ": \"", key, "\" must be a boolean"));
  *out = it->get<bool>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerConfig> LoadTokenizerConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open tokenizer config"));
  std::stringstream buf;
  buf << in.rdbuf();
  Json j = Json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  TokenizerConfig c;
  for (auto [key, field] : {std::pair{"bos_token", &c.bos_token}, std::pair{"eos_token", &c.eos_token},
                            std::pair{"pad_token", &c.pad_token}, std::pair{"unk_token", &c.unk_token}}) {
    if (auto s = ReadTokenString(j, key, path, field); !s.ok()) return s;
  }
  if (auto s = ReadBool(j, "add_bos_token", path, &c.add_bos_token); !s.ok()) return s;
  if (auto s = ReadBool(j, "add_eos_token", path, &c.add_eos_token); !s.ok()) return s;
  std::optional<bool> cleanup;
  if (auto s = ReadBool(j, "clean_up_tokenization_spaces", path, &cleanup); !s.ok()) return s;
  if (cleanup) c.clean_up_tokenization_spaces = *cleanup;
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // A list of named templates: the one called "default" is the chat template.
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": \"chat_template\" list entries must be {\"name\": ..., \"template\": ...}"));
        }
        if (entry["name"].get<std::string>() == "default") c.chat_template = entry["template"].get<std::string>();
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"chat_template\" must be a string or a list"));
    }
  }
  return c;
}

}  // namespace vc
