#include "common/chat/internal/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace vc::jinja {

const Value* ValueDict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::Int(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::Float(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::Str(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::List(ValueList x) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ValueList>(std::move(x));
  return v;
}
Value Value::Dict(ValueDict x) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>(std::move(x));
  return v;
}
Value Value::Function(std::string name, NativeFn fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::FromJson(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return None();
    case nlohmann::json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::json::value_t::string:
      return Str(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList l;
      for (const auto& e : j) l.push_back(FromJson(e));
      return List(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), FromJson(*it));
      return Dict(std::move(d));
    }
    default:
      return Undefined();
  }
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->items.empty();
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

namespace {
bool Numeric(const Value& v) {
  return v.kind == Value::Kind::kInt || v.kind == Value::Kind::kFloat ||
         v.kind == Value::Kind::kBool;
}
double Num(const Value& v) {
  if (v.kind == Value::Kind::kBool) return v.b ? 1 : 0;
  return v.AsDouble();
}
}  // namespace

bool Equal(const Value& a, const Value& b) {
  if (Numeric(a) && Numeric(b)) {
    if (a.kind == Value::Kind::kInt && b.kind == Value::Kind::kInt) return a.i == b.i;
    return Num(a) == Num(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->Find(k);
        if (o == nullptr || !Equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (Numeric(a) && Numeric(b)) {
    if (a.kind == Value::Kind::kInt && b.kind == Value::Kind::kInt) return a.i < b.i;
    return Num(a) < Num(b);
  }
  if (a.IsString() && b.IsString()) return a.s < b.s;
  if (a.IsList() && b.IsList()) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (Equal((*a.list)[k], (*b.list)[k])) continue;
      return Less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot order ", KindName(a), " and ", KindName(b)));
}

std::string KindName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "boolean";
    case Value::Kind::kInt:
      return "integer";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return v.is_namespace ? "namespace" : "dict";
    case Value::Kind::kCallable:
      return "callable";
  }
  return "?";
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: positional for
  // exponents in [-4, 16), scientific ("1e+16", "1.5e-05") otherwise.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (!mant.empty() && mant[0] == '-') {
    sign = "-";
    mant = mant.substr(1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  if (exp >= 16 || exp < -4) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return out + eb;
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
          digits.substr(static_cast<size_t>(exp) + 1);
  }
  return sign + out;
}

namespace {
std::string StrRepr(const std::string& s) {
  // Python picks single quotes unless the text has ' and no ".
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\x%02x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}
}  // namespace

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      return StrRepr(v.s);
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return ToString(v);
  }
}

std::string ToString(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return FloatRepr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += Repr((*v.list)[k]);
      }
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = v.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += StrRepr(k) + ": " + Repr(e);
      }
      return out + (v.is_namespace ? "}>" : "}");
    }
    case Value::Kind::kCallable:
      return "<function " + v.fn->name + ">";
  }
  return "";
}

namespace {
void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (std::string_view ch : CodePoints(s)) {
    const unsigned char c = static_cast<unsigned char>(ch[0]);
    if (ch.size() > 1) {
      if (!ensure_ascii) {
        out->append(ch);
        continue;
      }
      uint32_t cp = ch.size() == 2 ? (c & 0x1fu) : ch.size() == 3 ? (c & 0x0fu) : (c & 0x07u);
      for (size_t k = 1; k < ch.size(); ++k) cp = cp << 6 | (static_cast<unsigned char>(ch[k]) & 0x3fu);
      char b[32];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      *out += b;
      continue;
    }
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        // As json.dumps: other control characters escaped; DEL passes; a
        // stray non-UTF-8 byte is escaped with ensure_ascii, kept otherwise.
        if (c < 0x20 || (ensure_ascii && c >= 0x80)) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          *out += b;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

absl::Status JsonValue(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  if (depth > 64) return absl::ResourceExhaustedError("tojson: value nested too deeply");
  const int indent = o.indent;
  auto newline = [&](int d) {
    if (indent <= 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent > 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.b ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      return absl::OkStatus();
    case Value::Kind::kFloat:
      if (std::isnan(v.f)) *out += "NaN";
      else if (std::isinf(v.f)) *out += v.f < 0 ? "-Infinity" : "Infinity";
      else *out += FloatRepr(v.f);
      return absl::OkStatus();
    case Value::Kind::kString:
      JsonString(v.s, o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += item_sep;
        newline(depth + 1);
        if (auto s = JsonValue((*v.list)[k], o, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      bool first = true;
      for (const auto* item : items) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        JsonString(item->first, o.ensure_ascii, out);
        *out += ": ";
        if (auto s = JsonValue(item->second, o, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kCallable:
      return absl::InvalidArgumentError("tojson: a function is not JSON serializable");
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  if (auto s = JsonValue(v, options, 0, &out); !s.ok()) return s;
  return out;
}

std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  size_t k = 0;
  while (k < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n = 1;
    if (c >= 0xf0 && c < 0xf8) n = 4;
    else if (c >= 0xe0) n = c < 0xf0 ? 3 : 1;
    else if (c >= 0xc0) n = 2;
    if (k + n > s.size()) n = 1;
    for (size_t m = 1; m < n; ++m) {
      if ((static_cast<unsigned char>(s[k + m]) & 0xc0) != 0x80) {
        n = 1;
        break;
      }
    }
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

}  // namespace vc::jinja
