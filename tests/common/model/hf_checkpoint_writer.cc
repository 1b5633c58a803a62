#include "tests/common/model/hf_checkpoint_writer.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

namespace vc::testing {
namespace {

using Json = nlohmann::json;

void AppendU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

void AppendF32(std::string* out, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

// Rounds x to the nearest half-precision value. Computed with frexp/ldexp
// rather than bit manipulation so it is not a copy of the loader's decoder.
uint16_t ToHalf(float x, float* exact) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (!(a < 65504.0)) throw std::runtime_error("ToHalf: value out of the test's range");
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  int exp = e - 1;
  uint16_t bits;
  double value;
  if (a == 0.0 || exp < -14) {
    const long m = std::lround(std::ldexp(a, 24));  // subnormal steps of 2^-24
    bits = static_cast<uint16_t>(m);                // m == 1024 is the smallest normal
    value = std::ldexp(static_cast<double>(m), -24);
  } else {
    long m = std::lround(std::ldexp(a, 10 - exp));  // 11 significant bits
    if (m == 2048) {
      m = 1024;
      ++exp;
    }
    bits = static_cast<uint16_t>(((exp + 15) << 10) | (m - 1024));
    value = std::ldexp(static_cast<double>(m), exp - 10);
  }
  *exact = static_cast<float>(sign ? -value : value);
  return static_cast<uint16_t>(sign | bits);
}

const char* DtypeName(WireDtype d) {
  switch (d) {
    case WireDtype::kF32:
      return "F32";
    case WireDtype::kF16:
      return "F16";
    case WireDtype::kBF16:
      return "BF16";
  }
  return "?";
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Fields shared by the Llama-family presets' scaled sizes.
Json Sizes(int hidden, int intermediate, int heads, int kv_heads, int vocab) {
  return Json{{"hidden_size", hidden},        {"intermediate_size", intermediate},
              {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
              {"num_hidden_layers", 2},       {"vocab_size", vocab}};
}

}  // namespace

TestTensor RandomTensor(const std::string& name, std::vector<int64_t> shape, WireDtype dtype,
                        float center, float spread, std::mt19937_64& rng) {
  TestTensor t;
  t.name = name;
  t.dtype = DtypeName(dtype);
  t.shape = std::move(shape);
  const int64_t n = Product(t.shape);
  std::uniform_real_distribution<float> u(center - spread, center + spread);
  for (int64_t i = 0; i < n; ++i) {
    const float x = u(rng);
    switch (dtype) {
      case WireDtype::kF32:
        t.values.push_back(x);
        AppendF32(&t.bytes, x);
        break;
      case WireDtype::kBF16: {
        // Truncating the low 16 bits leaves a value bf16 holds exactly.
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        bits &= 0xffff0000u;
        float v;
        std::memcpy(&v, &bits, 4);
        t.values.push_back(v);
        AppendU16(&t.bytes, static_cast<uint16_t>(bits >> 16));
        break;
      }
      case WireDtype::kF16: {
        float v;
        AppendU16(&t.bytes, ToHalf(x, &v));
        t.values.push_back(v);
        break;
      }
    }
  }
  return t;
}

TestTensor HalfBitsTensor(const std::string& name, const std::string& dtype,
                          const std::vector<uint16_t>& bits) {
  TestTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = {static_cast<int64_t>(bits.size())};
  for (uint16_t b : bits) AppendU16(&t.bytes, b);
  return t;  // values: the caller states what it expects
}

// Llama-3.1-8B-Instruct: 4096 hidden, 14336 intermediate, 32 heads of 128,
// 8 KV heads, vocab 128256 (bos 128000 = first special token).
Json Llama31_8BInstructConfig() {
  Json c = {
      {"architectures", {"LlamaForCausalLM"}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", 256},
      {"eos_token_id", {257, 264, 265}},
      {"hidden_act", "silu"},
      {"initializer_range", 0.02},
      {"max_position_embeddings", 131072},
      {"mlp_bias", false},
      {"model_type", "llama"},
      {"pretraining_tp", 1},
      {"rms_norm_eps", 1e-05},
      {"rope_scaling",
       {{"factor", 8.0},
        {"low_freq_factor", 1.0},
        {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 8192},
        {"rope_type", "llama3"}}},
      {"rope_theta", 500000.0},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.42.3"},
      {"use_cache", true},
  };
  c.update(Sizes(64, 224, 4, 1, 320));
  return c;
}

// Mistral-7B-v0.1: 4096 hidden, 14336 intermediate, 32 heads, 8 KV heads,
// vocab 32000, a 4096-token sliding window.
Json Mistral7BV01Config() {
  Json c = {
      {"architectures", {"MistralForCausalLM"}},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"hidden_act", "silu"},
      {"initializer_range", 0.02},
      {"max_position_embeddings", 32768},
      {"model_type", "mistral"},
      {"rms_norm_eps", 1e-05},
      {"rope_theta", 10000.0},
      {"sliding_window", 4096},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.34.0.dev0"},
      {"use_cache", true},
  };
  c.update(Sizes(64, 224, 4, 1, 256));
  return c;
}

// Qwen2-7B: 3584 hidden, 18944 intermediate, 28 heads of 128, 4 KV heads,
// vocab 152064 (bos = eos = 151643, <|endoftext|>), windows off.
Json Qwen2_7BConfig() {
  Json c = {
      {"architectures", {"Qwen2ForCausalLM"}},
      {"attention_dropout", 0.0},
      {"bos_token_id", 300},
      {"eos_token_id", 300},
      {"hidden_act", "silu"},
      {"initializer_range", 0.02},
      {"max_position_embeddings", 131072},
      {"max_window_layers", 2},
      {"model_type", "qwen2"},
      {"rms_norm_eps", 1e-06},
      {"rope_theta", 1000000.0},
      {"sliding_window", 131072},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.37.2"},
      {"use_cache", true},
      {"use_sliding_window", false},
  };
  c.update(Sizes(56, 296, 7, 1, 320));
  return c;
}

// Qwen2.5-0.5B: 896 hidden, 4864 intermediate, 14 heads of 64, 2 KV heads,
// vocab 151936, tied embeddings, windows off.
Json Qwen25_05BConfig() {
  Json c = {
      {"architectures", {"Qwen2ForCausalLM"}},
      {"attention_dropout", 0.0},
      {"bos_token_id", 300},
      {"eos_token_id", 300},
      {"hidden_act", "silu"},
      {"initializer_range", 0.02},
      {"max_position_embeddings", 32768},
      {"max_window_layers", 2},
      {"model_type", "qwen2"},
      {"rms_norm_eps", 1e-06},
      {"rope_theta", 1000000.0},
      {"sliding_window", 32768},
      {"tie_word_embeddings", true},
      {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.40.1"},
      {"use_cache", true},
      {"use_sliding_window", false},
  };
  c.update(Sizes(56, 304, 14, 2, 320));
  return c;
}

TestTensor& HfCheckpoint::Get(const std::string& name) {
  for (TestTensor& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("HfCheckpoint has no tensor " + name);
}

void HfCheckpoint::Remove(const std::string& name) {
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    if (it->name == name) {
      tensors.erase(it);
      return;
    }
  }
  throw std::runtime_error("HfCheckpoint has no tensor " + name);
}

HfCheckpoint MakeCheckpoint(const Json& config, WireDtype dtype, uint64_t seed) {
  HfCheckpoint ck;
  ck.config = config;
  std::mt19937_64 rng(seed);
  const int64_t d = config.at("hidden_size").get<int64_t>();
  const int64_t h = config.at("intermediate_size").get<int64_t>();
  const int64_t heads = config.at("num_attention_heads").get<int64_t>();
  // Absent or null: the loader's defaults (multi-head attention, d / heads).
  auto int_or = [&](const char* key, int64_t def) {
    return config.contains(key) && !config[key].is_null() ? config[key].get<int64_t>() : def;
  };
  const int64_t kv_heads = int_or("num_key_value_heads", heads);
  const int64_t head_dim = int_or("head_dim", d / heads);
  const int64_t layers = config.at("num_hidden_layers").get<int64_t>();
  const int64_t vocab = config.at("vocab_size").get<int64_t>();
  const std::string arch = config.at("architectures")[0].get<std::string>();
  const bool llama_bias = arch == "LlamaForCausalLM" && config.value("attention_bias", false);
  const bool qkv_bias = arch == "Qwen2ForCausalLM" || llama_bias;
  const bool tied = config.value("tie_word_embeddings", false);
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(d));

  auto add = [&](const std::string& name, std::vector<int64_t> shape, float center, float spread) {
    ck.tensors.push_back(RandomTensor(name, std::move(shape), dtype, center, spread, rng));
  };
  add("model.embed_tokens.weight", {vocab, d}, 0.f, 1.f);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {d}, 1.f, 0.1f);
    add(p + "self_attn.q_proj.weight", {q, d}, 0.f, w_scale);
    add(p + "self_attn.k_proj.weight", {kv, d}, 0.f, w_scale);
    add(p + "self_attn.v_proj.weight", {kv, d}, 0.f, w_scale);
    if (qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q}, 0.f, 0.1f);
      add(p + "self_attn.k_proj.bias", {kv}, 0.f, 0.1f);
      add(p + "self_attn.v_proj.bias", {kv}, 0.f, 0.1f);
    }
    add(p + "self_attn.o_proj.weight", {d, q}, 0.f, w_scale);
    if (llama_bias) add(p + "self_attn.o_proj.bias", {d}, 0.f, 0.f);  // all zero
    add(p + "post_attention_layernorm.weight", {d}, 1.f, 0.1f);
    add(p + "mlp.gate_proj.weight", {h, d}, 0.f, w_scale);
    add(p + "mlp.up_proj.weight", {h, d}, 0.f, w_scale);
    add(p + "mlp.down_proj.weight", {d, h}, 0.f, 1.0f / std::sqrt(static_cast<float>(h)));
  }
  add("model.norm.weight", {d}, 1.f, 0.1f);
  if (!tied) add("lm_head.weight", {vocab, d}, 0.f, w_scale);
  return ck;
}

