// Text <-> token ids for any supported model, behind one interface: a Hugging
// Face tokenizer.json (BPE or Unigram with its normaliser, pre-tokenizer,
// added tokens, post-processor and decoder) or a llama2.c tokenizer.bin.
// Callers (the CLI, the OpenAI gateway, the demo) hold a TextTokenizer and
// never know which format is behind it. Loading is done once per process;
// Encode/Decode are const and safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer_config.h"

namespace vc {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;

  // Ids for `text`, as Hugging Face's `encode(text, add_special_tokens=...)`:
  // with `add_special_tokens` the post-processor's special tokens (e.g. BOS)
  // are added; added-token strings inside `text` are always matched.
  [[nodiscard]] virtual absl::StatusOr<std::vector<int32_t>> Encode(
      std::string_view text, bool add_special_tokens) const = 0;

  // Text for `ids`, as `decode(ids, skip_special_tokens=...)` including the
  // clean-up of tokenization spaces the tokenizer's config asks for. An id
  // outside [0, vocab_size()) is InvalidArgument.
  [[nodiscard]] virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                                           bool skip_special_tokens) const = 0;

  // Number of ids (the largest id + 1, added tokens included).
  virtual int vocab_size() const = 0;

  // The id of a token given by its exact string (a vocabulary entry or an
  // added token), e.g. "</s>"; nullopt when there is none.
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;

  // Whether `id` is a special token (skipped by skip_special_tokens).
  virtual bool IsSpecial(int32_t id) const = 0;

  // tokenizer_config.json's contents (defaults when there was none).
  virtual const TokenizerConfig& config() const = 0;
};

struct TextTokenizerOptions {
  // For a llama2.c tokenizer.bin, the number of pieces to read (the model's
  // vocab_size); ignored for tokenizer.json.
  int llama2c_vocab_size = 0;
};

// Loads `path`: a tokenizer.json (a tokenizer_config.json beside it is read
// if present), a llama2.c tokenizer.bin, or a checkpoint directory holding a
// tokenizer.json. NotFound when nothing is there; InvalidArgument naming the
// file and the defect (including an unknown component type) otherwise.
[[nodiscard]] absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTextTokenizer(
    const std::string& path, const TextTokenizerOptions& options = {});

// Turns a stream of generated ids into text pieces whose concatenation is
// exactly the one-shot Decode of all ids so far; never emits a piece that
// ends inside a multi-byte UTF-8 character (it holds those bytes back until
// the character completes).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const TextTokenizer& tokenizer, bool skip_special_tokens);

  // The new text that `id` completes (possibly empty).
  [[nodiscard]] absl::StatusOr<std::string> Push(int32_t id);
  // Whatever is still held back at the end of the stream.
  [[nodiscard]] absl::StatusOr<std::string> Finish();

 private:
  const TextTokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t emitted_bytes_ = 0;
  // The decode window: ids [prefix_offset_, read_offset_) are context whose
  // decode is prefix_text_; ids from read_offset_ on are not accounted yet.
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  std::string prefix_text_;
  std::string pending_;  // decoded but held back
  std::string emitted_;  // everything handed out so far
};

}  // namespace vc
