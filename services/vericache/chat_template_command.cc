// `vericache chat-template`: renders a conversation with a chat template and
// prints the prompt text exactly (no newline added), as a serving front end
// would before tokenizing it. The template comes from a file or from a
// tokenizer_config.json's "chat_template"; bos/eos strings from that file or
// flags.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer_config.h"
#include "nlohmann/json.hpp"
#include "services/vericache/commands.h"

namespace vc::cli {
namespace {

using Json = nlohmann::json;

// Template files, tokenizer configs and conversations are small; a larger
// file is a mistake, not input.
constexpr std::streamoff kMaxFileBytes = std::streamoff{64} << 20;

absl::StatusOr<std::string> ReadFileBounded(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", kMaxFileBytes, " bytes"));
  }
  f.seekg(0);
  std::string data(static_cast<size_t>(std::max<std::streamoff>(size, 0)), '\0');
  f.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (!f) return absl::InternalError(absl::StrCat(path, ": read failed"));
  return data;
}

struct TemplateSource {
  std::string source;
  std::string bos_token;
  std::string eos_token;
};

// The chat template and special-token strings of a tokenizer_config.json,
// read by the one parser of that file (LoadTokenizerConfig).
absl::StatusOr<TemplateSource> FromTokenizerConfig(const std::string& path) {
  absl::StatusOr<TokenizerConfig> config = LoadTokenizerConfig(path);
  if (!config.ok()) return config.status();
  if (!config->chat_template.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has no chat_template: this model has no chat format (give one with --template)"));
  }
  TemplateSource out;
  out.source = *config->chat_template;
  out.bos_token = config->bos_token.value_or("");
  out.eos_token = config->eos_token.value_or("");
  return out;
}

// [{"role": "...", "content": "..."}, ...]
absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const std::string& text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("--messages-json: not valid JSON");
  if (!j.is_array()) return absl::InvalidArgumentError("--messages-json: must be a JSON array of messages");
  std::vector<ChatMessage> out;
  for (size_t k = 0; k < j.size(); ++k) {
    const Json& m = j[k];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--messages-json: message ", k, " must be an object with string \"role\" and \"content\""));
    }
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

}  // namespace

int RunChatTemplate(int argc, char** argv) {
  const std::string cmd = "chat-template";
  std::string template_file, tokenizer_config, messages_json, messages_file, bos, eos;
  bool no_generation_prompt = false, json = false;
  FlagSet flags("vericache chat-template",
                "Render a conversation with a model's chat template (Jinja, as transformers\n"
                "renders it: trim_blocks and lstrip_blocks on) and print the prompt text exactly.");
  flags.Add("--template", &template_file, "FILE", "the Jinja chat template");
  flags.Add("--chat-template", &template_file, "FILE", "same as --template");
  flags.Add("--tokenizer-config", &tokenizer_config, "FILE",
            "tokenizer_config.json: its chat_template, bos_token and eos_token");
  flags.Add("--messages-json", &messages_json, "JSON",
            "the conversation: [{\"role\": \"user\", \"content\": \"...\"}, ...]");
  flags.Add("--messages-file", &messages_file, "FILE", "the conversation as a JSON file");
  flags.Add("--bos-token", &bos, "S", "bos_token for the template (overrides the config's)");
  flags.Add("--eos-token", &eos, "S", "eos_token for the template (overrides the config's)");
  flags.AddBool("--no-generation-prompt", &no_generation_prompt,
                "render with add_generation_prompt=false (default true)");
  flags.AddBool("--json", &json, "print {\"text\": ...} instead of the raw text");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (template_file.empty() == tokenizer_config.empty()) {
    return BadInput(cmd, "give exactly one of --template FILE or --tokenizer-config FILE");
  }
  if (messages_json.empty() == messages_file.empty()) {
    return BadInput(cmd, "give exactly one of --messages-json or --messages-file");
  }
  TemplateSource src;
  if (!template_file.empty()) {
    auto text = ReadFileBounded(template_file);
    if (!text.ok()) return Fail(cmd, text.status());
    src.source = *text;
  } else {
    auto from = FromTokenizerConfig(tokenizer_config);
    if (!from.ok()) return Fail(cmd, from.status());
    src = *from;
  }
  if (flags.was_set("--bos-token")) src.bos_token = bos;
  if (flags.was_set("--eos-token")) src.eos_token = eos;
  if (!messages_file.empty()) {
    auto text = ReadFileBounded(messages_file);
    if (!text.ok()) return Fail(cmd, text.status());
    messages_json = *text;
  }
  auto messages = ParseMessages(messages_json);
  if (!messages.ok()) return Fail(cmd, messages.status());
  auto tmpl = ChatTemplate::Parse(src.source);
  if (!tmpl.ok()) return Fail(cmd, tmpl.status());
  ChatTemplateInputs in;
  in.messages = std::move(messages).value();
  in.bos_token = src.bos_token;
  in.eos_token = src.eos_token;
  in.add_generation_prompt = !no_generation_prompt;
  auto text = (*tmpl)->Render(in);
  if (!text.ok()) return Fail(cmd, text.status());
  if (json) {
    std::cout << Json{{"text", *text}}.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  } else {
    std::fwrite(text->data(), 1, text->size(), stdout);
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace vc::cli
