// TLS for the "tcp" data plane backend (OpenSSL, TLS 1.3 only, mutual): the
// certificate, key and CA come from the same three files as the daemons'
// gRPC mutual TLS (--tls-cert, --tls-key, --tls-ca). A context source
// re-reads them when one of their mtimes changes, so rotated certificates
// apply to new connections without a restart.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/file_reloader.h"
#include "common/transport/data_plane.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
typedef struct bio_st BIO;
typedef struct x509_st X509;

namespace vc::transport::internal {

// A BIO over a connected (non-blocking) socket that never raises SIGPIPE;
// it does not own fd. nullptr if OpenSSL cannot allocate it.
BIO* NewSocketBio(int fd);

// OpenSSL's error queue of this thread as text (emptied), for messages.
std::string TakeTlsErrors();

// The authenticated identity of a TLS peer: "cert:" + the subject CN of its
// (verified) certificate, else "cert:" + its first DNS SAN; "" if none.
std::string TlsPeerIdentity(const SSL* ssl);
// The same for a (verified) certificate.
std::string CertIdentity(X509* cert);

class TlsContextSource {
 public:
  // InvalidArgument unless all three files are named; Unavailable if they
  // cannot be read or do not fit (the key is not the certificate's).
  static absl::StatusOr<std::shared_ptr<TlsContextSource>> Create(const DataPlaneTlsOptions& files,
                                                                  bool server);
  // The context for a new connection. Re-reads the files if one of them
  // changed since the last read; a reload that fails keeps the last good
  // context (a half-written rotation must not take the data plane down).
  std::shared_ptr<SSL_CTX> Get();
  // Successful reloads after the first load (for tests and logs).
  int reloads() const;

 private:
  TlsContextSource(DataPlaneTlsOptions files, bool server)
      : files_(std::move(files)), server_(server) {}
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Load() const;

  const DataPlaneTlsOptions files_;
  const bool server_;
  std::unique_ptr<FileReloader<std::shared_ptr<SSL_CTX>>> reloader_;
};

}  // namespace vc::transport::internal
