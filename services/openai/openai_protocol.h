// The OpenAI HTTP API's wire format as vc-openai speaks it: parses and
// validates the bodies of POST /v1/completions and /v1/chat/completions into
// one CompletionRequest (unsupported OpenAI fields are refused by name,
// VeriCache's own request fields are read from the same body), builds the
// response objects and stream chunks, and turns errors (a Status, or the
// coordinator's gRPC code) into OpenAI error objects with their HTTP status.
// Pure functions over nlohmann::json: no I/O, no tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"

namespace vc::openai {

// Limits on what one request may ask for (bounded before anything is
// allocated from them).
struct ProtocolLimits {
  int max_stop_strings = 16;         // OpenAI allows 4; vLLM more
  int max_stop_string_bytes = 1024;  // each
  int max_messages = 1024;           // chat messages per request
  int max_prompt_ids = 1 << 20;      // a prompt given as token ids
  int max_stop_token_ids = 64;       // the extra field stop_token_ids
};

enum class Endpoint { kCompletions, kChatCompletions };

// One request as the gateway runs it, whichever endpoint it came from.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                          // "" when the body has none
  // Completions: the prompt as text, or as token ids (OpenAI allows a list
  // of ints); chat: the messages.
  std::string prompt;
  std::optional<std::vector<int32_t>> prompt_ids;
  std::vector<ChatMessage> messages;
  std::optional<int64_t> max_tokens;          // max_tokens or max_completion_tokens
  double temperature = 1.0;                   // OpenAI's default; 0 = greedy
  double top_p = 1.0;
  int top_k = 0;                              // extra field (0 = off)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;                 // stream_options.include_usage
  // Extra fields: stop at these ids too; ignore the model's EOS ids.
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // VeriCache's own request fields; empty/0 = the cluster's defaults.
  std::string mode;                           // vericache | full_remote | full_local | lossy_remote
  std::string compressor;
  double ratio = 0;
  int bits = 0;
  int draft_len = 0;
  bool online_update = false;
};

// Parses and validates a request body for `endpoint`. InvalidArgument with a
// message naming the field (and every unsupported field present) otherwise.
[[nodiscard]] absl::StatusOr<CompletionRequest> ParseCompletionRequest(
    std::string_view body, Endpoint endpoint, const ProtocolLimits& limits = {});

// "stop" or "length".
struct Choice {
  std::string text;
  std::string finish_reason;
};
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// The fields every response and chunk of one request share.
struct ResponseMeta {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// A whole (non-streamed) response.
nlohmann::json CompletionResponse(Endpoint endpoint, const ResponseMeta& meta, const Choice& choice,
                                  const Usage& usage);

// Stream chunks. `finish_reason` empty: null (more follows). For chat, the
// first chunk carries the role (`first`). `with_usage_null`: the chunk has
// "usage": null (stream_options.include_usage asks for it on every chunk).
nlohmann::json StreamChunk(Endpoint endpoint, const ResponseMeta& meta, std::string_view text,
                           std::string_view finish_reason, bool first, bool with_usage_null);
// The last chunk when include_usage is on: no choices, the usage.
nlohmann::json UsageChunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage);

// "data: <json>\n\n" and the terminator "data: [DONE]\n\n".
std::string SseEvent(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// An OpenAI error: the HTTP status, the body {"error": {...}}, and
// Retry-After seconds (0: no header) when the cluster refused for load.
struct HttpError {
  int http_status = 500;
  nlohmann::json body;
  int retry_after_seconds = 0;
};
// From a Status (the gateway's own checks or the coordinator's answer):
// InvalidArgument/OutOfRange 400, Unauthenticated 401, PermissionDenied 403,
// NotFound 404, AlreadyExists 409, ResourceExhausted 429 (+ Retry-After),
// Unavailable 503, DeadlineExceeded 504, Cancelled 499, else 500.
HttpError ErrorFromStatus(const absl::Status& status, int retry_after_seconds = 1);
// A plain error object with the given HTTP status and OpenAI error type.
HttpError MakeError(int http_status, std::string_view type, std::string_view message,
                    std::string_view code = "", std::string_view param = "");

}  // namespace vc::openai
