// The chat-template engine on its own: Jinja's whitespace rules as
// transformers configures them, expressions with Python semantics, filters,
// tests, loops and scoping, and a clear error (or ResourceExhausted) for
// every way a template can be wrong or run away. Expected strings are what
// Python's jinja2 renders (trim_blocks and lstrip_blocks on).
#include "common/chat/chat_template.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vc {
namespace {

using ::testing::HasSubstr;

ChatTemplateInputs Conversation(bool add_generation_prompt = true) {
  ChatTemplateInputs in;
  in.messages = {{"system", "Be kind."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "Bye?"}};
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.add_generation_prompt = add_generation_prompt;
  return in;
}

absl::StatusOr<std::string> Render(const std::string& source,
                                   const ChatTemplateInputs& in = Conversation(),
                                   const ChatTemplateLimits& limits = {}) {
  auto t = ChatTemplate::Parse(source, limits);
  if (!t.ok()) return t.status();
  return (*t)->Render(in);
}

std::string Ok(const std::string& source, const ChatTemplateInputs& in = Conversation()) {
  auto r = Render(source, in);
  EXPECT_TRUE(r.ok()) << source << "\n-> " << r.status();
  return r.ok() ? *r : "<error>";
}

void ExpectError(const std::string& source, absl::StatusCode code, const std::string& part,
                 const ChatTemplateLimits& limits = {}) {
  auto r = Render(source, Conversation(), limits);
  ASSERT_FALSE(r.ok()) << source << " rendered " << *r;
  EXPECT_EQ(r.status().code(), code) << source << ": " << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(part)) << source;
}

TEST(ChatTemplateTest, TemplateTextIsEmittedByteForByte) {
  EXPECT_EQ(Ok("a\tb  c\r\nd\x01\xc3\xa9{{ 'x' }}"), "a\tb  c\r\nd\x01\xc3\xa9x");
  EXPECT_EQ(Ok("{ not a tag } %} }} {"), "{ not a tag } %} }} {");
  // One trailing newline is dropped (keep_trailing_newline is off).
  EXPECT_EQ(Ok("hi\n"), "hi");
  EXPECT_EQ(Ok("hi\n\n"), "hi\n");
  EXPECT_EQ(Ok(""), "");
}

