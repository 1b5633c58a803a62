// Model::LoadLlama2c on the real stories260K checkpoint and on damaged copies
// of it, and Model::Load's file/directory dispatch.
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/hf_checkpoint_writer.h"
#include "tests/common/model/status_matchers.h"
#include "tests/scratch_dir.h"

namespace vc {
namespace {

using ::vc::testing::ReadFile;
using ::vc::testing::StatusIs;
using ::vc::testing::WriteFile;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// stories260K: dim 64, hidden 172, 5 layers, vocab 512, kv_dim 32; f32.
constexpr size_t kDim = 64, kHidden = 172, kLayers = 5, kVocab = 512, kKvDim = 32;
constexpr size_t kHeaderBytes = 28;
constexpr size_t kEmbeddingBytes = kVocab * kDim * 4;
constexpr size_t kRmsAttBytes = kLayers * kDim * 4;
constexpr size_t kWqBytes = kLayers * kDim * kDim * 4;
constexpr size_t kWkBytes = kLayers * kKvDim * kDim * 4;
constexpr size_t kW1Bytes = kLayers * kHidden * kDim * 4;

class Llama2cLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("VC_MODELS_DIR");
    path_ = std::string(dir != nullptr ? dir : "/work/shared/models") + "/stories260K.bin";
    if (!std::filesystem::exists(path_)) GTEST_SKIP() << path_ << " is not available";
  }
  // A copy of the first `bytes` bytes of the checkpoint.
  std::string TruncatedCopy(size_t bytes) {
    std::string copy = tmp_.path() + "/truncated.bin";
    WriteFile(copy, ReadFile(path_).substr(0, bytes));
    return copy;
  }

  std::string path_;
  test_support::ScratchDir tmp_{"vc_model_"};
};

TEST_F(Llama2cLoaderTest, LoadsStories260K) {
  auto model = Model::LoadLlama2c(path_);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.architecture, "llama2c");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rope.layout, RopeLayout::kInterleaved);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ((*model)->source(), path_);

  const ModelWeights& w = (*model)->weights();
  EXPECT_EQ(w.classifier, w.token_embedding);
  ASSERT_EQ(w.layers.size(), 5u);
  // Spot-check tensors against the raw file: the first embedding row, and
  // the last element of layer 4's w3 (the end of the last per-layer tensor).
  const std::string raw = ReadFile(path_);
  for (size_t i = 0; i < kDim; ++i) {
    float x;
    std::memcpy(&x, raw.data() + kHeaderBytes + 4 * i, 4);
    EXPECT_EQ(w.token_embedding.At(i), x) << i;
  }
  // File order: embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3.
  const size_t w3_offset = kHeaderBytes + kEmbeddingBytes + kRmsAttBytes + kWqBytes + 2 * kWkBytes +
                           kWqBytes + kRmsAttBytes + 2 * kW1Bytes;
  float last;
  std::memcpy(&last, raw.data() + w3_offset + kW1Bytes - 4, 4);
  EXPECT_EQ(w.layers[kLayers - 1].w3.At(kHidden * kDim - 1), last);
}

TEST_F(Llama2cLoaderTest, LoadDispatchesFilesToLlama2c) {
  auto model = Model::Load(path_);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().architecture, "llama2c");
}

TEST_F(Llama2cLoaderTest, TruncatedCopyNamesTheTensor) {
  // Cut inside wq, which follows token_embedding and rms_att.
  const std::string copy = TruncatedCopy(kHeaderBytes + kEmbeddingBytes + kRmsAttBytes + 100);
  EXPECT_THAT(Model::LoadLlama2c(copy), StatusIs(kInvalid, {copy, "truncated", "'wq'"}));
  // Cut inside the embedding.
  const std::string early = TruncatedCopy(kHeaderBytes + 4);
  EXPECT_THAT(Model::LoadLlama2c(early), StatusIs(kInvalid, {"truncated", "'token_embedding'"}));
  // Cut inside the header.
  const std::string header = TruncatedCopy(10);
  EXPECT_THAT(Model::LoadLlama2c(header), StatusIs(kInvalid, {"truncated", "10 bytes"}));
}

TEST_F(Llama2cLoaderTest, TrailingBytesAreRejected) {
  const std::string copy = tmp_.path() + "/long.bin";
  WriteFile(copy, ReadFile(path_) + std::string(4096, '\0'));
  EXPECT_THAT(Model::LoadLlama2c(copy), StatusIs(kInvalid, {"trailing"}));
}

