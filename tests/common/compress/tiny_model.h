// What the compressor tests share: the tiny model shape their hand-computed
// budgets assume, and reading a stored row back.
#pragma once

#include <cstdint>
#include <vector>

#include "common/kv/row_codec.h"
#include "common/model/model.h"

namespace vc::testing {

// Two layers, two KV heads (GQA: two query heads each), head_dim 4: a full
// f32 token costs 2 layers x 2 heads x 2 rows x 16 bytes = 128 bytes, and a
// kept token of one head 2 x 16 + 4 (index) = 36 bytes against 32 full, so a
// ratio of 0.5 keeps 5 of 12 tokens and 7 of 16.
inline ModelConfig TinyConfig(int layers = 2) {
  ModelConfig c;
  c.dim = 16;
  c.hidden_dim = 32;
  c.n_layers = layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.vocab_size = 32;
  c.max_seq_len = 128;
  return c;
}

// Row i of `store`, dequantised.
inline std::vector<float> Row(const RowStore& store, int64_t i) {
  std::vector<float> out(store.dim());
  store.Decode(i, out.data());
  return out;
}

}  // namespace vc::testing
