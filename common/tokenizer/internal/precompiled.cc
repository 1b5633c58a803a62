#include "common/tokenizer/internal/precompiled.h"

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/internal/unicode.h"

namespace vc::tokenizer_internal {
namespace {

// darts-clone unit layout.
bool HasLeaf(uint32_t unit) { return ((unit >> 8) & 1) == 1; }
uint32_t Value(uint32_t unit) { return unit & ((1U << 31) - 1); }
uint32_t Label(uint32_t unit) { return unit & ((1U << 31) | 0xFF); }
uint32_t Offset(uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); }

}  // namespace

absl::StatusOr<std::unique_ptr<PrecompiledCharsmap>> PrecompiledCharsmap::FromBase64(std::string_view blob) {
  std::string bytes;
  if (!absl::Base64Unescape(absl::string_view(blob.data(), blob.size()), &bytes)) {
    return absl::InvalidArgumentError("Precompiled: precompiled_charsmap is not valid base64");
  }
  return FromBytes(std::move(bytes));
}

absl::StatusOr<std::unique_ptr<PrecompiledCharsmap>> PrecompiledCharsmap::FromBytes(std::string bytes) {
  if (bytes.size() < 4) return absl::InvalidArgumentError("Precompiled: charsmap shorter than its header");
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, bytes.data(), 4);  // little-endian, as the format (x86 host)
  if (trie_bytes % 4 != 0 || trie_bytes > bytes.size() - 4 || trie_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Precompiled: trie size ", trie_bytes, " does not fit a ", bytes.size(), "-byte charsmap"));
  }
  auto map = std::unique_ptr<PrecompiledCharsmap>(new PrecompiledCharsmap());
  map->units_.resize(trie_bytes / 4);
  std::memcpy(map->units_.data(), bytes.data() + 4, trie_bytes);
  map->normalized_ = bytes.substr(4 + trie_bytes);
  return map;
}

std::optional<std::string_view> PrecompiledCharsmap::Transform(std::string_view chunk) const {
  const size_t n = units_.size();
  size_t node = 0;
  uint32_t unit = units_[0];
  node ^= Offset(unit);
  for (unsigned char c : chunk) {
    if (c == 0) break;
    node ^= c;
    if (node >= n) return std::nullopt;
    unit = units_[node];
    if (Label(unit) != c) return std::nullopt;
    node ^= Offset(unit);
    if (node >= n) return std::nullopt;
    if (HasLeaf(unit)) {
      // The first (shortest) key that matches is the one used.
      uint32_t value = Value(units_[node]);
      if (value >= normalized_.size()) return std::nullopt;
      size_t end = normalized_.find('\0', value);
      if (end == std::string::npos) end = normalized_.size();
      return std::string_view(normalized_).substr(value, end - value);
    }
  }
  return std::nullopt;
}

absl::Status PrecompiledCharsmap::Normalize(std::string* text) const {
  VC_ASSIGN_OR_RETURN(std::vector<size_t> bounds, GraphemeBoundaries(*text));
  std::string out;
  out.reserve(text->size());
  bool modified = false;
  size_t start = 0;
  for (size_t end : bounds) {
    std::string_view g = std::string_view(*text).substr(start, end - start);
    start = end;
    if (g.size() < 6) {
      if (auto norm = Transform(g)) {
        out += *norm;
        modified = true;
        continue;
      }
    }
    size_t pos = 0;
    while (pos < g.size()) {
      size_t cs = pos;
      NextCodePoint(g, &pos);
      std::string_view ch = g.substr(cs, pos - cs);
      if (auto norm = Transform(ch)) {
        out += *norm;
        modified = true;
      } else {
        out += ch;
      }
    }
  }
  if (modified) *text = std::move(out);
  return absl::OkStatus();
}

}  // namespace vc::tokenizer_internal
