// Normalisers, pre-tokenizers, post-processors and decoders of tokenizer.json
// (the models live in bpe_model.cc and unigram_model.cc). Each follows the
// reference implementation's semantics for the same JSON.
#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/internal/components.h"
#include "common/tokenizer/internal/precompiled.h"
#include "common/tokenizer/internal/regex.h"
#include "common/tokenizer/internal/unicode.h"

namespace vc::tokenizer_internal {

// ---------------------------------------------------------------- helpers

std::string TypeOf(const Json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

absl::StatusOr<std::string> GetString(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::string> GetStringOr(const Json& j, const char* key, std::string fallback,
                                        const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be a string"));
  return it->get<std::string>();
}

absl::StatusOr<bool> GetBoolOr(const Json& j, const char* key, bool fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be a boolean"));
  return it->get<bool>();
}

absl::StatusOr<int64_t> GetIntOr(const Json& j, const char* key, int64_t fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be an integer"));
  }
  return it->get<int64_t>();
}

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_cp{};
  std::array<int, 512> from_cp{};  // every alphabet code point is < 0x144
  ByteTables() {
    from_cp.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_cp[b] = cp;
      from_cp[cp] = b;
    }
  }
};

const ByteTables& Bytes() {
  static const ByteTables* t = new ByteTables();
  return *t;
}

}  // namespace

char32_t ByteToUnicode(uint8_t b) { return Bytes().to_cp[b]; }
int UnicodeToByte(char32_t cp) { return cp < 512 ? Bytes().from_cp[cp] : -1; }

class Pattern {
 public:
  std::string literal;              // used when regex is null
  std::unique_ptr<Regex> regex;
};

absl::StatusOr<std::shared_ptr<const Pattern>> MakePattern(const Json& j) {
  auto p = std::make_shared<Pattern>();
  if (!j.is_object()) return absl::InvalidArgumentError("pattern must be an object {\"String\": ...} or {\"Regex\": ...}");
  if (auto it = j.find("String"); it != j.end() && it->is_string()) {
    p->literal = it->get<std::string>();
    return p;
  }
  if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
    VC_ASSIGN_OR_RETURN(p->regex, Regex::Compile(it->get<std::string>()));
    return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported pattern ", j.dump()));
}

absl::Status FindPatternMatches(const Pattern& p, std::string_view text,
                                std::vector<std::pair<size_t, size_t>>* out) {
  if (p.regex) return p.regex->FindAll(text, out);
  out->clear();
  if (p.literal.empty()) return absl::OkStatus();  // an empty string matches nothing
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(p.literal, pos);
    if (hit == std::string_view::npos) break;
    out->emplace_back(hit, hit + p.literal.size());
    pos = hit + p.literal.size();
  }
  return absl::OkStatus();
}

namespace {

// Replaces every match of `p` in `text` by `content`.
absl::Status ReplaceAll(const Pattern& p, const std::string& content, std::string* text) {
  std::vector<std::pair<size_t, size_t>> m;
  VC_RETURN_IF_ERROR(FindPatternMatches(p, *text, &m));
  if (m.empty()) return absl::OkStatus();
  std::string out;
  out.reserve(text->size());
  size_t prev = 0;
  for (auto [s, e] : m) {
    out.append(*text, prev, s - prev);
    out += content;
    prev = e;
  }
  out.append(*text, prev);
  *text = std::move(out);
  return absl::OkStatus();
}

// ------------------------------------------------------------ normalizers

class SequenceNormalizer : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> parts;
  absl::Status Normalize(std::string* text) const override {
    for (const auto& p : parts) VC_RETURN_IF_ERROR(p->Normalize(text));
    return absl::OkStatus();
  }
};

class PrependNormalizer : public Normalizer {
 public:
  std::string prepend;
  absl::Status Normalize(std::string* text) const override {
    if (!text->empty()) *text = prepend + *text;
    return absl::OkStatus();
  }
};

class ReplaceNormalizer : public Normalizer {
 public:
  std::shared_ptr<const Pattern> pattern;
  std::string content;
  absl::Status Normalize(std::string* text) const override { return ReplaceAll(*pattern, content, text); }
};

class UnicodeNormalizer : public Normalizer {
 public:
  NormalizationForm form = NormalizationForm::kNFC;
  absl::Status Normalize(std::string* text) const override {
    VC_ASSIGN_OR_RETURN(*text, tokenizer_internal::Normalize(*text, form));
    return absl::OkStatus();
  }
};

class LowercaseNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    VC_ASSIGN_OR_RETURN(*text, Lowercase(*text));
    return absl::OkStatus();
  }
};

class StripNormalizer : public Normalizer {
 public:
  bool left = false, right = false;
  absl::Status Normalize(std::string* text) const override {
    std::string_view v = TrimWhiteSpace(*text, left, right);
    if (v.size() != text->size()) *text = std::string(v);
    return absl::OkStatus();
  }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  // Removes nonspacing marks (Mn), as the reference does (it expects NFD first).
  absl::Status Normalize(std::string* text) const override;
};

class PrecompiledNormalizer : public Normalizer {
 public:
  std::unique_ptr<PrecompiledCharsmap> charsmap;
  absl::Status Normalize(std::string* text) const override { return charsmap->Normalize(text); }
};

}  // namespace
}  // namespace vc::tokenizer_internal

#include "unicode/uchar.h"

namespace vc::tokenizer_internal {
namespace {

absl::Status StripAccentsNormalizer::Normalize(std::string* text) const {
  std::string out;
  out.reserve(text->size());
  size_t pos = 0;
  while (pos < text->size()) {
    size_t start = pos;
    char32_t cp = NextCodePoint(*text, &pos);
    if (cp >= 0x80 && u_charType(static_cast<UChar32>(cp)) == U_NON_SPACING_MARK) continue;
    out.append(*text, start, pos - start);
  }
  *text = std::move(out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const Json& j) {
  std::string type = TypeOf(j);
  std::string where = absl::StrCat("normalizer ", type);
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return absl::InvalidArgumentError(where + ": \"normalizers\" must be a list");
    for (const auto& sub : *it) {
      VC_ASSIGN_OR_RETURN(auto p, MakeNormalizer(sub));
      n->parts.push_back(std::move(p));
    }
    return n;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    VC_ASSIGN_OR_RETURN(n->prepend, GetString(j, "prepend", where));
    return n;
  }
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    auto it = j.find("pattern");
    if (it == j.end()) return absl::InvalidArgumentError(where + ": missing \"pattern\"");
    VC_ASSIGN_OR_RETURN(n->pattern, MakePattern(*it));
    VC_ASSIGN_OR_RETURN(n->content, GetString(j, "content", where));
    return n;
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    auto n = std::make_unique<UnicodeNormalizer>();
    n->form = type == "NFC"    ? NormalizationForm::kNFC
              : type == "NFD"  ? NormalizationForm::kNFD
              : type == "NFKC" ? NormalizationForm::kNFKC
                               : NormalizationForm::kNFKD;
    return n;
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    VC_ASSIGN_OR_RETURN(n->left, GetBoolOr(j, "strip_left", false, where));
    VC_ASSIGN_OR_RETURN(n->right, GetBoolOr(j, "strip_right", false, where));
    return n;
  }
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Precompiled") {
    auto n = std::make_unique<PrecompiledNormalizer>();
    VC_ASSIGN_OR_RETURN(std::string blob, GetString(j, "precompiled_charsmap", where));
    VC_ASSIGN_OR_RETURN(n->charsmap, PrecompiledCharsmap::FromBase64(blob));
    return n;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported normalizer type '", type.empty() ? j.dump().substr(0, 80) : type, "'"));
}

// --------------------------------------------------------- pre-tokenizers

namespace {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> ParseBehavior(const Json& j, const std::string& where) {
  VC_ASSIGN_OR_RETURN(std::string b, GetString(j, "behavior", where));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(where, ": unsupported split behavior '", b, "'"));
}

struct Span {
  size_t start, end;
  bool is_match;
};

// Covers `len` bytes with the match spans and the gaps between them.
std::vector<Span> CoverWithMatches(size_t len, const std::vector<std::pair<size_t, size_t>>& matches, bool invert) {
  std::vector<Span> out;
  if (len == 0) return {{0, 0, false}};
  size_t prev = 0;
  for (auto [s, e] : matches) {
    if (prev != s) out.push_back({prev, s, invert});
    out.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != len) out.push_back({prev, len, invert});
  return out;
}

// The reference's NormalizedString::split: which spans to keep, merged how.
std::vector<std::pair<size_t, size_t>> ApplyBehavior(const std::vector<Span>& spans, SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& s : spans) out.emplace_back(s.start, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.is_match) out.emplace_back(s.start, s.end);
      }
      break;
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (const auto& s : spans) {
        if (s.is_match == prev_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.start, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !prev_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.start, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !prev_match && !out.empty()) {
          out.back().first = it->start;
        } else {
          out.emplace_back(it->start, it->end);
        }
        prev_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

// Splits every piece at the given spans; empty results are dropped.
template <typename MatchFn>
absl::Status SplitPieces(std::vector<PreToken>* pieces, SplitBehavior behavior, bool invert, MatchFn find) {
  std::vector<PreToken> out;
  out.reserve(pieces->size() * 2);
  std::vector<std::pair<size_t, size_t>> matches;
  for (auto& piece : *pieces) {
    VC_RETURN_IF_ERROR(find(piece.text, &matches));
    auto spans = CoverWithMatches(piece.text.size(), matches, invert);
    for (auto [s, e] : ApplyBehavior(spans, behavior)) {
      if (s == e) continue;
      out.push_back({piece.text.substr(s, e - s), piece.at_origin && s == 0});
    }
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

// Each character for which `pred` holds is a match of its own.
template <typename Pred>
auto CharMatcher(Pred pred) {
  return [pred](const std::string& text, std::vector<std::pair<size_t, size_t>>* m) {
    m->clear();
    size_t pos = 0;
    while (pos < text.size()) {
      size_t start = pos;
      char32_t cp = NextCodePoint(text, &pos);
      if (pred(cp)) m->emplace_back(start, pos);
    }
    return absl::OkStatus();
  };
}

// Runs of characters for which `pred` holds are one match each.
template <typename Pred>
auto RunMatcher(Pred pred) {
  return [pred](const std::string& text, std::vector<std::pair<size_t, size_t>>* m) {
    m->clear();
    size_t pos = 0;
    size_t run = std::string::npos;
    while (pos < text.size()) {
      size_t start = pos;
      char32_t cp = NextCodePoint(text, &pos);
      if (pred(cp)) {
        if (run == std::string::npos) run = start;
      } else if (run != std::string::npos) {
        m->emplace_back(run, start);
        run = std::string::npos;
      }
    }
    if (run != std::string::npos) m->emplace_back(run, text.size());
    return absl::OkStatus();
  };
}

constexpr std::string_view kByteLevelPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  bool add_prefix_space = false;
  bool use_regex = true;
  std::unique_ptr<Regex> regex;

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space) {
      for (auto& p : *pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text = " " + p.text;
      }
    }
    if (use_regex) {
      VC_RETURN_IF_ERROR(SplitPieces(pieces, SplitBehavior::kIsolated, false,
                                     [this](const std::string& t, std::vector<std::pair<size_t, size_t>>* m) {
                                       return regex->FindAll(t, m);
                                     }));
    }
    // Every byte becomes its alphabet character.
    static const std::array<std::string, 256>* kMapped = [] {
      auto* t = new std::array<std::string, 256>();
      for (int b = 0; b < 256; ++b) (*t)[b] = ToUtf8(ByteToUnicode(static_cast<uint8_t>(b)));
      return t;
    }();
    std::string mapped;
    for (auto& p : *pieces) {
      mapped.clear();
      mapped.reserve(p.text.size() * 2);
      for (unsigned char b : p.text) mapped += (*kMapped)[b];
      p.text.swap(mapped);
    }
    return absl::OkStatus();
  }
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  std::shared_ptr<const Pattern> pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitPieces(pieces, behavior, invert,
                       [this](const std::string& t, std::vector<std::pair<size_t, size_t>>* m) {
                         return FindPatternMatches(*pattern, t, m);
                       });
  }
};