TEST(ChatTemplateTest, TrimAndLstripBlocks) {
  EXPECT_EQ(Ok("{% if true %}\nyes\n{% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(Ok("  {% if true %}\n  yes\n  {% endif %}\n"), "  yes\n");
  // Only blocks and comments: expressions keep their surroundings.
  EXPECT_EQ(Ok("  {{ 'a' }}\nb"), "  a\nb");
  // lstrip only applies at the start of a line.
  EXPECT_EQ(Ok("x  {% if true %}y{% endif %}"), "x  y");
  EXPECT_EQ(Ok("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(Ok("a {# note #} b"), "a  b");
  EXPECT_EQ(Ok("{#- c -#}  x {{ 1 }} y"), "x 1 y");
  // "+" keeps the indentation; "-" strips all whitespace, newlines included.
  EXPECT_EQ(Ok("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(Ok("a  \n {%- if true -%}  \n b {%- endif %}"), "ab");
  EXPECT_EQ(Ok("a \n{{- 'b' -}}\n c"), "abc");
  EXPECT_EQ(Ok("{% for m in messages %}\n  {{ m.role }}\n{% endfor %}"),
            "  system\n  user\n  assistant\n  user\n");
}

TEST(ChatTemplateTest, ExpressionsFollowPython) {
  EXPECT_EQ(Ok("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ 10 - 4 - 3 }}"), "7 9 1024 3");
  EXPECT_EQ(Ok("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }}"),
            "3 -4 1 2 3.5 2.0");
  // ~ binds tighter than + and looser than * (jinja2's parser).
  EXPECT_EQ(Ok("{{ 'a' ~ (1 + 2) }} {{ 'x' ~ 2 * 3 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'ab' * 2 }}"),
            "a3 x6 ab [1, 2] abab");
  ExpectError("{{ 'a' ~ 1 + 2 }}", absl::StatusCode::kInvalidArgument, "unsupported operand types for +");
  EXPECT_EQ(Ok("{{ none }} {{ true }} {{ [1, 'a', none] }} {{ {'k': 'v'} }} {{ 1.5 }} {{ 1e20 }} {{ 0.0001 }}"),
            "None True [1, 'a', None] {'k': 'v'} 1.5 1e+20 0.0001");
  EXPECT_EQ(Ok("{{ 'y' if 0 else 'n' }} {{ 0 or 'x' }} {{ 1 and 'z' }} {{ not 0 }} {{ 'q' if false }}."),
            "n x z True .");
  EXPECT_EQ(Ok("{{ 'b' in ['a', 'b'] }} {{ 'z' not in 'xyz' }} {{ 'k' in {'k': 1} }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "True False True True False");
  EXPECT_EQ(Ok("{{ 1 == 1.0 }} {{ 'a' != 'a' }} {{ [1, 2] == [1, 2] }} {{ 2 >= 2 }} {{ 'b' <= 'a' }}"),
            "True False True True False");
}

TEST(ChatTemplateTest, SubscriptsSlicesAndUnicode) {
  EXPECT_EQ(Ok("{{ 'abc'[::-1] }} {{ [1, 2, 3, 4][1:3] }} {{ [1, 2, 3][-1] }} {{ 'abcdef'[::2] }}"),
            "cba [2, 3] 3 ace");
  EXPECT_EQ(Ok("{{ 'h\xc3\xa9llo'[1] }} {{ 'h\xc3\xa9llo' | length }} {{ 'h\xc3\xa9llo'[::-1] }}"),
            "\xc3\xa9 5 oll\xc3\xa9h");
  EXPECT_EQ(Ok("{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }} {{ messages | length }}"),
            "system Hi! Bye? 4");
  EXPECT_EQ(Ok("{{ messages[1:] | map(attribute='role') | join(',') }}"), "user,assistant,user");
  EXPECT_EQ(Ok("[{{ [1][5] }}][{{ {'a': 1}.b }}]"), "[][]");
}

TEST(ChatTemplateTest, FiltersAndMethods) {
  EXPECT_EQ(Ok("{{ {'a': [1, '\xc3\xa9', none, true], 'b': {'c': 'q\"\\n'}} | tojson }}"),
            "{\"a\": [1, \"\xc3\xa9\", null, true], \"b\": {\"c\": \"q\\\"\\n\"}}");
  EXPECT_EQ(Ok("{{ [1, {'a': 2}] | tojson(indent=2) }}"), "[\n  1,\n  {\n    \"a\": 2\n  }\n]");
  EXPECT_EQ(Ok("{{ {'b': '\xc3\xa9\xf0\x9f\x8c\x8d', 'a': 1} | tojson(ensure_ascii=true, sort_keys=true) }}"),
            "{\"a\": 1, \"b\": \"\\u00e9\\ud83c\\udf0d\"}");
  EXPECT_EQ(Ok("{{ '  x  ' | trim }}|{{ 'Ab' | upper }}|{{ 'Ab' | lower }}|{{ 'hELLO' | capitalize }}|{{ 'a b' | title }}"),
            "x|AB|ab|Hello|A B");
  EXPECT_EQ(Ok("{{ nothing | default('d') }}|{{ '' | default('e') }}|{{ '' | default('e', true) }}"), "d||e");
  EXPECT_EQ(Ok("{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}{{ [3, 1, 2] | sort | list }}{{ [1, 1, 2] | unique | list }}"),
            "32[1, 2, 3][1, 2]");
  EXPECT_EQ(Ok("{{ ['a', 'b'] | join }}|{{ 'aXbX' | replace('X', '-') }}|{{ '12' | int + 1 }}|{{ 'x' | int }}|{{ 3 | string }}"),
            "ab|a-b-|13|0|3");
  EXPECT_EQ(Ok("{{ messages | selectattr('role', 'equalto', 'user') | list | length }} "
               "{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join('/') }}"),
            "2 Be kind./Hello.");
  EXPECT_EQ(Ok("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}"
               "{% for k, v in {'c': 3}.items() %}{{ k }}{{ v }}{% endfor %}"
               "{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('z', 'dflt') }}{{ {'a': 1}.get('z') }}"),
            "a=1;b=2;c31dfltNone");
  EXPECT_EQ(Ok("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'xxa'.lstrip('x') }}|{{ 'axx'.rstrip('x') }}"
               "|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'Hello'.startswith('He') }}"
               "|{{ 'Hello'.endswith(('x', 'lo')) }}|{{ 'hello world'.title() }}|{{ 'ab'.upper() }}"
               "|{{ 'aXa'.replace('a', 'b') }}"),
            "a b|a|a|a|['a', 'b', '', 'c']|['a', 'b']|True|True|Hello World|AB|bXb");
  EXPECT_EQ(Ok("{{ '\xe3\x80\x80 x \xc2\xa0' | trim }}."), "x.");  // Unicode spaces too
}

TEST(ChatTemplateTest, Tests) {
  EXPECT_EQ(Ok("{{ 'a' is string }} {{ 1 is number }} {{ none is none }} {{ x is defined }} {{ x is undefined }} "
               "{{ [1] is iterable }} {{ {} is mapping }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} "
               "{{ 1 is not string }} {{ true is boolean }} {{ 1 is integer }} {{ 1.0 is float }}"),
            "True True True False True True True True True True True True True True");
  EXPECT_EQ(Ok("{{ 'a' is eq('a') }} {{ 2 is gt 1 }} {{ 'ab' is lower }} {{ 'AB' is upper }}"), "True True True True");
}

TEST(ChatTemplateTest, LoopsAndScoping) {
  EXPECT_EQ(Ok("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
               "{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %}"),
            "10TrueFalse33;21FalseFalse32;32FalseTrue31;");
  EXPECT_EQ(Ok("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Ok("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"), "2242");
  EXPECT_EQ(Ok("{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "023");
  EXPECT_EQ(Ok("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
  EXPECT_EQ(Ok("{% for c in 'h\xc3\xa9' %}[{{ c }}]{% endfor %}"), "[h][\xc3\xa9]");
  // A plain set inside a loop does not leak out; a namespace does.
  EXPECT_EQ(Ok("{% set n = 0 %}{% for m in messages %}{% set n = n + 1 %}{% endfor %}{{ n }}"), "0");
  EXPECT_EQ(Ok("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"),
            "4");
  EXPECT_EQ(Ok("{% if true %}{% set x = 'in if' %}{% endif %}{{ x }}"), "in if");
  EXPECT_EQ(Ok("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
}

TEST(ChatTemplateTest, MacrosAndBlockSet) {
  EXPECT_EQ(Ok("{% macro m(x, y='Y') %}[{{ x }}{{ y }}]{% endmacro %}{{ m(1) }}{{ m(2, y='z') }}{{ m(x=3) }}"),
            "[1Y][2z][3Y]");
  EXPECT_EQ(Ok("{% set block %}{{ messages | length }} messages{% endset %}<{{ block | upper }}>"), "<4 MESSAGES>");
  EXPECT_EQ(Ok("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(ChatTemplateTest, InputsReachTheTemplate) {
  const std::string t =
      "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% else %}{{ eos_token }}{% endif %}";
  EXPECT_EQ(Ok(t), "<s><system>Be kind.<user>Hi!<assistant>Hello.<user>Bye?<assistant>");
  EXPECT_EQ(Ok(t, Conversation(false)), "<s><system>Be kind.<user>Hi!<assistant>Hello.<user>Bye?</s>");
  ChatTemplateInputs empty;
  EXPECT_EQ(Ok(t, empty), "<assistant>");
}

TEST(ChatTemplateTest, RaiseExceptionIsInvalidArgumentWithTheMessage) {
  auto r = Render("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "System role not supported");
}

TEST(ChatTemplateTest, UndefinedIsEmptyButLookupsThroughItFail) {
  EXPECT_EQ(Ok("[{{ nothing }}]{% if nothing %}x{% else %}y{% endif %}{% for a in nothing %}z{% endfor %}"), "[]y");
  ExpectError("{{ nothing.attr }}", absl::StatusCode::kInvalidArgument, "'nothing' is undefined");
  ChatTemplateInputs empty;
  auto r = Render("{{ messages[0]['role'] }}", empty);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("undefined"));
}

TEST(ChatTemplateTest, SyntaxErrorsNameTheLine) {
  ExpectError("{% if x %}\nno end", absl::StatusCode::kInvalidArgument, "endif");
  ExpectError("line one\n{{ 1 + }}", absl::StatusCode::kInvalidArgument, "line 2");
  ExpectError("{% frobnicate %}", absl::StatusCode::kInvalidArgument, "unknown or unsupported tag 'frobnicate'");
  ExpectError("{{ 'x }}", absl::StatusCode::kInvalidArgument, "unterminated string");
  ExpectError("{{ 'x'", absl::StatusCode::kInvalidArgument, "unclosed expression");
  ExpectError("{{ x }", absl::StatusCode::kInvalidArgument, "unclosed expression");
  ExpectError("{# never closed", absl::StatusCode::kInvalidArgument, "unclosed comment");
  ExpectError("{{ 'x' | nosuchfilter }}", absl::StatusCode::kInvalidArgument, "unknown filter 'nosuchfilter'");
  ExpectError("{{ 1 is nosuchtest }}", absl::StatusCode::kInvalidArgument, "unknown test 'nosuchtest'");
  ExpectError("{{ 1 / 0 }}", absl::StatusCode::kInvalidArgument, "division by zero");
  ExpectError("{{ 'a' - 1 }}", absl::StatusCode::kInvalidArgument, "unsupported operand");
  ExpectError("{{ undefined_fn() }}", absl::StatusCode::kInvalidArgument, "not callable");
  ExpectError("{% set x = 1 %}{% set x.a = 2 %}", absl::StatusCode::kInvalidArgument, "not a namespace");
  ExpectError("{% for a, b in [1] %}{% endfor %}", absl::StatusCode::kInvalidArgument, "unpack");
  ExpectError("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}",
              absl::StatusCode::kInvalidArgument, "nested too deeply");
  std::string deep_blocks;
  for (int i = 0; i < 300; ++i) deep_blocks += "{% if true %}";
  ExpectError(deep_blocks, absl::StatusCode::kInvalidArgument, "nested too deeply");
}

TEST(ChatTemplateTest, RunawayTemplatesAreBounded) {
  ChatTemplateLimits small;
  small.max_loop_iterations = 1000;
  small.max_output_bytes = 10000;
  small.max_work_bytes = 100000;
  small.max_call_depth = 16;
  ExpectError("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
              absl::StatusCode::kResourceExhausted, "loop iterations", small);
  ExpectError("{% for i in range(100) %}{{ 'x' * 200 }}{% endfor %}", absl::StatusCode::kResourceExhausted,
              "output exceeds", small);
  ExpectError("{% set ns = namespace(s='') %}{% for i in range(900) %}{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxxxxxx' %}{% endfor %}",
              absl::StatusCode::kResourceExhausted, "bytes of strings", small);
  ExpectError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", absl::StatusCode::kResourceExhausted,
              "nested deeper", small);
  ExpectError("{{ range(100000) | length }}", absl::StatusCode::kResourceExhausted, "range", small);
  ExpectError("{{ 'x' * 1000000000000 }}", absl::StatusCode::kResourceExhausted, "too large", small);
  // The defaults are generous enough for real conversations.
  ChatTemplateInputs many;
  for (int i = 0; i < 2000; ++i) many.messages.push_back({i % 2 ? "assistant" : "user", std::string(100, 'w')});
  auto r = Render("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{% endfor %}", many);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->size(), 200000u);
}

}  // namespace
}  // namespace vc
