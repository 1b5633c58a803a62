// The full-KV chunk codec (common/kvstore/chunk_codec.h) on arbitrary bytes:
// VerifyChunk and DecodeChunkInto. The first input byte's low bit reseals
// the rest with a valid SHA-256 (otherwise nearly every input stops at the
// checksum). Invariants: a chunk that verifies decodes into a cache of its
// shape and encodes back to the same bytes; decoding into a cache of another
// shape fails and leaves the cache empty.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/engine/kv_cache.h"
#include "common/kvstore/chunk_codec.h"
#include "common/kvstore/internal/sha256.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  Input in(data, size);
  const uint8_t mode = in.U8();
  std::string bytes = in.Rest();
  if (mode & 1) {
    vc::kvstore::internal::Sha256 h;
    h.UpdateRaw(bytes.data(), bytes.size());
    const auto d = h.Finish();
    bytes.append(reinterpret_cast<const char*>(d.data()), d.size());
  }
  auto header = vc::kvstore::VerifyChunk(bytes);
  if (!header.ok()) return 0;
  // The payload fits the input, so the shape is small.
  vc::ModelConfig c;
  c.n_layers = static_cast<int>(header->layers);
  c.n_kv_heads = static_cast<int>(header->kv_heads);
  c.n_heads = c.n_kv_heads;
  c.head_dim = static_cast<int>(header->head_dim);
  c.dim = c.n_heads * c.head_dim;
  c.max_seq_len = header->first_position + static_cast<int32_t>(header->tokens);
  vc::PagedKvCache::Options o;
  o.first_position = header->first_position;
  o.max_tokens = static_cast<int32_t>(header->tokens);
  vc::PagedKvCache cache(c, o);
  const absl::Status s = vc::kvstore::DecodeChunkInto(bytes, cache);
  VC_FUZZ_CHECK(s.ok(), std::string(s.message()).c_str());
  auto again = vc::kvstore::EncodeChunk(cache, header->first_position,
                                        static_cast<int32_t>(header->tokens));
  VC_FUZZ_CHECK(again.ok() && *again == bytes, "a verified chunk re-encodes to the same bytes");

  vc::ModelConfig other = c;
  other.head_dim = c.head_dim + 2;
  other.dim = other.n_heads * other.head_dim;
  vc::PagedKvCache wrong(other, o);
  VC_FUZZ_CHECK(!vc::kvstore::DecodeChunkInto(bytes, wrong).ok(), "shape mismatch is refused");
  VC_FUZZ_CHECK(wrong.next_position() == header->first_position, "a refused chunk adds nothing");
  return 0;
}
