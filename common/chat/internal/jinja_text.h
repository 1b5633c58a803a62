// Private to common/chat: Python's str operations on UTF-8 text, as the
// templates' string methods and filters need them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vc::jinja {

// Bytes of the Python whitespace character (str.isspace) at the start of
// `s`, or 0: ASCII \t\n\v\f\r, \x1c-\x1f and space, and the Unicode ones
// (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000).
size_t PySpaceLength(std::string_view s);
// Same, for the character that ends `s`.
size_t PySpaceLengthBack(std::string_view s);

std::string_view LStripPy(std::string_view s);
std::string_view RStripPy(std::string_view s);
// str.strip(chars) with explicit characters (code points of `chars`).
std::string_view StripChars(std::string_view s, std::string_view chars, bool left, bool right);

// str.split() (whitespace runs, no empty parts) and str.split(sep).
std::vector<std::string> SplitWhitespace(std::string_view s, long max_split);
std::vector<std::string> SplitSep(std::string_view s, std::string_view sep, long max_split);

// ASCII case mapping; other characters are unchanged. (Python maps all of
// Unicode; chat templates apply these to role names and keywords.)
std::string AsciiUpper(std::string_view s);
std::string AsciiLower(std::string_view s);
// str.capitalize() and str.title(), on ASCII letters.
std::string Capitalize(std::string_view s);
std::string Title(std::string_view s);

// str.replace(old, new, count); count < 0 replaces all.
std::string Replace(std::string_view s, std::string_view from, std::string_view to, long count);

}  // namespace vc::jinja
