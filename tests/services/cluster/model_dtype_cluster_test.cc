// A bf16 checkpoint through the whole cluster (issue 16): tinystories656K is
// converted to bf16 by deploy/scripts/convert_checkpoint.py into a temporary
// directory, the four real daemons serve it (LocalCluster, seals on), and
// requests in vericache mode (int8; snapkv with KV refresh; streamingllm
// with the drafter's online update; greedy and seeded), full_remote and
// full_local return exactly what single-process full-KV decoding of the same
// bf16 checkpoint returns. The store's chunks of a registered prefix are the
// single-process chunks byte for byte, carry the model's dtype, and take half
// the bytes per token of the same prefix through the f32 checkpoint (run on
// a second cluster). Prints the store and link bytes of both runs.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/decode/full_decode.h"
#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/kvstore/chunk_codec.h"
#include "common/kvstore/chunk_key.h"
#include "common/kvstore/seal.h"
#include "common/model/model.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"
#include "services/local/local_cluster.h"
#include "tests/scratch_dir.h"
#include "tests/services/cluster/cluster_test_generate.h"
#include "vericache/v1/coordinator.grpc.pb.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc {
namespace {

namespace fs = std::filesystem;
namespace pb = ::vericache::v1;

constexpr int kChunkTokens = 32;

struct Spec {
  pb::Mode mode = pb::MODE_VERICACHE;
  std::string compressor;
  double ratio = 0;
  bool seeded = false;
  bool online_update = false;
};

// What one cluster run measured.
struct RunStats {
  int64_t chunk_payload_bytes = 0;  // the prefix's stored chunks, header and checksum excluded
  int64_t chunk_tokens = 0;
  int64_t dram_bytes = 0;  // every entry the store holds (chunks, variants, manifest)
  int64_t fast_link_bytes = 0;
  int64_t slow_link_bytes = 0;
};

class ModelDtypeClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("VC_MODELS_DIR");
    f32_path_ = std::string(dir ? dir : "../shared/models") + "/tinystories656K";
    if (!fs::exists(f32_path_ + "/config.json"))
      GTEST_SKIP() << "test model not found: " << f32_path_;
    bf16_path_ = ::testing::TempDir() + "/tinystories656K-bf16-" + std::to_string(getpid());
    fs::remove_all(bf16_path_);
    const std::string cmd = std::string(VC_PYTHON) + " " + VC_CONVERT_SCRIPT + " " + f32_path_ +
                            " " + bf16_path_ + " --dtype bf16";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  }
  void TearDown() override {
    if (!bf16_path_.empty()) fs::remove_all(bf16_path_);
  }

  // Serves `path` on a fresh cluster: registers `prefix`, runs every spec on
  // prefix + suffix and checks it against single-process decoding, then
  // reads the prefix's chunks back from the store.
  void Run(const std::string& path, const std::vector<int32_t>& prefix, RunStats* stats) {
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status();
    EngineOptions eo;
    eo.backend.threads = 1;
    auto engine = Engine::Create(**model, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();

    local::LocalClusterOptions o;
    o.bin_dir = VC_DAEMON_DIR;
    o.model = path;
    o.chunk_tokens = kChunkTokens;
    o.ingest_variants = "int8,snapkv:0.5,streamingllm:0.5";
    // Without authentication the test can compute the chunk keys itself
    // (API keys salt them with a secret); seals stay on.
    o.insecure = true;
    const test_support::ScratchDir logs("model-dtype-cluster-logs-");  // outlives the cluster
    o.log_dir = logs.path();
    auto cluster = local::LocalCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status() << " (daemon logs in " << o.log_dir << ")";
    auto stub = pb::Coordinator::NewStub(rpc::MakeChannel((*cluster)->client(), 64 << 20));
    auto store = pb::KvStore::NewStub(
        rpc::MakeChannel((*cluster)->internal((*cluster)->Find("kvstore")->address), 64 << 20));

    absl::StatusOr<std::string> registered = clustertest::RegisterPrefix(stub.get(), prefix);
    ASSERT_TRUE(registered.ok()) << registered.status();
    const std::string prefix_id = *registered;

    const std::vector<Spec> specs = {
        {pb::MODE_VERICACHE, "int8", 0, false, false},
        {pb::MODE_VERICACHE, "int8", 0, true, false},
        {pb::MODE_VERICACHE, "snapkv", 0.5, false, false},
        {pb::MODE_VERICACHE, "snapkv", 0.5, true, false},
        {pb::MODE_VERICACHE, "streamingllm", 0.5, false, true},
        {pb::MODE_FULL_REMOTE, "", 0, false, false},
        {pb::MODE_FULL_REMOTE, "", 0, true, false},
        {pb::MODE_FULL_LOCAL, "", 0, false, false},
    };
    for (size_t i = 0; i < specs.size(); ++i) {
      const Spec& s = specs[i];
      const std::vector<int32_t> suffix = {static_cast<int32_t>(40 + i),
                                           static_cast<int32_t>(90 + i)};
      pb::GenerateRequest req;
      req.set_prefix_id(prefix_id);
      for (int32_t t : suffix) req.add_suffix_ids(t);
      req.set_mode(s.mode);
      req.set_max_new_tokens(32);
      req.set_ignore_eos(true);
      req.set_compressor(s.compressor);
      req.set_ratio(s.ratio);
      req.set_draft_len(4);
      req.set_online_update(s.online_update);
      DecodeOptions d;
      d.max_new_tokens = 32;
      d.ignore_eos = true;
      if (s.seeded) clustertest::UseSeededSampling(11 + i, req, d);
      absl::StatusOr<pb::GenerateTotals> generated = clustertest::GenerateTotals(stub.get(), req);
      ASSERT_TRUE(generated.ok()) << path << " request " << i << ": " << generated.status();
      const pb::GenerateTotals& totals = *generated;
      std::vector<int32_t> prompt = prefix;
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      auto ref = DecodeFull(**engine, prompt, d);
      ASSERT_TRUE(ref.ok()) << ref.status();
      EXPECT_EQ(std::vector<int32_t>(totals.tokens().begin(), totals.tokens().end()), ref->tokens)
          << path << " request " << i << " mode " << s.mode << " compressor '" << s.compressor
          << "' seeded " << s.seeded;
      if (s.mode == pb::MODE_VERICACHE) {
        EXPECT_GT(totals.verify_rounds(), 0) << "request " << i;
      }
      if (s.online_update) {
        EXPECT_GT(totals.online_folds(), 0) << "request " << i;
      }
    }

    // The prefix's chunks as stored: sealed by the cluster's key, in the
    // model's dtype, and byte for byte the chunks single-process prefill of
    // the same tokens encodes.
    kvstore::ChunkKeyOptions ko;
    ko.chunk_tokens = kChunkTokens;
    ko.numerics_version = NumericsVersionFor((*model)->config());
    auto keys = kvstore::ChunkKeysForTokens(ko, kvstore::ComputeModelId(**model), prefix);
    ASSERT_TRUE(keys.ok()) << keys.status();
    ASSERT_EQ(keys->size(), prefix.size() / kChunkTokens);
    auto trust = kvstore::SealTrust::FromFile(
        (fs::path((*cluster)->data_dir()) / "seal-trust.txt").string());
    ASSERT_TRUE(trust.ok()) << trust.status();
    PagedKvCache local((*model)->config());
    {
      SequenceInput in;
      in.kv = &local;
      in.tokens = prefix;
      in.first_logit = static_cast<int64_t>(prefix.size()) - 1;
      std::vector<float> logits;
      ASSERT_TRUE((*engine)->Forward(std::span<const SequenceInput>(&in, 1), &logits).ok());
    }
    for (size_t c = 0; c < keys->size(); ++c) {
      const std::string key = (*keys)[c].Raw();
      pb::GetRequest req;
      req.set_key(key);
      pb::GetResponse resp;
      auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(30));
      const grpc::Status s = store->Get(ctx.get(), req, &resp);
      ASSERT_TRUE(s.ok()) << "chunk " << c << ": " << s.error_message();
      auto opened = trust->Open(key, resp.value());
      ASSERT_TRUE(opened.ok()) << opened.status();
      const std::string chunk(opened->payload);
      auto header = kvstore::VerifyChunk(chunk);
      ASSERT_TRUE(header.ok()) << header.status();
      EXPECT_EQ(header->dtype, static_cast<uint32_t>((*model)->config().dtype)) << "chunk " << c;
      auto expected =
          kvstore::EncodeChunk(local, static_cast<int32_t>(c * kChunkTokens), kChunkTokens);
      ASSERT_TRUE(expected.ok()) << expected.status();
      EXPECT_TRUE(chunk == *expected) << "chunk " << c << " differs from single-process prefill";
      stats->chunk_payload_bytes += static_cast<int64_t>(chunk.size() - kvstore::kChunkHeaderBytes -
                                                         kvstore::kChunkChecksumBytes);
      stats->chunk_tokens += header->tokens;
    }

    pb::StatResponse stat;
    {
      auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(30));
      ASSERT_TRUE(store->Stat(ctx.get(), pb::StatRequest(), &stat).ok());
    }
    stats->dram_bytes = stat.dram_bytes();
    for (const pb::LinkStat& l : stat.links()) {
      if (l.link() == "fast") stats->fast_link_bytes = l.bytes_total();
      if (l.link() == "slow") stats->slow_link_bytes = l.bytes_total();
    }
    (*cluster)->Stop();
  }

  std::string f32_path_;
  std::string bf16_path_;
};

