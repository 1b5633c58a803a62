#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kAidreamsVocab = 512;
// Ids in the standard llama2.c layout: <unk>, <s>, </s>, then <0x00>..<0xFF>.
constexpr int32_t kBos = 1;
constexpr int32_t kEos = 2;
constexpr int32_t kFirstUserPiece = 259;
int32_t ByteId(uint8_t byte) { return byte + 3; }

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string TempPath(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "vc_tokenizer_test_" + info->name() + "_" + name;
}

template <typename T>
void AppendRaw(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

struct PieceSpec {
  std::string text;
  float score;
};

// Serialises a tokenizer.bin. With `standard_prefix`, ids 0..258 are <unk>,
// <s>, </s> and the 256 byte pieces, so `pieces[k]` gets id 259 + k.
std::string TokenizerBytes(const std::vector<PieceSpec>& pieces, bool standard_prefix = true) {
  std::vector<PieceSpec> all;
  if (standard_prefix) {
    all = {{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      all.push_back({name, 0});
    }
  }
  all.insert(all.end(), pieces.begin(), pieces.end());
  std::string out;
  AppendRaw<int32_t>(out, 16);
  for (const PieceSpec& p : all) {
    AppendRaw<float>(out, p.score);
    AppendRaw<int32_t>(out, static_cast<int32_t>(p.text.size()));
    out += p.text;
  }
  return out;
}

int TotalPieces(const std::vector<PieceSpec>& pieces) {
  return kFirstUserPiece + static_cast<int>(pieces.size());
}

Tokenizer LoadTiny(const std::vector<PieceSpec>& pieces, const std::string& name = "tiny.bin") {
  const std::string path = TempPath(name);
  WriteFileBytes(path, TokenizerBytes(pieces));
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(path, TotalPieces(pieces));
  EXPECT_TRUE(tok.ok()) << tok.status();
  std::remove(path.c_str());
  return *std::move(tok);
}

std::string AidreamsPath() {
  const char* dir = std::getenv("VC_MODELS_DIR");
  if (dir == nullptr) return "";
  return std::string(dir) + "/aidreams260K.tok512.bin";
}

// Literal, independent implementation of the README's rule, used as an oracle:
// parse the file, start from UTF-8 characters (byte pieces for unknown ones),
// rescan the whole sequence each step and merge the leftmost best-scoring pair.
class NaiveReferenceEncoder {
 public:
  explicit NaiveReferenceEncoder(const std::string& bytes, int vocab_size) {
    size_t offset = 4;
    for (int id = 0; id < vocab_size; ++id) {
      float score;
      int32_t length;
      std::memcpy(&score, bytes.data() + offset, 4);
      std::memcpy(&length, bytes.data() + offset + 4, 4);
      std::string piece = bytes.substr(offset + 8, length);
      offset += 8 + length;
      scores_.push_back(score);
      const bool is_byte_piece = piece.size() == 6 && piece.rfind("<0x", 0) == 0;
      if (id > 2 && !is_byte_piece && !ids_.count(piece)) ids_[piece] = id;
    }
  }

  std::vector<int32_t> Encode(const std::string& text) const {
    // (id, text) per symbol; text is empty for byte-fallback symbols, which never merge.
    std::vector<std::pair<int32_t, std::string>> symbols;
    const std::string s = " " + text;
    for (size_t i = 0; i < s.size();) {
      const auto lead = static_cast<uint8_t>(s[i]);
      size_t n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
      if (lead >= 0xF8 || (lead >= 0x80 && lead < 0xC0) || i + n > s.size()) n = 1;
      for (size_t k = 1; k < n; ++k) {
        if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) n = 1;
      }
      const std::string ch = s.substr(i, n);
      if (auto it = ids_.find(ch); it != ids_.end()) {
        symbols.push_back({it->second, ch});
      } else {
        for (char c : ch) symbols.push_back({ByteId(static_cast<uint8_t>(c)), ""});
      }
      i += n;
    }
    while (true) {
      float best_score = -1e30f;
      int best_index = -1;
      int32_t best_id = -1;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        if (symbols[i].second.empty() || symbols[i + 1].second.empty()) continue;
        auto it = ids_.find(symbols[i].second + symbols[i + 1].second);
        if (it != ids_.end() && scores_[it->second] > best_score) {
          best_score = scores_[it->second];
          best_index = static_cast<int>(i);
          best_id = it->second;
        }
      }
      if (best_index < 0) break;
      symbols[best_index] = {best_id, symbols[best_index].second + symbols[best_index + 1].second};
      symbols.erase(symbols.begin() + best_index + 1);
    }
    std::vector<int32_t> out = {kBos};
    for (const auto& sym : symbols) out.push_back(sym.first);
    return out;
  }

 private:
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;
};

class AidreamsTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = AidreamsPath();
    if (path_.empty()) GTEST_SKIP() << "VC_MODELS_DIR is not set";
    if (!std::ifstream(path_).good()) GTEST_SKIP() << path_ << " is missing";
    absl::StatusOr<Tokenizer> tok = Tokenizer::Load(path_, kAidreamsVocab);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_.emplace(*std::move(tok));
  }

  std::vector<int32_t> EncodeOrDie(const std::string& text, bool add_bos = true) {
    absl::StatusOr<std::vector<int32_t>> ids = tok_->Encode(text, add_bos);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  std::string DecodeOrDie(const std::vector<int32_t>& ids) {
    absl::StatusOr<std::string> text = tok_->Decode(ids);
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : "<decode failed>";
  }

  std::string path_;
  std::optional<Tokenizer> tok_;
};

TEST_F(AidreamsTokenizerTest, ReportsVocabularyAndSpecialIds) {
  EXPECT_EQ(tok_->vocab_size(), kAidreamsVocab);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
}

TEST_F(AidreamsTokenizerTest, EncodesDemoPromptToKnownIds) {
  // Expected ids worked out by hand from the vocabulary (and cross-checked with
  // a separate script): " I"=303, " d"=281, "re"=269, "a"=435, "m"=447,
  // " of"=275. "rea", " dre" and " dream" are not pieces.
  const std::vector<int32_t> ids = EncodeOrDie("I dream of");
  EXPECT_THAT(ids, ElementsAre(kBos, 303, 281, 269, 435, 447, 275));
  EXPECT_EQ(DecodeOrDie(ids), "I dream of");
}

TEST_F(AidreamsTokenizerTest, AddBosControlsOnlyTheLeadingBos) {
  const std::vector<int32_t> with_bos = EncodeOrDie("I dream of", true);
  const std::vector<int32_t> without_bos = EncodeOrDie("I dream of", false);
  ASSERT_FALSE(without_bos.empty());
  EXPECT_NE(without_bos.front(), kBos);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), without_bos);
  // Without a BOS in front nothing marks the dummy prefix, so its space stays.
  EXPECT_EQ(DecodeOrDie(without_bos), " I dream of");
}

TEST_F(AidreamsTokenizerTest, EmptyTextGetsNoDummyPrefix) {
  EXPECT_THAT(EncodeOrDie("", true), ElementsAre(kBos));
  EXPECT_TRUE(EncodeOrDie("", false).empty());
  EXPECT_EQ(DecodeOrDie({kBos}), "");
}

TEST_F(AidreamsTokenizerTest, MultiByteCharacterThatIsAPieceStaysWhole) {
  // "ö" is piece 508; " " is 429 and " ö" is not a piece.
  EXPECT_THAT(EncodeOrDie("ö"), ElementsAre(kBos, 429, 508));
}

TEST_F(AidreamsTokenizerTest, UnknownCharactersFallBackToBytePieces) {
  // Neither "é" nor "☃" is a piece: their UTF-8 bytes become <0xNN> ids.
  EXPECT_THAT(EncodeOrDie("é"), ElementsAre(kBos, 429, ByteId(0xC3), ByteId(0xA9)));
  EXPECT_THAT(EncodeOrDie("☃"), ElementsAre(kBos, 429, ByteId(0xE2), ByteId(0x98), ByteId(0x83)));
  // Newline has no piece either.
  const std::vector<int32_t> ids = EncodeOrDie("a\nb");
  EXPECT_NE(std::find(ids.begin(), ids.end(), ByteId('\n')), ids.end());
  EXPECT_EQ(DecodeOrDie(ids), "a\nb");
}

