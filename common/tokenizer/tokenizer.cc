#include "common/tokenizer/tokenizer.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"

namespace vc {
namespace {

// The file stores little-endian values; we read them with memcpy.
static_assert(std::endian::native == std::endian::little,
              "tokenizer.bin reading assumes a little-endian host");

constexpr int32_t kUnkId = 0;
constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;

// Bounds-checked reader over the mapped file; every read failure names the file
// and what was being read, so a corrupt download is easy to diagnose.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* data, size_t size)
      : path_(path), data_(data), size_(size) {}

  // The next n bytes, viewed in place: nothing is allocated before the length
  // is known to fit, so a corrupt 2 GiB length costs nothing.
  absl::StatusOr<std::string_view> ReadBytes(size_t n, const std::string& what) {
    if (n > size_ - offset_) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": truncated tokenizer file: ", what, " needs ", n, " bytes at offset ", offset_,
          " but the file has ", size_ - offset_, " left"));
    }
    const std::string_view bytes(reinterpret_cast<const char*>(data_) + offset_, n);
    offset_ += n;
    return bytes;
  }

  template <typename T>
  absl::Status ReadValue(T& out, const std::string& what) {
    VC_ASSIGN_OR_RETURN(const std::string_view bytes, ReadBytes(sizeof(T), what));
    std::memcpy(&out, bytes.data(), sizeof(T));
    return absl::OkStatus();
  }

  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": corrupt tokenizer file: ", what, " (offset ", offset_, ")"));
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte a "<0xNN>" byte-fallback piece stands for, or nullopt.
std::optional<uint8_t> ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return std::nullopt;
  const int hi = HexDigit(piece[3]);
  const int lo = HexDigit(piece[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

// Length of the UTF-8 character starting at text[pos], or 1 when the bytes
// there are not a well-formed sequence (the stray byte then stands alone and
// takes the byte fallback, so any input still round-trips).
size_t Utf8CharLength(std::string_view text, size_t pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  size_t len = 1;
  if ((lead & 0xE0) == 0xC0) {
    len = 2;
  } else if ((lead & 0xF0) == 0xE0) {
    len = 3;
  } else if ((lead & 0xF8) == 0xF0) {
    len = 4;
  }
  if (len > text.size() - pos) return 1;
  for (size_t i = 1; i < len; ++i) {
    if ((static_cast<uint8_t>(text[pos + i]) & 0xC0) != 0x80) return 1;
  }
  return len;
}

// One symbol of the BPE working sequence: a byte range of the (prefixed) text,
// kept in a doubly linked list so a merge is O(1).
struct Symbol {
  size_t start;
  size_t length;
  int32_t id;
  int prev;        // index into the symbol vector, -1 at the front
  int next;        // -1 at the back
  bool mergeable;  // false for byte-fallback symbols and for merged-away ones
};

// A candidate merge of symbols[left] with symbols[right]. Entries go stale when
// either side changes; `length` (the merged byte length) detects that, because
// a symbol only ever grows to the right and its start never moves.
struct Candidate {
  float score;
  int left;
  int right;
  size_t length;
  int32_t id;
};

// Highest score first; on equal scores the leftmost pair, matching the naive
// "scan left to right, keep the first strictly better pair" rule.
struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& path, int vocab_size) {
  if (vocab_size <= kEosId) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": vocab_size ", vocab_size,
                                                   " is too small (ids 0..2 are <unk>, BOS, EOS)"));
  }
  VC_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  Reader reader(path, file.data(), file.size());

  int32_t max_token_length = 0;
  VC_RETURN_IF_ERROR(reader.ReadValue(max_token_length, "max_token_length"));
  if (max_token_length < 0) {
    return reader.Error(absl::StrCat("max_token_length ", max_token_length, " is negative"));
  }

  Tokenizer tok;
  tok.pieces_.reserve(vocab_size);
  tok.scores_.reserve(vocab_size);
  for (int id = 0; id < vocab_size; ++id) {
    const std::string piece_name = absl::StrCat("piece ", id);
    float score = 0;
    VC_RETURN_IF_ERROR(reader.ReadValue(score, absl::StrCat(piece_name, " score")));
    if (std::isnan(score)) return reader.Error(absl::StrCat(piece_name, " score is NaN"));
    int32_t length = 0;
    VC_RETURN_IF_ERROR(reader.ReadValue(length, absl::StrCat(piece_name, " length")));
    if (length < 0) {
      return reader.Error(absl::StrCat(piece_name, " length ", length, " is negative"));
    }
    VC_ASSIGN_OR_RETURN(const std::string_view piece,
                        reader.ReadBytes(static_cast<size_t>(length),
                                         absl::StrCat(piece_name, " (length ", length, ")")));
    tok.pieces_.emplace_back(piece);
    tok.scores_.push_back(score);
  }

  tok.byte_to_id_.fill(-1);
  tok.decoded_.resize(vocab_size);
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string& piece = tok.pieces_[id];
    if (id == kUnkId || id == kBosId || id == kEosId) continue;  // decode to nothing
    if (const std::optional<uint8_t> byte = ParseBytePiece(piece)) {
      tok.decoded_[id] = std::string(1, static_cast<char>(*byte));
      if (tok.byte_to_id_[*byte] < 0) tok.byte_to_id_[*byte] = id;
      continue;
    }
    tok.decoded_[id] = piece;
    // The first id wins for a duplicated piece, so encoding is deterministic.
    if (!piece.empty()) tok.piece_to_id_.emplace(piece, id);
  }
  return tok;
}