enum class PrependScheme { kAlways, kFirst, kNever };

absl::StatusOr<PrependScheme> ParsePrependScheme(const Json& j, const std::string& where) {
  auto it = j.find("prepend_scheme");
  if (it == j.end() || it->is_null()) {
    // Older files carry add_prefix_space instead.
    VC_ASSIGN_OR_RETURN(bool add, GetBoolOr(j, "add_prefix_space", true, where));
    return add ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  if (!it->is_string()) return absl::InvalidArgumentError(absl::StrCat(where, ": \"prepend_scheme\" must be a string"));
  std::string s = it->get<std::string>();
  if (s == "always") return PrependScheme::kAlways;
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  return absl::InvalidArgumentError(absl::StrCat(where, ": unsupported prepend_scheme '", s, "'"));
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  std::string replacement;  // one character
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (auto& p : *pieces) {
      std::string out;
      out.reserve(p.text.size() + replacement.size());
      for (char c : p.text) {
        if (c == ' ') {
          out += replacement;
        } else {
          out.push_back(c);
        }
      }
      bool starts = out.compare(0, replacement.size(), replacement) == 0;
      if (!starts && (scheme == PrependScheme::kAlways || (scheme == PrependScheme::kFirst && p.at_origin))) {
        out = replacement + out;
      }
      p.text = std::move(out);
    }
    if (!split) return absl::OkStatus();
    return SplitPieces(pieces, SplitBehavior::kMergedWithNext, false,
                       [this](const std::string& t, std::vector<std::pair<size_t, size_t>>* m) {
                         m->clear();
                         size_t pos = 0;
                         while ((pos = t.find(replacement, pos)) != std::string::npos) {
                           m->emplace_back(pos, pos + replacement.size());
                           pos += replacement.size();
                         }
                         return absl::OkStatus();
                       });
  }
};

