// `vericache tokenize` / `vericache detokenize`: the CLI contract (JSON
// shapes, exact file bytes, empty inputs, exit codes and one-line errors) and
// agreement with Hugging Face's JavaScript tokenizer through the real binary.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/tokenizer/hf_reference.h"
#include "tests/scratch_dir.h"
#include "tests/services/vericache/cli_runner.h"

namespace {

using vc::testing_cli::RunCli;
using vc::testing_cli::RunResult;

std::string WriteFile(const std::string& name, const std::string& bytes) {
  static const vc::test_support::ScratchDir scratch("tokenize_cli_");  // goes at exit
  std::string path = scratch / name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string Q(const std::string& s) { return "'" + s + "'"; }  // paths here have no quotes

class TokenizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* d = std::getenv("VC_MODELS_DIR");
    models_ = d ? d : "";
    stories_ = models_ + "/tinystories656K";
    if (models_.empty() || !std::ifstream(stories_ + "/tokenizer.json").good()) {
      GTEST_SKIP() << "tinystories656K not found (VC_MODELS_DIR)";
    }
  }
  std::string models_, stories_;
};

TEST_F(TokenizeCliTest, JsonIdsAndSpecialTokens) {
  RunResult r = RunCli("tokenize --tokenizer " + Q(stories_) + " --text 'Once upon a time' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("ids"));
  std::vector<int> ids = j["ids"].get<std::vector<int>>();
  ASSERT_FALSE(ids.empty());
  // With special tokens the template's BOS (<|start_story|> = 1) comes first.
  RunResult s = RunCli("tokenize --tokenizer " + Q(stories_ + "/tokenizer.json") +
                       " --text 'Once upon a time' --add-special-tokens --json");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::vector<int> with = nlohmann::json::parse(s.out)["ids"].get<std::vector<int>>();
  ASSERT_EQ(with.size(), ids.size() + 1);
  EXPECT_EQ(with[0], 1);
  // Plain output: the same ids, space-separated.
  RunResult p = RunCli("tokenize --tokenizer " + Q(stories_) + " --text 'Once upon a time'");
  ASSERT_EQ(p.exit_code, 0);
  std::string want;
  for (size_t i = 0; i < ids.size(); ++i) want += (i ? " " : "") + std::to_string(ids[i]);
  EXPECT_EQ(p.out, want + "\n");
}

TEST_F(TokenizeCliTest, FileBytesAreTakenExactly) {
  std::string gpt2 = models_ + "/../tokenizers/gpt2/tokenizer.json";
  if (!std::ifstream(gpt2).good()) GTEST_SKIP() << "gpt2 tokenizer not found";
  std::string with_nl = WriteFile("with_nl", "hi\n");
  RunResult a = RunCli("tokenize --tokenizer " + Q(gpt2) + " --file " + Q(with_nl) + " --json");
  RunResult b = RunCli("tokenize --tokenizer " + Q(gpt2) + " --text hi --json");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, "{\"ids\":[5303,198]}\n");  // "hi" then "\n" (GPT-2 ids)
  EXPECT_EQ(b.out, "{\"ids\":[5303]}\n");
  std::string empty = WriteFile("empty", "");
  RunResult e = RunCli("tokenize --tokenizer " + Q(gpt2) + " --file " + Q(empty) + " --json");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.out, "{\"ids\":[]}\n");
}

TEST_F(TokenizeCliTest, DetokenizeJsonAndSkip) {
  RunResult e = RunCli("detokenize --tokenizer " + Q(stories_) + " --ids '' --json");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.out, "{\"text\":\"\"}\n");
  RunResult ids = RunCli("tokenize --tokenizer " + Q(stories_) + " --text 'The cat sat.' --add-special-tokens");
  ASSERT_EQ(ids.exit_code, 0);
  std::string list = ids.out.substr(0, ids.out.size() - 1);
  RunResult plain = RunCli("detokenize --tokenizer " + Q(stories_) + " --ids '" + list + "' --skip-special-tokens");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out, "The cat sat.\n");
  RunResult js = RunCli("detokenize --tokenizer " + Q(stories_) + " --ids '" + list + "' --json");
  ASSERT_EQ(js.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(js.out)["text"], "<|start_story|> The cat sat.");
}

