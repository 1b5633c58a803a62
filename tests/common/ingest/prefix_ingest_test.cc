// Prefix ingest: the variant-list grammar and its errors, the stored-prefix
// rule, key derivation (every input changes the keys), and the exactness the
// distributed system relies on: full KV reloaded from chunks is bit-identical
// to a fresh prefill (and decoding on it gives the same logits), and every
// variant made at ingest is byte-identical to compressing a direct prefill of
// the prefix. On a random model, and on stories260K when it is present.
#include "common/ingest/prefix_ingest.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/compress/attention_stats.h"
#include "common/engine/engine.h"
#include "common/kvstore/chunk_codec.h"
#include "common/kvstore/chunk_key.h"
#include "common/kvstore/variant_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/small_model_config.h"

namespace vc::ingest {
namespace {

using ::testing::HasSubstr;

// ---- ParseVariantList ----

TEST(ParseVariantListTest, ParsesTheDocumentedExample) {
  auto specs = ParseVariantList("snapkv:0.25,kivi:4,snapkv+kivi:0.5:4,streamingllm:0.3,int8");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 5u);
  const CompressorOptions d;
  struct Want {
    std::string name;
    double ratio;
    int bits;
  };
  const std::vector<Want> want = {{"snapkv", 0.25, 0},
                                  {"kivi", 0.0, 4},
                                  {"snapkv+kivi", 0.5, 4},
                                  {"streamingllm", 0.3, 0},
                                  {"int8", 0.0, 0}};
  for (size_t i = 0; i < want.size(); ++i) {
    const CompressorOptions& o = (*specs)[i].compressor;
    EXPECT_EQ(o.name, want[i].name) << i;
    EXPECT_EQ(o.ratio, want[i].ratio) << i;
    EXPECT_EQ(o.bits, want[i].bits) << i;
    // Everything else keeps its default.
    EXPECT_EQ(o.window, d.window);
    EXPECT_EQ(o.quant_group, d.quant_group);
    EXPECT_EQ(o.residual, d.residual);
    EXPECT_EQ(o.sink_tokens, d.sink_tokens);
  }
}

TEST(ParseVariantListTest, WhitespaceAndEmptyLists) {
  auto specs = ParseVariantList("  snapkv : 0.5 ,\tkivi:2 , h2o+int8:0.75:8 ");
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_EQ((*specs)[0].compressor.name, "snapkv");
  EXPECT_EQ((*specs)[0].compressor.ratio, 0.5);
  EXPECT_EQ((*specs)[1].compressor.bits, 2);
  EXPECT_EQ((*specs)[2].compressor.name, "h2o+int8");
  EXPECT_EQ((*specs)[2].compressor.ratio, 0.75);
  EXPECT_EQ((*specs)[2].compressor.bits, 8);
  // A composite's bits are optional.
  specs = ParseVariantList("pyramidkv+kivi:0.5");
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ((*specs)[0].compressor.bits, 0);
  for (const char* empty : {"", "   ", "\t"}) {
    specs = ParseVariantList(empty);
    ASSERT_TRUE(specs.ok()) << specs.status();
    EXPECT_TRUE(specs->empty());
  }
}

TEST(ParseVariantListTest, RejectsBadEntriesNamingThem) {
  struct Case {
    std::string text;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"foo:0.5", {"entry 1 ('foo:0.5')", "unknown compressor 'foo'", "snapkv"}},
      {"snapkv:0.25,bar", {"entry 2 ('bar')", "unknown compressor 'bar'"}},
      {"snapkv", {"entry 1", "snapkv needs a ratio, e.g. snapkv:0.25"}},
      {"snapkv+kivi", {"needs a ratio, e.g. snapkv+kivi:0.25:4"}},
      {"snapkv:abc", {"ratio 'abc' is not a number"}},
      {"snapkv:", {"empty ratio"}},
      {"snapkv:nan", {"ratio 'nan' is not a number"}},
      {"snapkv:inf", {"ratio 'inf' is not a number"}},
      {"snapkv:1.5", {"--ratio must be in (0, 1]"}},
      {"snapkv:0", {"--ratio must be in (0, 1]"}},
      {"snapkv:-0.5", {"--ratio must be in (0, 1]"}},
      {"snapkv:0.25:4", {"snapkv takes at most 1 number (its ratio), got 2"}},
      {"kivi:4:2", {"kivi takes at most 1 number (its bits), got 2"}},
      {"snapkv+kivi:0.5:4:1", {"takes at most 2 numbers (ratio then bits), got 3"}},
      {"kivi:0.5", {"bits '0.5' is not an integer"}},
      {"kivi:0", {"bits must be positive, got 0"}},
      {"kivi:3", {"kivi supports --bits 2 or 4"}},
      {"int8:4", {"int8 supports only --bits 8"}},
      {"snapkv+int8:0.5:4", {"int8 supports only --bits 8"}},
      {"snapkv:0.25,,kivi:4", {"entry 2", "empty entry"}},
      {"snapkv:0.25,", {"entry 2", "empty entry"}},
      {",", {"entry 1", "empty entry"}},
      {"kivi:4,kivi", {"entry 2 ('kivi')", "duplicate variant", "kivi(bits=4"}},
      {"snapkv:0.25,snapkv:0.250", {"entry 2", "duplicate variant"}},
      {"int8,int8:8", {"entry 2", "duplicate variant"}},
  };
  for (const Case& c : cases) {
    const auto r = ParseVariantList(c.text);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << c.text << ": " << r.status();
    for (const std::string& p : c.parts) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(p)) << c.text;
    }
  }
  // The same method at two ratios, or two widths, is two variants.
  EXPECT_TRUE(ParseVariantList("snapkv:0.25,snapkv:0.5,kivi:2,kivi:4").ok());
}

