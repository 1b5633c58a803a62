#include "common/kvstore/chunk_codec.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace vc::kvstore {
namespace {

ModelConfig Config(int layers, int kv_heads, int head_dim) {
  ModelConfig c;
  c.n_layers = layers;
  c.n_kv_heads = kv_heads;
  c.n_heads = kv_heads;
  c.head_dim = head_dim;
  c.dim = kv_heads * head_dim;
  c.hidden_dim = c.dim;
  c.vocab_size = 8;
  c.max_seq_len = 256;
  return c;
}

// Fills positions [first_position, first_position + n) with random bits
// (including NaN and denormal patterns: the codec must be bit-exact).
void Fill(PagedKvCache& cache, const ModelConfig& c, int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t row = static_cast<size_t>(c.kv_dim());
  std::vector<uint32_t> k(row), v(row);
  const int32_t start = cache.next_position();
  ASSERT_TRUE(cache.Append(n).ok());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int32_t p = start; p < start + n; ++p) {
      for (size_t i = 0; i < row; ++i) {
        k[i] = rng();
        v[i] = rng();
      }
      cache.Write(l, p, reinterpret_cast<const float*>(k.data()),
                  reinterpret_cast<const float*>(v.data()));
    }
  }
}

bool SameRows(const PagedKvCache& a, const PagedKvCache& b, int32_t from, int32_t to) {
  for (int l = 0; l < a.n_layers(); ++l)
    for (int h = 0; h < a.kv_heads(); ++h)
      for (int32_t p = from; p < to; ++p) {
        const size_t n = static_cast<size_t>(a.head_dim()) * sizeof(float);
        if (std::memcmp(a.KeyAt(l, h, p), b.KeyAt(l, h, p), n) != 0) return false;
        if (std::memcmp(a.ValueAt(l, h, p), b.ValueAt(l, h, p), n) != 0) return false;
      }
  return true;
}

TEST(ChunkCodecTest, RoundTripIsBitExact) {
  const ModelConfig c = Config(3, 2, 8);
  PagedKvCache src(c);
  Fill(src, c, 40, 1);
  auto bytes = EncodeChunk(src, 16, 16);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), kChunkHeaderBytes + 2u * 3 * 2 * 8 * 16 * 4 + kChunkChecksumBytes);
  auto header = VerifyChunk(*bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->layers, 3u);
  EXPECT_EQ(header->kv_heads, 2u);
  EXPECT_EQ(header->head_dim, 8u);
  EXPECT_EQ(header->tokens, 16u);
  EXPECT_EQ(header->first_position, 16);

  PagedKvCache::Options o;
  o.first_position = 16;
  PagedKvCache dst(c, o);
  ASSERT_TRUE(DecodeChunkInto(*bytes, dst).ok());
  EXPECT_EQ(dst.next_position(), 32);
  EXPECT_TRUE(SameRows(src, dst, 16, 32));

  // Chunks chain: the next chunk appends after the first.
  auto next = EncodeChunk(src, 32, 8);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(DecodeChunkInto(*next, dst).ok());
  EXPECT_TRUE(SameRows(src, dst, 16, 40));
  // Encoding is deterministic.
  EXPECT_EQ(*EncodeChunk(src, 16, 16), *bytes);
}

