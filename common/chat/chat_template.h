// Chat templates: renders the Jinja template a Hugging Face checkpoint ships
// (tokenizer_config.json's chat_template, or a --chat-template file) over a
// conversation, producing the prompt text the model was trained on. A Jinja
// subset sufficient for real models' templates: for/if/set, namespaces,
// filters (trim, tojson, length, ...), string methods, raise_exception.
// Rendered with trim_blocks and lstrip_blocks on; template text is emitted
// byte for byte. The template is parsed once and rendered many times.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace vc {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;
};

struct ChatTemplateInputs {
  std::vector<ChatMessage> messages;
  std::string bos_token;  // tokenizer_config.json's strings ("" when absent)
  std::string eos_token;
  bool add_generation_prompt = true;
};

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument with the line and what was expected on a
  // syntax error or a construct outside the supported subset.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(std::string_view source);
  virtual ~ChatTemplate() = default;

  // Renders the template. raise_exception(msg) in the template becomes
  // InvalidArgument(msg); runaway loops or output are bounded (ResourceExhausted).
  [[nodiscard]] virtual absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const = 0;
};

}  // namespace vc
