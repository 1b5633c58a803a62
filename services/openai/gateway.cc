#include "services/openai/gateway.h"

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/http/accept_loop.h"
#include "common/http/httplib.h"
#include "services/common/daemon.h"
#include "services/openai/internal/bounded_server.h"
#include "services/openai/internal/bounded_task_queue.h"
#include "services/openai/internal/connection_watch.h"
#include "services/openai/openai_protocol.h"
#include "services/openai/stop_strings.h"

namespace vc::openai {
namespace {

namespace pb = ::vericache::v1;
using Json = nlohmann::json;

std::string RandomHex(size_t n) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = kHex[rng() & 15];
  return s;
}

pb::Mode ModeOf(const std::string& mode) {
  if (mode == "vericache") return pb::MODE_VERICACHE;
  if (mode == "full_remote") return pb::MODE_FULL_REMOTE;
  if (mode == "full_local") return pb::MODE_FULL_LOCAL;
  if (mode == "lossy_remote") return pb::MODE_LOSSY_REMOTE;
  return pb::MODE_UNSPECIFIED;  // the cluster's default
}

void SendError(httplib::Response& res, const HttpError& e) {
  res.status = e.http_status;
  if (e.retry_after_seconds > 0) res.set_header("Retry-After", std::to_string(e.retry_after_seconds));
  res.set_content(e.body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

// Generated ids -> emitted text: incremental detokenization of the
// generated ids alone (special tokens skipped), then the stop strings.
class TextAssembler {
 public:
  TextAssembler(const TextTokenizer& tokenizer, std::vector<std::string> stops)
      : detok_(tokenizer, /*skip_special_tokens=*/true), stops_(std::move(stops)) {}

  // Consumes `ids` until a stop string matches; the text to emit.
  absl::StatusOr<std::string> Push(std::span<const int32_t> ids) {
    std::string out;
    for (int32_t id : ids) {
      if (stops_.stopped()) break;
      ++tokens_;
      VC_ASSIGN_OR_RETURN(std::string piece, detok_.Push(id));
      out += stops_.Push(piece);
    }
    return out;
  }
  absl::StatusOr<std::string> Finish() {
    if (stops_.stopped()) return std::string();
    VC_ASSIGN_OR_RETURN(std::string tail, detok_.Finish());
    std::string out = stops_.Push(tail);
    return out + stops_.Finish();
  }
  bool stopped() const { return stops_.stopped(); }
  int64_t tokens() const { return tokens_; }

 private:
  IncrementalDetokenizer detok_;
  StopStringFilter stops_;
  int64_t tokens_ = 0;
};

}  // namespace

struct Gateway::Impl {
  GatewayOptions options;
  GatewayModel model;
  CoordinatorClient* client = nullptr;
  int64_t created = 0;
  std::shared_ptr<internal::TlsServerContext> tls;  // null: plain HTTP
  std::unique_ptr<internal::BoundedServer> server_holder;
  std::thread thread;
  int port = 0;
  std::unique_ptr<internal::ConnectionWatcher> watcher;
  metrics::Registry own_registry;
  metrics::CounterFamily* requests = nullptr;   // {endpoint, code}
  metrics::GaugeFamily* active = nullptr;       // coordinator calls running
  metrics::CounterFamily* hangups = nullptr;    // calls cancelled by a client that left
  std::atomic<int32_t> context_length{0};
  std::mutex mu;
  std::set<GenerateStream*> running;  // cancelled by Stop
  bool stopping = false;
  std::mutex stop_mu;
  bool stopped = false;

  // One request on its way through the cluster.
  struct Call {
    Impl* impl = nullptr;
    CompletionRequest req;
    ResponseMeta meta;
    int64_t prompt_tokens = 0;
    std::unique_ptr<GenerateStream> stream;
    std::unique_ptr<TextAssembler> text;
    int64_t watch = 0;
    bool finished = false;      // Finish() was called
    bool first_chunk = true;
    pb::GenerateResponse pending;  // read ahead before the response started
    bool has_pending = false;
    bool stopped_at_eos = false;
    bool got_final = false;

    ~Call() {
      if (impl == nullptr) return;
      if (stream) impl->active->Get().Inc(-1);
      if (watch != 0) impl->watcher->Unwatch(watch);
      if (stream) {
        {
          std::lock_guard<std::mutex> lock(impl->mu);
          impl->running.erase(stream.get());
        }
        if (!finished) {
          // The client went away or the text stopped: end the call now so
          // the coordinator frees the request's KV.
          stream->Cancel();
          pb::GenerateResponse drain;
          while (stream->Read(&drain)) {
          }
          stream->Finish().IgnoreError();  // cancelled on purpose
        }
      }
    }
    // Next coordinator message; false at the end of the stream.
    bool Next(pb::GenerateResponse* msg) {
      if (has_pending) {
        *msg = std::move(pending);
        has_pending = false;
        return true;
      }
      return stream->Read(msg);
    }
    absl::Status End() {
      finished = true;
      return stream->Finish();
    }
  };

  absl::StatusOr<std::string> Authorization(const httplib::Request& req) {
    if (!req.has_header("Authorization")) return std::string();
    const std::string value = req.get_header_value("Authorization");
    if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "Bearer ")) {
      return absl::UnauthenticatedError("the Authorization header must be 'Bearer KEY'");
    }
    const std::string key(absl::StripAsciiWhitespace(value.substr(7)));
    if (key.empty()) return absl::UnauthenticatedError("the Authorization header has an empty key");
    // It becomes a gRPC metadata value: printable ASCII only.
    for (char c : key) {
      if (c < 0x21 || c > 0x7e) {
        return absl::UnauthenticatedError("the API key has characters outside printable ASCII");
      }
    }
    return "Bearer " + key;
  }

