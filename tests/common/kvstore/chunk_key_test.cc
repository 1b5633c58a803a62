#include "common/kvstore/chunk_key.h"

#include <functional>
#include <numeric>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace vc::kvstore {
namespace {

ModelId TestModel(uint8_t fill) {
  ModelId m;
  m.bytes.fill(fill);
  return m;
}

std::vector<int32_t> Iota(int n, int32_t start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(ChunkKeyTest, SameInputsSameKeyAndHex) {
  ChunkKeyOptions o;
  o.tenant_salt = "tenant";
  const auto tokens = Iota(8);
  const ChunkKey a = FullChunkKey(o, TestModel(1), nullptr, tokens);
  const ChunkKey b = FullChunkKey(o, TestModel(1), nullptr, tokens);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.Hex().size(), 64u);
  EXPECT_EQ(a.Hex().find_first_not_of("0123456789abcdef"), std::string::npos);
  auto raw = ChunkKey::FromRaw(a.Raw());
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, a);
  EXPECT_EQ(ChunkKey::FromRaw("short").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChunkKeyTest, HexOfKnownBytes) {
  ChunkKey k;
  for (size_t i = 0; i < 32; ++i) k.bytes[i] = static_cast<uint8_t>(i * 8);
  EXPECT_EQ(k.Hex().substr(0, 8), "00081018");
  EXPECT_EQ(k.Hex().substr(62), "f8");
}

// Property: flipping any one input changes the key.
TEST(ChunkKeyTest, EveryFieldChangesTheKey) {
  ChunkKeyOptions base;
  base.tenant_salt = "salt";
  const ModelId model = TestModel(7);
  const ChunkKey prev = FullChunkKey(base, model, nullptr, Iota(4, 100));
  const auto tokens = Iota(4);
  const ChunkKey ref = FullChunkKey(base, model, &prev, tokens);

  std::vector<std::pair<const char*, std::function<ChunkKey()>>> flips = {
      {"salt",
       [&] {
         auto o = base;
         o.tenant_salt = "salu";
         return FullChunkKey(o, model, &prev, tokens);
       }},
      {"empty salt",
       [&] {
         auto o = base;
         o.tenant_salt = "";
         return FullChunkKey(o, model, &prev, tokens);
       }},
      {"numerics",
       [&] {
         auto o = base;
         o.numerics_version = base.numerics_version + 1;
         return FullChunkKey(o, model, &prev, tokens);
       }},
      {"layout",
       [&] {
         auto o = base;
         o.kv_layout_version = 2;
         return FullChunkKey(o, model, &prev, tokens);
       }},
      {"no previous", [&] { return FullChunkKey(base, model, nullptr, tokens); }},
      {"token count", [&] { return FullChunkKey(base, model, &prev, Iota(3)); }},
  };
  for (size_t byte = 0; byte < 32; ++byte) {
    flips.push_back({"model byte", [&, byte] {
                       ModelId m = model;
                       m.bytes[byte] ^= 1;
                       return FullChunkKey(base, m, &prev, tokens);
                     }});
    flips.push_back({"previous byte", [&, byte] {
                       ChunkKey p = prev;
                       p.bytes[byte] ^= 0x80;
                       return FullChunkKey(base, model, &p, tokens);
                     }});
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    flips.push_back({"token", [&, i] {
                       auto t = tokens;
                       t[i] += 1;
                       return FullChunkKey(base, model, &prev, t);
                     }});
  }
  std::set<ChunkKey> seen = {ref};
  for (auto& [name, f] : flips) {
    const ChunkKey k = f();
    EXPECT_NE(k, ref) << name;
    seen.insert(k);
  }
  EXPECT_EQ(seen.size(), flips.size() + 1) << "two different flips collided";
}

TEST(ChunkKeyTest, SplitsOnlyWholeChunksAndChains) {
  ChunkKeyOptions o;
  o.chunk_tokens = 4;
  const ModelId model = TestModel(3);
  auto tokens = Iota(4 * 4 + 3);
  auto keys = ChunkKeysForTokens(o, model, tokens);
  ASSERT_TRUE(keys.ok());
  ASSERT_EQ(keys->size(), 4u);
  // Each key chains on the previous.
  EXPECT_EQ((*keys)[0], FullChunkKey(o, model, nullptr, absl::MakeSpan(tokens).subspan(0, 4)));
  for (size_t i = 1; i < keys->size(); ++i) {
    EXPECT_EQ((*keys)[i],
              FullChunkKey(o, model, &(*keys)[i - 1], absl::MakeSpan(tokens).subspan(4 * i, 4)));
  }
  // Changing chunk 1 changes keys 1..3, not key 0.
  tokens[5] = 999;
  auto changed = ChunkKeysForTokens(o, model, tokens);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ((*changed)[0], (*keys)[0]);
  for (size_t i = 1; i < 4; ++i) EXPECT_NE((*changed)[i], (*keys)[i]) << i;
  // The trailing partial chunk does not matter.
  tokens[17] = 12345;
  auto tail = ChunkKeysForTokens(o, model, tokens);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, *changed);
  // Fewer tokens than a chunk: no keys.
  auto none = ChunkKeysForTokens(o, model, Iota(3));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // Default chunk size is 256.
  EXPECT_EQ(ChunkKeyOptions().chunk_tokens, 256);
  o.chunk_tokens = 0;
  EXPECT_EQ(ChunkKeysForTokens(o, model, tokens).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChunkKeyTest, LengthPrefixingPreventsAmbiguity) {
  // Tensor boundaries: [1,2][3] vs [1][2,3] vs [1,2,3].
  ModelConfig c;
  const float w[3] = {1, 2, 3};
  const absl::Span<const float> all(w, 3);
  const std::vector<absl::Span<const float>> a = {all.subspan(0, 2), all.subspan(2, 1)};
  const std::vector<absl::Span<const float>> b = {all.subspan(0, 1), all.subspan(1, 2)};
  const std::vector<absl::Span<const float>> one = {all};
  EXPECT_NE(ComputeModelId(c, a), ComputeModelId(c, b));
  EXPECT_NE(ComputeModelId(c, a), ComputeModelId(c, one));
  // Architecture "ab" + first tensor vs "a" + a tensor starting with "b":
  // field lengths keep them apart.
  ModelConfig ab = c, a1 = c;
  ab.architecture = "ab";
  a1.architecture = "a";
  EXPECT_NE(ComputeModelId(ab, one), ComputeModelId(a1, one));
  // Salt "ab" + tokens vs salt "a" + tokens: prefixes of each other.
  ChunkKeyOptions s1, s2;
  s1.tenant_salt = "ab";
  s2.tenant_salt = "a";
  EXPECT_NE(FullChunkKey(s1, TestModel(0), nullptr, Iota(2)),
            FullChunkKey(s2, TestModel(0), nullptr, Iota(2)));
  // Compressor description vs ratio: "x" with ratio r vs "x" + bytes of r.
  EXPECT_NE(CompressedVariantKey(TestModel(1), "snapkv", 0.5),
            CompressedVariantKey(TestModel(1), "snapk", 0.5));
  // An empty previous key (first chunk) differs from an all-zero one.
  ChunkKey zero;
  EXPECT_NE(FullChunkKey(s1, TestModel(0), nullptr, Iota(2)),
            FullChunkKey(s1, TestModel(0), &zero, Iota(2)));
}

// A tenant's ledger key depends on the model and the tenant, and is no
// manifest key: the manifest of an empty prefix under a salt equal to the
// tenant's name is the nearest one (domains keep them apart).
TEST(ChunkKeyTest, TenantLedgerKeysAreAKindOfTheirOwn) {
  EXPECT_EQ(TenantLedgerKey(TestModel(0), "a"), TenantLedgerKey(TestModel(0), "a"));
  EXPECT_NE(TenantLedgerKey(TestModel(0), "a"), TenantLedgerKey(TestModel(0), "b"));
  EXPECT_NE(TenantLedgerKey(TestModel(0), "a"), TenantLedgerKey(TestModel(1), "a"));
  EXPECT_NE(TenantLedgerKey(TestModel(0), ""), TenantLedgerKey(TestModel(0), std::string(1, '\0')));
  ChunkKeyOptions o;
  o.tenant_salt = "a";
  EXPECT_NE(TenantLedgerKey(TestModel(0), "a"), PrefixManifestKey(o, TestModel(0), {}));
}

TEST(ChunkKeyTest, DraftModelVariantKeysNameTheirDraftModel) {
  const ChunkKey last = TestModel(3);
  const ModelId draft_a = TestModel(4), draft_b = TestModel(5);
  const ChunkKey target = CompressedVariantKey(last, "int8", 0);
  const ChunkKey a = CompressedVariantKey(last, "int8", 0, &draft_a);
  EXPECT_EQ(a, CompressedVariantKey(last, "int8", 0, &draft_a));
  // Never the target's key, nor another draft model's.
  EXPECT_NE(a, target);
  EXPECT_NE(a, CompressedVariantKey(last, "int8", 0, &draft_b));
  EXPECT_NE(a, CompressedVariantKey(last, "int8", 0.5, &draft_a));
  EXPECT_NE(a, CompressedVariantKey(TestModel(6), "int8", 0, &draft_a));
  EXPECT_EQ(ShortModelId(draft_a), draft_a.Hex().substr(0, 16));
}

TEST(ChunkKeyTest, CompressedVariantKeyDependsOnEveryInput) {
  ChunkKey last;
  last.bytes.fill(9);
  const ChunkKey ref = CompressedVariantKey(last, "snapkv(window=32)", 0.25);
  EXPECT_EQ(ref, CompressedVariantKey(last, "snapkv(window=32)", 0.25));
  ChunkKey other = last;
  other.bytes[31] ^= 1;
  EXPECT_NE(ref, CompressedVariantKey(other, "snapkv(window=32)", 0.25));
  EXPECT_NE(ref, CompressedVariantKey(last, "snapkv(window=16)", 0.25));
  EXPECT_NE(ref, CompressedVariantKey(last, "snapkv(window=32)", 0.5));
  EXPECT_NE(ref, CompressedVariantKey(last, "snapkv(window=32)", std::nextafter(0.25, 1.0)));
  // A variant key never equals the full-chunk key it is derived from.
  EXPECT_NE(ref, last);
}

ModelConfig SmallConfig() {
  ModelConfig c;
  c.dim = 16;
  c.hidden_dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.vocab_size = 32;
  c.max_seq_len = 64;
  return c;
}

TEST(ChunkKeyTest, EveryMathConfigFieldChangesModelId) {
  const ModelConfig base = SmallConfig();
  const ModelId ref = ComputeModelId(base, {});
  std::vector<std::pair<const char*, std::function<void(ModelConfig&)>>> flips = {
      {"architecture", [](ModelConfig& c) { c.architecture = "LlamaForCausalLM"; }},
      {"dim", [](ModelConfig& c) { c.dim += 1; }},
      {"hidden_dim", [](ModelConfig& c) { c.hidden_dim += 1; }},
      {"n_layers", [](ModelConfig& c) { c.n_layers += 1; }},
      {"n_heads", [](ModelConfig& c) { c.n_heads += 1; }},
      {"n_kv_heads", [](ModelConfig& c) { c.n_kv_heads += 1; }},
      {"head_dim", [](ModelConfig& c) { c.head_dim += 1; }},
      {"vocab_size", [](ModelConfig& c) { c.vocab_size += 1; }},
      {"rms_norm_eps", [](ModelConfig& c) { c.rms_norm_eps = 1e-6f; }},
      {"rope.theta", [](ModelConfig& c) { c.rope.theta = 500000.0; }},
      {"rope.layout", [](ModelConfig& c) { c.rope.layout = RopeLayout::kHalfSplit; }},
      {"rope.scaling", [](ModelConfig& c) { c.rope.scaling = RopeConfig::Scaling::kLinear; }},
      {"rope.factor", [](ModelConfig& c) { c.rope.factor = 8.0; }},
      {"rope.low_freq_factor", [](ModelConfig& c) { c.rope.low_freq_factor = 2.0; }},
      {"rope.high_freq_factor", [](ModelConfig& c) { c.rope.high_freq_factor = 5.0; }},
      {"rope.original_max_position", [](ModelConfig& c) { c.rope.original_max_position = 4096; }},
      {"sliding_window", [](ModelConfig& c) { c.sliding_window = 16; }},
      {"qkv_bias", [](ModelConfig& c) { c.qkv_bias = !c.qkv_bias; }},
      {"tied_embeddings", [](ModelConfig& c) { c.tied_embeddings = !c.tied_embeddings; }},
  };
  std::set<ModelId> seen = {ref};
  for (auto& [name, f] : flips) {
    ModelConfig c = base;
    f(c);
    const ModelId id = ComputeModelId(c, {});
    EXPECT_NE(id, ref) << name;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), flips.size() + 1);
  // Fields that do not change the math do not change the id.
  ModelConfig c = base;
  c.bos_id = 5;
  c.eos_id = 6;
  c.max_seq_len = 4096;
  EXPECT_EQ(ComputeModelId(c, {}), ref);
}

TEST(ChunkKeyTest, ModelIdHashesEveryWeight) {
  const ModelConfig config = SmallConfig();
  auto m1 = Model::CreateRandom(config, 1);
  auto m1b = Model::CreateRandom(config, 1);
  auto m2 = Model::CreateRandom(config, 2);
  ASSERT_TRUE(m1.ok() && m1b.ok() && m2.ok());
  EXPECT_EQ(ComputeModelId(**m1), ComputeModelId(**m1b));
  EXPECT_NE(ComputeModelId(**m1), ComputeModelId(**m2));
  EXPECT_NE(ComputeModelId(**m1), ComputeModelId(config, {}));

  // One bit of one weight, in each tensor of the streamed list.
  const float w[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const ModelId ref = ComputeModelId(config, {absl::Span<const float>(w, 4)});
  for (int i = 0; i < 4; ++i) {
    float x[4] = {w[0], w[1], w[2], w[3]};
    x[i] = std::nextafter(x[i], 100.0f);
    EXPECT_NE(ComputeModelId(config, {absl::Span<const float>(x, 4)}), ref) << i;
  }
}

}  // namespace
}  // namespace vc::kvstore
