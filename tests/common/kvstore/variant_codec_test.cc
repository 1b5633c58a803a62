// The compressed-variant codec: every registered compressor's output (f32
// token dropping, KIVI 2/4-bit with residual, INT8, composites) from a random
// model's prefill round-trips with identical accounting, kept positions and
// bit-identical attention (Scores/MixValues compared with memcmp); the header
// matches the documented layout and the checksum an independent SHA-256;
// every corruption and truncation is DataLoss; well-sealed but malformed or
// mismatched blobs are InvalidArgument.
#include "common/kvstore/variant_codec.h"

#include <openssl/sha.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/compress/attention_stats.h"
#include "common/compress/compressor.h"
#include "common/engine/engine.h"
#include "common/kvstore/chunk_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "tests/small_model_config.h"

namespace vc::kvstore {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kPrefix = 96;
constexpr int kWindow = 16;

ModelConfig SmallConfig() { return test_support::SmallModelConfig(); }

// A random model's prefill of a random prompt, with its attention statistics.
struct Prefilled {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<PagedKvCache> full;
  std::unique_ptr<AttentionStats> stats;
};

const Prefilled& Shared() {
  static const Prefilled* p = [] {
    auto* f = new Prefilled;
    f->model = std::move(Model::CreateRandom(SmallConfig(), 11)).value();
    EngineOptions eo;
    eo.backend.threads = 1;
    f->engine = std::move(Engine::Create(*f->model, eo)).value();
    const ModelConfig& c = f->engine->config();
    std::mt19937_64 rng(3);
    std::vector<int32_t> prompt = {c.bos_id};
    while (static_cast<int>(prompt.size()) < kPrefix) {
      prompt.push_back(3 + static_cast<int32_t>(rng() % (c.vocab_size - 3)));
    }
    f->full = std::make_unique<PagedKvCache>(c);
    f->stats = std::make_unique<AttentionStats>(c, kPrefix, kWindow);
    const SequenceInput in{f->full.get(), prompt, static_cast<int64_t>(prompt.size()),
                           f->stats.get()};
    std::vector<float> logits;
    const absl::Status s = f->engine->Forward({&in, 1}, &logits);
    if (!s.ok()) ADD_FAILURE() << "prefill failed: " << s;
    return f;
  }();
  return *p;
}

std::shared_ptr<const CompressedPrefix> MustCompress(const CompressorOptions& o) {
  const Prefilled& p = Shared();
  auto c = CreateCompressor(o);
  EXPECT_TRUE(c.ok()) << o.name << ": " << c.status();
  if (!c.ok()) return nullptr;
  auto prefix = (*c)->Compress(p.engine->config(), *p.full, kPrefix, *p.stats);
  EXPECT_TRUE(prefix.ok()) << o.name << ": " << prefix.status();
  return prefix.ok() ? *prefix : nullptr;
}

// Attention through CompressedSequenceKv over the prefix and an exact tail.
void ExpectSameAttention(const CompressedPrefix& a, const CompressedPrefix& b,
                         const std::string& what) {
  const ModelConfig c = SmallConfig();
  auto backend = std::move(kernels::CreateBackend({.threads = 1})).value();
  CompressedSequenceKv kva(c, std::shared_ptr<const CompressedPrefix>(&a, [](auto*) {}));
  CompressedSequenceKv kvb(c, std::shared_ptr<const CompressedPrefix>(&b, [](auto*) {}));
  constexpr int32_t kTail = 5;
  ASSERT_TRUE(kva.Append(kTail).ok());
  ASSERT_TRUE(kvb.Append(kTail).ok());
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int32_t p = kPrefix; p < kPrefix + kTail; ++p) {
      for (float& x : k) x = u(rng);
      for (float& x : v) x = u(rng);
      kva.Write(l, p, k.data(), v.data());
      kvb.Write(l, p, k.data(), v.data());
    }
  }
  std::vector<float> q(c.head_dim);
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      // The whole prefix plus tail, and a window that starts inside the prefix.
      for (const int32_t min_pos : {0, kPrefix / 2}) {
        const auto ra = kva.Keys(l, h, min_pos, kPrefix + kTail - 1);
        const auto rb = kvb.Keys(l, h, min_pos, kPrefix + kTail - 1);
        ASSERT_EQ(ra.first, rb.first) << what;
        ASSERT_EQ(ra.count, rb.count) << what;
        for (float& x : q) x = u(rng);
        std::vector<float> sa(ra.count), sb(ra.count), p(ra.count);
        kva.Scores(*backend, l, h, ra, q.data(), 0.35f, sa.data());
        kvb.Scores(*backend, l, h, rb, q.data(), 0.35f, sb.data());
        EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0)
            << what << " scores l" << l << " h" << h;
        for (float& x : p) x = std::abs(u(rng));
        std::vector<float> ma(c.head_dim, 0.0f), mb(c.head_dim, 0.0f);
        kva.MixValues(*backend, l, h, ra, p.data(), ma.data());
        kvb.MixValues(*backend, l, h, rb, p.data(), mb.data());
        EXPECT_EQ(std::memcmp(ma.data(), mb.data(), ma.size() * sizeof(float)), 0)
            << what << " values l" << l << " h" << h;
      }
    }
  }
}