TEST_F(AidreamsTokenizerTest, TypedBytePieceNameIsEncodedAsText) {
  // "<0x41>" typed by a user is text, not the byte 'A'.
  const std::vector<int32_t> ids = EncodeOrDie("<0x41>");
  EXPECT_EQ(std::find(ids.begin(), ids.end(), ByteId('A')), ids.end());
  EXPECT_EQ(DecodeOrDie(ids), "<0x41>");
}

TEST_F(AidreamsTokenizerTest, RoundTripsManyStrings) {
  const std::vector<std::string> samples = {
      "I dream of",
      "a",
      " ",
      "  leading and trailing spaces  ",
      "Dimensions unfold, as I softly refine, as I adapt, a tapestry of light.",
      "The quick brown fox jumps over the lazy dog.",
      "Punctuation: !?.,;:'\"()[]{}<>@#$%^&*-_=+/\\|`~",
      "Digits 0123456789 and 3.14159, 1e-5, -42, 100%",
      "café ☃",
      "naïve façade, Ωμέγα, 日本語, emoji 🙂🚀",
      "line one\nline two\n\nline four\r\n\ttabbed",
      "ö°εabout λμ",
      "<unk> <s> </s> <0x0A>",
      std::string("embedded\0nul", 12),
      "\xff\xfe invalid utf-8 \xc3 \x80\x80 \xe2\x98",
  };
  for (const std::string& s : samples) {
    const std::vector<int32_t> ids = EncodeOrDie(s);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), kBos) << s;
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, kAidreamsVocab);
    }
    EXPECT_EQ(DecodeOrDie(ids), s);
  }
}

TEST_F(AidreamsTokenizerTest, RoundTripsRandomBytes) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(DecodeOrDie(EncodeOrDie(s)), s) << "trial " << trial;
  }
}

TEST_F(AidreamsTokenizerTest, MatchesNaiveReferenceRule) {
  const NaiveReferenceEncoder reference(ReadFileBytes(path_), kAidreamsVocab);
  std::vector<std::string> texts = {
      "I dream of",
      "Dimensions unfold, as I softly refine, as I softly refine, as I adapt, a tapestry of",
      "whispering currents of thought dissolve into shimmering patterns",
      "café ☃ ö°ε\nnew line",
  };
  // Random text over a small alphabet of common letters produces many
  // competing merges (and ties between repeated pairs).
  const std::string alphabet = "  aeinorstlhdgu.,I'";
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(1 + rng() % 80, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    texts.push_back(s);
  }
  // A prompt of a few thousand characters, as the engine will see.
  std::string long_text;
  while (long_text.size() < 3000) long_text += texts[1] + " " + texts[2] + ".\n";
  texts.push_back(long_text);
  for (const std::string& s : texts) {
    EXPECT_EQ(EncodeOrDie(s), reference.Encode(s)) << "text: \"" << s << "\"";
  }
}

TEST_F(AidreamsTokenizerTest, EncodesLongPromptQuickly) {
  std::string text;
  while (text.size() < 50000) text += "As I softly refine, a tapestry of dreams unfolds. 42\n";
  const std::vector<int32_t> ids = EncodeOrDie(text);
  // Merging happened (the 512-piece vocabulary compresses English only to
  // about 0.6 tokens per byte).
  EXPECT_LT(ids.size(), text.size() * 3 / 4);
  EXPECT_EQ(DecodeOrDie(ids), text);
}

