// End-to-end tests of the four real daemons on loopback (vc-kvstore,
// vc-verifier, vc-drafter, vc-coordinator started as processes by
// LocalCluster): many concurrent requests over distinct and shared stored
// prefixes, several compressors, greedy and seeded sampling and every
// request mode must produce exactly what single-process full-KV decoding
// produces (lossy_remote excepted: it is the unverified baseline), also with
// the drafter's online compressor update, all with TLS and API keys on
// (LocalCluster's default); bad input gets a precise
// INVALID_ARGUMENT; a killed drafter falls back, a killed
// verifier fails the request cleanly, and a killed store keeps its committed
// prefixes and loses its uncommitted put.
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "common/decode/full_decode.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"
#include "services/local/local_cluster.h"
#include "tests/scratch_dir.h"
#include "vericache/v1/coordinator.grpc.pb.h"
#include "vericache/v1/kvstore.grpc.pb.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc {
namespace {

namespace pb = ::vericache::v1;

std::string ModelPath() {
  const char* dir = std::getenv("VC_MODELS_DIR");
  return std::string(dir ? dir : "../shared/models") + "/stories260K.bin";
}

struct Spec {
  std::vector<int32_t> prompt;
  std::string prefix_id;          // registered prefix + suffix instead of prompt ids
  std::vector<int32_t> suffix;
  pb::Mode mode = pb::MODE_VERICACHE;
  std::string compressor;
  double ratio = 0;
  int bits = 0;
  bool seeded = false;
  uint64_t seed = 0;
  int draft_len = 0;
  int64_t max_new = 48;
  bool online_update = false;
  bool ignore_eos = true;
};

struct Outcome {
  grpc::Status status;
  std::vector<int32_t> tokens;          // from the final message
  std::vector<int32_t> streamed;        // concatenated round messages
  pb::GenerateTotals totals;
};

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_path_)) GTEST_SKIP() << "test model not found: " << model_path_;
    model_ = std::move(Model::Load(model_path_)).value();
    EngineOptions eo;
    eo.backend.threads = 1;
    engine_ = std::move(Engine::Create(*model_, eo)).value();
  }

  void StartCluster(local::LocalClusterOptions o = {}) {
    o.bin_dir = VC_DAEMON_DIR;
    o.model = model_path_;
    if (o.chunk_tokens == 64) o.chunk_tokens = 32;
    o.ingest_variants = "snapkv:0.3,int8,kivi:4";
    const std::string& logs = logs_.path();
    o.log_dir = logs;
    auto c = local::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status() << " (daemon logs in " << logs << ")";
    cluster_ = std::move(*c);
    stub_ = pb::Coordinator::NewStub(rpc::MakeChannel(cluster_->client(), 64 << 20));
  }

  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, const Spec& s) {
    DecodeOptions o;
    o.max_new_tokens = s.max_new;
    o.ignore_eos = s.ignore_eos;
    if (s.seeded) {
      o.sampling.temperature = 0.9f;
      o.sampling.top_k = 40;
      o.sampling.top_p = 0.95f;
      o.sampling.seed = s.seed;
    }
    return std::move(DecodeFull(*engine_, prompt, o)).value().tokens;
  }

  pb::GenerateRequest ToRequest(const Spec& s) {
    pb::GenerateRequest req;
    for (int32_t t : s.prompt) req.add_prompt_ids(t);
    req.set_prefix_id(s.prefix_id);
    for (int32_t t : s.suffix) req.add_suffix_ids(t);
    req.set_mode(s.mode);
    req.set_max_new_tokens(s.max_new);
    req.set_ignore_eos(s.ignore_eos);
    req.set_compressor(s.compressor);
    req.set_ratio(s.ratio);
    req.set_bits(s.bits);
    req.set_draft_len(s.draft_len);
    req.set_online_update(s.online_update);
    if (s.seeded) {
      req.mutable_sampling()->set_mode(pb::SamplingConfig::SEEDED);
      req.mutable_sampling()->set_temperature(0.9f);
      req.mutable_sampling()->set_top_k(40);
      req.mutable_sampling()->set_top_p(0.95f);
      req.mutable_sampling()->set_seed(s.seed);
    }
    return req;
  }

  // Runs one Generate; `on_first` runs after the first streamed message.
  Outcome Generate(const pb::GenerateRequest& req, const std::function<void()>& on_first = nullptr) {
    Outcome out;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(120));
    auto reader = stub_->Generate(ctx.get(), req);
    pb::GenerateResponse msg;
    bool first = true;
    while (reader->Read(&msg)) {
      if (msg.final()) {
        out.totals = msg.totals();
        out.tokens.assign(msg.totals().tokens().begin(), msg.totals().tokens().end());
      } else {
        out.streamed.insert(out.streamed.end(), msg.tokens().begin(), msg.tokens().end());
        if (first && on_first) on_first();
        first = false;
      }
    }
    out.status = reader->Finish();
    return out;
  }

  std::vector<int32_t> Text(int n, uint64_t seed) {
    // Prompts from the model itself (a greedy continuation of a short seed),
    // so drafts are accepted as on real text.
    std::vector<int32_t> p = {1, static_cast<int32_t>(300 + seed % 100)};
    DecodeOptions o;
    o.max_new_tokens = n - 2;
    o.ignore_eos = true;
    auto r = std::move(DecodeFull(*engine_, p, o)).value();
    p.insert(p.end(), r.tokens.begin(), r.tokens.end());
    return p;
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

  std::string model_path_ = ModelPath();
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  test_support::ScratchDir logs_{"cluster-logs-"};  // outlives the cluster
  std::unique_ptr<local::LocalCluster> cluster_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

TEST_F(ClusterTest, ConcurrentRequestsEqualFullKvDecoding) {
  local::LocalClusterOptions o;
  o.drafters = 2;
  StartCluster(o);
  // Shared prefixes (registered, and reused raw), distinct prompts.
  const std::vector<int32_t> shared_a = Text(96, 1);
  const std::vector<int32_t> shared_b = Text(70, 2);
  const std::string id_a = Register(shared_a);
  ASSERT_EQ(id_a.size(), 64u);
  std::vector<Spec> specs;
  const pb::Mode modes[] = {pb::MODE_VERICACHE, pb::MODE_VERICACHE, pb::MODE_FULL_REMOTE,
                            pb::MODE_FULL_LOCAL, pb::MODE_VERICACHE, pb::MODE_LOSSY_REMOTE};
  const std::vector<std::tuple<std::string, double, int>> compressors = {
      {"", 0, 0}, {"int8", 0, 0}, {"kivi", 0, 4}, {"snapkv", 0.3, 0}, {"streamingllm", 0.5, 0}};
  for (int i = 0; i < 36; ++i) {
    Spec s;
    s.mode = modes[i % 6];
    const auto& [name, ratio, bits] = compressors[i % compressors.size()];
    s.compressor = name;
    s.ratio = ratio;
    s.bits = bits;
    s.seeded = i % 3 == 1;
    s.seed = 1000 + i;
    s.draft_len = 2 + i % 7;
    s.max_new = 24 + (i % 4) * 8;
    if (i % 4 == 0) {
      s.prefix_id = id_a;
      s.suffix = {static_cast<int32_t>(10 + i), static_cast<int32_t>(20 + i)};
    } else if (i % 4 == 1) {
      s.prompt = shared_b;
      s.prompt.push_back(30 + i);
    } else {
      s.prompt = Text(40 + (i * 13) % 80, 50 + i);
    }
    specs.push_back(s);
  }
  std::vector<Outcome> outcomes(specs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < specs.size(); ++i) {
    threads.emplace_back([&, i] { outcomes[i] = Generate(ToRequest(specs[i])); });
  }
  for (auto& t : threads) t.join();
  int checked = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens, outcomes[i].streamed) << "request " << i;
    ASSERT_EQ(static_cast<int64_t>(outcomes[i].tokens.size()), s.max_new) << "request " << i;
    if (s.mode == pb::MODE_LOSSY_REMOTE) continue;  // the unverified baseline
    std::vector<int32_t> prompt = s.prompt;
    if (!s.prefix_id.empty()) {
      prompt = shared_a;
      prompt.insert(prompt.end(), s.suffix.begin(), s.suffix.end());
    }
    EXPECT_EQ(outcomes[i].tokens, Reference(prompt, s))
        << "request " << i << " mode " << s.mode << " compressor '" << s.compressor << "'";
    if (s.mode == pb::MODE_VERICACHE) {
      EXPECT_GT(outcomes[i].totals.verify_rounds(), 0) << "request " << i;
    }
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

// The cluster serving a Hugging Face checkpoint directory (tinystories656K):
// every daemon loads it from --model DIR, requests equal single-process
// decoding, and generation stops at the EOS of its generation_config.json.
class HfClusterTest : public ClusterTest {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("VC_MODELS_DIR");
    model_path_ = std::string(dir ? dir : "../shared/models") + "/tinystories656K";
    ClusterTest::SetUp();
  }
};

