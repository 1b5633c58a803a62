// TenantAuth (services/coordinator/tenant_auth.h): both keys-file formats,
// malformed files refused with a line number and never the key, two keys per
// tenant, reload on change (and keeping the old keys when the new file is
// broken), rate limiting of failures per peer, and the salt derivation.
#include "services/coordinator/tenant_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/scratch_dir.h"

namespace vc::coordinator {
namespace {

class TenantAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_.path();
    Write("secret", "0123456789abcdef0123456789abcdef\n");
  }
  // Atomic replace (a new inode), as a Secret volume or `mv` does.
  void Write(const std::string& name, const std::string& text) {
    const std::string tmp = dir_ + "/" + name + ".tmp";
    std::ofstream(tmp) << text;
    ASSERT_EQ(std::rename(tmp.c_str(), (dir_ + "/" + name).c_str()), 0);
  }
  TenantAuthOptions Options() {
    TenantAuthOptions o;
    o.api_keys_file = dir_ + "/keys";
    o.cluster_secret_file = dir_ + "/secret";
    o.reload_interval = std::chrono::milliseconds(0);  // check on every call
    return o;
  }
  test_support::ScratchDir scratch_{"tenant-auth-"};
  std::string dir_;
};

constexpr char kPeer[] = "ipv4:10.0.0.1:5555";

TEST_F(TenantAuthTest, LinesAndJsonMapKeysToTenants) {
  Write("keys", "# comment\n\ntenant-a key-aaaaaaaaaaaaaaaa\ntenant-b\tkey-bbbbbbbbbbbbbbbb\n");
  auto auth = TenantAuth::Create(Options());
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE((*auth)->enabled());
  EXPECT_EQ((*auth)->key_count(), 2);
  auto a = (*auth)->Authenticate("Bearer key-aaaaaaaaaaaaaaaa", kPeer);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tenant, "tenant-a");
  auto b = (*auth)->Authenticate("bearer key-bbbbbbbbbbbbbbbb", kPeer);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->tenant, "tenant-b");
  EXPECT_NE(a->salt, b->salt);
  EXPECT_EQ(a->salt.size(), 32u);
  EXPECT_EQ(a->salt.find("tenant-a"), std::string::npos);

  Write("keys", R"({"tenant-a": ["key-aaaaaaaaaaaaaaaa", "key-a2a2a2a2a2a2a2a2"], "tenant-b": "key-bbbbbbbbbbbbbbbb"})");
  auto json = TenantAuth::Create(Options());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)->key_count(), 3);
  auto a2 = (*json)->Authenticate("Bearer key-a2a2a2a2a2a2a2a2", kPeer);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->tenant, "tenant-a");
  EXPECT_EQ(a2->salt, a->salt);  // same tenant, same salt, whichever key
}

