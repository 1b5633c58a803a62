// Writes the fuzz targets' seed corpora into REPO/tests/fuzz/corpus/<target>/:
// small valid inputs made by the project's own encoders (wire requests and
// responses, chunks, variants, row stores, safetensors and llama2.c files,
// tokenizer.bin, protos) plus the repo's small example configs. Deterministic
// (fixed seeds), so rerunning it rewrites the same files.
//   usage: vc_fuzz_seeds REPO_ROOT
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/engine/kv_cache.h"
#include "common/kv/compressed_kv.h"
#include "common/kv/row_codec.h"
#include "common/kvstore/chunk_codec.h"
#include "common/kvstore/variant_codec.h"
#include "common/transport/internal/wire.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/hf_checkpoint_writer.h"
#include "tests/fuzz/seed_shapes.h"
#include "vericache/v1/coordinator.pb.h"

namespace vc::fuzz {
namespace {

namespace tw = transport::internal;
using Json = nlohmann::json;

std::string g_root;

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "vc_fuzz_seeds: " << what << "\n";
  std::exit(1);
}

void MakeDirs(const std::string& path) {
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    partial += part + "/";
    ::mkdir(partial.c_str(), 0755);
  }
}

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = g_root + "/tests/fuzz/corpus/" + target;
  MakeDirs(dir);
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) Die("cannot write " + dir + "/" + name);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void PutU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI32(std::string* out, int32_t v) { PutU32(out, static_cast<uint32_t>(v)); }
void PutF32(std::string* out, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  PutU32(out, u);
}
// u16 length + first part + second part: the two-file targets' input.
std::string TwoParts(const std::string& first, const std::string& second) {
  if (first.size() > 0xffff) Die("first part too long");
  std::string out;
  PutU16(&out, static_cast<uint16_t>(first.size()));
  return out + first + second;
}

// ---- data plane -----------------------------------------------------------

std::string StageRequest(uint64_t put_id,
                         const std::vector<std::pair<std::string, std::string>>& entries) {
  auto body = tw::StageBodyBytes(entries);
  if (!body.ok()) Die("stage body");
  std::string out = tw::EncodeStageHeader(put_id, transport::LinkClass::kSlow,
                                          static_cast<uint32_t>(entries.size()), *body, 0);
  for (const auto& [k, v] : entries) out += tw::EncodeStageEntryHead(k, v.size()) + v;
  return out;
}