bool IsWordChar(char32_t cp) {
  // The reference's \w (Rust regex, Unicode): Alphabetic, M, Nd, Pc, Join_Control.
  if (cp < 0x80) return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  int8_t t = u_charType(static_cast<UChar32>(cp));
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC) || t == U_NON_SPACING_MARK ||
         t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK || t == U_DECIMAL_DIGIT_NUMBER ||
         t == U_CONNECTOR_PUNCTUATION || u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_JOIN_CONTROL);
}

// Whitespace: runs of \w, runs of [^\w\s], whitespace removed.
class WhitespacePreTokenizer : public PreTokenizer {
 public:
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    for (auto& p : *pieces) {
      size_t pos = 0;
      size_t run_start = 0;
      int run_kind = -1;  // 0 word, 1 other
      auto flush = [&](size_t end) {
        if (run_kind >= 0 && end > run_start) {
          out.push_back({p.text.substr(run_start, end - run_start), p.at_origin && run_start == 0});
        }
        run_kind = -1;
      };
      while (pos < p.text.size()) {
        size_t start = pos;
        char32_t cp = NextCodePoint(p.text, &pos);
        int kind = IsWhiteSpace(cp) ? -1 : (IsWordChar(cp) ? 0 : 1);
        if (kind != run_kind) {
          flush(start);
          run_kind = kind;
          run_start = start;
        }
      }
      flush(p.text.size());
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }
};

class WhitespaceSplitPreTokenizer : public PreTokenizer {
 public:
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitPieces(pieces, SplitBehavior::kRemoved, false, RunMatcher([](char32_t cp) { return IsWhiteSpace(cp); }));
  }
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  bool individual = false;
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    auto numeric = [](char32_t cp) { return cp < 0x80 ? (cp >= '0' && cp <= '9') : IsNumeric(cp); };
    if (individual) return SplitPieces(pieces, SplitBehavior::kIsolated, false, CharMatcher(numeric));
    return SplitPieces(pieces, SplitBehavior::kContiguous, false, CharMatcher(numeric));
  }
};

bool IsBertPunctuation(char32_t cp) {
  return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126) ||
         IsPunctuation(cp);
}

class PunctuationPreTokenizer : public PreTokenizer {
 public:
  SplitBehavior behavior = SplitBehavior::kIsolated;
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitPieces(pieces, behavior, false, CharMatcher(IsBertPunctuation));
  }
};

