#include "services/local/cluster_credentials.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <functional>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace vc::local {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct ExtFree {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;

absl::Status SslError(const std::string& what) {
  char buf[256] = "unknown error";
  const unsigned long e = ERR_get_error();
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", buf));
}

absl::StatusOr<std::string> RandomHex(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) != 1) {
    return SslError("RAND_bytes");
  }
  return absl::BytesToHexString(raw);
}

// Creates `path` with mode 0600 (secrets and keys are never world-readable,
// not even for a moment) and writes `data`.
absl::Status WritePrivate(const std::string& path, const std::string& data) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n <= 0) {
      close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", path));
    }
    off += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Pem(const std::function<int(BIO*)>& write) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || write(bio.get()) != 1) return SslError("PEM encoding");
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(len));
}

absl::StatusOr<Pkey> NewKey() {
  Pkey key(EVP_EC_gen("P-256"));
  if (key == nullptr) return SslError("EC key generation");
  return key;
}

absl::Status AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, ExtFree> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return SslError(absl::StrCat("certificate extension ", value));
  }
  return absl::OkStatus();
}

// A certificate for `key` named `cn`, signed by (issuer, issuer_key), or
// self-signed when issuer is null. Valid from an hour ago for 30 days.
absl::StatusOr<Cert> NewCert(EVP_PKEY* key, const std::string& cn, X509* issuer,
                             EVP_PKEY* issuer_key, bool ca) {
  Cert cert(X509_new());
  if (cert == nullptr) return SslError("X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) return SslError("RAND_bytes");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  if (bn == nullptr || BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) == nullptr) {
    BN_free(bn);
    return SslError("serial number");
  }
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 30L * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("VeriCache local"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  absl::Status s = AddExt(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (s.ok()) s = AddExt(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  if (ca) {
    if (s.ok()) s = AddExt(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    if (s.ok()) s = AddExt(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    if (s.ok()) s = AddExt(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    if (s.ok()) s = AddExt(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyAgreement");
    if (s.ok()) s = AddExt(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
    if (s.ok()) s = AddExt(cert.get(), signer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  }
  if (!s.ok()) return s;
  if (X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) <= 0) {
    return SslError("signing the certificate");
  }
  return cert;
}

absl::Status WriteCert(const std::string& path, X509* cert) {
  absl::StatusOr<std::string> pem = Pem([&](BIO* b) { return PEM_write_bio_X509(b, cert); });
  if (!pem.ok()) return pem.status();
  return WritePrivate(path, *pem);
}

absl::Status WriteKey(const std::string& path, EVP_PKEY* key) {
  absl::StatusOr<std::string> pem = Pem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
  if (!pem.ok()) return pem.status();
  return WritePrivate(path, *pem);
}

// A leaf certificate `name` (subject CN `cn`) signed by the CA: writes
// NAME.crt and NAME.key.
absl::StatusOr<rpc::TlsFiles> Leaf(const std::string& dir, const std::string& name,
                                   const std::string& cn, X509* ca, EVP_PKEY* ca_key,
                                   const std::string& ca_path) {
  absl::StatusOr<Pkey> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<Cert> cert = NewCert(key->get(), cn, ca, ca_key, false);
  if (!cert.ok()) return cert.status();
  rpc::TlsFiles f;
  f.cert = dir + "/" + name + ".crt";
  f.key = dir + "/" + name + ".key";
  f.ca = ca_path;
  if (absl::Status s = WriteCert(f.cert, cert->get()); !s.ok()) return s;
  if (absl::Status s = WriteKey(f.key, key->get()); !s.ok()) return s;
  return f;
}

}  // namespace

absl::StatusOr<ClusterCredentials> MakeClusterCredentials(const std::string& dir) {
  ClusterCredentials out;
  absl::StatusOr<Pkey> ca_key = NewKey();
  if (!ca_key.ok()) return ca_key.status();
  absl::StatusOr<Cert> ca = NewCert(ca_key->get(), "vericache-local-ca", nullptr, nullptr, true);
  if (!ca.ok()) return ca.status();
  out.ca = dir + "/ca.crt";
  if (absl::Status s = WriteCert(out.ca, ca->get()); !s.ok()) return s;
  // The CA key is not written: nothing after this call signs with it.
  absl::StatusOr<rpc::TlsFiles> daemon =
      Leaf(dir, "daemon", "vericache-daemon", ca->get(), ca_key->get(), out.ca);
  if (!daemon.ok()) return daemon.status();
  out.daemon = *daemon;
  absl::StatusOr<rpc::TlsFiles> client =
      Leaf(dir, "client", "vericache-client", ca->get(), ca_key->get(), out.ca);
  if (!client.ok()) return client.status();
  out.client = *client;
  std::string keys;
  for (const char* tenant : {"tenant-a", "tenant-b"}) {
    absl::StatusOr<std::string> key = RandomHex(24);
    if (!key.ok()) return key.status();
    out.api_keys[tenant] = "vc-" + *key;
    absl::StrAppend(&keys, tenant, " ", out.api_keys[tenant], "\n");
    // The tenant's client certificate: its CN is the tenant's name.
    absl::StatusOr<rpc::TlsFiles> cert = Leaf(dir, tenant, tenant, ca->get(), ca_key->get(), out.ca);
    if (!cert.ok()) return cert.status();
    out.tenant_certs[tenant] = *cert;
  }
  out.api_keys_file = dir + "/api_keys";
  if (absl::Status s = WritePrivate(out.api_keys_file, keys); !s.ok()) return s;
  absl::StatusOr<std::string> secret = RandomHex(32);
  if (!secret.ok()) return secret.status();
  out.cluster_secret_file = dir + "/cluster_secret";
  if (absl::Status s = WritePrivate(out.cluster_secret_file, *secret + "\n"); !s.ok()) return s;
  return out;
}

}  // namespace vc::local