TEST_F(HfClusterTest, TinyStoriesRequestsEqualFullKvDecodingAndStopAtEos) {
  StartCluster();
  // "<|start_story|>Once upon a time" and a few more story openings.
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 80, 147, 201, 282, 57}, {1, 80, 147, 201, 282, 57, 11, 35}, {1, 80, 300, 301}};
  std::vector<Spec> specs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (pb::Mode mode : {pb::MODE_VERICACHE, pb::MODE_FULL_REMOTE}) {
      Spec s;
      s.prompt = prompts[i];
      s.mode = mode;
      s.compressor = i % 2 ? "kivi" : "int8";
      s.bits = i % 2 ? 4 : 0;
      s.draft_len = 4;
      s.max_new = 40;
      s.seeded = i == 2;
      s.seed = 7;
      specs.push_back(s);
    }
  }
  // One story long enough to end: it must stop at <|end_story|> (id 2).
  Spec story;
  story.prompt = prompts[0];
  story.max_new = 400;
  story.ignore_eos = false;
  story.draft_len = 8;
  specs.push_back(story);
  std::vector<Outcome> outcomes(specs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < specs.size(); ++i) {
    threads.emplace_back([&, i] { outcomes[i] = Generate(ToRequest(specs[i])); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens, Reference(specs[i].prompt, specs[i])) << "request " << i;
  }
  const std::vector<int32_t>& told = outcomes.back().tokens;
  ASSERT_FALSE(told.empty());
  ASSERT_LT(static_cast<int64_t>(told.size()), story.max_new) << "the story did not end within the budget";
  EXPECT_EQ(told.back(), 2);
  EXPECT_TRUE(outcomes.back().totals.stopped_at_eos());
}

