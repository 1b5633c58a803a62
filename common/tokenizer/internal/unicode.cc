#include "common/tokenizer/internal/unicode.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "unicode/ubrk.h"
#include "unicode/uchar.h"
#include "unicode/unorm2.h"
#include "unicode/ustring.h"
#include "unicode/utext.h"

namespace vc::tokenizer_internal {

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  unsigned char c = p[0];
  if (c < 0x80) {
    *pos += 1;
    return c;
  }
  int n = Utf8Len(c);
  if (n == 1 || *pos + n > s.size()) {  // not reached on valid input
    *pos += 1;
    return 0xFFFD;
  }
  char32_t cp = n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  *pos += n;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string ToUtf8(char32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

namespace {

// Length of the well-formed UTF-8 sequence at s[i], or, when it is
// ill-formed, -(length of its maximal ill-formed prefix) (at least 1). Follows
// Table 3-7 of the Unicode standard (no overlongs, no surrogates, <= U+10FFFF).
int SequenceAt(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned char c = p[i];
  if (c < 0x80) return 1;
  int n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -k;
    unsigned char b = p[i + k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -k;
  }
  return n;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    int n = SequenceAt(s, i);
    if (n < 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    int n = SequenceAt(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += -n;
    }
  }
  return out;
}

bool IsWhiteSpace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool IsAlphanumeric(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  if (u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC)) return true;
  return IsNumeric(cp);
}

bool IsNumeric(char32_t cp) {
  int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

bool IsPunctuation(char32_t cp) {
  int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_CONNECTOR_PUNCTUATION || t == U_DASH_PUNCTUATION || t == U_START_PUNCTUATION ||
         t == U_END_PUNCTUATION || t == U_INITIAL_PUNCTUATION || t == U_FINAL_PUNCTUATION ||
         t == U_OTHER_PUNCTUATION;
}

std::string_view TrimWhiteSpace(std::string_view s, bool left, bool right) {
  if (left) {
    size_t pos = 0;
    while (pos < s.size()) {
      size_t next = pos;
      if (!IsWhiteSpace(NextCodePoint(s, &next))) break;
      pos = next;
    }
    s.remove_prefix(pos);
  }
  if (right) {
    while (!s.empty()) {
      size_t start = s.size() - 1;
      while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t p = start;
      if (!IsWhiteSpace(NextCodePoint(s, &p))) break;
      s.remove_suffix(s.size() - start);
    }
  }
  return s;
}

namespace {

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

absl::StatusOr<std::u16string> ToUtf16(std::string_view s) {
  std::u16string out(s.size(), u'\0');  // UTF-16 never has more units than UTF-8 bytes
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &len,
                s.data(), static_cast<int32_t>(s.size()), &err);
  if (U_FAILURE(err)) return absl::InvalidArgumentError(absl::StrCat("UTF-8 to UTF-16: ", u_errorName(err)));
  out.resize(len);
  return out;
}

absl::StatusOr<std::string> FromUtf16(const std::u16string& s) {
  std::string out(s.size() * 3, '\0');
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len,
              reinterpret_cast<const UChar*>(s.data()), static_cast<int32_t>(s.size()), &err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("UTF-16 to UTF-8: ", u_errorName(err)));
  out.resize(len);
  return out;
}

// Runs an ICU UTF-16 transform that reports the size it needs.
template <typename Fn>
absl::StatusOr<std::string> Transform16(std::string_view s, Fn fn, const char* what) {
  auto in = ToUtf16(s);
  if (!in.ok()) return in.status();
  std::u16string out(in->size() * 2 + 16, u'\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    UErrorCode err = U_ZERO_ERROR;
    int32_t len = fn(reinterpret_cast<const UChar*>(in->data()), static_cast<int32_t>(in->size()),
                     reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &err);
    if (err == U_BUFFER_OVERFLOW_ERROR && attempt == 0) {
      out.assign(len, u'\0');
      continue;
    }
    if (U_FAILURE(err)) return absl::InternalError(absl::StrCat(what, ": ", u_errorName(err)));
    out.resize(len);
    return FromUtf16(out);
  }
  return absl::InternalError(absl::StrCat(what, ": output size changed between calls"));
}

}  // namespace

absl::StatusOr<std::string> Normalize(std::string_view s, NormalizationForm form) {
  if (IsAscii(s)) return std::string(s);  // ASCII is invariant under all four forms
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case NormalizationForm::kNFC: n = unorm2_getNFCInstance(&err); break;
    case NormalizationForm::kNFD: n = unorm2_getNFDInstance(&err); break;
    case NormalizationForm::kNFKC: n = unorm2_getNFKCInstance(&err); break;
    case NormalizationForm::kNFKD: n = unorm2_getNFKDInstance(&err); break;
  }
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU normalizer: ", u_errorName(err)));
  return Transform16(
      s,
      [n](const UChar* src, int32_t src_len, UChar* dst, int32_t cap, UErrorCode* e) {
        return unorm2_normalize(n, src, src_len, dst, cap, e);
      },
      "ICU normalize");
}

absl::StatusOr<std::string> Lowercase(std::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
  }
  return Transform16(
      s,
      [](const UChar* src, int32_t src_len, UChar* dst, int32_t cap, UErrorCode* e) {
        return u_strToLower(dst, cap, src, src_len, "", e);
      },
      "ICU lowercase");
}

absl::StatusOr<std::vector<size_t>> GraphemeBoundaries(std::string_view s) {
  std::vector<size_t> out;
  if (s.empty()) return out;
  UErrorCode err = U_ZERO_ERROR;
  UText* text = utext_openUTF8(nullptr, s.data(), static_cast<int64_t>(s.size()), &err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU utext: ", u_errorName(err)));
  std::unique_ptr<UText, decltype(&utext_close)> text_owner(text, &utext_close);
  UBreakIterator* it = ubrk_open(UBRK_CHARACTER, "", nullptr, 0, &err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU break iterator: ", u_errorName(err)));
  std::unique_ptr<UBreakIterator, decltype(&ubrk_close)> it_owner(it, &ubrk_close);
  ubrk_setUText(it, text, &err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU break iterator: ", u_errorName(err)));
  for (int32_t b = ubrk_next(it); b != UBRK_DONE; b = ubrk_next(it)) out.push_back(static_cast<size_t>(b));
  return out;
}

}  // namespace vc::tokenizer_internal
