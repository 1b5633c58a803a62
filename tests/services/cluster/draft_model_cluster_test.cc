// `--draft-model` in the cluster (issue 15 item 1): LocalCluster starts the
// real daemons as `vericache local --draft-model D` does. The draft model is
// a separate checkpoint written here from stories260K: its first two of five
// layers (same embeddings, so the same 512-token vocabulary, and drafts that
// agree often enough to exercise acceptance and rollback). The verifier makes
// the draft model's prefix variant at ingest; the drafter drafts with it,
// takes no KV refresh, and re-runs accepted tokens through the draft model.
// Checked: greedy and seeded outputs equal single-process full-KV decoding of
// the target token for token; the store holds the draft model's variant
// (keyed with its id) and not the target's; the drafter's KV is the draft
// model's (its size fits two layers, not five); no refresh bytes are sent; a
// draft model of another vocabulary stops vc-verifier, vc-drafter and
// `vericache local` at startup with exit 2 and one line; a drafter of another
// draft model is refused by the coordinator.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/decode/full_decode.h"
#include "common/engine/engine.h"
#include "common/ingest/prefix_ingest.h"
#include "common/kvstore/chunk_key.h"
#include "common/model/model.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"
#include "services/local/local_cluster.h"
#include "tests/scratch_dir.h"
#include "tests/services/cluster/cluster_test_command.h"
#include "tests/services/cluster/cluster_test_generate.h"
#include "tests/services/cluster/cluster_test_store.h"
#include "tests/services/cluster/cluster_test_text.h"
#include "vericache/v1/coordinator.grpc.pb.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc {
namespace {

namespace pb = ::vericache::v1;

constexpr int kChunkTokens = 32;
constexpr int kPrefixTokens = 160;
constexpr int kNewTokens = 40;
constexpr int kDraftLen = 6;

// Writes a llama2.c checkpoint made of `src`'s first `layers` layers and
// first `vocab` token embeddings (tied classifier, same dims and context).
// README of the test models: seven int32 (dim, hidden, layers, heads,
// kv_heads, vocab, seq_len), then the f32 tensors in a fixed order, each
// layered one [layers, ...], then a RoPE table this copies unchanged.
bool WriteTruncatedLlama2c(const std::string& src, const std::string& dst, int layers, int vocab) {
  std::ifstream in(src, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 28) return false;
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof h);
  const int64_t dim = h[0], hidden = h[1], n_layers = h[2], heads = h[3], kv_heads = h[4];
  if (h[5] <= 0 || layers > n_layers || vocab > h[5]) return false;
  const int64_t kv_dim = dim / heads * kv_heads;
  size_t at = sizeof h;
  std::string out;
  int32_t nh[7] = {h[0], h[1], layers, h[3], h[4], vocab, h[6]};
  out.append(reinterpret_cast<const char*>(nh), sizeof nh);
  auto copy = [&](int64_t keep_floats, int64_t total_floats) {
    out.append(bytes, at, static_cast<size_t>(keep_floats) * 4);
    at += static_cast<size_t>(total_floats) * 4;
  };
  copy(vocab * dim, h[5] * dim);  // token embedding
  // Per layer, in file order: rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3.
  for (int64_t per : {dim, dim * dim, kv_dim * dim, kv_dim * dim, dim * dim, dim, hidden * dim,
                      dim * hidden, hidden * dim}) {
    copy(per * layers, per * n_layers);
  }
  if (at > bytes.size()) return false;
  out.append(bytes, at, std::string::npos);  // rms_final and the RoPE table
  std::ofstream f(dst, std::ios::binary);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  return f.good();
}

class DraftModelClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(clustertest::StoriesModelPath()).good()) {
      GTEST_SKIP() << "test model not found: " << clustertest::StoriesModelPath();
    }
    dir_ = scratch_.path();
    draft_path_ = dir_ + "/stories-2layers.bin";
    other_draft_path_ = dir_ + "/stories-3layers.bin";
    small_vocab_path_ = dir_ + "/stories-vocab256.bin";
    ASSERT_TRUE(WriteTruncatedLlama2c(clustertest::StoriesModelPath(), draft_path_, 2, 512));
    ASSERT_TRUE(WriteTruncatedLlama2c(clustertest::StoriesModelPath(), other_draft_path_, 3, 512));
    ASSERT_TRUE(WriteTruncatedLlama2c(clustertest::StoriesModelPath(), small_vocab_path_, 2, 256));
    model_ = std::move(Model::Load(clustertest::StoriesModelPath())).value();
    draft_ = std::move(Model::Load(draft_path_)).value();
    EngineOptions eo;
    eo.backend.threads = 1;
    engine_ = std::move(Engine::Create(*model_, eo)).value();
  }
  local::LocalClusterOptions Options(const std::string& name) const {
    local::LocalClusterOptions o;
    o.bin_dir = VC_DAEMON_DIR;
    o.model = clustertest::StoriesModelPath();
    o.draft_model = draft_path_;
    o.insecure = true;
    o.chunk_tokens = kChunkTokens;
    o.ingest_variants = "int8,kivi:4";
    o.draft_len = kDraftLen;
    // Every token comes through a drafter round, however low the acceptance.
    o.extra_flags["vc-coordinator"] = {"--fallback-min-accepted=0"};
    o.log_dir = dir_ + "/logs-" + name;
    return o;
  }

  test_support::ScratchDir scratch_{"draft-model-"};
  std::string dir_, draft_path_, other_draft_path_, small_vocab_path_;
  std::unique_ptr<Model> model_, draft_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(DraftModelClusterTest, DraftModelDraftersStayExactOnTheirOwnKv) {
  const local::LocalClusterOptions o = Options("exact");
  auto cluster = local::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status() << " (daemon logs in " << o.log_dir << ")";
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel((*cluster)->client(), 64 << 20));
  auto store = pb::KvStore::NewStub(
      rpc::MakeChannel((*cluster)->internal((*cluster)->Find("kvstore")->address), 64 << 20));

  const std::vector<int32_t> prefix = clustertest::ModelText(*engine_, kPrefixTokens, 5);
  absl::StatusOr<std::string> registered = clustertest::RegisterPrefix(stub.get(), prefix);
  ASSERT_TRUE(registered.ok()) << registered.status();

  // The store keeps the draft model's variants, keyed with its id, and
  // none of the target's: drafters of this pool could not use them.
  const kvstore::ModelId target_id = kvstore::ComputeModelId(*model_);
  const kvstore::ModelId draft_id = kvstore::DraftModelId(*draft_);
  const std::vector<std::string> chunks =
      clustertest::RawChunkKeys(target_id, prefix, kChunkTokens);
  ASSERT_EQ(chunks.size(), static_cast<size_t>(kPrefixTokens / kChunkTokens));
  auto last = kvstore::ChunkKey::FromRaw(chunks.back());
  ASSERT_TRUE(last.ok());
  ingest::VariantSpec int8;
  int8.compressor.name = "int8";
  auto draft_key = ingest::VariantKeyFor(*last, int8, &draft_id);
  auto target_key = ingest::VariantKeyFor(*last, int8);
  ASSERT_TRUE(draft_key.ok() && target_key.ok());
  {
    pb::LookupRequest req;
    req.add_keys(draft_key->Raw());
    req.add_keys(target_key->Raw());
    pb::LookupResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    ASSERT_TRUE(store->Lookup(ctx.get(), req, &resp).ok());
    ASSERT_EQ(resp.results_size(), 2);
    EXPECT_TRUE(resp.results(0).hit()) << "the draft model's int8 variant is not stored";
    EXPECT_FALSE(resp.results(1).hit()) << "a target variant was made in a draft-model pool";
  }

  // The int8 variant's KV bytes for each model, as ingest makes them.
  auto int8_bytes = [&](const Model& m) -> int64_t {
    EngineOptions eo;
    eo.backend.threads = 1;
    auto engine = Engine::Create(m, eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return 0;
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = kChunkTokens;
    auto built = ingest::BuildPrefixEntries(**engine, prefix, ko, target_id, {int8});
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? built->variants.at(0).kv_bytes : 0;
  };
  const int64_t draft_prefix_bytes = int8_bytes(*draft_);
  const int64_t target_prefix_bytes = int8_bytes(*model_);
  std::printf("int8 prefix KV bytes: draft model %lld, target %lld\n",
              static_cast<long long>(draft_prefix_bytes),
              static_cast<long long>(target_prefix_bytes));

  struct Spec {
    std::string compressor;
    int bits = 0;
    bool seeded = false;
  };
  const std::vector<Spec> specs = {{"int8", 0, false}, {"int8", 0, true}, {"kivi", 4, false}};
  int64_t accepted = 0, rounds = 0, rolled_back_rounds = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    const std::vector<int32_t> suffix = {static_cast<int32_t>(60 + 11 * i)};
    const clustertest::PrefixGenerate g = clustertest::VeriCacheOverPrefix(
        *registered, suffix, s.compressor, s.bits, kDraftLen, kNewTokens, s.seeded, 41 + i);
    absl::StatusOr<pb::GenerateTotals> totals = clustertest::GenerateTotals(stub.get(), g.request);
    ASSERT_TRUE(totals.ok()) << "request " << i << ": " << totals.status();
    std::vector<int32_t> prompt = prefix;
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    auto ref = DecodeFull(*engine_, prompt, g.reference);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(std::vector<int32_t>(totals->tokens().begin(), totals->tokens().end()), ref->tokens)
        << "request " << i << " compressor " << s.compressor << " seeded " << s.seeded;
    EXPECT_GT(totals->verify_rounds(), 0) << "request " << i;
    EXPECT_EQ(totals->fallbacks(), 0) << "request " << i;
    EXPECT_EQ(totals->refresh_bytes(), 0) << "request " << i;
    EXPECT_EQ(totals->draft_model(), kvstore::ShortModelId(draft_id)) << "request " << i;
    if (s.compressor == "int8") {
      // The drafter's KV is the draft model's: at least its int8 prefix,
      // and with its tail still below the target's int8 prefix alone.
      EXPECT_GE(totals->drafter_kv_peak_bytes(), draft_prefix_bytes) << "request " << i;
      EXPECT_LT(totals->drafter_kv_peak_bytes(), target_prefix_bytes) << "request " << i;
    }
    accepted += totals->accepted_drafts();
    rounds += totals->verify_rounds();
    if (totals->accepted_drafts() < totals->drafted_tokens()) ++rolled_back_rounds;
  }
  std::printf(
      "draft_model=2-layer stories260K verify_rounds=%lld accepted_drafts=%lld "
      "mean_accepted=%.2f\n",
      static_cast<long long>(rounds), static_cast<long long>(accepted),
      rounds > 0 ? static_cast<double>(accepted) / static_cast<double>(rounds) : 0.0);
  // The draft model is another model: some drafts must have been rejected
  // (rolled back and re-run), and some accepted.
  EXPECT_GT(rolled_back_rounds, 0);
  EXPECT_GT(accepted, 0);

  // The remote baselines would decode with the draft model alone.
  pb::GenerateRequest remote;
  for (int32_t t : prefix) remote.add_prompt_ids(t);
  remote.set_mode(pb::MODE_LOSSY_REMOTE);
  remote.set_max_new_tokens(4);
  absl::StatusOr<pb::GenerateTotals> refused = clustertest::GenerateTotals(stub.get(), remote);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  (*cluster)->Stop();
}

