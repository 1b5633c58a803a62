// Shared by the cluster suites: where the test model is, and prompts that
// are the model's own text (a greedy continuation of a short seed), so
// drafts are accepted as on real text.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/decode/full_decode.h"

namespace vc::clustertest {

inline std::string StoriesModelPath() {
  const char* dir = std::getenv("VC_MODELS_DIR");
  return std::string(dir ? dir : "../shared/models") + "/stories260K.bin";
}

// `n` tokens: BOS, a seed-chosen token, then the model's greedy continuation.
inline std::vector<int32_t> ModelText(Engine& engine, int n, uint64_t seed) {
  std::vector<int32_t> p = {1, static_cast<int32_t>(300 + seed % 100)};
  DecodeOptions o;
  o.max_new_tokens = n - 2;
  o.ignore_eos = true;
  auto r = std::move(DecodeFull(engine, p, o)).value();
  p.insert(p.end(), r.tokens.begin(), r.tokens.end());
  return p;
}

}  // namespace vc::clustertest
