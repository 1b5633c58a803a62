// Encryption of KV at rest end to end (issue 11 item 3; docs/security.md
// "Encryption of KV at rest") on a secure LocalCluster started as
// `vericache local --kv-encryption` starts it: every mode that reads stored
// KV (vericache over the int8 and the snapkv variant, full_remote,
// full_local) returns exactly the full-KV tokens; every chunk and variant
// the store holds is an encrypted entry with no plaintext codec magic in
// it; a drafter started without the KV secret, or with another one, refuses
// those entries with a clear error instead of decoding them; bad
// --kv-secret-file flags stop a worker at start.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/escaping.h"
#include "common/decode/full_decode.h"
#include "common/kvstore/chunk_key.h"
#include "common/kvstore/kv_cipher.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"
#include "services/coordinator/tenant_auth.h"
#include "services/local/local_cluster.h"
#include "tests/scratch_dir.h"
#include "tests/services/cluster/cluster_test_command.h"
#include "tests/services/cluster/cluster_test_store.h"
#include "tests/services/cluster/cluster_test_text.h"
#include "vericache/v1/coordinator.grpc.pb.h"
#include "vericache/v1/kvstore.grpc.pb.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc {
namespace {

namespace pb = ::vericache::v1;
namespace fs = std::filesystem;

constexpr int kChunkTokens = 32;
constexpr int kMaxNew = 24;

std::string ModelPath() { return clustertest::StoriesModelPath(); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A vc-drafter started by the test (beside the cluster's), stopped on
// destruction. `address` is empty if it did not report one.
struct ExtraDrafter {
  pid_t pid = -1;
  FILE* out = nullptr;
  std::string address;
  ~ExtraDrafter() {
    if (pid > 0) ::kill(pid, SIGTERM);
    if (out != nullptr) pclose(out);
  }
};

class KvEncryptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(ModelPath()).good()) GTEST_SKIP() << "test model not found: " << ModelPath();
    model_ = std::move(Model::Load(ModelPath())).value();
    EngineOptions eo;
    eo.backend.threads = 1;
    engine_ = std::move(Engine::Create(*model_, eo)).value();
    model_id_ = kvstore::ComputeModelId(*model_);
    local::LocalClusterOptions o;
    o.bin_dir = VC_DAEMON_DIR;
    o.model = ModelPath();
    o.chunk_tokens = kChunkTokens;
    o.ingest_variants = "int8,snapkv:0.25";
    o.kv_encryption = true;  // secure (mutual TLS, API keys) as by default
    o.log_dir = logs_.path();
    log_dir_ = o.log_dir;
    auto c = local::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status() << " (daemon logs in " << o.log_dir << ")";
    cluster_ = std::move(*c);
    stub_ = pb::Coordinator::NewStub(rpc::MakeChannel(cluster_->client("tenant-a"), 64 << 20));
    store_ = pb::KvStore::NewStub(
        rpc::MakeChannel(cluster_->internal(cluster_->Find("kvstore")->address), 64 << 20));
    // tenant-a's salt, as the coordinator derives it from the cluster secret.
    std::string secret = ReadFile(cluster_->credentials()->cluster_secret_file);
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    salt_ = coordinator::DeriveTenantSalt(secret, "tenant-a");
  }

  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt) {
    DecodeOptions o;
    o.max_new_tokens = kMaxNew;
    o.ignore_eos = true;
    return std::move(DecodeFull(*engine_, prompt, o)).value().tokens;
  }

  pb::RegisterPrefixResponse Register(const std::vector<int32_t>& tokens) {
    pb::RegisterPrefixRequest req;
    for (int32_t t : tokens) req.add_tokens(t);
    pb::RegisterPrefixResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(60));
    const grpc::Status s = stub_->RegisterPrefix(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  // tenant-a's raw chunk keys of `tokens`.
  std::vector<std::string> ChunkKeys(const std::vector<int32_t>& tokens) {
    return clustertest::RawChunkKeys(model_id_, tokens, kChunkTokens, salt_);
  }

  std::string GetEntry(const std::string& key) { return clustertest::GetStoreEntry(*store_, key); }

  std::vector<int32_t> Generate(const std::string& prefix_id, pb::Mode mode,
                                const std::string& compressor = "", double ratio = 0) {
    pb::GenerateRequest req;
    req.set_prefix_id(prefix_id);
    req.add_suffix_ids(42);
    req.set_mode(mode);
    req.set_compressor(compressor);
    req.set_ratio(ratio);
    req.set_max_new_tokens(kMaxNew);
    req.set_ignore_eos(true);
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(120));
    auto reader = stub_->Generate(ctx.get(), req);
    pb::GenerateResponse msg;
    std::vector<int32_t> tokens;
    int64_t fallbacks = 0;
    while (reader->Read(&msg)) {
      if (msg.final()) {
        tokens.assign(msg.totals().tokens().begin(), msg.totals().tokens().end());
        fallbacks = msg.totals().fallbacks();
      }
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message() << " (daemon logs in " << log_dir_ << ")";
    // A drafter that could not decrypt would fall back to the verifier and
    // still return the right tokens: fallbacks show it.
    EXPECT_EQ(fallbacks, 0) << "mode " << mode << " " << compressor;
    return tokens;
  }

  // Starts a vc-drafter against the cluster's store with the cluster's TLS
  // and seal trust, and `extra` flags (a --kv-secret-file or none).
  std::unique_ptr<ExtraDrafter> StartDrafter(const std::string& name, const std::string& extra) {
    const auto& d = cluster_->credentials()->daemon;
    const std::string cmd = absl::StrCat(
        "echo $$; exec ", VC_DAEMON_DIR, "/vc-drafter --listen=127.0.0.1:0 --model=", ModelPath(),
        " --kvstore=", cluster_->Find("kvstore")->address,
        " --threads=1 --metrics-listen= --tls-cert=", d.cert, " --tls-key=", d.key,
        " --tls-ca=", d.ca,
        " --seal-trust=", (fs::path(cluster_->data_dir()) / "seal-trust.txt").string(), " ", extra,
        " 2>", log_dir_, "/", name, ".log");
    auto out = std::make_unique<ExtraDrafter>();
    out->out = popen(cmd.c_str(), "r");
    if (out->out == nullptr) return out;
    char line[4096];
    if (std::fgets(line, sizeof line, out->out) != nullptr) out->pid = std::atoi(line);
    if (std::fgets(line, sizeof line, out->out) != nullptr) {
      const std::string s(line);
      const size_t at = s.find(" listening on ");
      if (at != std::string::npos) {
        const size_t from = at + 14;
        out->address = s.substr(from, s.find(' ', from) - from);
      }
    }
    return out;
  }

  // Opens a session on `drafter` over tenant-a's stored prefix: its variant
  // `variant_key`, or its full chunks when that is empty.
  grpc::Status OpenOn(const std::string& drafter, const std::vector<int32_t>& prefix,
                      const std::string& variant_key) {
    auto stub = pb::Drafter::NewStub(rpc::MakeChannel(cluster_->internal(drafter), 64 << 20));
    pb::DrafterOpenRequest req;
    req.set_session_id(777);
    for (int32_t t : prefix) req.add_prompt(t);
    req.add_prompt(42);
    req.mutable_prefix()->set_prefix_tokens(static_cast<int32_t>(prefix.size()));
    for (const auto& k : ChunkKeys(prefix)) req.mutable_prefix()->add_chunk_keys(k);
    if (variant_key.empty()) {
      req.set_full_prefix(true);
    } else {
      req.set_variant_key(variant_key);
    }
    req.set_lookahead(8);
    req.set_tenant_salt(salt_);
    pb::DrafterOpenResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(60));
    ctx->set_wait_for_ready(true);
    return stub->Open(ctx.get(), req, &resp);
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  kvstore::ModelId model_id_;
  std::string log_dir_;
  std::string salt_;
  test_support::ScratchDir logs_{"kv-encryption-logs-"};  // outlives the cluster
  std::unique_ptr<local::LocalCluster> cluster_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  std::unique_ptr<pb::KvStore::Stub> store_;
};