TEST_F(ClusterTest, RejectsBadRequestsWithPreciseErrors) {
  StartCluster();
  auto code_of = [&](pb::GenerateRequest req) { return Generate(req).status; };
  pb::GenerateRequest req;
  req.set_max_new_tokens(8);
  req.add_prompt_ids(1);
  req.add_prompt_ids(100000);
  grpc::Status s = code_of(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("outside the vocabulary"), std::string::npos) << s.error_message();

  req.clear_prompt_ids();
  for (int i = 0; i < 500; ++i) req.add_prompt_ids(5);
  req.set_max_new_tokens(100);
  s = code_of(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("context"), std::string::npos) << s.error_message();

  req.clear_prompt_ids();
  req.add_prompt_ids(1);
  req.add_prompt_ids(5);
  req.set_max_new_tokens(8);
  req.set_compressor("snapkv");
  req.set_ratio(1.5);
  s = code_of(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req.set_ratio(0.5);
  req.set_compressor("nosuch");
  s = code_of(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("nosuch"), std::string::npos) << s.error_message();

  pb::GenerateRequest missing;
  missing.set_prefix_id(std::string(64, 'a'));
  missing.set_max_new_tokens(4);
  s = code_of(missing);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
}

// stop_token_ids (several EOS ids from generation_config.json, as the
// OpenAI gateway sends them): the output ends at the first of them, in every
// mode, also with ignore_eos; bad ids are INVALID_ARGUMENT; ClusterStatus
// reports the context length the gateway sizes max_tokens with.
TEST_F(ClusterTest, StopTokenIdsEndGenerationInEveryMode) {
  StartCluster();
  const std::vector<int32_t> prompt = Text(40, 7);
  Spec s;
  s.prompt = prompt;
  s.max_new = 32;
  const std::vector<int32_t> ref = Reference(prompt, s);
  // Two stop ids: the 10th and 20th generated tokens; the first occurrence of
  // either ends the output (inclusive).
  const std::vector<int32_t> stops = {ref[19], ref[9]};
  size_t end = ref.size();
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == stops[0] || ref[i] == stops[1]) {
      end = i + 1;
      break;
    }
  }
  const std::vector<int32_t> expected(ref.begin(), ref.begin() + static_cast<long>(end));
  for (pb::Mode mode : {pb::MODE_VERICACHE, pb::MODE_FULL_LOCAL, pb::MODE_FULL_REMOTE}) {
    s.mode = mode;
    pb::GenerateRequest req = ToRequest(s);  // ignore_eos is set
    for (int32_t id : stops) req.add_stop_token_ids(id);
    Outcome out = Generate(req);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.tokens, expected) << "mode " << mode;
    EXPECT_TRUE(out.totals.stopped_at_eos()) << "mode " << mode;
  }
  pb::GenerateRequest bad = ToRequest(s);
  bad.add_stop_token_ids(1 << 20);
  grpc::Status st = Generate(bad).status;
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("stop_token_ids"), std::string::npos) << st.error_message();
  pb::ClusterStatusResponse status;
  auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
  ASSERT_TRUE(stub_->ClusterStatus(ctx.get(), pb::ClusterStatusRequest(), &status).ok());
  EXPECT_EQ(status.context_length(), model_->config().max_seq_len);
}

