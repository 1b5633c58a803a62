// The Hugging Face checkpoint loader (Model::LoadHuggingFace: config.json
// parsing, then model.safetensors checked against it) on arbitrary pairs of
// files. Input: u16 little-endian length N, N bytes of config.json, then the
// bytes of model.safetensors (an empty rest writes no weights file, so the
// config alone is parsed). Invariants: errors are InvalidArgument or
// NotFound; a model that loads has a valid config and one weight entry per
// layer, and its weights can be read end to end.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model/model.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  Input in(data, size);
  const std::string config = in.Bytes(in.U16());
  const std::string weights = in.Rest();
  WriteScratch("config.json", config);
  if (weights.empty()) {
    RemoveScratch("model.safetensors");
  } else {
    WriteScratch("model.safetensors", weights);
  }
  auto model = vc::Model::LoadHuggingFace(ScratchDir());
  if (!model.ok()) {
    const absl::Status& s = model.status();
    VC_FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsNotFound(s),
                  std::string(s.message()).c_str());
    return 0;
  }
  const vc::ModelConfig& c = (*model)->config();
  VC_FUZZ_CHECK(c.Validate().ok(), "a loaded model has a valid config");
  const vc::ModelWeights& w = (*model)->weights();
  VC_FUZZ_CHECK(static_cast<int>(w.layers.size()) == c.n_layers, "one entry per layer");
  volatile float sink = 0;
  auto touch = [&](vc::WeightMatrix p, int64_t n) {
    VC_FUZZ_CHECK(static_cast<bool>(p), "weight present");
    for (int64_t i = 0; i < n; ++i) sink = sink + p.At(i);
  };
  const int64_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  touch(w.token_embedding, int64_t{c.vocab_size} * d);
  touch(w.classifier, int64_t{c.vocab_size} * d);
  touch(w.rms_final, d);
  for (const vc::LayerWeights& l : w.layers) {
    touch(l.wq, q * d);
    touch(l.wk, kv * d);
    touch(l.wv, kv * d);
    touch(l.wo, d * q);
    touch(l.w1, h * d);
    touch(l.w2, d * h);
    touch(l.w3, h * d);
    if (c.qkv_bias) {
      touch(l.bq, q);
      touch(l.bk, kv);
      touch(l.bv, kv);
    }
  }
  return 0;
}
