// vc-openai's server: the OpenAI HTTP API (GET /v1/models, POST
// /v1/completions and /v1/chat/completions, streamed as server-sent events or
// not, GET /health) in front of the coordinator's gRPC API. Text becomes
// token ids here (the model's tokenizer, its chat template) and ids become
// text again (incremental detokenization, stop strings); the cluster only
// ever sees ids. Every request runs as one coordinator Generate call with the
// caller's credentials; a client that hangs up cancels it.
//
// HTTP is cpp-httplib (Debian's libcpp-httplib) with bounded threads, a
// bounded connection queue, a body-size limit (413), a limit on the whole
// request head (request line + headers; cpp-httplib itself bounds only each
// line), read/write/idle timeouts. With a certificate it serves HTTPS only
// (OpenSSL, TLS 1.2+, no client certificate asked for; the certificate is
// re-read when its files change), with the same limits and a bounded
// handshake.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/metrics/metrics.h"
#include "common/tokenizer/text_tokenizer.h"
#include "services/openai/coordinator_client.h"

namespace vc::openai {

struct GatewayOptions {
  std::string host = "127.0.0.1";  // address to bind
  int port = 8000;                 // 0 picks a free one (see Gateway::port)
  // The model id clients see in /v1/models and must send (or omit).
  std::string served_model_name = "vericache";
  int threads = 32;                 // requests handled at once (each holds one thread)
  int max_queued_connections = 64;  // accepted, waiting for a thread; beyond, accept waits
  int64_t max_body_bytes = int64_t{4} << 20;  // larger bodies get 413
  int64_t max_header_bytes = 64 << 10;         // request line + headers; beyond, 400
  int read_timeout_s = 30;          // a client stalled while sending its request
  int write_timeout_s = 30;         // a client that stops reading its response
  int idle_timeout_s = 15;          // keep-alive connection with no request
  int keep_alive_max_requests = 100;
  int request_timeout_s = 600;      // deadline of each coordinator call
  int retry_after_s = 1;            // Retry-After when the coordinator is full (429)
  int disconnect_poll_ms = 100;     // how often hung-up clients are looked for
  // HTTPS: PEM certificate chain and key (both or neither; neither: plain
  // HTTP). Re-read when they change; new connections get the new pair.
  std::string tls_cert;
  std::string tls_key;
  int tls_handshake_timeout_ms = 5000;  // a connection not through its handshake by then is dropped
  // Where the gateway's metrics go (vericache_openai_*); null: a private registry.
  metrics::Registry* registry = nullptr;
};

// What the gateway knows about the model (the checkpoint beside it).
struct GatewayModel {
  const TextTokenizer* tokenizer = nullptr;   // required
  const ChatTemplate* chat_template = nullptr;  // null: chat requests get 400
  // generation_config.json's EOS ids: generation stops at any of them. Empty:
  // the model's own EOS (the coordinator's default).
  std::vector<int32_t> eos_token_ids;
  // tokenizer_config.json's strings, given to the chat template.
  std::string bos_token;
  std::string eos_token;
};

class Gateway {
 public:
  // Binds and starts serving. `model`'s pointers and `client` must outlive
  // the gateway. InvalidArgument for bad options (a certificate or key that
  // does not load included), Unavailable if the bind fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gateway>> Start(const GatewayOptions& options,
                                                                     const GatewayModel& model,
                                                                     CoordinatorClient* client);
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  int port() const;
  // Certificate reloads since start (HTTPS; 0 for plain HTTP).
  int tls_reloads() const;
  // Stops accepting, cancels nothing itself (running requests finish or
  // their clients go), joins the threads. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vc::openai
