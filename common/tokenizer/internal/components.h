// The stages of a Hugging Face tokenizer.json pipeline, each built from its
// JSON object: normaliser -> pre-tokenizer -> model -> post-processor on the
// way in, decoder on the way out. Every factory rejects an unknown "type"
// with InvalidArgument naming it; nothing falls back silently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace vc::tokenizer_internal {

using Json = nlohmann::json;

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  [[nodiscard]] virtual absl::Status Normalize(std::string* text) const = 0;
};

// A piece of text between pre-tokenization steps. `at_origin`: the piece
// starts at byte 0 of the caller's input (Metaspace's prepend_scheme "first").
struct PreToken {
  std::string text;
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokens (empty pieces dropped).
  [[nodiscard]] virtual absl::Status PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-token.
  [[nodiscard]] virtual absl::Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // The vocabulary string of `id`, nullptr when the model has none.
  virtual const std::string* IdToToken(int32_t id) const = 0;
  // Largest id + 1.
  virtual int32_t size() const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  [[nodiscard]] virtual absl::Status Process(std::vector<int32_t>* ids, bool add_special_tokens) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  [[nodiscard]] virtual absl::Status DecodeChain(std::vector<std::string>* tokens) const = 0;
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const Json& j);
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const Json& j);
absl::StatusOr<std::unique_ptr<Model>> MakeModel(const Json& j);
absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const Json& j);
absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const Json& j);

// Shared helpers.
// The byte-level alphabet: byte -> the code point GPT-2 maps it to, and back
// (-1 for code points outside the alphabet).
char32_t ByteToUnicode(uint8_t b);
int UnicodeToByte(char32_t cp);

// A "pattern" object: {"String": s} or {"Regex": r}.
class Pattern;
absl::StatusOr<std::shared_ptr<const Pattern>> MakePattern(const Json& j);
// [start, end) of every match, in order.
[[nodiscard]] absl::Status FindPatternMatches(const Pattern& p, std::string_view text,
                                              std::vector<std::pair<size_t, size_t>>* out);

// JSON field access with errors that name the field.
absl::StatusOr<std::string> GetString(const Json& j, const char* key, const std::string& where);
absl::StatusOr<std::string> GetStringOr(const Json& j, const char* key, std::string fallback,
                                        const std::string& where);
absl::StatusOr<bool> GetBoolOr(const Json& j, const char* key, bool fallback, const std::string& where);
absl::StatusOr<int64_t> GetIntOr(const Json& j, const char* key, int64_t fallback, const std::string& where);
// The "type" of a component object ("" when absent).
std::string TypeOf(const Json& j);

}  // namespace vc::tokenizer_internal