  CallOptions Options(std::string authorization) const {
    CallOptions o;
    o.authorization = std::move(authorization);
    o.timeout = std::chrono::milliseconds(int64_t{options.request_timeout_s} * 1000);
    return o;
  }

  absl::StatusOr<int32_t> ContextLength(const CallOptions& call) {
    if (int32_t c = context_length.load(); c > 0) return c;
    VC_ASSIGN_OR_RETURN(pb::ClusterStatusResponse status, client->ClusterStatus(call));
    if (status.context_length() <= 0) {
      return absl::UnavailableError("the coordinator did not report the model's context length");
    }
    context_length.store(status.context_length());
    return status.context_length();
  }

  // Body -> prompt ids and the coordinator's request.
  absl::Status Prepare(const std::string& body, Endpoint endpoint, const CallOptions& call_options,
                       Call* call, pb::GenerateRequest* greq) {
    VC_ASSIGN_OR_RETURN(call->req, ParseCompletionRequest(body, endpoint));
    const CompletionRequest& r = call->req;
    if (!r.model.empty() && r.model != options.served_model_name) {
      return absl::NotFoundError(absl::StrCat("the model '", r.model, "' does not exist (this server serves '",
                                              options.served_model_name, "')"));
    }
    std::vector<int32_t> ids;
    if (endpoint == Endpoint::kCompletions) {
      if (r.prompt_ids) {
        ids = *r.prompt_ids;
      } else {
        // As Hugging Face's encode(prompt): the post-processor's specials (BOS).
        VC_ASSIGN_OR_RETURN(ids, model.tokenizer->Encode(r.prompt, /*add_special_tokens=*/true));
      }
    } else {
      if (model.chat_template == nullptr) {
        return absl::InvalidArgumentError(
            "this model has no chat template (tokenizer_config.json has no chat_template and "
            "vc-openai was started without --chat-template): use /v1/completions");
      }
      ChatTemplateInputs in;
      in.messages = r.messages;
      in.bos_token = model.bos_token;
      in.eos_token = model.eos_token;
      in.add_generation_prompt = true;
      VC_ASSIGN_OR_RETURN(std::string text, model.chat_template->Render(in));
      // The template carries the special tokens itself.
      VC_ASSIGN_OR_RETURN(ids, model.tokenizer->Encode(text, /*add_special_tokens=*/false));
    }
    if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty (no tokens)");
    call->prompt_tokens = static_cast<int64_t>(ids.size());
    int64_t max_tokens = 0;
    if (r.max_tokens) {
      max_tokens = *r.max_tokens;
    } else {
      // No limit given: up to the model's context (as vLLM does).
      VC_ASSIGN_OR_RETURN(int32_t context, ContextLength(call_options));
      max_tokens = context - call->prompt_tokens;
      if (max_tokens < 1) {
        return absl::InvalidArgumentError(absl::StrCat("the prompt has ", call->prompt_tokens,
                                                       " tokens: no room left in the model's context of ",
                                                       context, " tokens"));
      }
    }
    greq->set_request_id(call->meta.id);
    for (int32_t id : ids) greq->add_prompt_ids(id);
    greq->set_max_new_tokens(max_tokens);
    // generation_config.json's EOS ids replace the model's single EOS.
    if (!r.ignore_eos && !model.eos_token_ids.empty()) {
      greq->set_ignore_eos(true);
      for (int32_t id : model.eos_token_ids) greq->add_stop_token_ids(id);
    } else {
      greq->set_ignore_eos(r.ignore_eos);
    }
    for (int32_t id : r.stop_token_ids) greq->add_stop_token_ids(id);
    pb::SamplingConfig* s = greq->mutable_sampling();
    if (r.temperature == 0) {
      s->set_mode(pb::SamplingConfig::GREEDY);
    } else {
      s->set_mode(pb::SamplingConfig::SEEDED);
      s->set_temperature(static_cast<float>(r.temperature));
      s->set_top_p(static_cast<float>(r.top_p));
      s->set_top_k(r.top_k);
      s->set_seed(r.seed ? *r.seed : std::random_device{}());
    }
    greq->set_mode(ModeOf(r.mode));
    greq->set_compressor(r.compressor);
    greq->set_ratio(r.ratio);
    greq->set_bits(r.bits);
    greq->set_draft_len(r.draft_len);
    greq->set_online_update(r.online_update);
    greq->set_deadline_ms(int64_t{options.request_timeout_s} * 1000);
    call->text = std::make_unique<TextAssembler>(*model.tokenizer, r.stop);
    return absl::OkStatus();
  }