TEST_F(ModelDtypeClusterTest, Bf16CheckpointRoundTripsAndHalvesStoreBytes) {
  // "<|start_story|>Once upon a time" continued greedily by the f32 model
  // to 100 tokens: three whole 32-token chunks plus a partial one.
  std::vector<int32_t> prefix = {1, 80, 147, 201, 282, 57};
  {
    auto model = Model::Load(f32_path_);
    ASSERT_TRUE(model.ok()) << model.status();
    auto engine = Engine::Create(**model, EngineOptions());
    ASSERT_TRUE(engine.ok());
    DecodeOptions d;
    d.max_new_tokens = 100 - static_cast<int64_t>(prefix.size());
    d.ignore_eos = true;
    auto r = DecodeFull(**engine, prefix, d);
    ASSERT_TRUE(r.ok()) << r.status();
    prefix.insert(prefix.end(), r->tokens.begin(), r->tokens.end());
  }
  RunStats bf16, f32;
  ASSERT_NO_FATAL_FAILURE(Run(bf16_path_, prefix, &bf16));
  ASSERT_NO_FATAL_FAILURE(Run(f32_path_, prefix, &f32));
  ASSERT_EQ(bf16.chunk_tokens, 96);
  ASSERT_EQ(f32.chunk_tokens, 96);
  for (const auto& [name, s] :
       {std::pair<const char*, const RunStats&>{"f32", f32}, {"bf16", bf16}}) {
    std::cout << "tinystories656K " << name << ": store chunk payload "
              << s.chunk_payload_bytes / s.chunk_tokens << " bytes/token (" << s.chunk_tokens
              << " tokens), store dram_bytes " << s.dram_bytes << ", fast link "
              << s.fast_link_bytes << " bytes, slow link " << s.slow_link_bytes << " bytes\n";
  }
  EXPECT_EQ(bf16.chunk_payload_bytes * 2, f32.chunk_payload_bytes);
  EXPECT_LT(bf16.dram_bytes, f32.dram_bytes);
  EXPECT_LT(bf16.fast_link_bytes, f32.fast_link_bytes);
}

