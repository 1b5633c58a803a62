// Private to common/chat: the parsed form of a chat template, and the parser
// that builds it. The lexer applies Jinja's whitespace rules as transformers
// configures them (trim_blocks and lstrip_blocks on, "-" strips, "+" keeps),
// so text nodes hold exactly the bytes to emit.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/internal/jinja_value.h"

namespace vc::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    kLiteral,    // value
    kName,       // name
    kList,       // args: elements (also tuples)
    kDict,       // kwargs: key expressions are args[2k], values args[2k+1]
    kAttr,       // args[0].name
    kItem,       // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]], absent parts null
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..])
    kUnary,      // op ("-", "+", "not") args[0]
    kBinary,     // args[0] op args[1]: + - * / // % ** ~ and or
    kCompare,    // args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in "not in"
    kCondition,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Type type = Type::kLiteral;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test or operator
  std::vector<std::string> ops;
  bool negated = false;  // "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Type { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  Type type = Type::kText;
  int line = 0;
  std::string text;                 // kText
  ExprPtr expr;                     // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: condition and body, in order
  Body body;                        // kFor, kSetBlock, kMacro
  Body else_body;                   // kIf else, kFor else
  std::vector<std::string> targets; // kFor/kSet names; kSet "ns.attr" as {"ns", "attr"} with attr set
  std::string attr;                 // kSet to an attribute of targets[0]
  ExprPtr filter;                   // kFor "if" condition
  std::string name;                 // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro, defaults may be null
};

// Parses a template. InvalidArgument with "line N: ..." on a syntax error or a
// construct outside the supported subset.
absl::StatusOr<Body> ParseTemplate(std::string_view source);

}  // namespace vc::jinja
