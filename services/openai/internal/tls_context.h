// The gateway's HTTPS identity: an OpenSSL server context built from a PEM
// certificate chain and key (vc-openai's --tls-cert/--tls-key), TLS 1.2 or
// later, no client certificate requested (HTTP callers present API keys).
// Public clients (SDKs, curl, browsers) still speak TLS 1.2, so unlike the
// data plane's mutual TLS 1.3 (common/transport) this one accepts both. The
// files are re-read when one of them changes (checked as each connection
// arrives), so a rotated certificate applies to new connections without a
// restart; a rotation that does not load keeps the last good context.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/file_reloader.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace vc::openai::internal {

class TlsServerContext {
 public:
  // InvalidArgument naming the flag if a file is missing, unreadable, not
  // PEM, or the key is not the certificate's.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<TlsServerContext>> Create(
      const std::string& cert_file, const std::string& key_file);
  // The context for a new connection (re-read first if the files changed).
  std::shared_ptr<SSL_CTX> Get();
  // Successful reloads after the first load.
  int reloads() const;

 private:
  TlsServerContext(std::string cert, std::string key)
      : cert_(std::move(cert)), key_(std::move(key)) {}
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Load() const;

  const std::string cert_;
  const std::string key_;
  std::unique_ptr<FileReloader<std::shared_ptr<SSL_CTX>>> reloader_;
};

}  // namespace vc::openai::internal