void DataPlaneSeeds() {
  const char piece = 0;  // first byte: read piece size selector
  auto fetch = tw::EncodeRequest({"ab", "cd", "Nx"}, transport::LinkClass::kFast, 0, 1 << 16);
  auto fetch_ok = tw::EncodeRequest({"k1", "k2"}, transport::LinkClass::kFast, 5000, 1 << 16);
  std::vector<std::string> many;
  for (int i = 0; i < 20; ++i) many.push_back("key" + std::to_string(i));
  auto too_many = tw::EncodeRequest(many, transport::LinkClass::kSlow, 0, 1 << 16);
  if (!fetch.ok() || !fetch_ok.ok() || !too_many.ok()) Die("encode fetch");
  const std::string stage = StageRequest(42, {{"s1", "value one"}, {"s2", std::string(100, 'z')}});
  const std::string stage_fail = StageRequest(43, {{"ok", "v"}, {"Fail", "w"}, {"after", "x"}});
  Seed("fuzz_dataplane_server", "fetch", std::string(1, piece) + *fetch_ok);
  Seed("fuzz_dataplane_server", "fetch_missing", std::string(1, '\x01') + *fetch);
  Seed("fuzz_dataplane_server", "stage", std::string(1, piece) + stage);
  Seed("fuzz_dataplane_server", "stage_fails", std::string(1, '\x02') + stage_fail);
  Seed("fuzz_dataplane_server", "fetch_stage_fetch",
       std::string(1, piece) + *fetch_ok + stage + *fetch_ok);
  Seed("fuzz_dataplane_server", "too_many_keys", std::string(1, piece) + *too_many + *fetch_ok);
  std::string bad = *fetch_ok;
  bad[0] = 'X';
  Seed("fuzz_dataplane_server", "bad_magic", std::string(1, piece) + bad);

  // Client: call count, one byte per call (bit 7 = stage, low 3 bits = keys-1),
  // piece selector, then the server's answers.
  auto ok_values = [](const std::vector<std::string>& values) {
    tw::ResponseHeader h;
    h.count = static_cast<uint32_t>(values.size());
    std::string out = tw::EncodeResponseHeader(h);
    for (const std::string& v : values) {
      tw::PutU64(&out, v.size());
      out += v;
    }
    return out;
  };
  tw::ResponseHeader staged;
  staged.count = 2;
  Seed("fuzz_dataplane_client", "fetch_two",
       std::string("\x00\x01\x00", 3) + ok_values({"value-a", "value-b"}));
  Seed("fuzz_dataplane_client", "fetch_error",
       std::string("\x00\x02\x00", 3) +
           tw::EncodeErrorResponse(absl::NotFoundError("key 6162: not found")));
  Seed("fuzz_dataplane_client", "stage_then_fetch",
       std::string("\x01\x81\x00\x00", 4) + tw::EncodeResponseHeader(staged) + ok_values({"x"}));
  Seed("fuzz_dataplane_client", "four_calls",
       std::string("\x03\x00\x80\x01\x02\x05", 6) + ok_values({"1"}) +
           tw::EncodeErrorResponse(absl::ResourceExhaustedError("too big")) +
           ok_values({"22", "333"}) + ok_values({"4444", "5", "6"}));
}

// ---- KV codecs --------------------------------------------------------------

std::vector<float> RandomRows(int64_t n, int dim, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n * dim));
  for (float& x : v) x = d(rng);
  return v;
}

