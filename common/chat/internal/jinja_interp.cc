// The evaluator: statements, expressions, and the filters, tests, methods and
// globals real chat templates call. Semantics follow Python Jinja (as
// transformers configures it); where Jinja would raise on a lookup through an
// undefined value this evaluator yields undefined instead, which renders the
// same for every template that renders at all in Python.
#include "common/chat/internal/jinja_interp.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat/internal/jinja_text.h"

namespace vc::jinja {
namespace {

using Scope = std::shared_ptr<std::unordered_map<std::string, Value>>;

absl::Status LineError(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

// A "raise_exception" status is passed up unchanged; its message is the
// template's own text.
struct Args {
  std::vector<Value>& pos;
  KwArgs& kw;
  // Positional k, or the keyword `name`, or `def`.
  Value Get(size_t k, const char* name, Value def = Value()) const {
    if (k < pos.size()) return pos[k];
    for (auto& [n, v] : kw) {
      if (n == name) return v;
    }
    return def;
  }
};

class Interp {
 public:
  explicit Interp(const RenderLimits& limits) : limits_(limits) {}

  absl::StatusOr<std::string> Run(const Body& body,
                                  const std::vector<std::pair<std::string, Value>>& globals) {
    auto root = std::make_shared<std::unordered_map<std::string, Value>>();
    InstallBuiltins(root.get());
    for (const auto& [k, v] : globals) (*root)[k] = v;
    scopes_.push_back(root);
    std::string out;
    out_ = &out;
    auto flow = Exec(body);
    if (!flow.ok()) return flow.status();
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status Charge(size_t bytes) {
    work_ += bytes;
    if (work_ > limits_.max_work_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chat template: rendering built more than ", limits_.max_work_bytes, " bytes of strings"));
    }
    return absl::OkStatus();
  }

  absl::Status Emit(std::string_view s) {
    if (out_->size() + s.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chat template: output exceeds ", limits_.max_output_bytes, " bytes"));
    }
    out_->append(s);
    return Charge(s.size());
  }

  absl::Status CountIteration(int line) {
    if (++iterations_ > limits_.max_loop_iterations) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chat template line ", line, ": more than ", limits_.max_loop_iterations,
          " loop iterations"));
    }
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Value();
  }
  void Assign(const std::string& name, Value v) { (*scopes_.back())[name] = std::move(v); }

  // --- Statements ---------------------------------------------------------

