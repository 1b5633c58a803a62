// Lexer and recursive-descent parser for the Jinja subset chat templates use.
// Operator precedence follows jinja2's parser: conditional, or, and, not,
// comparisons, + -, ~, * / // %, **, unary - +, then postfix (. [] ()) and
// filters/tests, which bind tightest.
#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/internal/jinja_ast.h"
#include "common/chat/internal/jinja_text.h"

namespace vc::jinja {
namespace {

// Deeper nesting than this (of expressions or blocks) is refused at parse
// time, which also bounds the evaluator's recursion.
constexpr int kMaxNesting = 128;

struct Token {
  enum class Kind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
  Kind kind = Kind::kEof;
  std::string text;  // text, name, operator, or decoded string literal
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

absl::Status SyntaxError(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

int LineAt(std::string_view src, size_t pos) {
  int line = 1;
  for (size_t k = 0; k < pos && k < src.size(); ++k) line += src[k] == '\n';
  return line;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    // Jinja drops one trailing newline of the template (keep_trailing_newline
    // is off in transformers).
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;  // the text about to be read starts a line
    bool strip_next = false;    // the previous tag ended with "-"
    while (true) {
      size_t tag = pos;
      while (true) {
        tag = src_.find('{', tag);
        if (tag == std::string_view::npos || tag + 1 >= src_.size()) {
          tag = std::string_view::npos;
          break;
        }
        const char c = src_[tag + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++tag;
      }
      std::string text(src_.substr(pos, tag == std::string_view::npos ? std::string_view::npos : tag - pos));
      if (strip_next) text = std::string(LStripPy(text));
      if (tag == std::string_view::npos) {
        Emit(Token::Kind::kText, std::move(text), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        text = std::string(RStripPy(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: spaces and tabs between a line start and a block or
        // comment tag are dropped.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = true;
          for (size_t k = l_pos; k < text.size(); ++k) blank &= text[k] == ' ' || text[k] == '\t';
          if (blank) text.resize(l_pos);
        }
      }
      Emit(Token::Kind::kText, std::move(text), pos);
      size_t p = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", p);
        if (end == std::string_view::npos) return SyntaxError(LineAt(src_, tag), "unclosed comment");
        const bool minus = end > p && src_[end - 1] == '-';
        const bool plus = end > p && src_[end - 1] == '+';
        pos = end + 2;
        pos = AfterTag(pos, minus, !plus, &strip_next);
      } else {
        const bool block = kind == '%';
        Emit(block ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, "", tag);
        auto end = LexTag(p, block);
        if (!end.ok()) return end.status();
        pos = *end;
        strip_next = false;  // LexTag consumed what a "-" strips
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Emit(Token::Kind::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  // After a tag closing at `pos` (just past "%}" or "#}"): "-" strips the
  // whitespace that follows; otherwise trim_blocks drops one newline.
  size_t AfterTag(size_t pos, bool minus, bool trim, bool* strip_next) {
    *strip_next = false;
    if (minus) {
      *strip_next = true;
    } else if (trim && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  void Emit(Token::Kind kind, std::string text, size_t pos) {
    if (kind == Token::Kind::kText && text.empty()) return;
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.line = LineAt(src_, pos);
    tokens_.push_back(std::move(t));
  }

  // Tokens inside {{ }} or {% %} starting at `p`; returns the position after
  // the closing delimiter (and the whitespace it strips).
  absl::StatusOr<size_t> LexTag(size_t p, bool block) {
    const char close = block ? '%' : '}';
    int depth = 0;  // open ( [ {: "}}" inside a dict literal does not close
    while (true) {
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (p >= src_.size()) {
        return SyntaxError(LineAt(src_, p), block ? "unclosed block tag, expected '%}'"
                                                  : "unclosed expression, expected '}}'");
      }
      auto closes_at = [&](size_t q) {
        return depth == 0 && q + 1 < src_.size() && src_[q] == close && src_[q + 1] == '}';
      };
      if (closes_at(p) || ((src_[p] == '-' || (block && src_[p] == '+')) && closes_at(p + 1))) {
        const bool minus = src_[p] == '-';
        const bool plus = src_[p] == '+';
        Emit(block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, "", p);
        p += (minus || plus) ? 3 : 2;
        bool strip = false;
        p = AfterTag(p, minus, block && !plus, &strip);
        if (strip) {
          while (p < src_.size()) {
            const size_t n = PySpaceLength(src_.substr(p));
            if (n == 0) break;
            p += n;
          }
        }
        return p;
      }
      const char c = src_[p];
      const size_t start = p;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
        Emit(Token::Kind::kName, std::string(src_.substr(start, p - start)), start);
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        std::string digits;
        bool is_float = false;
        while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) {
          if (src_[p] != '_') digits.push_back(src_[p]);
          ++p;
        }
        if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
          is_float = true;
          digits.push_back('.');
          ++p;
          while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) {
            if (src_[p] != '_') digits.push_back(src_[p]);
            ++p;
          }
        }
        if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
            is_float = true;
            digits += src_.substr(p, q - p);
            p = q;
            while (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) digits.push_back(src_[p++]);
          }
        }
        Token t;
        t.line = LineAt(src_, start);
        if (is_float) {
          t.kind = Token::Kind::kFloat;
          t.f = std::strtod(digits.c_str(), nullptr);
        } else {
          t.kind = Token::Kind::kInt;
          errno = 0;
          const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
          if (errno != 0 || v > static_cast<unsigned long long>(INT64_MAX)) {
            return SyntaxError(t.line, absl::StrCat("integer literal ", digits, " is too large"));
          }
          t.i = static_cast<int64_t>(v);
        }
        tokens_.push_back(std::move(t));
        continue;
      }
      if (c == '\'' || c == '"') {
        auto s = LexString(&p);
        if (!s.ok()) return s.status();
        Emit(Token::Kind::kString, "", start);
        tokens_.back().text = std::move(s).value();
        continue;
      }
      static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                         "~",  "<",  ">",  "=",  "(",  ")",  "[", "]", "{", "}", ",",
                                         ".",  ":",  "|"};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::strlen(op);
        if (src_.compare(p, n, op) == 0) {
          if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
          if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
          Emit(Token::Kind::kOp, op, p);
          p += n;
          matched = true;
          break;
        }
      }
      if (!matched) {
        return SyntaxError(LineAt(src_, p), absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
    }
  }

  // A quoted literal with Python's escapes (\n \t \r \\ \' \" \xhh \uhhhh
  // \Uhhhhhhhh, octal); unknown escapes stay as written, as in Python.
  absl::StatusOr<std::string> LexString(size_t* pos) {
    const char quote = src_[*pos];
    const int line = LineAt(src_, *pos);
    size_t p = *pos + 1;
    std::string out;
    while (true) {
      if (p >= src_.size()) return SyntaxError(line, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return SyntaxError(line, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case 'a': out.push_back('\a'); break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case '\n': break;  // a backslash-newline continues the line
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            if (p + k >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p + k]))) {
              return SyntaxError(line, absl::StrCat("bad \\", std::string(1, e), " escape in a string literal"));
            }
            const char h = src_[p + k];
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10ffff) return SyntaxError(line, "escape outside Unicode in a string literal");
          p += n;
          AppendUtf8(cp, &out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            AppendUtf8(cp, &out);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    *pos = p + 1;
    return out;
  }

  std::string_view src_;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll() {
    Body body;
    std::string end;
    if (auto s = ParseBody(&body, {}, &end); !s.ok()) return s;
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    const size_t k = std::min(pos_ + ahead, t_.size() - 1);
    return t_[k];
  }
  Token Next() {
    Token t = Peek();
    if (pos_ < t_.size() - 1) ++pos_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kName && Peek(ahead).text == name;
  }
  std::string Describe(const Token& t) const {
    switch (t.kind) {
      case Token::Kind::kEof: return "the end of the template";
      case Token::Kind::kVarEnd: return "'}}'";
      case Token::Kind::kBlockEnd: return "'%}'";
      case Token::Kind::kText: return "template text";
      case Token::Kind::kString: return "a string";
      case Token::Kind::kInt:
      case Token::Kind::kFloat: return "a number";
      default: return "'" + t.text + "'";
    }
  }
  absl::Status Expected(const std::string& what) const {
    return SyntaxError(Peek().line, absl::StrCat("expected ", what, ", found ", Describe(Peek())));
  }
  absl::Status ExpectOp(const char* op) {
    if (!IsOp(op)) return Expected(absl::StrCat("'", op, "'"));
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().kind != Token::Kind::kBlockEnd) return Expected("'%}'");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName(const char* what) {
    if (Peek().kind != Token::Kind::kName) return Expected(what);
    return Next().text;
  }

  // Nodes until a block tag whose keyword is in `ends` (consumed up to the
  // keyword; *end says which) or, with no ends, the end of the template.
  absl::Status ParseBody(Body* body, const std::vector<std::string>& ends, std::string* end) {
    if (++depth_ > kMaxNesting) return SyntaxError(Peek().line, "blocks nested too deeply");
    struct Leave {
      int* d;
      ~Leave() { --*d; }
    } leave{&depth_};
    while (true) {
      const Token& t = Peek();
      switch (t.kind) {
        case Token::Kind::kEof:
          if (!ends.empty()) {
            return SyntaxError(t.line, absl::StrCat("unexpected end of template; expected {% ", ends.back(), " %}"));
          }
          return absl::OkStatus();
        case Token::Kind::kText: {
          auto n = std::make_unique<Node>();
          n->type = Node::Type::kText;
          n->line = t.line;
          n->text = Next().text;
          body->push_back(std::move(n));
          break;
        }
        case Token::Kind::kVarBegin: {
          auto n = std::make_unique<Node>();
          n->type = Node::Type::kOutput;
          n->line = Next().line;
          auto e = ParseExpression();
          if (!e.ok()) return e.status();
          n->expr = std::move(e).value();
          if (Peek().kind != Token::Kind::kVarEnd) return Expected("'}}'");
          Next();
          body->push_back(std::move(n));
          break;
        }
        case Token::Kind::kBlockBegin: {
          const int line = Next().line;
          if (Peek().kind != Token::Kind::kName) return Expected("a tag name");
          const std::string kw = Peek().text;
          for (const std::string& e : ends) {
            if (kw == e) {
              Next();
              *end = kw;
              return absl::OkStatus();
            }
          }
          Next();
          if (auto s = ParseStatement(kw, line, body); !s.ok()) return s;
          break;
        }
        default:
          return Expected("template text or a tag");
      }
    }
  }

  absl::Status ParseStatement(const std::string& kw, int line, Body* body) {
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") {
      n->type = Node::Type::kIf;
      std::string end = "elif";
      while (end == "elif") {
        auto cond = ParseExpression();
        if (!cond.ok()) return cond.status();
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
        Body b;
        if (auto s = ParseBody(&b, {"elif", "else", "endif"}, &end); !s.ok()) return s;
        n->branches.emplace_back(std::move(cond).value(), std::move(b));
      }
      if (end == "else") {
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
        if (auto s = ParseBody(&n->else_body, {"endif"}, &end); !s.ok()) return s;
      }
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    } else if (kw == "for") {
      n->type = Node::Type::kFor;
      auto targets = ParseTargets();
      if (!targets.ok()) return targets.status();
      n->targets = std::move(targets).value();
      if (!IsName("in")) return Expected("'in'");
      Next();
      // The iterable stops before "if" (the loop filter): parse it without
      // the conditional expression, as jinja2 does.
      auto iter = ParseOr();
      if (!iter.ok()) return iter.status();
      n->expr = std::move(iter).value();
      if (IsName("if")) {
        Next();
        auto f = ParseExpression();
        if (!f.ok()) return f.status();
        n->filter = std::move(f).value();
      }
      if (IsName("recursive")) return SyntaxError(line, "recursive loops are not supported");
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      if (auto s = ParseBody(&n->body, {"else", "endfor"}, &end); !s.ok()) return s;
      if (end == "else") {
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
        if (auto s = ParseBody(&n->else_body, {"endfor"}, &end); !s.ok()) return s;
      }
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    } else if (kw == "set") {
      auto first = ExpectName("a variable name after 'set'");
      if (!first.ok()) return first.status();
      n->targets.push_back(*first);
      if (IsOp(".")) {
        Next();
        auto attr = ExpectName("an attribute name");
        if (!attr.ok()) return attr.status();
        n->attr = *attr;
      } else {
        while (IsOp(",")) {
          Next();
          auto more = ExpectName("a variable name");
          if (!more.ok()) return more.status();
          n->targets.push_back(*more);
        }
      }
      if (Peek().kind == Token::Kind::kBlockEnd && n->attr.empty() && n->targets.size() == 1) {
        // {% set x %}...{% endset %}: the body's output, as a string.
        Next();
        n->type = Node::Type::kSetBlock;
        std::string end;
        if (auto s = ParseBody(&n->body, {"endset"}, &end); !s.ok()) return s;
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      } else {
        n->type = Node::Type::kSet;
        if (auto s = ExpectOp("="); !s.ok()) return s;
        auto value = ParseTuple();
        if (!value.ok()) return value.status();
        n->expr = std::move(value).value();
        if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      }
    } else if (kw == "macro") {
      n->type = Node::Type::kMacro;
      auto name = ExpectName("a macro name");
      if (!name.ok()) return name.status();
      n->name = *name;
      if (auto s = ExpectOp("("); !s.ok()) return s;
      while (!IsOp(")")) {
        auto param = ExpectName("a parameter name");
        if (!param.ok()) return param.status();
        ExprPtr def;
        if (IsOp("=")) {
          Next();
          auto d = ParseExpression();
          if (!d.ok()) return d.status();
          def = std::move(d).value();
        }
        n->params.emplace_back(*param, std::move(def));
        if (!IsOp(",")) break;
        Next();
      }
      if (auto s = ExpectOp(")"); !s.ok()) return s;
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      if (auto s = ParseBody(&n->body, {"endmacro"}, &end); !s.ok()) return s;
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    } else if (kw == "break" || kw == "continue") {
      n->type = kw == "break" ? Node::Type::kBreak : Node::Type::kContinue;
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    } else if (kw == "generation") {
      // transformers' AssistantTracker marks assistant text for masks; it
      // renders its body unchanged.
      if (auto s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      if (auto s = ParseBody(body, {"endgeneration"}, &end); !s.ok()) return s;
      return ExpectBlockEnd();
    } else {
      return SyntaxError(line, absl::StrCat("unknown or unsupported tag '", kw, "'"));
    }
    body->push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = IsOp("(");
    if (paren) Next();
    while (true) {
      auto name = ExpectName("a loop variable");
      if (!name.ok()) return name.status();
      names.push_back(*name);
      if (!IsOp(",")) break;
      Next();
    }
    if (paren) {
      if (auto s = ExpectOp(")"); !s.ok()) return s;
    }
    return names;
  }

  ExprPtr Make(Expr::Type type, int line) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = line;
    return e;
  }

  // "a, b" without brackets (in set): a tuple.
  absl::StatusOr<ExprPtr> ParseTuple() {
    const int line = Peek().line;
    auto first = ParseExpression();
    if (!first.ok() || !IsOp(",")) return first;
    ExprPtr list = Make(Expr::Type::kList, line);
    list->args.push_back(std::move(first).value());
    while (IsOp(",")) {
      Next();
      auto e = ParseExpression();
      if (!e.ok()) return e.status();
      list->args.push_back(std::move(e).value());
    }
    return list;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    if (++depth_ > kMaxNesting) return SyntaxError(Peek().line, "expression nested too deeply");
    struct Leave {
      int* d;
      ~Leave() { --*d; }
    } leave{&depth_};
    auto body = ParseOr();
    if (!body.ok()) return body;
    if (!IsName("if")) return body;
    const int line = Next().line;
    ExprPtr e = Make(Expr::Type::kCondition, line);
    auto cond = ParseOr();
    if (!cond.ok()) return cond.status();
    e->args.push_back(std::move(cond).value());
    e->args.push_back(std::move(body).value());
    if (IsName("else")) {
      Next();
      auto other = ParseExpression();
      if (!other.ok()) return other.status();
      e->args.push_back(std::move(other).value());
    } else {
      e->args.push_back(nullptr);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Binary(absl::StatusOr<ExprPtr> (Parser::*next)(),
                                 std::initializer_list<const char*> ops, bool names) {
    auto left = (this->*next)();
    if (!left.ok()) return left;
    ExprPtr e = std::move(left).value();
    while (true) {
      const char* found = nullptr;
      for (const char* op : ops) {
        if (names ? IsName(op) : IsOp(op)) found = op;
      }
      if (found == nullptr) return e;
      const int line = Next().line;
      auto right = (this->*next)();
      if (!right.ok()) return right;
      ExprPtr b = Make(Expr::Type::kBinary, line);
      b->name = found;
      b->args.push_back(std::move(e));
      b->args.push_back(std::move(right).value());
      e = std::move(b);
    }
  }
  absl::StatusOr<ExprPtr> ParseOr() { return Binary(&Parser::ParseAnd, {"or"}, true); }
  absl::StatusOr<ExprPtr> ParseAnd() { return Binary(&Parser::ParseNot, {"and"}, true); }
  absl::StatusOr<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    const int line = Next().line;
    auto operand = ParseNot();
    if (!operand.ok()) return operand;
    ExprPtr e = Make(Expr::Type::kUnary, line);
    e->name = "not";
    e->args.push_back(std::move(operand).value());
    return e;
  }
  absl::StatusOr<ExprPtr> ParseCompare() {
    auto left = ParseMath1();
    if (!left.ok()) return left;
    ExprPtr e;
    while (true) {
      std::string op;
      for (const char* o : {"==", "!=", "<", ">", "<=", ">="}) {
        if (IsOp(o)) op = o;
      }
      if (op.empty() && IsName("in")) op = "in";
      if (op.empty() && IsName("not") && IsName("in", 1)) {
        Next();
        op = "not in";
      }
      if (op.empty()) break;
      const int line = Next().line;
      auto right = ParseMath1();
      if (!right.ok()) return right;
      if (!e) {
        e = Make(Expr::Type::kCompare, line);
        e->args.push_back(std::move(left).value());
      }
      e->ops.push_back(op);
      e->args.push_back(std::move(right).value());
    }
    if (e) return e;
    return left;
  }
  absl::StatusOr<ExprPtr> ParseMath1() { return Binary(&Parser::ParseConcat, {"+", "-"}, false); }
  absl::StatusOr<ExprPtr> ParseConcat() { return Binary(&Parser::ParseMath2, {"~"}, false); }
  absl::StatusOr<ExprPtr> ParseMath2() {
    return Binary(&Parser::ParsePow, {"*", "/", "//", "%"}, false);
  }
  absl::StatusOr<ExprPtr> ParsePow() { return Binary(&Parser::ParseUnary, {"**"}, false); }
  absl::StatusOr<ExprPtr> ParseUnary() {
    if (IsOp("-") || IsOp("+")) {
      const Token op = Next();
      if (++depth_ > kMaxNesting) return SyntaxError(op.line, "expression nested too deeply");
      auto operand = ParseUnary();
      --depth_;
      if (!operand.ok()) return operand;
      ExprPtr e = Make(Expr::Type::kUnary, op.line);
      e->name = op.text;
      e->args.push_back(std::move(operand).value());
      return ParseFilters(std::move(e));
    }
    auto primary = ParsePrimary();
    if (!primary.ok()) return primary;
    auto post = ParsePostfix(std::move(primary).value());
    if (!post.ok()) return post;
    return ParseFilters(std::move(post).value());
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    ExprPtr e = Make(Expr::Type::kLiteral, t.line);
    switch (t.kind) {
      case Token::Kind::kString: {
        std::string s = Next().text;
        while (Peek().kind == Token::Kind::kString) s += Next().text;  // "a" "b" is "ab"
        e->value = Value::Str(std::move(s));
        return e;
      }
      case Token::Kind::kInt:
        e->value = Value::Int(Next().i);
        return e;
      case Token::Kind::kFloat:
        e->value = Value::Float(Next().f);
        return e;
      case Token::Kind::kName: {
        const std::string name = Next().text;
        if (name == "true" || name == "True") e->value = Value::Bool(true);
        else if (name == "false" || name == "False") e->value = Value::Bool(false);
        else if (name == "none" || name == "None") e->value = Value::None();
        else {
          e->type = Expr::Type::kName;
          e->name = name;
        }
        return e;
      }
      case Token::Kind::kOp:
        break;
      default:
        return Expected("an expression");
    }
    if (IsOp("(")) {
      Next();
      if (IsOp(")")) {
        Next();
        e->type = Expr::Type::kList;  // the empty tuple
        return e;
      }
      auto inner = ParseExpression();
      if (!inner.ok()) return inner;
      if (IsOp(")")) {
        Next();
        return inner;
      }
      e->type = Expr::Type::kList;  // a tuple
      e->args.push_back(std::move(inner).value());
      while (IsOp(",")) {
        Next();
        if (IsOp(")")) break;
        auto more = ParseExpression();
        if (!more.ok()) return more;
        e->args.push_back(std::move(more).value());
      }
      if (auto s = ExpectOp(")"); !s.ok()) return s;
      return e;
    }
    if (IsOp("[")) {
      Next();
      e->type = Expr::Type::kList;
      while (!IsOp("]")) {
        auto item = ParseExpression();
        if (!item.ok()) return item;
        e->args.push_back(std::move(item).value());
        if (!IsOp(",")) break;
        Next();
      }
      if (auto s = ExpectOp("]"); !s.ok()) return s;
      return e;
    }
    if (IsOp("{")) {
      Next();
      e->type = Expr::Type::kDict;
      while (!IsOp("}")) {
        auto key = ParseExpression();
        if (!key.ok()) return key;
        if (auto s = ExpectOp(":"); !s.ok()) return s;
        auto value = ParseExpression();
        if (!value.ok()) return value;
        e->args.push_back(std::move(key).value());
        e->args.push_back(std::move(value).value());
        if (!IsOp(",")) break;
        Next();
      }
      if (auto s = ExpectOp("}"); !s.ok()) return s;
      return e;
    }
    return Expected("an expression");
  }

  // Call arguments after "(": positional, then name=value.
  absl::Status ParseArgs(Expr* e) {
    while (!IsOp(")")) {
      if (Peek().kind == Token::Kind::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        Next();
        auto v = ParseExpression();
        if (!v.ok()) return v.status();
        e->kwargs.emplace_back(std::move(name), std::move(v).value());
      } else {
        if (!e->kwargs.empty()) return SyntaxError(Peek().line, "positional argument after a keyword argument");
        auto v = ParseExpression();
        if (!v.ok()) return v.status();
        e->args.push_back(std::move(v).value());
      }
      if (!IsOp(",")) break;
      Next();
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        ExprPtr a = Make(Expr::Type::kAttr, line);
        if (Peek().kind == Token::Kind::kInt) {
          // foo.0 is foo[0] in Jinja.
          a->type = Expr::Type::kItem;
          ExprPtr idx = Make(Expr::Type::kLiteral, line);
          idx->value = Value::Int(Next().i);
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
        } else {
          auto name = ExpectName("an attribute name after '.'");
          if (!name.ok()) return name.status();
          a->name = *name;
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        const int line = Next().line;
        ExprPtr parts[3];
        int colons = 0;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            auto v = ParseExpression();
            if (!v.ok()) return v;
            parts[k] = std::move(v).value();
          }
          if (k < 2 && IsOp(":")) {
            Next();
            ++colons;
          } else {
            break;
          }
        }
        if (auto s = ExpectOp("]"); !s.ok()) return s;
        ExprPtr s = Make(colons == 0 ? Expr::Type::kItem : Expr::Type::kSlice, line);
        s->args.push_back(std::move(e));
        if (colons == 0) {
          if (!parts[0]) return SyntaxError(line, "empty subscript");
          s->args.push_back(std::move(parts[0]));
        } else {
          for (auto& p : parts) s->args.push_back(std::move(p));
        }
        e = std::move(s);
      } else if (IsOp("(")) {
        const int line = Next().line;
        ExprPtr c = Make(Expr::Type::kCall, line);
        c->args.push_back(std::move(e));
        if (auto s = ParseArgs(c.get()); !s.ok()) return s;
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        auto name = ExpectName("a filter name after '|'");
        if (!name.ok()) return name.status();
        ExprPtr f = Make(Expr::Type::kFilter, line);
        f->name = *name;
        f->args.push_back(std::move(e));
        if (IsOp("(")) {
          Next();
          if (auto s = ParseArgs(f.get()); !s.ok()) return s;
        }
        e = std::move(f);
        auto post = ParsePostfix(std::move(e));
        if (!post.ok()) return post;
        e = std::move(post).value();
      } else if (IsName("is")) {
        const int line = Next().line;
        ExprPtr t = Make(Expr::Type::kTest, line);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        // Test names include the keywords none/true/false and in.
        if (Peek().kind != Token::Kind::kName && !IsOp("==") && !IsOp("!=") && !IsOp("<") &&
            !IsOp(">") && !IsOp("<=") && !IsOp(">=")) {
          return Expected("a test name after 'is'");
        }
        t->name = Next().text;
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          Next();
          if (auto s = ParseArgs(t.get()); !s.ok()) return s;
        } else if (Peek().kind == Token::Kind::kString || Peek().kind == Token::Kind::kInt ||
                   Peek().kind == Token::Kind::kFloat ||
                   (Peek().kind == Token::Kind::kName && !IsName("and") && !IsName("or") &&
                    !IsName("if") && !IsName("else") && !IsName("is") && !IsName("in") &&
                    !IsName("not"))) {
          // "x is divisibleby 3", "x is sameas none": one argument without
          // parentheses.
          auto arg = ParsePrimary();
          if (!arg.ok()) return arg;
          auto post = ParsePostfix(std::move(arg).value());
          if (!post.ok()) return post;
          t->args.push_back(std::move(post).value());
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(std::string_view source) {
  Lexer lexer(source);
  auto tokens = lexer.Run();
  if (!tokens.ok()) return tokens.status();
  Parser parser(std::move(tokens).value());
  return parser.ParseAll();
}

}  // namespace vc::jinja
