// Sealed KV end to end (issue 11 items 3 and 5) against the four real
// daemons (LocalCluster, seals on as `vericache local` starts them): a
// forged chunk (valid checksum, no seal / an untrusted signer's seal / a
// trusted seal over a checksum that does not match the bytes), a
// chunk transplanted from another prefix at the same position (a valid seal
// for another key), a chunk or variant bit-flipped on disk underneath the
// store, and entries the store accepts but a reader refuses (a trusted seal
// for another numerics version). The forged and transplanted ones are
// refused at commit; the corrupted ones are quarantined when read (by the
// store or by the reader) and the prefix heals: the request that meets one
// still returns exactly the full-KV tokens (the coordinator ingests the
// prefix again and runs it once more, or the drafter's failure falls back to
// the verifier), later requests too, never other tokens.
#include <rocksdb/db.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/decode/full_decode.h"
#include "common/http/httplib.h"
#include "common/ingest/prefix_ingest.h"
#include "common/kvstore/chunk_codec.h"
#include "common/kvstore/chunk_key.h"
#include "common/kvstore/seal.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"
#include "services/local/local_cluster.h"
#include "tests/scratch_dir.h"
#include "tests/services/cluster/cluster_test_metrics.h"
#include "tests/services/cluster/cluster_test_store.h"
#include "tests/services/cluster/cluster_test_text.h"
#include "vericache/v1/coordinator.grpc.pb.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc {
namespace {

namespace pb = ::vericache::v1;

constexpr int kChunkTokens = 32;

std::string ModelPath() { return clustertest::StoriesModelPath(); }

class KvIntegrityTest : public ::testing::Test {
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
    o.ingest_variants = "int8";
    // Seals are what this suite tests, and they are on either way; without
    // authentication the test can compute the chunk keys itself (with API
    // keys the coordinator salts them with a secret the test does not hold).
    o.insecure = true;
    o.log_dir = logs_.path();
    auto c = local::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status() << " (daemon logs in " << o.log_dir << ")";
    cluster_ = std::move(*c);
    stub_ = pb::Coordinator::NewStub(rpc::MakeChannel(cluster_->client(), 64 << 20));
    store_ = pb::KvStore::NewStub(rpc::MakeChannel(cluster_->internal(cluster_->Find("kvstore")->address), 64 << 20));
  }

