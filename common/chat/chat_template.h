// Chat templates: renders the Jinja template a Hugging Face checkpoint ships
// (tokenizer_config.json's chat_template, or a --chat-template file) over a
// conversation, producing the prompt text the model was trained on. A Jinja
// subset sufficient for real models' templates: for/if/set, namespaces,
// filters (trim, tojson, length, ...), string methods, raise_exception.
// Rendered with trim_blocks and lstrip_blocks on; template text is emitted
// byte for byte. The template is parsed once and rendered many times.
#pragma once

#include <cstddef>
#include <cstdint>
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

// Bounds on one render, so that a hostile or broken template cannot run away
// (exceeding one gives ResourceExhausted).
struct ChatTemplateLimits {
  size_t max_output_bytes = size_t{16} << 20;  // the rendered prompt
  // Bytes of strings built along the way (concatenations, filters), which
  // bounds e.g. a loop that keeps growing a string.
  size_t max_work_bytes = size_t{256} << 20;
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together
  int max_call_depth = 64;                  // nested macro calls
};

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument with the line and what was expected on a
  // syntax error or a construct outside the supported subset.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(std::string_view source);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(
      std::string_view source, const ChatTemplateLimits& limits);
  virtual ~ChatTemplate() = default;

  // Renders the template. raise_exception(msg) in the template becomes
  // InvalidArgument(msg); runaway loops or output are bounded (ResourceExhausted).
  [[nodiscard]] virtual absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const = 0;
};

}  // namespace vc
