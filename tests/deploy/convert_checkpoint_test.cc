// deploy/scripts/convert_checkpoint.py against the C++ rounding of
// common/base/dtype.h: every converted element of tinystories656K (bf16 and
// f16) has exactly the bits F32ToBf16Bits / F32ToF16Bits give for the f32
// weight, the converted directory loads as a model of that dtype with its
// tokenizer files copied byte for byte, the special values (ties, NaN,
// infinities, subnormals, overflow) round the same way, and bad input gets
// one line on stderr and its documented exit code.
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/model/internal/safetensors.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "tests/common/model/hf_checkpoint_writer.h"
#include "tests/scratch_dir.h"

namespace vc {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string stderr_text;
};

// Runs the script with `args` (already shell-quoted where needed).
RunResult RunScript(const std::string& args, const std::string& tmp) {
  const std::string err = tmp + "/stderr.txt";
  const std::string cmd =
      std::string(VC_PYTHON) + " " + VC_CONVERT_SCRIPT + " " + args + " >/dev/null 2>" + err;
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.stderr_text = testing::ReadFile(err);
  return r;
}

uint32_t F32Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

uint16_t U16At(const uint8_t* p, int64_t i) {
  return static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
}

float F32At(const uint8_t* p, int64_t i) {
  uint32_t b = 0;
  for (int k = 0; k < 4; ++k) b |= uint32_t{p[4 * i + k]} << (8 * k);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Every tensor of `out` equals the C++ rounding of the same tensor of `in`.
void ExpectRoundedLikeCxx(const safetensors::File& in, const safetensors::File& out, Dtype dtype,
                          const std::string& wire) {
  ASSERT_EQ(in.tensors().size(), out.tensors().size());
  int64_t checked = 0;
  for (const safetensors::TensorInfo& src : in.tensors()) {
    const safetensors::TensorInfo* dst = out.Find(src.name);
    ASSERT_NE(dst, nullptr) << src.name;
    ASSERT_EQ(src.dtype, "F32") << src.name;
    EXPECT_EQ(dst->dtype, wire) << src.name;
    ASSERT_EQ(dst->shape, src.shape) << src.name;
    ASSERT_EQ(dst->num_elements, src.num_elements) << src.name;
    for (int64_t i = 0; i < src.num_elements; ++i) {
      const float x = F32At(src.data, i);
      const uint16_t want = NarrowBits(x, dtype);
      const uint16_t got = U16At(dst->data, i);
      if (got != want) {
        ADD_FAILURE() << src.name << "[" << i << "]: f32 bits 0x" << std::hex << F32Bits(x)
                      << " -> script 0x" << got << ", C++ 0x" << want;
        return;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

std::string TinyStories() {
  const char* models = std::getenv("VC_MODELS_DIR");
  return models == nullptr ? "" : std::string(models) + "/tinystories656K";
}

class ConvertCheckpointTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ConvertCheckpointTest, Tinystories656KEqualsTheCxxRounding) {
  const std::string src = TinyStories();
  if (src.empty() || !fs::exists(src + "/config.json")) {
    GTEST_SKIP() << "VC_MODELS_DIR/tinystories656K not present";
  }
  const std::string name = GetParam();
  const Dtype dtype = *ParseDtype(name);
  test_support::ScratchDir tmp("vc_model_");
  const std::string dst = tmp.path() + "/out";
  const RunResult r = RunScript(src + " " + dst + " --dtype " + name, tmp.path());
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;

  auto in = safetensors::File::Open(src + "/model.safetensors");
  ASSERT_TRUE(in.ok()) << in.status();
  auto out = safetensors::File::Open(dst + "/model.safetensors");
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_NO_FATAL_FAILURE(
      ExpectRoundedLikeCxx(*in, *out, dtype, dtype == Dtype::kBf16 ? "BF16" : "F16"));

  // It loads as a model of that dtype, and its weights are the f32 model's
  // rounded (the loader's view, not only the file's).
  auto f32 = Model::Load(src);
  ASSERT_TRUE(f32.ok()) << f32.status();
  auto narrow = Model::Load(dst);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ((*narrow)->config().dtype, dtype);
  for (const char* w :
       {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.self_attn.k_proj.weight"}) {
    const WeightMatrix a = testing::FindWeight(**f32, w);
    const WeightMatrix b = testing::FindWeight(**narrow, w);
    ASSERT_TRUE(a && b) << w;
    EXPECT_EQ(b.dtype, dtype) << w;
    for (int64_t i = 0; i < 64; ++i) {
      EXPECT_EQ(F32Bits(b.At(i)), F32Bits(RoundToDtype(a.At(i), dtype))) << w << "[" << i << "]";
    }
  }
  const nlohmann::json config = nlohmann::json::parse(testing::ReadFile(dst + "/config.json"));
  EXPECT_EQ(config["torch_dtype"], dtype == Dtype::kBf16 ? "bfloat16" : "float16");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "generation_config.json"}) {
    if (!fs::exists(src + "/" + f)) continue;
    EXPECT_EQ(testing::ReadFile(dst + "/" + f), testing::ReadFile(src + "/" + f)) << f;
  }
}

// Ties, both signs of zero, subnormals of both targets, values that round
// past the largest finite value, infinities and NaNs with payloads, in a
// two-shard checkpoint (the index is rewritten, shard names kept).
TEST_P(ConvertCheckpointTest, SpecialValuesAndShardsEqualTheCxxRounding) {
  const std::string name = GetParam();
  const Dtype dtype = *ParseDtype(name);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f + 0x1p-8f,
                               1.0f + 3 * 0x1p-8f,
                               -(1.0f + 0x1p-8f),
                               1.0f + 0x1p-11f,
                               1.0f + 3 * 0x1p-11f,
                               0x1p-24f,
                               0x1p-25f,
                               0x3p-26f,
                               0x1p-14f - 0x1p-30f,
                               0x1p-130f,
                               0x1p-133f + 0x1p-140f,
                               0x1p-149f,
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               -70000.0f,
                               3.3895e38f,
                               std::numeric_limits<float>::max(),
                               inf,
                               -inf,
                               std::numeric_limits<float>::quiet_NaN(),
                               -std::numeric_limits<float>::quiet_NaN()};
  uint32_t payload_nan = 0x7f812345u;  // signalling, with a payload
  float f;
  std::memcpy(&f, &payload_nan, 4);
  values.push_back(f);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 4096; ++i) {
    // Random bit patterns: every exponent, both signs.
    uint32_t bits = static_cast<uint32_t>(rng());
    std::memcpy(&f, &bits, 4);
    values.push_back(f);
  }
  test_support::ScratchDir tmp("vc_model_");
  const std::string src = tmp.Subdir("src");
  testing::TestTensor a;
  a.name = "a";
  a.dtype = "F32";
  a.shape = {static_cast<int64_t>(values.size())};
  for (float v : values) {
    const uint32_t b = F32Bits(v);
    for (int k = 0; k < 4; ++k) a.bytes.push_back(static_cast<char>((b >> (8 * k)) & 0xff));
  }
  testing::TestTensor c = a;
  c.name = "c";
  testing::TestTensor ids;  // an integer tensor is copied unchanged
  ids.name = "ids";
  ids.dtype = "I64";
  ids.shape = {2};
  ids.bytes = std::string("\x01\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff", 16);
  testing::WriteSafetensors(src + "/model-00001-of-00002.safetensors", {&a, &ids});
  testing::WriteSafetensors(src + "/model-00002-of-00002.safetensors", {&c});
  testing::WriteFile(
      src + "/model.safetensors.index.json",
      R"({"metadata": {"total_size": 1}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                     "ids": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  testing::WriteFile(src + "/config.json", R"({"torch_dtype": "float32", "hidden_size": 4})");
  const std::string dst = tmp.path() + "/out";
  const RunResult r = RunScript(src + " " + dst + " --dtype " + name, tmp.path());
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::string wire = dtype == Dtype::kBf16 ? "BF16" : "F16";
  for (const char* shard :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    auto out = safetensors::File::Open(dst + "/" + shard);
    ASSERT_TRUE(out.ok()) << out.status();
    const bool first = std::string(shard).find("00001-") != std::string::npos;
    const safetensors::TensorInfo* t = out->Find(first ? "a" : "c");
    if (first) {
      const safetensors::TensorInfo* o = out->Find("ids");
      ASSERT_NE(o, nullptr);
      EXPECT_EQ(o->dtype, "I64");
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(o->data), 16), ids.bytes);
    }
    ASSERT_NE(t, nullptr) << shard;
    EXPECT_EQ(t->dtype, wire);
    ASSERT_EQ(t->num_elements, static_cast<int64_t>(values.size()));
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(U16At(t->data, static_cast<int64_t>(i)), NarrowBits(values[i], dtype))
          << shard << " element " << i << ": f32 bits 0x" << std::hex << F32Bits(values[i]);
    }
  }
  const nlohmann::json index =
      nlohmann::json::parse(testing::ReadFile(dst + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], static_cast<int64_t>(values.size()) * 2 * 2 + 16);
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00002.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ConvertCheckpointTest, ::testing::Values("bf16", "f16"));