// The coordinator refuses a worker whose model differs from the others':
// here the drafter loads the bf16 copy while the verifier serves the f32
// checkpoint (other weights, so another model id, and another numerics
// version). The coordinator does not start; its log names the worker and
// both model ids, and the cluster start fails with a clear error.
TEST_F(ModelDtypeClusterTest, CoordinatorRefusesAWorkerOfAnotherDtype) {
  local::LocalClusterOptions o;
  o.bin_dir = VC_DAEMON_DIR;
  o.model = f32_path_;
  o.insecure = true;
  o.chunk_tokens = kChunkTokens;
  o.ingest_variants = "int8";
  o.start_timeout = std::chrono::seconds(60);
  // The drafter's own --model comes after the cluster's (the last one counts).
  o.extra_flags["vc-drafter"] = {"--model=" + bf16_path_};
  const test_support::ScratchDir logs("model-dtype-refusal-logs-");  // outlives the cluster
  o.log_dir = logs.path();
  auto cluster = local::LocalCluster::Start(o);
  ASSERT_FALSE(cluster.ok()) << "the coordinator accepted a bf16 drafter beside an f32 verifier";
  std::ifstream log(o.log_dir + "/coordinator.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("refusing a worker"), std::string::npos) << text;
  EXPECT_NE(text.find("runs another model"), std::string::npos) << text;
  EXPECT_NE(text.find("expected"), std::string::npos) << text;
  // The drafter itself loaded the bf16 copy fine (it is not the one failing).
  std::ifstream dlog(o.log_dir + "/drafter.log");
  const std::string dtext((std::istreambuf_iterator<char>(dlog)), std::istreambuf_iterator<char>());
  EXPECT_EQ(dtext.find("error"), std::string::npos) << dtext;
}

}  // namespace
}  // namespace vc