TEST_F(AidreamsTokenizerTest, DecodeHandlesSpecialAndByteIds) {
  EXPECT_EQ(DecodeOrDie({0, kBos, kEos}), "");
  EXPECT_EQ(DecodeOrDie({ByteId(0xE2), ByteId(0x98), ByteId(0x83)}), "☃");
  // Only the piece right after a BOS loses its leading space.
  EXPECT_EQ(DecodeOrDie({kBos, 303, 275, kBos, 275}), "I ofof");
  EXPECT_EQ(DecodeOrDie({303, 275}), " I of");
}

TEST_F(AidreamsTokenizerTest, DecodePieceStreamsLikeDecode) {
  const std::vector<int32_t> ids = EncodeOrDie("I dream of café ☃, again.");
  std::string streamed;
  int32_t prev = -1;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = tok_->DecodePiece(prev, id);
    ASSERT_TRUE(piece.ok()) << piece.status();
    streamed += *piece;
    prev = id;
  }
  EXPECT_EQ(streamed, "I dream of café ☃, again.");
  EXPECT_EQ(*tok_->DecodePiece(kBos, 303), "I");
  EXPECT_EQ(*tok_->DecodePiece(-1, 303), " I");
  EXPECT_EQ(*tok_->DecodePiece(275, 303), " I");
}

