#include "services/openai/openai_protocol.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vc::openai {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("'", field, "' ", what));
}

// Field readers: absent or null keeps the default; a value of the wrong
// type is an error naming the field (nlohmann's get<> would throw).
absl::Status ReadString(const Json& body, const char* key, std::string* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return Bad(key, "must be a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& body, const char* key, bool* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Bad(key, "must be a boolean");
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadNumber(const Json& body, const char* key, double lo, double hi,
                        std::optional<double>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Bad(key, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", it->dump()));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& body, const char* key, int64_t lo, int64_t hi,
                     std::optional<int64_t>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return Bad(key, "must be an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", it->dump()));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  *out = v;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ReadIdList(const Json& v, const char* key, size_t max_len) {
  if (!v.is_array()) return Bad(key, "must be a list of token ids");
  if (v.size() > max_len) return Bad(key, absl::StrCat("has more than ", max_len, " ids"));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const Json& e : v) {
    if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX) ||
        e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) {
      return Bad(key, absl::StrCat("must hold non-negative integer token ids, got ", e.dump()));
    }
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return ids;
}

// Fields of the OpenAI API that VeriCache does not implement: a request
// that uses one gets 400 naming it instead of an answer that silently
// differs from what it asked for. Each entry says when a value is harmless
// (the API's default).
std::vector<std::string> UnsupportedFields(const Json& body) {
  std::vector<std::string> bad;
  auto present = [&](const char* key) {
    auto it = body.find(key);
    return it != body.end() && !it->is_null();
  };
  auto get = [&](const char* key) -> const Json& { return body.at(key); };
  if (present("n") && !(get("n").is_number_integer() && get("n").get<int64_t>() == 1)) {
    bad.push_back("n (only n=1)");
  }
  if (present("best_of") && !(get("best_of").is_number_integer() && get("best_of").get<int64_t>() == 1)) {
    bad.push_back("best_of");
  }
  if (present("logprobs") && !(get("logprobs").is_boolean() && !get("logprobs").get<bool>())) {
    bad.push_back("logprobs");
  }
  if (present("top_logprobs")) bad.push_back("top_logprobs");
  if (present("echo") && !(get("echo").is_boolean() && !get("echo").get<bool>())) bad.push_back("echo");
  if (present("suffix") && !(get("suffix").is_string() && get("suffix").get<std::string>().empty())) {
    bad.push_back("suffix");
  }
  for (const char* key : {"tools", "functions"}) {
    if (present(key) && !(get(key).is_array() && get(key).empty())) bad.push_back(key);
  }
  for (const char* key : {"tool_choice", "function_call"}) {
    if (present(key) && !(get(key).is_string() && get(key).get<std::string>() == "none")) {
      bad.push_back(key);
    }
  }
  if (present("response_format")) {
    const Json& rf = get("response_format");
    const bool text = rf.is_object() && rf.contains("type") && rf["type"].is_string() &&
                      rf["type"].get<std::string>() == "text";
    if (!text) bad.push_back("response_format");
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (present(key) && !(get(key).is_number() && get(key).get<double>() == 0)) bad.push_back(key);
  }
  if (present("logit_bias") && !(get("logit_bias").is_object() && get("logit_bias").empty())) {
    bad.push_back("logit_bias");
  }
  return bad;
}

absl::Status ReadMessages(const Json& body, const ProtocolLimits& limits,
                          std::vector<ChatMessage>* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return Bad("messages", "is required");
  if (!it->is_array() || it->empty()) return Bad("messages", "must be a non-empty list");
  if (it->size() > static_cast<size_t>(limits.max_messages)) {
    return Bad("messages", absl::StrCat("has more than ", limits.max_messages, " entries"));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(where, "must be an object");
    ChatMessage msg;
    if (!m.contains("role") || !m["role"].is_string()) return Bad(where + ".role", "must be a string");
    msg.role = m["role"].get<std::string>();
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "developer") {
      return Bad(where + ".role",
                 absl::StrCat("must be system, developer, user or assistant, got '", msg.role, "'"));
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) return Bad(where + ".tool_calls", "is not supported");
    const Json* content = m.contains("content") ? &m["content"] : nullptr;
    if (content == nullptr || content->is_null()) {
      msg.content = "";
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text parts can reach a text model.
      for (size_t j = 0; j < content->size(); ++j) {
        const Json& part = (*content)[j];
        const std::string pwhere = absl::StrCat(where, ".content[", j, "]");
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
          return Bad(pwhere, "must be an object with a 'type'");
        }
        if (part["type"].get<std::string>() != "text") {
          return Bad(pwhere, absl::StrCat("has type '", part["type"].get<std::string>(),
                                          "'; only text parts are supported"));
        }
        if (!part.contains("text") || !part["text"].is_string()) return Bad(pwhere + ".text", "must be a string");
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return Bad(where + ".content", "must be a string or a list of text parts");
    }
    out->push_back(std::move(msg));
  }
  return absl::OkStatus();
}

