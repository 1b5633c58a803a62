// Long tier: a seeded generated corpus of 10,000 random strings per shared
// tokenizer (scripts, emoji with joiners and skin tones, combining marks,
// whitespace runs, digit runs, the tokenizer's own added-token strings and
// fragments of them), compared with Hugging Face's JavaScript implementation
// as in hf_differential_test. For nmt-unigram the reference is given our
// normalisation (its Precompiled normaliser is an approximation).
#include <fstream>
#include <random>
#include <sstream>

#include "common/tokenizer/internal/unicode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/tokenizer/hf_reference.h"

namespace vc::testing {
namespace {

constexpr int kStrings = 10000;

std::vector<std::string> AddedTokenStrings(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  auto j = nlohmann::json::parse(buf.str());
  std::vector<std::string> out;
  for (const auto& t : j["added_tokens"]) out.push_back(t["content"].get<std::string>());
  return out;
}

std::string Generate(std::mt19937& rng, const std::vector<std::string>& added) {
  struct Range {
    char32_t lo, hi;
  };
  static const Range kScripts[] = {
      {0xC0, 0xFF},     {0x391, 0x3C9},   {0x410, 0x44F},   {0x5D0, 0x5EA},   {0x627, 0x64A},
      {0x905, 0x939},   {0x93E, 0x94C},   {0xE01, 0xE2E},   {0x10D0, 0x10F0}, {0x3041, 0x3096},
      {0x30A1, 0x30FA}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7A3}, {0x1F600, 0x1F64F}, {0x1F300, 0x1F3F0},
      {0x300, 0x36F},   {0x2000, 0x200A}, {0xFF01, 0xFF5E}, {0x2160, 0x217F}, {0x1D400, 0x1D433}};
  static const char* kWords[] = {"the", "The", "don't", "I'm", "they're", "hello", "WORLD", "naïve", "x", "foo_bar",
                                 "it's", "We'll", "ABC", "a.b", "(x)", "?!", "...", "--", "#", "@user", "http://a.b/c"};
  static const char* kSpace[] = {" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t ", "        "};
  std::string s;
  int parts = 1 + static_cast<int>(rng() % 12);
  for (int p = 0; p < parts; ++p) {
    switch (rng() % 8) {
      case 0:
      case 1:
        s += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
        break;
      case 2:
        s += kSpace[rng() % (sizeof(kSpace) / sizeof(kSpace[0]))];
        break;
      case 3: {
        int n = 1 + static_cast<int>(rng() % 20);
        for (int k = 0; k < n; ++k) s += static_cast<char>('0' + rng() % 10);
        break;
      }
      case 4:
      case 5: {
        const Range& r = kScripts[rng() % (sizeof(kScripts) / sizeof(kScripts[0]))];
        int n = 1 + static_cast<int>(rng() % 6);
        for (int k = 0; k < n; ++k) tokenizer_internal::AppendUtf8(r.lo + rng() % (r.hi - r.lo + 1), &s);
        break;
      }
      case 6: {
        // Emoji sequences: skin tones, ZWJ joiners, variation selectors.
        tokenizer_internal::AppendUtf8(0x1F466 + rng() % 4, &s);
        if (rng() % 2) tokenizer_internal::AppendUtf8(0x1F3FB + rng() % 5, &s);
        if (rng() % 2) {
          tokenizer_internal::AppendUtf8(0x200D, &s);
          tokenizer_internal::AppendUtf8(0x1F4BB, &s);
        }
        if (rng() % 3 == 0) tokenizer_internal::AppendUtf8(0xFE0F, &s);
        break;
      }
      case 7:
        if (!added.empty()) {
          const std::string& t = added[rng() % added.size()];
          // Whole, or a fragment that must not match.
          s += rng() % 3 ? t : t.substr(0, 1 + rng() % t.size());
        }
        break;
    }
  }
  return s;
}

class HfDifferentialLongTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfDifferentialLongTest, GeneratedCorpus) {
  if (std::string why = ReferenceUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  std::string path;
  for (const auto& [name, p] : SharedTokenizers()) {
    if (name == GetParam()) path = p;
  }
  if (path.empty()) GTEST_SKIP() << "shared tokenizer " << GetParam() << " not found";
  auto ours = LoadTextTokenizer(path);
  ASSERT_TRUE(ours.ok()) << ours.status();
  std::mt19937 rng(20240601u);
  std::vector<std::string> added = AddedTokenStrings(path);
  std::vector<std::string> texts;
  for (int i = 0; i < kStrings; ++i) texts.push_back(Generate(rng, added));
  const bool precompiled = GetParam() == "nmt-unigram";
  auto reference = RunReference(path, texts, precompiled ? ours->get() : nullptr);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<std::string> unused;
  std::vector<std::string> errors = Compare(**ours, texts, *reference, false, &unused);
  for (size_t i = 0; i < errors.size() && i < 50; ++i) ADD_FAILURE() << GetParam() << ": " << errors[i];
  EXPECT_TRUE(errors.empty()) << errors.size() << " disagreements over " << texts.size() << " strings";
}

INSTANTIATE_TEST_SUITE_P(Shared, HfDifferentialLongTest,
                         ::testing::ValuesIn(kSharedTokenizerNames),
                         [](const auto& info) { return SharedTokenizerTestName(info.param); });

}  // namespace
}  // namespace vc::testing
