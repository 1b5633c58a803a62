// The llama2.c tokenizer loader (Tokenizer::Load, tokenizer.bin) on
// arbitrary files, then Encode/Decode with the loaded vocabulary. Input:
// u16 vocab_size, u8 length N, N bytes of text to encode, then the file.
// Invariants: load errors are InvalidArgument; with a loaded vocabulary,
// encoded ids are inside it, decode accepts them, DecodePiece over them
// concatenates to Decode, and an id outside the vocabulary is an error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  Input in(data, size);
  const int vocab = in.U16();
  const std::string text = in.Bytes(in.U8());
  const std::string path = WriteScratch("tokenizer.bin", in.Rest());
  auto tok = vc::Tokenizer::Load(path, vocab);
  if (!tok.ok()) {
    VC_FUZZ_CHECK(absl::IsInvalidArgument(tok.status()), std::string(tok.status().message()).c_str());
    return 0;
  }
  VC_FUZZ_CHECK(tok->vocab_size() == vocab, "vocab size as asked");
  VC_FUZZ_CHECK(!tok->Decode(std::vector<int32_t>{vocab}).ok(), "id past the vocabulary");
  VC_FUZZ_CHECK(!tok->Decode(std::vector<int32_t>{-1}).ok(), "negative id");
  auto ids = tok->Encode(text, /*add_bos=*/(size & 1) != 0);
  if (!ids.ok()) return 0;  // a needed byte piece is missing
  for (int32_t id : *ids) VC_FUZZ_CHECK(id >= 0 && id < vocab, "encoded id in the vocabulary");
  auto whole = tok->Decode(*ids);
  VC_FUZZ_CHECK(whole.ok(), "encoded ids decode");
  std::string pieces;
  int32_t prev = -1;
  for (int32_t id : *ids) {
    auto piece = tok->DecodePiece(prev, id);
    VC_FUZZ_CHECK(piece.ok(), "each encoded id decodes as a piece");
    pieces += *piece;
    prev = id;
  }
  VC_FUZZ_CHECK(pieces == *whole, "DecodePiece concatenates to Decode");
  return 0;
}