// Sessions held by the workers, from ClusterStatus.
int WorkerSessions(pb::Coordinator::Stub* stub) {
  pb::ClusterStatusRequest req;
  pb::ClusterStatusResponse resp;
  auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
  if (!stub->ClusterStatus(ctx.get(), req, &resp).ok()) return -1;
  int sessions = 0;
  for (const auto& w : resp.workers()) sessions += w.sessions();
  return sessions;
}

TEST_F(ClusterTest, OnlineUpdateInTheDrafterEqualsFullKvDecoding) {
  StartCluster();
  // 80-token prompts: 64 stored tokens (two chunks), so the drafter folds
  // into the fetched variant.
  const std::vector<std::tuple<std::string, double, int>> compressors = {
      {"kivi", 0, 4}, {"int8", 0, 0}, {"streamingllm", 0.5, 0}, {"h2o", 0.5, 0}};
  std::vector<Spec> specs;
  for (size_t i = 0; i < compressors.size() * 2; ++i) {
    Spec s;
    const auto& [name, ratio, bits] = compressors[i / 2];
    s.prompt = Text(80, 400 + i);
    s.compressor = name;
    s.ratio = ratio;
    s.bits = bits;
    s.seeded = i % 2 == 1;
    s.seed = 500 + i;
    s.draft_len = 3 + static_cast<int>(i);
    s.max_new = 48;
    s.online_update = true;
    specs.push_back(s);
  }
  Spec lossy = specs[0];
  lossy.mode = pb::MODE_LOSSY_REMOTE;
  specs.push_back(lossy);
  std::vector<Outcome> out(specs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < specs.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = Generate(ToRequest(specs[i])); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    ASSERT_TRUE(out[i].status.ok()) << "request " << i << ": " << out[i].status.error_message();
    ASSERT_EQ(static_cast<int64_t>(out[i].tokens.size()), s.max_new) << "request " << i;
    EXPECT_EQ(out[i].tokens, out[i].streamed) << "request " << i;
    EXPECT_GT(out[i].totals.online_folds(), 0) << "request " << i << " (" << s.compressor << ")";
    EXPECT_GT(out[i].totals.drafter_kv_peak_bytes(), 0) << "request " << i;
    if (s.mode == pb::MODE_LOSSY_REMOTE) continue;  // the unverified baseline
    EXPECT_EQ(out[i].tokens, Reference(s.prompt, s))
        << "request " << i << " compressor " << s.compressor << " seeded " << s.seeded;
    EXPECT_GT(out[i].totals.verify_rounds(), 0) << "request " << i;
  }

  // Refused before any session opens, naming the problem.
  Spec bad;
  bad.prompt = Text(80, 450);
  bad.max_new = 8;
  bad.online_update = true;
  bad.compressor = "snapkv";
  bad.ratio = 0.3;
  grpc::Status st = Generate(ToRequest(bad)).status;
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("snapkv has no online rule"), std::string::npos)
      << st.error_message();
  bad.compressor = "int8";
  bad.ratio = 0;
  bad.mode = pb::MODE_FULL_LOCAL;
  st = Generate(ToRequest(bad)).status;
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("not full_local"), std::string::npos) << st.error_message();
  EXPECT_EQ(WorkerSessions(stub_.get()), 0);
}