  // Starts the coordinator call and waits for its first message, so that a
  // refusal (admission, bad request, authentication) still becomes an HTTP
  // status rather than an error inside a 200 stream.
  absl::Status Open(const pb::GenerateRequest& greq, const CallOptions& call_options,
                    const httplib::Request& http, Call* call) {
    call->stream = client->Generate(greq, call_options);
    active->Get().Inc();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return absl::UnavailableError("vc-openai is shutting down");
      running.insert(call->stream.get());
    }
    int fd = internal::BoundedServer::CurrentSocket();
    if (fd < 0) {
      fd = internal::FindConnectionFd(http.local_addr, http.local_port, http.remote_addr, http.remote_port);
    }
    if (fd >= 0) {
      GenerateStream* stream = call->stream.get();
      metrics::Counter* hung_up = &hangups->Get();
      call->watch = watcher->Watch(fd, [stream, hung_up] {
        hung_up->Inc();
        stream->Cancel();
      });
    }
    if (call->stream->Read(&call->pending)) {
      call->has_pending = true;
      return absl::OkStatus();
    }
    absl::Status s = call->End();
    if (s.ok()) s = absl::InternalError("the coordinator ended the stream without a message");
    return s;
  }

  // Consumes one message; the new text.
  absl::StatusOr<std::string> Consume(Call* call, const pb::GenerateResponse& msg) {
    if (msg.final()) {
      call->got_final = true;
      call->stopped_at_eos = msg.totals().stopped_at_eos();
    }
    return call->text->Push(std::span<const int32_t>(msg.tokens().data(), msg.tokens().size()));
  }

  std::string FinishReason(const Call& call) const {
    return call.text->stopped() || call.stopped_at_eos ? "stop" : "length";
  }

  absl::Status Complete(const std::string& body, Endpoint endpoint, const httplib::Request& http,
                        httplib::Response& res) {
    VC_ASSIGN_OR_RETURN(std::string auth, Authorization(http));
    const CallOptions call_options = Options(std::move(auth));
    auto call = std::make_shared<Call>();
    call->impl = this;
    call->meta.id = absl::StrCat(endpoint == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-", RandomHex(24));
    call->meta.created = static_cast<int64_t>(std::time(nullptr));
    call->meta.model = options.served_model_name;
    pb::GenerateRequest greq;
    VC_RETURN_IF_ERROR(Prepare(body, endpoint, call_options, call.get(), &greq));
    VC_RETURN_IF_ERROR(Open(greq, call_options, http, call.get()));
    if (!call->req.stream) return Whole(call.get(), endpoint, res);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, call, endpoint](size_t /*offset*/, httplib::DataSink& sink) {
          return StreamStep(call.get(), endpoint, sink);
        },
        [call](bool /*success*/) mutable {
          // Runs when the response is done or abandoned: ~Call cancels a
          // call that did not end.
          call.reset();
        });
    return absl::OkStatus();
  }

  absl::Status Whole(Call* call, Endpoint endpoint, httplib::Response& res) {
    std::string text;
    pb::GenerateResponse msg;
    while (!call->text->stopped() && call->Next(&msg)) {
      VC_ASSIGN_OR_RETURN(std::string piece, Consume(call, msg));
      text += piece;
    }
    if (!call->text->stopped()) {
      VC_RETURN_IF_ERROR(call->End());
      if (!call->got_final) return absl::InternalError("the stream ended without a final message");
      VC_ASSIGN_OR_RETURN(std::string tail, call->text->Finish());
      text += tail;
    }
    Choice choice{std::move(text), FinishReason(*call)};
    const Usage usage{call->prompt_tokens, call->text->tokens()};
    res.status = 200;
    res.set_content(CompletionResponse(endpoint, call->meta, choice, usage)
                        .dump(-1, ' ', false, Json::error_handler_t::replace),
                    "application/json");
    return absl::OkStatus();
  }

  // One step of a stream: one coordinator message as (at most) one event;
  // at the end the finish chunk, the usage chunk and [DONE].
  bool StreamStep(Call* call, Endpoint endpoint, httplib::DataSink& sink) {
    auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
    const bool usage_null = call->req.include_usage;
    std::string out;
    pb::GenerateResponse msg;
    if (!call->text->stopped() && call->Next(&msg)) {
      absl::StatusOr<std::string> piece = Consume(call, msg);
      if (!piece.ok()) return WriteStreamError(call, sink, piece.status());
      // A chat stream opens with the role, even before any text.
      if (!piece->empty() || (endpoint == Endpoint::kChatCompletions && call->first_chunk)) {
        out = SseEvent(StreamChunk(endpoint, call->meta, *piece, "", call->first_chunk, usage_null));
        call->first_chunk = false;
      }
      if (!call->text->stopped()) return out.empty() || write(out);
    }
    // The end: a stop string matched, or the coordinator's stream ended.
    std::string tail;
    if (!call->text->stopped()) {
      absl::Status s = call->End();
      if (s.ok() && !call->got_final) s = absl::InternalError("the stream ended without a final message");
      if (!s.ok()) {
        if (!out.empty() && !write(out)) return false;
        return WriteStreamError(call, sink, s);
      }
      absl::StatusOr<std::string> t = call->text->Finish();
      if (!t.ok()) return WriteStreamError(call, sink, t.status());
      tail = *std::move(t);
    }
    if (!tail.empty() || (endpoint == Endpoint::kChatCompletions && call->first_chunk)) {
      out += SseEvent(StreamChunk(endpoint, call->meta, tail, "", call->first_chunk, usage_null));
      call->first_chunk = false;
    }
    out += SseEvent(StreamChunk(endpoint, call->meta, "", FinishReason(*call), false, usage_null));
    if (call->req.include_usage) {
      out += SseEvent(UsageChunk(endpoint, call->meta, Usage{call->prompt_tokens, call->text->tokens()}));
    }
    out += kSseDone;
    if (!write(out)) return false;
    sink.done();
    return true;
  }

  // An error after the stream started: an error event (as vLLM sends), then
  // [DONE].
  bool WriteStreamError(Call* call, httplib::DataSink& sink, const absl::Status& s) {
    (void)call;
    const std::string out = SseEvent(ErrorFromStatus(s).body) + std::string(kSseDone);
    if (!sink.write(out.data(), out.size())) return false;
    sink.done();
    return true;
  }

  void Models(const httplib::Request& http, httplib::Response& res, const std::string& only) {
    absl::StatusOr<std::string> auth = Authorization(http);
    if (!auth.ok()) return SendError(res, ErrorFromStatus(auth.status()));
    // Asking the cluster also checks the caller's key.
    absl::StatusOr<pb::ClusterStatusResponse> status = client->ClusterStatus(Options(*auth));
    if (!status.ok()) return SendError(res, ErrorFromStatus(status.status(), options.retry_after_s));
    if (status->context_length() > 0) context_length.store(status->context_length());
    Json model = {{"id", options.served_model_name},
                  {"object", "model"},
                  {"created", created},
                  {"owned_by", "vericache"},
                  {"max_model_len", status->context_length()}};
    if (!only.empty()) {
      if (only != options.served_model_name) {
        return SendError(res, MakeError(404, "not_found_error",
                                        absl::StrCat("the model '", only, "' does not exist"),
                                        "model_not_found", "model"));
      }
      res.set_content(model.dump(), "application/json");
      return;
    }
    res.set_content(Json{{"object", "list"}, {"data", Json::array({model})}}.dump(), "application/json");
  }

  void Route(const httplib::Request& http, httplib::Response& res, const httplib::ContentReader& reader,
             Endpoint endpoint) {
    // Bodies sent chunked have no Content-Length for the pre-routing check:
    // count while reading.
    std::string body;
    bool too_big = false;
    const bool read = reader([&](const char* data, size_t n) {
      if (body.size() + n > static_cast<size_t>(options.max_body_bytes)) {
        too_big = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (too_big) {
      res.set_header("Connection", "close");
      return SendError(res, MakeError(413, "invalid_request_error",
                                      absl::StrCat("the request body exceeds ", options.max_body_bytes, " bytes")));
    }
    if (!read) return SendError(res, MakeError(400, "invalid_request_error", "the request body could not be read"));
    absl::Status s = Complete(body, endpoint, http, res);
    if (!s.ok()) {
      SendError(res, ErrorFromStatus(s, options.retry_after_s));
      // The operator sees server-side failures; client errors are the client's.
      if (res.status >= 500) std::fprintf(stderr, "vc-openai: %s\n", s.ToString().c_str());
    }
    requests->Labels({endpoint == Endpoint::kCompletions ? "completions" : "chat_completions",
                      std::to_string(res.status)})
        .Inc();
  }
};

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() { Stop(); }
int Gateway::port() const { return impl_->port; }
int Gateway::tls_reloads() const { return impl_->tls ? impl_->tls->reloads() : 0; }

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(const GatewayOptions& options,
                                                       const GatewayModel& model,
                                                       CoordinatorClient* client) {
  if (model.tokenizer == nullptr) return absl::InvalidArgumentError("vc-openai: no tokenizer");
  if (client == nullptr) return absl::InvalidArgumentError("vc-openai: no coordinator client");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: bad port ", options.port));
  }
  if (options.threads < 1 || options.max_queued_connections < 1 || options.max_body_bytes < 1 ||
      options.read_timeout_s < 1 || options.write_timeout_s < 1 || options.idle_timeout_s < 1 ||
      options.request_timeout_s < 1 || options.keep_alive_max_requests < 1 || options.retry_after_s < 0 ||
      options.max_header_bytes < 1024 || options.tls_handshake_timeout_ms < 1) {
    return absl::InvalidArgumentError("vc-openai: thread, queue, size and timeout settings must be >= 1");
  }
  if (options.served_model_name.empty()) {
    return absl::InvalidArgumentError("--served-model-name must not be empty");
  }
  auto impl = std::make_unique<Impl>();
  if (!options.tls_cert.empty() || !options.tls_key.empty()) {
    absl::StatusOr<std::shared_ptr<internal::TlsServerContext>> tls =
        internal::TlsServerContext::Create(options.tls_cert, options.tls_key);
    if (!tls.ok()) return tls.status();
    impl->tls = *std::move(tls);
  }
  impl->options = options;
  impl->model = model;
  impl->client = client;
  impl->created = static_cast<int64_t>(std::time(nullptr));
  impl->watcher = std::make_unique<internal::ConnectionWatcher>(options.disconnect_poll_ms);
  metrics::Registry* registry = options.registry ? options.registry : &impl->own_registry;
  impl->requests = daemon::MustCounter(registry, "vericache_openai_requests_total",
                                       "Completion requests answered, by endpoint and HTTP status "
                                       "(a stream counts its status when it starts).",
                                       {"endpoint", "code"});
  impl->active = daemon::MustGauge(registry, "vericache_openai_active_requests",
                                   "Coordinator calls the gateway is running.");
  impl->hangups = daemon::MustCounter(registry, "vericache_openai_client_disconnects_total",
                                      "Requests cancelled because their client hung up.");
  Impl* self = impl.get();
  impl->server_holder = std::make_unique<internal::BoundedServer>(
      static_cast<size_t>(options.max_header_bytes), static_cast<size_t>(options.max_body_bytes), impl->tls,
      options.tls_handshake_timeout_ms);
  httplib::Server& srv = *impl->server_holder;
  const size_t threads = static_cast<size_t>(options.threads);
  const size_t queued = static_cast<size_t>(options.max_queued_connections);
  srv.new_task_queue = [threads, queued] { return new internal::BoundedTaskQueue(threads, queued); };
  srv.set_keep_alive_timeout(options.idle_timeout_s);
  srv.set_keep_alive_max_count(static_cast<size_t>(options.keep_alive_max_requests));
  srv.set_read_timeout(options.read_timeout_s, 0);
  srv.set_write_timeout(options.write_timeout_s, 0);
  srv.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  srv.set_tcp_nodelay(true);  // stream events leave at once
  // SO_REUSEADDR only (httplib's default SO_REUSEPORT would let a second
  // process bind the same port silently).
  srv.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Before the body is read: refuse a declared length over the limit.
  srv.set_pre_routing_handler([self](const httplib::Request& req, httplib::Response& res) {
    internal::BoundedServer::HeadDone();  // the body's budget from here on
    if (req.has_header("Content-Length")) {
      uint64_t len = 0;
      const bool parsed = absl::SimpleAtoi(req.get_header_value("Content-Length"), &len);
      if (!parsed) {
        res.set_header("Connection", "close");
        SendError(res, MakeError(400, "invalid_request_error", "bad Content-Length header"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (len > static_cast<uint64_t>(self->options.max_body_bytes)) {
        res.set_header("Connection", "close");
        SendError(res, MakeError(413, "invalid_request_error",
                                 absl::StrCat("the request body exceeds ", self->options.max_body_bytes,
                                              " bytes")));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own refusals (404 for unknown paths, 400 for malformed
  // requests, 413) get an OpenAI error object too.
  srv.set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request& req, httplib::Response& res) -> httplib::Server::HandlerResponse {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const int status = res.status;
    const std::string type = status == 404 ? "not_found_error" : "invalid_request_error";
    const std::string msg = status == 404 ? absl::StrCat("no route ", req.method, " ", req.path)
                                          : absl::StrCat("bad request (HTTP ", status, ")");
    SendError(res, MakeError(status, type, msg));
    return httplib::Server::HandlerResponse::Handled;
  }));
  srv.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    SendError(res, MakeError(500, "server_error", "internal error"));
  });
  srv.Get("/health", [self](const httplib::Request&, httplib::Response& res) {
    const absl::Status s = self->client->Health(std::chrono::milliseconds(2000));
    if (!s.ok()) {
      return SendError(res, MakeError(503, "service_unavailable",
                                      absl::StrCat("coordinator not serving: ", s.message())));
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  srv.Get("/v1/models", [self](const httplib::Request& req, httplib::Response& res) {
    self->Models(req, res, "");
  });
  srv.Get(R"(/v1/models/(.+))", [self](const httplib::Request& req, httplib::Response& res) {
    self->Models(req, res, req.matches[1].str());
  });
  srv.Post("/v1/completions", [self](const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
    self->Route(req, res, reader, Endpoint::kCompletions);
  });
  srv.Post("/v1/chat/completions", [self](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
    self->Route(req, res, reader, Endpoint::kChatCompletions);
  });

  int port = options.port;
  if (port == 0) {
    port = srv.bind_to_any_port(options.host);
  } else if (!srv.bind_to_port(options.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("vc-openai: cannot bind ", options.host, ":", options.port));
  }
  impl->port = port;
  VC_RETURN_IF_ERROR(http::StartAcceptLoop(srv, &impl->thread, "vc-openai"));
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

void Gateway::Stop() {
  if (impl_ == nullptr) return;
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  {
    // Running calls end now (their clients get an error event or a closed
    // connection) so that stopping does not wait for long generations.
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stopping = true;
    for (GenerateStream* s : impl_->running) s->Cancel();
  }
  impl_->server_holder->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace vc::openai
