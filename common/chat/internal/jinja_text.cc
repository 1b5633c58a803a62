#include "common/chat/internal/jinja_text.h"

#include <cstdint>

#include "common/chat/internal/jinja_value.h"

namespace vc::jinja {
namespace {

bool IsPySpaceCp(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f)) return true;
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

uint32_t Decode(std::string_view ch) {
  const auto* b = reinterpret_cast<const unsigned char*>(ch.data());
  switch (ch.size()) {
    case 1:
      return b[0];
    case 2:
      return (uint32_t{b[0]} & 0x1f) << 6 | (b[1] & 0x3f);
    case 3:
      return (uint32_t{b[0]} & 0x0f) << 12 | (uint32_t{b[1]} & 0x3f) << 6 | (b[2] & 0x3f);
    default:
      return (uint32_t{b[0]} & 0x07) << 18 | (uint32_t{b[1]} & 0x3f) << 12 |
             (uint32_t{b[2]} & 0x3f) << 6 | (b[3] & 0x3f);
  }
}

// Length of a well-formed UTF-8 character at the start of s (1 for a stray byte).
size_t CharLen(std::string_view s) {
  const unsigned char c = static_cast<unsigned char>(s[0]);
  size_t n = c < 0x80 ? 1 : c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
  if (n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[k]) & 0xc0) != 0x80) return 1;
  }
  return n;
}

bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

size_t PySpaceLength(std::string_view s) {
  if (s.empty()) return 0;
  const size_t n = CharLen(s);
  return IsPySpaceCp(Decode(s.substr(0, n))) ? n : 0;
}

size_t PySpaceLengthBack(std::string_view s) {
  if (s.empty()) return 0;
  size_t start = s.size() - 1;
  while (start > 0 && s.size() - start < 4 &&
         (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) {
    --start;
  }
  const std::string_view tail = s.substr(start);
  if (CharLen(tail) != tail.size()) {
    return IsPySpaceCp(static_cast<unsigned char>(s.back())) ? 1 : 0;
  }
  return IsPySpaceCp(Decode(tail)) ? tail.size() : 0;
}

std::string_view LStripPy(std::string_view s) {
  while (size_t n = PySpaceLength(s)) s.remove_prefix(n);
  return s;
}

std::string_view RStripPy(std::string_view s) {
  while (size_t n = PySpaceLengthBack(s)) s.remove_suffix(n);
  return s;
}

std::string_view StripChars(std::string_view s, std::string_view chars, bool left, bool right) {
  const std::vector<std::string_view> set = CodePoints(chars);
  auto in_set = [&](std::string_view ch) {
    for (std::string_view c : set) {
      if (c == ch) return true;
    }
    return false;
  };
  std::vector<std::string_view> cps = CodePoints(s);
  size_t lo = 0, hi = cps.size();
  if (left) {
    while (lo < hi && in_set(cps[lo])) ++lo;
  }
  if (right) {
    while (hi > lo && in_set(cps[hi - 1])) --hi;
  }
  if (lo == hi) return s.substr(0, 0);
  const size_t begin = static_cast<size_t>(cps[lo].data() - s.data());
  const size_t end = static_cast<size_t>(cps[hi - 1].data() - s.data()) + cps[hi - 1].size();
  return s.substr(begin, end - begin);
}

std::vector<std::string> SplitWhitespace(std::string_view s, long max_split) {
  std::vector<std::string> out;
  s = LStripPy(s);
  while (!s.empty()) {
    if (max_split >= 0 && static_cast<long>(out.size()) == max_split) {
      out.emplace_back(RStripPy(s));
      break;
    }
    size_t k = 0;
    while (k < s.size() && PySpaceLength(s.substr(k)) == 0) k += CharLen(s.substr(k));
    out.emplace_back(s.substr(0, k));
    s = LStripPy(s.substr(k));
  }
  return out;
}

std::vector<std::string> SplitSep(std::string_view s, std::string_view sep, long max_split) {
  std::vector<std::string> out;
  while (true) {
    const size_t k = (max_split >= 0 && static_cast<long>(out.size()) == max_split)
                         ? std::string_view::npos
                         : s.find(sep);
    if (k == std::string_view::npos) {
      out.emplace_back(s);
      return out;
    }
    out.emplace_back(s.substr(0, k));
    s.remove_prefix(k + sep.size());
  }
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

std::string Title(std::string_view s) {
  std::string out(s);
  bool prev_letter = false;
  for (char& c : out) {
    if (IsAsciiAlpha(c)) {
      if (prev_letter) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      } else if (c >= 'a' && c <= 'z') {
        c = static_cast<char>(c - 'a' + 'A');
      }
      prev_letter = true;
    } else {
      prev_letter = false;
    }
  }
  return out;
}

std::string Replace(std::string_view s, std::string_view from, std::string_view to, long count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    const std::vector<std::string_view> cps = CodePoints(s);
    long n = 0;
    for (std::string_view cp : cps) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  long n = 0;
  size_t pos = 0;
  while (count < 0 || n < count) {
    const size_t k = s.find(from, pos);
    if (k == std::string_view::npos) break;
    out += s.substr(pos, k - pos);
    out += to;
    pos = k + from.size();
    ++n;
  }
  out += s.substr(pos);
  return out;
}

}  // namespace vc::jinja