const char* ObjectName(Endpoint e, bool chunk) {
  if (e == Endpoint::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

Json UsageJson(const Usage& u) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body, Endpoint endpoint,
                                                         const ProtocolLimits& limits) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  if (std::vector<std::string> bad = UnsupportedFields(j); !bad.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported field(s): ", absl::StrJoin(bad, ", ")));
  }
  CompletionRequest r;
  r.endpoint = endpoint;
  absl::Status s = ReadString(j, "model", &r.model);
  if (!s.ok()) return s;
  if (endpoint == Endpoint::kCompletions) {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return Bad("prompt", "is required");
    if (it->is_string()) {
      r.prompt = it->get<std::string>();
    } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
      r.prompt = (*it)[0].get<std::string>();
    } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
      auto ids = ReadIdList(*it, "prompt", static_cast<size_t>(limits.max_prompt_ids));
      if (!ids.ok()) return ids.status();
      r.prompt_ids = std::move(*ids);
    } else if (it->is_array() && !it->empty() && ((*it)[0].is_string() || (*it)[0].is_array())) {
      return Bad("prompt", "holds several prompts; only one per request is supported");
    } else {
      return Bad("prompt", "must be a string or a list of token ids");
    }
  } else {
    if (s = ReadMessages(j, limits, &r.messages); !s.ok()) return s;
  }
  std::optional<int64_t> max_tokens, max_completion_tokens;
  if (s = ReadInt(j, "max_tokens", 1, INT32_MAX, &max_tokens); !s.ok()) return s;
  if (s = ReadInt(j, "max_completion_tokens", 1, INT32_MAX, &max_completion_tokens); !s.ok()) return s;
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens) {
    return absl::InvalidArgumentError("'max_tokens' and 'max_completion_tokens' disagree; give one");
  }
  r.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  std::optional<double> temperature, top_p;
  if (s = ReadNumber(j, "temperature", 0, 2, &temperature); !s.ok()) return s;
  if (s = ReadNumber(j, "top_p", 0, 1, &top_p); !s.ok()) return s;
  if (temperature) r.temperature = *temperature;
  if (top_p) {
    if (*top_p <= 0) return Bad("top_p", "must be in (0, 1]");
    r.top_p = *top_p;
  }
  std::optional<int64_t> top_k;
  if (s = ReadInt(j, "top_k", -1, INT32_MAX, &top_k); !s.ok()) return s;
  if (top_k) r.top_k = *top_k < 0 ? 0 : static_cast<int>(*top_k);  // vLLM: -1 = off
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return Bad("seed", "must be an integer");
    // OpenAI seeds are 64-bit signed; the sampler takes the same bits.
    r.seed = it->is_number_unsigned() ? it->get<uint64_t>()
                                      : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > static_cast<size_t>(limits.max_stop_strings)) {
        return Bad("stop", absl::StrCat("has more than ", limits.max_stop_strings, " strings"));
      }
      for (const Json& e : *it) {
        if (!e.is_string()) return Bad("stop", "must be a string or a list of strings");
        r.stop.push_back(e.get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or a list of strings");
    }
    for (const std::string& stop : r.stop) {
      if (stop.empty()) return Bad("stop", "must not contain an empty string");
      if (stop.size() > static_cast<size_t>(limits.max_stop_string_bytes)) {
        return Bad("stop", absl::StrCat("strings are at most ", limits.max_stop_string_bytes, " bytes"));
      }
    }
  }
  if (s = ReadBool(j, "stream", &r.stream); !s.ok()) return s;
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("stream_options", "must be an object");
    if (!r.stream) return Bad("stream_options", "is only allowed with stream: true");
    if (s = ReadBool(*it, "include_usage", &r.include_usage); !s.ok()) return s;
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    auto ids = ReadIdList(*it, "stop_token_ids", static_cast<size_t>(limits.max_stop_token_ids));
    if (!ids.ok()) return ids.status();
    r.stop_token_ids = std::move(*ids);
  }
  if (s = ReadBool(j, "ignore_eos", &r.ignore_eos); !s.ok()) return s;
  // VeriCache's own fields.
  if (s = ReadString(j, "mode", &r.mode); !s.ok()) return s;
  if (!r.mode.empty() && r.mode != "vericache" && r.mode != "full_remote" && r.mode != "full_local" &&
      r.mode != "lossy_remote") {
    return Bad("mode", absl::StrCat("must be vericache, full_remote, full_local or lossy_remote, got '",
                                    r.mode, "'"));
  }
  if (s = ReadString(j, "compressor", &r.compressor); !s.ok()) return s;
  std::optional<double> ratio;
  if (s = ReadNumber(j, "ratio", 0, 1, &ratio); !s.ok()) return s;
  if (ratio) {
    if (*ratio <= 0) return Bad("ratio", "must be in (0, 1]");
    r.ratio = *ratio;
  }
  std::optional<int64_t> bits, draft_len;
  if (s = ReadInt(j, "bits", 0, 16, &bits); !s.ok()) return s;
  if (bits) r.bits = static_cast<int>(*bits);
  if (s = ReadInt(j, "draft_len", 0, 1024, &draft_len); !s.ok()) return s;
  if (draft_len) r.draft_len = static_cast<int>(*draft_len);
  if (s = ReadBool(j, "online_update", &r.online_update); !s.ok()) return s;
  return r;
}