std::string ShardName(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", index + 1, count);
  return buf;
}

std::string SafetensorsBytes(const std::vector<const TestTensor*>& tensors,
                             int extra_header_padding,
                             const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  uint64_t offset = 0;
  for (const TestTensor* t : tensors) {
    header[t->name] = {{"dtype", t->dtype},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string text = header.dump();
  // Like the reference writer: pad with spaces so the data starts 8-aligned.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  text.append(static_cast<size_t>(extra_header_padding), ' ');
  std::string out;
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += text;
  for (const TestTensor* t : tensors) out += t->bytes;
  return out;
}

void WriteSafetensors(const std::string& path, const std::vector<const TestTensor*>& tensors,
                      int extra_header_padding,
                      const std::map<std::string, std::string>& metadata) {
  WriteFile(path, SafetensorsBytes(tensors, extra_header_padding, metadata));
}

void WriteCheckpoint(const HfCheckpoint& ckpt, const std::string& dir,
                     const WriteOptions& options) {
  WriteFile(dir + "/config.json", ckpt.config.dump(2));
  const int n = options.shards;
  if (n <= 1) {
    std::vector<const TestTensor*> all;
    for (const TestTensor& t : ckpt.tensors) all.push_back(&t);
    WriteSafetensors(dir + "/model.safetensors", all, options.extra_header_padding,
                     options.metadata);
    return;
  }
  Json weight_map = Json::object();
  uint64_t total = 0;
  const size_t count = ckpt.tensors.size();
  for (int s = 0; s < n; ++s) {
    std::vector<const TestTensor*> part;
    for (size_t i = count * s / n; i < count * (s + 1) / n; ++i) {
      part.push_back(&ckpt.tensors[i]);
      weight_map[ckpt.tensors[i].name] = ShardName(s, n);
      total += ckpt.tensors[i].bytes.size();
    }
    WriteSafetensors(dir + "/" + ShardName(s, n), part, options.extra_header_padding,
                     options.metadata);
  }
  Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  WriteFile(dir + "/model.safetensors.index.json", index.dump(2));
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

WeightMatrix FindWeight(const Model& model, const std::string& name) {
  const ModelWeights& w = model.weights();
  if (name == "model.embed_tokens.weight") return w.token_embedding;
  if (name == "model.norm.weight") return w.rms_final;
  if (name == "lm_head.weight") return w.classifier;
  const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return nullptr;
  size_t pos = prefix.size();
  const size_t dot = name.find('.', pos);
  if (dot == std::string::npos) return nullptr;
  const size_t layer = std::stoul(name.substr(pos, dot - pos));
  if (layer >= w.layers.size()) return nullptr;
  const LayerWeights& lw = w.layers[layer];
  const std::string rest = name.substr(dot + 1);
  if (rest == "input_layernorm.weight") return lw.rms_att;
  if (rest == "self_attn.q_proj.weight") return lw.wq;
  if (rest == "self_attn.k_proj.weight") return lw.wk;
  if (rest == "self_attn.v_proj.weight") return lw.wv;
  if (rest == "self_attn.q_proj.bias") return lw.bq;
  if (rest == "self_attn.k_proj.bias") return lw.bk;
  if (rest == "self_attn.v_proj.bias") return lw.bv;
  if (rest == "self_attn.o_proj.weight") return lw.wo;
  if (rest == "post_attention_layernorm.weight") return lw.rms_ffn;
  if (rest == "mlp.gate_proj.weight") return lw.w1;
  if (rest == "mlp.down_proj.weight") return lw.w2;
  if (rest == "mlp.up_proj.weight") return lw.w3;
  return nullptr;
}

}  // namespace vc::testing
