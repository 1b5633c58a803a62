#include "common/transport/internal/auth_stream.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/transport/internal/tls.h"

namespace vc::transport::internal {
namespace {

constexpr char kHelloMagic[4] = {'V', 'C', 'A', '1'};
constexpr uint32_t kMaxCertBytes = 16 << 10;    // a DER leaf certificate
constexpr uint32_t kMaxSignatureBytes = 1024;   // RSA-4096 is 512
constexpr uint32_t kMaxMessageBytes = 1 << 20;  // one authenticated message's payload
constexpr size_t kMacBytes = 32;
constexpr size_t kMessageHeaderBytes = 12;  // u32 length + u64 sequence

void PutU32(std::string* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

absl::Status AuthError(const std::string& what) {
  return absl::UnavailableError(absl::StrCat("data plane authentication: ", what));
}

struct Files {
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  X509_STORE* ca = nullptr;
  ~Files() {
    X509_free(cert);
    EVP_PKEY_free(key);
    X509_STORE_free(ca);
  }
};

absl::StatusOr<std::unique_ptr<Files>> LoadFiles(const DataPlaneTlsOptions& o) {
  auto f = std::make_unique<Files>();
  ERR_clear_error();
  if (FILE* in = std::fopen(o.cert_file.c_str(), "r")) {
    f->cert = PEM_read_X509(in, nullptr, nullptr, nullptr);
    std::fclose(in);
  }
  if (f->cert == nullptr) return AuthError("cannot read certificate " + o.cert_file);
  if (FILE* in = std::fopen(o.key_file.c_str(), "r")) {
    f->key = PEM_read_PrivateKey(in, nullptr, nullptr, nullptr);
    std::fclose(in);
  }
  if (f->key == nullptr) return AuthError("cannot read key " + o.key_file);
  if (X509_check_private_key(f->cert, f->key) != 1) {
    return AuthError("key does not match the certificate");
  }
  f->ca = X509_STORE_new();
  if (f->ca == nullptr || X509_STORE_load_file(f->ca, o.ca_file.c_str()) != 1) {
    return AuthError("cannot read CA " + o.ca_file);
  }
  ERR_clear_error();
  return f;
}

// HMAC-SHA256 of `parts` under `key`.
std::string Hmac(const std::string& key, std::initializer_list<std::string_view> parts) {
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t len = 0;
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                         OSSL_PARAM_construct_end()};
  EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params);
  for (std::string_view p : parts) {
    EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(p.data()), p.size());
  }
  EVP_MAC_final(ctx, out, &len, sizeof(out));
  EVP_MAC_CTX_free(ctx);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string Sha256(const std::string& data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return std::string(reinterpret_cast<char*>(out), sizeof(out));
}

class AuthStream : public ByteStream {
 public:
  AuthStream(std::unique_ptr<ByteStream> inner, DataPlaneTlsOptions files, bool server)
      : inner_(std::move(inner)), files_(std::move(files)), server_(server) {}

  // The handshake, within the deadline (the server runs it lazily, on its
  // first read, bounded by its handshake deadline).
  absl::Status DoHandshake(TimePoint deadline) {
    if (state_ == State::kDone) return absl::OkStatus();
    if (state_ == State::kFailed) return AuthError("handshake failed earlier");
    absl::Status s = RunHandshake(deadline);
    state_ = s.ok() ? State::kDone : State::kFailed;
    if (!s.ok()) inner_->Close();
    return s;
  }

  Handshake ContinueHandshake() override {
    // fd-less backends serve each connection in its own thread; the
    // handshake ran in that thread's first (deadline-bounded) read.
    if (state_ == State::kDone) return Handshake::kDone;
    return Handshake::kFailed;
  }
  std::string PeerIdentity() const override { return identity_; }
  bool HasBufferedBytes() const override { return plain_at_ < plain_.size(); }
  std::string PeerAddress() const override { return inner_->PeerAddress(); }
  void Close() override { inner_->Close(); }

  absl::StatusOr<size_t> ReadSome(char* buf, size_t max, TimePoint deadline) override {
    if (absl::Status s = DoHandshake(deadline); !s.ok()) return s;
    while (plain_at_ == plain_.size()) {
      if (absl::Status s = ReadMessage(deadline); !s.ok()) {
        inner_->Close();  // a forged, replayed or cut message: the stream is done
        return s;
      }
    }
    const size_t n = std::min(max, plain_.size() - plain_at_);
    std::memcpy(buf, plain_.data() + plain_at_, n);
    plain_at_ += n;
    return n;
  }

