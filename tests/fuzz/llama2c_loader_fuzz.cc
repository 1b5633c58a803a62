// The llama2.c checkpoint loader (Model::LoadLlama2c) on arbitrary files.
// Invariants: a file that loads has a valid config, and every weight pointer
// lies inside the file (checked by reading each tensor's first and last
// float: the mapping is exactly the file, so a pointer past it faults).
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model/model.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  const std::string path =
      WriteScratch("model.bin", std::string_view(reinterpret_cast<const char*>(data), size));
  auto model = vc::Model::LoadLlama2c(path);
  if (!model.ok()) {
    VC_FUZZ_CHECK(absl::IsInvalidArgument(model.status()),
                  std::string(model.status().message()).c_str());
    return 0;
  }
  const vc::ModelConfig& c = (*model)->config();
  VC_FUZZ_CHECK(c.Validate().ok(), "a loaded model has a valid config");
  VC_FUZZ_CHECK(c.num_parameters() * 4 <= static_cast<int64_t>(size), "weights fit the file");
  const vc::ModelWeights& w = (*model)->weights();
  volatile float sink = 0;
  auto touch = [&](vc::WeightMatrix p, int64_t n) {
    VC_FUZZ_CHECK(static_cast<bool>(p), "weight present");
    sink = sink + p.At(0) + p.At(n - 1);
  };
  const int64_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  touch(w.token_embedding, int64_t{c.vocab_size} * d);
  touch(w.classifier, int64_t{c.vocab_size} * d);
  touch(w.rms_final, d);
  VC_FUZZ_CHECK(static_cast<int>(w.layers.size()) == c.n_layers, "one entry per layer");
  for (const vc::LayerWeights& l : w.layers) {
    touch(l.rms_att, d);
    touch(l.wq, q * d);
    touch(l.wk, kv * d);
    touch(l.wv, kv * d);
    touch(l.wo, d * q);
    touch(l.rms_ffn, d);
    touch(l.w1, h * d);
    touch(l.w2, d * h);
    touch(l.w3, h * d);
  }
  return 0;
}