// Bad input: one line on stderr naming the problem, and the exit code the
// script documents (1 bad input, 2 bad usage, 3 output exists).
TEST(ConvertCheckpointErrorsTest, BadInputGetsOneLineAndItsExitCode) {
  test_support::ScratchDir tmp("vc_model_");
  const std::string ok = tmp.Subdir("ok");
  testing::WriteFile(ok + "/config.json", R"({"torch_dtype": "float32"})");
  testing::TestTensor t;
  t.name = "w";
  t.dtype = "F32";
  t.shape = {1};
  t.bytes = std::string(4, '\0');
  testing::WriteSafetensors(ok + "/model.safetensors", {&t});
  const std::string bin = tmp.Subdir("bin");
  testing::WriteFile(bin + "/config.json", "{}");
  testing::WriteFile(bin + "/pytorch_model.bin", "not safetensors");
  const std::string corrupt = tmp.Subdir("corrupt");
  testing::WriteFile(corrupt + "/config.json", "{}");
  testing::WriteFile(corrupt + "/model.safetensors", std::string("\xff\xff\xff\xff\0\0\0\0{}", 10));
  const std::string exists = tmp.Subdir("exists");

  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {tmp.path() + "/missing " + tmp.path() + "/o1 --dtype bf16", 1,
       "no such checkpoint directory"},
      {bin + " " + tmp.path() + "/o2 --dtype bf16", 1, "only safetensors is supported"},
      {corrupt + " " + tmp.path() + "/o3 --dtype bf16", 1, "not a safetensors file"},
      {ok + " " + tmp.path() + "/o4 --dtype fp8", 2, "invalid choice: 'fp8'"},
      {ok + " " + tmp.path() + "/o5", 2, "--dtype"},
      {ok + " " + exists + " --dtype bf16", 3, "exists (--force replaces it)"},
      {ok + " " + ok + " --dtype bf16 --force", 1, "the output is the input directory"},
  };
  for (const Case& c : cases) {
    const RunResult r = RunScript(c.args, tmp.path());
    EXPECT_EQ(r.exit_code, c.code) << c.args << ": " << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(c.says), std::string::npos) << c.args << ": " << r.stderr_text;
    EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  }
  EXPECT_FALSE(fs::exists(tmp.path() + "/o3")) << "a failed conversion left its output behind";
  // --force replaces an existing output; --help exits 0.
  const RunResult forced = RunScript(ok + " " + exists + " --dtype f16 --force", tmp.path());
  EXPECT_EQ(forced.exit_code, 0) << forced.stderr_text;
  EXPECT_TRUE(fs::exists(exists + "/model.safetensors"));
  EXPECT_EQ(RunScript("--help", tmp.path()).exit_code, 0);
  // Nothing but the outputs asked for: no leftover work directories.
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    EXPECT_NE(e.path().filename().string().rfind(".convert-", 0), 0u) << e.path();
  }
}

}  // namespace
}  // namespace vc
