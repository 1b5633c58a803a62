// LoadTextTokenizer (format dispatch), the llama2.c tokenizer.bin adapter and
// IncrementalDetokenizer.
#include "common/tokenizer/text_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/internal/hf_tokenizer.h"
#include "common/tokenizer/internal/unicode.h"
#include "common/tokenizer/tokenizer.h"

namespace vc {
namespace {

namespace fs = std::filesystem;

// llama2.c's tokenizer.bin behind the TextTokenizer interface. Its special
// pieces are <unk> (0), <s> (1) and </s> (2); decoding never prints them (the
// format's own convention), with or without skip_special_tokens.
class Llama2cTextTokenizer : public TextTokenizer {
 public:
  explicit Llama2cTextTokenizer(Tokenizer tok) : tok_(std::move(tok)) {
    for (int32_t id = 0; id < tok_.vocab_size(); ++id) by_piece_.emplace(std::string(tok_.Piece(id)), id);
    config_.bos_token = "<s>";
    config_.eos_token = "</s>";
    config_.unk_token = "<unk>";
    config_.add_bos_token = true;
    config_.clean_up_tokenization_spaces = false;
  }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override {
    return tok_.Encode(std::string(text), add_special_tokens);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool /*skip_special_tokens*/) const override {
    return tok_.Decode(ids);
  }
  int vocab_size() const override { return tok_.vocab_size(); }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = by_piece_.find(std::string(token));
    if (it == by_piece_.end()) return std::nullopt;
    return it->second;
  }
  bool IsSpecial(int32_t id) const override { return id >= 0 && id <= 2 && id < tok_.vocab_size(); }
  const TokenizerConfig& config() const override { return config_; }

 private:
  Tokenizer tok_;
  std::unordered_map<std::string, int32_t> by_piece_;
  TokenizerConfig config_;
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  return buf.str();
}

// The number of whole pieces a llama2.c tokenizer.bin holds: after the int32
// max_token_length, each piece is a float32 score, an int32 length and that
// many bytes.
absl::StatusOr<int> CountLlama2cPieces(const std::string& path, const std::string& bytes) {
  if (bytes.size() < 4) return absl::InvalidArgumentError(absl::StrCat(path, ": too short for a tokenizer.bin"));
  size_t off = 4;
  int count = 0;
  while (off < bytes.size()) {
    if (bytes.size() - off < 8) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated piece ", count, " at offset ", off));
    }
    int32_t len = 0;
    std::memcpy(&len, bytes.data() + off + 4, 4);
    if (len < 0 || static_cast<size_t>(len) > bytes.size() - off - 8) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": piece ", count, " has a bad length ", len));
    }
    off += 8 + static_cast<size_t>(len);
    ++count;
  }
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": holds no pieces"));
  return count;
}

bool LooksLikeJson(const std::string& path, const std::string& bytes) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return true;
  for (char c : bytes) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    return c == '{';
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTextTokenizer(const std::string& path,
                                                                 const TextTokenizerOptions& options) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    file = (fs::path(path) / "tokenizer.json").string();
    if (!fs::exists(file, ec)) {
      return absl::NotFoundError(absl::StrCat(path, ": no tokenizer.json in this directory"));
    }
  } else if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  VC_ASSIGN_OR_RETURN(std::string bytes, ReadFile(file));
  if (LooksLikeJson(file, bytes)) {
    TokenizerConfig config;
    fs::path beside = fs::path(file).parent_path() / "tokenizer_config.json";
    if (fs::exists(beside, ec)) {
    VC_ASSIGN_OR_RETURN(config, LoadTokenizerConfig(beside.string()));
  }
    return tokenizer_internal::LoadHfTokenizerFromString(bytes, file, std::move(config));
  }
  int vocab = options.llama2c_vocab_size;
  if (vocab <= 0) {
    VC_ASSIGN_OR_RETURN(vocab, CountLlama2cPieces(file, bytes));
  }
  VC_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(file, vocab));
  return std::unique_ptr<TextTokenizer>(new Llama2cTextTokenizer(std::move(tok)));
}

// ------------------------------------------------------- IncrementalDetokenizer
//
// Each Push decodes a short window: a few context ids already accounted for,
// then the new ones. The new text is what the window's decode adds beyond the
// decode of its context. Text is held back while it ends in U+FFFD (a
// multi-byte character whose bytes are still arriving) or in a space that
// clean-up could still remove. When the context's decode is not a prefix of
// the window's (a decoder rule reached across the window), the whole sequence
// is decoded again once. Finish decodes everything once and hands out the
// rest, so the concatenation is exactly the one-shot Decode.

namespace {
constexpr size_t kContextIds = 16;
constexpr size_t kMaxHeldIds = 8;  // a UTF-8 character has at most 4 bytes
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const TextTokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is outside the vocabulary (size ", tokenizer_->vocab_size(), ")"));
  }
  ids_.push_back(id);
  std::span<const int32_t> all(ids_);
  VC_ASSIGN_OR_RETURN(std::string window, tokenizer_->Decode(all.subspan(prefix_offset_), skip_special_tokens_));
  if (EndsWith(window, kReplacement) && ids_.size() - read_offset_ < kMaxHeldIds) {
    return std::string();  // wait for the rest of the character
  }
  if (window.compare(0, prefix_text_.size(), prefix_text_) == 0) {
    pending_ += window.substr(prefix_text_.size());
  } else {
    VC_ASSIGN_OR_RETURN(std::string full, tokenizer_->Decode(all, skip_special_tokens_));
    if (full.compare(0, emitted_.size(), emitted_) != 0) {
      return absl::InternalError("incremental decode diverged from the full decode");
    }
    pending_ = full.substr(emitted_.size());
    emitted_bytes_ = emitted_.size();
  }
  read_offset_ = ids_.size();
  if (read_offset_ - prefix_offset_ > 2 * kContextIds) {
    prefix_offset_ = read_offset_ - kContextIds;
    VC_ASSIGN_OR_RETURN(prefix_text_, tokenizer_->Decode(all.subspan(prefix_offset_), skip_special_tokens_));
  } else {
    prefix_text_ = std::move(window);
  }
  // Hold back a trailing space (and what follows it, up to a contraction's
  // length) while clean-up could still rewrite it.
  size_t stable = pending_.size();
  if (tokenizer_->config().clean_up_tokenization_spaces) {
    size_t tail_start = pending_.size() >= 4 ? pending_.size() - 4 : 0;
    size_t space = pending_.find(' ', tail_start);
    if (space != std::string::npos) stable = space;
  }
  std::string out = pending_.substr(0, stable);
  pending_.erase(0, stable);
  emitted_ += out;
  emitted_bytes_ = emitted_.size();
  return out;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Finish() {
  VC_ASSIGN_OR_RETURN(std::string full, tokenizer_->Decode(ids_, skip_special_tokens_));
  if (full.compare(0, emitted_.size(), emitted_) != 0) {
    return absl::InternalError("incremental decode diverged from the full decode");
  }
  std::string rest = full.substr(emitted_.size());
  emitted_ = std::move(full);
  emitted_bytes_ = emitted_.size();
  pending_.clear();
  // Continuing after Finish starts from here.
  read_offset_ = ids_.size();
  prefix_offset_ = ids_.size() > kContextIds ? ids_.size() - kContextIds : 0;
  VC_ASSIGN_OR_RETURN(prefix_text_,
                      tokenizer_->Decode(std::span<const int32_t>(ids_).subspan(prefix_offset_), skip_special_tokens_));
  return rest;
}

}  // namespace vc