void CodecSeeds() {
  std::mt19937_64 rng(13);
  const ModelConfig c = SeedModelConfig();
  // A cache holding positions [0, 32) of random rows.
  PagedKvCache cache(c);
  if (!cache.Append(32).ok()) Die("append");
  for (int32_t p = 0; p < 32; ++p) {
    for (int l = 0; l < c.n_layers; ++l) {
      const auto k = RandomRows(c.n_kv_heads, c.head_dim, rng);
      const auto v = RandomRows(c.n_kv_heads, c.head_dim, rng);
      cache.Write(l, p, k.data(), v.data());
    }
  }
  // Chunks: first byte 0 (keep the checksum as written).
  for (auto [first, tokens] : {std::pair{0, 4}, std::pair{8, 2}, std::pair{31, 1}}) {
    auto chunk = kvstore::EncodeChunk(cache, first, tokens);
    if (!chunk.ok()) Die("encode chunk");
    Seed("fuzz_chunk_codec", "chunk_" + std::to_string(first) + "_" + std::to_string(tokens),
         std::string(1, '\0') + *chunk);
  }

  // Row stores in every format.
  struct Spec {
    const char* name;
    RowCodecSpec spec;
    int64_t rows;
  };
  const std::vector<Spec> specs = {
      {"f32", RowCodecSpec::F32(), 5},
      {"int8_token_sym", {RowCodecSpec::Kind::kPerTokenSymmetric, 8, 4, 0}, 6},
      {"int4_token_asym_residual", {RowCodecSpec::Kind::kPerTokenAsymmetric, 4, 8, 2}, 7},
      {"int2_channel_asym", {RowCodecSpec::Kind::kPerChannelAsymmetric, 2, 4, 1}, 9},
  };
  for (const Spec& s : specs) {
    const auto rows = RandomRows(s.rows, c.head_dim, rng);
    auto store = RowStore::Encode(s.spec, rows.data(), s.rows, c.head_dim);
    if (!store.ok()) Die(std::string("encode row store ") + s.name + ": " +
                         std::string(store.status().message()));
    std::string bytes;
    (*store)->AppendSerialized(&bytes);
    Seed("fuzz_row_codec", s.name, bytes);
  }
  // Rows rounded to a model dtype (a bf16/f16 model's K/V): the
  // full-precision rows travel as 2-byte values with their dtype word.
  for (const Dtype d : {Dtype::kBf16, Dtype::kF16}) {
    for (const Spec& s : {specs[0], specs[2]}) {
      auto rows = RandomRows(s.rows, c.head_dim, rng);
      for (float& x : rows) x = RoundToDtype(x, d);
      auto store = RowStore::Encode(s.spec, rows.data(), s.rows, c.head_dim);
      if (!store.ok()) Die(std::string("encode row store ") + s.name);
      std::string bytes;
      (*store)->AppendSerialized(&bytes);
      Seed("fuzz_row_codec", std::string(s.name) + "_" + DtypeName(d), bytes);
    }
  }

  // Variants: token dropping (every other position), with f32 / INT8 / KIVI rows.
  std::vector<std::vector<std::vector<int32_t>>> kept(
      c.n_layers, std::vector<std::vector<int32_t>>(c.n_kv_heads));
  for (auto& layer : kept) {
    for (auto& head : layer) {
      for (int32_t p = 0; p < 32; p += 2) head.push_back(p);
    }
  }
  std::vector<std::vector<std::vector<int32_t>>> all = kept;
  for (auto& layer : all) {
    for (auto& head : layer) {
      head.clear();
      for (int32_t p = 0; p < 32; ++p) head.push_back(p);
    }
  }
  struct VariantCase {
    const char* name;
    const std::vector<std::vector<std::vector<int32_t>>>* kept;
    RowCodecSpec keys, values;
  };
  const std::vector<VariantCase> variants = {
      {"drop_f32", &kept, RowCodecSpec::F32(), RowCodecSpec::F32()},
      {"int8", &all, {RowCodecSpec::Kind::kPerTokenSymmetric, 8, 0, 0},
       {RowCodecSpec::Kind::kPerTokenSymmetric, 8, 0, 0}},
      {"drop_kivi2", &kept, {RowCodecSpec::Kind::kPerChannelAsymmetric, 2, 4, 4},
       {RowCodecSpec::Kind::kPerTokenAsymmetric, 2, 4, 4}},
  };
  for (const VariantCase& v : variants) {
    auto prefix = CompressedPrefix::Build(c, cache, 32, *v.kept, v.keys, v.values, v.name);
    if (!prefix.ok()) Die(std::string("build variant ") + v.name + ": " +
                          std::string(prefix.status().message()));
    Seed("fuzz_variant_codec", v.name, std::string(1, '\0') + kvstore::EncodeCompressedPrefix(**prefix));
  }
}

// ---- model files ------------------------------------------------------------

// A llama2.c checkpoint: 7 int32 header fields, then f32 tensors in order.
std::string Llama2c(int dim, int hidden, int layers, int heads, int kv_heads, int vocab, int seq,
                    bool tied) {
  std::string out;
  for (int v : {dim, hidden, layers, heads, kv_heads, tied ? vocab : -vocab, seq}) PutI32(&out, v);
  const int head = dim / heads;
  const int64_t kv = int64_t{kv_heads} * head;
  const int64_t floats = int64_t{vocab} * dim + layers * (2 * dim + 2 * dim * dim + 2 * kv * dim +
                                                          3 * int64_t{hidden} * dim) +
                         dim + int64_t{seq} * head + (tied ? 0 : int64_t{vocab} * dim);
  for (int64_t i = 0; i < floats; ++i) PutF32(&out, static_cast<float>(i % 7) * 0.125f);
  return out;
}