// ---- StoredPrefixTokens ----

TEST(StoredPrefixTokensTest, LargestWholeChunkPrefixBeforeTheLastToken) {
  struct Case {
    int32_t prompt;
    int chunk;
    int32_t want;
  };
  for (const Case& c : std::vector<Case>{{0, 4, 0},
                                         {1, 4, 0},
                                         {2, 4, 0},
                                         {4, 4, 0},
                                         {5, 4, 4},
                                         {8, 4, 4},
                                         {9, 4, 8},
                                         {7, 1, 6},
                                         {10, 0, 0},
                                         {10, -3, 0},
                                         {-5, 4, 0},
                                         {257, 256, 256},
                                         {256, 256, 0}}) {
    EXPECT_EQ(StoredPrefixTokens(c.prompt, c.chunk), c.want) << c.prompt << " / " << c.chunk;
  }
}

// ---- Keys ----

kvstore::ChunkKey SomeKey(uint8_t fill) {
  kvstore::ChunkKey k;
  k.bytes.fill(fill);
  return k;
}

VariantSpec Spec(const std::string& name, double ratio, int bits = 0) {
  VariantSpec s;
  s.compressor.name = name;
  s.compressor.ratio = ratio;
  s.compressor.bits = bits;
  return s;
}

TEST(VariantKeyForTest, IsTheVariantKeyOfTheDescription) {
  const kvstore::ChunkKey last = SomeKey(7);
  auto k = VariantKeyFor(last, Spec("snapkv", 0.25));
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(
      *k, kvstore::CompressedVariantKey(last, "snapkv(ratio=0.25,window=16,pool_kernel=7)", 0.25));
  auto q = VariantKeyFor(last, Spec("kivi", 0.0, 2));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, kvstore::CompressedVariantKey(last, "kivi(bits=2,group=32,residual=32)", 0.0));
  EXPECT_EQ(VariantKeyFor(last, Spec("snapkv", 2.0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VariantKeyFor(last, Spec("nope", 0.5)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(VariantKeyForTest, EveryInputChangesTheKey) {
  const kvstore::ChunkKey last = SomeKey(1);
  std::vector<VariantSpec> specs = {Spec("snapkv", 0.25),
                                    Spec("snapkv", 0.5),
                                    Spec("h2o", 0.25),
                                    Spec("snapkv+kivi", 0.25, 4),
                                    Spec("snapkv+kivi", 0.25, 2),
                                    Spec("kivi", 0.0, 4),
                                    Spec("kivi", 0.0, 2),
                                    Spec("int8", 0.0)};
  VariantSpec w = Spec("snapkv", 0.25);
  w.compressor.window = 8;
  specs.push_back(w);
  VariantSpec p = Spec("snapkv", 0.25);
  p.compressor.pool_kernel = 5;
  specs.push_back(p);
  VariantSpec g = Spec("kivi", 0.0, 4);
  g.compressor.quant_group = 16;
  specs.push_back(g);
  VariantSpec r = Spec("kivi", 0.0, 4);
  r.compressor.residual = 8;
  specs.push_back(r);
  std::vector<kvstore::ChunkKey> keys;
  for (const VariantSpec& s : specs) {
    auto k = VariantKeyFor(last, s);
    ASSERT_TRUE(k.ok()) << s.compressor.name << ": " << k.status();
    for (const kvstore::ChunkKey& other : keys) EXPECT_NE(*k, other) << s.compressor.name;
    keys.push_back(*k);
    auto other_prefix = VariantKeyFor(SomeKey(2), s);
    ASSERT_TRUE(other_prefix.ok());
    EXPECT_NE(*k, *other_prefix) << s.compressor.name;
  }
}

// ---- BuildPrefixEntries / LoadFullPrefix on a random model ----

constexpr int kChunk = 16;
constexpr int kChunks = 4;
constexpr int32_t kPrefix = kChunk * kChunks;

ModelConfig SmallConfig() { return test_support::SmallModelConfig(); }

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> ingest_engine;  // small batches: prefill in pieces
  std::unique_ptr<Engine> engine;         // the reference, one pass
  kvstore::ModelId id;
};

Fixture MakeFixture(std::unique_ptr<Model> model, int threads) {
  Fixture f;
  f.model = std::move(model);
  EngineOptions eo;
  eo.backend.threads = threads;
  eo.max_batch_tokens = 24;  // 64 tokens = 24 + 24 + 16
  f.ingest_engine = std::move(Engine::Create(*f.model, eo)).value();
  eo.max_batch_tokens = 4096;
  f.engine = std::move(Engine::Create(*f.model, eo)).value();
  f.id = kvstore::ComputeModelId(*f.model);
  return f;
}

Fixture& RandomFixture() {
  static Fixture* f =
      new Fixture(MakeFixture(std::move(Model::CreateRandom(SmallConfig(), 21)).value(), 1));
  return *f;
}

std::vector<int32_t> RandomTokens(int n, const ModelConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p = {c.bos_id};
  while (static_cast<int>(p.size()) < n)
    p.push_back(3 + static_cast<int32_t>(rng() % (c.vocab_size - 3)));
  return p;
}

kvstore::ChunkKeyOptions KeyOptions(int chunk = kChunk) {
  kvstore::ChunkKeyOptions o;
  o.chunk_tokens = chunk;
  o.tenant_salt = "tenant-a";
  return o;
}

std::vector<VariantSpec> AllKindsOfVariants() {
  std::vector<VariantSpec> v =
      std::move(ParseVariantList("snapkv:0.25,kivi:4,snapkv+kivi:0.5:2,streamingllm:0.3,int8,"
                                 "h2o:0.5,tova:0.4,pyramidkv+int8:0.5"))
          .value();
  // A second observation window: ingest must gather statistics for each.
  VariantSpec w = Spec("snapkv", 0.5);
  w.compressor.window = 8;
  v.push_back(w);
  VariantSpec k = Spec("kivi", 0.0, 2);
  k.compressor.quant_group = 8;
  k.compressor.residual = 5;
  v.push_back(k);
  return v;
}

// A fresh single-pass prefill of `tokens`, optionally with statistics.
std::unique_ptr<PagedKvCache> Prefill(Engine& e, const std::vector<int32_t>& tokens,
                                      AttentionObserver* observer, std::vector<float>* logits) {
  auto kv = std::make_unique<PagedKvCache>(e.config());
  const SequenceInput in{kv.get(), tokens, 0, observer};
  std::vector<float> scratch;
  const absl::Status s = e.Forward({&in, 1}, logits ? logits : &scratch);
  EXPECT_TRUE(s.ok()) << s;
  return kv;
}

void ExpectSameRows(const PagedKvCache& a, const PagedKvCache& b, int32_t n) {
  const size_t row = static_cast<size_t>(a.head_dim()) * sizeof(float);
  for (int l = 0; l < a.n_layers(); ++l) {
    for (int h = 0; h < a.kv_heads(); ++h) {
      for (int32_t p = 0; p < n; ++p) {
        ASSERT_EQ(std::memcmp(a.KeyAt(l, h, p), b.KeyAt(l, h, p), row), 0)
            << l << " " << h << " " << p;
        ASSERT_EQ(std::memcmp(a.ValueAt(l, h, p), b.ValueAt(l, h, p), row), 0)
            << l << " " << h << " " << p;
      }
    }
  }
}

std::vector<std::string> ChunkValues(const PrefixEntries& e) {
  std::vector<std::string> out;
  for (size_t i = 0; i < e.chunk_keys.size(); ++i) out.push_back(e.entries[i].second);
  return out;
}

// Checks every exactness property of ingest for `tokens` (a whole number of
// chunks) on fixture `f`, with `prompt` = tokens + a suffix.
void CheckIngestExactness(Fixture& f, const std::vector<int32_t>& prompt, int32_t prefix_len,
                          const kvstore::ChunkKeyOptions& ko,
                          const std::vector<VariantSpec>& variants) {
  const ModelConfig& c = f.engine->config();
  const std::vector<int32_t> prefix(prompt.begin(), prompt.begin() + prefix_len);
  auto built = BuildPrefixEntries(*f.ingest_engine, prefix, ko, f.id, variants);
  ASSERT_TRUE(built.ok()) << built.status();
  const PrefixEntries& e = *built;

  // Layout of the result.
  const int chunks = prefix_len / ko.chunk_tokens;
  EXPECT_EQ(e.prefix_tokens, prefix_len);
  EXPECT_EQ(e.chunk_keys, *kvstore::ChunkKeysForTokens(ko, f.id, prefix));
  ASSERT_EQ(e.chunk_keys.size(), static_cast<size_t>(chunks));
  ASSERT_EQ(e.entries.size(), chunks + variants.size());
  ASSERT_EQ(e.variants.size(), variants.size());
  for (int i = 0; i < chunks; ++i) EXPECT_EQ(e.entries[i].first, e.chunk_keys[i].Raw());

  // Full KV: chunks decode to exactly a fresh prefill's rows, of the prefix
  // alone and of the whole prompt (causal: the prefix rows do not change).
  auto loaded = LoadFullPrefix(c, ChunkValues(e), {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->first_position(), 0);
  EXPECT_EQ((*loaded)->next_position(), prefix_len);
  ExpectSameRows(**loaded, *Prefill(*f.engine, prefix, nullptr, nullptr), prefix_len);
  std::vector<float> ref_logits;
  const auto whole = Prefill(*f.engine, prompt, nullptr, &ref_logits);
  ExpectSameRows(**loaded, *whole, prefix_len);
  // Decoding the suffix on the reloaded prefix gives the same logits as
  // prefilling the whole prompt.
  const std::vector<int32_t> suffix(prompt.begin() + prefix_len, prompt.end());
  const SequenceInput in{loaded->get(), suffix, 0, nullptr};
  std::vector<float> logits;
  ASSERT_TRUE(f.engine->Forward({&in, 1}, &logits).ok());
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  ASSERT_EQ(logits.size(), suffix.size() * vocab);
  EXPECT_EQ(std::memcmp(logits.data(), ref_logits.data() + prefix_len * vocab,
                        logits.size() * sizeof(float)),
            0);

  // Variants: byte-identical to compressing a direct prefill of the prefix
  // with statistics of the variant's own window.
  for (size_t i = 0; i < variants.size(); ++i) {
    const StoredVariant& v = e.variants[i];
    auto compressor = std::move(CreateCompressor(variants[i].compressor)).value();
    const std::string what = compressor->Describe();
    AttentionStats stats(c, prefix_len, variants[i].compressor.window);
    const auto direct_kv = Prefill(*f.engine, prefix, &stats, nullptr);
    auto direct = compressor->Compress(c, *direct_kv, prefix_len, stats);
    ASSERT_TRUE(direct.ok()) << what << ": " << direct.status();
    const std::string direct_bytes = kvstore::EncodeCompressedPrefix(**direct);
    const auto& [key, value] = e.entries[chunks + i];
    EXPECT_EQ(value, direct_bytes) << what;
    EXPECT_EQ(v.description, what);
    EXPECT_EQ(v.target_ratio, variants[i].compressor.ratio) << what;
    EXPECT_EQ(v.key, *VariantKeyFor(e.chunk_keys.back(), variants[i])) << what;
    EXPECT_EQ(key, v.key.Raw()) << what;
    EXPECT_EQ(v.bytes, static_cast<int64_t>(value.size())) << what;
    EXPECT_EQ(v.kv_bytes, (*direct)->bytes()) << what;
    EXPECT_EQ(v.achieved_ratio, (*direct)->ratio()) << what;
    auto decoded = kvstore::DecodeCompressedPrefix(c, value);
    ASSERT_TRUE(decoded.ok()) << what << ": " << decoded.status();
    EXPECT_EQ((*decoded)->ratio(), v.achieved_ratio) << what;
    if (v.target_ratio > 0) {
      EXPECT_LE(v.achieved_ratio, v.target_ratio) << what;
    }
  }
}

TEST(BuildPrefixEntriesTest, ExactOnARandomModel) {
  Fixture& f = RandomFixture();
  const std::vector<int32_t> prompt = RandomTokens(kPrefix + 7, f.engine->config(), 5);
  CheckIngestExactness(f, prompt, kPrefix, KeyOptions(), AllKindsOfVariants());
}

TEST(BuildPrefixEntriesTest, NoVariantsAndOneChunk) {
  Fixture& f = RandomFixture();
  const std::vector<int32_t> prompt = RandomTokens(kChunk + 1, f.engine->config(), 6);
  CheckIngestExactness(f, prompt, kChunk, KeyOptions(), {});
}

// With a separate draft model the chunks stay the target's and the variants
// are the draft model's: each equals ingesting the prefix on the draft
// engine alone, stored under the key that names the draft model.
TEST(BuildPrefixEntriesTest, DraftModelVariantsComeFromTheDraftModel) {
  Fixture& f = RandomFixture();
  ModelConfig dc = SmallConfig();
  dc.n_layers = 1;
  dc.n_kv_heads = 4;
  Fixture d = MakeFixture(std::move(Model::CreateRandom(dc, 33)).value(), 1);
  const kvstore::ModelId draft_id = kvstore::DraftModelId(*d.model);
  const std::vector<int32_t> tokens = RandomTokens(kPrefix, f.engine->config(), 9);
  const std::vector<VariantSpec> variants = *ParseVariantList("snapkv:0.25,int8");
  const DraftModelIngest draft{d.ingest_engine.get(), draft_id};
  auto built =
      BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, variants, {}, &draft);
  ASSERT_TRUE(built.ok()) << built.status();
  auto target = BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, variants);
  auto alone = BuildPrefixEntries(*d.engine, tokens, KeyOptions(), f.id, variants);
  ASSERT_TRUE(target.ok() && alone.ok());
  const size_t chunks = built->chunk_keys.size();
  EXPECT_EQ(built->chunk_keys, target->chunk_keys);
  for (size_t i = 0; i < chunks; ++i) EXPECT_EQ(built->entries[i], target->entries[i]);
  ASSERT_EQ(built->variants.size(), variants.size());
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_EQ(built->entries[chunks + i].second, alone->entries[chunks + i].second) << i;
    EXPECT_NE(built->entries[chunks + i].second, target->entries[chunks + i].second) << i;
    EXPECT_EQ(built->variants[i].key,
              *VariantKeyFor(built->chunk_keys.back(), variants[i], &draft_id))
        << i;
    EXPECT_NE(built->variants[i].key, target->variants[i].key) << i;
  }
  // A draft engine of another vocabulary is refused before any work.
  ModelConfig wrong = dc;
  wrong.vocab_size = 32;
  Fixture w = MakeFixture(std::move(Model::CreateRandom(wrong, 34)).value(), 1);
  const DraftModelIngest bad{w.engine.get(), draft_id};
  EXPECT_EQ(BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, variants, {}, &bad)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The caller going away stops the ingest at the next prefill piece, chunk or
// variant: whenever `cancelled` first answers true, the result is Cancelled
// and nothing is returned to be written.
TEST(BuildPrefixEntriesTest, StopsOnceCancelled) {
  Fixture& f = RandomFixture();
  const std::vector<int32_t> tokens = RandomTokens(kPrefix, f.engine->config(), 8);
  const std::vector<VariantSpec> variants = *ParseVariantList("snapkv:0.25,kivi:4");
  // Never cancelled: asked before each of 3 prefill pieces (24 + 24 + 16
  // tokens), each of the 4 chunks and each of the 2 variants.
  int asked = 0;
  auto counted = BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, variants, [&] {
    ++asked;
    return false;
  });
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(asked, 3 + kChunks + 2);
  for (int stop_at = 1; stop_at <= asked; ++stop_at) {
    int calls = 0;
    auto r = BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, variants,
                                [&] { return ++calls >= stop_at; });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << "cancelled at ask " << stop_at;
    EXPECT_EQ(calls, stop_at) << "went on after the cancellation";
  }
}

