#include "common/tokenizer/internal/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/internal/unicode.h"

namespace vc::tokenizer_internal {
namespace {

// Oniguruma's \s (Unicode) is the White_Space property; PCRE2's UCP \s
// leaves out U+0085. Its \w is Alphabetic | Mark | Decimal_Number |
// Connector_Punctuation. Its \h is a hexadecimal digit, not horizontal space.
const std::string kSpaceInClass = "\\p{White_Space}";
const std::string kNotSpaceInClass = "\\P{White_Space}";
const std::string kWordInClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
const std::string kHexInClass = "0-9A-Fa-f";

}  // namespace

std::string TranslateOnigurumaPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  int class_depth = 0;
  size_t i = 0;
  while (i < p.size()) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      bool in_class = class_depth > 0;
      switch (n) {
        case 's':
          out += in_class ? std::string(kSpaceInClass) : absl::StrCat("[", kSpaceInClass, "]");
          break;
        case 'S':
          out += in_class ? std::string(kNotSpaceInClass) : absl::StrCat("[", kNotSpaceInClass, "]");
          break;
        case 'w':
          out += in_class ? std::string(kWordInClass) : absl::StrCat("[", kWordInClass, "]");
          break;
        case 'W':
          // Inside a class there is no way to splice a complement in; PCRE2's
          // own \W (UCP) is the closest.
          out += in_class ? std::string("\\W") : absl::StrCat("[^", kWordInClass, "]");
          break;
        case 'h':
          out += in_class ? std::string(kHexInClass) : absl::StrCat("[", kHexInClass, "]");
          break;
        case 'H':
          out += in_class ? std::string("\\x00-/:-@G-`g-\\x{10FFFF}") : absl::StrCat("[^", kHexInClass, "]");
          break;
        default:
          out.push_back(c);
          out.push_back(n);
          // Copy the rest of a multi-byte escaped character whole.
          for (int k = 1; k < Utf8Len(static_cast<unsigned char>(n)) && i + 1 + k < p.size(); ++k) {
            out.push_back(p[i + 1 + k]);
          }
          i += Utf8Len(static_cast<unsigned char>(n)) - 1;
          break;
      }
      i += 2;
      continue;
    }
    if (c == '[') {
      // "[:alpha:]" inside a class is a POSIX bracket, not a nested class.
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {
        size_t close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out.append(p.substr(i, close + 2 - i));
          i = close + 2;
          continue;
        }
      }
      ++class_depth;
      out.push_back(c);
      ++i;
      // A ']' right after '[' or '[^' is a literal.
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') {
        out += "\\]";
        ++i;
      }
      continue;
    }
    if (c == ']' && class_depth > 0) {
      --class_depth;
      out.push_back(c);
      ++i;
      continue;
    }
    if (c == '(' && class_depth == 0 && i + 1 < p.size() && p[i + 1] == '?') {
      // Ruby's (?m) is dot-matches-newline, PCRE2's (?s).
      size_t j = i + 2;
      std::string opts;
      while (j < p.size() && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) {
        opts.push_back(p[j] == 'm' ? 's' : p[j]);
        ++j;
      }
      if (!opts.empty() && j < p.size() && (p[j] == ':' || p[j] == ')')) {
        out += "(?" + opts;
        i = j;
        continue;
      }
    }
    out.push_back(c);
    ++i;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view oniguruma_pattern) {
  std::unique_ptr<Regex> re(new Regex());
  re->translated_ = TranslateOnigurumaPattern(oniguruma_pattern);
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // Ruby syntax: ^ and $ are line anchors, '.' excludes only "\n".
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re->translated_.data()),
                                   re->translated_.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                   &err, &err_offset, ctx);
  pcre2_compile_context_free(ctx);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return absl::InvalidArgumentError(absl::StrCat("regex '", std::string(oniguruma_pattern), "' does not compile: ",
                                                   reinterpret_cast<const char*>(msg), " at offset ",
                                                   err_offset));
  }
  // JIT is an optimisation: where it is unavailable the interpreter runs.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  re->code_ = code;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

namespace {

// Per-thread match state: match data sized for the largest pattern seen and
// a JIT stack big enough for long whitespace runs.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(16, nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

absl::Status Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
  matches->clear();
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& st = MatchState();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // Retry once without the JIT (its stack is the usual limit).
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.data, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return absl::ResourceExhaustedError(absl::StrCat("regex match failed: ", reinterpret_cast<const char*>(msg)));
      }
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t s = ov[0], e = ov[1];
    if (s == e && have_last && e == last_end) {
      // An empty match right where the last one ended: step one character.
      if (pos >= text.size()) break;
      pos += Utf8Len(static_cast<unsigned char>(text[pos]));
      continue;
    }
    matches->emplace_back(s, e);
    have_last = true;
    last_end = e;
    if (e == s) {
      if (e >= text.size()) break;
      pos = e + Utf8Len(static_cast<unsigned char>(text[e]));
    } else {
      pos = e;
    }
  }
  return absl::OkStatus();
}

}  // namespace vc::tokenizer_internal