  absl::Status Write(std::string data, TimePoint deadline) override {
    if (absl::Status s = DoHandshake(deadline); !s.ok()) return s;
    size_t at = 0;
    while (at < data.size()) {
      const size_t n = std::min<size_t>(kMaxMessageBytes, data.size() - at);
      std::string header;
      PutU32(&header, static_cast<uint32_t>(n));
      PutU64(&header, send_seq_++);
      const std::string_view payload(data.data() + at, n);
      std::string message = header;
      message.append(payload);
      message += Hmac(send_key_, {header, payload});
      if (absl::Status s = inner_->Write(std::move(message), deadline); !s.ok()) return s;
      CountSent(n);
      at += n;
    }
    return absl::OkStatus();
  }

 private:
  enum class State { kNew, kDone, kFailed };

  absl::Status ReadExact(char* dst, size_t n, TimePoint deadline) {
    while (n > 0) {
      auto got = inner_->ReadSome(dst, n, deadline);
      if (!got.ok()) return got.status();
      dst += *got;
      n -= *got;
    }
    return absl::OkStatus();
  }

  absl::Status ReadMessage(TimePoint deadline) {
    char header[kMessageHeaderBytes];
    if (absl::Status s = ReadExact(header, sizeof(header), deadline); !s.ok()) return s;
    const uint32_t len = GetU32(header);
    const uint64_t seq = GetU64(header + 4);
    if (len > kMaxMessageBytes) {
      return AuthError(absl::StrCat("message of ", len, " bytes exceeds ", kMaxMessageBytes));
    }
    if (seq != recv_seq_) {
      return AuthError(absl::StrCat("message sequence ", seq, ", expected ", recv_seq_,
                                    " (replayed, dropped or reordered)"));
    }
    std::string body(len + kMacBytes, '\0');
    if (absl::Status s = ReadExact(body.data(), body.size(), deadline); !s.ok()) return s;
    const std::string mac = Hmac(recv_key_, {std::string_view(header, sizeof(header)),
                                             std::string_view(body.data(), len)});
    if (CRYPTO_memcmp(mac.data(), body.data() + len, kMacBytes) != 0) {
      return AuthError(absl::StrCat("message ", seq, " fails its MAC"));
    }
    ++recv_seq_;
    body.resize(len);
    plain_ = std::move(body);
    plain_at_ = 0;
    return absl::OkStatus();
  }