TEST_F(ClusterTest, CancelAndClientDisconnectFreeEveryWorkersSessions) {
  StartCluster();
  Spec s;
  s.prompt = Text(80, 11);
  s.max_new = 400;
  s.compressor = "int8";
  s.draft_len = 2;
  // Cancel by id while the request streams.
  pb::GenerateRequest req = ToRequest(s);
  req.set_request_id("cancel-me");
  const Outcome out = Generate(req, [&] {
    pb::CancelRequest c;
    c.set_request_id("cancel-me");
    pb::CancelResponse cr;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    ASSERT_TRUE(stub_->Cancel(ctx.get(), c, &cr).ok());
    EXPECT_TRUE(cr.existed());
  });
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::CANCELLED) << out.status.error_message();
  {
    pb::GetRequestRequest g;
    g.set_request_id("cancel-me");
    pb::RequestStatus st;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    ASSERT_TRUE(stub_->GetRequest(ctx.get(), g, &st).ok());
    EXPECT_EQ(st.state(), "cancelled");
  }
  // The client goes away mid-stream (its context is cancelled).
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->Generate(&ctx, ToRequest(s));
    pb::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    (void)reader->Finish();
  }
  // Both requests' sessions are released on the verifier and the drafter.
  int sessions = -1;
  for (int i = 0; i < 200 && sessions != 0; ++i) {
    sessions = WorkerSessions(stub_.get());
    if (sessions != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(sessions, 0);
}

TEST_F(ClusterTest, PrefixPinUnpinDelete) {
  StartCluster();
  const std::vector<int32_t> prefix = Text(70, 12);
  const std::string id = Register(prefix);
  auto manage = [&](pb::ManagePrefixRequest::Action action, int* entries) {
    pb::ManagePrefixRequest req;
    req.set_prefix_id(id);
    req.set_action(action);
    pb::ManagePrefixResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    const grpc::Status s = stub_->ManagePrefix(ctx.get(), req, &resp);
    if (entries) *entries = resp.entries();
    return s;
  };
  int entries = 0;
  ASSERT_TRUE(manage(pb::ManagePrefixRequest::PIN, &entries).ok());
  // 2 chunks of 32, the 3 default variants, the manifest.
  EXPECT_EQ(entries, 2 + 3 + 1);
  const grpc::Status pinned = manage(pb::ManagePrefixRequest::DELETE, nullptr);
  EXPECT_EQ(pinned.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << pinned.error_message();
  ASSERT_TRUE(manage(pb::ManagePrefixRequest::UNPIN, nullptr).ok());
  ASSERT_TRUE(manage(pb::ManagePrefixRequest::DELETE, &entries).ok());
  Spec s;
  s.prefix_id = id;
  s.suffix = {9};
  s.max_new = 4;
  EXPECT_EQ(Generate(ToRequest(s)).status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ClusterTest, KilledDrafterFallsBackWithCorrectTokens) {
  StartCluster();
  Spec s;
  s.prompt = Text(80, 7);
  s.max_new = 200;
  s.compressor = "int8";
  s.draft_len = 4;
  const Outcome out = Generate(ToRequest(s), [&] { ASSERT_TRUE(cluster_->Kill("drafter").ok()); });
  // The verifier finishes the request alone (fallback to full-KV decoding).
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.tokens, Reference(s.prompt, s));
  EXPECT_GE(out.totals.fallbacks(), 1);
}

TEST_F(ClusterTest, KilledVerifierFailsCleanlyWithCorrectPrefix) {
  StartCluster();
  Spec s;
  s.prompt = Text(80, 8);
  s.max_new = 300;
  s.mode = pb::MODE_FULL_LOCAL;
  const Outcome out = Generate(ToRequest(s), [&] { ASSERT_TRUE(cluster_->Kill("verifier").ok()); });
  ASSERT_FALSE(out.status.ok()) << "the request cannot finish without its verifier";
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
  EXPECT_NE(out.status.error_message().find("verifier"), std::string::npos);
  const std::vector<int32_t> ref = Reference(s.prompt, s);
  ASSERT_LE(out.streamed.size(), ref.size());
  EXPECT_TRUE(std::equal(out.streamed.begin(), out.streamed.end(), ref.begin()));
}

TEST_F(ClusterTest, StoreRestartKeepsCommittedPrefixesAndDropsHalfWrittenPuts) {
  StartCluster();
  const std::vector<int32_t> prefix = Text(100, 9);
  const std::string id = Register(prefix);
  // A put that is begun and staged but never committed.
  auto store = pb::KvStore::NewStub(rpc::MakeChannel(cluster_->internal(cluster_->Find("kvstore")->address), 64 << 20));
  const std::string orphan(32, 'z');
  {
    pb::BeginPutRequest b;
    pb::BeginPutResponse br;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    ASSERT_TRUE(store->BeginPut(ctx.get(), b, &br).ok());
    pb::StageChunkRequest st;
    st.set_put_id(br.put_id());
    st.set_key(orphan);
    st.set_value("half-written");
    pb::StageChunkResponse sr;
    auto ctx2 = rpc::ContextWithTimeout(std::chrono::seconds(10));
    ASSERT_TRUE(store->StageChunk(ctx2.get(), st, &sr).ok());
  }
  ASSERT_TRUE(cluster_->Kill("kvstore").ok());
  ASSERT_TRUE(cluster_->RestartKvStore().ok());
  {
    pb::LookupRequest req;
    req.add_keys(orphan);
    pb::LookupResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    ctx->set_wait_for_ready(true);
    ASSERT_TRUE(store->Lookup(ctx.get(), req, &resp).ok());
    EXPECT_FALSE(resp.results(0).hit()) << "an uncommitted put became visible";
  }
  // The registered prefix is served from the restarted store (no ingest).
  Spec s;
  s.prefix_id = id;
  s.suffix = {42};
  s.max_new = 32;
  s.compressor = "int8";
  const Outcome out = Generate(ToRequest(s));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_FALSE(out.totals.ingested());
  std::vector<int32_t> prompt = prefix;
  prompt.push_back(42);
  EXPECT_EQ(out.tokens, Reference(prompt, s));
}

TEST_F(ClusterTest, SupervisorAndRestartBringDaemonsBackOnTheirAddresses) {
  local::LocalClusterOptions o;
  o.supervise = true;
  o.restart_backoff = std::chrono::milliseconds(100);
  StartCluster(o);
  // kill -9 (Kill()): the supervisor starts it again on the same address.
  int restarts = 0;
  for (const std::string name : {"drafter", "verifier"}) {
    const std::string address = cluster_->Find(name)->address;
    const pid_t old_pid = cluster_->Find(name)->pid;
    ASSERT_TRUE(cluster_->Kill(name).ok());
    ++restarts;
    // Counted once the new process is healthy.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (cluster_->supervisor_restarts() < restarts) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << name << " was not restarted";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(cluster_->Find(name)->address, address);
    EXPECT_NE(cluster_->Find(name)->pid, old_pid);
    auto channel = rpc::MakeChannel(cluster_->internal(address), 4 << 20);
    EXPECT_TRUE(rpc::CheckHealth(channel, std::chrono::seconds(10)).ok()) << name;
  }
  // An explicit restart of a running daemon (the coordinator): same port,
  // and it serves exact tokens again.
  const std::string coordinator = cluster_->coordinator();
  ASSERT_TRUE(cluster_->Restart("coordinator").ok());
  EXPECT_EQ(cluster_->coordinator(), coordinator);
  EXPECT_EQ(cluster_->Restart("no-such-daemon").code(), absl::StatusCode::kNotFound);
  Spec s;
  s.prompt = Text(70, 11);
  s.max_new = 24;
  s.compressor = "int8";
  const Outcome out = Generate(ToRequest(s));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.tokens, Reference(s.prompt, s));
}

// --max-stored-bytes-per-tenant outlives a coordinator restart: the
// coordinator keeps each tenant's count in a ledger entry in the store,
// which the restarted one reads before the tenant's next ingest. A
// 100-token prefix is one whole chunk of 64 tokens, at least 64 x 1280
// bytes of stories260K's KV (81,920): one fits under the limit, two do not.
TEST_F(ClusterTest, TheStoredBytesQuotaHoldsAcrossACoordinatorRestart) {
  local::LocalClusterOptions o;
  o.extra_flags["vc-coordinator"] = {"--max-stored-bytes-per-tenant=150000"};
  StartCluster(o);
  Register(Text(100, 9));  // admitted: nothing stored yet
  ASSERT_TRUE(cluster_->Restart("coordinator").ok());
  pb::RegisterPrefixRequest req;
  for (int32_t t : Text(100, 10)) req.add_tokens(t);
  pb::RegisterPrefixResponse resp;
  auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(60));
  ctx->set_wait_for_ready(true);
  const grpc::Status s = stub_->RegisterPrefix(ctx.get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max-stored-bytes-per-tenant"), std::string::npos)
      << s.error_message();
}

TEST_F(ClusterTest, StaggeredSchedulingKeepsThePacedFastLinkWithinCapacity) {
  // stories260K holds 1280 bytes of KV per token: a 96-token prefix is a
  // 123 kB reload, 31 ms on a 4 MB/s fast link, about 7 slots of 5 ms.
  const double bw = 4e6;
  for (const bool lock_step : {false, true}) {
    local::LocalClusterOptions o;
    o.fast_link_bytes_per_second = bw;
    o.slot_ms = 5;
    o.lock_step = lock_step;
    StartCluster(o);
    const int n = 8;
    std::vector<Spec> specs(n);
    std::vector<Outcome> out(n);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      specs[i].prompt = Text(100, 200 + i);
      specs[i].compressor = "int8";
      specs[i].draft_len = 4;
      specs[i].max_new = 24;
      threads.emplace_back([&, i] { out[i] = Generate(ToRequest(specs[i])); });
    }
    for (auto& th : threads) th.join();
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(out[i].status.ok()) << out[i].status.error_message();
      EXPECT_EQ(out[i].tokens, Reference(specs[i].prompt, specs[i])) << "request " << i;
    }
    pb::ClusterStatusResponse status;
    {
      pb::ClusterStatusRequest req;
      auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
      ASSERT_TRUE(stub_->ClusterStatus(ctx.get(), req, &status).ok());
    }
    ASSERT_GE(status.link_overrun_seconds_size(), 1);
    if (lock_step) {
      // Every request's reload lands in the same window: the fast link is
      // oversubscribed (what the staggered schedule avoids).
      EXPECT_GT(status.link_overrun_seconds(0), 0.0);
    } else {
      EXPECT_EQ(status.link_overrun_seconds(0), 0.0);
      EXPECT_LE(status.link_peak_slot_seconds(0), 0.005 + 1e-9);
    }
    // The data plane's own per-slot byte counters on the fast link never
    // exceed what one slot of the link can carry (plus one write piece).
    pb::StatResponse stat;
    {
      auto store =
          pb::KvStore::NewStub(rpc::MakeChannel(cluster_->internal(cluster_->Find("kvstore")->address), 64 << 20));
      pb::StatRequest req;
      auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
      ASSERT_TRUE(store->Stat(ctx.get(), req, &stat).ok());
    }
    const pb::LinkStat* fast = nullptr;
    for (const auto& l : stat.links()) {
      if (l.link() == "fast") fast = &l;
    }
    ASSERT_NE(fast, nullptr);
    EXPECT_GE(fast->bytes_total(), n * 96 * 1280);
    const double cap = bw * fast->slot_seconds() + (64 << 10);
    int64_t peak = 0;
    for (int64_t b : fast->bytes_per_slot()) peak = std::max(peak, b);
    EXPECT_LE(static_cast<double>(peak), cap) << (lock_step ? "lock-step" : "staggered");
    cluster_->Stop();
    cluster_.reset();
  }
}

