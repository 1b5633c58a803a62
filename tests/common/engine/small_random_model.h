// A small random model and a run of passes over it, for the engine tests of
// options that must not change a logit (the warm-up pass, the stage clock).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "gtest/gtest.h"

namespace vc::engine_testing {

inline ModelConfig SmallRandomConfig() {
  ModelConfig c;
  c.architecture = "random";
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 50;
  c.max_seq_len = 48;
  return c;
}

// The logits of passes of `sizes` tokens each (ids drawn from `seed`) over
// one fresh KV, in order.
inline std::vector<float> RunPasses(Engine& engine, uint64_t seed,
                                    std::initializer_list<int> sizes) {
  const ModelConfig& c = engine.config();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  PagedKvCache kv(c);
  std::vector<float> all, logits;
  for (int n : sizes) {
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = tok(rng);
    const SequenceInput in{&kv, tokens, 0};
    const absl::Status s = engine.Forward({&in, 1}, &logits);
    EXPECT_TRUE(s.ok()) << s;
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

}  // namespace vc::engine_testing