class BertPreTokenizer : public PreTokenizer {
 public:
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    VC_RETURN_IF_ERROR(
        SplitPieces(pieces, SplitBehavior::kRemoved, false, CharMatcher([](char32_t cp) { return IsWhiteSpace(cp); })));
    return SplitPieces(pieces, SplitBehavior::kIsolated, false, CharMatcher(IsBertPunctuation));
  }
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& p : parts) VC_RETURN_IF_ERROR(p->PreTokenize(pieces));
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const Json& j) {
  std::string type = TypeOf(j);
  std::string where = absl::StrCat("pre_tokenizer ", type);
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    VC_ASSIGN_OR_RETURN(p->add_prefix_space, GetBoolOr(j, "add_prefix_space", true, where));
    VC_ASSIGN_OR_RETURN(p->use_regex, GetBoolOr(j, "use_regex", true, where));
    if (p->use_regex) {
    VC_ASSIGN_OR_RETURN(p->regex, Regex::Compile(kByteLevelPattern));
  }
    return p;
  }
  if (type == "Split") {
    auto p = std::make_unique<SplitPreTokenizer>();
    auto it = j.find("pattern");
    if (it == j.end()) return absl::InvalidArgumentError(where + ": missing \"pattern\"");
    VC_ASSIGN_OR_RETURN(p->pattern, MakePattern(*it));
    VC_ASSIGN_OR_RETURN(p->behavior, ParseBehavior(j, where));
    VC_ASSIGN_OR_RETURN(p->invert, GetBoolOr(j, "invert", false, where));
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    VC_ASSIGN_OR_RETURN(p->replacement, GetString(j, "replacement", where));
    size_t pos = 0;
    if (p->replacement.empty() || (NextCodePoint(p->replacement, &pos), pos != p->replacement.size())) {
      return absl::InvalidArgumentError(where + ": \"replacement\" must be one character");
    }
    VC_ASSIGN_OR_RETURN(p->scheme, ParsePrependScheme(j, where));
    VC_ASSIGN_OR_RETURN(p->split, GetBoolOr(j, "split", true, where));
    return p;
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    VC_ASSIGN_OR_RETURN(p->individual, GetBoolOr(j, "individual_digits", false, where));
    return p;
  }
  if (type == "Punctuation") {
    auto p = std::make_unique<PunctuationPreTokenizer>();
    if (j.contains("behavior")) {
    VC_ASSIGN_OR_RETURN(p->behavior, ParseBehavior(j, where));
  }
    return p;
  }
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "Sequence") {
    auto p = std::make_unique<SequencePreTokenizer>();
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return absl::InvalidArgumentError(where + ": \"pretokenizers\" must be a list");
    for (const auto& sub : *it) {
      VC_ASSIGN_OR_RETURN(auto part, MakePreTokenizer(sub));
      p->parts.push_back(std::move(part));
    }
    return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported pre_tokenizer type '", type.empty() ? j.dump().substr(0, 80) : type, "'"));
}

// -------------------------------------------------------- post-processors

namespace {

class TemplateProcessor : public PostProcessor {
 public:
  // The "single" template: a special token's ids, or the sequence (empty).
  std::vector<std::optional<std::vector<int32_t>>> single;
  absl::Status Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return absl::OkStatus();
    std::vector<int32_t> out;
    out.reserve(ids->size() + 4);
    for (const auto& item : single) {
      if (item) {
        out.insert(out.end(), item->begin(), item->end());
      } else {
        out.insert(out.end(), ids->begin(), ids->end());
      }
    }
    *ids = std::move(out);
    return absl::OkStatus();
  }
};

class NoopProcessor : public PostProcessor {
 public:
  absl::Status Process(std::vector<int32_t>*, bool) const override { return absl::OkStatus(); }
};

// Bert: [CLS] A [SEP]; Roberta: <s> A </s> (same shape for a single sequence).
class ClsSepProcessor : public PostProcessor {
 public:
  int32_t cls = 0, sep = 0;
  absl::Status Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return absl::OkStatus();
    ids->insert(ids->begin(), cls);
    ids->push_back(sep);
    return absl::OkStatus();
  }
};

class SequenceProcessor : public PostProcessor {
 public:
  std::vector<std::unique_ptr<PostProcessor>> parts;
  absl::Status Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    for (const auto& p : parts) VC_RETURN_IF_ERROR(p->Process(ids, add_special_tokens));
    return absl::OkStatus();
  }
};

