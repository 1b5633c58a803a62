// Test helper: runs Hugging Face's JavaScript tokenizer (@huggingface/tokenizers,
// installed by deploy/scripts/install_tools.sh) over a batch of strings in one
// node process, and compares its answers with ours.
#pragma once

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/text_tokenizer.h"

namespace vc::testing {

struct ReferenceResult {
  std::vector<int32_t> ids;          // encode(text, add_special_tokens=false)
  std::vector<int32_t> ids_special;  // encode(text) (add_special_tokens=true)
  std::optional<std::string> normalized;
  std::string decoded;       // decode(ids_special)
  std::string decoded_skip;  // decode(ids_special, skip_special_tokens=true)
};

// Empty when node and the package are there; otherwise why not (for GTEST_SKIP).
std::string ReferenceUnavailableReason();

// The shared tokenizers: {name, tokenizer.json path}; every directory of
// $VC_MODELS_DIR/../tokenizers and the tinystories656K checkpoint.
std::vector<std::pair<std::string, std::string>> SharedTokenizers();

// With `our_normalizer`, the reference's normaliser is replaced by ours (its
// Precompiled is an approximation): every section it normalises is looked up
// in a table of our normalisations (two rounds when sections are missing).
absl::StatusOr<std::vector<ReferenceResult>> RunReference(const std::string& tokenizer_json,
                                                          const std::vector<std::string>& texts,
                                                          const TextTokenizer* our_normalizer = nullptr);

// One line per disagreement between `ours` and the reference on texts[i];
// empty when they agree everywhere. With `precompiled_exception`, a text whose
// normalisation differs from the reference's (its Precompiled approximation)
// is reported in *precompiled_differences instead of compared.
std::vector<std::string> Compare(const TextTokenizer& ours, const std::vector<std::string>& texts,
                                 const std::vector<ReferenceResult>& reference, bool precompiled_exception,
                                 std::vector<std::string>* precompiled_differences);

// JSON-escaped form of a string, for messages.
std::string Quote(const std::string& s);

// The shared tokenizers every differential suite runs over (directories in
// ../shared/tokenizers, and the tinystories656K checkpoint).
inline const std::vector<std::string> kSharedTokenizerNames = {
    "gpt2", "dolma2", "minimind", "tinystories656K", "llama2", "phi3", "nmt-unigram"};

// A gtest parameter name for one of them ("nmt-unigram" -> "nmt_unigram").
inline std::string SharedTokenizerTestName(const std::string& name) {
  std::string n = name;
  for (char& c : n) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

}  // namespace vc::testing