  absl::StatusOr<Flow> Exec(const Body& body) {
    for (const auto& n : body) {
      auto flow = ExecNode(*n);
      if (!flow.ok() || *flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecNode(const Node& n) {
    switch (n.type) {
      case Node::Type::kText:
        if (auto s = Emit(n.text); !s.ok()) return s;
        return Flow::kNormal;
      case Node::Type::kOutput: {
        auto v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        if (auto s = Emit(ToString(*v)); !s.ok()) return s;
        return Flow::kNormal;
      }
      case Node::Type::kIf: {
        for (const auto& [cond, body] : n.branches) {
          auto c = Eval(*cond);
          if (!c.ok()) return c.status();
          if (Truthy(*c)) return Exec(body);
        }
        return Exec(n.else_body);
      }
      case Node::Type::kFor:
        return ExecFor(n);
      case Node::Type::kSet: {
        auto v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        if (auto s = AssignTargets(n, std::move(v).value()); !s.ok()) return s;
        return Flow::kNormal;
      }
      case Node::Type::kSetBlock: {
        std::string captured;
        std::string* saved = out_;
        out_ = &captured;
        auto flow = Exec(n.body);
        out_ = saved;
        if (!flow.ok()) return flow.status();
        Assign(n.targets[0], Value::Str(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::Type::kMacro:
        Assign(n.name, MakeMacro(n));
        return Flow::kNormal;
      case Node::Type::kBreak:
        return Flow::kBreak;
      case Node::Type::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  absl::Status AssignTargets(const Node& n, Value v) {
    if (!n.attr.empty()) {
      Value ns = Lookup(n.targets[0]);
      if (!ns.IsDict() || !ns.is_namespace) {
        return LineError(n.line, absl::StrCat("cannot assign attribute '", n.attr, "' on '",
                                              n.targets[0], "', which is not a namespace()"));
      }
      ns.dict->Set(n.attr, std::move(v));
      return absl::OkStatus();
    }
    if (n.targets.size() == 1) {
      Assign(n.targets[0], std::move(v));
      return absl::OkStatus();
    }
    return Unpack(n.line, n.targets, v, [this](const std::string& k, Value x) { Assign(k, std::move(x)); });
  }

  template <typename F>
  absl::Status Unpack(int line, const std::vector<std::string>& names, const Value& v, F assign) {
    if (!v.IsList() || v.list->size() != names.size()) {
      return LineError(line, absl::StrCat("cannot unpack ", KindName(v), " into ", names.size(),
                                          " variables"));
    }
    for (size_t k = 0; k < names.size(); ++k) assign(names[k], (*v.list)[k]);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Value>> Iterate(int line, const Value& v) {
    std::vector<Value> items;
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return items;
      case Value::Kind::kList:
        return *v.list;
      case Value::Kind::kDict:
        for (const auto& [k, x] : v.dict->items) items.push_back(Value::Str(k));
        return items;
      case Value::Kind::kString:
        for (std::string_view cp : CodePoints(v.s)) items.push_back(Value::Str(std::string(cp)));
        return items;
      default:
        return LineError(line, absl::StrCat("cannot iterate over ", KindName(v)));
    }
  }

  absl::StatusOr<Flow> ExecFor(const Node& n) {
    auto iterable = Eval(*n.expr);
    if (!iterable.ok()) return iterable.status();
    auto all = Iterate(n.line, *iterable);
    if (!all.ok()) return all.status();
    auto bind = [&](const Value& item) -> absl::Status {
      if (n.targets.size() == 1) {
        Assign(n.targets[0], item);
        return absl::OkStatus();
      }
      return Unpack(n.line, n.targets, item, [this](const std::string& k, Value x) { Assign(k, std::move(x)); });
    };
    // The loop filter runs first: loop.length and loop.last count the items
    // it keeps.
    std::vector<Value> items;
    if (n.filter) {
      for (const Value& item : *all) {
        if (auto s = CountIteration(n.line); !s.ok()) return s;
        scopes_.push_back(std::make_shared<std::unordered_map<std::string, Value>>());
        absl::Status s = bind(item);
        absl::StatusOr<Value> keep = s.ok() ? Eval(*n.filter) : absl::StatusOr<Value>(s);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (Truthy(*keep)) items.push_back(item);
      }
    } else {
      items = std::move(all).value();
    }
    if (items.empty()) return Exec(n.else_body);
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      if (auto s = CountIteration(n.line); !s.ok()) return s;
      scopes_.push_back(std::make_shared<std::unordered_map<std::string, Value>>());
      ValueDict loop;
      loop.Set("index", Value::Int(k + 1));
      loop.Set("index0", Value::Int(k));
      loop.Set("revindex", Value::Int(len - k));
      loop.Set("revindex0", Value::Int(len - k - 1));
      loop.Set("first", Value::Bool(k == 0));
      loop.Set("last", Value::Bool(k + 1 == len));
      loop.Set("length", Value::Int(len));
      loop.Set("depth", Value::Int(1));
      loop.Set("depth0", Value::Int(0));
      loop.Set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value());
      loop.Set("nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value());
      loop.Set("cycle", Value::Function("loop.cycle", [k](std::vector<Value>& a, KwArgs&) -> absl::StatusOr<Value> {
                 if (a.empty()) return absl::InvalidArgumentError("loop.cycle() needs arguments");
                 return a[static_cast<size_t>(k) % a.size()];
               }));
      Assign("loop", Value::Dict(std::move(loop)));
      absl::Status s = bind(items[static_cast<size_t>(k)]);
      absl::StatusOr<Flow> flow = s.ok() ? Exec(n.body) : absl::StatusOr<Flow>(s);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& n) {
    const Node* node = &n;
    // The macro is stored in the scope it captures: a weak reference breaks
    // that cycle (the root scope outlives every call, which happen during
    // the render that owns it).
    std::weak_ptr<std::unordered_map<std::string, Value>> weak_root = scopes_.front();
    return Value::Function(n.name, [this, node, weak_root](std::vector<Value>& pos, KwArgs& kw) -> absl::StatusOr<Value> {
      Scope root = weak_root.lock();
      if (root == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("macro '", node->name, "' called after its template finished rendering"));
      }
      if (depth_ >= limits_.max_call_depth) {
        return absl::ResourceExhaustedError(absl::StrCat("chat template line ", node->line,
                                                         ": macro calls nested deeper than ",
                                                         limits_.max_call_depth));
      }
      if (pos.size() > node->params.size()) {
        return LineError(node->line, absl::StrCat("macro '", node->name, "' takes ",
                                                  node->params.size(), " arguments, got ", pos.size()));
      }
      std::vector<Scope> saved = std::move(scopes_);
      scopes_ = {root, std::make_shared<std::unordered_map<std::string, Value>>()};
      std::string captured;
      std::string* saved_out = out_;
      out_ = &captured;
      ++depth_;
      absl::Status s;
      for (size_t k = 0; k < node->params.size() && s.ok(); ++k) {
        const auto& [name, def] = node->params[k];
        Value v;
        bool given = false;
        if (k < pos.size()) {
          v = pos[k];
          given = true;
        }
        for (auto& [kn, kv] : kw) {
          if (kn == name) {
            v = kv;
            given = true;
          }
        }
        if (!given && def) {
          auto d = Eval(*def);
          if (!d.ok()) s = d.status();
          else v = std::move(d).value();
        }
        Assign(name, std::move(v));
      }
      absl::StatusOr<Flow> flow = s.ok() ? Exec(node->body) : absl::StatusOr<Flow>(s);
      --depth_;
      out_ = saved_out;
      scopes_ = std::move(saved);
      if (!flow.ok()) return flow.status();
      return Value::Str(std::move(captured));
    });
  }

  // --- Expressions --------------------------------------------------------

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.type) {
      case Expr::Type::kLiteral:
        return e.value;
      case Expr::Type::kName:
        return Lookup(e.name);
      case Expr::Type::kList: {
        ValueList l;
        for (const auto& a : e.args) {
          auto v = Eval(*a);
          if (!v.ok()) return v;
          l.push_back(std::move(v).value());
        }
        return Value::List(std::move(l));
      }
      case Expr::Type::kDict: {
        ValueDict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          auto key = Eval(*e.args[k]);
          if (!key.ok()) return key;
          if (!key->IsString()) return LineError(e.line, "dict keys must be strings");
          auto v = Eval(*e.args[k + 1]);
          if (!v.ok()) return v;
          d.Set(key->s, std::move(v).value());
        }
        return Value::Dict(std::move(d));
      }
      case Expr::Type::kAttr: {
        auto obj = Eval(*e.args[0]);
        if (!obj.ok()) return obj;
        if (obj->IsUndefined()) return UndefinedError(*e.args[0], e.name);
        return Attribute(e.line, *obj, e.name);
      }
      case Expr::Type::kItem: {
        auto obj = Eval(*e.args[0]);
        if (!obj.ok()) return obj;
        auto key = Eval(*e.args[1]);
        if (!key.ok()) return key;
        if (obj->IsUndefined()) return UndefinedError(*e.args[0], Repr(*key));
        return Item(*obj, *key);
      }
      case Expr::Type::kSlice:
        return EvalSlice(e);
      case Expr::Type::kCall: {
        auto fn = Eval(*e.args[0]);
        if (!fn.ok()) return fn;
        if (fn->kind != Value::Kind::kCallable) {
          std::string what = e.args[0]->type == Expr::Type::kName ? "'" + e.args[0]->name + "'"
                             : e.args[0]->type == Expr::Type::kAttr ? "'" + e.args[0]->name + "'"
                                                                    : "the expression";
          return LineError(e.line, absl::StrCat(what, " is ", KindName(*fn), ", not callable"));
        }
        std::vector<Value> pos;
        KwArgs kw;
        if (auto s = EvalArgs(e, 1, &pos, &kw); !s.ok()) return s;
        return fn->fn->fn(pos, kw);
      }
      case Expr::Type::kFilter: {
        auto input = Eval(*e.args[0]);
        if (!input.ok()) return input;
        std::vector<Value> pos;
        KwArgs kw;
        if (auto s = EvalArgs(e, 1, &pos, &kw); !s.ok()) return s;
        return ApplyFilter(e.line, e.name, std::move(input).value(), pos, kw);
      }
      case Expr::Type::kTest: {
        auto input = Eval(*e.args[0]);
        if (!input.ok()) return input;
        std::vector<Value> pos;
        KwArgs kw;
        if (auto s = EvalArgs(e, 1, &pos, &kw); !s.ok()) return s;
        auto r = ApplyTest(e.line, e.name, *input, pos);
        if (!r.ok()) return r.status();
        return Value::Bool(*r != e.negated);
      }
      case Expr::Type::kUnary: {
        auto v = Eval(*e.args[0]);
        if (!v.ok()) return v;
        if (e.name == "not") return Value::Bool(!Truthy(*v));
        if (v->kind == Value::Kind::kInt) return e.name == "-" ? Value::Int(-v->i) : *v;
        if (v->kind == Value::Kind::kFloat) return e.name == "-" ? Value::Float(-v->f) : *v;
        if (v->kind == Value::Kind::kBool) return Value::Int(e.name == "-" ? -int{v->b} : int{v->b});
        return LineError(e.line, absl::StrCat("bad operand for unary ", e.name, ": ", KindName(*v)));
      }
      case Expr::Type::kBinary:
        return EvalBinary(e);
      case Expr::Type::kCompare: {
        auto left = Eval(*e.args[0]);
        if (!left.ok()) return left;
        Value l = std::move(left).value();
        for (size_t k = 0; k < e.ops.size(); ++k) {
          auto right = Eval(*e.args[k + 1]);
          if (!right.ok()) return right;
          auto r = Compare(e.line, e.ops[k], l, *right);
          if (!r.ok()) return r.status();
          if (!*r) return Value::Bool(false);
          l = std::move(right).value();
        }
        return Value::Bool(true);
      }
      case Expr::Type::kCondition: {
        auto c = Eval(*e.args[0]);
        if (!c.ok()) return c;
        if (Truthy(*c)) return Eval(*e.args[1]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value();
      }
    }
    return Value();
  }

  // Jinja raises when a lookup goes through an undefined value (a missing
  // variable, key or index), as `messages[0]['role']` on no messages does.
  static absl::Status UndefinedError(const Expr& obj, const std::string& what) {
    std::string name = "a value";
    if (obj.type == Expr::Type::kName) name = "'" + obj.name + "'";
    else if (obj.type == Expr::Type::kAttr) name = "attribute '" + obj.name + "'";
    else if (obj.type == Expr::Type::kItem) name = "an item";
    return LineError(obj.line, absl::StrCat(name, " is undefined (looking up ", what, " in it)"));
  }

  absl::Status EvalArgs(const Expr& e, size_t first, std::vector<Value>* pos, KwArgs* kw) {
    for (size_t k = first; k < e.args.size(); ++k) {
      auto v = Eval(*e.args[k]);
      if (!v.ok()) return v.status();
      pos->push_back(std::move(v).value());
    }
    for (const auto& [name, x] : e.kwargs) {
      auto v = Eval(*x);
      if (!v.ok()) return v.status();
      kw->emplace_back(name, std::move(v).value());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Compare(int line, const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in" || op == "not in") {
      auto in = Contains(line, b, a);
      if (!in.ok()) return in;
      return op == "in" ? *in : !*in;
    }
    absl::StatusOr<bool> r = (op == "<" || op == ">=") ? Less(a, b) : Less(b, a);
    if (!r.ok()) return LineError(line, std::string(r.status().message()));
    if (op == "<" || op == ">") return *r;
    return !*r;  // <= is not (b < a); >= is not (a < b)
  }

  absl::StatusOr<bool> Contains(int line, const Value& haystack, const Value& needle) {
    switch (haystack.kind) {
      case Value::Kind::kString:
        if (!needle.IsString()) {
          return LineError(line, absl::StrCat("'in <string>' needs a string, not ", KindName(needle)));
        }
        return haystack.s.find(needle.s) != std::string::npos;
      case Value::Kind::kList:
        for (const Value& v : *haystack.list) {
          if (Equal(v, needle)) return true;
        }
        return false;
      case Value::Kind::kDict:
        return needle.IsString() && haystack.dict->Find(needle.s) != nullptr;
      case Value::Kind::kUndefined:
        return false;
      default:
        return LineError(line, absl::StrCat("'in' needs a string, list or dict, not ", KindName(haystack)));
    }
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    auto left = Eval(*e.args[0]);
    if (!left.ok()) return left;
    const std::string& op = e.name;
    if (op == "and") return Truthy(*left) ? Eval(*e.args[1]) : left;
    if (op == "or") return Truthy(*left) ? left : Eval(*e.args[1]);
    auto right = Eval(*e.args[1]);
    if (!right.ok()) return right;
    const Value& a = *left;
    const Value& b = *right;
    if (op == "~") {
      std::string s = ToString(a) + ToString(b);
      if (auto c = Charge(s.size()); !c.ok()) return c;
      return Value::Str(std::move(s));
    }
    if (op == "+" && a.IsString() && b.IsString()) {
      if (auto c = Charge(a.s.size() + b.s.size()); !c.ok()) return c;
      return Value::Str(a.s + b.s);
    }
    if (op == "+" && a.IsList() && b.IsList()) {
      ValueList l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      if (auto c = Charge(l.size() * sizeof(Value)); !c.ok()) return c;
      return Value::List(std::move(l));
    }
    if (op == "*" && (a.IsString() || a.IsList()) && b.kind == Value::Kind::kInt) {
      const int64_t n = std::max<int64_t>(0, b.i);
      const size_t unit = a.IsString() ? a.s.size() : a.list->size() * sizeof(Value);
      if (unit > 0 && static_cast<uint64_t>(n) > limits_.max_work_bytes / unit) {
        return absl::ResourceExhaustedError(absl::StrCat("chat template line ", e.line,
                                                         ": repetition too large"));
      }
      if (auto c = Charge(unit * static_cast<size_t>(n)); !c.ok()) return c;
      if (a.IsString()) {
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += a.s;
        return Value::Str(std::move(s));
      }
      ValueList l;
      for (int64_t k = 0; k < n; ++k) l.insert(l.end(), a.list->begin(), a.list->end());
      return Value::List(std::move(l));
    }
    auto num = [](const Value& v) {
      return v.kind == Value::Kind::kInt || v.kind == Value::Kind::kFloat || v.kind == Value::Kind::kBool;
    };
    if (!num(a) || !num(b)) {
      return LineError(e.line, absl::StrCat("unsupported operand types for ", op, ": ", KindName(a),
                                            " and ", KindName(b)));
    }
    auto as_int = [](const Value& v) { return v.kind == Value::Kind::kBool ? int64_t{v.b} : v.i; };
    auto as_double = [](const Value& v) { return v.kind == Value::Kind::kBool ? double{v.b ? 1.0 : 0.0} : v.AsDouble(); };
    const bool ints = a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
    if (ints && op != "/" && op != "**") {
      const int64_t x = as_int(a), y = as_int(b);
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
      else if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
      else if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
      else {
        if (y == 0) return LineError(e.line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
          overflow = true;
        } else {
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors
            --q;
            m += y;
          }
          r = op == "//" ? q : m;
        }
      }
      if (overflow) return LineError(e.line, "integer overflow");
      return Value::Int(r);
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "**") {
      if (ints && as_int(b) >= 0) {
        double r = std::pow(x, y);
        if (std::fabs(r) < 9.2e18) return Value::Int(static_cast<int64_t>(std::llround(r)));
        return LineError(e.line, "integer overflow");
      }
      return Value::Float(std::pow(x, y));
    }
    if (y == 0) return LineError(e.line, "division by zero");
    if (op == "/") return Value::Float(x / y);
    if (op == "//") return Value::Float(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::Float(m);
  }

  static Value Item(const Value& obj, const Value& key) {
    if (obj.IsDict()) {
      if (!key.IsString()) return Value();
      const Value* v = obj.dict->Find(key.s);
      return v ? *v : Value();
    }
    if ((obj.IsList() || obj.IsString()) && (key.kind == Value::Kind::kInt || key.kind == Value::Kind::kBool)) {
      int64_t k = key.kind == Value::Kind::kBool ? int64_t{key.b} : key.i;
      if (obj.IsList()) {
        const int64_t n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value();
        return (*obj.list)[static_cast<size_t>(k)];
      }
      const std::vector<std::string_view> cps = CodePoints(obj.s);
      const int64_t n = static_cast<int64_t>(cps.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value();
      return Value::Str(std::string(cps[static_cast<size_t>(k)]));
    }
    return Value();
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    auto obj = Eval(*e.args[0]);
    if (!obj.ok()) return obj;
    std::optional<int64_t> bound[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      auto v = Eval(*e.args[k + 1]);
      if (!v.ok()) return v;
      if (v->IsNone()) continue;
      if (v->kind != Value::Kind::kInt) return LineError(e.line, "slice indices must be integers or none");
      bound[k] = v->i;
    }
    const int64_t step = bound[2].value_or(1);
    if (step == 0) return LineError(e.line, "slice step cannot be zero");
    std::vector<std::string_view> cps;
    int64_t n = 0;
    if (obj->IsList()) {
      n = static_cast<int64_t>(obj->list->size());
    } else if (obj->IsString()) {
      cps = CodePoints(obj->s);
      n = static_cast<int64_t>(cps.size());
    } else if (obj->IsUndefined()) {
      return Value();
    } else {
      return LineError(e.line, absl::StrCat("cannot slice ", KindName(*obj)));
    }
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> v, int64_t def_pos, int64_t def_neg) {
      if (!v) return step > 0 ? def_pos : def_neg;
      int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(bound[0], 0, n - 1);
    const int64_t stop = clamp(bound[1], n, -1);
    std::vector<int64_t> idx;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) idx.push_back(k);
    if (obj->IsList()) {
      ValueList l;
      for (int64_t k : idx) l.push_back((*obj->list)[static_cast<size_t>(k)]);
      return Value::List(std::move(l));
    }
    std::string s;
    for (int64_t k : idx) s += cps[static_cast<size_t>(k)];
    return Value::Str(std::move(s));
  }

  // --- Attributes and methods ---------------------------------------------

  absl::StatusOr<Value> Attribute(int line, const Value& obj, const std::string& name) {
    if (obj.IsDict()) {
      if (!obj.is_namespace && (name == "items" || name == "keys" || name == "values" || name == "get")) {
        return DictMethod(line, obj, name);
      }
      const Value* v = obj.dict->Find(name);
      return v ? *v : Value();
    }
    if (obj.IsString()) return StringMethod(line, obj, name);
    return Value();
  }

  Value DictMethod(int line, const Value& obj, const std::string& name) {
    std::shared_ptr<ValueDict> d = obj.dict;
    return Value::Function(name, [d, name, line](std::vector<Value>& pos, KwArgs& kw) -> absl::StatusOr<Value> {
      Args a{pos, kw};
      if (name == "get") {
        Value key = a.Get(0, "key");
        const Value* v = key.IsString() ? d->Find(key.s) : nullptr;
        return v ? *v : a.Get(1, "default", Value::None());
      }
      ValueList l;
      for (const auto& [k, v] : d->items) {
        if (name == "keys") l.push_back(Value::Str(k));
        else if (name == "values") l.push_back(v);
        else l.push_back(Value::List({Value::Str(k), v}));
      }
      (void)line;
      return Value::List(std::move(l));
    });
  }

  absl::StatusOr<Value> StringMethod(int line, const Value& obj, const std::string& name) {
    static const char* const kMethods[] = {"strip", "lstrip", "rstrip", "startswith", "endswith",
                                           "split", "upper", "lower", "replace", "title",
                                           "capitalize", "find", "count", "join", "isdigit",
                                           "isspace", "isalpha", "isupper", "islower"};
    bool known = false;
    for (const char* m : kMethods) known |= name == m;
    if (!known) return Value();
    const std::string s = obj.s;
    return Value::Function("str." + name, [this, s, name, line](std::vector<Value>& pos, KwArgs& kw) -> absl::StatusOr<Value> {
      Args a{pos, kw};
      auto str_arg = [&](size_t k, const char* n) -> absl::StatusOr<std::optional<std::string>> {
        Value v = a.Get(k, n);
        if (v.IsUndefined() || v.IsNone()) return std::optional<std::string>();
        if (!v.IsString()) {
          return LineError(line, absl::StrCat("str.", name, "() argument must be a string, not ", KindName(v)));
        }
        return std::optional<std::string>(v.s);
      };
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        auto chars = str_arg(0, "chars");
        if (!chars.ok()) return chars.status();
        const bool left = name != "rstrip", right = name != "lstrip";
        if (!chars->has_value()) {
          std::string_view v = s;
          if (left) v = LStripPy(v);
          if (right) v = RStripPy(v);
          return Value::Str(std::string(v));
        }
        return Value::Str(std::string(StripChars(s, **chars, left, right)));
      }
      if (name == "startswith" || name == "endswith") {
        Value p = a.Get(0, "prefix");
        std::vector<std::string> options;
        if (p.IsString()) {
          options.push_back(p.s);
        } else if (p.IsList()) {
          for (const Value& x : *p.list) {
            if (!x.IsString()) return LineError(line, absl::StrCat("str.", name, "() needs strings"));
            options.push_back(x.s);
          }
        } else {
          return LineError(line, absl::StrCat("str.", name, "() needs a string or a tuple of strings"));
        }
        for (const std::string& o : options) {
          const bool hit = name == "startswith"
                               ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                               : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
          if (hit) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      if (name == "split") {
        auto sep = str_arg(0, "sep");
        if (!sep.ok()) return sep.status();
        Value m = a.Get(1, "maxsplit", Value::Int(-1));
        if (m.kind != Value::Kind::kInt) return LineError(line, "str.split() maxsplit must be an integer");
        std::vector<std::string> parts;
        if (!sep->has_value()) {
          parts = SplitWhitespace(s, m.i);
        } else {
          if ((*sep)->empty()) return LineError(line, "str.split(): empty separator");
          parts = SplitSep(s, **sep, m.i);
        }
        ValueList l;
        for (auto& x : parts) l.push_back(Value::Str(std::move(x)));
        return Value::List(std::move(l));
      }
      if (name == "upper") return Value::Str(AsciiUpper(s));
      if (name == "lower") return Value::Str(AsciiLower(s));
      if (name == "title") return Value::Str(Title(s));
      if (name == "capitalize") return Value::Str(Capitalize(s));
      if (name == "replace") {
        auto from = str_arg(0, "old");
        auto to = str_arg(1, "new");
        if (!from.ok()) return from.status();
        if (!to.ok()) return to.status();
        if (!from->has_value() || !to->has_value()) return LineError(line, "str.replace() needs two strings");
        Value c = a.Get(2, "count", Value::Int(-1));
        std::string r = Replace(s, **from, **to, c.kind == Value::Kind::kInt ? c.i : -1);
        if (auto st = Charge(r.size()); !st.ok()) return st;
        return Value::Str(std::move(r));
      }
      if (name == "find" || name == "count") {
        auto sub = str_arg(0, "sub");
        if (!sub.ok()) return sub.status();
        if (!sub->has_value()) return LineError(line, absl::StrCat("str.", name, "() needs a string"));
        if (name == "find") {
          const size_t k = s.find(**sub);
          if (k == std::string::npos) return Value::Int(-1);
          return Value::Int(static_cast<int64_t>(CodePoints(std::string_view(s).substr(0, k)).size()));
        }
        if ((*sub)->empty()) return Value::Int(static_cast<int64_t>(CodePoints(s).size()) + 1);
        int64_t n = 0;
        for (size_t k = s.find(**sub); k != std::string::npos; k = s.find(**sub, k + (*sub)->size())) ++n;
        return Value::Int(n);
      }
      if (name == "join") {
        Value items = a.Get(0, "iterable");
        auto list = Iterate(line, items);
        if (!list.ok()) return list.status();
        std::string r;
        for (size_t k = 0; k < list->size(); ++k) {
          if (k) r += s;
          r += ToString((*list)[k]);
        }
        if (auto st = Charge(r.size()); !st.ok()) return st;
        return Value::Str(std::move(r));
      }
      // is*(): ASCII classes; false on the empty string, as in Python.
      if (s.empty()) return Value::Bool(false);
      bool all = true, any_cased = false;
      for (unsigned char c : s) {
        if (name == "isdigit") all &= c >= '0' && c <= '9';
        else if (name == "isspace") all &= PySpaceLength(std::string_view(reinterpret_cast<const char*>(&c), 1)) > 0;
        else if (name == "isalpha") all &= std::isalpha(c) != 0;
        else if (name == "isupper") { all &= !(c >= 'a' && c <= 'z'); any_cased |= c >= 'A' && c <= 'Z'; }
        else if (name == "islower") { all &= !(c >= 'A' && c <= 'Z'); any_cased |= c >= 'a' && c <= 'z'; }
      }
      if (name == "isupper" || name == "islower") return Value::Bool(all && any_cased);
      return Value::Bool(all);
    });
  }

  // --- Filters ------------------------------------------------------------

  absl::StatusOr<Value> ApplyFilter(int line, const std::string& name, Value in,
                                    std::vector<Value>& pos, KwArgs& kw) {
    Args a{pos, kw};
    auto bad = [&](const std::string& what) { return LineError(line, absl::StrCat("filter '", name, "': ", what)); };
    if (name == "trim") {
      if (!in.IsString()) in = Value::Str(ToString(in));
      Value chars = a.Get(0, "chars");
      if (chars.IsString()) return Value::Str(std::string(StripChars(in.s, chars.s, true, true)));
      return Value::Str(std::string(RStripPy(LStripPy(in.s))));
    }
    if (name == "tojson") {
      // transformers' signature: tojson(x, ensure_ascii=False, indent=None,
      // separators=None, sort_keys=False).
      JsonOptions o;
      o.ensure_ascii = Truthy(a.Get(0, "ensure_ascii"));
      Value indent = a.Get(1, "indent");
      if (indent.kind == Value::Kind::kInt) o.indent = static_cast<int>(std::clamp<int64_t>(indent.i, 0, 64));
      if (!a.Get(2, "separators").IsUndefined() && !a.Get(2, "separators").IsNone()) {
        return bad("separators= is not supported");
      }
      o.sort_keys = Truthy(a.Get(3, "sort_keys"));
      auto j = ToJson(in, o);
      if (!j.ok()) return bad(std::string(j.status().message()));
      if (auto st = Charge(j->size()); !st.ok()) return st;
      return Value::Str(std::move(j).value());
    }
    if (name == "length" || name == "count") {
      switch (in.kind) {
        case Value::Kind::kString: return Value::Int(static_cast<int64_t>(CodePoints(in.s).size()));
        case Value::Kind::kList: return Value::Int(static_cast<int64_t>(in.list->size()));
        case Value::Kind::kDict: return Value::Int(static_cast<int64_t>(in.dict->items.size()));
        case Value::Kind::kUndefined: return Value::Int(0);
        default: return bad(absl::StrCat(KindName(in), " has no length"));
      }
    }
    if (name == "upper") return Value::Str(AsciiUpper(ToString(in)));
    if (name == "lower") return Value::Str(AsciiLower(ToString(in)));
    if (name == "capitalize") return Value::Str(Capitalize(ToString(in)));
    if (name == "title") return Value::Str(Title(ToString(in)));
    if (name == "string") return Value::Str(ToString(in));
    if (name == "safe") return in;
    if (name == "default" || name == "d") {
      Value def = a.Get(0, "default_value", Value::Str(""));
      const bool boolean = Truthy(a.Get(1, "boolean", Value::Bool(false)));
      if (in.IsUndefined() || (boolean && !Truthy(in))) return def;
      return in;
    }
    if (name == "first" || name == "last") {
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      if (items->empty()) return Value();
      return name == "first" ? items->front() : items->back();
    }
    if (name == "join") {
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      Value sep = a.Get(0, "d", Value::Str(""));
      Value attr = a.Get(1, "attribute");
      std::string r;
      for (size_t k = 0; k < items->size(); ++k) {
        if (k) r += ToString(sep);
        Value v = (*items)[k];
        if (attr.IsString()) v = Item(v, attr);
        r += ToString(v);
      }
      if (auto st = Charge(r.size()); !st.ok()) return st;
      return Value::Str(std::move(r));
    }
    if (name == "replace") {
      Value from = a.Get(0, "old"), to = a.Get(1, "new"), count = a.Get(2, "count");
      if (!from.IsString() || !to.IsString()) return bad("needs two strings");
      std::string r = Replace(ToString(in), from.s, to.s, count.kind == Value::Kind::kInt ? count.i : -1);
      if (auto st = Charge(r.size()); !st.ok()) return st;
      return Value::Str(std::move(r));
    }
    if (name == "int" || name == "float") {
      const bool is_int = name == "int";
      Value def = a.Get(0, "default", is_int ? Value::Int(0) : Value::Float(0));
      double d = 0;
      switch (in.kind) {
        case Value::Kind::kInt: return is_int ? in : Value::Float(static_cast<double>(in.i));
        case Value::Kind::kBool: return is_int ? Value::Int(in.b) : Value::Float(in.b);
        case Value::Kind::kFloat: d = in.f; break;
        case Value::Kind::kString: {
          const std::string t(RStripPy(LStripPy(in.s)));
          char* end = nullptr;
          if (is_int) {
            errno = 0;
            const long long v = std::strtoll(t.c_str(), &end, 10);
            if (!t.empty() && end == t.c_str() + t.size() && errno == 0) return Value::Int(v);
          }
          end = nullptr;
          d = std::strtod(t.c_str(), &end);
          if (t.empty() || end != t.c_str() + t.size()) return def;
          break;
        }
        default:
          return def;
      }
      if (!is_int) return Value::Float(d);
      if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return def;
      return Value::Int(static_cast<int64_t>(d));
    }
    if (name == "abs") {
      if (in.kind == Value::Kind::kInt) return Value::Int(in.i < 0 ? -in.i : in.i);
      if (in.kind == Value::Kind::kFloat) return Value::Float(std::fabs(in.f));
      return bad(absl::StrCat("bad operand ", KindName(in)));
    }
    if (name == "round") {
      Value prec = a.Get(0, "precision", Value::Int(0));
      if (!in.IsNumber()) return bad("needs a number");
      const double scale = std::pow(10.0, prec.kind == Value::Kind::kInt ? static_cast<double>(prec.i) : 0.0);
      return Value::Float(std::round(in.AsDouble() * scale) / scale);
    }
    if (name == "list") {
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      return Value::List(std::move(items).value());
    }
    if (name == "reverse") {
      if (in.IsString()) {
        std::vector<std::string_view> cps = CodePoints(in.s);
        std::string r;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += *it;
        return Value::Str(std::move(r));
      }
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      std::reverse(items->begin(), items->end());
      return Value::List(std::move(items).value());
    }
    if (name == "items") {
      if (in.IsUndefined()) return Value::List();
      if (!in.IsDict()) return bad(absl::StrCat("needs a dict, not ", KindName(in)));
      ValueList l;
      for (const auto& [k, v] : in.dict->items) l.push_back(Value::List({Value::Str(k), v}));
      return Value::List(std::move(l));
    }
    if (name == "unique") {
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      ValueList l;
      for (const Value& v : *items) {
        bool seen = false;
        for (const Value& u : l) seen |= Equal(u, v);
        if (!seen) l.push_back(v);
      }
      return Value::List(std::move(l));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "selectattr" || name == "select";
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      size_t k = 0;
      Value attr;
      if (by_attr) attr = k < pos.size() ? pos[k++] : Value();
      std::string test = k < pos.size() && pos[k].IsString() ? pos[k++].s : "";
      std::vector<Value> test_args(pos.begin() + static_cast<long>(std::min(k, pos.size())), pos.end());
      ValueList l;
      for (const Value& item : *items) {
        Value v = item;
        if (by_attr) {
          if (!attr.IsString()) return bad("needs an attribute name");
          auto got = Attribute(line, item, attr.s);
          if (!got.ok()) return got.status();
          v = *got;
        }
        bool pass = false;
        if (test.empty()) {
          pass = Truthy(v);
        } else {
          auto r = ApplyTest(line, test, v, test_args);
          if (!r.ok()) return r.status();
          pass = *r;
        }
        if (pass == keep_if) l.push_back(item);
      }
      return Value::List(std::move(l));
    }
    if (name == "map") {
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      Value attr = a.Get(99, "attribute");
      ValueList l;
      if (attr.IsString()) {
        Value def = a.Get(99, "default");
        for (const Value& item : *items) {
          auto v = Attribute(line, item, attr.s);
          if (!v.ok()) return v.status();
          l.push_back(v->IsUndefined() ? def : *v);
        }
        return Value::List(std::move(l));
      }
      if (pos.empty() || !pos[0].IsString()) return bad("needs a filter name or attribute=");
      const std::string filter = pos[0].s;
      std::vector<Value> rest(pos.begin() + 1, pos.end());
      for (const Value& item : *items) {
        std::vector<Value> p = rest;
        KwArgs k2;
        auto v = ApplyFilter(line, filter, item, p, k2);
        if (!v.ok()) return v.status();
        l.push_back(std::move(v).value());
      }
      return Value::List(std::move(l));
    }
    if (name == "sort") {
      auto items = Iterate(line, in);
      if (!items.ok()) return items.status();
      const bool reverse = Truthy(a.Get(0, "reverse", Value::Bool(false)));
      Value attr = a.Get(2, "attribute");
      absl::Status err;
      std::vector<Value> keyed = *items;
      auto key = [&](const Value& v) { return attr.IsString() ? Item(v, attr) : v; };
      std::stable_sort(keyed.begin(), keyed.end(), [&](const Value& x, const Value& y) {
        auto r = reverse ? Less(key(y), key(x)) : Less(key(x), key(y));
        if (!r.ok()) {
          err = r.status();
          return false;
        }
        return *r;
      });
      if (!err.ok()) return bad(std::string(err.message()));
      return Value::List(std::move(keyed));
    }
    if (name == "indent") {
      Value width = a.Get(0, "width", Value::Int(4));
      const bool first = Truthy(a.Get(1, "first", Value::Bool(false)));
      const bool blank = Truthy(a.Get(2, "blank", Value::Bool(false)));
      const std::string pad = width.IsString() ? width.s : std::string(static_cast<size_t>(std::clamp<int64_t>(width.i, 0, 256)), ' ');
      std::vector<std::string> lines = SplitSep(ToString(in), "\n", -1);
      std::string r;
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k) r += "\n";
        const bool indent_it = (k > 0 || first) && (blank || !lines[k].empty());
        if (indent_it) r += pad;
        r += lines[k];
      }
      if (auto st = Charge(r.size()); !st.ok()) return st;
      return Value::Str(std::move(r));
    }
    return LineError(line, absl::StrCat("unknown filter '", name, "'"));
  }

  // --- Tests --------------------------------------------------------------

  absl::StatusOr<bool> ApplyTest(int line, const std::string& name, const Value& v,
                                 const std::vector<Value>& args) {
    auto arg = [&]() -> absl::StatusOr<Value> {
      if (args.empty()) return LineError(line, absl::StrCat("test '", name, "' needs an argument"));
      return args[0];
    };
    if (name == "defined") return !v.IsUndefined();
    if (name == "undefined") return v.IsUndefined();
    if (name == "none") return v.IsNone();
    if (name == "boolean") return v.kind == Value::Kind::kBool;
    if (name == "true") return v.kind == Value::Kind::kBool && v.b;
    if (name == "false") return v.kind == Value::Kind::kBool && !v.b;
    if (name == "integer") return v.kind == Value::Kind::kInt;
    if (name == "float") return v.kind == Value::Kind::kFloat;
    if (name == "number") return v.IsNumber() || v.kind == Value::Kind::kBool;
    if (name == "string") return v.IsString();
    if (name == "mapping") return v.IsDict();
    if (name == "sequence") return v.IsList() || v.IsString() || v.IsDict();
    if (name == "iterable") return v.IsList() || v.IsString() || v.IsDict();
    if (name == "callable") return v.kind == Value::Kind::kCallable;
    if (name == "lower") return v.IsString() && AsciiLower(v.s) == v.s;
    if (name == "upper") return v.IsString() && AsciiUpper(v.s) == v.s;
    if (name == "odd" || name == "even") {
      if (v.kind != Value::Kind::kInt) return LineError(line, absl::StrCat("test '", name, "' needs an integer"));
      return ((v.i % 2) != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
      auto d = arg();
      if (!d.ok()) return d.status();
      if (v.kind != Value::Kind::kInt || d->kind != Value::Kind::kInt || d->i == 0) {
        return LineError(line, "test 'divisibleby' needs integers (and a non-zero divisor)");
      }
      return v.i % d->i == 0;
    }
    static const std::map<std::string, std::string> kCompare = {
        {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="},
        {"lt", "<"},  {"lessthan", "<"}, {"<", "<"},   {"gt", ">"},  {"greaterthan", ">"},
        {">", ">"},   {"le", "<="},      {"<=", "<="}, {"ge", ">="}, {">=", ">="},
        {"in", "in"}};
    if (auto it = kCompare.find(name); it != kCompare.end()) {
      auto other = arg();
      if (!other.ok()) return other.status();
      return Compare(line, it->second, v, *other);
    }
    if (name == "sameas") {
      auto other = arg();
      if (!other.ok()) return other.status();
      if (v.kind != other->kind) return false;
      if (v.IsNone() || v.IsUndefined()) return true;
      if (v.kind == Value::Kind::kBool) return v.b == other->b;
      if (v.IsList()) return v.list == other->list;
      if (v.IsDict()) return v.dict == other->dict;
      return Equal(v, *other);
    }
    return LineError(line, absl::StrCat("unknown test '", name, "'"));
  }

  // --- Globals ------------------------------------------------------------

  void InstallBuiltins(std::unordered_map<std::string, Value>* root) {
    (*root)["raise_exception"] = Value::Function("raise_exception", [](std::vector<Value>& pos, KwArgs&) -> absl::StatusOr<Value> {
      return absl::InvalidArgumentError(pos.empty() ? std::string("raise_exception() called") : ToString(pos[0]));
    });
    (*root)["range"] = Value::Function("range", [this](std::vector<Value>& pos, KwArgs&) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : pos) {
        if (v.kind != Value::Kind::kInt) return absl::InvalidArgumentError("chat template: range() needs integers");
      }
      if (pos.size() == 1) {
        stop = pos[0].i;
      } else if (pos.size() == 2 || pos.size() == 3) {
        start = pos[0].i;
        stop = pos[1].i;
        if (pos.size() == 3) step = pos[2].i;
      } else {
        return absl::InvalidArgumentError("chat template: range() takes 1 to 3 arguments");
      }
      if (step == 0) return absl::InvalidArgumentError("chat template: range() step must not be zero");
      ValueList l;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (static_cast<int64_t>(l.size()) >= limits_.max_loop_iterations) {
          return absl::ResourceExhaustedError("chat template: range() too long");
        }
        l.push_back(Value::Int(k));
      }
      return Value::List(std::move(l));
    });
    auto make_dict = [](bool ns) {
      return [ns](std::vector<Value>& pos, KwArgs& kw) -> absl::StatusOr<Value> {
        ValueDict d;
        if (!pos.empty()) {
          if (pos.size() > 1 || !pos[0].IsDict()) {
            return absl::InvalidArgumentError(ns ? "chat template: namespace() takes a dict or keyword arguments"
                                                 : "chat template: dict() takes a dict or keyword arguments");
          }
          d = *pos[0].dict;
        }
        for (auto& [k, v] : kw) d.Set(k, v);
        Value v = Value::Dict(std::move(d));
        v.is_namespace = ns;
        return v;
      };
    };
    (*root)["namespace"] = Value::Function("namespace", make_dict(true));
    (*root)["dict"] = Value::Function("dict", make_dict(false));
  }

  const RenderLimits limits_;
  std::vector<Scope> scopes_;
  std::string* out_ = nullptr;
  size_t work_ = 0;
  int64_t iterations_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Render(const Body& body,
                                   const std::vector<std::pair<std::string, Value>>& globals,
                                   const RenderLimits& limits) {
  Interp interp(limits);
  return interp.Run(body, globals);
}

}  // namespace vc::jinja