absl::StatusOr<int32_t> TokenPairId(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be [token, id]"));
  }
  return (*it)[1].get<int32_t>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const Json& j) {
  std::string type = TypeOf(j);
  std::string where = absl::StrCat("post_processor ", type);
  if (type == "TemplateProcessing") {
    auto p = std::make_unique<TemplateProcessor>();
    auto tmpl = j.find("single");
    auto specials = j.find("special_tokens");
    if (tmpl == j.end() || !tmpl->is_array()) return absl::InvalidArgumentError(where + ": \"single\" must be a list");
    for (const auto& item : *tmpl) {
      if (auto st = item.find("SpecialToken"); st != item.end()) {
        VC_ASSIGN_OR_RETURN(std::string name, GetString(*st, "id", where));
        if (specials == j.end() || !specials->contains(name)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": special token '", name, "' is not in \"special_tokens\""));
        }
        const Json& entry = (*specials)[name];
        auto ids = entry.find("ids");
        if (ids == entry.end() || !ids->is_array()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": special token '", name, "' has no \"ids\" list"));
        }
        std::vector<int32_t> v;
        for (const auto& id : *ids) {
          if (!id.is_number_integer()) return absl::InvalidArgumentError(where + ": ids must be integers");
          v.push_back(id.get<int32_t>());
        }
        p->single.emplace_back(std::move(v));
      } else if (auto seq = item.find("Sequence"); seq != item.end()) {
        p->single.emplace_back(std::nullopt);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(where, ": unsupported template item ", item.dump()));
      }
    }
    return p;
  }
  if (type == "ByteLevel") return std::make_unique<NoopProcessor>();  // it only trims offsets
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto p = std::make_unique<ClsSepProcessor>();
    VC_ASSIGN_OR_RETURN(p->cls, TokenPairId(j, "cls", where));
    VC_ASSIGN_OR_RETURN(p->sep, TokenPairId(j, "sep", where));
    return p;
  }
  if (type == "Sequence") {
    auto p = std::make_unique<SequenceProcessor>();
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) return absl::InvalidArgumentError(where + ": \"processors\" must be a list");
    for (const auto& sub : *it) {
      VC_ASSIGN_OR_RETURN(auto part, MakePostProcessor(sub));
      p->parts.push_back(std::move(part));
    }
    return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported post_processor type '", type.empty() ? j.dump().substr(0, 80) : type, "'"));
}

// --------------------------------------------------------------- decoders

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const auto& t : *tokens) {
      size_t mark = bytes.size();
      size_t pos = 0;
      bool all_mapped = true;
      while (pos < t.size()) {
        int b = UnicodeToByte(NextCodePoint(t, &pos));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all_mapped) {  // a token outside the alphabet (an added token) goes as it is
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens->assign(1, Utf8Lossy(bytes));
    return absl::OkStatus();
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  std::string replacement;
  PrependScheme scheme = PrependScheme::kAlways;
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string out;
      out.reserve(t.size());
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, replacement.size(), replacement) == 0) {
          if (!(i == 0 && scheme != PrependScheme::kNever)) out.push_back(' ');
          pos += replacement.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      t = std::move(out);
    }
    return absl::OkStatus();
  }
};

class ReplaceDecoder : public Decoder {
 public:
  std::shared_ptr<const Pattern> pattern;
  std::string content;
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) VC_RETURN_IF_ERROR(ReplaceAll(*pattern, content, &t));
    return absl::OkStatus();
  }
};

// "<0xAB>" -> 0xAB, or -1.
int ParseByteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      // Bytes that do not form UTF-8 become one U+FFFD per byte, as the
      // reference does.
      if (FindInvalidUtf8(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending_count; ++k) out.push_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : *tokens) {
      int b = ParseByteToken(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
    return absl::OkStatus();
  }
};

class FuseDecoder : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
    return absl::OkStatus();
  }
};

class StripDecoder : public Decoder {
 public:
  std::string content;  // one character
  int64_t start = 0, stop = 0;
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      // Count in characters, as the reference does.
      std::vector<size_t> bounds;  // char start offsets
      size_t pos = 0;
      while (pos < t.size()) {
        bounds.push_back(pos);
        NextCodePoint(t, &pos);
      }
      bounds.push_back(t.size());
      size_t nchars = bounds.size() - 1;
      auto is_content = [&](size_t k) {
        return bounds[k + 1] - bounds[k] == content.size() && t.compare(bounds[k], content.size(), content) == 0;
      };
      size_t cut_start = 0;
      for (int64_t k = 0; k < start && static_cast<size_t>(k) < nchars; ++k) {
        if (!is_content(k)) break;
        cut_start = k + 1;
      }
      size_t cut_stop = nchars;
      for (int64_t k = 0; k < stop && static_cast<size_t>(k) < nchars; ++k) {
        size_t idx = nchars - 1 - k;
        if (!is_content(idx)) break;
        cut_stop = idx;
      }
      if (cut_stop < cut_start) cut_stop = cut_start;
      t = t.substr(bounds[cut_start], bounds[cut_stop] - bounds[cut_start]);
    }
    return absl::OkStatus();
  }
};