TEST_F(DraftModelClusterTest, ADrafterOfAnotherDraftModelIsNeverPaired) {
  // The verifier makes the 2-layer model's variants; the drafter runs the
  // 3-layer one: the coordinator refuses it at startup (it would fetch
  // variants made for another model, or find none).
  local::LocalClusterOptions o = Options("other");
  o.extra_flags["vc-drafter"] = {"--draft-model=" + other_draft_path_};
  auto cluster = local::LocalCluster::Start(o);
  ASSERT_FALSE(cluster.ok()) << "a drafter of another draft model was accepted";
  std::ifstream log(o.log_dir + "/coordinator.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("has draft model"), std::string::npos) << cluster.status() << "\n" << text;

  // Pinned by the coordinator's flag: a pool of the right model with the
  // wrong id pinned is refused too.
  local::LocalClusterOptions p = Options("pinned");
  p.extra_flags["vc-coordinator"].push_back("--draft-model-id=" + std::string(64, 'a'));
  auto pinned = local::LocalCluster::Start(p);
  ASSERT_FALSE(pinned.ok()) << "a pool of another draft model than --draft-model-id was accepted";
}

TEST_F(DraftModelClusterTest, AnotherVocabularyExitsTwoWithOneLine) {
  const std::string worker_args = " --model " + clustertest::StoriesModelPath() +
                                  " --kvstore 127.0.0.1:1 --draft-model " + small_vocab_path_;
  const std::vector<std::string> commands = {
      std::string(VC_DAEMON_DIR) + "/vc-drafter" + worker_args,
      std::string(VC_DAEMON_DIR) + "/vc-verifier" + worker_args,
  };
  // The coordinator's pin is checked before it contacts anyone.
  for (const char* id : {"xyz", "abcd"}) {
    std::string out;
    const std::string c = std::string(VC_DAEMON_DIR) +
                          "/vc-coordinator --verifiers 127.0.0.1:1 --drafters 127.0.0.1:2 "
                          "--kvstore 127.0.0.1:3 --draft-model-id " +
                          id;
    EXPECT_EQ(clustertest::RunCommand(c, &out), 2) << c << "\n" << out;
    EXPECT_NE(out.find("--draft-model-id must be auto, none or 64 hex digits"), std::string::npos)
        << c << "\n"
        << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << c << "\n" << out;
  }
  for (const std::string& c : commands) {
    std::string out;
    EXPECT_EQ(clustertest::RunCommand(c, &out), 2) << c << "\n" << out;
    EXPECT_NE(out.find("--draft-model: draft model"), std::string::npos) << c << "\n" << out;
    EXPECT_NE(out.find("vocabulary of 256 tokens"), std::string::npos) << c << "\n" << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << c << "\n" << out;
  }
  std::string out;
  const std::string missing =
      std::string(VC_CLI_PATH) + " local --insecure --draft-model " + dir_ + "/none.bin";
  EXPECT_EQ(clustertest::RunCommand(missing, &out), 2) << out;
  EXPECT_NE(out.find("--draft-model"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace
}  // namespace vc