TEST_F(AidreamsTokenizerTest, OutOfRangeIdsAreErrors) {
  for (int32_t bad : {-1, kAidreamsVocab, kAidreamsVocab + 1, INT32_MAX, INT32_MIN}) {
    const std::vector<int32_t> ids = {kBos, 303, bad, 275};
    absl::StatusOr<std::string> text = tok_->Decode(ids);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    absl::StatusOr<std::string> piece = tok_->DecodePiece(kBos, bad);
    EXPECT_EQ(piece.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // The last valid id still decodes.
  EXPECT_TRUE(tok_->DecodePiece(-1, kAidreamsVocab - 1).ok());
}

TEST_F(AidreamsTokenizerTest, LoadingFewerPiecesLimitsTheVocabulary) {
  absl::StatusOr<Tokenizer> small = Tokenizer::Load(path_, 300);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->vocab_size(), 300);
  EXPECT_FALSE(small->DecodePiece(-1, 300).ok());
  // Without single-letter pieces (ids >= 429) the letters fall back to bytes.
  absl::StatusOr<std::vector<int32_t>> ids = small->Encode("I", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(kBos, ByteId(' '), ByteId('I')));
}

// ---- Hand-checked BPE on tiny vocabularies written by the test -------------

// Ids: " "=259, "a"=260, "b"=261, "c"=262, then the pieces under test.
std::vector<PieceSpec> Letters() { return {{" ", -10}, {"a", -10}, {"b", -10}, {"c", -10}}; }
constexpr int32_t kSpace = 259, kA = 260, kB = 261, kC = 262, kNext = 263;

TEST(TinyTokenizerTest, HigherScoringPairMergesFirst) {
  // " abc": candidates "ab" and "bc"; "abc" is not a piece, so whichever pair
  // merges first decides the result.
  std::vector<PieceSpec> ab_wins = Letters();
  ab_wins.push_back({"ab", 2.0f});  // kNext
  ab_wins.push_back({"bc", 1.0f});  // kNext + 1
  EXPECT_THAT(*LoadTiny(ab_wins).Encode("abc", true), ElementsAre(kBos, kSpace, kNext, kC));

  std::vector<PieceSpec> bc_wins = Letters();
  bc_wins.push_back({"ab", 1.0f});
  bc_wins.push_back({"bc", 2.0f});
  EXPECT_THAT(*LoadTiny(bc_wins).Encode("abc", false), ElementsAre(kSpace, kA, kNext + 1));
}

TEST(TinyTokenizerTest, MergesRepeatUntilNoPairIsAPiece) {
  // " cab": "ab" (score 0) merges first, then "c"+"ab" = "cab" (score -1),
  // then " "+"cab" = " cab" (score -5). "ca" (score -0.5) beats "cab" but is
  // no longer adjacent once "ab" has formed.
  std::vector<PieceSpec> pieces = Letters();
  pieces.push_back({"ab", 0.0f});     // kNext
  pieces.push_back({"ca", -0.5f});    // kNext + 1
  pieces.push_back({"cab", -1.0f});   // kNext + 2
  pieces.push_back({" cab", -5.0f});  // kNext + 3
  const Tokenizer tok = LoadTiny(pieces);
  EXPECT_THAT(*tok.Encode("cab", true), ElementsAre(kBos, kNext + 3));
  EXPECT_EQ(*tok.Decode(*tok.Encode("cab", true)), "cab");
  // " ca": "ca" merges, then " "+"ca" is not a piece, so merging stops there.
  EXPECT_THAT(*tok.Encode("ca", true), ElementsAre(kBos, kSpace, kNext + 1));
  // " cb": no adjacent pair is a piece at all.
  EXPECT_THAT(*tok.Encode("cb", true), ElementsAre(kBos, kSpace, kC, kB));
}

TEST(TinyTokenizerTest, EqualScoresMergeTheLeftmostPair) {
  // " aaa" with "aa": merging the left pair gives [aa, a], the right [a, aa].
  std::vector<PieceSpec> pieces = Letters();
  pieces.push_back({"aa", 0.0f});  // kNext
  const Tokenizer tok = LoadTiny(pieces);
  EXPECT_THAT(*tok.Encode("aaa", true), ElementsAre(kBos, kSpace, kNext, kA));
  EXPECT_THAT(*tok.Encode("aaaa", true), ElementsAre(kBos, kSpace, kNext, kNext));
}

TEST(TinyTokenizerTest, DummyPrefixMergesWithTheFirstWord) {
  std::vector<PieceSpec> pieces = Letters();
  pieces.push_back({" a", 0.0f});  // kNext
  const Tokenizer tok = LoadTiny(pieces);
  EXPECT_THAT(*tok.Encode("a a", true), ElementsAre(kBos, kNext, kNext));
  EXPECT_EQ(*tok.Decode(*tok.Encode("a a", true)), "a a");
}

TEST(TinyTokenizerTest, CharactersOutsideTheVocabularyUseBytePieces) {
  const Tokenizer tok = LoadTiny(Letters());
  EXPECT_THAT(*tok.Encode("aq", true), ElementsAre(kBos, kSpace, kA, ByteId('q')));
  EXPECT_THAT(*tok.Encode("é", false), ElementsAre(kSpace, ByteId(0xC3), ByteId(0xA9)));
}

TEST(TinyTokenizerTest, BytePiecesNeverMerge) {
  // Even though "qq" is a piece, the two "q"s are byte fallbacks (no "q"
  // piece), and byte pieces are not text that can merge.
  std::vector<PieceSpec> pieces = Letters();
  pieces.push_back({"qq", 5.0f});
  const Tokenizer tok = LoadTiny(pieces);
  EXPECT_THAT(*tok.Encode("qq", true), ElementsAre(kBos, kSpace, ByteId('q'), ByteId('q')));
}

TEST(TinyTokenizerTest, DuplicatedPieceEncodesToItsFirstId) {
  std::vector<PieceSpec> pieces = Letters();
  pieces.push_back({"a", 3.0f});  // kNext: a second "a"
  const Tokenizer tok = LoadTiny(pieces);
  EXPECT_THAT(*tok.Encode("a", true), ElementsAre(kBos, kSpace, kA));
  EXPECT_EQ(*tok.Decode({{kBos, kSpace, kNext}}), "a");
}

TEST(TinyTokenizerTest, MissingBytePieceIsAnError) {
  // A vocabulary without <0xNN> pieces cannot encode an unknown character.
  const std::string path = TempPath("nobytes.bin");
  WriteFileBytes(path, TokenizerBytes({{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}, {" ", 0}, {"a", 0}},
                                      /*standard_prefix=*/false));
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(path, 5);
  std::remove(path.c_str());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*tok->Encode("aa", true), ElementsAre(kBos, 3, 4, 4));
  absl::StatusOr<std::vector<int32_t>> ids = tok->Encode("ab", true);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("0x62"));
}

// ---- Load errors -----------------------------------------------------------