class WordPieceDecoder : public Decoder {
 public:
  std::string prefix = "##";
  bool cleanup = true;
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override;
};

class BpeSuffixDecoder : public Decoder {
 public:
  std::string suffix = "</w>";
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string repl = i + 1 == tokens->size() ? "" : " ";
      std::string out;
      size_t pos = 0, hit;
      while (!suffix.empty() && (hit = t.find(suffix, pos)) != std::string::npos) {
        out.append(t, pos, hit - pos);
        out += repl;
        pos = hit + suffix.size();
      }
      out.append(t, pos);
      t = std::move(out);
    }
    return absl::OkStatus();
  }
};

class SequenceDecoder : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> parts;
  absl::Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts) VC_RETURN_IF_ERROR(p->DecodeChain(tokens));
    return absl::OkStatus();
  }
};

}  // namespace

std::string CleanUpTokenizationSpaces(std::string text);

namespace {

absl::Status WordPieceDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  for (size_t i = 0; i < tokens->size(); ++i) {
    std::string& t = (*tokens)[i];
    if (i != 0) {
      if (!prefix.empty() && t.compare(0, prefix.size(), prefix) == 0) {
        t.erase(0, prefix.size());
      } else {
        t = " " + t;
      }
    }
    if (cleanup) t = CleanUpTokenizationSpaces(std::move(t));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CleanUpTokenizationSpaces(std::string text) {
  // transformers' clean_up_tokenization, replacement by replacement.
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) {
    if (text.find(from) == std::string::npos) continue;
    std::string out;
    out.reserve(text.size());
    size_t pos = 0, hit;
    while ((hit = text.find(from, pos)) != std::string::npos) {
      out.append(text, pos, hit - pos);
      out += to;
      pos = hit + from.size();
    }
    out.append(text, pos);
    text = std::move(out);
  }
  return text;
}

absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const Json& j) {
  std::string type = TypeOf(j);
  std::string where = absl::StrCat("decoder ", type);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    VC_ASSIGN_OR_RETURN(d->replacement, GetString(j, "replacement", where));
    if (d->replacement.empty()) return absl::InvalidArgumentError(where + ": empty \"replacement\"");
    VC_ASSIGN_OR_RETURN(d->scheme, ParsePrependScheme(j, where));
    return d;
  }
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDecoder>();
    auto it = j.find("pattern");
    if (it == j.end()) return absl::InvalidArgumentError(where + ": missing \"pattern\"");
    VC_ASSIGN_OR_RETURN(d->pattern, MakePattern(*it));
    VC_ASSIGN_OR_RETURN(d->content, GetString(j, "content", where));
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    VC_ASSIGN_OR_RETURN(d->content, GetString(j, "content", where));
    size_t pos = 0;
    if (d->content.empty() || (NextCodePoint(d->content, &pos), pos != d->content.size())) {
      return absl::InvalidArgumentError(where + ": \"content\" must be one character");
    }
    VC_ASSIGN_OR_RETURN(d->start, GetIntOr(j, "start", 0, where));
    VC_ASSIGN_OR_RETURN(d->stop, GetIntOr(j, "stop", 0, where));
    return d;
  }
  if (type == "WordPiece") {
    auto d = std::make_unique<WordPieceDecoder>();
    VC_ASSIGN_OR_RETURN(d->prefix, GetStringOr(j, "prefix", "##", where));
    VC_ASSIGN_OR_RETURN(d->cleanup, GetBoolOr(j, "cleanup", true, where));
    return d;
  }
  if (type == "BPEDecoder") {
    auto d = std::make_unique<BpeSuffixDecoder>();
    VC_ASSIGN_OR_RETURN(d->suffix, GetStringOr(j, "suffix", "</w>", where));
    return d;
  }
  if (type == "Sequence") {
    auto d = std::make_unique<SequenceDecoder>();
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) return absl::InvalidArgumentError(where + ": \"decoders\" must be a list");
    for (const auto& sub : *it) {
      VC_ASSIGN_OR_RETURN(auto part, MakeDecoder(sub));
      d->parts.push_back(std::move(part));
    }
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported decoder type '", type.empty() ? j.dump().substr(0, 80) : type, "'"));
}

}  // namespace vc::tokenizer_internal
