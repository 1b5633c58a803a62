// The gateway over real HTTP (cpp-httplib's client) with a fake coordinator
// and a byte-level fake tokenizer: what reaches the coordinator (prompt ids,
// EOS ids, sampling, credentials), the responses and streams that come back
// (usage, finish_reason, stop strings held back across events), error
// mapping (400/401/404/413/429 + Retry-After/503), and a client that hangs up
// mid-stream cancelling its coordinator call. Over HTTPS (certificates from
// the local cluster's throwaway CA): verification against the CA, plain HTTP
// and silent clients dropped without harm, the same limits, certificate
// reload.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/httplib.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/local/cluster_credentials.h"
#include "services/openai/gateway.h"

namespace vc::openai {
namespace {

namespace pb = ::vericache::v1;
using Json = nlohmann::json;

// Ids: 0 <unk>, 1 <s>, 2 </s> (special), then byte b is id b + 3.
class ByteTokenizer final : public TextTokenizer {
 public:
  ByteTokenizer() {
    config_.bos_token = "<s>";
    config_.eos_token = "</s>";
  }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> ids;
    if (add_special) ids.push_back(1);
    for (unsigned char c : text) ids.push_back(c + 3);
    return ids;
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) return absl::InvalidArgumentError("bad id");
      if (id < 3) {
        if (!skip_special) out += id == 1 ? "<s>" : id == 2 ? "</s>" : "<unk>";
      } else {
        out.push_back(static_cast<char>(id - 3));
      }
    }
    return out;
  }
  int vocab_size() const override { return 259; }
  std::optional<int32_t> TokenToId(std::string_view t) const override {
    if (t == "</s>") return 2;
    return std::nullopt;
  }
  bool IsSpecial(int32_t id) const override { return id < 3; }
  const TokenizerConfig& config() const override { return config_; }

 private:
  TokenizerConfig config_;
};

std::vector<int32_t> Ids(std::string_view text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c + 3);
  return ids;
}

class TestTemplate final : public ChatTemplate {
 public:
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& in) const override {
    std::string out = in.bos_token;
    for (const auto& m : in.messages) out += m.role + ": " + m.content + "\n";
    if (in.add_generation_prompt) out += "assistant:";
    return out;
  }
};

// What the fake cluster answers: token batches (one message each), then a
// final message, or an error before anything; `hang` keeps the stream open
// after the batches until it is cancelled.
struct Script {
  std::vector<std::vector<int32_t>> batches;
  bool stopped_at_eos = false;
  absl::Status error = absl::OkStatus();
  bool hang = false;
};

class FakeStream final : public GenerateStream {
 public:
  explicit FakeStream(Script script) : script_(std::move(script)) {}
  bool Read(pb::GenerateResponse* msg) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!script_.error.ok() || cancelled_) return false;
    if (next_ < script_.batches.size()) {
      *msg = pb::GenerateResponse();
      for (int32_t t : script_.batches[next_]) msg->add_tokens(t);
      ++next_;
      return true;
    }
    if (script_.hang) {
      cv_.wait(lock, [&] { return cancelled_; });
      return false;
    }
    if (final_sent_) return false;
    final_sent_ = true;
    *msg = pb::GenerateResponse();
    msg->set_final(true);
    msg->mutable_totals()->set_stopped_at_eos(script_.stopped_at_eos);
    return true;
  }
  absl::Status Finish() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return absl::CancelledError("cancelled");
    return script_.error;
  }
  void Cancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    cancels.fetch_add(1);
  }
  static inline std::atomic<int> cancels{0};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Script script_;
  size_t next_ = 0;
  bool final_sent_ = false;
  bool cancelled_ = false;
};

class FakeCoordinator final : public CoordinatorClient {
 public:
  std::unique_ptr<GenerateStream> Generate(const pb::GenerateRequest& req, const CallOptions& o) override {
    std::lock_guard<std::mutex> lock(mu);
    last_request = req;
    last_auth = o.authorization;
    ++generates;
    return std::make_unique<FakeStream>(script);
  }
  absl::StatusOr<pb::ClusterStatusResponse> ClusterStatus(const CallOptions& o) override {
    std::lock_guard<std::mutex> lock(mu);
    last_auth = o.authorization;
    if (!status_error.ok()) return status_error;
    pb::ClusterStatusResponse r;
    r.set_context_length(64);
    return r;
  }
  absl::Status Health(std::chrono::milliseconds) override { return health; }

  std::mutex mu;
  Script script;
  pb::GenerateRequest last_request;
  std::string last_auth;
  int generates = 0;
  absl::Status status_error = absl::OkStatus();
  absl::Status health = absl::OkStatus();
};