  // hello = magic | role | u32 cert_len | cert DER | nonce(32) | x25519 pub(32)
  absl::Status RunHandshake(TimePoint deadline) {
    auto files = LoadFiles(files_);
    if (!files.ok()) return files.status();
    // The ephemeral key of this connection.
    EVP_PKEY* eph = EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519");
    if (eph == nullptr) return AuthError("X25519 key generation: " + TakeTlsErrors());
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> eph_owner(eph, &EVP_PKEY_free);
    unsigned char eph_pub[32];
    size_t eph_len = sizeof(eph_pub);
    EVP_PKEY_get_raw_public_key(eph, eph_pub, &eph_len);
    unsigned char nonce[32];
    if (RAND_bytes(nonce, sizeof(nonce)) != 1) return AuthError("no randomness");
    unsigned char* der = nullptr;
    const int der_len = i2d_X509((*files)->cert, &der);
    if (der_len <= 0) return AuthError("cannot encode the certificate");
    std::string mine(kHelloMagic, 4);
    mine.push_back(server_ ? 'S' : 'C');
    PutU32(&mine, static_cast<uint32_t>(der_len));
    mine.append(reinterpret_cast<char*>(der), static_cast<size_t>(der_len));
    OPENSSL_free(der);
    mine.append(reinterpret_cast<char*>(nonce), sizeof(nonce));
    mine.append(reinterpret_cast<char*>(eph_pub), sizeof(eph_pub));
    if (absl::Status s = inner_->Write(mine, deadline); !s.ok()) return s;

    // The peer's hello, bounded before allocation.
    char head[9];
    if (absl::Status s = ReadExact(head, sizeof(head), deadline); !s.ok()) return s;
    if (std::memcmp(head, kHelloMagic, 4) != 0 || head[4] != (server_ ? 'C' : 'S')) {
      return AuthError("the peer did not send an authentication hello");
    }
    const uint32_t cert_len = GetU32(head + 5);
    if (cert_len == 0 || cert_len > kMaxCertBytes) {
      return AuthError(absl::StrCat("peer certificate of ", cert_len, " bytes"));
    }
    std::string theirs(head, sizeof(head));
    theirs.resize(sizeof(head) + cert_len + 64);
    if (absl::Status s = ReadExact(theirs.data() + sizeof(head), cert_len + 64, deadline); !s.ok()) {
      return s;
    }
    const auto* p = reinterpret_cast<const unsigned char*>(theirs.data() + sizeof(head));
    std::unique_ptr<X509, decltype(&X509_free)> peer(d2i_X509(nullptr, &p, cert_len), &X509_free);
    if (peer == nullptr) return AuthError("peer certificate does not parse");
    // It must chain to the cluster CA.
    {
      X509_STORE_CTX* vctx = X509_STORE_CTX_new();
      X509_STORE_CTX_init(vctx, (*files)->ca, peer.get(), nullptr);
      const int ok = X509_verify_cert(vctx);
      const int err = X509_STORE_CTX_get_error(vctx);
      X509_STORE_CTX_free(vctx);
      if (ok != 1) {
        return AuthError(absl::StrCat("peer certificate: ", X509_verify_cert_error_string(err)));
      }
    }
    const std::string& client_hello = server_ ? theirs : mine;
    const std::string& server_hello = server_ ? mine : theirs;
    const std::string transcript = Sha256(absl::StrCat("vc-dp-auth-v1", client_hello, server_hello));

    // Proof of possession: sign (role, transcript) with the certificate's key.
    auto sign_input = [&](char role) { return absl::StrCat("vc-dp-auth-v1 sign ", std::string(1, role), transcript); };
    std::string sig;
    {
      EVP_MD_CTX* md = EVP_MD_CTX_new();
      const std::string in = sign_input(server_ ? 'S' : 'C');
      const EVP_MD* hash = EVP_PKEY_get_id((*files)->key) == EVP_PKEY_ED25519 ? nullptr : EVP_sha256();
      size_t sig_len = 0;
      bool ok = EVP_DigestSignInit(md, nullptr, hash, nullptr, (*files)->key) == 1 &&
                EVP_DigestSign(md, nullptr, &sig_len,
                               reinterpret_cast<const unsigned char*>(in.data()), in.size()) == 1;
      if (ok) {
        sig.resize(sig_len);
        ok = EVP_DigestSign(md, reinterpret_cast<unsigned char*>(sig.data()), &sig_len,
                            reinterpret_cast<const unsigned char*>(in.data()), in.size()) == 1;
        sig.resize(sig_len);
      }
      EVP_MD_CTX_free(md);
      if (!ok) return AuthError("signing: " + TakeTlsErrors());
    }
    std::string sig_msg;
    PutU32(&sig_msg, static_cast<uint32_t>(sig.size()));
    sig_msg += sig;
    if (absl::Status s = inner_->Write(sig_msg, deadline); !s.ok()) return s;
    char len_bytes[4];
    if (absl::Status s = ReadExact(len_bytes, 4, deadline); !s.ok()) return s;
    const uint32_t peer_sig_len = GetU32(len_bytes);
    if (peer_sig_len == 0 || peer_sig_len > kMaxSignatureBytes) {
      return AuthError(absl::StrCat("peer signature of ", peer_sig_len, " bytes"));
    }
    std::string peer_sig(peer_sig_len, '\0');
    if (absl::Status s = ReadExact(peer_sig.data(), peer_sig.size(), deadline); !s.ok()) return s;
    {
      EVP_PKEY* peer_key = X509_get0_pubkey(peer.get());
      if (peer_key == nullptr) return AuthError("peer certificate has no usable key");
      const std::string in = sign_input(server_ ? 'C' : 'S');
      const EVP_MD* hash = EVP_PKEY_get_id(peer_key) == EVP_PKEY_ED25519 ? nullptr : EVP_sha256();
      EVP_MD_CTX* md = EVP_MD_CTX_new();
      const bool ok =
          EVP_DigestVerifyInit(md, nullptr, hash, nullptr, peer_key) == 1 &&
          EVP_DigestVerify(md, reinterpret_cast<const unsigned char*>(peer_sig.data()),
                           peer_sig.size(), reinterpret_cast<const unsigned char*>(in.data()),
                           in.size()) == 1;
      EVP_MD_CTX_free(md);
      ERR_clear_error();
      if (!ok) return AuthError("the peer's signature does not verify (not its certificate's key)");
    }

    // Session keys: the X25519 secret, bound to the transcript.
    const auto* peer_pub =
        reinterpret_cast<const unsigned char*>(theirs.data() + sizeof(head) + cert_len + 32);
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> peer_eph(
        EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_pub, 32), &EVP_PKEY_free);
    if (peer_eph == nullptr) return AuthError("peer ephemeral key does not parse");
    std::string secret(32, '\0');
    {
      EVP_PKEY_CTX* dctx = EVP_PKEY_CTX_new(eph, nullptr);
      size_t secret_len = secret.size();
      const bool ok = dctx != nullptr && EVP_PKEY_derive_init(dctx) == 1 &&
                      EVP_PKEY_derive_set_peer(dctx, peer_eph.get()) == 1 &&
                      EVP_PKEY_derive(dctx, reinterpret_cast<unsigned char*>(secret.data()),
                                      &secret_len) == 1;
      EVP_PKEY_CTX_free(dctx);
      if (!ok) return AuthError("key agreement: " + TakeTlsErrors());
    }
    const std::string c2s = Hmac(secret, {"vc-dp-auth-v1 c2s", transcript});
    const std::string s2c = Hmac(secret, {"vc-dp-auth-v1 s2c", transcript});
    send_key_ = server_ ? s2c : c2s;
    recv_key_ = server_ ? c2s : s2c;
    OPENSSL_cleanse(secret.data(), secret.size());
    identity_ = CertIdentity(peer.get());
    return absl::OkStatus();
  }

