#include "services/coordinator/tenant_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/file_stamp.h"
#include "nlohmann/json.hpp"

namespace vc::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
using Hash = std::array<unsigned char, SHA256_DIGEST_LENGTH>;

// Bounds on what a keys file and a caller may hold; a presented key longer
// than kMaxKeyBytes is refused without hashing it.
constexpr size_t kMaxTenantBytes = 64;
constexpr size_t kMinKeyBytes = 16;
constexpr size_t kMaxKeyBytes = 256;
constexpr size_t kMaxKeysFileBytes = 4 << 20;
constexpr size_t kMaxKeys = 100000;

Hash Sha256(absl::string_view s) {
  Hash h;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), h.data());
  return h;
}

struct Entry {
  Hash hash;
  std::string tenant;
};

absl::StatusOr<FileStamp> Stamp(const std::string& path) {
  std::optional<FileStamp> stamp = StampFile(path);
  if (!stamp) return absl::NotFoundError(absl::StrCat("--api-keys-file ", path, ": cannot stat"));
  return *stamp;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& flag, const std::string& path,
                                          size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read"));
  std::string data;
  data.resize(limit + 1);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": larger than the limit of ", limit, " bytes"));
  }
  return data;
}

bool ValidTenant(absl::string_view t) {
  if (t.empty() || t.size() > kMaxTenantBytes) return false;
  for (char c : t) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

bool ValidKey(absl::string_view k) {
  if (k.size() < kMinKeyBytes || k.size() > kMaxKeyBytes) return false;
  for (char c : k) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// Errors name the line or tenant, never the key.
absl::Status AddKey(const std::string& where, const std::string& tenant, const std::string& key,
                    std::vector<Entry>* out) {
  if (!ValidTenant(tenant)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--api-keys-file ", where, ": a tenant name is 1..", kMaxTenantBytes,
        " characters of [A-Za-z0-9._-]"));
  }
  if (!ValidKey(key)) {
    return absl::InvalidArgumentError(absl::StrCat("--api-keys-file ", where, ": a key is ",
                                                   kMinKeyBytes, "..", kMaxKeyBytes,
                                                   " printable characters without spaces"));
  }
  if (out->size() >= kMaxKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-keys-file: more than ", kMaxKeys, " keys"));
  }
  const Hash h = Sha256(key);
  for (const Entry& e : *out) {
    if (e.hash == h) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-keys-file ", where, ": a key is listed twice"));
    }
  }
  out->push_back(Entry{h, tenant});
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Entry>> ParseKeys(const std::string& text) {
  std::vector<Entry> out;
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (!trimmed.empty() && trimmed.front() == '{') {
    const nlohmann::json j = nlohmann::json::parse(trimmed, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError("--api-keys-file: not a JSON object");
    }
    for (const auto& [tenant, v] : j.items()) {
      if (v.is_string()) {
        if (absl::Status s = AddKey("tenant entry", tenant, v.get<std::string>(), &out); !s.ok()) {
          return s;
        }
      } else if (v.is_array()) {
        for (const auto& k : v) {
          if (!k.is_string()) {
            return absl::InvalidArgumentError("--api-keys-file: keys must be strings");
          }
          if (absl::Status s = AddKey("tenant entry", tenant, k.get<std::string>(), &out);
              !s.ok()) {
            return s;
          }
        }
      } else {
        return absl::InvalidArgumentError(
            "--api-keys-file: each tenant maps to a key or a list of keys");
      }
    }
  } else {
    int line_no = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      ++line_no;
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line.front() == '#') continue;
      std::vector<std::string> words =
          absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      if (words.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("--api-keys-file line ", line_no, ": expected 'TENANT KEY'"));
      }
      if (absl::Status s = AddKey(absl::StrCat("line ", line_no), words[0], words[1], &out);
          !s.ok()) {
        return s;
      }
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--api-keys-file holds no key");
  return out;
}

std::string PeerHost(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  return std::string(colon == absl::string_view::npos ? peer : peer.substr(0, colon));
}

}  // namespace