  std::vector<int32_t> Text(int n, uint64_t seed) {
    return clustertest::ModelText(*engine_, n, seed);
  }

  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new) {
    DecodeOptions o;
    o.max_new_tokens = max_new;
    o.ignore_eos = true;
    return std::move(DecodeFull(*engine_, prompt, o)).value().tokens;
  }

  std::string Register(const std::vector<int32_t>& tokens) {
    pb::RegisterPrefixRequest req;
    for (int32_t t : tokens) req.add_tokens(t);
    pb::RegisterPrefixResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(60));
    const grpc::Status s = stub_->RegisterPrefix(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.prefix_id();
  }

  // The raw chunk keys of a registered prefix (as the coordinator keys them:
  // no tenant salt, numerics version 1).
  std::vector<std::string> ChunkKeys(const std::vector<int32_t>& tokens) {
    return clustertest::RawChunkKeys(model_id_, tokens, kChunkTokens);
  }

  std::string GetEntry(const std::string& key) { return clustertest::GetStoreEntry(*store_, key); }

  // Writes `value` under `key` through the store's own two-phase put, as
  // any client on the network could; the CommitPut status.
  grpc::Status Write(const std::string& key, const std::string& value) {
    pb::BeginPutResponse began;
    {
      auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
      const grpc::Status s = store_->BeginPut(ctx.get(), pb::BeginPutRequest(), &began);
      if (!s.ok()) return s;
    }
    {
      pb::StageChunkRequest req;
      req.set_put_id(began.put_id());
      req.set_key(key);
      req.set_value(value);
      pb::StageChunkResponse resp;
      auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
      const grpc::Status s = store_->StageChunk(ctx.get(), req, &resp);
      if (!s.ok()) return s;
    }
    pb::CommitPutRequest req;
    req.set_put_id(began.put_id());
    pb::CommitPutResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    return store_->CommitPut(ctx.get(), req, &resp);
  }

  // The raw key of the prefix's int8 variant (the cluster's ingest variant).
  std::string VariantKey(const std::vector<int32_t>& tokens) {
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = kChunkTokens;
    auto keys = kvstore::ChunkKeysForTokens(ko, model_id_, tokens);
    EXPECT_TRUE(keys.ok()) << keys.status();
    auto specs = ingest::ParseVariantList("int8");
    EXPECT_TRUE(specs.ok()) << specs.status();
    auto vk = ingest::VariantKeyFor(keys->back(), specs->front());
    EXPECT_TRUE(vk.ok()) << vk.status();
    return vk->Raw();
  }

  // Flips one bit of `key`'s value (at `offset`) in RocksDB underneath the
  // stopped store (the DRAM tier goes with the process), then restarts it.
  void FlipOnDisk(const std::string& key, size_t offset) {
    ASSERT_TRUE(cluster_->Kill("kvstore").ok());
    {
      const std::string path = (std::filesystem::path(cluster_->data_dir()) / "kvstore").string();
      rocksdb::DB* raw = nullptr;
      ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path, &raw).ok());
      std::unique_ptr<rocksdb::DB> db(raw);
      const std::string data_key = "d" + key;
      std::string value;
      ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), data_key, &value).ok());
      ASSERT_LT(offset, value.size());
      value[offset] ^= 0x10;
      rocksdb::WriteOptions wo;
      wo.sync = true;
      ASSERT_TRUE(db->Put(wo, data_key, value).ok());
      ASSERT_TRUE(db->Close().ok());
    }
    ASSERT_TRUE(cluster_->RestartKvStore().ok());
    store_ = pb::KvStore::NewStub(
        rpc::MakeChannel(cluster_->internal(cluster_->Find("kvstore")->address), 64 << 20));
  }

  // `value`'s payload sealed again with the cluster's own (trusted) seal key
  // but for numerics version 2: the store accepts it (a trusted seal for
  // its key), every reader refuses it (not its numerics).
  std::string ResealForOtherNumerics(const std::string& key, const std::string& value) {
    const std::filesystem::path dir(cluster_->data_dir());
    auto trust = kvstore::SealTrust::FromFile((dir / "seal-trust.txt").string());
    EXPECT_TRUE(trust.ok()) << trust.status();
    auto opened = trust->Open(key, value);
    EXPECT_TRUE(opened.ok()) << opened.status();
    auto signer = kvstore::SealSigner::FromPemFile((dir / "seal-key.pem").string());
    EXPECT_TRUE(signer.ok()) << signer.status();
    kvstore::SealContext other = opened->context;
    other.numerics_version = opened->context.numerics_version + 1;
    std::string resealed(opened->payload);
    const absl::Status sealed = (*signer)->Seal(key, other, &resealed);
    EXPECT_TRUE(sealed.ok()) << sealed;
    return resealed;
  }

  // The coordinator's vericache_kv_heals_total.
  double Heals() {
    const std::string body = clustertest::MetricsPage(cluster_->Find("coordinator")->metrics);
    if (body.empty()) return -1;
    const std::string name = "vericache_kv_heals_total ";
    const size_t at = body.find("\n" + name);
    EXPECT_NE(at, std::string::npos) << body;
    if (at == std::string::npos) return -1;
    return std::stod(body.substr(at + 1 + name.size()));
  }

  // Generates over the registered prefix + one suffix token; the request
  // either fails cleanly or returns exactly the full-KV tokens.
  grpc::Status GenerateAndCheck(const std::string& id, const std::vector<int32_t>& prefix,
                                pb::Mode mode, pb::GenerateTotals* totals_out = nullptr) {
    constexpr int kMaxNew = 24;
    pb::GenerateRequest req;
    req.set_prefix_id(id);
    req.add_suffix_ids(42);
    req.set_mode(mode);
    req.set_max_new_tokens(kMaxNew);
    req.set_ignore_eos(true);
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(120));
    auto reader = stub_->Generate(ctx.get(), req);
    pb::GenerateResponse msg;
    std::vector<int32_t> tokens;
    while (reader->Read(&msg)) {
      if (msg.final()) {
        tokens.assign(msg.totals().tokens().begin(), msg.totals().tokens().end());
        if (totals_out != nullptr) *totals_out = msg.totals();
      }
    }
    const grpc::Status status = reader->Finish();
    if (status.ok()) {
      std::vector<int32_t> prompt = prefix;
      prompt.push_back(42);
      EXPECT_EQ(tokens, Reference(prompt, kMaxNew)) << "tokens computed from a bad entry";
    }
    return status;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  kvstore::ModelId model_id_;
  test_support::ScratchDir logs_{"kv-integrity-logs-"};  // outlives the cluster
  std::unique_ptr<local::LocalCluster> cluster_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  std::unique_ptr<pb::KvStore::Stub> store_;
};

