// vc_seal_bench: what integrity and confidentiality cost per chunk, on one
// core: GB/s of SHA-256, HMAC-SHA256, AES-256-GCM, and of what a sealed entry
// costs its writer and its reader, for chunk-sized payloads, printed next to
// the fast link's rate (the paper's 40 GB/s by default; --fast-link-gbps). A
// figure below the link's rate means that many cores are needed to keep up
// with the link at full load (cores = link / figure). Time is the thread's
// CPU time, so other load on the machine does not lower the figures.
//
// Seal rows, per entry that already ends in its SHA-256 checksum (as the
// codecs write it, and as the writer has just computed it):
//   v2 seal    SealSigner::Seal today: one Ed25519 signature over a small
//              statement holding the checksum, appended in place.
//   v2 read    what a reader does today: SealTrust::Open (recomputes the
//              checksum: one SHA-256 pass; checks the signature) and nothing
//              more (the codec skips its checksum: kAlreadyRecomputed).
//   v1 seal    what seal version 1 cost (the same primitives): a copy of the
//              entry (PutAll passed one), a SHA-256 pass over it, a signature.
//   v1 read    what a version-1 reader did: the seal's SHA-256 pass and the
//              codec's checksum pass (two passes), and the signature check.
// The reader's signature check is remembered after the first open of an
// entry (SealTrust), as in a verifier reloading a prefix; the per-entry
// Ed25519 costs are printed separately at the end.
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
        if (v <= 32) {  // an entry ends in its 32-byte checksum
          std::fprintf(stderr, "vc_seal_bench: bad --sizes entry (each must be > 32)\n");
          return 2;
        }
        sizes.push_back(static_cast<size_t>(v));
        at = comma + 1;
      }
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: vc_seal_bench [--sizes N,N,...] [--seconds X] [--fast-link-gbps X] "
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
  std::printf("%-12s %-24s %10s %12s\n", "bytes", "operation", "GB/s", "cores/link");
  bool ok = true;
  for (size_t size : sizes) {
    // An entry as the codecs write it: body, then SHA-256 of the body, with
    // room reserved for the seal.
    std::string payload(size - 32, '\0');
    RAND_bytes(reinterpret_cast<unsigned char*>(payload.data()), static_cast<int>(size - 32));
    std::vector<unsigned char> out(size + 32);
    {
      unsigned int len = 0;
      EVP_Digest(payload.data(), payload.size(), out.data(), &len, EVP_sha256(), nullptr);
      payload.append(reinterpret_cast<const char*>(out.data()), 32);
    }
    std::string sealed = payload;
    if (!Check((*signer)->Seal(store_key, context, &sealed).ok(), "seal")) return 1;
    // Reused: sealed in place, as PutAll seals a moved-in codec output.
    std::string entry;
    entry.reserve(size + vc::kvstore::kSealTrailerMaxBytes);
    entry.assign(payload);

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
    rows.push_back(
        {"hmac-sha256", [&] {
           EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
           OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
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
                      ok &=
                          ctx != nullptr &&
                          EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, aes_key, iv) == 1 &&
                          EVP_EncryptUpdate(ctx, out.data(), &len,
                                            reinterpret_cast<const unsigned char*>(payload.data()),
                                            static_cast<int>(size)) == 1 &&
                          EVP_EncryptFinal_ex(ctx, out.data() + len, &len) == 1;
                      EVP_CIPHER_CTX_free(ctx);
                    }});
    rows.push_back({"v2 seal (sign)", [&] {
                      entry.resize(size);  // drop the last trailer; no payload byte written
                      ok &= (*signer)->Seal(store_key, context, &entry).ok();
                    }});
    rows.push_back(
        {"v2 read (open)", [&] { ok &= trust.OpenFor(store_key, context, sealed).ok(); }});
    rows.push_back({"v1 seal (copy+sha+sign)", [&] {
                      std::string copy = payload;
                      unsigned int len = 0;
                      ok &= EVP_Digest(copy.data(), copy.size(), out.data(), &len, EVP_sha256(),
                                       nullptr) == 1;
                      // The signature over a statement holding a digest,
                      // appended past the copy's end (v1 reallocated too).
                      ok &= (*signer)->Seal(store_key, context, &copy).ok();
                    }});
    rows.push_back({"v1 read (2 x sha+open)", [&] {
                      unsigned int len = 0;
                      ok &= EVP_Digest(sealed.data(), size, out.data(), &len, EVP_sha256(),
                                       nullptr) == 1;
                      ok &= trust.OpenFor(store_key, context, sealed).ok();
                    }});
    for (const Row& r : rows) {
      const double gbps = Throughput(size, seconds, r.op);
      std::printf("%-12zu %-24s %10.2f %12.1f\n", size, r.name, gbps, link_gbps / gbps);
    }
  }
  // The size-independent part: one Ed25519 signature / verification, on an
  // entry with an empty body (its checksum is SHA-256 of nothing). A fresh
  // store key per verification, so none is remembered.
  std::string tiny(32, '\0');
  {
    unsigned int len = 0;
    EVP_Digest("", 0, reinterpret_cast<unsigned char*>(tiny.data()), &len, EVP_sha256(), nullptr);
  }
  constexpr int kOps = 2000;
  std::vector<std::string> tiny_keys, tiny_sealed;
  for (int i = 0; i < kOps; ++i) {
    tiny_keys.push_back(store_key + std::to_string(i));
    tiny_sealed.push_back(tiny);
    ok &= (*signer)->Seal(tiny_keys.back(), context, &tiny_sealed.back()).ok();
  }
  auto per_op_us = [&](const std::function<void(int)>& op) {
    const double start = ThreadCpuSeconds();
    for (int i = 0; i < kOps; ++i) op(i);
    return (ThreadCpuSeconds() - start) * 1e6 / kOps;
  };
  std::string tiny_entry;
  std::printf("# ed25519 per entry: sign %.1f us, verify %.1f us\n", per_op_us([&](int) {
                tiny_entry = tiny;
                ok &= (*signer)->Seal(store_key, context, &tiny_entry).ok();
              }),
              per_op_us([&](int i) { ok &= trust.Open(tiny_keys[i], tiny_sealed[i]).ok(); }));
  EVP_MAC_free(hmac);
  if (!Check(ok, "an operation")) return 1;
  return 0;
}
