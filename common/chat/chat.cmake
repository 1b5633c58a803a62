# Chat templates (common/chat): a Jinja subset for Hugging Face chat_template.
add_library(vc_chat
  chat/chat_template.cc
  chat/internal/jinja_interp.cc
  chat/internal/jinja_parser.cc
  chat/internal/jinja_text.cc
  chat/internal/jinja_value.cc
)
target_link_libraries(vc_chat PUBLIC vc_base absl::status absl::statusor absl::strings
                      nlohmann_json::nlohmann_json)
