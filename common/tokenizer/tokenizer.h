// Text <-> token ids for llama2.c-format models: loads a llama2.c tokenizer.bin
// (sentencepiece-style vocabulary with scores and <0xNN> byte-fallback pieces),
// encodes prompts by score-ordered BPE and decodes generated ids back to text,
// both as a whole sequence and one piece at a time for streaming output.
// Malformed files and bad ids give an absl::Status, never a crash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace vc {

class Tokenizer {
 public:
  // Loads a llama2.c tokenizer.bin: int32 max_token_length, then per id a
  // float32 score, an int32 byte length and the piece's bytes. `vocab_size` is
  // the number of pieces to read (the model's vocabulary, 512 for
  // aidreams260K); bytes after them are ignored. Errors: NotFound when the file
  // is missing, InvalidArgument naming the file and the defect when it is
  // truncated or corrupt.
  static absl::StatusOr<Tokenizer> Load(const std::string& path, int vocab_size);

  // Token ids for `text`: BOS first when `add_bos`; a space is put in front of
  // non-empty text (sentencepiece's "dummy prefix"); then BPE by score: start
  // from UTF-8 characters, repeatedly merge the adjacent pair whose
  // concatenation is a piece with the highest score (the leftmost such pair on
  // ties). Characters that are not pieces become their <0xNN> byte pieces,
  // which never merge. Fails only if a needed byte piece is missing from the
  // vocabulary.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool add_bos) const;

  // Text for a sequence of ids. <0xNN> pieces become the raw byte; <unk>, BOS
  // and EOS produce nothing; a piece that directly follows a BOS in `ids` loses
  // its leading space (llama2.c convention, undoing the dummy prefix), so
  // Decode(Encode(s, true)) == s. An id outside [0, vocab_size) is an
  // InvalidArgument error.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const;

  // The text of `id` when it follows `prev` (for streaming output); pass -1 as
  // `prev` when there is no previous token. Concatenating DecodePiece over a
  // sequence gives Decode of that sequence. `prev` is only compared with BOS,
  // so any value is accepted; `id` outside [0, vocab_size) is an error.
  absl::StatusOr<std::string> DecodePiece(int32_t prev, int32_t id) const;

  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  // The piece string of `id` as stored in the file (e.g. "<s>", "<0x0A>",
  // " the"); empty for an id outside [0, vocab_size).
  std::string_view Piece(int32_t id) const {
    return id >= 0 && id < vocab_size() ? std::string_view(pieces_[id]) : std::string_view();
  }
  int bos_id() const { return 1; }
  int eos_id() const { return 2; }

 private:
  // Lets the piece map be searched with a std::string_view without building a
  // std::string per lookup (the BPE loop does one lookup per candidate pair).
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, PieceHash, std::equal_to<>>;

  // Looks up a mergeable piece; -1 when `text` is not one.
  int32_t FindPiece(std::string_view text) const;
  absl::Status CheckId(int32_t id) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  // What each id decodes to: the piece text, the single raw byte for <0xNN>
  // pieces, empty for <unk>/BOS/EOS.
  std::vector<std::string> decoded_;
  // Text -> id for ordinary pieces only: control and byte-fallback pieces are
  // never produced by merging text (so "<0x41>" typed by a user stays text).
  PieceMap piece_to_id_;
  // Byte value -> id of its <0xNN> piece, -1 if the vocabulary has none.
  std::array<int32_t, 256> byte_to_id_{};
};

}  // namespace vc
