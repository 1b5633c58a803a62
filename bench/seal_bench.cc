// vc_seal_bench: what integrity and confidentiality cost per chunk, on one
// core: GB/s of SHA-256, HMAC-SHA256, AES-256-GCM, and of sealing (SHA-256 of
// the payload + one Ed25519 signature) and opening a seal (SHA-256 + one
// Ed25519 verification), for chunk-sized payloads, printed next to the fast
// link's rate (the paper's 40 GB/s by default; --fast-link-gbps). A figure
// below the link's rate means that many cores are needed to keep up with the
// link at full load (cores = link / figure). Time is the thread's CPU time,
// so other load on the machine does not lower the figures.
//
//   build/bin/vc_seal_bench [--sizes 262144,4194304,16777216] [--seconds 0.5]
//                           [--fast-link-gbps 40] [--quick]
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/kvstore/seal.h"

namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds this thread has used: "per core" figures that a loaded
// machine (other processes on the same cores) does not distort the way
// wall time would.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs `op` on `bytes` until `seconds` of this thread's CPU time pass (at
// least 3 times); GB per CPU second.
double Throughput(size_t bytes, double seconds, const std::function<void()>& op) {
  op();  // warm up
  int n = 0;
  const double start = ThreadCpuSeconds();
  double elapsed = 0;
  do {
    op();
    ++n;
    elapsed = ThreadCpuSeconds() - start;
  } while (elapsed < seconds || n < 3);
  return static_cast<double>(bytes) * n / elapsed / 1e9;
}

bool Check(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "vc_seal_bench: %s failed\n", what);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {size_t{256} << 10, size_t{4} << 20, size_t{16} << 20};
  double seconds = 0.5;
  double link_gbps = 40;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "vc_seal_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      sizes = {size_t{256} << 10};
      seconds = 0.05;
    } else if (a == "--seconds") {
      seconds = std::atof(next());
    } else if (a == "--fast-link-gbps") {
      link_gbps = std::atof(next());
    } else if (a == "--sizes") {
      sizes.clear();
      std::string list = next();
      size_t at = 0;
      while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const long long v = std::atoll(list.substr(at, comma - at).c_str());
        if (v <= 0) {
          std::fprintf(stderr, "vc_seal_bench: bad --sizes entry\n");
          return 2;
        }
        sizes.push_back(static_cast<size_t>(v));
        at = comma + 1;
      }
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: vc_seal_bench [--sizes N,N,...] [--seconds X] [--fast-link-gbps X] "
                  "[--quick]\n");
      return 0;
    } else {
      std::fprintf(stderr, "vc_seal_bench: unknown flag %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (!(seconds > 0) || !(link_gbps > 0)) {
    std::fprintf(stderr, "vc_seal_bench: --seconds and --fast-link-gbps must be > 0\n");
    return 2;
  }

  auto signer = vc::kvstore::SealSigner::Generate();
  if (!Check(signer.ok(), "key generation")) return 1;
  vc::kvstore::SealTrust trust;
  if (!Check(trust.Add((*signer)->PublicKeyHex()).ok(), "trust")) return 1;
  vc::kvstore::SealContext context;
  context.model_id.bytes.fill(0x5a);
  const std::string store_key(32, 'k');

  unsigned char mac_key[32], aes_key[32], iv[12];
  RAND_bytes(mac_key, sizeof(mac_key));
  RAND_bytes(aes_key, sizeof(aes_key));
  RAND_bytes(iv, sizeof(iv));
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!Check(hmac != nullptr, "HMAC fetch")) return 1;

  std::printf("# per core: GB per CPU second of this thread (1e9 bytes); fast link %.1f GB/s\n",
              link_gbps);
  std::printf("%-12s %-22s %10s %12s\n", "bytes", "operation", "GB/s", "cores/link");
  bool ok = true;
  for (size_t size : sizes) {
    std::string payload(size, '\0');
    RAND_bytes(reinterpret_cast<unsigned char*>(payload.data()), static_cast<int>(size));
    std::string sealed = *(*signer)->Seal(store_key, context, payload);
    std::vector<unsigned char> out(size + 32);

    struct Row {
      const char* name;
      std::function<void()> op;
    };
    std::vector<Row> rows;
    rows.push_back({"sha256", [&] {
                      unsigned int len = 0;
                      ok &= EVP_Digest(payload.data(), size, out.data(), &len, EVP_sha256(),
                                       nullptr) == 1;
                    }});
    rows.push_back({"hmac-sha256", [&] {
                      EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
                      OSSL_PARAM params[] = {
                          OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
                                                           const_cast<char*>("SHA256"), 0),
                          OSSL_PARAM_construct_end()};
                      size_t len = 0;
                      ok &= ctx != nullptr && EVP_MAC_init(ctx, mac_key, sizeof(mac_key), params) == 1 &&
                            EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(payload.data()),
                                           size) == 1 &&
                            EVP_MAC_final(ctx, out.data(), &len, 32) == 1;
                      EVP_MAC_CTX_free(ctx);
                    }});
    rows.push_back({"aes-256-gcm encrypt", [&] {
                      EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
                      int len = 0;
                      ok &= ctx != nullptr &&
                            EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, aes_key, iv) == 1 &&
                            EVP_EncryptUpdate(ctx, out.data(), &len,
                                              reinterpret_cast<const unsigned char*>(payload.data()),
                                              static_cast<int>(size)) == 1 &&
                            EVP_EncryptFinal_ex(ctx, out.data() + len, &len) == 1;
                      EVP_CIPHER_CTX_free(ctx);
                    }});
    rows.push_back({"seal (sign)", [&] {
                      ok &= (*signer)->Seal(store_key, context, payload).ok();
                    }});
    rows.push_back({"seal open (verify)", [&] {
                      ok &= trust.OpenFor(store_key, context, sealed).ok();
                    }});
    for (const Row& r : rows) {
      const double gbps = Throughput(size, seconds, r.op);
      std::printf("%-12zu %-22s %10.2f %12.1f\n", size, r.name, gbps, link_gbps / gbps);
    }
  }
  // The size-independent part: one Ed25519 signature / verification.
  const std::string tiny = "x";
  const std::string tiny_sealed = *(*signer)->Seal(store_key, context, tiny);
  auto per_op_us = [&](const std::function<void()>& op) {
    const int n = 2000;
    const double start = ThreadCpuSeconds();
    for (int i = 0; i < n; ++i) op();
    return (ThreadCpuSeconds() - start) * 1e6 / n;
  };
  std::printf("# ed25519 per entry: sign %.1f us, verify %.1f us\n",
              per_op_us([&] { ok &= (*signer)->Seal(store_key, context, tiny).ok(); }),
              per_op_us([&] { ok &= trust.Open(store_key, tiny_sealed).ok(); }));
  EVP_MAC_free(hmac);
  if (!Check(ok, "an operation")) return 1;
  return 0;
}