TEST_F(KvIntegrityTest, ForgedChunksAreRefusedAtCommit) {
  const std::vector<int32_t> prefix = Text(2 * kChunkTokens + 5, 3);
  const std::string id = Register(prefix);
  const std::vector<std::string> keys = ChunkKeys(prefix);
  ASSERT_EQ(keys.size(), 2u);
  // A well-formed chunk with a correct checksum but other rows.
  const std::string sealed = GetEntry(keys[1]);
  ASSERT_TRUE(kvstore::LooksSealed(sealed));
  PagedKvCache cache(model_->config(), PagedKvCache::Options{.max_tokens = kChunkTokens});
  ASSERT_TRUE(cache.Append(kChunkTokens).ok());
  std::vector<float> row(static_cast<size_t>(model_->config().n_kv_heads) *
                             model_->config().head_dim,
                         0.25f);
  for (int l = 0; l < model_->config().n_layers; ++l) {
    for (int p = 0; p < kChunkTokens; ++p) cache.Write(l, p, row.data(), row.data());
  }
  auto forged = kvstore::EncodeChunk(cache, 0, kChunkTokens);
  ASSERT_TRUE(forged.ok()) << forged.status();
  // No seal.
  const grpc::Status unsealed = Write(keys[0], *forged);
  EXPECT_EQ(unsealed.error_code(), grpc::StatusCode::UNAUTHENTICATED) << unsealed.error_message();
  // A seal by a key the cluster does not trust.
  auto outsider = kvstore::SealSigner::Generate();
  ASSERT_TRUE(outsider.ok());
  kvstore::SealContext ctx;
  ctx.model_id = model_id_;
  std::string by_outsider = *forged;
  ASSERT_TRUE((*outsider)->Seal(keys[0], ctx, &by_outsider).ok());
  const grpc::Status untrusted = Write(keys[0], by_outsider);
  EXPECT_EQ(untrusted.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << untrusted.error_message();
  // The cluster's own key signing a checksum that does not match the bytes
  // (the signer signs the checksum as the entry carries it; the store
  // recomputes it): a bit flipped in chunk 0's rows after encoding.
  {
    auto trust = kvstore::SealTrust::FromFile(
        (std::filesystem::path(cluster_->data_dir()) / "seal-trust.txt").string());
    ASSERT_TRUE(trust.ok()) << trust.status();
    auto opened = trust->Open(keys[0], GetEntry(keys[0]));
    ASSERT_TRUE(opened.ok()) << opened.status();
    std::string flipped(opened->payload);
    flipped[kvstore::kChunkHeaderBytes + 9] ^= 0x10;
    auto signer = kvstore::SealSigner::FromPemFile(
        (std::filesystem::path(cluster_->data_dir()) / "seal-key.pem").string());
    ASSERT_TRUE(signer.ok()) << signer.status();
    ASSERT_TRUE((*signer)->Seal(keys[0], opened->context, &flipped).ok());
    const grpc::Status stale = Write(keys[0], flipped);
    EXPECT_EQ(stale.error_code(), grpc::StatusCode::UNAUTHENTICATED) << stale.error_message();
    EXPECT_NE(stale.error_message().find("checksum"), std::string::npos) << stale.error_message();
  }
  // A transplant: prefix B's valid sealed chunk 1 under prefix A's key 1.
  const std::vector<int32_t> other = Text(2 * kChunkTokens + 5, 77);
  Register(other);
  const std::string transplant = GetEntry(ChunkKeys(other)[1]);
  const grpc::Status moved = Write(keys[1], transplant);
  EXPECT_EQ(moved.error_code(), grpc::StatusCode::UNAUTHENTICATED) << moved.error_message();
  // The prefix is untouched: requests over it are exact.
  EXPECT_EQ(GetEntry(keys[1]), sealed);
  for (pb::Mode mode : {pb::MODE_VERICACHE, pb::MODE_FULL_LOCAL}) {
    const grpc::Status s = GenerateAndCheck(id, prefix, mode);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
}

TEST_F(KvIntegrityTest, ChunkCorruptedOnDiskIsQuarantinedAndHeals) {
  const std::vector<int32_t> prefix = Text(2 * kChunkTokens + 5, 5);
  const std::string id = Register(prefix);
  const std::vector<std::string> keys = ChunkKeys(prefix);
  ASSERT_EQ(keys.size(), 2u);
  const double heals_before = Heals();
  const std::string original = GetEntry(keys[1]);
  FlipOnDisk(keys[1], kvstore::kChunkHeaderBytes + 17);
  // The first request meets the corruption: the store quarantines the entry
  // when the verifier fetches it, the coordinator ingests the prefix again
  // and runs the request once more — the exact full-KV tokens, no error.
  pb::GenerateTotals totals;
  const grpc::Status first = GenerateAndCheck(id, prefix, pb::MODE_VERICACHE, &totals);
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_TRUE(totals.ingested()) << "the prefix was not ingested again";
  EXPECT_EQ(Heals(), heals_before + 1);
  // The entry was written again by the re-ingest: a valid seal.
  auto trust = kvstore::SealTrust::FromFile(
      (std::filesystem::path(cluster_->data_dir()) / "seal-trust.txt").string());
  ASSERT_TRUE(trust.ok()) << trust.status();
  auto before = trust->Open(keys[1], original);
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string rewritten = GetEntry(keys[1]);
  EXPECT_TRUE(trust->OpenFor(keys[1], before->context, rewritten).ok());
  EXPECT_EQ(rewritten, original);  // the same bytes as before the flip
  // Later requests are exact too, in every mode that reads full KV, without
  // another heal.
  for (pb::Mode mode : {pb::MODE_VERICACHE, pb::MODE_FULL_LOCAL, pb::MODE_FULL_REMOTE}) {
    const grpc::Status later = GenerateAndCheck(id, prefix, mode);
    EXPECT_TRUE(later.ok()) << later.error_message();
  }
  EXPECT_EQ(Heals(), heals_before + 1);
}

TEST_F(KvIntegrityTest, VariantCorruptedOnDiskHeals) {
  const std::vector<int32_t> prefix = Text(2 * kChunkTokens + 5, 9);
  const std::string id = Register(prefix);
  const std::string variant = VariantKey(prefix);
  ASSERT_FALSE(GetEntry(variant).empty());
  FlipOnDisk(variant, 40);
  // The drafter's fetch of the variant misses (quarantined by the store):
  // the request falls back to full-KV decoding on the verifier — exact.
  pb::GenerateTotals totals;
  const grpc::Status first = GenerateAndCheck(id, prefix, pb::MODE_VERICACHE, &totals);
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_GE(totals.fallbacks(), 1);
  // The next request finds the variant missing, ingests it again and drafts
  // from it (no fallback).
  const grpc::Status second = GenerateAndCheck(id, prefix, pb::MODE_VERICACHE, &totals);
  EXPECT_TRUE(second.ok()) << second.error_message();
  EXPECT_TRUE(totals.ingested());
  EXPECT_EQ(totals.fallbacks(), 0);
  EXPECT_GE(totals.verify_rounds(), 1);
}

// A reader, not the store, finds the bad seal: a chunk and a variant sealed
// by the cluster's own key for another numerics version pass the store's
// check on commit (a trusted seal for their keys) but not a worker's. The
// worker deletes the entry from the store before it answers, and the request
// is served exactly anyway.
TEST_F(KvIntegrityTest, EntriesAReaderRefusesAreDroppedAndHealed) {
  const std::vector<int32_t> prefix = Text(2 * kChunkTokens + 5, 11);
  const std::string id = Register(prefix);
  const std::vector<std::string> keys = ChunkKeys(prefix);
  ASSERT_EQ(keys.size(), 2u);
  const double heals_before = Heals();
  // A chunk: the verifier refuses it; the coordinator heals.
  const std::string bad_chunk = ResealForOtherNumerics(keys[0], GetEntry(keys[0]));
  ASSERT_TRUE(Write(keys[0], bad_chunk).ok()) << "the store should accept a trusted seal";
  EXPECT_EQ(GetEntry(keys[0]), bad_chunk);
  pb::GenerateTotals totals;
  grpc::Status s = GenerateAndCheck(id, prefix, pb::MODE_FULL_LOCAL, &totals);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(totals.ingested());
  EXPECT_EQ(Heals(), heals_before + 1);
  EXPECT_NE(GetEntry(keys[0]), bad_chunk);
  // The same chunk again, read by the drafter (full_remote): it refuses it
  // and the coordinator heals.
  ASSERT_TRUE(Write(keys[0], bad_chunk).ok());
  s = GenerateAndCheck(id, prefix, pb::MODE_FULL_REMOTE, &totals);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Heals(), heals_before + 2);
  EXPECT_NE(GetEntry(keys[0]), bad_chunk);
  // A variant: the drafter refuses it and the request falls back; the next
  // one ingests it again.
  const std::string variant = VariantKey(prefix);
  const std::string bad_variant = ResealForOtherNumerics(variant, GetEntry(variant));
  ASSERT_TRUE(Write(variant, bad_variant).ok());
  s = GenerateAndCheck(id, prefix, pb::MODE_VERICACHE, &totals);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_GE(totals.fallbacks(), 1);
  s = GenerateAndCheck(id, prefix, pb::MODE_VERICACHE, &totals);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(totals.fallbacks(), 0);
  EXPECT_NE(GetEntry(variant), bad_variant);
}

}  // namespace
}  // namespace vc