Json TinyConfig(const char* arch) {
  Json j = {{"architectures", {arch}},
            {"hidden_size", 8},
            {"intermediate_size", 12},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 1},
            {"vocab_size", 16},
            {"max_position_embeddings", 64},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},
            {"bos_token_id", 1},
            {"eos_token_id", 2},
            {"tie_word_embeddings", true},
            {"hidden_act", "silu"}};
  return j;
}

void ModelSeeds() {
  Seed("fuzz_llama2c_loader", "tiny_tied", Llama2c(8, 12, 1, 2, 2, 16, 8, true));
  Seed("fuzz_llama2c_loader", "tiny_gqa_untied", Llama2c(8, 12, 2, 4, 2, 16, 4, false));

  int n = 0;
  for (const char* arch : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}) {
    for (auto dtype : {testing::WireDtype::kBF16, testing::WireDtype::kF32}) {
      Json config = TinyConfig(arch);
      if (std::string(arch) == "MistralForCausalLM") config["sliding_window"] = nullptr;
      const testing::HfCheckpoint ck = testing::MakeCheckpoint(config, dtype, 7 + n);
      std::vector<const testing::TestTensor*> tensors;
      for (const testing::TestTensor& t : ck.tensors) tensors.push_back(&t);
      const std::string st = testing::SafetensorsBytes(tensors);
      const std::string name = std::string(arch) + (dtype == testing::WireDtype::kF32 ? "_f32" : "_bf16");
      Seed("fuzz_hf_checkpoint", name, TwoParts(config.dump(1), st));
      if (n == 0) Seed("fuzz_safetensors", "tiny_llama_bf16", st);
      if (n == 1) Seed("fuzz_safetensors", "tiny_llama_f32", st);
      ++n;
    }
  }
  // The scaled-down copies of real published configs, config only.
  Seed("fuzz_hf_checkpoint", "config_llama31_8b", TwoParts(testing::Llama31_8BInstructConfig().dump(1), ""));
  Seed("fuzz_hf_checkpoint", "config_mistral_7b", TwoParts(testing::Mistral7BV01Config().dump(1), ""));
  Seed("fuzz_hf_checkpoint", "config_qwen2_7b", TwoParts(testing::Qwen2_7BConfig().dump(1), ""));
  Seed("fuzz_hf_checkpoint", "config_qwen25_05b", TwoParts(testing::Qwen25_05BConfig().dump(1), ""));
}

