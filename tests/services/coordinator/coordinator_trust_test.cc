// The cluster against hostile callers, on the four real daemons
// (LocalCluster, secure by default): mutual TLS on every internal port (no
// certificate, or one from another CA, cannot complete a call); request
// bounds (huge ids, absurd max_new_tokens and draft_len, too many variants)
// answered INVALID_ARGUMENT naming the limit and keeping nothing; API-key
// authentication (missing, wrong, key rotation through the keys file without
// a restart, rate limiting of failures); and tenant isolation (no
// cross-tenant generate, cancel, query, pin or delete; no existence oracle in
// already_stored). A second cluster with small limits: a Generate stream
// whose reader stops reading is ended after --stream-write-timeout-ms, or at
// once by a Cancel, and --max-requests-per-tenant holds one tenant at its
// limit without touching another.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>

#include "common/rpc/rpc.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/local/local_cluster.h"
#include "tests/scratch_dir.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc {
namespace {

namespace pb = ::vericache::v1;

std::string ModelPath() {
  const char* dir = std::getenv("VC_MODELS_DIR");
  return std::string(dir ? dir : "../shared/models") + "/stories260K.bin";
}

// tenant-a's second key (rotation); the first ones are the cluster's.
constexpr char kKeyA2[] = "key-a-second-fedcba9876";

int64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// Writes `text` to `path` atomically (a rename: a new inode, so the
// coordinator sees the change whatever the mtime granularity).
void WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

class CoordinatorTrustTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::ifstream(ModelPath()).good()) return;
    scratch_ = new test_support::ScratchDir("coordinator-trust-");
    dir_ = scratch_->path();
    local::LocalClusterOptions o;
    o.bin_dir = VC_DAEMON_DIR;
    o.model = ModelPath();
    o.chunk_tokens = 32;
    o.ingest_variants = "snapkv:0.3";
    o.log_dir = dir_ + "/logs";
    o.extra_flags["vc-coordinator"] = {"--max-pins-per-tenant=1", "--max-draft-len=16"};
    auto c = local::LocalCluster::Start(o);
    if (!c.ok()) {
      start_error_ = c.status().ToString();
      return;
    }
    cluster_ = c->release();
    keys_file_ = cluster_->credentials()->api_keys_file;
    key_a1_ = cluster_->credentials()->api_keys.at("tenant-a");
    key_b_ = cluster_->credentials()->api_keys.at("tenant-b");
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete scratch_;  // after the cluster, whose logs are in it
    scratch_ = nullptr;
  }
  void SetUp() override {
    if (!std::ifstream(ModelPath()).good()) GTEST_SKIP() << "test model not found: " << ModelPath();
    ASSERT_NE(cluster_, nullptr) << start_error_ << " (logs in " << dir_ << "/logs)";
    ASSERT_NE(cluster_->credentials(), nullptr) << "LocalCluster is secure by default";
    // TLS to the public port, the key per call (not on the channel).
    rpc::ClientConfig c = cluster_->client();
    c.api_key.clear();
    stub_ = pb::Coordinator::NewStub(rpc::MakeChannel(c, 64 << 20));
    kKeyA1 = key_a1_;
    kKeyB = key_b_;
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& key) {
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(60));
    if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
    return ctx;
  }

  struct Outcome {
    grpc::Status status;
    std::vector<int32_t> tokens;
    pb::GenerateTotals totals;
  };
  Outcome Generate(const std::string& key, const pb::GenerateRequest& req) {
    auto ctx = Ctx(key);
    auto reader = stub_->Generate(ctx.get(), req);
    pb::GenerateResponse msg;
    Outcome out;
    while (reader->Read(&msg)) {
      if (msg.final()) {
        out.totals = msg.totals();
        out.tokens.assign(msg.totals().tokens().begin(), msg.totals().tokens().end());
      }
    }
    out.status = reader->Finish();
    return out;
  }

  static pb::GenerateRequest Prompt(int n, int seed, int64_t max_new = 8) {
    pb::GenerateRequest req;
    req.add_prompt_ids(1);
    for (int i = 1; i < n; ++i) req.add_prompt_ids(10 + (i * 7 + seed) % 400);
    req.set_max_new_tokens(max_new);
    req.set_ignore_eos(true);
    return req;
  }

  grpc::Status Register(const std::string& key, const std::vector<int32_t>& tokens,
                        pb::RegisterPrefixResponse* resp, const std::string& variants = "") {
    pb::RegisterPrefixRequest req;
    for (int32_t t : tokens) req.add_tokens(t);
    req.set_variants(variants);
    auto ctx = Ctx(key);
    return stub_->RegisterPrefix(ctx.get(), req, resp);
  }

  grpc::Status Manage(const std::string& key, const std::string& id,
                      pb::ManagePrefixRequest::Action action) {
    pb::ManagePrefixRequest req;
    req.set_prefix_id(id);
    req.set_action(action);
    pb::ManagePrefixResponse resp;
    auto ctx = Ctx(key);
    return stub_->ManagePrefix(ctx.get(), req, &resp);
  }

  static std::vector<int32_t> Tokens(int n, int seed) {
    std::vector<int32_t> t = {1};
    for (int i = 1; i < n; ++i) t.push_back(10 + (i * 11 + seed * 13) % 400);
    return t;
  }

  static inline test_support::ScratchDir* scratch_ = nullptr;
  static inline std::string dir_;
  static inline std::string keys_file_;
  static inline std::string key_a1_, key_b_;
  std::string kKeyA1, kKeyB;
  static inline std::string start_error_;
  static inline local::LocalCluster* cluster_ = nullptr;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