void ExpectSamePrefix(const CompressedPrefix& a, const CompressedPrefix& b,
                      const std::string& what) {
  EXPECT_EQ(a.prefix_len(), b.prefix_len()) << what;
  EXPECT_EQ(a.bytes(), b.bytes()) << what;
  EXPECT_EQ(a.full_bytes(), b.full_bytes()) << what;
  EXPECT_EQ(a.ratio(), b.ratio()) << what;
  EXPECT_EQ(a.description(), b.description()) << what;
  ASSERT_EQ(a.n_layers(), b.n_layers()) << what;
  for (int l = 0; l < a.n_layers(); ++l) {
    ASSERT_EQ(a.layer(l).heads.size(), b.layer(l).heads.size()) << what;
    EXPECT_EQ(a.kept(l), b.kept(l)) << what;
    for (size_t h = 0; h < a.layer(l).heads.size(); ++h) {
      const CompressedPrefix::Head& ha = a.layer(l).heads[h];
      const CompressedPrefix::Head& hb = b.layer(l).heads[h];
      EXPECT_EQ(ha.positions, hb.positions) << what;
      for (int64_t i = 0; i < ha.keys->rows(); ++i) {
        EXPECT_EQ(ha.keys->RowIfF32(i) == nullptr, hb.keys->RowIfF32(i) == nullptr) << what;
        EXPECT_EQ(ha.values->RowIfF32(i) == nullptr, hb.values->RowIfF32(i) == nullptr) << what;
      }
    }
  }
  ExpectSameAttention(a, b, what);
}

std::vector<CompressorOptions> EveryCompressorOptions() {
  std::vector<CompressorOptions> out;
  for (const CompressorInfo& info : ListCompressors()) {
    std::vector<int> bits = {0};
    if (info.takes_bits) {
      if (info.name.ends_with("kivi")) bits = {2, 4};
      if (info.name.ends_with("int8")) bits = {8};
    }
    for (const int b : bits) {
      // The defaults (32-token key groups, 32 residual tokens), and small
      // groups so that composites quantise some of their kept rows.
      for (const bool small : {false, true}) {
        CompressorOptions o;
        o.name = info.name;
        o.ratio = info.takes_ratio ? (info.takes_bits ? 0.6 : 0.4) : 0.0;
        o.bits = b;
        o.window = kWindow;
        if (small) {
          o.quant_group = 8;
          o.residual = 5;
        }
        out.push_back(o);
      }
    }
  }
  return out;
}

