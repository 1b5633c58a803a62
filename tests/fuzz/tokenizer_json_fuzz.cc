// The tokenizer.json loader (tokenizer_internal::LoadHfTokenizerFromString,
// what LoadTextTokenizer runs on a tokenizer.json: the model, normaliser,
// pre-tokenizer with its regexes, added tokens, post-processor and decoder)
// on arbitrary JSON, then Encode/Decode with whatever loaded. Input: u8
// length N, N bytes of text to encode, then the tokenizer.json text.
// Invariants: load errors are InvalidArgument; encode errors InvalidArgument
// or ResourceExhausted (a regex's match limit); encoded ids are in
// [0, vocab_size()) and decode (skipping specials or not); an id outside the
// vocabulary is refused.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/internal/hf_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  Input in(data, size);
  const std::string text = in.Bytes(in.U8());
  const std::string json = in.Rest();
  auto tok = vc::tokenizer_internal::LoadHfTokenizerFromString(json, "tokenizer.json", vc::TokenizerConfig{});
  if (!tok.ok()) {
    VC_FUZZ_CHECK(absl::IsInvalidArgument(tok.status()), std::string(tok.status().message()).c_str());
    return 0;
  }
  const vc::TextTokenizer& t = **tok;
  const int vocab = t.vocab_size();
  VC_FUZZ_CHECK(vocab >= 0, "vocab size not negative");
  VC_FUZZ_CHECK(!t.Decode(std::vector<int32_t>{vocab}, false).ok(), "id past the vocabulary");
  VC_FUZZ_CHECK(!t.Decode(std::vector<int32_t>{-1}, false).ok(), "negative id");
  for (bool special : {false, true}) {
    auto ids = t.Encode(text, special);
    if (!ids.ok()) {
      // Text the vocabulary cannot cover (no unk, no byte fallback), or a
      // regex over its match limit.
      const absl::Status& s = ids.status();
      VC_FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsResourceExhausted(s), std::string(s.message()).c_str());
      continue;
    }
    for (int32_t id : *ids) VC_FUZZ_CHECK(id >= 0 && id < vocab, "encoded id in the vocabulary");
    for (bool skip : {false, true}) {
      auto back = t.Decode(*ids, skip);
      VC_FUZZ_CHECK(back.ok(), std::string(back.status().message()).c_str());
    }
  }
  return 0;
}
