// Internal: a streaming SHA-256 (OpenSSL EVP) with length-prefixed fields.
#pragma once

#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status_macros.h"

namespace vc::kvstore::internal {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    VC_CHECK(ctx_ != nullptr, "EVP_MD_CTX_new failed");
    VC_CHECK(EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1,
             "EVP_DigestInit_ex(sha256) failed");
  }
  // Raw bytes, no length prefix.
  void UpdateRaw(const void* data, size_t size) {
    if (size == 0) return;
    VC_CHECK(EVP_DigestUpdate(ctx_.get(), data, size) == 1, "EVP_DigestUpdate failed");
  }
  void U64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    UpdateRaw(b, 8);
  }
  // A field: its byte length (u64 little endian), then the bytes.
  void Field(const void* data, size_t size) {
    U64(size);
    UpdateRaw(data, size);
  }
  void Field(const std::string& s) { Field(s.data(), s.size()); }
  void FieldU64(uint64_t v) {
    U64(8);
    U64(v);
  }
  std::array<uint8_t, 32> Finish() {
    std::array<uint8_t, 32> out{};
    unsigned int len = 0;
    VC_CHECK(EVP_DigestFinal_ex(ctx_.get(), out.data(), &len) == 1 && len == 32,
             "EVP_DigestFinal_ex failed");
    return out;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

}  // namespace vc::kvstore::internal