// tokenizer.bin: i32 max_token_length, then per id f32 score, i32 length, bytes.
void TokenizerSeeds() {
  std::vector<std::pair<std::string, float>> pieces = {{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    pieces.emplace_back(name, 0.f);
  }
  for (const char* p : {" ", "e", "t", "h", " t", "th", " th", "he", " the", "a", " a", "\xc3\xa9"}) {
    pieces.emplace_back(p, -static_cast<float>(pieces.size()));
  }
  std::string file;
  PutI32(&file, 8);
  for (const auto& [text, score] : pieces) {
    PutF32(&file, score);
    PutI32(&file, static_cast<int32_t>(text.size()));
    file += text;
  }
  // Input: u16 vocab, u8 text length, text, file.
  auto input = [&](int vocab, const std::string& text) {
    std::string out;
    PutU16(&out, static_cast<uint16_t>(vocab));
    out.push_back(static_cast<char>(text.size()));
    return out + text + file;
  };
  const int vocab = static_cast<int>(pieces.size());
  Seed("fuzz_tokenizer_bin", "bytes_and_merges", input(vocab, "the theta at\xc3\xa9 \x01!"));
  Seed("fuzz_tokenizer_bin", "fewer_ids", input(200, "hat"));
  Seed("fuzz_tokenizer_bin", "empty_text", input(vocab, ""));
}

// ---- protos and configs ---------------------------------------------------------

void ProtoSeeds() {
  namespace pb = ::vericache::v1;
  auto gen = [](const pb::GenerateRequest& r) { return std::string(1, '\0') + r.SerializeAsString(); };
  pb::GenerateRequest g;
  for (int i = 0; i < 20; ++i) g.add_prompt_ids(i * 7 % 500);
  g.set_max_new_tokens(16);
  Seed("fuzz_coordinator_request", "generate_greedy", gen(g));
  g.set_compressor("snapkv");
  g.set_ratio(0.25);
  g.set_mode(pb::MODE_VERICACHE);
  g.set_online_update(true);
  g.mutable_sampling()->set_mode(pb::SamplingConfig::SEEDED);
  g.mutable_sampling()->set_temperature(0.8f);
  g.mutable_sampling()->set_top_k(40);
  g.mutable_sampling()->set_seed(7);
  g.set_draft_len(4);
  g.set_deadline_ms(3000);
  Seed("fuzz_coordinator_request", "generate_seeded_snapkv", gen(g));
  pb::GenerateRequest p;
  p.set_prefix_id(std::string(64, 'a'));
  p.add_suffix_ids(3);
  p.set_max_new_tokens(4);
  p.set_compressor("kivi");
  p.set_bits(4);
  p.mutable_sampling()->set_mode(pb::SamplingConfig::REJECTION);
  p.mutable_sampling()->set_temperature(1.0f);
  p.mutable_sampling()->set_top_p(0.9f);
  Seed("fuzz_coordinator_request", "generate_prefix_kivi", gen(p));
  // Inputs of fixed bugs (docs/results.md, Reliability): prompt +
  // max_new_tokens overflowed int64; a NaN ratio passed the range check.
  pb::GenerateRequest overflow;
  overflow.add_prompt_ids(5);
  overflow.set_max_new_tokens(std::numeric_limits<int64_t>::max());
  Seed("fuzz_coordinator_request", "regression-max-new-tokens-int64-max", gen(overflow));
  pb::GenerateRequest nan_ratio = overflow;
  nan_ratio.set_max_new_tokens(4);
  nan_ratio.set_compressor("snapkv");
  nan_ratio.set_ratio(std::numeric_limits<double>::quiet_NaN());
  Seed("fuzz_coordinator_request", "regression-nan-ratio", gen(nan_ratio));
  pb::RegisterPrefixRequest r;
  for (int i = 0; i < 40; ++i) r.add_tokens(i);
  r.set_variants("snapkv:0.25,kivi:4,snapkv+kivi:0.5:4,int8");
  r.set_tenant_salt("tenant");
  Seed("fuzz_coordinator_request", "register_prefix", std::string(1, '\x01') + r.SerializeAsString());
}

void SimSeeds() {
  const std::string dir = g_root + "/bench/sim/";
  const std::string csv = ReadFileOrDie(dir + "acceptance_example.csv");
  for (const char* name : {"empirical_acceptance", "fig6_lockstep_vs_staggered", "local_cluster",
                           "long_context_mistral24b", "long_context_poisson",
                           "remote_prefix_llama70b"}) {
    std::string config = ReadFileOrDie(dir + name + ".json");
    // The CSV travels as the input's second part, under the name acc.csv.
    const std::string from = "acceptance_example.csv";
    for (size_t at = config.find(from); at != std::string::npos; at = config.find(from)) {
      config.replace(at, from.size(), "acc.csv");
    }
    Seed("fuzz_sim_config", name, TwoParts(config, csv));
  }
}

}  // namespace
}  // namespace vc::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: vc_fuzz_seeds REPO_ROOT\n";
    return 2;
  }
  vc::fuzz::g_root = argv[1];
  vc::fuzz::DataPlaneSeeds();
  vc::fuzz::CodecSeeds();
  vc::fuzz::ModelSeeds();
  vc::fuzz::TokenizerSeeds();
  vc::fuzz::ProtoSeeds();
  vc::fuzz::SimSeeds();
  std::cout << "vc_fuzz_seeds: corpora written under " << argv[1] << "/tests/fuzz/corpus\n";
  return 0;
}