int32_t Tokenizer::FindPiece(std::string_view text) const {
  const auto it = piece_to_id_.find(text);
  return it == piece_to_id_.end() ? -1 : it->second;
}

absl::Status Tokenizer::CheckId(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is out of range [0, ", vocab_size(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(const std::string& text,
                                                       bool add_bos) const {
  // Symbol indices are ints; refuse inputs whose byte count could overflow one.
  if (text.size() >= static_cast<size_t>(std::numeric_limits<int>::max() / 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("text of ", text.size(), " bytes is too long to encode"));
  }
  std::vector<int32_t> ids;
  if (add_bos) ids.push_back(kBosId);
  if (text.empty()) return ids;

  const std::string prefixed = " " + text;
  const std::string_view view(prefixed);

  // Initial symbols: one per UTF-8 character that is a piece, else one
  // unmergeable byte-fallback symbol per byte of the character.
  std::vector<Symbol> symbols;
  symbols.reserve(prefixed.size());
  auto append_symbol = [&symbols](size_t start, size_t length, int32_t id, bool mergeable) {
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({start, length, id, index - 1, -1, mergeable});
    if (index > 0) symbols[index - 1].next = index;
  };
  for (size_t pos = 0; pos < view.size();) {
    const size_t char_length = Utf8CharLength(view, pos);
    const int32_t id = FindPiece(view.substr(pos, char_length));
    if (id >= 0) {
      append_symbol(pos, char_length, id, /*mergeable=*/true);
    } else {
      for (size_t i = pos; i < pos + char_length; ++i) {
        const auto byte = static_cast<uint8_t>(view[i]);
        const int32_t byte_id = byte_to_id_[byte];
        if (byte_id < 0) {
          // Offset i in `prefixed` is i - 1 in the caller's text; 0 is the prefix.
          const std::string where =
              i == 0 ? std::string("the dummy-prefix space") : absl::StrCat("text offset ", i - 1);
          return absl::InvalidArgumentError(absl::StrCat(
              "cannot encode byte 0x", absl::Hex(byte, absl::kZeroPad2), " (", where,
              "): it is not in a piece and the vocabulary has no <0xNN> piece for it"));
        }
        append_symbol(i, 1, byte_id, /*mergeable=*/false);
      }
    }
    pos += char_length;
  }

  // BPE: a max-heap of candidate pairs replaces the naive rescan of the whole
  // sequence per merge (O(n^2)) with O(n log n), and pops pairs in exactly the
  // order the naive rule would merge them (see CandidateOrder).
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> candidates;
  auto push_candidate = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    if (!a.mergeable || !b.mergeable) return;
    const size_t length = a.length + b.length;
    const int32_t id = FindPiece(view.substr(a.start, length));
    if (id < 0) return;
    candidates.push({scores_[id], left, right, length, id});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    push_candidate(static_cast<int>(i), static_cast<int>(i + 1));
  }
  while (!candidates.empty()) {
    const Candidate top = candidates.top();
    candidates.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    const bool stale = !left.mergeable || !right.mergeable || left.next != top.right ||
                       left.length + right.length != top.length;
    if (stale) continue;
    left.length = top.length;
    left.id = top.id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.mergeable = false;
    right.length = 0;
    push_candidate(left.prev, top.left);
    push_candidate(top.left, left.next);
  }

  for (int i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
  return ids;
}

absl::StatusOr<std::string> Tokenizer::DecodePiece(int32_t prev, int32_t id) const {
  VC_RETURN_IF_ERROR(CheckId(id));
  std::string_view text = decoded_[id];
  // Undo the dummy prefix: the first word after BOS was encoded as " word".
  if (prev == kBosId && !text.empty() && text.front() == ' ') text.remove_prefix(1);
  return std::string(text);
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string text;
  int32_t prev = -1;
  for (const int32_t id : ids) {
    VC_ASSIGN_OR_RETURN(const std::string piece, DecodePiece(prev, id));
    text += piece;
    prev = id;
  }
  return text;
}

}  // namespace vc
