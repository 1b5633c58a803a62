// Batch invariance of the forward pass (docs/numerics.md): a token's logits
// are bit-identical however its sequence is split into passes (one prefill,
// 1-token decodes, multi-token verify chunks), whatever other sequences share
// the pass, whatever the thread count and SIMD level, the KV block size, and
// after a rollback (PagedKvCache::Truncate) and recompute.
//
// Every comparison here is memcmp of f32 logits: not "close", identical.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "tests/sanitizer_scale.h"

namespace vc {
namespace {

// Logits of a sequence, [positions][vocab], flattened.
using Rows = std::vector<float>;

std::string ModelPath(const char* file) {
  const char* dir = std::getenv("VC_MODELS_DIR");
  if (dir == nullptr) return "";
  const std::string path = std::string(dir) + "/" + file;
  return std::filesystem::exists(path) ? path : "";
}

std::unique_ptr<Engine> MakeEngine(const Model& model, int threads, const std::string& simd) {
  EngineOptions options;
  options.backend.threads = threads;
  options.backend.simd = simd;
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

std::vector<std::string> SimdLevels() {
  std::vector<std::string> out;
  for (const char* name : {"scalar", "avx2", "avx512"}) {
    if (kernels::ParseSimdLevel(name).ok()) {
      out.push_back(name);
    } else {
      std::cout << "SIMD level " << name << " not supported here; skipped\n";
    }
  }
  return out;
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int n, const ModelConfig& c) {
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = tok(rng);
  t[0] = c.bos_id;
  return t;
}

// A seed from a name (FNV-1a), the same on every platform.
uint64_t SeedOf(const std::string& name) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Splits n tokens into consecutive chunks; sizes from [1, max_chunk].
std::vector<int> RandomChunks(std::mt19937_64& rng, int n, int max_chunk) {
  std::uniform_int_distribution<int> size(1, max_chunk);
  std::vector<int> chunks;
  for (int done = 0; done < n;) {
    const int c = std::min(n - done, size(rng));
    chunks.push_back(c);
    done += c;
  }
  return chunks;
}

// Runs `tokens[begin, end)` on `kv` in the given chunk sizes, one sequence per
// pass, appending every logit row to `rows`.
void RunChunks(Engine& engine, PagedKvCache& kv, const std::vector<int32_t>& tokens, size_t begin,
               const std::vector<int>& chunks, Rows* rows) {
  std::vector<float> logits;
  size_t pos = begin;
  for (int n : chunks) {
    SequenceInput in;
    in.kv = &kv;
    in.tokens = std::span<const int32_t>(tokens.data() + pos, static_cast<size_t>(n));
    in.first_logit = 0;
    const absl::Status s = engine.Forward(std::span<const SequenceInput>(&in, 1), &logits);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(logits.size(), static_cast<size_t>(n) * engine.config().vocab_size);
    rows->insert(rows->end(), logits.begin(), logits.end());
    pos += static_cast<size_t>(n);
  }
}

void RunFresh(Engine& engine, const std::vector<int32_t>& tokens, const std::vector<int>& chunks,
              Rows* rows, int block_tokens = 16) {
  PagedKvCache::Options o;
  o.block_tokens = block_tokens;
  PagedKvCache kv(engine.config(), o);
  rows->clear();
  RunChunks(engine, kv, tokens, 0, chunks, rows);
}

// memcmp, and on a mismatch the first differing (position, logit).
::testing::AssertionResult BitIdentical(const Rows& want, const Rows& got, int vocab) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure()
           << "row counts differ: " << want.size() / vocab << " vs " << got.size() / vocab;
  }
  if (want.empty() || std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) {
    return ::testing::AssertionSuccess();
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at position " << i / vocab << " logit " << i % vocab << ": "
             << want[i] << " vs " << got[i] << " (diff " << got[i] - want[i] << ")";
    }
  }
  return ::testing::AssertionFailure() << "memcmp differs but no element does (NaN payloads?)";
}

// A model under test and the sequence its checks run on.
struct Subject {
  std::string name;
  std::unique_ptr<Model> model;
  int length = 0;  // tokens of the main sequence
};

ModelConfig Shape(int dim, int hidden, int layers, int heads, int kv_heads, int head_dim, int vocab,
                  bool bias) {
  ModelConfig c;
  c.architecture = "random";
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = vocab;
  c.max_seq_len = 160;
  c.qkv_bias = bias;
  return c;
}