std::string DeriveTenantSalt(absl::string_view cluster_secret, absl::string_view tenant) {
  // Domain-separated so the same secret could key other derivations.
  const std::string msg = absl::StrCat("vericache tenant salt v1", std::string(1, '\0'), tenant);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), cluster_secret.data(), static_cast<int>(cluster_secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

struct TenantAuth::Impl {
  TenantAuthOptions options;
  std::string secret;
  std::mutex mu;
  std::shared_ptr<const std::vector<Entry>> keys;
  FileStamp stamp;
  Clock::time_point next_check;
  bool reported_bad_reload = false;
  struct Bucket {
    double tokens;
    Clock::time_point at;
  };
  std::map<std::string, Bucket> buckets;

  absl::Status Load() {
    absl::StatusOr<FileStamp> st = Stamp(options.api_keys_file);
    if (!st.ok()) return absl::InvalidArgumentError(st.status().message());
    absl::StatusOr<std::string> text =
        ReadSmallFile("--api-keys-file", options.api_keys_file, kMaxKeysFileBytes);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<Entry>> parsed = ParseKeys(*text);
    if (!parsed.ok()) return parsed.status();
    keys = std::make_shared<const std::vector<Entry>>(std::move(*parsed));
    stamp = *st;
    return absl::OkStatus();
  }

  // Called with mu held.
  void MaybeReload() {
    const auto now = Clock::now();
    if (now < next_check) return;
    next_check = now + options.reload_interval;
    absl::StatusOr<FileStamp> st = Stamp(options.api_keys_file);
    if (!st.ok() || *st == stamp) return;
    const absl::Status s = Load();
    if (!s.ok()) {
      // Keep serving with the previous keys; say so once per bad version.
      if (!reported_bad_reload) {
        std::fprintf(stderr, "vc-coordinator: keys file changed but not reloaded: %s\n",
                     std::string(s.message()).c_str());
      }
      reported_bad_reload = true;
      stamp = *st;
    } else {
      reported_bad_reload = false;
    }
  }

  Bucket& BucketFor(const std::string& host, Clock::time_point now) {
    auto it = buckets.find(host);
    if (it != buckets.end()) {
      const double dt = std::chrono::duration<double>(now - it->second.at).count();
      it->second.tokens = std::min<double>(options.failure_burst,
                                           it->second.tokens + dt * options.failures_per_second);
      it->second.at = now;
      return it->second;
    }
    if (static_cast<int>(buckets.size()) >= options.max_tracked_peers) {
      // Forget refilled peers first, then any.
      for (auto b = buckets.begin(); b != buckets.end();) {
        const double dt = std::chrono::duration<double>(now - b->second.at).count();
        if (b->second.tokens + dt * options.failures_per_second >= options.failure_burst) {
          b = buckets.erase(b);
        } else {
          ++b;
        }
      }
      if (static_cast<int>(buckets.size()) >= options.max_tracked_peers) {
        buckets.erase(buckets.begin());
      }
    }
    return buckets.emplace(host, Bucket{static_cast<double>(options.failure_burst), now})
        .first->second;
  }
};

TenantAuth::~TenantAuth() = default;

absl::StatusOr<std::unique_ptr<TenantAuth>> TenantAuth::Create(const TenantAuthOptions& options) {
  auto auth = std::unique_ptr<TenantAuth>(new TenantAuth());
  auth->impl_ = std::make_unique<Impl>();
  Impl& impl = *auth->impl_;
  impl.options = options;
  if (options.api_keys_file.empty()) {
    if (!options.cluster_secret_file.empty()) {
      return absl::InvalidArgumentError("--cluster-secret-file needs --api-keys-file");
    }
    return auth;
  }
  if (options.failure_burst < 1 || !(options.failures_per_second > 0) ||
      options.max_tracked_peers < 1) {
    return absl::InvalidArgumentError("authentication rate limits must be positive");
  }
  if (options.cluster_secret_file.empty()) {
    return absl::InvalidArgumentError(
        "--api-keys-file needs --cluster-secret-file (the key of the tenant salt derivation)");
  }
  absl::StatusOr<std::string> secret =
      ReadSmallFile("--cluster-secret-file", options.cluster_secret_file, 4096);
  if (!secret.ok()) return secret.status();
  std::string s = *secret;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < 16) {
    return absl::InvalidArgumentError("--cluster-secret-file must hold at least 16 bytes");
  }
  impl.secret = std::move(s);
  if (absl::Status st = impl.Load(); !st.ok()) return st;
  impl.next_check = Clock::now() + options.reload_interval;
  return auth;
}

bool TenantAuth::enabled() const { return !impl_->options.api_keys_file.empty(); }

int TenantAuth::key_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->keys ? static_cast<int>(impl_->keys->size()) : 0;
}

absl::StatusOr<Identity> TenantAuth::Authenticate(absl::string_view authorization,
                                                   absl::string_view peer,
                                                   absl::string_view certificate_cn) {
  if (!enabled()) return Identity{};
  Impl& impl = *impl_;
  const std::string host = PeerHost(peer);
  const auto now = Clock::now();
  std::shared_ptr<const std::vector<Entry>> keys;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    impl.MaybeReload();
    if (impl.BucketFor(host, now).tokens < 1) {
      return absl::ResourceExhaustedError(
          "too many failed authentications from this address; retry later");
    }
    keys = impl.keys;
  }
  auto fail = [&](const char* why) -> absl::Status {
    std::lock_guard<std::mutex> lock(impl.mu);
    impl.BucketFor(host, Clock::now()).tokens -= 1;
    return absl::UnauthenticatedError(why);
  };
  auto identity = [&](const std::string& tenant) {
    Identity id;
    id.tenant = tenant;
    id.salt = DeriveTenantSalt(impl.secret, id.tenant);
    return id;
  };
  // The tenant a verified client certificate names, if the keys file knows
  // it ("" otherwise).
  std::string cert_tenant;
  if (!certificate_cn.empty()) {
    for (const Entry& e : *keys) {
      if (e.tenant == certificate_cn) cert_tenant = e.tenant;
    }
  }
  constexpr absl::string_view kBearer = "Bearer ";
  if (authorization.empty()) {
    if (!cert_tenant.empty()) return identity(cert_tenant);
    if (!certificate_cn.empty()) {
      return fail("the client certificate's subject CN is no tenant of the keys file, and no "
                  "API key was sent");
    }
    return fail("missing API key: send metadata 'authorization: Bearer KEY'");
  }
  if (authorization.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kBearer.size()), kBearer)) {
    return fail("malformed authorization metadata: expected 'Bearer KEY'");
  }
  const absl::string_view key = authorization.substr(kBearer.size());
  if (key.size() > kMaxKeyBytes) return fail("unknown API key");
  const Hash h = Sha256(key);
  // Every entry is compared, in constant time each, so the time taken says
  // nothing about which key (or how much of one) matched.
  const Entry* match = nullptr;
  for (const Entry& e : *keys) {
    const bool eq = CRYPTO_memcmp(e.hash.data(), h.data(), h.size()) == 0;
    if (eq) match = &e;
  }
  if (match == nullptr) return fail("unknown API key");
  // A certificate that names no tenant (a daemon's, say, from a gateway
  // forwarding its caller's key) says nothing about who is calling.
  if (!cert_tenant.empty() && cert_tenant != match->tenant) {
    return fail("the API key and the client certificate name different tenants");
  }
  return identity(match->tenant);
}

}  // namespace vc::coordinator
