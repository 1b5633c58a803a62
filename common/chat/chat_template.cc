#include "common/chat/chat_template.h"

#include <utility>

#include "common/chat/internal/jinja_ast.h"
#include "common/chat/internal/jinja_interp.h"
#include "common/chat/internal/jinja_value.h"

namespace vc {
namespace {

class JinjaChatTemplate final : public ChatTemplate {
 public:
  JinjaChatTemplate(jinja::Body body, const ChatTemplateLimits& limits)
      : body_(std::move(body)) {
    limits_.max_output_bytes = limits.max_output_bytes;
    limits_.max_work_bytes = limits.max_work_bytes;
    limits_.max_loop_iterations = limits.max_loop_iterations;
    limits_.max_call_depth = limits.max_call_depth;
  }

  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const override {
    jinja::ValueList messages;
    messages.reserve(inputs.messages.size());
    for (const ChatMessage& m : inputs.messages) {
      jinja::ValueDict d;
      d.Set("role", jinja::Value::Str(m.role));
      d.Set("content", jinja::Value::Str(m.content));
      messages.push_back(jinja::Value::Dict(std::move(d)));
    }
    std::vector<std::pair<std::string, jinja::Value>> globals = {
        {"messages", jinja::Value::List(std::move(messages))},
        {"bos_token", jinja::Value::Str(inputs.bos_token)},
        {"eos_token", jinja::Value::Str(inputs.eos_token)},
        {"add_generation_prompt", jinja::Value::Bool(inputs.add_generation_prompt)},
    };
    return jinja::Render(body_, globals, limits_);
  }

 private:
  jinja::Body body_;
  jinja::RenderLimits limits_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(std::string_view source) {
  return Parse(source, ChatTemplateLimits{});
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(std::string_view source,
                                                                  const ChatTemplateLimits& limits) {
  auto body = jinja::ParseTemplate(source);
  if (!body.ok()) return body.status();
  return std::unique_ptr<ChatTemplate>(new JinjaChatTemplate(std::move(body).value(), limits));
}

}  // namespace vc
