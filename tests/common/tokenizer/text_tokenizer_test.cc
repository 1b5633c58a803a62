// Unit tests of the tokenizer.json components on small hand-made files whose
// answers follow from the format's definition, of tokenizer_config.json, of
// LoadTextTokenizer's dispatch and of IncrementalDetokenizer.
#include "common/tokenizer/text_tokenizer.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/tokenizer/internal/components.h"
#include "common/tokenizer/internal/hf_tokenizer.h"
#include "common/tokenizer/internal/precompiled.h"
#include "common/tokenizer/internal/regex.h"
#include "common/tokenizer/internal/unicode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/scratch_dir.h"

namespace vc {
namespace {

using tokenizer_internal::Json;
using tokenizer_internal::PreToken;

std::unique_ptr<TextTokenizer> FromJson(const Json& j, TokenizerConfig config = {}) {
  auto t = tokenizer_internal::LoadHfTokenizerFromString(j.dump(), "test.json", config);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<int32_t> Enc(const TextTokenizer& t, const std::string& s, bool special = false) {
  auto ids = t.Encode(s, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string Dec(const TextTokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  auto s = t.Decode(ids, skip);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

std::vector<std::string> Pre(const Json& j, const std::string& text, bool at_origin = true) {
  auto p = tokenizer_internal::MakePreTokenizer(j);
  EXPECT_TRUE(p.ok()) << p.status();
  std::vector<PreToken> pieces{{text, at_origin}};
  EXPECT_TRUE((*p)->PreTokenize(&pieces).ok());
  std::vector<std::string> out;
  for (auto& x : pieces) out.push_back(x.text);
  return out;
}

std::string Norm(const Json& j, std::string text) {
  auto n = tokenizer_internal::MakeNormalizer(j);
  EXPECT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE((*n)->Normalize(&text).ok());
  return text;
}

std::vector<std::string> DecodeChain(const Json& j, std::vector<std::string> tokens) {
  auto d = tokenizer_internal::MakeDecoder(j);
  EXPECT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE((*d)->DecodeChain(&tokens).ok());
  return tokens;
}

// A character-level BPE over "abc" with merges a+b -> ab, ab+c -> abc.
Json SmallBpe(Json merges) {
  return Json{{"model",
               {{"type", "BPE"},
                {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"ab", 4}, {"abc", 5}, {"bc", 6}}},
                {"merges", merges},
                {"unk_token", "<unk>"}}}};
}

TEST(BpeModel, MergesAsStringsOrPairsAgree) {
  auto a = FromJson(SmallBpe(Json::array({"a b", "ab c", "b c"})));
  auto b = FromJson(SmallBpe(Json::array({Json::array({"a", "b"}), Json::array({"ab", "c"}), Json::array({"b", "c"})})));
  EXPECT_EQ(Enc(*a, "abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ(Enc(*b, "abc"), (std::vector<int32_t>{5}));
  // Rank order decides: "b c" is last, so "abc" never splits as a + bc.
  EXPECT_EQ(Enc(*a, "bc"), (std::vector<int32_t>{6}));
  EXPECT_EQ(Enc(*a, "abab"), (std::vector<int32_t>{4, 4}));
}

TEST(BpeModel, UnknownCharactersAndFuseUnk) {
  Json j = SmallBpe(Json::array({"a b"}));
  auto plain = FromJson(j);
  EXPECT_EQ(Enc(*plain, "axxb"), (std::vector<int32_t>{1, 0, 0, 2}));
  j["model"]["fuse_unk"] = true;
  auto fused = FromJson(j);
  EXPECT_EQ(Enc(*fused, "axxb"), (std::vector<int32_t>{1, 0, 2}));
  // byte_fallback without <0xNN> pieces in the vocabulary: <unk>, fused.
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(Enc(*FromJson(j), "axxb"), (std::vector<int32_t>{1, 0, 2}));
}

TEST(BpeModel, ByteFallbackUsesBytePieces) {
  Json j = SmallBpe(Json::array({"a b"}));
  j["model"]["byte_fallback"] = true;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    j["model"]["vocab"][name] = 100 + b;
  }
  auto t = FromJson(j);
  // "é" is C3 A9.
  EXPECT_EQ(Enc(*t, "a\xC3\xA9"), (std::vector<int32_t>{1, 100 + 0xC3, 100 + 0xA9}));
  j["decoder"] = {{"type", "ByteFallback"}};
  auto d = FromJson(j);
  EXPECT_EQ(Dec(*d, {1, 100 + 0xC3, 100 + 0xA9}), "a\xC3\xA9");
}

TEST(BpeModel, IgnoreMergesAndAffixes) {
  Json j = SmallBpe(Json::array({"a b"}));
  j["model"]["vocab"]["abab"] = 7;
  EXPECT_EQ(Enc(*FromJson(j), "abab"), (std::vector<int32_t>{4, 4}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(Enc(*FromJson(j), "abab"), (std::vector<int32_t>{7}));

  Json w = {{"model",
             {{"type", "BPE"},
              {"vocab", {{"a", 0}, {"##b", 1}, {"##c</w>", 2}, {"a##b", 3}}},
              {"merges", {"a ##b"}},
              {"continuing_subword_prefix", "##"},
              {"end_of_word_suffix", "</w>"}}}};
  EXPECT_EQ(Enc(*FromJson(w), "abc"), (std::vector<int32_t>{3, 2}));
}

TEST(BpeModel, RejectsDropoutAndBadMerges) {
  Json j = SmallBpe(Json::array({"a b"}));
  j["model"]["dropout"] = 0.1;
  auto t = tokenizer_internal::LoadHfTokenizerFromString(j.dump(), "x.json", {});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("dropout"), std::string::npos);
  Json m = SmallBpe(Json::array({"a z"}));
  EXPECT_FALSE(tokenizer_internal::LoadHfTokenizerFromString(m.dump(), "x.json", {}).ok());
}

TEST(BpeModel, LongWordsMergeLikeShortOnes) {
  // The heap path (long words) and the rescan path (short words) agree.
  auto t = FromJson(SmallBpe(Json::array({"a b", "ab c", "b c"})));
  std::string word;
  std::vector<int32_t> want;
  for (int i = 0; i < 40; ++i) {
    word += "abcab";
    want.push_back(5);
    want.push_back(4);
  }
  EXPECT_EQ(Enc(*t, word), want);
}

TEST(UnigramModel, ViterbiPicksTheBestSegmentation) {
  Json j = {{"model",
             {{"type", "Unigram"},
              {"unk_id", 0},
              {"vocab", Json::array({Json::array({"<unk>", 0.0}), Json::array({"a", -1.0}), Json::array({"b", -1.0}),
                                     Json::array({"ab", -1.5}), Json::array({"abc", -5.0}),
                                     Json::array({"c", -2.0})})}}}};
  auto t = FromJson(j);
  EXPECT_EQ(Enc(*t, "ab"), (std::vector<int32_t>{3}));       // -1.5 beats -2
  EXPECT_EQ(Enc(*t, "abc"), (std::vector<int32_t>{3, 5}));   // -3.5 beats -5
  // Unknown characters score min - 10 and consecutive ones fuse.
  EXPECT_EQ(Enc(*t, "axyb"), (std::vector<int32_t>{1, 0, 2}));
}

TEST(UnigramModel, ByteFallback) {
  Json j = {{"model", {{"type", "Unigram"}, {"unk_id", 0}, {"byte_fallback", true}, {"vocab", Json::array()}}}};
  j["model"]["vocab"].push_back(Json::array({"<unk>", 0.0}));
  j["model"]["vocab"].push_back(Json::array({"a", -1.0}));
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    j["model"]["vocab"].push_back(Json::array({name, -3.0}));
  }
  auto t = FromJson(j);
  EXPECT_EQ(Enc(*t, "a\xC3\xA9"), (std::vector<int32_t>{1, 2 + 0xC3, 2 + 0xA9}));
}

TEST(Normalizers, Basics) {
  EXPECT_EQ(Norm({{"type", "Lowercase"}}, "ÀBC Σ"), "àbc σ");
  EXPECT_EQ(Norm({{"type", "NFC"}}, "e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(Norm({{"type", "NFD"}}, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Norm({{"type", "NFKC"}}, "\xEF\xAC\x81"), "fi");  // ligature fi
  EXPECT_EQ(Norm({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, " \t x \n"), "x \n");
  EXPECT_EQ(Norm({{"type", "Prepend"}, {"prepend", "_"}}, "x"), "_x");
  EXPECT_EQ(Norm({{"type", "Prepend"}, {"prepend", "_"}}, ""), "");
  EXPECT_EQ(Norm({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", "_"}}, "a  b c"), "a_b c");
  EXPECT_EQ(Norm({{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", "x"}}, "abab"), "xx");
  EXPECT_EQ(Norm({{"type", "Sequence"},
                  {"normalizers", {{{"type", "NFD"}}, {{"type", "StripAccents"}}, {{"type", "Lowercase"}}}}},
                 "Café"),
            "cafe");
}

TEST(PreTokenizers, SplitBehaviors) {
  auto split = [](const char* behavior, bool invert) {
    return Json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(Pre(split("Removed", false), "a-b--c"), (V{"a", "b", "c"}));
  EXPECT_EQ(Pre(split("Isolated", false), "a-b--c"), (V{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(Pre(split("MergedWithPrevious", false), "a-b--c"), (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(Pre(split("MergedWithNext", false), "a-b--c"), (V{"a", "-b", "-", "-c"}));
  EXPECT_EQ(Pre(split("Contiguous", false), "a-b--c"), (V{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(Pre(split("Removed", true), "a-b--c"), (V{"-", "-", "-"}));
}

TEST(PreTokenizers, GptPatterns) {
  using V = std::vector<std::string>;
  Json gpt2 = {{"type", "Split"},
               {"pattern", {{"Regex", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
               {"behavior", "Isolated"},
               {"invert", false}};
  EXPECT_EQ(Pre(gpt2, "I'm  here 123!!"), (V{"I", "'m", " ", " here", " 123", "!!"}));
  // Oniguruma's \s includes U+0085 (PCRE2's UCP \s does not).
  EXPECT_EQ(Pre(gpt2, "a\xC2\x85" "b"), (V{"a", "\xC2\x85", "b"}));
  Json llama3 = {{"type", "Split"},
                 {"pattern",
                  {{"Regex",
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                 {"behavior", "Removed"},
                 {"invert", true}};
  EXPECT_EQ(Pre(llama3, "DON'T 12345"), (V{"DON", "'T", " ", "123", "45"}));
  auto bl = Pre({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}, "hi there");
  EXPECT_EQ(bl, (V{"\xC4\xA0hi", "\xC4\xA0there"}));  // "Ġhi", "Ġthere"
  EXPECT_EQ(Pre({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}, "a b"),
            (V{"a\xC4\xA0" "b"}));
}

TEST(PreTokenizers, MetaspaceSchemes) {
  using V = std::vector<std::string>;
  auto ms = [](const char* scheme, bool split) {
    return Json{{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", scheme}, {"split", split}};
  };
  const std::string u = "\xE2\x96\x81";
  EXPECT_EQ(Pre(ms("always", true), "hi  there"), (V{u + "hi", u, u + "there"}));
  EXPECT_EQ(Pre(ms("always", false), "hi there"), (V{u + "hi" + u + "there"}));
  EXPECT_EQ(Pre(ms("never", false), "hi"), (V{"hi"}));
  EXPECT_EQ(Pre(ms("first", false), "hi", true), (V{u + "hi"}));
  EXPECT_EQ(Pre(ms("first", false), "hi", false), (V{"hi"}));
}

TEST(PreTokenizers, WhitespaceDigitsPunctuation) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pre({{"type", "Whitespace"}}, "Hey, friend!  ok"), (V{"Hey", ",", "friend", "!", "ok"}));
  EXPECT_EQ(Pre({{"type", "WhitespaceSplit"}}, " a\tb  c "), (V{"a", "b", "c"}));
  EXPECT_EQ(Pre({{"type", "Digits"}, {"individual_digits", true}}, "a123b"), (V{"a", "1", "2", "3", "b"}));
  EXPECT_EQ(Pre({{"type", "Digits"}, {"individual_digits", false}}, "a123b"), (V{"a", "123", "b"}));
  EXPECT_EQ(Pre({{"type", "Punctuation"}, {"behavior", "Isolated"}}, "a,b!"), (V{"a", ",", "b", "!"}));
}

TEST(Decoders, Basics) {
  using V = std::vector<std::string>;
  EXPECT_EQ(DecodeChain({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}, {"  a  "}), (V{" a "}));
  EXPECT_EQ(DecodeChain({{"type", "Fuse"}}, {"a", "b"}), (V{"ab"}));
  // Bytes that are not UTF-8 become one U+FFFD each.
  EXPECT_EQ(DecodeChain({{"type", "ByteFallback"}}, {"<0xE4>", "<0xBD>", "x"}),
            (V{"\xEF\xBF\xBD", "\xEF\xBF\xBD", "x"}));
  EXPECT_EQ(DecodeChain({{"type", "Replace"}, {"pattern", {{"String", "_"}}}, {"content", " "}}, {"_a_b"}),
            (V{" a b"}));
  EXPECT_EQ(DecodeChain({{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "always"}}, {"_a", "_b"}),
            (V{"a", " b"}));
  // ByteLevel: the alphabet back to bytes, repaired as UTF-8.
  EXPECT_EQ(DecodeChain({{"type", "ByteLevel"}}, {"\xC4\xA0hi", "\xC3\xA4"}), (V{" hi\xEF\xBF\xBD"}));
  EXPECT_EQ(DecodeChain({{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}, {"un", "##able", "."}),
            (V{"un", "able", "."}));
}

TEST(Components, UnknownTypesAreNamed) {
  for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    Json j = SmallBpe(Json::array({"a b"}));
    j[key] = {{"type", "Frobnicate"}};
    auto t = tokenizer_internal::LoadHfTokenizerFromString(j.dump(), "x.json", {});
    ASSERT_FALSE(t.ok()) << key;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("Frobnicate"), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find("x.json"), std::string::npos) << t.status();
  }
  Json m = {{"model", {{"type", "WordLevel"}, {"vocab", Json::object()}}}};
  auto t = tokenizer_internal::LoadHfTokenizerFromString(m.dump(), "x.json", {});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("WordLevel"), std::string::npos);
}

TEST(AddedTokens, FlagsAndPostProcessing) {
  Json j = SmallBpe(Json::array({"a b"}));
  j["added_tokens"] = {
      {{"id", 10}, {"content", "<s>"}, {"special", true}, {"lstrip", false}, {"rstrip", false},
       {"single_word", false}, {"normalized", false}},
      {{"id", 11}, {"content", "[R]"}, {"special", false}, {"rstrip", true}, {"normalized", false}},
      {{"id", 12}, {"content", "[L]"}, {"special", false}, {"lstrip", true}, {"normalized", false}},
      {{"id", 13}, {"content", "ab"}, {"special", false}, {"single_word", true}, {"normalized", false}},
  };
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {10}}, {"tokens", {"<s>"}}}}}}};
  auto t = FromJson(j);
  EXPECT_EQ(t->vocab_size(), 14);
  EXPECT_EQ(Enc(*t, "a<s>b"), (std::vector<int32_t>{1, 10, 2}));
  EXPECT_EQ(Enc(*t, "a", true), (std::vector<int32_t>{10, 1}));
  // rstrip eats the spaces after, lstrip the ones before (they are not in
  // the vocabulary, so they would otherwise be <unk>).
  EXPECT_EQ(Enc(*t, "a[R]  b"), (std::vector<int32_t>{1, 11, 2}));
  EXPECT_EQ(Enc(*t, "a  [L]b"), (std::vector<int32_t>{1, 12, 2}));
  // single_word: "ab" alone is the added token, inside "cabc" it is not.
  EXPECT_EQ(Enc(*t, "ab"), (std::vector<int32_t>{13}));
  EXPECT_EQ(Enc(*t, "cabc"), (std::vector<int32_t>{3, 4, 3}));
  EXPECT_TRUE(t->IsSpecial(10));
  EXPECT_FALSE(t->IsSpecial(11));
  EXPECT_EQ(t->TokenToId("<s>"), 10);
  EXPECT_EQ(t->TokenToId("abc"), 5);
  EXPECT_EQ(t->TokenToId("nope"), std::nullopt);
  // No decoder: tokens joined by spaces; skip_special_tokens drops <s>.
  EXPECT_EQ(Dec(*t, {10, 1, 2}), "<s> a b");
  EXPECT_EQ(Dec(*t, {10, 1, 2}, true), "a b");
  EXPECT_FALSE(t->Decode(std::vector<int32_t>{99}, false).ok());
  EXPECT_FALSE(t->Encode("\xC3", false).ok());  // not UTF-8
}

TEST(Decode, CleanUpTokenizationSpaces) {
  EXPECT_EQ(tokenizer_internal::CleanUpTokenizationSpaces("a , b . c ! d ? I 'm do n't it 's"),
            "a, b. c! d? I'm don't it's");
  Json j = SmallBpe(Json::array({"a b"}));
  j["model"]["vocab"]["."] = 20;
  TokenizerConfig off;
  off.clean_up_tokenization_spaces = false;
  EXPECT_EQ(Dec(*FromJson(j), {1, 20}), "a.");
  EXPECT_EQ(Dec(*FromJson(j, off), {1, 20}), "a .");
}

// A scratch directory (tests/scratch_dir.h) and a way to put a file in it.
class TempDir {
 public:
  std::string Write(const std::string& name, const std::string& bytes) const {
    std::string p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  const std::string& path() const { return dir_.path(); }

 private:
  test_support::ScratchDir dir_{"vc_tok_test_"};
};

TEST(TokenizerConfig, Fields) {
  TempDir d;
  std::string p = d.Write("tokenizer_config.json", R"({
    "bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}, "pad_token": null,
    "add_bos_token": true, "add_eos_token": false, "clean_up_tokenization_spaces": false,
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  auto c = LoadTokenizerConfig(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
  EXPECT_EQ(c->pad_token, std::nullopt);
  EXPECT_EQ(c->add_bos_token, true);
  EXPECT_EQ(c->add_eos_token, false);
  EXPECT_FALSE(c->clean_up_tokenization_spaces);
  EXPECT_EQ(c->chat_template, "D");
  auto bad = LoadTokenizerConfig(d.Write("bad.json", R"({"add_bos_token": "yes"})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("add_bos_token"), std::string::npos);
  EXPECT_EQ(LoadTokenizerConfig(d.path() + "/missing.json").status().code(), absl::StatusCode::kNotFound);
  auto empty = LoadTokenizerConfig(d.Write("empty.json", "{}"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->clean_up_tokenization_spaces);
}

TEST(LoadTextTokenizer, Dispatch) {
  TempDir d;
  EXPECT_EQ(LoadTextTokenizer(d.path()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadTextTokenizer(d.path() + "/nope.json").status().code(), absl::StatusCode::kNotFound);
  d.Write("tokenizer.json", SmallBpe(Json::array({"a b"})).dump());
  auto fromdir = LoadTextTokenizer(d.path());
  ASSERT_TRUE(fromdir.ok()) << fromdir.status();
  EXPECT_EQ(Enc(**fromdir, "ab"), (std::vector<int32_t>{4}));
  EXPECT_TRUE((*fromdir)->config().clean_up_tokenization_spaces);
  d.Write("tokenizer_config.json", R"({"clean_up_tokenization_spaces": false, "eos_token": "c"})");
  auto withcfg = LoadTextTokenizer(d.path() + "/tokenizer.json");
  ASSERT_TRUE(withcfg.ok());
  EXPECT_FALSE((*withcfg)->config().clean_up_tokenization_spaces);
  EXPECT_EQ((*withcfg)->config().eos_token, "c");
  auto bad = LoadTextTokenizer(d.Write("broken.json", "{not json"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // A llama2.c tokenizer.bin with its size read from the file: two pieces.
  std::string bin;
  auto put32 = [&](int32_t v) { bin.append(reinterpret_cast<const char*>(&v), 4); };
  auto putf = [&](float v) { bin.append(reinterpret_cast<const char*>(&v), 4); };
  put32(3);
  for (const char* piece : {"<unk>", "<s>", "</s>", "a"}) {
    putf(0.f);
    put32(static_cast<int32_t>(std::strlen(piece)));
    bin += piece;
  }
  auto l2c = LoadTextTokenizer(d.Write("tokenizer.bin", bin));
  ASSERT_TRUE(l2c.ok()) << l2c.status();
  EXPECT_EQ((*l2c)->vocab_size(), 4);
  EXPECT_EQ((*l2c)->TokenToId("a"), 3);
  EXPECT_TRUE((*l2c)->IsSpecial(1));
  auto truncated = LoadTextTokenizer(d.Write("t.bin", bin.substr(0, bin.size() - 1)));
  EXPECT_FALSE(truncated.ok());
}

// A hand-built darts-clone trie with one key, "a" -> "X": the root's offset
// leads to unit 1 ^ 'a' = 96, whose label is 'a' with a leaf below it at
// 96 ^ 1 = 97, whose value is offset 0 in the replacement strings.
TEST(Precompiled, DoubleArrayCharsmap) {
  std::vector<uint32_t> units(98, 0);
  units[0] = 1u << 10;                              // offset 1
  units[96] = 0x61u | (1u << 8) | (1u << 10);       // label 'a', has leaf, offset 1
  units[97] = (1u << 31) | 0u;                      // leaf: value 0
  std::string blob(4, '\0');
  uint32_t size = static_cast<uint32_t>(units.size() * 4);
  std::memcpy(blob.data(), &size, 4);
  blob.append(reinterpret_cast<const char*>(units.data()), units.size() * 4);
  blob += std::string("X\0", 2);
  auto map = tokenizer_internal::PrecompiledCharsmap::FromBytes(blob);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ((*map)->Transform("a"), "X");
  EXPECT_EQ((*map)->Transform("b"), std::nullopt);
  std::string text = "bab";
  ASSERT_TRUE((*map)->Normalize(&text).ok());
  EXPECT_EQ(text, "bXb");
  // A short grapheme cluster whose first character has a mapping is replaced
  // whole (the reference's rule): "a" + combining acute -> "X".
  text = "a\xCC\x81" "b";
  ASSERT_TRUE((*map)->Normalize(&text).ok());
  EXPECT_EQ(text, "Xb");
  EXPECT_FALSE(tokenizer_internal::PrecompiledCharsmap::FromBytes(std::string("\xFF\x00\x00\x00", 4)).ok());
  EXPECT_FALSE(tokenizer_internal::PrecompiledCharsmap::FromBase64("not base64!").ok());
}

TEST(Regex, OnigurumaEscapes) {
  auto find = [](const char* pattern, const std::string& text) {
    auto re = tokenizer_internal::Regex::Compile(pattern);
    EXPECT_TRUE(re.ok()) << re.status();
    std::vector<std::pair<size_t, size_t>> m;
    EXPECT_TRUE((*re)->FindAll(text, &m).ok());
    return m.size();
  };
  EXPECT_EQ(find("\\s", "\xC2\x85"), 1u);   // NEL is Oniguruma whitespace
  EXPECT_EQ(find("\\h+", "0aF g"), 1u);     // \h is a hex digit in Oniguruma
  EXPECT_EQ(find("(?i:'s)", "'S 's"), 2u);
  EXPECT_EQ(find("^a", "a\na"), 2u);        // ^ is a line anchor in Ruby syntax
  EXPECT_EQ(find(".", "\n"), 0u);
  EXPECT_FALSE(tokenizer_internal::Regex::Compile("(").ok());
}

TEST(Unicode, LossyUtf8) {
  using tokenizer_internal::Utf8Lossy;
  EXPECT_EQ(Utf8Lossy("a\xE4\xBD" "b"), "a\xEF\xBF\xBD" "b");              // truncated: one U+FFFD
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");           // overlong: one per byte
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x99\x82"), "\xF0\x9F\x99\x82");
}

// ------------------------------------------------------ IncrementalDetokenizer

std::string ModelsDir() {
  const char* d = std::getenv("VC_MODELS_DIR");
  return d ? d : "";
}

void ExpectStreamsLikeOneShot(const TextTokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer det(t, skip);
  std::string streamed;
  for (int32_t id : ids) {
    auto piece = det.Push(id);
    ASSERT_TRUE(piece.ok()) << piece.status();
    // Every piece is whole UTF-8 characters.
    EXPECT_EQ(tokenizer_internal::FindInvalidUtf8(*piece), std::string::npos);
    streamed += *piece;
  }
  auto rest = det.Finish();
  ASSERT_TRUE(rest.ok()) << rest.status();
  streamed += *rest;
  auto one_shot = t.Decode(ids, skip);
  ASSERT_TRUE(one_shot.ok());
  EXPECT_EQ(streamed, *one_shot);
}

TEST(IncrementalDetokenizer, ConcatenationIsTheOneShotDecode) {
  const std::string root = ModelsDir();
  if (root.empty()) GTEST_SKIP() << "VC_MODELS_DIR not set";
  const std::vector<std::string> texts = {
      "Once upon a time, there was a dog. He said: \"don't go!\"  Then ... they left .",
      "日本語のテキスト 🙂👍🏽 and 👨‍👩‍👧‍👦 mixed with English , ok ?",
      "<|endoftext|>text<|im_start|> a ' b n't 's\n\n\ttabs   spaces ",
  };
  std::vector<std::string> paths = {root + "/tinystories656K"};
  for (const char* name : {"gpt2", "llama2", "phi3", "minimind", "nmt-unigram", "dolma2"}) {
    paths.push_back(root + "/../tokenizers/" + name + "/tokenizer.json");
  }
  std::mt19937 rng(7);
  for (const auto& path : paths) {
    if (!std::filesystem::exists(path)) continue;
    SCOPED_TRACE(path);
    auto t = LoadTextTokenizer(path);
    ASSERT_TRUE(t.ok()) << t.status();
    for (const auto& text : texts) {
      auto ids = (*t)->Encode(text, true);
      ASSERT_TRUE(ids.ok());
      ExpectStreamsLikeOneShot(**t, *ids, false);
      ExpectStreamsLikeOneShot(**t, *ids, true);
    }
    // Random ids: partial UTF-8 sequences, byte pieces, specials anywhere.
    std::uniform_int_distribution<int32_t> any(0, (*t)->vocab_size() - 1);
    for (int round = 0; round < 5; ++round) {
      std::vector<int32_t> ids;
      for (int k = 0; k < 60; ++k) ids.push_back(any(rng));
      ExpectStreamsLikeOneShot(**t, ids, round % 2 == 0);
    }
  }
}

TEST(IncrementalDetokenizer, HoldsBackAPartialCharacter) {
  const std::string path = ModelsDir() + "/../tokenizers/gpt2/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "gpt2 tokenizer not found";
  auto t = LoadTextTokenizer(path);
  ASSERT_TRUE(t.ok());
  auto ids = (*t)->Encode("🙂", false);  // one emoji, several byte-level tokens
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 1u);
  IncrementalDetokenizer det(**t, false);
  for (size_t i = 0; i + 1 < ids->size(); ++i) EXPECT_EQ(*det.Push((*ids)[i]), "");
  EXPECT_EQ(*det.Push(ids->back()), "🙂");
  EXPECT_FALSE(det.Push(-1).ok());
}

}  // namespace
}  // namespace vc