nlohmann::json CompletionResponse(Endpoint endpoint, const ResponseMeta& meta, const Choice& choice,
                                  const Usage& usage) {
  Json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", choice.finish_reason}};
  if (endpoint == Endpoint::kCompletions) {
    c["text"] = choice.text;
  } else {
    c["message"] = {{"role", "assistant"}, {"content", choice.text}};
  }
  return Json{{"id", meta.id},
              {"object", ObjectName(endpoint, false)},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", Json::array({c})},
              {"usage", UsageJson(usage)}};
}

nlohmann::json StreamChunk(Endpoint endpoint, const ResponseMeta& meta, std::string_view text,
                           std::string_view finish_reason, bool first, bool with_usage_null) {
  Json c = {{"index", 0}, {"logprobs", nullptr}};
  c["finish_reason"] = finish_reason.empty() ? Json(nullptr) : Json(std::string(finish_reason));
  if (endpoint == Endpoint::kCompletions) {
    c["text"] = std::string(text);
  } else {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = std::string(text);
    c["delta"] = std::move(delta);
  }
  Json j = {{"id", meta.id},
            {"object", ObjectName(endpoint, true)},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", Json::array({c})}};
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

nlohmann::json UsageChunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage) {
  return Json{{"id", meta.id},
              {"object", ObjectName(endpoint, true)},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", Json::array()},
              {"usage", UsageJson(usage)}};
}

std::string SseEvent(const nlohmann::json& j) {
  // dump() escapes newlines inside strings, so the event is one data line.
  // Invalid UTF-8 is replaced rather than thrown on.
  return absl::StrCat("data: ", j.dump(-1, ' ', false, Json::error_handler_t::replace), "\n\n");
}

HttpError MakeError(int http_status, std::string_view type, std::string_view message,
                    std::string_view code, std::string_view param) {
  HttpError e;
  e.http_status = http_status;
  e.body = {{"error",
             {{"message", std::string(message)},
              {"type", std::string(type)},
              {"param", param.empty() ? Json(nullptr) : Json(std::string(param))},
              {"code", code.empty() ? Json(nullptr) : Json(std::string(code))}}}};
  return e;
}

HttpError ErrorFromStatus(const absl::Status& status, int retry_after_seconds) {
  const std::string msg(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return MakeError(400, "invalid_request_error", msg);
    case absl::StatusCode::kUnauthenticated:
      return MakeError(401, "authentication_error", msg, "invalid_api_key");
    case absl::StatusCode::kPermissionDenied:
      return MakeError(403, "permission_error", msg);
    case absl::StatusCode::kNotFound:
      return MakeError(404, "not_found_error", msg);
    case absl::StatusCode::kAlreadyExists:
      return MakeError(409, "invalid_request_error", msg);
    case absl::StatusCode::kResourceExhausted: {
      HttpError e = MakeError(429, "rate_limit_error", msg, "rate_limit_exceeded");
      e.retry_after_seconds = retry_after_seconds;
      return e;
    }
    case absl::StatusCode::kUnavailable:
      return MakeError(503, "service_unavailable", msg);
    case absl::StatusCode::kDeadlineExceeded:
      return MakeError(504, "timeout", msg);
    case absl::StatusCode::kCancelled:
      return MakeError(499, "cancelled", msg);
    default:
      return MakeError(500, "server_error", msg);
  }
}

}  // namespace vc::openai