TEST_F(ClusterTest, UcxDataPlaneCarriesTheChunkBytes) {
  local::LocalClusterOptions o;
  o.data_plane = "ucx";
  StartCluster(o);
  Spec s;
  s.prompt = Text(100, 300);
  s.compressor = "int8";
  s.max_new = 16;
  const Outcome out = Generate(ToRequest(s));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.tokens, Reference(s.prompt, s));
  for (const char* role : {"verifier", "drafter"}) {
    auto channel = rpc::MakeChannel(cluster_->internal(cluster_->Find(role)->address), 64 << 20);
    pb::WorkerInfoRequest req;
    pb::WorkerInfoResponse info;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    const grpc::Status st = std::string(role) == "verifier"
                                ? pb::Verifier::NewStub(channel)->Info(ctx.get(), req, &info)
                                : pb::Drafter::NewStub(channel)->Info(ctx.get(), req, &info);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(info.data_plane(), "ucx");
    EXPECT_GT(info.data_plane_bytes(), 0) << role;
    // UCX's own receive completions account for at least the chunk bytes.
    EXPECT_GE(info.data_plane_transport_bytes(), info.data_plane_bytes()) << role;
  }
  // The ingest's chunk bytes were uploaded over the store's data plane too
  // (stage requests on the verifier's fast link), not in gRPC messages.
  ASSERT_TRUE(out.totals.ingested());
  pb::StatResponse stat;
  {
    auto store =
        pb::KvStore::NewStub(rpc::MakeChannel(cluster_->internal(cluster_->Find("kvstore")->address), 64 << 20));
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    ASSERT_TRUE(store->Stat(ctx.get(), pb::StatRequest(), &stat).ok());
  }
  int fast_links = 0;
  for (const auto& l : stat.links()) {
    if (l.link() != "fast") continue;
    ++fast_links;
    EXPECT_GT(l.stages(), 0);
    EXPECT_GT(l.bytes_received(), 0);
  }
  EXPECT_EQ(fast_links, 1);
}

