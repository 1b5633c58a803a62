// Test certificates made with the OpenSSL API: a throwaway CA and leaf
// certificates it signs (EC P-256, SANs IP:127.0.0.1 and DNS:localhost),
// written as PEM files into a directory. No gtest here (bench/ uses it too):
// a failure aborts with its reason.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/transport/data_plane.h"

namespace vc::transport::testing {

inline void CertCheck(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "test certificates: %s failed\n", what.c_str());
  std::abort();
}

class TestCa {
 public:
  // A self-signed CA named `name`.
  explicit TestCa(std::string name) : name_(std::move(name)) {
    key_ = NewKey();
    cert_ = NewCert(name_, key_, nullptr, nullptr, /*ca=*/true);
  }
  ~TestCa() {
    X509_free(cert_);
    EVP_PKEY_free(key_);
  }
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  void WriteCa(const std::string& path) const { WritePem(path, cert_, nullptr); }

  // A leaf with subject CN `cn` signed by this CA, as DataPlaneTlsOptions
  // (cert and key under `dir`, named after cn; the CA file is `ca_file`).
  DataPlaneTlsOptions Leaf(const std::string& dir, const std::string& cn,
                           const std::string& ca_file) const {
    EVP_PKEY* key = NewKey();
    X509* cert = NewCert(cn, key, cert_, key_, /*ca=*/false);
    DataPlaneTlsOptions o;
    o.cert_file = dir + "/" + cn + ".crt";
    o.key_file = dir + "/" + cn + ".key";
    o.ca_file = ca_file;
    WritePem(o.cert_file, cert, nullptr);
    WritePem(o.key_file, nullptr, key);
    X509_free(cert);
    EVP_PKEY_free(key);
    return o;
  }

 private:
  static EVP_PKEY* NewKey() {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    CertCheck(key != nullptr, "EC key generation");
    return key;
  }

  static void AddExt(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    CertCheck(ext != nullptr, "extension");
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }

  X509* NewCert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                bool ca) const {
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), ++serial_);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(cert, issuer != nullptr ? X509_get_subject_name(issuer) : name);
    X509* signer = issuer != nullptr ? issuer : cert;
    if (ca) {
      AddExt(cert, signer, NID_basic_constraints, "critical,CA:TRUE");
      AddExt(cert, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
      AddExt(cert, signer, NID_basic_constraints, "CA:FALSE");
      AddExt(cert, signer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
      AddExt(cert, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    }
    CertCheck(X509_sign(cert, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) > 0, "signing");
    return cert;
  }

  static void WritePem(const std::string& path, X509* cert, EVP_PKEY* key) {
    FILE* f = std::fopen(path.c_str(), "w");
    CertCheck(f != nullptr, "writing " + path);
    if (cert != nullptr) PEM_write_X509(f, cert);
    if (key != nullptr) PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
  }

  std::string name_;
  EVP_PKEY* key_ = nullptr;
  X509* cert_ = nullptr;
  mutable long serial_ = 0;
};

}  // namespace vc::transport::testing