void ExpectError(const grpc::Status& s, grpc::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(needle), std::string::npos)
      << "'" << needle << "' not in: " << s.error_message();
}

TEST_F(CoordinatorTrustTest, InternalPortsRequireAClusterCertificate) {
  const local::ClusterCredentials& creds = *cluster_->credentials();
  // A certificate from another CA: a peer that is authenticated, wrongly.
  const std::string other = dir_ + "/other-ca";
  ::mkdir(other.c_str(), 0700);
  absl::StatusOr<local::ClusterCredentials> foreign = local::MakeClusterCredentials(other);
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  const auto t = std::chrono::seconds(10);
  for (const char* name : {"kvstore", "verifier", "drafter"}) {
    SCOPED_TRACE(name);
    const std::string addr = cluster_->Find(name)->address;
    EXPECT_TRUE(rpc::CheckHealth(rpc::MakeChannel(cluster_->internal(addr), 1 << 20), t).ok());
    // Plaintext.
    EXPECT_FALSE(rpc::CheckHealth(rpc::MakeChannel(addr, 1 << 20), t).ok());
    // TLS that trusts the cluster, without a client certificate.
    rpc::ClientConfig ca_only(addr);
    ca_only.tls.ca = creds.ca;
    EXPECT_FALSE(rpc::CheckHealth(rpc::MakeChannel(ca_only, 1 << 20), t).ok());
    // A client certificate the cluster's CA did not sign.
    rpc::ClientConfig wrong(addr);
    wrong.tls = foreign->client;
    wrong.tls.ca = creds.ca;
    EXPECT_FALSE(rpc::CheckHealth(rpc::MakeChannel(wrong, 1 << 20), t).ok());
  }
  // The public port: TLS without a client certificate (API keys instead);
  // plaintext cannot complete a call, nor can a client that does not trust
  // the cluster's CA.
  const std::string coord = cluster_->coordinator();
  pb::ClusterStatusRequest req;
  pb::ClusterStatusResponse resp;
  {
    auto plain = pb::Coordinator::NewStub(rpc::MakeChannel(coord, 1 << 20));
    auto ctx = Ctx(kKeyA1);
    EXPECT_EQ(plain->ClusterStatus(ctx.get(), req, &resp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  {
    rpc::ClientConfig untrusting(coord);
    untrusting.tls.ca = foreign->ca;
    auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(untrusting, 1 << 20));
    auto ctx = Ctx(kKeyA1);
    EXPECT_EQ(stub->ClusterStatus(ctx.get(), req, &resp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  auto ctx = Ctx(kKeyA1);
  EXPECT_TRUE(stub_->ClusterStatus(ctx.get(), req, &resp).ok());
  // The key on the channel (call credentials over TLS) works as well.
  auto keyed = pb::Coordinator::NewStub(rpc::MakeChannel(cluster_->client("tenant-b"), 1 << 20));
  auto ctx2 = rpc::ContextWithTimeout(std::chrono::seconds(10));
  EXPECT_TRUE(keyed->ClusterStatus(ctx2.get(), req, &resp).ok());
}

TEST_F(CoordinatorTrustTest, EveryRpcRefusesMissingAndWrongKeys) {
  for (const std::string& key : {std::string(), std::string("not-a-key-0123456789")}) {
    SCOPED_TRACE(key.empty() ? "no key" : "wrong key");
    EXPECT_EQ(Generate(key, Prompt(4, 1)).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    {
      pb::CancelRequest req;
      req.set_request_id("x");
      pb::CancelResponse resp;
      auto ctx = Ctx(key);
      EXPECT_EQ(stub_->Cancel(ctx.get(), req, &resp).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      pb::GetRequestRequest req;
      req.set_request_id("x");
      pb::RequestStatus resp;
      auto ctx = Ctx(key);
      EXPECT_EQ(stub_->GetRequest(ctx.get(), req, &resp).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      pb::ClusterStatusRequest req;
      pb::ClusterStatusResponse resp;
      auto ctx = Ctx(key);
      EXPECT_EQ(stub_->ClusterStatus(ctx.get(), req, &resp).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    pb::RegisterPrefixResponse rr;
    EXPECT_EQ(Register(key, Tokens(40, 1), &rr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Manage(key, std::string(64, 'a'), pb::ManagePrefixRequest::DELETE).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // A malformed header is no key either.
  auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
  ctx->AddMetadata("authorization", std::string("Basic ") + kKeyA1);
  pb::ClusterStatusRequest req;
  pb::ClusterStatusResponse resp;
  EXPECT_EQ(stub_->ClusterStatus(ctx.get(), req, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // And the right key works.
  auto ok_ctx = Ctx(kKeyA1);
  EXPECT_TRUE(stub_->ClusterStatus(ok_ctx.get(), req, &resp).ok());
}

TEST_F(CoordinatorTrustTest, ClientSaltIsRefusedWhenAuthenticationIsOn) {
  pb::GenerateRequest req = Prompt(4, 2);
  req.set_tenant_salt("tenant-a");
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "tenant_salt");
  pb::RegisterPrefixRequest reg;
  for (int32_t t : Tokens(40, 2)) reg.add_tokens(t);
  reg.set_tenant_salt("x");
  pb::RegisterPrefixResponse resp;
  auto ctx = Ctx(kKeyA1);
  ExpectError(stub_->RegisterPrefix(ctx.get(), reg, &resp), grpc::StatusCode::INVALID_ARGUMENT,
              "tenant_salt");
}

TEST_F(CoordinatorTrustTest, BoundsAreCheckedBeforeAnythingIsKept) {
  pb::GenerateRequest req = Prompt(4, 3);
  req.set_request_id(std::string(129, 'r'));
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "128");

  req = Prompt(4, 3);
  req.set_max_new_tokens(std::numeric_limits<int64_t>::max());
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "context");
  req.set_max_new_tokens(std::numeric_limits<int64_t>::min());
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "max_new_tokens");

  req = Prompt(4, 3);
  req.set_draft_len(1 << 30);
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "--max-draft-len");
  req.set_draft_len(-5);
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "draft_len");
  req.set_draft_len(16);  // the configured maximum is allowed
  EXPECT_TRUE(Generate(kKeyA1, req).status.ok());

  req = Prompt(4, 3);
  req.set_deadline_ms(std::numeric_limits<int64_t>::max());
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "deadline_ms");

  req = Prompt(4, 3);
  for (int i = 0; i < 5000; ++i) req.add_prompt_ids(5);
  ExpectError(Generate(kKeyA1, req).status, grpc::StatusCode::INVALID_ARGUMENT, "context");

  // 17 variants: refused before anything is built on the verifier.
  std::string variants = "int8";
  for (int i = 1; i < 17; ++i) variants += ",snapkv:0." + std::to_string(10 + i);
  pb::RegisterPrefixResponse rr;
  ExpectError(Register(kKeyA1, Tokens(40, 3), &rr, variants), grpc::StatusCode::INVALID_ARGUMENT,
              "16");
  ExpectError(Register(kKeyA1, Tokens(4000, 3), &rr), grpc::StatusCode::INVALID_ARGUMENT,
              "context");

  // Many refused requests with 2 MiB ids: each refused, none remembered,
  // and the coordinator's memory does not grow with them.
  const pid_t pid = cluster_->Find("coordinator")->pid;
  const int64_t before = RssBytes(pid);
  pb::GenerateRequest huge;
  huge.set_request_id(std::string(2 << 20, 'h'));
  huge.set_max_new_tokens(4);
  for (int i = 0; i < 100; ++i) {
    const grpc::Status s = Generate(kKeyA1, huge).status;
    ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  const int64_t after = RssBytes(pid);
  ASSERT_GT(before, 0);
  // 100 kept ids would be 200 MiB (and more with copies); allow allocator slack.
  EXPECT_LT(after - before, int64_t{64} << 20) << "RSS " << before << " -> " << after;
  // Still serving.
  EXPECT_TRUE(Generate(kKeyA1, Prompt(4, 3)).status.ok());
}

TEST_F(CoordinatorTrustTest, TenantsCannotReachEachOthersPrefixesOrRequests) {
  const std::vector<int32_t> prefix = Tokens(70, 4);
  pb::RegisterPrefixResponse a;
  ASSERT_TRUE(Register(kKeyA1, prefix, &a).ok());
  ASSERT_EQ(a.prefix_id().size(), 64u);
  EXPECT_FALSE(a.already_stored());
  // No existence oracle: B registering the same tokens learns nothing of A's.
  pb::RegisterPrefixResponse b;
  ASSERT_TRUE(Register(kKeyB, prefix, &b).ok());
  EXPECT_FALSE(b.already_stored());
  EXPECT_NE(a.prefix_id(), b.prefix_id());
  pb::RegisterPrefixResponse a_again;
  ASSERT_TRUE(Register(kKeyA1, prefix, &a_again).ok());
  EXPECT_TRUE(a_again.already_stored());

  // B cannot generate from, pin or delete A's prefix: it looks unknown.
  pb::GenerateRequest from_a;
  from_a.set_prefix_id(a.prefix_id());
  from_a.add_suffix_ids(9);
  from_a.set_max_new_tokens(4);
  from_a.set_ignore_eos(true);
  EXPECT_EQ(Generate(kKeyB, from_a).status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Manage(kKeyB, a.prefix_id(), pb::ManagePrefixRequest::PIN).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Manage(kKeyB, a.prefix_id(), pb::ManagePrefixRequest::DELETE).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // A still can, and both tenants get the same exact tokens from their own
  // copies.
  const Outcome oa = Generate(kKeyA1, from_a);
  ASSERT_TRUE(oa.status.ok()) << oa.status.error_message();
  pb::GenerateRequest from_b = from_a;
  from_b.set_prefix_id(b.prefix_id());
  const Outcome ob = Generate(kKeyB, from_b);
  ASSERT_TRUE(ob.status.ok()) << ob.status.error_message();
  EXPECT_EQ(oa.tokens, ob.tokens);

  // A raw prompt over the same tokens: B's first request ingests (it does
  // not find A's KV), A's finds its own.
  pb::GenerateRequest raw;
  for (int32_t t : Tokens(80, 5)) raw.add_prompt_ids(t);
  raw.set_max_new_tokens(4);
  raw.set_ignore_eos(true);
  raw.set_mode(pb::MODE_FULL_LOCAL);
  const Outcome ra = Generate(kKeyA1, raw);
  ASSERT_TRUE(ra.status.ok()) << ra.status.error_message();
  EXPECT_TRUE(ra.totals.ingested());
  const Outcome rb = Generate(kKeyB, raw);
  ASSERT_TRUE(rb.status.ok()) << rb.status.error_message();
  EXPECT_TRUE(rb.totals.ingested());
  EXPECT_EQ(ra.tokens, rb.tokens);

  // Request ids are per tenant: B neither sees nor cancels A's request.
  pb::GenerateRequest named = Prompt(6, 6);
  named.set_request_id("shared-name");
  ASSERT_TRUE(Generate(kKeyA1, named).status.ok());
  {
    pb::GetRequestRequest req;
    req.set_request_id("shared-name");
    pb::RequestStatus resp;
    auto ctx = Ctx(kKeyB);
    EXPECT_EQ(stub_->GetRequest(ctx.get(), req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
    auto ctx_a = Ctx(kKeyA1);
    ASSERT_TRUE(stub_->GetRequest(ctx_a.get(), req, &resp).ok());
    EXPECT_EQ(resp.state(), "done");
    pb::CancelRequest cancel;
    cancel.set_request_id("shared-name");
    pb::CancelResponse cresp;
    auto ctx_c = Ctx(kKeyB);
    ASSERT_TRUE(stub_->Cancel(ctx_c.get(), cancel, &cresp).ok());
    EXPECT_FALSE(cresp.existed());
  }
  // B may use the same id for its own request.
  EXPECT_TRUE(Generate(kKeyB, named).status.ok());
}

TEST_F(CoordinatorTrustTest, PinsPerTenantAreLimited) {
  pb::RegisterPrefixResponse p1, p2, other;
  ASSERT_TRUE(Register(kKeyA1, Tokens(40, 7), &p1).ok());
  ASSERT_TRUE(Register(kKeyA1, Tokens(40, 8), &p2).ok());
  ASSERT_TRUE(Register(kKeyB, Tokens(40, 9), &other).ok());
  ASSERT_TRUE(Manage(kKeyA1, p1.prefix_id(), pb::ManagePrefixRequest::PIN).ok());
  ExpectError(Manage(kKeyA1, p2.prefix_id(), pb::ManagePrefixRequest::PIN),
              grpc::StatusCode::RESOURCE_EXHAUSTED, "--max-pins-per-tenant");
  // Re-pinning the same prefix is not a new pin; another tenant has its own.
  EXPECT_TRUE(Manage(kKeyA1, p1.prefix_id(), pb::ManagePrefixRequest::PIN).ok());
  EXPECT_TRUE(Manage(kKeyB, other.prefix_id(), pb::ManagePrefixRequest::PIN).ok());
  ASSERT_TRUE(Manage(kKeyA1, p1.prefix_id(), pb::ManagePrefixRequest::UNPIN).ok());
  EXPECT_TRUE(Manage(kKeyA1, p2.prefix_id(), pb::ManagePrefixRequest::PIN).ok());
  EXPECT_TRUE(Manage(kKeyA1, p2.prefix_id(), pb::ManagePrefixRequest::UNPIN).ok());
  EXPECT_TRUE(Manage(kKeyB, other.prefix_id(), pb::ManagePrefixRequest::UNPIN).ok());
}

TEST_F(CoordinatorTrustTest, KeyRotationWithoutRestart) {
  pb::ClusterStatusRequest req;
  pb::ClusterStatusResponse resp;
  auto status_with = [&](const std::string& key) {
    auto ctx = Ctx(key);
    return stub_->ClusterStatus(ctx.get(), req, &resp).error_code();
  };
  ASSERT_EQ(status_with(kKeyA1), grpc::StatusCode::OK);
  ASSERT_EQ(status_with(kKeyA2), grpc::StatusCode::UNAUTHENTICATED);
  // Both keys of tenant-a valid at once (JSON form of the file this time).
  WriteFile(keys_file_, "{\"tenant-a\": [\"" + kKeyA1 + "\", \"" + kKeyA2 +
                            "\"], \"tenant-b\": \"" + kKeyB + "\"}");
  auto eventually = [&](const std::string& key, grpc::StatusCode want) {
    // The file is polled about once a second; allow a loaded machine 30 s.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    grpc::StatusCode got = status_with(key);
    while (got != want && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      got = status_with(key);
    }
    return got;
  };
  EXPECT_EQ(eventually(kKeyA2, grpc::StatusCode::OK), grpc::StatusCode::OK);
  EXPECT_EQ(status_with(kKeyA1), grpc::StatusCode::OK);
  // Same tenant, same salt: a prefix registered with one key is the same
  // prefix with the other.
  pb::RegisterPrefixResponse r1, r2;
  ASSERT_TRUE(Register(kKeyA1, Tokens(40, 10), &r1).ok());
  ASSERT_TRUE(Register(kKeyA2, Tokens(40, 10), &r2).ok());
  EXPECT_EQ(r1.prefix_id(), r2.prefix_id());
  EXPECT_TRUE(r2.already_stored());
  // The old key removed: refused after the reload.
  WriteFile(keys_file_, std::string("tenant-a ") + kKeyA2 + "\ntenant-b " + kKeyB + "\n");
  EXPECT_EQ(eventually(kKeyA1, grpc::StatusCode::UNAUTHENTICATED),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status_with(kKeyA2), grpc::StatusCode::OK);
  // A broken file keeps the keys that were valid.
  WriteFile(keys_file_, "this is not a keys file\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(status_with(kKeyA2), grpc::StatusCode::OK);
  WriteFile(keys_file_, std::string("tenant-a ") + kKeyA1 + "\ntenant-b " + kKeyB + "\n");
  EXPECT_EQ(eventually(kKeyA1, grpc::StatusCode::OK), grpc::StatusCode::OK);
}

// Last: it spends this peer's failure budget.
TEST_F(CoordinatorTrustTest, FailedAuthenticationsAreRateLimited) {
  // Failures from several threads at once, faster than the bucket refills
  // however slow each call is on a loaded machine.
  std::atomic<int> limited{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      pb::ClusterStatusRequest req;
      pb::ClusterStatusResponse resp;
      for (int i = 0; i < 40; ++i) {
        auto ctx = Ctx("wrong-key-000000000000");
        if (stub_->ClusterStatus(ctx.get(), req, &resp).error_code() ==
            grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++limited;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(limited.load(), 0);
  // The bucket refills: a good key works again.
  pb::ClusterStatusRequest req;
  pb::ClusterStatusResponse resp;
  grpc::StatusCode code = grpc::StatusCode::RESOURCE_EXHAUSTED;
  for (int i = 0; i < 100 && code != grpc::StatusCode::OK; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto ctx = Ctx(kKeyA1);
    code = stub_->ClusterStatus(ctx.get(), req, &resp).error_code();
  }
  EXPECT_EQ(code, grpc::StatusCode::OK);
}

// Last too: it changes the cluster's CA bundle (to a superset).
TEST_F(CoordinatorTrustTest, CaBundleIsReloadedWithoutARestart) {
  const local::ClusterCredentials& creds = *cluster_->credentials();
  const std::string other = dir_ + "/second-ca";
  ::mkdir(other.c_str(), 0700);
  absl::StatusOr<local::ClusterCredentials> second = local::MakeClusterCredentials(other);
  ASSERT_TRUE(second.ok()) << second.status();
  const std::string addr = cluster_->Find("kvstore")->address;
  rpc::ClientConfig newcomer(addr);
  newcomer.tls = second->client;
  newcomer.tls.ca = creds.ca;  // it trusts the cluster; the cluster does not trust it yet
  const auto t = std::chrono::seconds(5);
  ASSERT_FALSE(rpc::CheckHealth(rpc::MakeChannel(newcomer, 1 << 20), t).ok());
  // Rotation step one: both CAs in the bundle every daemon reads.
  std::stringstream bundle;
  bundle << std::ifstream(creds.ca).rdbuf() << std::ifstream(second->ca).rdbuf();
  WriteFile(creds.ca, bundle.str());
  // gRPC re-reads the files about every 10 s; allow a loaded machine 60 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool accepted = false;
  while (!accepted && std::chrono::steady_clock::now() < deadline) {
    accepted = rpc::CheckHealth(rpc::MakeChannel(newcomer, 1 << 20), t).ok();
    if (!accepted) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_TRUE(accepted) << "the store did not pick up the new CA bundle";
  // The cluster itself still works (the old CA is still in the bundle).
  EXPECT_TRUE(Generate(kKeyA1, Prompt(5, 11)).status.ok());
}

// The public port asks for (never requires) a client certificate: one from
// the cluster CA whose subject CN is a tenant of the keys file identifies
// that tenant without a key; a key sent with it must name the same tenant;
// a certificate whose CN is no tenant (the cluster's own client certificate)
// identifies nobody.
TEST_F(CoordinatorTrustTest, ClientCertificateNamesTheTenant) {
  const auto& creds = *cluster_->credentials();
  ASSERT_EQ(creds.tenant_certs.count("tenant-a"), 1u);
  rpc::ClientConfig as_a = cluster_->client();
  as_a.api_key.clear();
  as_a.tls = creds.tenant_certs.at("tenant-a");
  auto cert_a = pb::Coordinator::NewStub(rpc::MakeChannel(as_a, 64 << 20));
  auto ctx_with = [](const std::string& key) {
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(60));
    if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
    return ctx;
  };
  // Registered by certificate alone: the prefix is tenant A's (A's key
  // reaches it, B's does not).
  pb::RegisterPrefixRequest reg;
  for (int32_t t : Tokens(40, 31)) reg.add_tokens(t);
  pb::RegisterPrefixResponse reg_resp;
  {
    auto ctx = ctx_with("");
    const grpc::Status s = cert_a->RegisterPrefix(ctx.get(), reg, &reg_resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ExpectError(Manage(kKeyB, reg_resp.prefix_id(), pb::ManagePrefixRequest::PIN),
              grpc::StatusCode::NOT_FOUND, "not registered");
  EXPECT_TRUE(Manage(kKeyA1, reg_resp.prefix_id(), pb::ManagePrefixRequest::PIN).ok());
  EXPECT_TRUE(Manage(kKeyA1, reg_resp.prefix_id(), pb::ManagePrefixRequest::UNPIN).ok());
  // Generate over it by certificate, and with the certificate and A's key.
  pb::GenerateRequest gen;
  gen.set_prefix_id(reg_resp.prefix_id());
  gen.add_suffix_ids(42);
  gen.set_max_new_tokens(4);
  gen.set_ignore_eos(true);
  for (const std::string& key : {std::string(), kKeyA1}) {
    auto ctx = ctx_with(key);
    auto reader = cert_a->Generate(ctx.get(), gen);
    pb::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << (key.empty() ? "certificate only: " : "certificate and key: ")
                        << s.error_message();
  }
  // Certificate A with B's key: they disagree.
  {
    auto ctx = ctx_with(kKeyB);
    pb::RegisterPrefixResponse resp;
    ExpectError(cert_a->RegisterPrefix(ctx.get(), reg, &resp), grpc::StatusCode::UNAUTHENTICATED,
                "different tenants");
  }
  // The cluster's client certificate (CN vericache-client) is no tenant.
  rpc::ClientConfig as_client = cluster_->client();
  as_client.api_key.clear();
  as_client.tls = creds.client;
  auto cert_client = pb::Coordinator::NewStub(rpc::MakeChannel(as_client, 64 << 20));
  {
    auto ctx = ctx_with("");
    pb::RegisterPrefixResponse resp;
    ExpectError(cert_client->RegisterPrefix(ctx.get(), reg, &resp),
                grpc::StatusCode::UNAUTHENTICATED, "no tenant");
  }
}

// A cluster whose coordinator allows 2 requests per tenant and ends a
// stream whose message has waited 20 s to be sent.
class CoordinatorStreamLimitsTest : public ::testing::Test {
 protected:
  static constexpr int kMaxNew = 480;  // the model's context is 512

  static void SetUpTestSuite() {
    if (!std::ifstream(ModelPath()).good()) return;
    scratch_ = new test_support::ScratchDir("coordinator-limits-");
    dir_ = scratch_->path();
    local::LocalClusterOptions o;
    o.bin_dir = VC_DAEMON_DIR;
    o.model = ModelPath();
    o.chunk_tokens = 32;
    o.ingest_variants = "int8";
    o.log_dir = dir_ + "/logs";
    o.extra_flags["vc-coordinator"] = {"--max-requests-per-tenant=2",
                                       "--stream-write-timeout-ms=20000"};
    auto c = local::LocalCluster::Start(o);
    if (!c.ok()) {
      start_error_ = c.status().ToString();
      return;
    }
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete scratch_;  // after the cluster, whose logs are in it
    scratch_ = nullptr;
  }
  void SetUp() override {
    if (!std::ifstream(ModelPath()).good()) GTEST_SKIP() << "test model not found: " << ModelPath();
    ASSERT_NE(cluster_, nullptr) << start_error_ << " (logs in " << dir_ << "/logs)";
    stub_ = pb::Coordinator::NewStub(rpc::MakeChannel(cluster_->client(), 64 << 20));
    // A reader that stops reading: the smallest receive window gRPC allows
    // and no window growth, so the coordinator's writes of one long request
    // (480 messages, each carrying a 128-byte request id) soon wait.
    const rpc::ClientConfig c = cluster_->client();
    grpc::ChannelArguments args;
    args.SetInt("grpc.http2.lookahead_bytes", 1024);
    args.SetInt("grpc.http2.bdp_probe", 0);
    args.SetMaxReceiveMessageSize(64 << 20);
    slow_stub_ = pb::Coordinator::NewStub(
        grpc::CreateCustomChannel(c.address, rpc::ChannelCredentials(c.tls), args));
  }

  std::string Key(const std::string& tenant) const {
    return cluster_->credentials()->api_keys.at(tenant);
  }
  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& tenant,
                                           std::chrono::seconds timeout = std::chrono::seconds(60)) {
    auto ctx = rpc::ContextWithTimeout(timeout);
    ctx->AddMetadata("authorization", "Bearer " + Key(tenant));
    return ctx;
  }

  static pb::GenerateRequest LongRequest(const std::string& id) {
    pb::GenerateRequest req;
    req.set_request_id(id + std::string(128 - id.size(), '.'));
    req.add_prompt_ids(1);
    req.add_prompt_ids(300);
    req.set_mode(pb::MODE_FULL_LOCAL);
    req.set_max_new_tokens(kMaxNew);
    req.set_ignore_eos(true);
    return req;
  }

  // A stream of `tenant` that is never read.
  struct Stalled {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader;
    std::string id;
  };
  Stalled Stall(const std::string& tenant, const std::string& id) {
    Stalled s;
    s.ctx = Ctx(tenant, std::chrono::seconds(600));
    pb::GenerateRequest req = LongRequest(id);
    s.id = req.request_id();
    s.reader = slow_stub_->Generate(s.ctx.get(), req);
    return s;
  }

  pb::RequestStatus Get(const std::string& tenant, const std::string& id) {
    pb::GetRequestRequest req;
    req.set_request_id(id);
    pb::RequestStatus resp;
    auto ctx = Ctx(tenant);
    const grpc::Status s = stub_->GetRequest(ctx.get(), req, &resp);
    if (!s.ok()) resp.set_state("(GetRequest: " + s.error_message() + ")");
    return resp;
  }

  // Polls until `pred` holds for the request's state (at most `limit`).
  bool WaitFor(const std::string& tenant, const std::string& id,
               const std::function<bool(const pb::RequestStatus&)>& pred,
               std::chrono::seconds limit, pb::RequestStatus* last) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      *last = Get(tenant, id);
      if (pred(*last)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  grpc::Status Generate(const std::string& tenant, int seed) {
    pb::GenerateRequest req;
    req.add_prompt_ids(1);
    req.add_prompt_ids(100 + seed);
    req.set_max_new_tokens(8);
    req.set_ignore_eos(true);
    auto ctx = Ctx(tenant);
    auto reader = stub_->Generate(ctx.get(), req);
    pb::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    return reader->Finish();
  }

  static inline test_support::ScratchDir* scratch_ = nullptr;
  static inline std::string dir_;
  static inline std::string start_error_;
  static inline local::LocalCluster* cluster_ = nullptr;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  std::unique_ptr<pb::Coordinator::Stub> slow_stub_;
};

TEST_F(CoordinatorStreamLimitsTest, AStreamWhoseReaderStopsIsEnded) {
  Stalled s = Stall("tenant-a", "stalled-reader");
  pb::RequestStatus last;
  // Not finished by itself (the writes wait for the reader), and ended by the
  // coordinator after the write timeout: generous bounds for a loaded machine.
  const bool ended = WaitFor(
      "tenant-a", s.id,
      [](const pb::RequestStatus& r) {
        return r.state() != "running" && r.state() != "queued" && r.state().rfind("(", 0) != 0;
      },
      std::chrono::seconds(180), &last);
  ASSERT_TRUE(ended) << "still " << last.state() << " after 180 s, " << last.generated()
                     << " tokens generated";
  EXPECT_EQ(last.state(), "cancelled") << last.error();
  EXPECT_LT(last.generated(), kMaxNew) << "the request finished: the reader did not hold it up";
  // The client sees the stream end (what arrived before, then an error).
  pb::GenerateResponse msg;
  while (s.reader->Read(&msg)) {
  }
  EXPECT_FALSE(s.reader->Finish().ok());
  // The coordinator serves on.
  EXPECT_TRUE(Generate("tenant-a", 1).ok());
}

// A request whose reader stopped reading waits for room to write; a Cancel
// ends it at once, not --stream-write-timeout-ms after its write began.
TEST_F(CoordinatorStreamLimitsTest, ACancelEndsARequestWhoseReaderStopped) {
  Stalled s = Stall("tenant-b", "cancel-stalled");
  // Until its writes wait: running, and no new token for a second.
  pb::RequestStatus last;
  int64_t before = -1;
  bool stalled = false;
  for (int i = 0; i < 60 && !stalled; ++i) {
    last = Get("tenant-b", s.id);
    stalled = last.state() == "running" && last.generated() > 0 && last.generated() == before;
    before = last.generated();
    if (!stalled) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  ASSERT_TRUE(stalled) << last.state() << ", " << last.generated() << " tokens";
  const auto cancelled_at = std::chrono::steady_clock::now();
  pb::CancelRequest cancel;
  cancel.set_request_id(s.id);
  pb::CancelResponse resp;
  auto ctx = Ctx("tenant-b");
  ASSERT_TRUE(stub_->Cancel(ctx.get(), cancel, &resp).ok());
  EXPECT_TRUE(resp.existed());
  ASSERT_TRUE(WaitFor(
      "tenant-b", s.id,
      [](const pb::RequestStatus& r) { return r.state() != "running" && r.state() != "queued"; },
      std::chrono::seconds(60), &last));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled_at).count();
  EXPECT_EQ(last.state(), "cancelled") << last.error();
  // The write timeout would have ended it 18-20 s after the Cancel (it was
  // detected within 2 s of the stall); the Cancel takes a poll or two.
  EXPECT_LT(waited, 10.0) << "ended by the write timeout, not by the Cancel";
  EXPECT_LT(last.generated(), kMaxNew);
  // Its client sees the stream end, cancelled.
  pb::GenerateResponse msg;
  while (s.reader->Read(&msg)) {
  }
  EXPECT_EQ(s.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Generate("tenant-b", 5).ok());
}

TEST_F(CoordinatorStreamLimitsTest, ActiveRequestsAreLimitedPerTenant) {
  // Two requests of tenant A that stay running (their reader stalls).
  Stalled s1 = Stall("tenant-a", "limit-1");
  Stalled s2 = Stall("tenant-a", "limit-2");
  pb::RequestStatus last;
  for (const Stalled* s : {&s1, &s2}) {
    ASSERT_TRUE(WaitFor(
        "tenant-a", s->id,
        [](const pb::RequestStatus& r) { return r.state() == "running" && r.generated() > 0; },
        std::chrono::seconds(60), &last))
        << s->id.substr(0, 7) << ": " << last.state();
  }
  // A is at its limit; B is not affected.
  const grpc::Status third = Generate("tenant-a", 2);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_NE(third.error_message().find("--max-requests-per-tenant"), std::string::npos)
      << third.error_message();
  const grpc::Status other = Generate("tenant-b", 3);
  EXPECT_TRUE(other.ok()) << other.error_message();
  // Both of A's requests were still holding their places meanwhile.
  EXPECT_EQ(Get("tenant-a", s1.id).state(), "running");
  EXPECT_EQ(Get("tenant-a", s2.id).state(), "running");
  // A's clients give up: its places come back.
  s1.ctx->TryCancel();
  s2.ctx->TryCancel();
  for (const Stalled* s : {&s1, &s2}) {
    EXPECT_TRUE(WaitFor(
        "tenant-a", s->id,
        [](const pb::RequestStatus& r) { return r.state() != "running" && r.state() != "queued"; },
        std::chrono::seconds(60), &last));
  }
  (void)s1.reader->Finish();
  (void)s2.reader->Finish();
  EXPECT_TRUE(Generate("tenant-a", 4).ok());
}

}  // namespace
}  // namespace vc
