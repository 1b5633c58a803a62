// `vc-openai`: the OpenAI-compatible HTTP gateway in front of vc-coordinator
// (services/openai/gateway.h). It loads only the model's text side (the
// tokenizer, tokenizer_config.json, generation_config.json, the chat
// template), never its weights.
// Exit codes: 0 ok (stopped by SIGTERM/SIGINT), 1 runtime failure, 2 bad flags.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/chat/chat_template.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/model/generation_config.h"
#include "common/rpc/rpc.h"
#include "common/tokenizer/text_tokenizer.h"
#include "services/common/daemon.h"
#include "services/openai/gateway.h"

namespace {

namespace fs = std::filesystem;
constexpr char kName[] = "vc-openai";

// A llama2.c checkpoint's vocabulary size (the header's sixth int32; negative
// when the classifier is not shared), which its tokenizer.bin needs.
absl::StatusOr<int> Llama2cVocab(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t header[7];
  if (!in.read(reinterpret_cast<char*>(header), sizeof header)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": too short for a llama2.c header"));
  }
  const int32_t vocab = header[5] < 0 ? -header[5] : header[5];
  if (vocab <= 0 || vocab > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": implausible vocab_size ", header[5]));
  }
  return vocab;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  vc::openai::GatewayOptions o;
  std::string listen = "127.0.0.1:8000";
  std::string coordinator = "127.0.0.1:7430";
  std::string model, tokenizer, chat_template, metrics_listen;
  vc::FlagSet flags(kName,
                    "VeriCache OpenAI-compatible HTTP API: /v1/models, /v1/completions,\n"
                    "/v1/chat/completions (streamed or not), /health, served through vc-coordinator.");
  flags.Add("--listen", &listen, "HOST:PORT", "HTTP(S) address (port 0 picks one)");
  flags.Add("--tls-cert", &o.tls_cert, "PATH",
            "PEM certificate chain of the HTTPS listener (with --tls-key: HTTPS only, no client "
            "certificate asked for; empty: plain HTTP); re-read when it changes");
  flags.Add("--tls-key", &o.tls_key, "PATH", "PEM private key of --tls-cert");
  flags.Add("--tls-handshake-timeout-ms", &o.tls_handshake_timeout_ms, "N",
            "drop a connection whose TLS handshake is not done by then");
  flags.Add("--coordinator", &coordinator, "HOST:PORT", "vc-coordinator's gRPC address");
  std::string coordinator_tls_ca, coordinator_tls_server_name;
  flags.Add("--coordinator-tls-ca", &coordinator_tls_ca, "PATH",
            "CA bundle of the coordinator's TLS port (empty: plaintext gRPC); callers' API keys "
            "travel with each call");
  flags.Add("--coordinator-tls-server-name", &coordinator_tls_server_name, "NAME",
            "name in the coordinator's certificate when it is not the --coordinator host");
  flags.Add("--model", &model, "PATH",
            "the model the cluster serves: a Hugging Face checkpoint directory (its tokenizer.json, "
            "tokenizer_config.json and generation_config.json are used) or a llama2.c .bin "
            "(then --tokenizer is required); required");
  flags.Add("--tokenizer", &tokenizer, "PATH",
            "tokenizer.json or llama2.c tokenizer.bin (default: the checkpoint directory's)");
  flags.Add("--chat-template", &chat_template, "FILE",
            "Jinja chat template (default: tokenizer_config.json's chat_template; none: chat "
            "requests get 400)");
  flags.Add("--served-model-name", &o.served_model_name, "NAME",
            "model id in /v1/models and requests (default: the --model file or directory name)");
  flags.Add("--metrics-listen", &metrics_listen, "HOST:PORT", "Prometheus /metrics address (empty: off)");
  flags.Add("--threads", &o.threads, "N", "HTTP requests handled at once");
  flags.Add("--max-queued-connections", &o.max_queued_connections, "N",
            "accepted connections waiting for a thread (beyond: the listen backlog)");
  flags.Add("--max-body-bytes", &o.max_body_bytes, "N", "largest request body (larger: 413)");
  flags.Add("--max-header-bytes", &o.max_header_bytes, "N",
            "largest request head, request line + headers (larger: 400)");
  flags.Add("--read-timeout-s", &o.read_timeout_s, "N", "drop a client stalled while sending");
  flags.Add("--write-timeout-s", &o.write_timeout_s, "N",
            "drop (and cancel the request of) a client that stops reading");
  flags.Add("--idle-timeout-s", &o.idle_timeout_s, "N", "close a keep-alive connection idle this long");
  flags.Add("--keep-alive-max-requests", &o.keep_alive_max_requests, "N",
            "requests per keep-alive connection");
  flags.Add("--request-timeout-s", &o.request_timeout_s, "N", "deadline of each generation");
  flags.Add("--retry-after-s", &o.retry_after_s, "N", "Retry-After of a 429 (cluster full)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    return vc::daemon::BadFlags(kName, std::string(s.message()));
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (model.empty()) return vc::daemon::BadFlags(kName, "--model is required");
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return vc::daemon::BadFlags(kName, "--tls-cert and --tls-key go together");
  }
  if (absl::Status s = vc::rpc::SplitHostPort("--listen", listen, &o.host, &o.port); !s.ok()) {
    return vc::daemon::BadFlags(kName, std::string(s.message()));
  }
  {
    std::string host;
    int port = 0;
    if (absl::Status s = vc::rpc::SplitHostPort("--coordinator", coordinator, &host, &port); !s.ok()) {
      return vc::daemon::BadFlags(kName, std::string(s.message()));
    }
  }
  std::string metrics_host;
  int metrics_port = 0;
  if (!metrics_listen.empty()) {
    if (absl::Status s = vc::rpc::SplitHostPort("--metrics-listen", metrics_listen, &metrics_host, &metrics_port);
        !s.ok()) {
      return vc::daemon::BadFlags(kName, std::string(s.message()));
    }
  }
  std::error_code ec;
  const bool model_is_dir = fs::is_directory(model, ec);
  if (!model_is_dir && !fs::exists(model, ec)) return vc::daemon::BadFlags(kName, "--model " + model + " not found");
  if (!flags.was_set("--served-model-name")) {
    o.served_model_name = fs::path(model).filename().string();
    if (o.served_model_name.empty()) o.served_model_name = fs::path(model).parent_path().filename().string();
  }
  vc::TextTokenizerOptions topts;
  if (tokenizer.empty()) {
    if (!model_is_dir) return vc::daemon::BadFlags(kName, "--tokenizer is required with a llama2.c --model");
    tokenizer = model;
  } else if (!model_is_dir) {
    absl::StatusOr<int> vocab = Llama2cVocab(model);
    if (!vocab.ok()) return vc::daemon::BadFlags(kName, std::string(vocab.status().message()));
    topts.llama2c_vocab_size = *vocab;
  }
  vc::daemon::InstallCrashReporter(argv[0]);
  vc::daemon::BlockDrainSignals();

  auto tok = vc::LoadTextTokenizer(tokenizer, topts);
  if (!tok.ok()) return vc::daemon::BadFlags(kName, "--tokenizer: " + std::string(tok.status().message()));
  vc::openai::GatewayModel m;
  m.tokenizer = tok->get();
  const vc::TokenizerConfig& tc = (*tok)->config();
  m.bos_token = tc.bos_token.value_or("");
  m.eos_token = tc.eos_token.value_or("");
  if (model_is_dir) {
    auto gc = vc::LoadGenerationConfig(model);
    if (gc.ok()) {
      m.eos_token_ids = gc->eos_token_ids;
    } else if (gc.status().code() != absl::StatusCode::kNotFound) {
      return vc::daemon::BadFlags(kName, std::string(gc.status().message()));
    }
  }
  std::string template_source;
  if (!chat_template.empty()) {
    auto text = ReadFile(chat_template);
    if (!text.ok()) return vc::daemon::BadFlags(kName, "--chat-template: " + std::string(text.status().message()));
    template_source = *std::move(text);
  } else if (tc.chat_template) {
    template_source = *tc.chat_template;
  }
  std::unique_ptr<vc::ChatTemplate> tmpl;
  if (!template_source.empty()) {
    auto parsed = vc::ChatTemplate::Parse(template_source);
    if (!parsed.ok()) {
      return vc::daemon::BadFlags(kName, "chat template: " + std::string(parsed.status().message()));
    }
    tmpl = *std::move(parsed);
  }
  m.chat_template = tmpl.get();

  vc::metrics::Registry registry;
  o.registry = &registry;
  std::unique_ptr<vc::metrics::MetricsServer> metrics;
  if (!metrics_listen.empty()) {
    vc::metrics::MetricsServerOptions mo;
    mo.address = metrics_host;
    mo.port = metrics_port;
    auto started = vc::metrics::MetricsServer::Start(&registry, mo);
    if (!started.ok()) return vc::daemon::Fail(kName, started.status().ToString());
    metrics = *std::move(started);
  }
  auto client = vc::openai::MakeGrpcCoordinatorClient({.address = coordinator,
                                                      .tls_ca = coordinator_tls_ca,
                                                      .tls_server_name = coordinator_tls_server_name});
  auto gateway = vc::openai::Gateway::Start(o, m, client.get());
  if (!gateway.ok()) {
    return gateway.status().code() == absl::StatusCode::kInvalidArgument
               ? vc::daemon::BadFlags(kName, std::string(gateway.status().message()))
               : vc::daemon::Fail(kName, gateway.status().ToString());
  }
  // The line `vericache local` reads (as the other daemons print theirs).
  std::printf("%s listening on %s:%d metrics %s\n", kName, o.host.c_str(), (*gateway)->port(),
              metrics ? absl::StrCat(metrics_host, ":", metrics->port()).c_str() : "disabled");
  std::fflush(stdout);
  std::fprintf(stderr, "%s: serving '%s' over %s (%s chat template) through coordinator %s\n", kName,
               o.served_model_name.c_str(), o.tls_cert.empty() ? "HTTP" : "HTTPS", tmpl ? "with a" : "no",
               coordinator.c_str());
  const int sig = vc::daemon::WaitForDrainSignal();
  std::fprintf(stderr, "%s: signal %d, stopping\n", kName, sig);
  (*gateway)->Stop();
  if (metrics) metrics->Stop();
  return 0;
}