TEST_F(TokenizeCliTest, Llama2cTokenizerBin) {
  std::string bin = models_ + "/aidreams260K.tok512.bin";
  if (!std::ifstream(bin).good()) GTEST_SKIP() << "aidreams tokenizer not found";
  RunResult r = RunCli("tokenize --tokenizer " + Q(bin) + " --text 'I dream of' --add-special-tokens --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<int> ids = nlohmann::json::parse(r.out)["ids"].get<std::vector<int>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);  // BOS
  std::string list;
  for (int id : ids) list += std::to_string(id) + " ";
  RunResult d = RunCli("detokenize --tokenizer " + Q(bin) + " --vocab-size 512 --ids '" + list + "' --json");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(nlohmann::json::parse(d.out)["text"], "I dream of");
}

TEST_F(TokenizeCliTest, BadInputIsExitTwoAndOneLine) {
  struct Case {
    std::string args;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"tokenize --text x", "--tokenizer is required"},
      {"tokenize --tokenizer " + Q(stories_), "exactly one of --text or --file"},
      {"tokenize --tokenizer " + Q(stories_) + " --text x --file y", "exactly one of --text or --file"},
      {"tokenize --tokenizer /nonexistent/tokenizer.json --text x", "no such file"},
      {"tokenize --tokenizer " + Q(stories_) + " --file /nonexistent", "cannot open"},
      {"detokenize --tokenizer " + Q(stories_), "--ids is required"},
      {"detokenize --tokenizer " + Q(stories_) + " --ids '1 x'", "not an integer"},
      {"detokenize --tokenizer " + Q(stories_) + " --ids '1 99999'", "outside the vocabulary"},
  };
  for (const auto& c : cases) {
    RunResult r = RunCli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << " -> " << r.err;
  }
  std::string bad = WriteFile("bad.json", "{\"model\": {\"type\": \"WordLevel\", \"vocab\": {}}}");
  RunResult r = RunCli("tokenize --tokenizer " + Q(bad) + " --text x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unsupported model type 'WordLevel'"), std::string::npos) << r.err;
}

// Through the real binary, the same ids and text as the JavaScript reference.
TEST_F(TokenizeCliTest, AgreesWithReference) {
  if (std::string why = vc::testing::ReferenceUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> texts = {"Once upon a time,  there was a dog.\n", "don't  stop 123 🙂",
                                          "<|start_story|>Hi<|end_story|>", " leading and trailing "};
  auto ref = vc::testing::RunReference(stories_ + "/tokenizer.json", texts);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string f = WriteFile("ref_text", texts[i]);
    for (bool special : {false, true}) {
      RunResult r = RunCli("tokenize --tokenizer " + Q(stories_) + " --file " + Q(f) + " --json" +
                           (special ? " --add-special-tokens" : ""));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>(),
                special ? (*ref)[i].ids_special : (*ref)[i].ids)
          << texts[i];
    }
    std::string list;
    for (int32_t id : (*ref)[i].ids_special) list += std::to_string(id) + " ";
    for (bool skip : {false, true}) {
      RunResult d = RunCli("detokenize --tokenizer " + Q(stories_) + " --ids '" + list + "' --json" +
                           (skip ? " --skip-special-tokens" : ""));
      ASSERT_EQ(d.exit_code, 0) << d.err;
      EXPECT_EQ(nlohmann::json::parse(d.out)["text"], skip ? (*ref)[i].decoded_skip : (*ref)[i].decoded) << texts[i];
    }
  }
}

}  // namespace
