#include "services/openai/openai_protocol.h"

#include <string>

#include "gtest/gtest.h"

namespace vc::openai {
namespace {

using Json = nlohmann::json;

absl::StatusOr<CompletionRequest> Completion(const Json& body) {
  return ParseCompletionRequest(body.dump(), Endpoint::kCompletions);
}
absl::StatusOr<CompletionRequest> Chat(const Json& body) {
  return ParseCompletionRequest(body.dump(), Endpoint::kChatCompletions);
}

// The error is InvalidArgument and its message contains `needle`.
void ExpectBad(const absl::StatusOr<CompletionRequest>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok()) << "expected an error naming " << needle;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
}

TEST(OpenAIProtocolTest, CompletionDefaults) {
  auto r = Completion({{"model", "m"}, {"prompt", "Once upon"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->prompt, "Once upon");
  EXPECT_FALSE(r->prompt_ids.has_value());
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_EQ(r->temperature, 1.0);
  EXPECT_EQ(r->top_p, 1.0);
  EXPECT_FALSE(r->stream);
  EXPECT_TRUE(r->stop.empty());
  EXPECT_TRUE(r->mode.empty());
}

TEST(OpenAIProtocolTest, CompletionFields) {
  auto r = Completion({{"prompt", Json::array({"one"})},
                       {"max_tokens", 7},
                       {"temperature", 0},
                       {"top_p", 0.5},
                       {"seed", -3},
                       {"stop", Json::array({"\n", "END"})},
                       {"stream", true},
                       {"stream_options", {{"include_usage", true}}},
                       {"n", 1},
                       {"logprobs", nullptr},
                       {"echo", false},
                       {"mode", "full_local"},
                       {"compressor", "snapkv"},
                       {"ratio", 0.25},
                       {"draft_len", 4},
                       {"online_update", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt, "one");
  EXPECT_EQ(*r->max_tokens, 7);
  EXPECT_EQ(r->temperature, 0);
  EXPECT_EQ(r->top_p, 0.5);
  EXPECT_EQ(*r->seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r->stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->mode, "full_local");
  EXPECT_EQ(r->compressor, "snapkv");
  EXPECT_EQ(r->ratio, 0.25);
  EXPECT_EQ(r->draft_len, 4);
  EXPECT_TRUE(r->online_update);
}

TEST(OpenAIProtocolTest, PromptAsTokenIds) {
  auto r = Completion({{"prompt", Json::array({1, 80, 147})}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->prompt_ids, (std::vector<int32_t>{1, 80, 147}));
  ExpectBad(Completion({{"prompt", Json::array({1, -2})}}), "prompt");
  ExpectBad(Completion({{"prompt", Json::array({"a", "b"})}}), "several prompts");
}

TEST(OpenAIProtocolTest, MaxCompletionTokensIsMaxTokens) {
  auto r = Chat({{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                 {"max_completion_tokens", 9}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->max_tokens, 9);
  ExpectBad(Chat({{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                  {"max_tokens", 3},
                  {"max_completion_tokens", 9}}),
            "disagree");
  ExpectBad(Completion({{"prompt", "x"}, {"max_tokens", 0}}), "max_tokens");
  ExpectBad(Completion({{"prompt", "x"}, {"max_tokens", "5"}}), "max_tokens");
}

TEST(OpenAIProtocolTest, UnsupportedFieldsAreNamed) {
  auto r = Completion({{"prompt", "x"}, {"n", 2}, {"logprobs", 3}, {"best_of", 2}, {"echo", true},
                       {"suffix", "s"}});
  ExpectBad(r, "n (only n=1)");
  for (const char* name : {"logprobs", "best_of", "echo", "suffix"}) ExpectBad(r, name);
  auto c = Chat({{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                 {"tools", Json::array({{{"type", "function"}}})},
                 {"response_format", {{"type", "json_object"}}}});
  ExpectBad(c, "tools");
  ExpectBad(c, "response_format");
  // Their defaults are fine.
  EXPECT_TRUE(Chat({{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                    {"tools", Json::array()},
                    {"response_format", {{"type", "text"}}},
                    {"presence_penalty", 0}})
                  .ok());
}

TEST(OpenAIProtocolTest, BadValues) {
  ExpectBad(ParseCompletionRequest("{not json", Endpoint::kCompletions), "not valid JSON");
  ExpectBad(ParseCompletionRequest("[1]", Endpoint::kCompletions), "JSON object");
  ExpectBad(Completion({{"model", "m"}}), "'prompt' is required");
  ExpectBad(Completion({{"prompt", "x"}, {"temperature", 3}}), "temperature");
  ExpectBad(Completion({{"prompt", "x"}, {"top_p", 0}}), "top_p");
  ExpectBad(Completion({{"prompt", "x"}, {"stop", Json::array({""})}}), "stop");
  ExpectBad(Completion({{"prompt", "x"}, {"stop", std::string(2000, 'a')}}), "stop");
  ExpectBad(Completion({{"prompt", "x"}, {"stop", Json::array({1})}}), "stop");
  ExpectBad(Completion({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}),
            "stream_options");
  ExpectBad(Completion({{"prompt", "x"}, {"mode", "fast"}}), "mode");
  ExpectBad(Completion({{"prompt", "x"}, {"ratio", 2}}), "ratio");
  ExpectBad(Completion({{"prompt", "x"}, {"stream", "yes"}}), "stream");
  ExpectBad(Chat({{"model", "m"}}), "messages");
  ExpectBad(Chat({{"messages", Json::array()}}), "messages");
  ExpectBad(Chat({{"messages", Json::array({{{"role", "tool"}, {"content", "x"}}})}}), "role");
  ExpectBad(Chat({{"messages", Json::array({{{"role", "user"},
                                             {"content", Json::array({{{"type", "image_url"}}})}}})}}),
            "image_url");
}

TEST(OpenAIProtocolTest, ChatContentParts) {
  auto r = Chat({{"messages", Json::array({{{"role", "system"}, {"content", "Be brief."}},
                                           {{"role", "user"},
                                            {"content", Json::array({{{"type", "text"}, {"text", "a"}},
                                                                     {{"type", "text"}, {"text", "b"}}})}}})}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "ab");
}

TEST(OpenAIProtocolTest, ResponsesAndChunks) {
  const ResponseMeta meta{"cmpl-1", 100, "m"};
  Json whole = CompletionResponse(Endpoint::kCompletions, meta, {"text", "length"}, {3, 4});
  EXPECT_EQ(whole["object"], "text_completion");
  EXPECT_EQ(whole["choices"][0]["text"], "text");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["total_tokens"], 7);
  Json chat = CompletionResponse(Endpoint::kChatCompletions, meta, {"hi", "stop"}, {1, 1});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hi");

  Json first = StreamChunk(Endpoint::kChatCompletions, meta, "", "", true, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  Json last = StreamChunk(Endpoint::kChatCompletions, meta, "", "stop", false, false);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last.contains("usage"));
  Json usage = UsageChunk(Endpoint::kCompletions, meta, {2, 5});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);

  const std::string event = SseEvent(StreamChunk(Endpoint::kCompletions, meta, "a\nb", "", false, false));
  EXPECT_EQ(event.rfind("data: {", 0), 0u);
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_EQ(event.find('\n'), event.size() - 2) << "one data line";
}

TEST(OpenAIProtocolTest, ErrorsFromStatus) {
  HttpError e = ErrorFromStatus(absl::ResourceExhaustedError("full"), 2);
  EXPECT_EQ(e.http_status, 429);
  EXPECT_EQ(e.retry_after_seconds, 2);
  EXPECT_EQ(e.body["error"]["message"], "full");
  EXPECT_EQ(e.body["error"]["type"], "rate_limit_error");
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("x")).http_status, 400);
  EXPECT_EQ(ErrorFromStatus(absl::UnauthenticatedError("x")).http_status, 401);
  EXPECT_EQ(ErrorFromStatus(absl::NotFoundError("x")).http_status, 404);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("x")).retry_after_seconds, 0);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("x")).http_status, 500);
}

}  // namespace
}  // namespace vc::openai
