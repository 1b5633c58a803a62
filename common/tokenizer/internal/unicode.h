// UTF-8 and Unicode helpers for the tokenizer.json implementation: decoding
// and encoding code points, lossy UTF-8 repair (as Rust's from_utf8_lossy and
// the WHATWG decoder do), the Unicode properties the pipeline tests (ICU), and
// the four normalisation forms (ICU).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace vc::tokenizer_internal {

// Length in bytes of the UTF-8 sequence whose lead byte is `lead` (1 for a
// stray continuation byte, so loops always advance).
inline int Utf8Len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Decodes the code point at s[*pos] (valid UTF-8 assumed) and advances *pos.
char32_t NextCodePoint(std::string_view s, size_t* pos);
// Appends the UTF-8 encoding of `cp`.
void AppendUtf8(char32_t cp, std::string* out);
std::string ToUtf8(char32_t cp);

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t FindInvalidUtf8(std::string_view s);
// `bytes` with every maximal ill-formed subsequence replaced by U+FFFD (the
// Unicode "best practice" both reference implementations follow).
std::string Utf8Lossy(std::string_view bytes);

// Unicode properties (ICU).
bool IsWhiteSpace(char32_t cp);  // White_Space (Rust's char::is_whitespace)
bool IsAlphanumeric(char32_t cp);  // Rust's char::is_alphanumeric: Alphabetic or N*
bool IsPunctuation(char32_t cp);   // general category P*
bool IsNumeric(char32_t cp);       // N* (Rust's char::is_numeric)

// Strips White_Space from one or both ends.
std::string_view TrimWhiteSpace(std::string_view s, bool left, bool right);

enum class NormalizationForm { kNFC, kNFD, kNFKC, kNFKD };
absl::StatusOr<std::string> Normalize(std::string_view s, NormalizationForm form);
// Full Unicode lowercase mapping (root locale), as Rust's str::to_lowercase.
absl::StatusOr<std::string> Lowercase(std::string_view s);

// Byte offsets where extended grapheme clusters end (the last is s.size()).
absl::StatusOr<std::vector<size_t>> GraphemeBoundaries(std::string_view s);

}  // namespace vc::tokenizer_internal