TEST(VariantCodecTest, EveryCompressorRoundTripsExactly) {
  bool saw_dropped_f32 = false, saw_kivi2 = false, saw_kivi4 = false, saw_int8 = false,
       saw_composite = false;
  int checked = 0;
  for (const CompressorOptions& o : EveryCompressorOptions()) {
    const std::string what =
        o.name + " bits " + std::to_string(o.bits) + " group " + std::to_string(o.quant_group);
    const auto prefix = MustCompress(o);
    ASSERT_NE(prefix, nullptr) << what;
    const std::string bytes = EncodeCompressedPrefix(*prefix);
    const auto decoded = DecodeCompressedPrefix(SmallConfig(), bytes);
    ASSERT_TRUE(decoded.ok()) << what << ": " << decoded.status();
    ExpectSamePrefix(*prefix, **decoded, what);
    EXPECT_EQ(EncodeCompressedPrefix(**decoded), bytes) << what << ": encoding not stable";
    ++checked;

    // Which formats this run exercised (first head of layer 0).
    const CompressedPrefix::Head& h = prefix->layer(0).heads[0];
    const bool dropped = prefix->kept(0) < kPrefix;
    const bool quantised_head = h.keys->RowIfF32(0) == nullptr;
    const bool f32_residual = h.keys->RowIfF32(h.keys->rows() - 1) != nullptr;
    if (dropped && !quantised_head && o.bits == 0) saw_dropped_f32 = true;
    if (!dropped && quantised_head && f32_residual && o.name == "kivi") {
      (o.bits == 2 ? saw_kivi2 : saw_kivi4) = true;
    }
    if (!dropped && quantised_head && !f32_residual && o.name == "int8") saw_int8 = true;
    if (dropped && quantised_head && o.name.find('+') != std::string::npos) saw_composite = true;
  }
  EXPECT_GE(checked, 40);
  EXPECT_TRUE(saw_dropped_f32);
  EXPECT_TRUE(saw_kivi2);
  EXPECT_TRUE(saw_kivi4);
  EXPECT_TRUE(saw_int8);
  EXPECT_TRUE(saw_composite);
}

uint32_t U32At(const std::string& s, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(s[off + i])} << (8 * i);
  return v;
}

void SetU32(std::string& s, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[off + i] = static_cast<char>(v >> (8 * i));
}

// Recomputes the trailing checksum (an independent SHA-256: OpenSSL's one-shot).
std::string Reseal(std::string body_and_old_sum) {
  body_and_old_sum.resize(body_and_old_sum.size() - kVariantChecksumBytes);
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(body_and_old_sum.data()), body_and_old_sum.size(),
         d);
  return body_and_old_sum + std::string(reinterpret_cast<const char*>(d), sizeof(d));
}

std::string SampleBytes() {
  CompressorOptions o;
  o.name = "snapkv+kivi";
  o.ratio = 0.5;
  o.bits = 2;
  o.window = kWindow;
  o.quant_group = 8;
  o.residual = 5;
  return EncodeCompressedPrefix(*MustCompress(o));
}

TEST(VariantCodecTest, HeaderAndChecksumFollowTheDocumentedLayout) {
  const std::string bytes = SampleBytes();
  ASSERT_GT(bytes.size(), kVariantHeaderBytes + kVariantChecksumBytes);
  EXPECT_EQ(bytes.substr(0, 4), "VCKV");
  EXPECT_EQ(U32At(bytes, 4), kVariantFormatVersion);
  EXPECT_EQ(U32At(bytes, 8), 2u);   // layers
  EXPECT_EQ(U32At(bytes, 12), 2u);  // kv_heads
  EXPECT_EQ(U32At(bytes, 16), 8u);  // head_dim
  EXPECT_EQ(U32At(bytes, 20), static_cast<uint32_t>(kPrefix));
  const std::string description =
      "snapkv(ratio=0.5,window=16,pool_kernel=7)+kivi(bits=2,group=8,residual=5)";
  EXPECT_EQ(U32At(bytes, 24), description.size());
  EXPECT_EQ(U32At(bytes, 28), 0u);
  EXPECT_EQ(bytes.substr(kVariantHeaderBytes, description.size()), description);
  EXPECT_EQ(Reseal(bytes), bytes) << "checksum is not SHA-256 over the rest";
  auto h = VerifyVariant(bytes);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->layers, 2u);
  EXPECT_EQ(h->kv_heads, 2u);
  EXPECT_EQ(h->head_dim, 8u);
  EXPECT_EQ(h->prefix_len, kPrefix);
  EXPECT_EQ(h->description, description);
  // Layer 0's kept count follows the description: 0.5 of 96 tokens sized as
  // f32 with 4-byte indices keeps floor(0.5 * 64 * 96 / 68) = 45.
  EXPECT_EQ(U32At(bytes, kVariantHeaderBytes + description.size()), 45u);
}