TEST(BuildPrefixEntriesTest, KeysChangeWithEveryInput) {
  Fixture& f = RandomFixture();
  const std::vector<int32_t> tokens = RandomTokens(kPrefix, f.engine->config(), 7);
  const std::vector<VariantSpec> variants = *ParseVariantList("snapkv:0.25,kivi:4");
  auto base = BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, variants);
  ASSERT_TRUE(base.ok()) << base.status();
  // Deterministic.
  auto again = BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, variants);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->entries, base->entries);

  auto all_keys_differ = [&](const PrefixEntries& other, const std::string& what) {
    for (size_t i = 0; i < base->entries.size(); ++i) {
      EXPECT_NE(other.entries[i].first, base->entries[i].first) << what << " entry " << i;
    }
  };
  kvstore::ChunkKeyOptions salt = KeyOptions();
  salt.tenant_salt = "tenant-b";
  all_keys_differ(*BuildPrefixEntries(*f.ingest_engine, tokens, salt, f.id, variants), "salt");
  kvstore::ChunkKeyOptions numerics = KeyOptions();
  numerics.numerics_version = numerics.numerics_version + 1;
  all_keys_differ(*BuildPrefixEntries(*f.ingest_engine, tokens, numerics, f.id, variants),
                  "numerics version");
  kvstore::ChunkKeyOptions layout = KeyOptions();
  layout.kv_layout_version = 2;
  all_keys_differ(*BuildPrefixEntries(*f.ingest_engine, tokens, layout, f.id, variants),
                  "layout version");
  kvstore::ModelId other_id = f.id;
  other_id.bytes[0] ^= 1;
  all_keys_differ(*BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), other_id, variants),
                  "model id");
  // A token in the last chunk: earlier chunk keys (and bytes) stay, the last
  // chunk's key and every variant key change.
  std::vector<int32_t> changed = tokens;
  changed[kPrefix - 3] = changed[kPrefix - 3] == 5 ? 6 : 5;
  auto t = BuildPrefixEntries(*f.ingest_engine, changed, KeyOptions(), f.id, variants);
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < kChunks - 1; ++i) EXPECT_EQ(t->entries[i], base->entries[i]) << i;
  for (size_t i = kChunks - 1; i < base->entries.size(); ++i) {
    EXPECT_NE(t->entries[i].first, base->entries[i].first) << i;
  }
  // A token in the first chunk changes every key (the chain).
  changed = tokens;
  changed[1] = changed[1] == 5 ? 6 : 5;
  all_keys_differ(*BuildPrefixEntries(*f.ingest_engine, changed, KeyOptions(), f.id, variants),
                  "first token");
  // Variant parameters and ratio change only that variant's key.
  std::vector<VariantSpec> ratio = variants;
  ratio[0].compressor.ratio = 0.3;
  ratio[1].compressor.bits = 2;
  auto rv = BuildPrefixEntries(*f.ingest_engine, tokens, KeyOptions(), f.id, ratio);
  ASSERT_TRUE(rv.ok());
  for (int i = 0; i < kChunks; ++i) EXPECT_EQ(rv->entries[i], base->entries[i]);
  EXPECT_NE(rv->entries[kChunks].first, base->entries[kChunks].first);
  EXPECT_NE(rv->entries[kChunks + 1].first, base->entries[kChunks + 1].first);
}