std::vector<Subject> Subjects() {
  std::vector<Subject> out;
  struct Spec {
    const char* name;
    ModelConfig config;
  };
  std::vector<Spec> specs;
  // GQA ratio 1, head_dim 12, dims not multiples of 16, biases.
  specs.push_back({"gqa1_hd12_bias", Shape(36, 70, 2, 4, 4, 12, 101, true)});
  // GQA ratio 2, head_dim 8, q_dim (64) != dim (40), no bias.
  specs.push_back({"gqa2_hd8", Shape(40, 72, 2, 8, 4, 8, 67, false)});
  // GQA ratio 4, head_dim 24, half-split RoPE with Llama 3 scaling, biases.
  {
    Spec s{"gqa4_hd24_llama3_bias", Shape(72, 130, 2, 8, 2, 24, 90, true)};
    s.config.rope.layout = RopeLayout::kHalfSplit;
    s.config.rope.scaling = RopeConfig::Scaling::kLlama3;
    s.config.rope.factor = 8.0;
    s.config.rope.original_max_position = 256;
    specs.push_back(s);
  }
  // GQA ratio 8, head_dim 14, sliding window, untied classifier.
  {
    Spec s{"gqa8_hd14_window_untied", Shape(50, 90, 3, 8, 1, 14, 77, false)};
    s.config.sliding_window = 11;
    s.config.tied_embeddings = false;
    specs.push_back(s);
  }
  // GQA ratio 8 with biases and a head_dim above 16 but not a multiple of it.
  {
    Spec s{"gqa8_hd20_bias_linear", Shape(24, 40, 1, 16, 2, 20, 50, true)};
    s.config.rope.scaling = RopeConfig::Scaling::kLinear;
    s.config.rope.factor = 2.0;
    specs.push_back(s);
  }
  uint64_t seed = 77;
  for (auto& s : specs) {
    auto m = Model::CreateRandom(s.config, ++seed);
    EXPECT_TRUE(m.ok()) << s.name << ": " << m.status();
    if (m.ok()) out.push_back({s.name, std::move(*m), 70});
  }
  const std::string path = ModelPath("stories260K.bin");
  if (path.empty()) {
    std::cout << "stories260K.bin not found in VC_MODELS_DIR; real-model cases skipped\n";
  } else {
    auto m = Model::Load(path);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) out.push_back({"stories260K", std::move(*m), 200});
  }
  return out;
}

class BatchInvarianceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { subjects_ = new std::vector<Subject>(Subjects()); }
  static void TearDownTestSuite() {
    delete subjects_;
    subjects_ = nullptr;
  }
  static std::vector<Subject>* subjects_;
};
std::vector<Subject>* BatchInvarianceTest::subjects_ = nullptr;

// (a) one prefill vs (b) token-by-token decode vs (c) random chunkings, and
// the KV block size.
TEST_F(BatchInvarianceTest, PrefillDecodeAndChunksAgree) {
  for (const auto& s : *subjects_) {
    SCOPED_TRACE(s.name);
    const int vocab = s.model->config().vocab_size;
    auto engine = MakeEngine(*s.model, 2, "auto");
    ASSERT_NE(engine, nullptr);
    std::mt19937_64 rng(SeedOf(s.name));
    const auto tokens = RandomTokens(rng, s.length, s.model->config());
    Rows prefill, rows;
    ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, {s.length}, &prefill));

    ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, std::vector<int>(s.length, 1), &rows));
    EXPECT_TRUE(BitIdentical(prefill, rows, vocab)) << "token-by-token decode";

    for (int max_chunk : {3, 9, 33}) {
      const auto chunks = RandomChunks(rng, s.length, max_chunk);
      ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, chunks, &rows));
      EXPECT_TRUE(BitIdentical(prefill, rows, vocab)) << "chunks up to " << max_chunk;
    }
    for (int block : {1, 5, 64, 512}) {
      const auto chunks = RandomChunks(rng, s.length, 7);
      ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, chunks, &rows, block));
      EXPECT_TRUE(BitIdentical(prefill, rows, vocab)) << "block_tokens " << block;
    }
  }
}