TEST_F(KvEncryptionTest, EveryModeIsExactAndTheStoreHoldsCiphertextOnly) {
  const std::vector<int32_t> prefix = clustertest::ModelText(*engine_, 3 * kChunkTokens, 7);
  const pb::RegisterPrefixResponse reg = Register(prefix);
  const std::vector<std::string> chunks = ChunkKeys(prefix);
  {
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = kChunkTokens;
    ko.tenant_salt = salt_;
    ASSERT_EQ(reg.prefix_id(), kvstore::PrefixManifestKey(ko, model_id_, prefix).Hex())
        << "the test derives tenant-a's keys as the coordinator does";
  }
  ASSERT_EQ(reg.variants_size(), 2);

  std::vector<int32_t> prompt = prefix;
  prompt.push_back(42);
  const std::vector<int32_t> want = Reference(prompt);
  // int8 is the first ingest variant: the default compressor.
  EXPECT_EQ(Generate(reg.prefix_id(), pb::MODE_VERICACHE), want);
  EXPECT_EQ(Generate(reg.prefix_id(), pb::MODE_VERICACHE, "snapkv", 0.25), want);
  EXPECT_EQ(Generate(reg.prefix_id(), pb::MODE_FULL_REMOTE), want);
  EXPECT_EQ(Generate(reg.prefix_id(), pb::MODE_FULL_LOCAL), want);

  std::vector<std::string> keys = chunks;
  for (const auto& v : reg.variants()) keys.push_back(v.key());
  for (const std::string& key : keys) {
    const std::string value = GetEntry(key);
    ASSERT_GT(value.size(), kvstore::kEncryptionOverheadBytes);
    EXPECT_TRUE(kvstore::LooksEncrypted(value)) << "entry " << absl::BytesToHexString(key);
    // Neither the chunk nor the variant codec's magic anywhere: no
    // plaintext entry inside the ciphertext (a 4-byte pattern turns up in a
    // few KB of random bytes with odds of about 1e-6).
    EXPECT_EQ(value.find("VCKC"), std::string::npos);
    EXPECT_EQ(value.find("VCKV"), std::string::npos);
  }
}