TEST_F(TenantAuthTest, MissingWrongAndMalformedKeysAreUnauthenticated) {
  Write("keys", "tenant-a key-aaaaaaaaaaaaaaaa\n");
  auto auth = TenantAuth::Create(Options());
  ASSERT_TRUE(auth.ok());
  for (const char* bad : {"", "Bearer ", "Basic key-aaaaaaaaaaaaaaaa", "key-aaaaaaaaaaaaaaaa",
                          "Bearer key-aaaaaaaaaaaaaaab", "Bearer key-aaaaaaaaaaaaaaa"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ((*auth)->Authenticate(bad, kPeer).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ((*auth)->Authenticate("Bearer " + std::string(100000, 'k'), kPeer).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(TenantAuthTest, ClientCertificateCnNamesAKnownTenant) {
  Write("keys", "tenant-a key-aaaaaaaaaaaaaaaa\ntenant-b key-bbbbbbbbbbbbbbbb\n");
  auto auth = TenantAuth::Create(Options());
  ASSERT_TRUE(auth.ok());
  auto by_key = (*auth)->Authenticate("Bearer key-aaaaaaaaaaaaaaaa", kPeer);
  ASSERT_TRUE(by_key.ok());
  // A certificate alone: the tenant it names, with that tenant's salt.
  auto by_cert = (*auth)->Authenticate("", kPeer, "tenant-a");
  ASSERT_TRUE(by_cert.ok()) << by_cert.status();
  EXPECT_EQ(by_cert->tenant, "tenant-a");
  EXPECT_EQ(by_cert->salt, by_key->salt);
  // Both, agreeing.
  auto both = (*auth)->Authenticate("Bearer key-aaaaaaaaaaaaaaaa", kPeer, "tenant-a");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->tenant, "tenant-a");
  // Both, disagreeing; a CN that is no tenant; a wrong key with a good CN.
  EXPECT_EQ((*auth)->Authenticate("Bearer key-bbbbbbbbbbbbbbbb", kPeer, "tenant-a").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate("", kPeer, "vericache-daemon").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A certificate naming no tenant next to a good key (a gateway with its
  // own certificate forwarding its caller's key): the key decides.
  auto gateway = (*auth)->Authenticate("Bearer key-bbbbbbbbbbbbbbbb", kPeer, "vericache-daemon");
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  EXPECT_EQ(gateway->tenant, "tenant-b");
  EXPECT_EQ((*auth)->Authenticate("Bearer key-cccccccccccccccc", kPeer, "tenant-a").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A tenant removed from the keys file is no longer a certificate tenant.
  Write("keys", "tenant-b key-bbbbbbbbbbbbbbbb\n# tenant-a gone\n");
  EXPECT_EQ((*auth)->Authenticate("", kPeer, "tenant-a").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(TenantAuthTest, BadFilesAreRefusedWithoutEchoingKeys) {
  const std::string key = "secret-key-0123456789";
  auto refused = [&](const std::string& text, const std::string& needle) {
    Write("keys", text);
    auto auth = TenantAuth::Create(Options());
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(auth.status().message().find(needle), std::string::npos) << auth.status();
    EXPECT_EQ(auth.status().message().find(key), std::string::npos) << auth.status();
  };
  refused("tenant-a " + key + " extra\n", "line 1");
  refused("tenant-a " + key + "\ntenant b " + key + "x\n", "line 2");
  refused("tenant/a " + key + "\n", "tenant name");
  refused("tenant-a short\n", "key is");
  refused("tenant-a " + key + "\ntenant-b " + key + "\n", "twice");
  refused("# nothing\n", "no key");
  refused("{\"tenant-a\": 5}", "key or a list");
  refused("{not json", "JSON");
  // Secret: required, and long enough.
  Write("keys", "tenant-a " + key + "\n");
  TenantAuthOptions o = Options();
  o.cluster_secret_file = "";
  EXPECT_EQ(TenantAuth::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  Write("secret", "short\n");
  EXPECT_EQ(TenantAuth::Create(Options()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TenantAuthTest, ReloadsOnChangeAndKeepsOldKeysWhenTheNewFileIsBroken) {
  Write("keys", "tenant-a key-old-0000000000000\n");
  auto auth = TenantAuth::Create(Options());
  ASSERT_TRUE(auth.ok());
  ASSERT_TRUE((*auth)->Authenticate("Bearer key-old-0000000000000", kPeer).ok());
  // Rotation: both keys, then only the new one.
  Write("keys", "tenant-a key-old-0000000000000\ntenant-a key-new-1111111111111\n");
  EXPECT_TRUE((*auth)->Authenticate("Bearer key-new-1111111111111", kPeer).ok());
  EXPECT_TRUE((*auth)->Authenticate("Bearer key-old-0000000000000", kPeer).ok());
  Write("keys", "tenant-a key-new-1111111111111\n");
  EXPECT_EQ((*auth)->Authenticate("Bearer key-old-0000000000000", kPeer).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*auth)->Authenticate("Bearer key-new-1111111111111", kPeer).ok());
  // A broken file: the keys that were valid stay valid.
  Write("keys", "garbage\n");
  EXPECT_TRUE((*auth)->Authenticate("Bearer key-new-1111111111111", kPeer).ok());
}

TEST_F(TenantAuthTest, FailuresAreRateLimitedPerPeer) {
  Write("keys", "tenant-a key-aaaaaaaaaaaaaaaa\n");
  TenantAuthOptions o = Options();
  o.failure_burst = 3;
  o.failures_per_second = 1e-6;  // no refill within the test
  auto auth = TenantAuth::Create(o);
  ASSERT_TRUE(auth.ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*auth)->Authenticate("Bearer wrong-wrong-wrong-wrong", kPeer).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  // The bucket is empty: refused before the key is looked at.
  EXPECT_EQ((*auth)->Authenticate("Bearer key-aaaaaaaaaaaaaaaa", kPeer).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Another address (same host, other port counts as the same host) is not.
  EXPECT_EQ((*auth)->Authenticate("Bearer key-aaaaaaaaaaaaaaaa", "ipv4:10.0.0.1:6666")
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*auth)->Authenticate("Bearer key-aaaaaaaaaaaaaaaa", "ipv4:10.0.0.2:5555").ok());
}

TEST_F(TenantAuthTest, OffMeansAnonymous) {
  auto auth = TenantAuth::Create(TenantAuthOptions{});
  ASSERT_TRUE(auth.ok());
  EXPECT_FALSE((*auth)->enabled());
  auto id = (*auth)->Authenticate("", kPeer);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->tenant, "");
}

TEST(DeriveTenantSaltTest, KeyedByTheSecretAndTheTenant) {
  const std::string s1 = DeriveTenantSalt("secret-one-0123456789", "tenant-a");
  EXPECT_EQ(s1, DeriveTenantSalt("secret-one-0123456789", "tenant-a"));
  EXPECT_NE(s1, DeriveTenantSalt("secret-two-0123456789", "tenant-a"));
  EXPECT_NE(s1, DeriveTenantSalt("secret-one-0123456789", "tenant-b"));
  EXPECT_EQ(s1.size(), 32u);
}

}  // namespace
}  // namespace vc::coordinator