// A random model's tensors (the benchmarks' synthetic models) are owned by
// the model and start on cache lines, so the products' 64-byte loads never
// straddle two lines.
TEST(RandomModelTest, TensorsStartOnCacheLines) {
  ModelConfig c;
  c.dim = 40;  // rows of 160 bytes: a plain allocation would not be aligned by luck
  c.hidden_dim = 72;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 10;
  c.vocab_size = 33;
  c.max_seq_len = 16;
  auto model = Model::CreateRandom(c, 7);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelWeights& w = (*model)->weights();
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; };
  EXPECT_TRUE(aligned(w.token_embedding.data));
  EXPECT_TRUE(aligned(w.rms_final));
  for (const LayerWeights& l : w.layers) {
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) {
      EXPECT_TRUE(aligned(m->data));
    }
    EXPECT_TRUE(aligned(l.rms_att));
    EXPECT_TRUE(aligned(l.rms_ffn));
  }
}

TEST(Llama2cLoaderErrors, GarbageHeaderFailsCleanly) {
  test_support::ScratchDir tmp("vc_model_");
  const std::string path = tmp.path() + "/garbage.bin";
  WriteFile(path, std::string("this is not a llama2.c checkpoint, just some text") +
                      std::string(1000, 'x'));
  EXPECT_THAT(Model::LoadLlama2c(path), StatusIs(kInvalid, {path, "not a llama2.c checkpoint"}));

  // Plausible sizes but inconsistent ones: dim not divisible by n_heads.
  const int32_t header[7] = {64, 172, 5, 7, 7, 512, 512};
  std::string bytes(sizeof(header), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  WriteFile(path, bytes + std::string(4096, '\0'));
  EXPECT_THAT(Model::LoadLlama2c(path), StatusIs(kInvalid, {"not divisible"}));

  WriteFile(path, "");
  EXPECT_THAT(Model::LoadLlama2c(path), StatusIs(kInvalid, {"truncated"}));
}

// Found by fuzz_llama2c_loader (tests/fuzz/): the vocab field INT32_MIN was
// negated before the header was checked (signed overflow, UBSan abort).
TEST(Llama2cLoaderErrors, Int32MinHeaderFieldFailsCleanly) {
  test_support::ScratchDir tmp("vc_model_");
  const std::string path = tmp.path() + "/min.bin";
  for (int field = 0; field < 7; ++field) {
    int32_t header[7] = {8, 12, 1, 2, 2, 16, 8};
    header[field] = INT32_MIN;
    std::string bytes(sizeof(header), '\0');
    std::memcpy(bytes.data(), header, sizeof(header));
    WriteFile(path, bytes + std::string(64, '\0'));
    EXPECT_THAT(Model::LoadLlama2c(path),
                StatusIs(kInvalid, {"not a llama2.c checkpoint", "-2147483648"}))
        << "field " << field;
  }
  // dim INT32_MIN with n_heads -1 would also have divided INT32_MIN by -1.
  const int32_t header[7] = {INT32_MIN, 12, 1, -1, 1, 16, 8};
  std::string bytes(sizeof(header), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  WriteFile(path, bytes);
  EXPECT_THAT(Model::LoadLlama2c(path), StatusIs(kInvalid, {"header field 0"}));
}

// Every field within the header's bound of 2^24, but layers x dim x dim is
// 2^72 elements: the size arithmetic overflowed int64 before the file size
// was compared. Now the file is simply too short for what it claims.
TEST(Llama2cLoaderErrors, HugeShapeProductIsTruncationNotOverflow) {
  test_support::ScratchDir tmp("vc_model_");
  const std::string path = tmp.path() + "/huge.bin";
  const int32_t big = 1 << 24;
  const int32_t header[7] = {big, big, big, 1, 1, 16, 8};
  std::string bytes(sizeof(header), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  WriteFile(path, bytes + std::string(4096, '\0'));
  EXPECT_THAT(Model::LoadLlama2c(path), StatusIs(kInvalid, {"truncated", "runs past the end"}));
}

TEST(Llama2cLoaderErrors, MissingFileIsNotFound) {
  test_support::ScratchDir tmp("vc_model_");
  EXPECT_THAT(Model::LoadLlama2c(tmp.path() + "/missing.bin"),
              StatusIs(absl::StatusCode::kNotFound, {"missing.bin"}));
  EXPECT_THAT(Model::Load(tmp.path() + "/missing.bin"),
              StatusIs(absl::StatusCode::kNotFound, {"missing.bin"}));
}

TEST(Llama2cLoaderErrors, LoadSendsDirectoriesToTheHuggingFaceLoader) {
  test_support::ScratchDir tmp("vc_model_");
  // An empty directory: the Hugging Face loader's complaint, not llama2.c's.
  EXPECT_THAT(Model::Load(tmp.path()), StatusIs(absl::StatusCode::kNotFound, {"config.json"}));
}

}  // namespace
}  // namespace vc