class GatewayTest : public ::testing::Test {
 protected:
  GatewayTest() {
    options_.port = 0;
    options_.served_model_name = "tiny";
    options_.threads = 4;
    options_.max_body_bytes = 4096;
    options_.disconnect_poll_ms = 10;
  }

  void Start(bool with_template = true, std::vector<int32_t> eos = {2, 7}) {
    const GatewayOptions& o = options_;
    GatewayModel m;
    m.tokenizer = &tokenizer_;
    m.chat_template = with_template ? &template_ : nullptr;
    m.eos_token_ids = std::move(eos);
    m.bos_token = "<s>";
    m.eos_token = "</s>";
    auto g = Gateway::Start(o, m, &coordinator_);
    ASSERT_TRUE(g.ok()) << g.status();
    gateway_ = std::move(*g);
    client_ = NewClient();
  }

  // A client of the gateway: HTTPS trusting `ca` when the gateway has a
  // certificate (the default: options_.tls_ca), plain HTTP otherwise.
  std::unique_ptr<httplib::Client> NewClient(std::string ca = "") {
    if (options_.tls_cert.empty()) {
      auto c = std::make_unique<httplib::Client>("127.0.0.1", gateway_->port());
      c->set_read_timeout(30, 0);
      return c;
    }
    auto c = std::make_unique<httplib::Client>(absl::StrCat("https://127.0.0.1:", gateway_->port()));
    c->set_ca_cert_path(ca.empty() ? tls_ca_.c_str() : ca.c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(30, 0);
    c->set_read_timeout(30, 0);
    return c;
  }

  httplib::Result Post(const std::string& path, const Json& body, httplib::Headers headers = {}) {
    return client_->Post(path.c_str(), headers, body.dump(), "application/json");
  }

  // The data payloads of an SSE body, in order ("[DONE]" included).
  static std::vector<std::string> Events(const std::string& body) {
    std::vector<std::string> out;
    for (absl::string_view block : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
      EXPECT_TRUE(absl::StartsWith(block, "data: ")) << block;
      out.emplace_back(block.substr(6));
    }
    return out;
  }

  GatewayOptions options_;
  std::string tls_ca_;  // the CA of options_.tls_cert
  ByteTokenizer tokenizer_;
  TestTemplate template_;
  FakeCoordinator coordinator_;
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(GatewayTest, CompletionSendsIdsAndReturnsText) {
  ASSERT_NO_FATAL_FAILURE(Start());
  coordinator_.script.batches = {Ids("Hel"), Ids("lo"), {2}};
  coordinator_.script.stopped_at_eos = true;
  auto res = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "Hi"}, {"max_tokens", 5}, {"temperature", 0}},
                  {{"Authorization", "Bearer k1"}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["text"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);  // BOS + 2 bytes
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  const pb::GenerateRequest& g = coordinator_.last_request;
  EXPECT_EQ(std::vector<int32_t>(g.prompt_ids().begin(), g.prompt_ids().end()),
            (std::vector<int32_t>{1, 'H' + 3, 'i' + 3}));
  EXPECT_EQ(g.max_new_tokens(), 5);
  EXPECT_TRUE(g.ignore_eos());  // replaced by generation_config's ids
  EXPECT_EQ(std::vector<int32_t>(g.stop_token_ids().begin(), g.stop_token_ids().end()),
            (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(g.sampling().mode(), pb::SamplingConfig::GREEDY);
  EXPECT_EQ(coordinator_.last_auth, "Bearer k1");
}

TEST_F(GatewayTest, LengthWhenNotStoppedAndDefaultMaxTokensFillsTheContext) {
  ASSERT_NO_FATAL_FAILURE(Start(true, {}));
  coordinator_.script.batches = {Ids("abc")};
  auto res = Post("/v1/completions", {{"prompt", "xy"}, {"temperature", 0.7}, {"seed", 5}, {"top_p", 0.9},
                                      {"mode", "full_local"}, {"draft_len", 3}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  const pb::GenerateRequest& g = coordinator_.last_request;
  EXPECT_EQ(g.max_new_tokens(), 64 - 3);
  EXPECT_FALSE(g.ignore_eos());
  EXPECT_EQ(g.stop_token_ids_size(), 0);
  EXPECT_EQ(g.sampling().mode(), pb::SamplingConfig::SEEDED);
  EXPECT_EQ(g.sampling().seed(), 5u);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.mode(), pb::MODE_FULL_LOCAL);
  EXPECT_EQ(g.draft_len(), 3);
  EXPECT_TRUE(coordinator_.last_auth.empty());
}

TEST_F(GatewayTest, StopStringEndsTheTextAndCancelsTheCall) {
  ASSERT_NO_FATAL_FAILURE(Start());
  coordinator_.script.batches = {Ids("one. "), Ids("STO"), Ids("P more")};
  coordinator_.script.hang = true;  // the call only ends when cancelled
  const int before = FakeStream::cancels.load();
  auto res = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 30}, {"stop", "STOP"}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], "one. ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_GT(FakeStream::cancels.load(), before);
}

TEST_F(GatewayTest, StreamHoldsBackAStopStringAcrossEvents) {
  ASSERT_NO_FATAL_FAILURE(Start());
  coordinator_.script.batches = {Ids("ab"), Ids("c\n"), Ids("\nzz")};
  coordinator_.script.hang = true;
  auto res = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 30}, {"stop", "\n\n"}, {"stream", true},
                                      {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::vector<std::string> events = Events(res->body);
  ASSERT_GE(events.size(), 4u) << res->body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json e = Json::parse(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    ASSERT_TRUE(e.contains("usage"));
    if (e["choices"].empty()) {
      usage = e["usage"];
      continue;
    }
    const std::string piece = e["choices"][0]["text"];
    EXPECT_EQ(piece.find('\n'), std::string::npos) << "a held-back newline leaked: " << events[i];
    text += piece;
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "abc");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(usage["completion_tokens"], 5);  // up to the token that completed the stop string
  EXPECT_EQ(usage["prompt_tokens"], 2);
}

TEST_F(GatewayTest, ChatRendersTheTemplateAndStreamsDeltas) {
  ASSERT_NO_FATAL_FAILURE(Start());
  coordinator_.script.batches = {Ids(" Hi"), Ids(" there"), {2}};
  coordinator_.script.stopped_at_eos = true;
  Json body = {{"model", "tiny"},
               {"messages", Json::array({{{"role", "user"}, {"content", "hey"}}})},
               {"max_completion_tokens", 10}};
  auto res = Post("/v1/chat/completions", body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], " Hi there");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  {
    std::lock_guard<std::mutex> lock(coordinator_.mu);
    const pb::GenerateRequest& g = coordinator_.last_request;
    // The template's text, encoded without added specials (the template has them).
    EXPECT_EQ(std::vector<int32_t>(g.prompt_ids().begin(), g.prompt_ids().end()),
              Ids("<s>user: hey\nassistant:"));
  }
  body["stream"] = true;
  res = Post("/v1/chat/completions", body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::vector<std::string> events = Events(res->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(first.contains("usage"));
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json e = Json::parse(events[i]);
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"];
  }
  EXPECT_EQ(text, " Hi there");
  EXPECT_EQ(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "stop");
}

TEST_F(GatewayTest, ChatWithoutTemplateIs400) {
  ASSERT_NO_FATAL_FAILURE(Start(/*with_template=*/false));
  auto res = Post("/v1/chat/completions", {{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("chat template"), std::string::npos);
  EXPECT_EQ(coordinator_.generates, 0);
}

TEST_F(GatewayTest, BadRequestsGetOpenAIErrors) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto res = Post("/v1/completions", {{"prompt", "x"}, {"n", 3}, {"logprobs", 2}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  const std::string msg = Json::parse(res->body)["error"]["message"];
  EXPECT_NE(msg.find("n (only n=1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("logprobs"), std::string::npos) << msg;

  res = Post("/v1/completions", {{"model", "other"}, {"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(Json::parse(res->body)["error"]["type"], "not_found_error");

  res = client_->Post("/v1/completions", std::string(5000, ' '), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_TRUE(Json::parse(res->body).contains("error"));

  res = client_->Post("/v1/completions", "{", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);

  res = Post("/v1/completions", {{"prompt", "x"}}, {{"Authorization", "Basic abc"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);

  res = client_->Get("/v1/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_TRUE(Json::parse(res->body).contains("error"));
  EXPECT_EQ(coordinator_.generates, 0);
}

TEST_F(GatewayTest, RequestHeadIsBounded) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // 2000 header lines of 100 bytes: each line is within httplib's own limit,
  // the head (~200 KB) is over the gateway's 64 KiB.
  httplib::Headers many;
  for (int i = 0; i < 2000; ++i) many.emplace("X-Filler-" + std::to_string(i), std::string(100, 'v'));
  auto res = client_->Get("/health", many);
  if (res) {
    EXPECT_EQ(res->status, 400);  // or the connection was closed: no result
  }
  // Normal requests still work, on a new connection.
  httplib::Client fresh("127.0.0.1", gateway_->port());
  res = fresh.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(GatewayTest, CoordinatorRefusalsMapToHttpStatuses) {
  ASSERT_NO_FATAL_FAILURE(Start());
  coordinator_.script.error = absl::ResourceExhaustedError("coordinator is full");
  auto res = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"stream", true}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(Json::parse(res->body)["error"]["message"], "coordinator is full");

  coordinator_.script.error = absl::UnauthenticatedError("unknown API key");
  res = Post("/v1/chat/completions", {{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})},
                                      {"max_tokens", 2}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);

  coordinator_.script.error = absl::InvalidArgumentError("exceeds the model's context");
  res = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);

  coordinator_.status_error = absl::UnauthenticatedError("unknown API key");
  res = client_->Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(coordinator_.last_auth, "Bearer wrong");

  coordinator_.health = absl::UnavailableError("down");
  res = client_->Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
}

TEST_F(GatewayTest, ModelsAndHealth) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto res = client_->Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(client_->Get("/v1/models/tiny")->status, 200);
  EXPECT_EQ(client_->Get("/v1/models/huge")->status, 404);
  res = client_->Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(GatewayTest, ClientHangingUpMidStreamCancelsTheCall) {
  ASSERT_NO_FATAL_FAILURE(Start());
  coordinator_.script.batches = {Ids("first")};
  coordinator_.script.hang = true;
  const int before = FakeStream::cancels.load();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(gateway_->port()));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string body = Json{{"prompt", "x"}, {"max_tokens", 50}, {"stream", true}}.dump();
  const std::string req = absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                       "Content-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  // Read until the first event arrived: the call is running.
  std::string got;
  char buf[4096];
  while (got.find("first") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof buf);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  // The watcher notices within its poll interval; the bound is generous.
  for (int i = 0; i < 1000 && FakeStream::cancels.load() == before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(FakeStream::cancels.load(), before);
}

// ---- HTTPS ----

namespace fs = std::filesystem;

// A TCP connection to the gateway whose reads give up after 30 s (the bound
// the server's own timeouts must beat by far).
int ConnectRaw(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads until the server closes; what it sent. `timed_out` when the 30 s
// receive timeout ran out first (the server kept the connection).
std::string ReadUntilClosed(int fd, bool* timed_out) {
  std::string got;
  char buf[4096];
  *timed_out = false;
  while (true) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      got.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) *timed_out = true;
    return got;
  }
}

void CopyFile(const std::string& from, const std::string& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

class GatewayHttpsTest : public GatewayTest {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // as the daemons do: OpenSSL writes with write(2)
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("gateway_https_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    for (const char* sub : {"a", "b"}) fs::create_directories(dir_ / sub);
    auto a = local::MakeClusterCredentials((dir_ / "a").string());
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = local::MakeClusterCredentials((dir_ / "b").string());
    ASSERT_TRUE(b.ok()) << b.status();
    a_ = *a;
    b_ = *b;
    // The gateway's files are copies, so that a test can rotate them.
    options_.tls_cert = (dir_ / "tls.crt").string();
    options_.tls_key = (dir_ / "tls.key").string();
    CopyFile(a_.daemon.cert, options_.tls_cert);
    CopyFile(a_.daemon.key, options_.tls_key);
    tls_ca_ = a_.ca;
    options_.tls_handshake_timeout_ms = 500;
    options_.idle_timeout_s = 1;
  }
  void TearDown() override {
    if (gateway_) gateway_->Stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  fs::path dir_;
  local::ClusterCredentials a_, b_;
};

TEST_F(GatewayHttpsTest, ServesRequestsVerifiedByTheClusterCa) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto res = client_->Get("/v1/models");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  coordinator_.script.batches = {Ids("Hel"), Ids("lo"), {2}};
  coordinator_.script.stopped_at_eos = true;
  res = Post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 5}}, {{"Authorization", "Bearer k1"}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(Json::parse(res->body)["choices"][0]["text"], "Hello");
  EXPECT_EQ(coordinator_.last_auth, "Bearer k1");
  // Streamed too (chunked over TLS).
  res = Post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 5}, {"stream", true}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(Events(res->body).back(), "[DONE]");
}

TEST_F(GatewayHttpsTest, ClientNotTrustingTheCaFailsVerification) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto res = NewClient(b_.ca)->Get("/health");
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error(), httplib::Error::SSLServerVerification);
  res = NewClient()->Get("/health");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

TEST_F(GatewayHttpsTest, WrongKeyGets401) {
  ASSERT_NO_FATAL_FAILURE(Start());
  coordinator_.status_error = absl::UnauthenticatedError("unknown API key");
  auto res = client_->Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(Json::parse(res->body)["error"]["message"], "unknown API key");
  EXPECT_EQ(coordinator_.last_auth, "Bearer wrong");
  coordinator_.script.error = absl::UnauthenticatedError("unknown API key");
  res = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}, {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 401);
}

TEST_F(GatewayHttpsTest, PlainHttpIsClosedAndServingGoesOn) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // More plain requests than threads: none may keep one.
  for (int i = 0; i < 2 * options_.threads; ++i) {
    const int fd = ConnectRaw(gateway_->port());
    ASSERT_GE(fd, 0);
    const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    bool timed_out = false;
    const std::string got = ReadUntilClosed(fd, &timed_out);
    close(fd);
    EXPECT_FALSE(timed_out);
    EXPECT_FALSE(absl::StartsWith(got, "HTTP/")) << got;  // at most a TLS alert
  }
  httplib::Client plain("127.0.0.1", gateway_->port());
  plain.set_read_timeout(30, 0);
  EXPECT_FALSE(plain.Get("/health"));
  auto res = client_->Get("/health");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

TEST_F(GatewayHttpsTest, SilentAndIdleConnectionsAreDropped) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // As many silent connections as threads: each is dropped at the handshake
  // deadline (0.5 s), long before the client's 30 s.
  std::vector<int> silent;
  for (int i = 0; i < options_.threads; ++i) {
    silent.push_back(ConnectRaw(gateway_->port()));
    ASSERT_GE(silent.back(), 0);
  }
  for (int fd : silent) {
    bool timed_out = false;
    EXPECT_EQ(ReadUntilClosed(fd, &timed_out), "");
    EXPECT_FALSE(timed_out);
    close(fd);
  }
  // A connection through its handshake that sends no request: dropped at
  // the idle timeout (1 s).
  const int fd = ConnectRaw(gateway_->port());
  ASSERT_GE(fd, 0);
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(SSL_CTX_load_verify_locations(ctx.get(), tls_ca_.c_str(), nullptr), 1);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), &SSL_free);
  ASSERT_EQ(SSL_set_fd(ssl.get(), fd), 1);
  ASSERT_EQ(SSL_connect(ssl.get()), 1);
  char c;
  const int n = SSL_read(ssl.get(), &c, 1);
  EXPECT_LE(n, 0);
  EXPECT_NE(SSL_get_error(ssl.get(), n), SSL_ERROR_WANT_READ);  // WANT_READ: our 30 s ran out
  ssl.reset();
  close(fd);
  // Every thread is free again.
  auto res = client_->Get("/health");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

TEST_F(GatewayHttpsTest, HeadAndBodyLimitsHold) {
  ASSERT_NO_FATAL_FAILURE(Start());
  httplib::Headers many;
  for (int i = 0; i < 2000; ++i) many.emplace("X-Filler-" + std::to_string(i), std::string(100, 'v'));
  auto res = client_->Get("/health", many);
  if (res) {
    EXPECT_EQ(res->status, 400);  // or the connection was closed: no result
  }
  res = NewClient()->Post("/v1/completions", std::string(5000, ' '), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 413);
  res = NewClient()->Get("/health");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

TEST_F(GatewayHttpsTest, RotatedCertificateServesNewConnections) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(NewClient(a_.ca)->Get("/health"));
  EXPECT_EQ(gateway_->tls_reloads(), 0);
  // Rotate as a Secret update does: new files renamed into place.
  CopyFile(b_.daemon.cert, options_.tls_cert + ".new");
  CopyFile(b_.daemon.key, options_.tls_key + ".new");
  fs::rename(options_.tls_cert + ".new", options_.tls_cert);
  fs::rename(options_.tls_key + ".new", options_.tls_key);
  auto res = NewClient(b_.ca)->Get("/health");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_GE(gateway_->tls_reloads(), 1);
  res = NewClient(a_.ca)->Get("/health");
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error(), httplib::Error::SSLServerVerification);
}

TEST_F(GatewayHttpsTest, UnusableCertificateIsInvalidArgument) {
  GatewayModel m;
  m.tokenizer = &tokenizer_;
  GatewayOptions o = options_;
  o.tls_key = b_.daemon.key;  // not the certificate's key
  auto g = Gateway::Start(o, m, &coordinator_);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  o.tls_key = (dir_ / "missing.key").string();
  g = Gateway::Start(o, m, &coordinator_);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  o.tls_key = "";
  g = Gateway::Start(o, m, &coordinator_);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
}

}  // namespace
}  // namespace vc::openai
