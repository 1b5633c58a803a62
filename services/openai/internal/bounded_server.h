// cpp-httplib's Server with a bound on the request head. cpp-httplib 0.11
// limits each header line (8 KiB) but not their number: a client can send
// megabytes of header lines and the server keeps them all. This server runs
// httplib's own request processing (Server::process_request: every byte of
// HTTP is still parsed by the library) over a connection stream that counts
// what the library reads: at most `max_head_bytes` before the request's
// pre-routing handler runs (request line + headers), at most the body limit
// (+ chunk framing) after; a read past the budget fails, which httplib
// answers with 400 or by closing. It also knows each connection's socket,
// which the gateway uses to notice clients that hang up.
//
// With a TLS context the same stream runs over OpenSSL (HTTPS only): the
// handshake is bounded by `handshake_timeout_ms` on the worker thread that
// got the connection, so a client that connects and says nothing (or
// speaks plain HTTP) is dropped quickly; the head/body budgets count the
// decrypted bytes, exactly as over plain TCP. The process must ignore
// SIGPIPE (the daemons do): OpenSSL writes to the socket with write(2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/http/httplib.h"
#include "services/openai/internal/tls_context.h"

typedef struct ssl_st SSL;

namespace vc::openai::internal {

class BoundedServer : public httplib::Server {
 public:
  // `tls` null: plain HTTP.
  BoundedServer(size_t max_head_bytes, size_t max_body_bytes,
                std::shared_ptr<TlsServerContext> tls = nullptr, int handshake_timeout_ms = 5000)
      : max_head_bytes_(max_head_bytes),
        max_body_bytes_(max_body_bytes),
        tls_(std::move(tls)),
        handshake_timeout_ms_(handshake_timeout_ms) {}

  // Call from the pre-routing handler: the head has been read, the body
  // budget applies from now on. The socket of the connection being served
  // on this thread (-1 outside a request).
  static void HeadDone();
  static int CurrentSocket();

 private:
  bool process_and_close_socket(socket_t sock) override;
  // The server side of a TLS handshake on `sock` within the handshake
  // timeout; null (and the socket left to close) when it fails.
  std::unique_ptr<SSL, void (*)(SSL*)> Handshake(socket_t sock);
  const size_t max_head_bytes_;
  const size_t max_body_bytes_;
  const std::shared_ptr<TlsServerContext> tls_;
  const int handshake_timeout_ms_;
};

}  // namespace vc::openai::internal
