// Writes small Hugging Face checkpoints for the loader tests: config.json plus
// model.safetensors, or shards model-0000i-of-0000N.safetensors with
// model.safetensors.index.json. Weights are random but exactly representable
// in the wire dtype, so a correct loader reproduces `values` bit for bit.
//
// Test-only code: I/O failures throw std::runtime_error, which GoogleTest
// reports as a test failure.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "nlohmann/json.hpp"

namespace vc::testing {

enum class WireDtype { kF32, kF16, kBF16 };

struct TestTensor {
  std::string name;
  std::string dtype;  // safetensors dtype name, e.g. "BF16"
  std::vector<int64_t> shape;
  std::string bytes;          // little-endian payload as written
  std::vector<float> values;  // what a correct loader yields (f32 widening)
};

// Random values drawn from [center - spread, center + spread], rounded to
// values exactly representable in `dtype`.
TestTensor RandomTensor(const std::string& name, std::vector<int64_t> shape, WireDtype dtype,
                        float center, float spread, std::mt19937_64& rng);
// A tensor with the given half-precision bit patterns (F16 or BF16).
TestTensor HalfBitsTensor(const std::string& name, const std::string& dtype,
                          const std::vector<uint16_t>& bits);

// Real published config.json files, field for field, with the sizes scaled
// down (2 layers, hidden sizes around 64, a few hundred tokens) and the
// token ids moved inside the scaled vocabulary.
nlohmann::json Llama31_8BInstructConfig();
nlohmann::json Mistral7BV01Config();
nlohmann::json Qwen2_7BConfig();
nlohmann::json Qwen25_05BConfig();

struct HfCheckpoint {
  nlohmann::json config;
  std::vector<TestTensor> tensors;

  TestTensor& Get(const std::string& name);  // throws if absent
  void Remove(const std::string& name);
};

// The tensors `config` implies, under their Hugging Face names.
HfCheckpoint MakeCheckpoint(const nlohmann::json& config, WireDtype dtype, uint64_t seed);

struct WriteOptions {
  int shards = 1;  // 1: model.safetensors; N > 1: N shards plus the index
  // Spaces added after the header's usual 8-byte padding; 1-3 leave the
  // data section misaligned for f32.
  int extra_header_padding = 0;
  // Entries added to each file's __metadata__ (besides "format": "pt"), e.g.
  // {"model.embed_tokens.weight", "lm_head.weight"} as safetensors' save_model
  // records a tensor it dropped as a duplicate.
  std::map<std::string, std::string> metadata = {};
};
// Writes config.json and the weights into `dir` (which must exist).
void WriteCheckpoint(const HfCheckpoint& ckpt, const std::string& dir,
                     const WriteOptions& options = {});
// One safetensors file holding `tensors` in order: its bytes, or written to `path`.
std::string SafetensorsBytes(const std::vector<const TestTensor*>& tensors,
                             int extra_header_padding = 0,
                             const std::map<std::string, std::string>& metadata = {});
void WriteSafetensors(const std::string& path, const std::vector<const TestTensor*>& tensors,
                      int extra_header_padding = 0,
                      const std::map<std::string, std::string>& metadata = {});
// Shard file names, as transformers writes them.
std::string ShardName(int index, int count);

void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);

// The model's f32 weight under a Hugging Face tensor name; null if the model
// exposes no such weight.
WeightMatrix FindWeight(const Model& model, const std::string& hf_name);

}  // namespace vc::testing