// (d) Mixed batches: several sequences advance together, each pass taking a
// random subset of them in random order, each with a random chunk (prefill,
// decode or verify sized) and a random first_logit. Every row any pass
// returns must equal that sequence's single-prefill row.
TEST_F(BatchInvarianceTest, MixedBatchesAgreeWithSoloPrefill) {
  for (const auto& s : *subjects_) {
    SCOPED_TRACE(s.name);
    const ModelConfig& c = s.model->config();
    const int vocab = c.vocab_size;
    auto engine = MakeEngine(*s.model, 2, "auto");
    ASSERT_NE(engine, nullptr);
    std::mt19937_64 rng(SeedOf(s.name) + 1);
    int64_t rows_checked = 0;
    int passes = 0;
    for (int round = 0; round < 3; ++round) {
      constexpr int kSeqs = 5;
      std::vector<std::vector<int32_t>> seqs;
      std::vector<Rows> solo(kSeqs);
      for (int i = 0; i < kSeqs; ++i) {
        const int len = std::uniform_int_distribution<int>(s.length / 4, s.length)(rng);
        seqs.push_back(RandomTokens(rng, len, c));
        ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, seqs[i], {len}, &solo[i]));
      }

      std::vector<std::unique_ptr<PagedKvCache>> kvs;
      for (int i = 0; i < kSeqs; ++i) {
        PagedKvCache::Options o;
        o.block_tokens = 1 + 7 * i;  // every sequence with its own block size
        kvs.push_back(std::make_unique<PagedKvCache>(c, o));
      }
      std::vector<size_t> done(kSeqs, 0);
      std::vector<float> logits;
      while (true) {
        std::vector<int> live;
        for (int i = 0; i < kSeqs; ++i) {
          if (done[i] < seqs[i].size()) live.push_back(i);
        }
        if (live.empty()) break;
        std::shuffle(live.begin(), live.end(), rng);
        live.resize(std::uniform_int_distribution<size_t>(1, live.size())(rng));

        std::vector<SequenceInput> batch;
        for (int i : live) {
          const size_t left = seqs[i].size() - done[i];
          // Mostly decodes and verify-sized chunks, sometimes a prefill of the
          // rest, so that passes mix all three kinds.
          const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
          size_t n = 1;  // decode
          if (done[i] == 0 && kind % 2 == 0) {
            n = std::uniform_int_distribution<size_t>(1, left)(rng);  // a prompt
          } else if (kind >= 9) {
            n = left;  // prefill the rest
          } else if (kind >= 4) {
            n = std::min<size_t>(left, std::uniform_int_distribution<size_t>(2, 12)(rng));
          }
          SequenceInput in;
          in.kv = kvs[i].get();
          in.tokens = std::span<const int32_t>(seqs[i].data() + done[i], n);
          switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
            case 0:
              in.first_logit = 0;
              break;
            case 1:
              in.first_logit = static_cast<int64_t>(n) - 1;
              break;
            case 2:
              in.first_logit = static_cast<int64_t>(n);
              break;
            default:
              in.first_logit = std::uniform_int_distribution<int64_t>(0, n)(rng);
          }
          batch.push_back(in);
        }
        const absl::Status st = engine->Forward(batch, &logits);
        ASSERT_TRUE(st.ok()) << st;
        ++passes;
        size_t row = 0;
        for (size_t b = 0; b < batch.size(); ++b) {
          const int i = live[b];
          const size_t n = batch[b].tokens.size();
          for (size_t t = static_cast<size_t>(batch[b].first_logit); t < n; ++t, ++row) {
            const size_t pos = done[i] + t;
            ASSERT_LT((row + 1) * vocab, logits.size() + 1);
            ASSERT_EQ(
                std::memcmp(&logits[row * vocab], &solo[i][pos * vocab], vocab * sizeof(float)), 0)
                << "sequence " << i << " position " << pos << " in a pass of " << batch.size()
                << " sequences (entry " << b << ", " << n << " tokens)";
            ++rows_checked;
          }
          done[i] += n;
        }
        ASSERT_EQ(row * vocab, logits.size());
      }
    }
    std::cout << s.name << ": " << passes << " mixed passes, " << rows_checked
              << " rows bit-identical\n";
  }
}

// Thread counts 1, 2, 4 and every SIMD level the CPU has.
TEST_F(BatchInvarianceTest, ThreadsAndSimdLevelsAgree) {
  const auto levels = SimdLevels();
  for (const auto& s : *subjects_) {
    SCOPED_TRACE(s.name);
    const int vocab = s.model->config().vocab_size;
    std::mt19937_64 rng(SeedOf(s.name) + 2);
    const auto tokens = RandomTokens(rng, s.length, s.model->config());
    const auto chunks = RandomChunks(rng, s.length, 6);
    Rows want;
    {
      auto engine = MakeEngine(*s.model, 1, "scalar");
      ASSERT_NE(engine, nullptr);
      ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, {s.length}, &want));
    }
    for (const auto& level : levels) {
      for (int threads : test_support::FullOrUnderSanitizer({1, 2, 4}, {1, 4})) {
        auto engine = MakeEngine(*s.model, threads, level);
        ASSERT_NE(engine, nullptr);
        Rows rows;
        ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, {s.length}, &rows));
        EXPECT_TRUE(BitIdentical(want, rows, vocab))
            << level << " threads " << threads << " prefill";
        ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, chunks, &rows));
        EXPECT_TRUE(BitIdentical(want, rows, vocab))
            << level << " threads " << threads << " chunked";
      }
    }
  }
}

