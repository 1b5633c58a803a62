// The small model shape that the KV, ingest, long-context and speculative
// tests share: 2 layers, 4 query heads over 2 KV heads (so every path sees
// grouped-query attention) of 8 dims, a 32-wide residual. Small enough that
// a random model's prefill of a few hundred tokens takes milliseconds under
// the sanitizers; each test picks the vocabulary, context and FFN width its
// cases need.
#pragma once

#include "common/model/model.h"

namespace vc::test_support {

struct SmallModelShape {
  int vocab_size = 64;
  int max_seq_len = 128;
  int hidden_dim = 48;
};

inline ModelConfig SmallModelConfig(const SmallModelShape& shape = {}) {
  ModelConfig c;
  c.dim = 32;
  c.hidden_dim = shape.hidden_dim;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = shape.vocab_size;
  c.max_seq_len = shape.max_seq_len;
  return c;
}

}  // namespace vc::test_support
