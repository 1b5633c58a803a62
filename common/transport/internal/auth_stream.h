// Authentication for backends without TLS (UCX): a ByteStream decorator.
//
// Handshake (before any request byte): each side sends a hello (its
// certificate, DER; a fresh 32-byte nonce; an ephemeral X25519 public key),
// then a signature with its certificate's private key over the transcript
// hash (both hellos and its role), so each proves possession of its key for
// this very connection. Each checks the peer's certificate chains to the CA
// and the signature, then both derive per-direction session keys from the
// X25519 secret and the transcript. After it every message is
// [u32 length][u64 sequence][payload][HMAC-SHA256 over the three], lengths
// bounded before allocation; a wrong MAC or an unexpected sequence number
// (a replay, a drop, a reorder) fails the stream, and the server closes it.
// Integrity and authenticity only: the payload is not encrypted.
#pragma once

#include <memory>

#include "common/transport/data_plane.h"
#include "common/transport/internal/stream.h"

namespace vc::transport::internal {

// A listener whose streams authenticate (server side) with `files`. The
// certificate files are read per connection, so a rotation applies to the
// next one. InvalidArgument/Unavailable if the files do not load now.
absl::StatusOr<std::unique_ptr<Listener>> WrapAuthListener(std::unique_ptr<Listener> inner,
                                                           const DataPlaneTlsOptions& files);
// A connector whose streams authenticate (client side) within Connect's
// deadline.
absl::StatusOr<std::unique_ptr<Connector>> WrapAuthConnector(std::unique_ptr<Connector> inner,
                                                             const DataPlaneTlsOptions& files);

// For tests: the two ends over any pair of connected streams.
std::unique_ptr<ByteStream> AuthServerStream(std::unique_ptr<ByteStream> inner,
                                             const DataPlaneTlsOptions& files);
absl::StatusOr<std::unique_ptr<ByteStream>> AuthClientStream(std::unique_ptr<ByteStream> inner,
                                                             const DataPlaneTlsOptions& files,
                                                             TimePoint deadline);

}  // namespace vc::transport::internal