TEST_F(KvEncryptionTest, AWorkerWithoutTheSecretOrWithAnotherRefusesTheEntries) {
  const std::vector<int32_t> prefix = clustertest::ModelText(*engine_, 2 * kChunkTokens, 11);
  const pb::RegisterPrefixResponse reg = Register(prefix);
  ASSERT_EQ(reg.variants_size(), 2);
  const std::string variant = reg.variants(0).key();

  // The cluster's own drafter reads them (the same request, for contrast).
  {
    const grpc::Status ok = OpenOn(cluster_->Find("drafter")->address, prefix, variant);
    EXPECT_TRUE(ok.ok()) << ok.error_message();
  }

  auto plain = StartDrafter("drafter-no-secret", "");
  ASSERT_FALSE(plain->address.empty()) << "see " << log_dir_ << "/drafter-no-secret.log";
  for (const std::string& v : {variant, std::string()}) {
    const grpc::Status s = OpenOn(plain->address, prefix, v);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_NE(s.error_message().find("encrypted at rest"), std::string::npos) << s.error_message();
    EXPECT_NE(s.error_message().find("--kv-secret-file"), std::string::npos) << s.error_message();
  }

  const std::string other_secret = log_dir_ + "/other-kv-secret";
  std::ofstream(other_secret, std::ios::binary) << std::string(32, 'o');
  auto other = StartDrafter("drafter-other-secret", "--kv-secret-file=" + other_secret);
  ASSERT_FALSE(other->address.empty()) << "see " << log_dir_ << "/drafter-other-secret.log";
  for (const std::string& v : {variant, std::string()}) {
    const grpc::Status s = OpenOn(other->address, prefix, v);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_NE(s.error_message().find("does not decrypt"), std::string::npos) << s.error_message();
    EXPECT_NE(s.error_message().find("--kv-secret-file"), std::string::npos) << s.error_message();
  }
  // Refused, not quarantined: the entries are still there for the workers
  // that hold the secret.
  EXPECT_TRUE(kvstore::LooksEncrypted(GetEntry(variant)));
}

TEST_F(KvEncryptionTest, BadSecretFilesStopAWorkerAtStart) {
  const auto& d = cluster_->credentials()->daemon;
  const std::string base = absl::StrCat(VC_DAEMON_DIR, "/vc-verifier --model=", ModelPath(),
                                        " --kvstore=", cluster_->Find("kvstore")->address);
  const std::string tls =
      absl::StrCat(" --tls-cert=", d.cert, " --tls-key=", d.key, " --tls-ca=", d.ca);
  const std::string short_secret = log_dir_ + "/short-kv-secret";
  std::ofstream(short_secret, std::ios::binary) << "too short";
  const std::string good_secret = (fs::path(cluster_->data_dir()) / "kv-secret").string();
  struct Case {
    std::string flags;
    std::string says;
  } cases[] = {
      {tls + " --kv-secret-file=" + log_dir_ + "/no-such-secret", "no-such-secret"},
      {tls + " --kv-secret-file=" + short_secret, "at least 32"},
      {" --kv-secret-file=" + good_secret, "needs mutual TLS"},
  };
  for (const Case& c : cases) {
    std::string output;
    EXPECT_EQ(clustertest::RunCommand(base + c.flags, &output), 2) << output;
    EXPECT_NE(output.find("--kv-secret-file"), std::string::npos) << output;
    EXPECT_NE(output.find(c.says), std::string::npos) << output;
  }
}

}  // namespace
}  // namespace vc
