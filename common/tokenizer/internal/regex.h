// Regular expressions for tokenizer.json patterns. The reference
// implementation compiles them with Oniguruma (Ruby syntax); we compile them
// with PCRE2 (UTF + UCP, JIT) after rewriting the few escapes whose meaning
// differs between the two (\s, \h, \w, (?m)), so that a pattern means the
// same thing here as there.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace vc::tokenizer_internal {

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern. InvalidArgument with PCRE2's
  // message and offset when it does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view oniguruma_pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [start, end) of the successive non-overlapping matches in
  // `text` (valid UTF-8), leftmost first; an empty match right after the
  // previous match is skipped and the search moves on one character, as the
  // reference's find_iter does. Safe to call from many threads.
  [[nodiscard]] absl::Status FindAll(std::string_view text,
                                     std::vector<std::pair<size_t, size_t>>* matches) const;

  const std::string& pcre_pattern() const { return translated_; }

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  std::string translated_;
};

// The Oniguruma -> PCRE2 rewrite, exposed for tests.
std::string TranslateOnigurumaPattern(std::string_view pattern);

}  // namespace vc::tokenizer_internal
