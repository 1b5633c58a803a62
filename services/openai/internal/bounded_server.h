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
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/metrics/internal/httplib_wrapper.h"

namespace vc::openai::internal {

class BoundedServer : public httplib::Server {
 public:
  BoundedServer(size_t max_head_bytes, size_t max_body_bytes)
      : max_head_bytes_(max_head_bytes), max_body_bytes_(max_body_bytes) {}

  // Call from the pre-routing handler: the head has been read, the body
  // budget applies from now on. The socket of the connection being served
  // on this thread (-1 outside a request).
  static void HeadDone();
  static int CurrentSocket();

 private:
  bool process_and_close_socket(socket_t sock) override;
  const size_t max_head_bytes_;
  const size_t max_body_bytes_;
};

}  // namespace vc::openai::internal
