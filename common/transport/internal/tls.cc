#include "common/transport/internal/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"

namespace vc::transport::internal {
namespace {

std::string Asn1Utf8(const ASN1_STRING* s) {
  unsigned char* out = nullptr;
  const int n = ASN1_STRING_to_UTF8(&out, s);
  if (n < 0) return "";
  std::string text(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  OPENSSL_free(out);
  return text;
}

// A socket BIO that sends with MSG_NOSIGNAL: OpenSSL's own socket BIO uses
// write(), whose SIGPIPE on a peer that hung up would kill a process that
// did not ignore the signal (a library must not require that).
int SockFd(BIO* b) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b))); }

int SockWrite(BIO* b, const char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::send(SockFd(b), data, static_cast<size_t>(len), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(b);
  return static_cast<int>(n);
}

int SockRead(BIO* b, char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::recv(SockFd(b), data, static_cast<size_t>(len), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  return static_cast<int>(n);
}

long SockCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

const BIO_METHOD* SockMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "vc-socket");
    BIO_meth_set_write(m, &SockWrite);
    BIO_meth_set_read(m, &SockRead);
    BIO_meth_set_ctrl(m, &SockCtrl);
    return m;
  }();
  return method;
}

}  // namespace

BIO* NewSocketBio(int fd) {
  BIO* b = BIO_new(SockMethod());
  if (b == nullptr) return nullptr;
  BIO_set_data(b, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  BIO_set_init(b, 1);
  return b;
}

std::string TakeTlsErrors() {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!text.empty()) text += "; ";
    text += buf;
  }
  return text.empty() ? "no OpenSSL error" : text;
}

std::string TlsPeerIdentity(const SSL* ssl) { return CertIdentity(SSL_get0_peer_certificate(ssl)); }

std::string CertIdentity(X509* cert) {
  if (cert == nullptr) return "";
  const X509_NAME* subject = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at >= 0) {
    std::string cn = Asn1Utf8(X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at)));
    if (!cn.empty()) return "cert:" + cn;
  }
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  std::string identity;
  for (int i = 0; sans != nullptr && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
    if (name->type == GEN_DNS) {
      identity = "cert:" + Asn1Utf8(name->d.dNSName);
      break;
    }
  }
  GENERAL_NAMES_free(sans);
  return identity;
}

absl::StatusOr<std::shared_ptr<TlsContextSource>> TlsContextSource::Create(
    const DataPlaneTlsOptions& files, bool server) {
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "data plane TLS needs all three of cert_file, key_file and ca_file (or none)");
  }
  std::shared_ptr<TlsContextSource> source(new TlsContextSource(files, server));
  auto reloader = FileReloader<std::shared_ptr<SSL_CTX>>::Create(
      {{"data plane TLS certificate", files.cert_file},
       {"data plane TLS key", files.key_file},
       {"data plane TLS CA", files.ca_file}},
      [raw = source.get()] { return raw->Load(); });
  if (!reloader.ok()) return reloader.status();
  source->reloader_ = std::move(*reloader);
  return source;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> TlsContextSource::Load() const {
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(server_ ? TLS_server_method() : TLS_client_method()),
                               &SSL_CTX_free);
  if (ctx == nullptr) return absl::UnavailableError("data plane TLS: " + TakeTlsErrors());
  auto fail = [](const std::string& what) {
    return absl::UnavailableError(absl::StrCat("data plane TLS: ", what, ": ", TakeTlsErrors()));
  };
  SSL_CTX* c = ctx.get();
  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1) return fail("TLS 1.3");
  if (SSL_CTX_use_certificate_chain_file(c, files_.cert_file.c_str()) != 1) {
    return fail("certificate " + files_.cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(c, files_.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return fail("key " + files_.key_file);
  }
  if (SSL_CTX_check_private_key(c) != 1) return fail("key does not match the certificate");
  if (SSL_CTX_load_verify_locations(c, files_.ca_file.c_str(), nullptr) != 1) {
    return fail("CA " + files_.ca_file);
  }
  // Mutual: the server refuses a client without a certificate chaining to
  // the CA; the client refuses a server without one.
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | (server_ ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), nullptr);
  // No tickets or resumption: every connection presents and checks its
  // certificate, and no ticket bytes arrive unasked on an idle connection.
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // Non-blocking writes: a partial write returns its count, and a retry may
  // come from a different buffer position.
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

std::shared_ptr<SSL_CTX> TlsContextSource::Get() { return reloader_->Get(); }

int TlsContextSource::reloads() const { return reloader_->reloads(); }

}  // namespace vc::transport::internal