TEST(VariantCodecTest, EverySingleByteCorruptionIsDataLoss) {
  const std::string bytes = SampleBytes();
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (const uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(static_cast<uint8_t>(bad[i]) ^ mask);
      const auto r = DecodeCompressedPrefix(SmallConfig(), bad);
      ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss)
          << "byte " << i << ": " << r.status();
    }
  }
  std::string bad = bytes;
  bad[bytes.size() / 2] ^= 4;
  EXPECT_THAT(std::string(DecodeCompressedPrefix(SmallConfig(), bad).status().message()),
              HasSubstr("checksum mismatch"));
}

TEST(VariantCodecTest, EveryTruncationAndPaddingIsDataLoss) {
  const std::string bytes = SampleBytes();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const auto r = DecodeCompressedPrefix(SmallConfig(), bytes.substr(0, n));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss)
        << "length " << n << ": " << r.status();
  }
  EXPECT_EQ(DecodeCompressedPrefix(SmallConfig(), bytes + "x").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(VerifyVariant("").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(VerifyVariant(std::string(200, 'z')).status().code(), absl::StatusCode::kDataLoss);
}

void ExpectInvalid(const absl::StatusOr<std::shared_ptr<const CompressedPrefix>>& r,
                   const std::string& message) {
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(message));
}

TEST(VariantCodecTest, ShapeMismatchIsInvalidArgument) {
  const std::string bytes = SampleBytes();
  ModelConfig c = SmallConfig();
  c.n_layers = 3;
  ExpectInvalid(DecodeCompressedPrefix(c, bytes), "does not match the model (layers=3");
  c = SmallConfig();
  c.n_kv_heads = 4;
  ExpectInvalid(DecodeCompressedPrefix(c, bytes), "kv_heads=4");
  c = SmallConfig();
  c.head_dim = 4;
  ExpectInvalid(DecodeCompressedPrefix(c, bytes), "head_dim=4");
  c = SmallConfig();
  c.max_seq_len = kPrefix - 1;
  ExpectInvalid(DecodeCompressedPrefix(c, bytes), "exceeds the model's context");
}

TEST(VariantCodecTest, SealedButMalformedBlobsAreInvalidArgument) {
  const std::string bytes = SampleBytes();
  const ModelConfig c = SmallConfig();
  {
    std::string bad = bytes;
    // Version 1 (f32 rows only, before rows carried their dtype) included.
    SetU32(bad, 4, 1);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "unsupported format version 1");
    SetU32(bad, 4, 3);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "unsupported format version 3");
  }
  {
    std::string bad = bytes;
    bad[3] = 'X';
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "bad magic");
  }
  {
    std::string bad = bytes;
    SetU32(bad, 28, 1);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "reserved");
  }
  {
    std::string bad = bytes;
    SetU32(bad, 24, 1u << 20);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "description");
  }
  {
    std::string bad = bytes;
    SetU32(bad, 20, 0);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "bad shape");
  }
  {
    // A shorter prefix than the kept positions reach.
    std::string bad = bytes;
    SetU32(bad, 20, kPrefix - 1);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "inside [0, 95)");
  }
  {
    // More kept positions than the prefix has tokens.
    std::string bad = bytes;
    SetU32(bad, kVariantHeaderBytes + U32At(bytes, 24), kPrefix + 1);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "keeps 97 positions");
  }
  {
    // Extra bytes between the last layer and the checksum.
    std::string bad = bytes;
    bad.insert(bad.size() - kVariantChecksumBytes, "pad");
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "3 unexpected bytes");
  }
  {
    // The body cut short (and resealed): parsing runs out inside a layer.
    std::string bad = bytes;
    bad.erase(bad.size() - kVariantChecksumBytes - 100, 100);
    ExpectInvalid(DecodeCompressedPrefix(c, Reseal(bad)), "layer 1 head 1");
  }
  {
    // A full-KV chunk is sealed the same way but is not a variant.
    auto chunk = EncodeChunk(*Shared().full, 0, 16);
    ASSERT_TRUE(chunk.ok());
    ExpectInvalid(DecodeCompressedPrefix(c, *chunk), "full-KV chunk");
  }
}

