// The `vericache` binary with Hugging Face inputs: `generate --model DIR` on
// the tinystories656K checkpoint directory, and `vericache chat-template`
// (exit codes, one-line errors, exact output bytes).
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/scratch_dir.h"
#include "tests/services/vericache/cli_runner.h"

namespace {

using vc::testing_cli::CountLines;
using vc::testing_cli::RunCli;
using vc::testing_cli::RunResult;

std::string Tinystories() {
  const char* d = std::getenv("VC_MODELS_DIR");
  const std::string dir = std::string(d ? d : "") + "/tinystories656K";
  return std::filesystem::is_directory(dir) ? dir : "";
}

std::string TemplatePath(const char* name) {
  return std::string(VC_SOURCE_DIR) + "/tests/data/chat_templates/" + name;
}

TEST(ChatCliTest, GenerateTakesAHuggingFaceDirectory) {
  const std::string dir = Tinystories();
  if (dir.empty()) GTEST_SKIP() << "tinystories656K not found (VC_MODELS_DIR)";
  const std::string prompt = " --prompt-ids '1 80 147 201 282 57' --max-new-tokens 24 --json";
  RunResult full = RunCli("generate --model " + dir + prompt);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const auto fj = nlohmann::json::parse(full.out);
  ASSERT_EQ(fj["tokens"].size(), 24u);
  RunResult spec = RunCli("generate --model " + dir + prompt + " --mode vericache --compressor kivi --bits 4");
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(nlohmann::json::parse(spec.out)["tokens"], fj["tokens"]);
}

TEST(ChatCliTest, RendersATemplateExactly) {
  const std::string messages =
      R"( --messages-json '[{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi \u00e9"}]')";
  RunResult r = RunCli("chat-template --template " + TemplatePath("chatml.jinja") + messages);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi \xc3\xa9<|im_end|>\n"
            "<|im_start|>assistant\n");
  r = RunCli("chat-template --chat-template " + TemplatePath("chatml.jinja") + messages +
             " --no-generation-prompt --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountLines(r.out), 1);
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"],
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi \xc3\xa9<|im_end|>\n");
}

TEST(ChatCliTest, TakesTheTemplateAndTokensFromATokenizerConfig) {
  const vc::test_support::ScratchDir scratch("chat_cli_");
  const std::string path = scratch / "tokenizer_config.json";
  {
    nlohmann::json config = {
        {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
        {"eos_token", "</s>"},
        {"chat_template",
         {{{"name", "tool_use"}, {"template", "unused"}},
          {{"name", "default"}, {"template", "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"}}}}};
    std::ofstream(path) << config.dump();
  }
  RunResult r = RunCli("chat-template --tokenizer-config " + path +
                       R"( --messages-json '[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]')");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[a][b]</s>");
  r = RunCli("chat-template --tokenizer-config " + path + " --bos-token '' --eos-token '!' --messages-json '[]'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "!");
  std::filesystem::remove(path);
}

TEST(ChatCliTest, BadInputIsExit2WithOneLine) {
  const std::string hi = R"( --messages-json '[{"role": "user", "content": "Hi"}]')";
  // A model without a chat template (the gateway answers 400 for it).
  const std::string dir = Tinystories();
  if (!dir.empty()) {
    RunResult r = RunCli("chat-template --tokenizer-config " + dir + "/tokenizer_config.json" + hi);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("no chat_template"), std::string::npos) << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
  }
  // The template's own raise_exception.
  RunResult r = RunCli("chat-template --template " + TemplatePath("gemma.jinja") +
                       R"( --messages-json '[{"role": "system", "content": "x"}]')");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "vericache chat-template: System role not supported\n");
  // Malformed messages, missing flags, a template that does not parse.
  r = RunCli("chat-template --template " + TemplatePath("chatml.jinja") + " --messages-json '[{\"role\": 1}]'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("message 0"), std::string::npos) << r.err;
  r = RunCli("chat-template --template " + TemplatePath("chatml.jinja") + " --messages-json 'nope'");
  EXPECT_EQ(r.exit_code, 2);
  r = RunCli("chat-template" + hi);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--template"), std::string::npos) << r.err;
  r = RunCli("chat-template --template /nonexistent/t.jinja" + hi);
  EXPECT_EQ(r.exit_code, 2);
  const vc::test_support::ScratchDir scratch("chat_cli_");
  const std::string bad = scratch / "bad.jinja";
  std::ofstream(bad) << "line one\n{% for m in messages %}{{ m.content }}";
  r = RunCli("chat-template --template " + bad + hi);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("endfor"), std::string::npos) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  std::filesystem::remove(bad);
}

}  // namespace