TEST(BuildPrefixEntriesTest, RejectsBadInput) {
  Fixture& f = RandomFixture();
  const ModelConfig& c = f.engine->config();
  const std::vector<VariantSpec> none;
  auto expect = [](const absl::StatusOr<PrefixEntries>& r, const std::string& part) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(part));
  };
  expect(BuildPrefixEntries(*f.engine, {}, KeyOptions(), f.id, none), "got 0 tokens");
  const std::vector<int32_t> sixty = RandomTokens(60, c, 1);
  expect(BuildPrefixEntries(*f.engine, sixty, KeyOptions(), f.id, none), "got 60 tokens");
  const std::vector<int32_t> long_prompt = RandomTokens(144, c, 1);
  expect(BuildPrefixEntries(*f.engine, long_prompt, KeyOptions(), f.id, none),
         "exceeds the model's context of 128");
  const std::vector<int32_t> tokens = RandomTokens(kPrefix, c, 1);
  expect(BuildPrefixEntries(*f.engine, tokens, KeyOptions(0), f.id, none), "chunk_tokens");
  expect(BuildPrefixEntries(*f.engine, tokens, KeyOptions(), f.id, {Spec("snapkv", 2.0)}),
         "variant 1 (snapkv)");
  std::vector<int32_t> bad_token = tokens;
  bad_token[10] = c.vocab_size;
  EXPECT_EQ(BuildPrefixEntries(*f.engine, bad_token, KeyOptions(), f.id, none).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadFullPrefixTest, RejectsChunksThatDoNotLineUp) {
  Fixture& f = RandomFixture();
  const ModelConfig& c = f.engine->config();
  const std::vector<int32_t> tokens = RandomTokens(kPrefix, c, 8);
  auto e = BuildPrefixEntries(*f.engine, tokens, KeyOptions(), f.id, {});
  ASSERT_TRUE(e.ok());
  const std::vector<std::string> chunks = ChunkValues(*e);
  auto expect = [](const absl::StatusOr<std::unique_ptr<PagedKvCache>>& r, absl::StatusCode code,
                   const std::string& part) {
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(part));
  };
  expect(LoadFullPrefix(c, {}, {}), absl::StatusCode::kInvalidArgument, "no chunks");
  expect(LoadFullPrefix(c, {chunks[1], chunks[0]}, {}), absl::StatusCode::kInvalidArgument,
         "prefix chunk 0: KV chunk starts at position 16");
  expect(LoadFullPrefix(c, {chunks[0], chunks[2]}, {}), absl::StatusCode::kInvalidArgument,
         "prefix chunk 1: KV chunk starts at position 32 but the cache's next is 16");
  std::string corrupt = chunks[1];
  corrupt[100] ^= 1;
  expect(LoadFullPrefix(c, {chunks[0], corrupt}, {}), absl::StatusCode::kDataLoss,
         "prefix chunk 1: KV chunk: checksum mismatch");
  PagedKvCache::Options shifted;
  shifted.first_position = 16;
  expect(LoadFullPrefix(c, chunks, shifted), absl::StatusCode::kInvalidArgument, "position 0");
  PagedKvCache::Options small;
  small.max_tokens = kPrefix - 1;
  expect(LoadFullPrefix(c, chunks, small), absl::StatusCode::kResourceExhausted, "prefix chunk 3");
  ModelConfig other = c;
  other.n_kv_heads = 1;
  expect(LoadFullPrefix(other, chunks, {}), absl::StatusCode::kInvalidArgument, "does not match");
  // Chunks of unequal size (a 16-token chunk then an 8-token one).
  const auto kv = Prefill(*f.engine, RandomTokens(24, c, 9), nullptr, nullptr);
  const std::string a = *kvstore::EncodeChunk(*kv, 0, 16), b = *kvstore::EncodeChunk(*kv, 16, 8);
  expect(LoadFullPrefix(c, {a, b}, {}), absl::StatusCode::kInvalidArgument,
         "prefix chunk 1 holds 8 tokens, chunk 0 holds 16");
  // A bounded cache that fits is fine, and stays bounded.
  PagedKvCache::Options exact;
  exact.max_tokens = kPrefix;
  auto ok = LoadFullPrefix(c, chunks, exact);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->max_tokens(), kPrefix);
}

