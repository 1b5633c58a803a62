#include "common/base/flags.h"

#include "gtest/gtest.h"

namespace vc {
namespace {

struct Opts {
  std::string model;
  int64_t n = 5;
  float t = 0.5f;
  bool json = false;
  uint64_t seed = 0;
};

FlagSet MakeFlags(Opts* o) {
  FlagSet f("tool", "A tool.");
  f.Add("--model", &o->model, "PATH", "model path");
  f.Add("--n", &o->n, "N", "count");
  f.Add("--t", &o->t, "T", "temperature");
  f.Add("--seed", &o->seed, "S", "seed");
  f.AddBool("--json", &o->json, "json output");
  return f;
}

absl::Status ParseArgs(FlagSet& f, std::vector<const char*> args) {
  args.insert(args.begin(), "tool");
  return f.Parse(static_cast<int>(args.size()), args.data());
}

TEST(FlagsTest, ParsesBothSyntaxesAndKeepsDefaults) {
  Opts o;
  FlagSet f = MakeFlags(&o);
  ASSERT_TRUE(ParseArgs(f, {"--model", "m.bin", "--n=7", "--json"}).ok());
  EXPECT_EQ(o.model, "m.bin");
  EXPECT_EQ(o.n, 7);
  EXPECT_TRUE(o.json);
  EXPECT_FLOAT_EQ(o.t, 0.5f);
  EXPECT_TRUE(f.was_set("--n"));
  EXPECT_FALSE(f.was_set("--t"));
}

TEST(FlagsTest, RejectsBadInputWithTheFlagName) {
  struct Case {
    std::vector<const char*> args;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{{{"--n", "seven"}, "--n"},
                                         {{"--bogus"}, "unknown flag --bogus"},
                                         {{"--model"}, "needs a value"},
                                         {{"--t", "nan"}, "--t"},
                                         {{"--seed", "-3"}, "--seed"},
                                         {{"--json=maybe"}, "--json"},
                                         {{"positional"}, "unexpected argument"}}) {
    Opts o;
    FlagSet f = MakeFlags(&o);
    absl::Status s = ParseArgs(f, c.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(std::string(s.message()).find(c.needle), std::string::npos) << s.message();
  }
}

TEST(FlagsTest, HelpListsEveryFlagWithDefaults) {
  Opts o;
  FlagSet f = MakeFlags(&o);
  ASSERT_TRUE(ParseArgs(f, {"--help"}).ok());
  EXPECT_TRUE(f.help_requested());
  const std::string help = f.Help();
  for (const char* name : {"--model", "--n", "--t", "--seed", "--json", "--help"}) {
    EXPECT_NE(help.find(name), std::string::npos) << name;
  }
  EXPECT_NE(help.find("(default: 5)"), std::string::npos) << help;
}

}  // namespace
}  // namespace vc
