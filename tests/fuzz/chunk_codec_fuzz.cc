// The full-KV chunk codec (common/kvstore/chunk_codec.h) on arbitrary bytes:
// VerifyChunk and DecodeChunkInto. The first input byte's low bit reseals
// the rest with a valid SHA-256 (otherwise nearly every input stops at the
// checksum). Invariants: a chunk that verifies decodes into a cache of its
// shape and KV dtype and encodes back to the same bytes (or, where a 16-bit
// chunk holds a signalling NaN, which narrowing quiets, to a chunk of the
// same values, NaNs as NaNs); decoding into a
// cache of another shape or dtype fails and leaves the cache empty.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/engine/kv_cache.h"
#include "common/kvstore/chunk_codec.h"
#include "common/kvstore/internal/sha256.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Whether a 16-bit chunk's payload holds a signalling NaN (all-ones
// exponent, quiet bit clear, payload non-zero).
bool HoldsSignallingNan(const std::string& bytes, const vc::kvstore::ChunkHeader& h) {
  const auto dtype = static_cast<vc::Dtype>(h.dtype);
  if (dtype == vc::Dtype::kF32) return false;
  const uint16_t exp_mask = dtype == vc::Dtype::kBf16 ? 0x7f80u : 0x7c00u;
  const uint16_t quiet = dtype == vc::Dtype::kBf16 ? 0x40u : 0x200u;
  const uint16_t mant_mask = static_cast<uint16_t>(quiet * 2 - 1);
  const size_t values = size_t{2} * h.layers * h.kv_heads * h.tokens * h.head_dim;
  for (size_t i = 0; i < values; ++i) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + vc::kvstore::kChunkHeaderBytes + 2 * i, 2);
    if ((v & exp_mask) == exp_mask && (v & quiet) == 0 && (v & mant_mask) != 0) return true;
  }
  return false;
}

}  // namespace

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
  // The chunk's own KV dtype (VerifyChunk checked it is a known one): a
  // bf16 or f16 model's chunks decode into a cache of that dtype only.
  c.dtype = static_cast<vc::Dtype>(header->dtype);
  vc::PagedKvCache::Options o;
  o.first_position = header->first_position;
  o.max_tokens = static_cast<int32_t>(header->tokens);
  vc::PagedKvCache cache(c, o);
  const absl::Status s = vc::kvstore::DecodeChunkInto(bytes, cache);
  VC_FUZZ_CHECK(s.ok(), std::string(s.message()).c_str());
  auto again = vc::kvstore::EncodeChunk(cache, header->first_position,
                                        static_cast<int32_t>(header->tokens));
  VC_FUZZ_CHECK(again.ok(), "a verified chunk re-encodes");
  if (!HoldsSignallingNan(bytes, *header)) {
    VC_FUZZ_CHECK(*again == bytes, "a verified chunk re-encodes to the same bytes");
  } else {
    // Narrowing quiets a signalling NaN (common/base/dtype.h): the same
    // values, NaNs as NaNs, in a chunk that verifies.
    VC_FUZZ_CHECK(again->size() == bytes.size(), "a re-encoded chunk keeps its size");
    vc::PagedKvCache back(c, o);
    VC_FUZZ_CHECK(vc::kvstore::DecodeChunkInto(*again, back).ok(), "a re-encoded chunk decodes");
    for (int l = 0; l < c.n_layers; ++l) {
      for (int32_t p = o.first_position; p < back.next_position(); ++p) {
        for (int kv = 0; kv < 2 * c.n_kv_heads; ++kv) {
          const int head = kv / 2;
          const float* a = kv % 2 == 0 ? cache.KeyAt(l, head, p) : cache.ValueAt(l, head, p);
          const float* b = kv % 2 == 0 ? back.KeyAt(l, head, p) : back.ValueAt(l, head, p);
          for (int i = 0; i < c.head_dim; ++i) {
            VC_FUZZ_CHECK((std::isnan(a[i]) && std::isnan(b[i])) ||
                              std::memcmp(&a[i], &b[i], sizeof(float)) == 0,
                          "a re-encoded chunk holds the same values");
          }
        }
      }
    }
  }

  vc::ModelConfig other = c;
  other.head_dim = c.head_dim + 2;
  other.dim = other.n_heads * other.head_dim;
  vc::PagedKvCache wrong(other, o);
  VC_FUZZ_CHECK(!vc::kvstore::DecodeChunkInto(bytes, wrong).ok(), "shape mismatch is refused");
  VC_FUZZ_CHECK(wrong.next_position() == header->first_position, "a refused chunk adds nothing");

  vc::ModelConfig other_dtype = c;
  other_dtype.dtype = c.dtype == vc::Dtype::kF32 ? vc::Dtype::kBf16 : vc::Dtype::kF32;
  vc::PagedKvCache wrong_dtype(other_dtype, o);
  VC_FUZZ_CHECK(!vc::kvstore::DecodeChunkInto(bytes, wrong_dtype).ok(),
                "dtype mismatch is refused");
  VC_FUZZ_CHECK(wrong_dtype.next_position() == header->first_position,
                "a refused chunk adds nothing");
  return 0;
}
