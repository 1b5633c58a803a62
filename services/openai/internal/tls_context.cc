#include "services/openai/internal/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <optional>

#include "absl/strings/str_cat.h"

namespace vc::openai::internal {
namespace {

std::string TakeErrors() {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!text.empty()) text += "; ";
    text += buf;
  }
  return text.empty() ? "no OpenSSL error" : text;
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsServerContext>> TlsServerContext::Create(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  std::shared_ptr<TlsServerContext> source(new TlsServerContext(cert_file, key_file));
  auto reloader = FileReloader<std::shared_ptr<SSL_CTX>>::Create(
      {{"--tls-cert", cert_file}, {"--tls-key", key_file}},
      [raw = source.get()] { return raw->Load(); });
  if (!reloader.ok()) return absl::InvalidArgumentError(reloader.status().message());
  source->reloader_ = std::move(*reloader);
  return source;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> TlsServerContext::Load() const {
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), &SSL_CTX_free);
  auto fail = [](const std::string& what) {
    return absl::UnavailableError(absl::StrCat("HTTPS: ", what, ": ", TakeErrors()));
  };
  if (ctx == nullptr) return fail("SSL_CTX_new");
  SSL_CTX* c = ctx.get();
  if (SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION) != 1) return fail("TLS 1.2");
  if (SSL_CTX_use_certificate_chain_file(c, cert_.c_str()) != 1) return fail("--tls-cert " + cert_);
  if (SSL_CTX_use_PrivateKey_file(c, key_.c_str(), SSL_FILETYPE_PEM) != 1)
    return fail("--tls-key " + key_);
  if (SSL_CTX_check_private_key(c) != 1) return fail("--tls-key does not match --tls-cert");
  SSL_CTX_set_verify(c, SSL_VERIFY_NONE, nullptr);  // callers authenticate with API keys
  // A client-started renegotiation is extra handshake work a peer could
  // repeat without bound; no HTTP client needs it.
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  // No resumption state: every connection is a full handshake against the
  // current certificate, and nothing is cached per client.
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

std::shared_ptr<SSL_CTX> TlsServerContext::Get() { return reloader_->Get(); }

int TlsServerContext::reloads() const { return reloader_->reloads(); }

}  // namespace vc::openai::internal
