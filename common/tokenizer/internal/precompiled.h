// sentencepiece's precompiled normalisation charsmap, as tokenizer.json's
// "Precompiled" normaliser carries it: base64 of [u32 trie size in bytes]
// [darts-clone double-array trie: u32 units] [NUL-terminated replacement
// strings]. A trie value is the offset of a replacement string.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::tokenizer_internal {

class PrecompiledCharsmap {
 public:
  // InvalidArgument when the blob is not base64 or its sizes do not add up.
  static absl::StatusOr<std::unique_ptr<PrecompiledCharsmap>> FromBase64(std::string_view blob);
  static absl::StatusOr<std::unique_ptr<PrecompiledCharsmap>> FromBytes(std::string bytes);

  // The reference's normalisation: per extended grapheme cluster shorter than
  // 6 bytes, the replacement of its first trie match if any; otherwise per
  // character, its replacement or itself.
  [[nodiscard]] absl::Status Normalize(std::string* text) const;

  // The replacement for the shortest trie key that prefixes `chunk`.
  std::optional<std::string_view> Transform(std::string_view chunk) const;

 private:
  std::vector<uint32_t> units_;
  std::string normalized_;
};

}  // namespace vc::tokenizer_internal
