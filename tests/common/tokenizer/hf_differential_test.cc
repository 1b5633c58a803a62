// Differential test: every shared tokenizer.json, over a hand-written corpus
// (tests/common/tokenizer/testdata/tokenizer_corpus.json), against Hugging
// Face's JavaScript implementation: the same ids with and without special
// tokens, and the same decoded text with and without skip_special_tokens.
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "common/tokenizer/internal/hf_tokenizer.h"
#include "tests/common/tokenizer/hf_reference.h"

namespace vc::testing {
namespace {

std::vector<std::string> Corpus() {
  std::ifstream in(std::string(VC_TOKENIZER_TEST_DIR) + "/testdata/tokenizer_corpus.json");
  std::stringstream buf;
  buf << in.rdbuf();
  return nlohmann::json::parse(buf.str()).get<std::vector<std::string>>();
}

class HfDifferentialTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfDifferentialTest, MatchesReferenceOnCorpus) {
  if (std::string why = ReferenceUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  std::string path;
  for (const auto& [name, p] : SharedTokenizers()) {
    if (name == GetParam()) path = p;
  }
  if (path.empty()) GTEST_SKIP() << "shared tokenizer " << GetParam() << " not found";
  auto ours = LoadTextTokenizer(path);
  ASSERT_TRUE(ours.ok()) << ours.status();
  std::vector<std::string> texts = Corpus();
  ASSERT_GT(texts.size(), 100u);
  auto reference = RunReference(path, texts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<std::string> precompiled;
  bool exception = GetParam() == "nmt-unigram";
  std::vector<std::string> errors = Compare(**ours, texts, *reference, exception, &precompiled);
  for (const auto& e : errors) ADD_FAILURE() << GetParam() << ": " << e;
  // Where the normalisations differ only the Precompiled normaliser is
  // at fault: RestOfPipelineMatchesWithOurNormalization covers those texts.
  if (exception) {
    EXPECT_GT(precompiled.size(), 0u);
    std::cout << precompiled.size() << " of " << texts.size()
              << " texts normalise differently (Precompiled charsmap vs the reference's NFKC)\n";
  } else {
    EXPECT_TRUE(precompiled.empty());
  }
}

// The Precompiled normaliser is the one allowed difference: the reference
// approximates it with NFKC and whitespace rules, while the charsmap of this
// tokenizer (a factored-case NMT vocabulary) maps "A" to "Ua" and "(" to "P(".
// Everything after the normaliser is still compared: the reference is given
// our normalisation of every section it normalises.
TEST(HfDifferentialPrecompiled, RestOfPipelineMatchesWithOurNormalization) {
  if (std::string why = ReferenceUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  std::string path;
  for (const auto& [name, p] : SharedTokenizers()) {
    if (name == "nmt-unigram") path = p;
  }
  if (path.empty()) GTEST_SKIP() << "shared tokenizer nmt-unigram not found";
  auto ours = LoadTextTokenizer(path);
  ASSERT_TRUE(ours.ok()) << ours.status();
  std::vector<std::string> texts = Corpus();
  auto reference = RunReference(path, texts, ours->get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<std::string> unused;
  for (const auto& e : Compare(**ours, texts, *reference, false, &unused)) ADD_FAILURE() << "nmt-unigram: " << e;
}

// The difference itself, pinned: what the charsmap does where NFKC would do
// something else, and that the reference indeed approximates.
TEST(HfDifferentialPrecompiled, DocumentedDifferences) {
  if (std::string why = ReferenceUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  std::string path;
  for (const auto& [name, p] : SharedTokenizers()) {
    if (name == "nmt-unigram") path = p;
  }
  if (path.empty()) GTEST_SKIP() << "shared tokenizer nmt-unigram not found";
  auto ours = LoadTextTokenizer(path);
  ASSERT_TRUE(ours.ok()) << ours.status();
  struct Case {
    std::string text, ours, reference;
  };
  const std::vector<Case> cases = {
      // Upper case becomes a "U" factor before the lower-case letter.
      {"ALL", "UaUlUl", "ALL"},
      // Punctuation gets a "P" factor.
      {"a.", "aP.", "a."},
      // Full-width letters are lower-cased but not folded to ASCII.
      {"\xEF\xBC\xA1", "U\xEF\xBD\x81", "A"},
      // Circled digits are left alone (NFKC would give "1").
      {"\xE2\x91\xA0", "\xE2\x91\xA0", "1"},
      // A newline inside the text is kept (the reference makes it a space).
      {"a\nb", "a\nb", "a b"},
  };
  std::vector<std::string> texts;
  for (const auto& c : cases) texts.push_back(c.text);
  auto reference = RunReference(path, texts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (size_t i = 0; i < cases.size(); ++i) {
    auto norm = tokenizer_internal::NormalizeForTest(**ours, cases[i].text);
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_EQ(*norm, cases[i].ours) << Quote(cases[i].text);
    ASSERT_TRUE((*reference)[i].normalized.has_value());
    EXPECT_EQ(*(*reference)[i].normalized, cases[i].reference) << Quote(cases[i].text);
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, HfDifferentialTest,
                         ::testing::ValuesIn(kSharedTokenizerNames),
                         [](const auto& info) { return SharedTokenizerTestName(info.param); });

}  // namespace
}  // namespace vc::testing