  std::unique_ptr<ByteStream> inner_;
  const DataPlaneTlsOptions files_;
  const bool server_;
  State state_ = State::kNew;
  std::string send_key_, recv_key_;
  uint64_t send_seq_ = 0, recv_seq_ = 0;
  std::string plain_;  // the current message's payload
  size_t plain_at_ = 0;
  std::string identity_;
};

class AuthListener : public Listener {
 public:
  AuthListener(std::unique_ptr<Listener> inner, DataPlaneTlsOptions files)
      : inner_(std::move(inner)), files_(std::move(files)) {}
  absl::StatusOr<std::unique_ptr<ByteStream>> Accept(std::chrono::milliseconds wait) override {
    auto s = inner_->Accept(wait);
    if (!s.ok() || *s == nullptr) return s;
    return AuthServerStream(std::move(*s), files_);
  }
  std::string address() const override { return inner_->address(); }

 private:
  std::unique_ptr<Listener> inner_;
  const DataPlaneTlsOptions files_;
};

class AuthConnector : public Connector {
 public:
  AuthConnector(std::unique_ptr<Connector> inner, DataPlaneTlsOptions files)
      : inner_(std::move(inner)), files_(std::move(files)) {}
  absl::StatusOr<std::unique_ptr<ByteStream>> Connect(TimePoint deadline) override {
    auto s = inner_->Connect(deadline);
    if (!s.ok()) return s.status();
    return AuthClientStream(std::move(*s), files_, deadline);
  }

 private:
  std::unique_ptr<Connector> inner_;
  const DataPlaneTlsOptions files_;
};

}  // namespace

std::unique_ptr<ByteStream> AuthServerStream(std::unique_ptr<ByteStream> inner,
                                             const DataPlaneTlsOptions& files) {
  return std::make_unique<AuthStream>(std::move(inner), files, /*server=*/true);
}

absl::StatusOr<std::unique_ptr<ByteStream>> AuthClientStream(std::unique_ptr<ByteStream> inner,
                                                             const DataPlaneTlsOptions& files,
                                                             TimePoint deadline) {
  auto stream = std::make_unique<AuthStream>(std::move(inner), files, /*server=*/false);
  if (absl::Status s = stream->DoHandshake(deadline); !s.ok()) return s;
  return std::unique_ptr<ByteStream>(std::move(stream));
}

absl::StatusOr<std::unique_ptr<Listener>> WrapAuthListener(std::unique_ptr<Listener> inner,
                                                           const DataPlaneTlsOptions& files) {
  if (auto f = LoadFiles(files); !f.ok()) return f.status();
  return std::unique_ptr<Listener>(new AuthListener(std::move(inner), files));
}

absl::StatusOr<std::unique_ptr<Connector>> WrapAuthConnector(std::unique_ptr<Connector> inner,
                                                             const DataPlaneTlsOptions& files) {
  if (auto f = LoadFiles(files); !f.ok()) return f.status();
  return std::unique_ptr<Connector>(new AuthConnector(std::move(inner), files));
}

}  // namespace vc::transport::internal