// ---- stories260K ----

std::string StoriesPath() {
  const char* dir = std::getenv("VC_MODELS_DIR");
  if (dir == nullptr) return "";
  const std::string p = std::string(dir) + "/stories260K.bin";
  return std::filesystem::exists(p) ? p : "";
}

TEST(BuildPrefixEntriesTest, ExactOnStories260K) {
  const std::string path = StoriesPath();
  if (path.empty()) GTEST_SKIP() << "stories260K.bin not found under $VC_MODELS_DIR";
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  Fixture f = MakeFixture(std::move(model).value(), 2);
  const ModelConfig& c = f.engine->config();
  const std::vector<int32_t> prompt = RandomTokens(3 * 32 + 5, c, 10);
  const int32_t prefix = StoredPrefixTokens(static_cast<int32_t>(prompt.size()), 32);
  ASSERT_EQ(prefix, 96);
  CheckIngestExactness(f, prompt, prefix, KeyOptions(32),
                       *ParseVariantList("snapkv:0.25,kivi:4,snapkv+kivi:0.5:4,streamingllm:0.3,"
                                         "int8,h2o+kivi:0.5:2"));
}

// Chunk keys carry the engine's numerics version by default, so KV computed
// under version 1 (before the fixed-block row-parallel reductions) is never
// served to an engine of version 2.
TEST(NumericsVersionTest, ChunkKeysDefaultToTheEnginesVersion) {
  EXPECT_EQ(kvstore::ChunkKeyOptions().numerics_version, kNumericsVersion);
  EXPECT_EQ(kNumericsVersion, 2u);
}

}  // namespace
}  // namespace vc::ingest