TEST(ChunkCodecTest, EncodeRejectsUnstoredRanges) {
  const ModelConfig c = Config(1, 1, 2);
  PagedKvCache src(c);
  Fill(src, c, 4, 2);
  EXPECT_EQ(EncodeChunk(src, 2, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeChunk(src, -1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeChunk(src, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

bool IsCorruptionCode(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDataLoss || s.code() == absl::StatusCode::kInvalidArgument;
}

TEST(ChunkCodecTest, EverySingleByteCorruptionIsDetected) {
  const ModelConfig c = Config(1, 2, 2);
  PagedKvCache src(c);
  Fill(src, c, 3, 3);
  auto bytes = EncodeChunk(src, 0, 3);
  ASSERT_TRUE(bytes.ok());
  for (size_t i = 0; i < bytes->size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::string bad = *bytes;
      bad[i] = static_cast<char>(static_cast<uint8_t>(bad[i]) ^ mask);
      const absl::Status v = VerifyChunk(bad).status();
      EXPECT_TRUE(IsCorruptionCode(v)) << "byte " << i << " mask " << int{mask} << ": " << v;
      PagedKvCache dst(c);
      const absl::Status d = DecodeChunkInto(bad, dst);
      EXPECT_TRUE(IsCorruptionCode(d)) << "byte " << i << ": " << d;
      EXPECT_EQ(dst.next_position(), 0) << "cache changed on a failed decode";
    }
  }
  // Payload corruption is reported as DataLoss with a clear message.
  std::string bad = *bytes;
  bad[kChunkHeaderBytes] ^= 1;
  const absl::Status s = VerifyChunk(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s;
}

// kAlreadyRecomputed (bytes whose seal was just opened, which recomputed
// the checksum) skips only the checksum pass: the header, shape and size are
// still checked, and the rows decode the same. The encoder leaves room for a
// seal so that sealing does not copy the chunk.
TEST(ChunkCodecTest, AChecksumAlreadyRecomputedIsNotHashedAgain) {
  const ModelConfig c = Config(2, 1, 4);
  PagedKvCache src(c);
  Fill(src, c, 4, 5);
  auto bytes = EncodeChunk(src, 0, 4);
  ASSERT_TRUE(bytes.ok());
  EXPECT_GE(bytes->capacity(), bytes->size() + kSealTrailerMaxBytes);
  std::string stale = *bytes;
  stale.back() ^= 1;  // only the stored checksum differs
  EXPECT_EQ(VerifyChunk(stale).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(VerifyChunk(stale, ChecksumCheck::kAlreadyRecomputed).ok());
  PagedKvCache dst(c);
  ASSERT_TRUE(DecodeChunkInto(*bytes, dst, ChecksumCheck::kAlreadyRecomputed).ok());
  EXPECT_TRUE(SameRows(src, dst, 0, 4));
  EXPECT_EQ(VerifyChunk(bytes->substr(0, bytes->size() - 1), ChecksumCheck::kAlreadyRecomputed)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  std::string bad_header = *bytes;
  bad_header[32] = 1;  // reserved field
  EXPECT_EQ(VerifyChunk(bad_header, ChecksumCheck::kAlreadyRecomputed).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChunkCodecTest, TruncationAtEveryLengthIsDetected) {
  const ModelConfig c = Config(2, 1, 2);
  PagedKvCache src(c);
  Fill(src, c, 2, 4);
  auto bytes = EncodeChunk(src, 0, 2);
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    const absl::Status s = VerifyChunk(bytes->substr(0, n)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << n << ": " << s;
  }
  EXPECT_EQ(VerifyChunk(*bytes + "x").status().code(), absl::StatusCode::kDataLoss);
}

TEST(ChunkCodecTest, MismatchedCacheIsRejected) {
  const ModelConfig c = Config(2, 2, 4);
  PagedKvCache src(c);
  Fill(src, c, 8, 5);
  auto bytes = EncodeChunk(src, 0, 4);
  ASSERT_TRUE(bytes.ok());
  for (const ModelConfig& other : {Config(1, 2, 4), Config(2, 1, 4), Config(2, 2, 8)}) {
    PagedKvCache dst(other);
    const absl::Status s = DecodeChunkInto(*bytes, dst);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("does not match"), std::string::npos) << s;
    EXPECT_EQ(dst.next_position(), 0);
  }
  // Wrong position: the cache already holds tokens.
  PagedKvCache dst(c);
  Fill(dst, c, 1, 6);
  EXPECT_EQ(DecodeChunkInto(*bytes, dst).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dst.next_position(), 1);
  // No room: the cache's capacity is smaller than the chunk.
  PagedKvCache::Options small;
  small.max_tokens = 2;
  PagedKvCache tiny(c, small);
  EXPECT_EQ(DecodeChunkInto(*bytes, tiny).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tiny.next_position(), 0);
}

TEST(ChunkCodecTest, GarbageIsRejected) {
  EXPECT_EQ(VerifyChunk("").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(VerifyChunk(std::string(200, 'z')).status().code(), absl::StatusCode::kInvalidArgument);
  // A valid-looking header that claims a huge shape must not allocate or
  // crash.
  const ModelConfig c = Config(1, 1, 2);
  PagedKvCache src(c);
  Fill(src, c, 1, 7);
  std::string bytes = *EncodeChunk(src, 0, 1);
  for (size_t off : {8u, 12u, 16u, 20u}) {
    std::string bad = bytes;
    bad[off + 3] = static_cast<char>(0x7f);
    EXPECT_TRUE(IsCorruptionCode(VerifyChunk(bad).status())) << off;
  }
}

// A bf16/f16 model's chunk carries its rows in the model's dtype: exactly
// half the f32 payload, bit-exact, and refused by a cache of another dtype.
TEST(ChunkCodecTest, NarrowDtypeHalvesThePayloadAndRoundTrips) {
  for (Dtype dtype : {Dtype::kBf16, Dtype::kF16}) {
    ModelConfig c = Config(3, 2, 8);
    c.dtype = dtype;
    PagedKvCache src(c);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    const size_t row = static_cast<size_t>(c.kv_dim());
    std::vector<float> k(row), v(row);
    ASSERT_TRUE(src.Append(20).ok());
    for (int l = 0; l < c.n_layers; ++l) {
      for (int32_t p = 0; p < 20; ++p) {
        for (size_t i = 0; i < row; ++i) {
          k[i] = RoundToDtype(normal(rng), dtype);  // as the engine writes them
          v[i] = RoundToDtype(normal(rng), dtype);
        }
        src.Write(l, p, k.data(), v.data());
      }
    }
    auto bytes = EncodeChunk(src, 4, 16);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const size_t f32_payload = size_t{2} * 3 * 2 * 8 * 16 * 4;
    EXPECT_EQ(bytes->size(), kChunkHeaderBytes + f32_payload / 2 + kChunkChecksumBytes);
    auto h = VerifyChunk(*bytes);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->dtype, static_cast<uint32_t>(dtype));

    PagedKvCache::Options at4;
    at4.first_position = 4;
    PagedKvCache dst(c, at4);
    ASSERT_TRUE(DecodeChunkInto(*bytes, dst).ok());
    EXPECT_TRUE(SameRows(src, dst, 4, 20));

    ModelConfig f32 = c;
    f32.dtype = Dtype::kF32;
    PagedKvCache wrong(f32, at4);
    const absl::Status s = DecodeChunkInto(*bytes, wrong);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("dtype"), std::string::npos) << s.message();
    EXPECT_EQ(wrong.next_position(), 4);  // unchanged

    std::string bad = *bytes;
    bad[24] = 7;  // an unknown dtype
    EXPECT_EQ(VerifyChunk(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace vc::kvstore
