// The model shape the codec fuzzers decode for and the seed generator
// (make_seeds.cc) writes its chunks and variants in.
#pragma once

#include "common/model/model.h"

namespace vc::fuzz {

inline ModelConfig SeedModelConfig() {
  ModelConfig c;
  c.dim = 16;
  c.hidden_dim = 24;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 32;
  c.max_seq_len = 64;
  c.bos_id = 1;
  c.eos_id = 2;
  return c;
}

}  // namespace vc::fuzz