TEST_F(ClusterTest, RejectionSamplingIsServedInEveryMode) {
  // Distribution identity is tested in tests/common/cluster (chi-square over
  // the split sessions); here the daemons carry the draft distributions end
  // to end. Plain full-KV decoding under rejection sampling is seeded
  // sampling, so full_local and full_remote must equal the seeded reference
  // exactly.
  StartCluster();
  const std::vector<int32_t> prompt = Text(72, 21);
  const std::vector<std::tuple<pb::Mode, std::string, double, int>> runs = {
      {pb::MODE_VERICACHE, "streamingllm", 0.5, 0}, {pb::MODE_VERICACHE, "kivi", 0, 2},
      {pb::MODE_VERICACHE, "", 0, 0},               {pb::MODE_FULL_REMOTE, "", 0, 0},
      {pb::MODE_FULL_LOCAL, "", 0, 0},              {pb::MODE_LOSSY_REMOTE, "int8", 0, 0}};
  int64_t drafted = 0, accepted = 0;
  for (const auto& [mode, compressor, ratio, bits] : runs) {
    Spec s;
    s.prompt = prompt;
    s.mode = mode;
    s.compressor = compressor;
    s.ratio = ratio;
    s.bits = bits;
    s.seeded = true;
    s.seed = 77;
    s.draft_len = 4;
    s.max_new = 40;
    pb::GenerateRequest req = ToRequest(s);
    req.mutable_sampling()->set_mode(pb::SamplingConfig::REJECTION);
    const Outcome out = Generate(req);
    ASSERT_TRUE(out.status.ok()) << "mode " << mode << ": " << out.status.error_message();
    ASSERT_EQ(static_cast<int64_t>(out.tokens.size()), s.max_new) << "mode " << mode;
    EXPECT_EQ(out.tokens, out.streamed);
    for (int32_t t : out.tokens) ASSERT_TRUE(t >= 0 && t < model_->config().vocab_size);
    if (mode == pb::MODE_FULL_LOCAL || mode == pb::MODE_FULL_REMOTE) {
      EXPECT_EQ(out.tokens, Reference(prompt, s)) << "mode " << mode;
    }
    if (mode == pb::MODE_VERICACHE) {
      EXPECT_GT(out.totals.verify_rounds(), 0) << "mode " << mode;
      drafted += out.totals.drafted_tokens();
      accepted += out.totals.accepted_drafts();
    }
  }
  // The drafts were judged, not waved through or all refused.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(drafted, 0);

  pb::GenerateRequest cold;
  for (int32_t t : prompt) cold.add_prompt_ids(t);
  cold.set_max_new_tokens(4);
  cold.mutable_sampling()->set_mode(pb::SamplingConfig::REJECTION);  // no temperature
  const grpc::Status s = Generate(cold).status;
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("temperature"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace vc