// A bf16/f16 model's variants (issue 16): its K/V are rounded to its dtype
// when written, so the full-precision rows a variant keeps (token dropping's
// kept rows, KIVI's residual window) travel as 2-byte values, losslessly:
// the decoded prefix is the encoded one bit for bit, and every
// full-precision block is marked with the model's dtype. Quantised codes,
// scales and zero points are unchanged. An f32 model's rows stay f32.
class ModelDtypeVariantTest : public ::testing::TestWithParam<Dtype> {};

TEST_P(ModelDtypeVariantTest, KeptRowsTravelInTheModelsDtype) {
  const Dtype dtype = GetParam();
  ModelConfig c = SmallConfig();
  c.dtype = dtype;
  auto model = Model::CreateRandom(c, 11);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions eo;
  eo.backend.threads = 1;
  auto engine = Engine::Create(**model, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<int32_t> prompt = {c.bos_id};
  std::mt19937_64 rng(3);
  while (static_cast<int>(prompt.size()) < kPrefix) {
    prompt.push_back(3 + static_cast<int32_t>(rng() % (c.vocab_size - 3)));
  }
  PagedKvCache full((*engine)->config());
  AttentionStats stats((*engine)->config(), kPrefix, kWindow);
  const SequenceInput in{&full, prompt, static_cast<int64_t>(prompt.size()), &stats};
  std::vector<float> logits;
  ASSERT_TRUE((*engine)->Forward({&in, 1}, &logits).ok());

  std::vector<CompressorOptions> options(3);
  options[0].name = "snapkv";
  options[0].ratio = 0.5;
  options[1].name = "snapkv+kivi";
  options[1].ratio = 0.5;
  options[1].bits = 2;
  options[1].quant_group = 8;
  options[1].residual = 5;
  options[2].name = "int8";
  for (CompressorOptions& o : options) {
    o.window = kWindow;
    auto compressor = CreateCompressor(o);
    ASSERT_TRUE(compressor.ok()) << compressor.status();
    auto prefix = (*compressor)->Compress((*engine)->config(), full, kPrefix, stats);
    ASSERT_TRUE(prefix.ok()) << o.name << ": " << prefix.status();
    const std::string bytes = EncodeCompressedPrefix(**prefix);
    const auto decoded = DecodeCompressedPrefix((*engine)->config(), bytes);
    ASSERT_TRUE(decoded.ok()) << o.name << ": " << decoded.status();
    ExpectSamePrefix(**prefix, **decoded, o.name);
    EXPECT_EQ(EncodeCompressedPrefix(**decoded), bytes) << o.name << ": encoding not stable";
    // Each head's stores: the dtype word of their full-precision rows (it
    // follows the header for f32 stores and ends the quantised part
    // otherwise) and their size.
    int64_t full_precision_stores = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      for (const CompressedPrefix::Head& h : (*prefix)->layer(l).heads) {
        for (const RowStore* store : {h.keys.get(), h.values.get()}) {
          if (store->RowIfF32(0) == nullptr) continue;  // quantised rows first
          std::string one;
          store->AppendSerialized(&one);
          constexpr size_t kStoreHeaderBytes = 28;
          ASSERT_GE(one.size(), kStoreHeaderBytes + 4);
          EXPECT_EQ(U32At(one, kStoreHeaderBytes), static_cast<uint32_t>(dtype)) << o.name;
          const int64_t values = store->rows() * store->dim();
          EXPECT_EQ(one.size(),
                    kStoreHeaderBytes + 4 + static_cast<size_t>(values * DtypeBytes(dtype)))
              << o.name;
          ++full_precision_stores;
        }
      }
    }
    if (o.name == "snapkv") {
      EXPECT_EQ(full_precision_stores, 2 * c.n_layers * c.n_kv_heads);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModelDtypeVariantTest,
                         ::testing::Values(Dtype::kF32, Dtype::kBf16, Dtype::kF16),
                         [](const auto& info) { return std::string(DtypeName(info.param)); });

}  // namespace
}  // namespace vc::kvstore