// Rollback: rejected tokens written and then truncated away leave no trace.
TEST_F(BatchInvarianceTest, TruncateThenRecomputeIsIdentical) {
  for (const auto& s : *subjects_) {
    SCOPED_TRACE(s.name);
    const ModelConfig& c = s.model->config();
    const int vocab = c.vocab_size;
    auto engine = MakeEngine(*s.model, 2, "auto");
    ASSERT_NE(engine, nullptr);
    std::mt19937_64 rng(SeedOf(s.name) + 3);
    const auto tokens = RandomTokens(rng, s.length, c);
    Rows want;
    ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, {s.length}, &want));

    for (int block : {16, 3}) {
      PagedKvCache::Options o;
      o.block_tokens = block;
      PagedKvCache kv(c, o);
      Rows got;
      size_t done = 0;
      while (done < tokens.size()) {
        // A "draft" of random tokens is verified and rejected: written, then
        // truncated away. Its length sometimes crosses block boundaries.
        const int draft = std::uniform_int_distribution<int>(1, 20)(rng);
        const auto junk = RandomTokens(rng, draft + 1, c);
        const size_t accepted =
            std::min(tokens.size() - done, std::uniform_int_distribution<size_t>(1, 8)(rng));
        if (done + accepted + draft <= static_cast<size_t>(kv.max_tokens())) {
          Rows ignored;
          ASSERT_NO_FATAL_FAILURE(RunChunks(*engine, kv, junk, 1, {draft}, &ignored));
          ASSERT_EQ(kv.next_position(), static_cast<int32_t>(done) + draft);
          kv.Truncate(static_cast<int32_t>(done));
          ASSERT_EQ(kv.next_position(), static_cast<int32_t>(done));
        }
        ASSERT_NO_FATAL_FAILURE(
            RunChunks(*engine, kv, tokens, done, {static_cast<int>(accepted)}, &got));
        done += accepted;
      }
      EXPECT_TRUE(BitIdentical(want, got, vocab)) << "drafts rejected, block_tokens " << block;

      // A deep rollback over already-accepted tokens, then recompute them.
      const int32_t keep = static_cast<int32_t>(tokens.size() / 3);
      kv.Truncate(keep);
      Rows redo;
      ASSERT_NO_FATAL_FAILURE(RunChunks(*engine, kv, tokens, static_cast<size_t>(keep),
                                        RandomChunks(rng, s.length - keep, 5), &redo));
      const Rows tail(want.begin() + static_cast<int64_t>(keep) * vocab, want.end());
      EXPECT_TRUE(BitIdentical(tail, redo, vocab)) << "deep rollback, block_tokens " << block;
      EXPECT_EQ(kv.bytes(), int64_t{s.length} * c.kv_bytes_per_token());
    }
  }
}

// The smallest version of the property, easy to read when it fails: the last
// token's logits from a full prefill, a decode step and a 2-token verify.
TEST_F(BatchInvarianceTest, LastTokenThreeWays) {
  for (const auto& s : *subjects_) {
    SCOPED_TRACE(s.name);
    const ModelConfig& c = s.model->config();
    auto engine = MakeEngine(*s.model, 2, "auto");
    ASSERT_NE(engine, nullptr);
    std::mt19937_64 rng(5);
    const auto tokens = RandomTokens(rng, 12, c);
    Rows a, b, d;
    ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, {12}, &a));
    ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, {11, 1}, &b));
    ASSERT_NO_FATAL_FAILURE(RunFresh(*engine, tokens, {10, 2}, &d));
    EXPECT_TRUE(BitIdentical(a, b, c.vocab_size)) << "prefill 12 vs prefill 11 + decode 1";
    EXPECT_TRUE(BitIdentical(a, d, c.vocab_size)) << "prefill 12 vs prefill 10 + verify 2";
  }
}

}  // namespace
}  // namespace vc
