// Private to common/chat: the values a chat template computes with, following
// Python's semantics where Jinja inherits them (truthiness, equality, str()
// and repr() of lists and dicts, floor division). Lists and dicts are shared
// by reference, as in Python, so a namespace() assigned through one name is
// seen through all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace vc::jinja {

struct Value;
using ValueList = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;

// Insertion-ordered, as Python dicts are (tojson and items() keep the order).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);
};

using NativeFn = std::function<absl::StatusOr<Value>(std::vector<Value>& args, KwArgs& kwargs)>;
struct Callable {
  std::string name;
  NativeFn fn;
};

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };
  Kind kind = Kind::kUndefined;
  bool is_namespace = false;  // a dict made by namespace(): attributes may be assigned
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;
  std::shared_ptr<Callable> fn;

  static Value Undefined() { return Value(); }
  static Value None();
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Float(double v);
  static Value Str(std::string v);
  static Value List(ValueList v = {});
  static Value Dict(ValueDict v = {});
  static Value Function(std::string name, NativeFn fn);
  static Value FromJson(const nlohmann::json& j);

  bool IsUndefined() const { return kind == Kind::kUndefined; }
  bool IsNone() const { return kind == Kind::kNone; }
  bool IsString() const { return kind == Kind::kString; }
  bool IsNumber() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  bool IsList() const { return kind == Kind::kList; }
  bool IsDict() const { return kind == Kind::kDict; }
  double AsDouble() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }
};

// Python truthiness; undefined is false.
bool Truthy(const Value& v);
// Python ==, with 1 == 1.0 and True == 1.
bool Equal(const Value& a, const Value& b);
// Python <, for numbers, strings (code point order = UTF-8 byte order) and
// lists; InvalidArgument for anything else.
absl::StatusOr<bool> Less(const Value& a, const Value& b);
// str(v) as Jinja prints it ({{ v }}): undefined prints as "".
std::string ToString(const Value& v);
// repr(v), as str() of a list or dict shows its elements.
std::string Repr(const Value& v);
// json.dumps(v, ensure_ascii=..., indent=..., sort_keys=...) as
// transformers' tojson filter calls it (defaults: ensure_ascii=False, no
// indent, insertion order): separators ", " and ": " (or "," and ": " with
// an indent); ensure_ascii writes non-ASCII as \uXXXX (surrogate pairs).
struct JsonOptions {
  int indent = 0;
  bool ensure_ascii = false;
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);
// Python's float repr: shortest round trip, "1.0", "1e+16", "inf", "nan".
std::string FloatRepr(double d);
std::string KindName(const Value& v);

// UTF-8 code points of `s` (invalid bytes are kept as single units so
// nothing is lost), and back.
std::vector<std::string_view> CodePoints(std::string_view s);

}  // namespace vc::jinja