TEST(TokenizerLoadTest, MissingFileIsNotFound) {
  const std::string path = TempPath("does_not_exist.bin");
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(path, 512);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tok.status().message(), HasSubstr(path));
}

absl::Status LoadBytes(const std::string& bytes, int vocab_size, std::string* path_out) {
  *path_out = TempPath("corrupt.bin");
  WriteFileBytes(*path_out, bytes);
  absl::Status status = Tokenizer::Load(*path_out, vocab_size).status();
  std::remove(path_out->c_str());
  return status;
}

TEST(TokenizerLoadTest, TruncatedFileIsInvalidArgumentAtEveryCut) {
  const std::string full = TokenizerBytes(Letters());
  const int vocab = TotalPieces(Letters());
  std::string path;
  ASSERT_TRUE(LoadBytes(full, vocab, &path).ok());
  // Every proper prefix is missing something; none may load or crash.
  for (size_t cut = 0; cut < full.size(); ++cut) {
    const absl::Status status = LoadBytes(full.substr(0, cut), vocab, &path);
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "cut at " << cut;
    EXPECT_THAT(status.message(), HasSubstr(path));
  }
  // A cut inside the last piece's bytes names that piece.
  const absl::Status status = LoadBytes(full.substr(0, full.size() - 1), vocab, &path);
  EXPECT_THAT(status.message(), HasSubstr("piece " + std::to_string(vocab - 1)));
}

TEST(TokenizerLoadTest, NegativePieceLengthIsInvalidArgument) {
  std::string bytes;
  AppendRaw<int32_t>(bytes, 16);
  for (int id = 0; id < 3; ++id) {
    AppendRaw<float>(bytes, 0.0f);
    AppendRaw<int32_t>(bytes, id == 2 ? -5 : 1);
    if (id != 2) bytes += "x";
  }
  bytes += std::string(64, 'x');  // plenty of bytes: the length itself is wrong
  std::string path;
  const absl::Status status = LoadBytes(bytes, 3, &path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_THAT(status.message(), HasSubstr("piece 2 length -5 is negative"));
}

TEST(TokenizerLoadTest, PieceRunningPastTheEndIsInvalidArgument) {
  std::string bytes;
  AppendRaw<int32_t>(bytes, 16);
  AppendRaw<float>(bytes, 0.0f);
  AppendRaw<int32_t>(bytes, INT32_MAX);
  bytes += "short";
  std::string path;
  const absl::Status status = LoadBytes(bytes, 3, &path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("piece 0"));
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
}

TEST(TokenizerLoadTest, NanScoreAndNegativeMaxLengthAreInvalidArgument) {
  std::string nan_score;
  AppendRaw<int32_t>(nan_score, 16);
  for (int id = 0; id < 3; ++id) {
    AppendRaw<float>(nan_score, id == 1 ? std::nanf("") : 0.0f);
    AppendRaw<int32_t>(nan_score, 1);
    nan_score += "x";
  }
  std::string path;
  EXPECT_THAT(LoadBytes(nan_score, 3, &path).message(), HasSubstr("piece 1 score is NaN"));

  std::string bad_header = TokenizerBytes(Letters());
  const int32_t negative = -1;
  std::memcpy(bad_header.data(), &negative, sizeof(negative));
  const absl::Status status = LoadBytes(bad_header, TotalPieces(Letters()), &path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("max_token_length"));
}

TEST(TokenizerLoadTest, VocabSizeLargerThanTheFileIsInvalidArgument) {
  std::string path;
  const absl::Status status =
      LoadBytes(TokenizerBytes(Letters()), TotalPieces(Letters()) + 1, &path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("piece " + std::to_string(TotalPieces(Letters()))));
}

TEST(TokenizerLoadTest, TooSmallVocabSizeIsInvalidArgument) {
  std::string path;
  for (int vocab : {-1, 0, 2}) {
    EXPECT_EQ(LoadBytes(TokenizerBytes(Letters()), vocab, &path).code(),
              absl::StatusCode::kInvalidArgument)
        << vocab;
  }
}

}  // namespace
}  // namespace vc
