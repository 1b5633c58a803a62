#include "common/kvstore/chunk_codec.h"

#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvstore/internal/sha256.h"

namespace vc::kvstore {
namespace {

constexpr char kMagic[4] = {'V', 'C', 'K', 'C'};

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(static_cast<uint8_t>(v >> (8 * i))));
}

uint32_t GetU32(const std::string& in, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(in[off + i])} << (8 * i);
  return v;
}

std::array<uint8_t, 32> Digest(const char* data, size_t size) {
  internal::Sha256 h;
  h.UpdateRaw(data, size);
  return h.Finish();
}

// Bytes per element of a verified (known-dtype) header.
size_t ElementBytes(const ChunkHeader& h) {
  return static_cast<size_t>(DtypeBytes(static_cast<Dtype>(h.dtype)));
}

// Payload bytes for a shape, or -1 if it overflows.
int64_t PayloadBytes(const ChunkHeader& h) {
  const unsigned __int128 n = static_cast<unsigned __int128>(2) * h.layers * h.kv_heads *
                              h.head_dim * h.tokens * ElementBytes(h);
  if (n > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max() / 2)) return -1;
  return static_cast<int64_t>(n);
}

}  // namespace

absl::StatusOr<std::string> EncodeChunk(const PagedKvCache& cache, int32_t first_position,
                                        int32_t tokens) {
  if (tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EncodeChunk: tokens must be positive, got ", tokens));
  }
  if (first_position < cache.first_position() ||
      int64_t{first_position} + tokens > cache.next_position()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EncodeChunk: positions [", first_position, ", ",
                     int64_t{first_position} + tokens, ") are not all stored (cache holds [",
                     cache.first_position(), ", ", cache.next_position(), "))"));
  }
  ChunkHeader h;
  h.layers = static_cast<uint32_t>(cache.n_layers());
  h.kv_heads = static_cast<uint32_t>(cache.kv_heads());
  h.head_dim = static_cast<uint32_t>(cache.head_dim());
  h.tokens = static_cast<uint32_t>(tokens);
  h.first_position = first_position;
  h.dtype = static_cast<uint32_t>(cache.dtype());
  const int64_t payload = PayloadBytes(h);
  if (payload < 0) return absl::InvalidArgumentError("EncodeChunk: chunk too large");

  std::string out;
  out.reserve(kChunkHeaderBytes + static_cast<size_t>(payload) + kChunkChecksumBytes +
              kSealTrailerMaxBytes);
  out.append(kMagic, 4);
  PutU32(out, h.format_version);
  PutU32(out, h.layers);
  PutU32(out, h.kv_heads);
  PutU32(out, h.head_dim);
  PutU32(out, h.tokens);
  PutU32(out, h.dtype);
  PutU32(out, static_cast<uint32_t>(h.first_position));
  PutU32(out, 0);
  const size_t row_bytes = static_cast<size_t>(h.head_dim) * sizeof(float);
  const Dtype dtype = cache.dtype();
  std::vector<uint16_t> narrow(h.head_dim);
  for (int l = 0; l < cache.n_layers(); ++l) {
    for (int v = 0; v < 2; ++v) {
      for (int kh = 0; kh < cache.kv_heads(); ++kh) {
        for (int32_t p = first_position; p < first_position + tokens; ++p) {
          const float* row = v == 0 ? cache.KeyAt(l, kh, p) : cache.ValueAt(l, kh, p);
          if (dtype == Dtype::kF32) {
            out.append(reinterpret_cast<const char*>(row), row_bytes);
            continue;
          }
          // Exact: the engine stored values already rounded to the dtype.
          for (uint32_t d = 0; d < h.head_dim; ++d) narrow[d] = NarrowBits(row[d], dtype);
          out.append(reinterpret_cast<const char*>(narrow.data()), narrow.size() * 2);
        }
      }
    }
  }
  const auto d = Digest(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(d.data()), d.size());
  return out;
}

absl::StatusOr<ChunkHeader> VerifyChunk(const std::string& bytes, ChecksumCheck checksum) {
  if (bytes.size() < kChunkHeaderBytes + kChunkChecksumBytes) {
    return absl::DataLossError(absl::StrCat("KV chunk truncated: ", bytes.size(),
                                            " bytes, shorter than header + checksum (",
                                            kChunkHeaderBytes + kChunkChecksumBytes, ")"));
  }
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("KV chunk: bad magic (not a VeriCache KV chunk)");
  }
  ChunkHeader h;
  h.format_version = GetU32(bytes, 4);
  h.layers = GetU32(bytes, 8);
  h.kv_heads = GetU32(bytes, 12);
  h.head_dim = GetU32(bytes, 16);
  h.tokens = GetU32(bytes, 20);
  h.dtype = GetU32(bytes, 24);
  h.first_position = static_cast<int32_t>(GetU32(bytes, 28));
  const uint32_t reserved = GetU32(bytes, 32);
  if (h.format_version != kChunkFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("KV chunk: unsupported format version ",
                                                   h.format_version, " (expected ",
                                                   kChunkFormatVersion, ")"));
  }
  if (h.dtype > 255 || !DtypeFromByte(static_cast<uint8_t>(h.dtype)).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk: unsupported dtype ", h.dtype, " (known: 0 = f32, 1 = bf16, 2 = f16)"));
  }
  if (reserved != 0) return absl::InvalidArgumentError("KV chunk: reserved header field not 0");
  const int32_t max_i32 = std::numeric_limits<int32_t>::max();
  if (h.layers == 0 || h.kv_heads == 0 || h.head_dim == 0 || h.tokens == 0 ||
      h.layers > static_cast<uint32_t>(max_i32) || h.kv_heads > static_cast<uint32_t>(max_i32) ||
      h.head_dim > static_cast<uint32_t>(max_i32) || h.tokens > static_cast<uint32_t>(max_i32) ||
      h.first_position < 0 || int64_t{h.first_position} + h.tokens > max_i32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk: bad shape layers=", h.layers, " kv_heads=", h.kv_heads, " head_dim=", h.head_dim,
        " tokens=", h.tokens, " first_position=", h.first_position));
  }
  const int64_t payload = PayloadBytes(h);
  if (payload < 0) return absl::InvalidArgumentError("KV chunk: shape overflows");
  const uint64_t expected =
      kChunkHeaderBytes + static_cast<uint64_t>(payload) + kChunkChecksumBytes;
  if (bytes.size() != expected) {
    return absl::DataLossError(absl::StrCat("KV chunk: size ", bytes.size(),
                                            " bytes does not match its header (expected ", expected,
                                            "): truncated or padded"));
  }
  if (checksum == ChecksumCheck::kAlreadyRecomputed) return h;
  const size_t body = bytes.size() - kChunkChecksumBytes;
  const auto d = Digest(bytes.data(), body);
  if (std::memcmp(d.data(), bytes.data() + body, kChunkChecksumBytes) != 0) {
    return absl::DataLossError("KV chunk: checksum mismatch (corrupt data)");
  }
  return h;
}

absl::Status DecodeChunkInto(const std::string& bytes, PagedKvCache& cache,
                             ChecksumCheck checksum) {
  VC_ASSIGN_OR_RETURN(const ChunkHeader h, VerifyChunk(bytes, checksum));
  if (h.layers != static_cast<uint32_t>(cache.n_layers()) ||
      h.kv_heads != static_cast<uint32_t>(cache.kv_heads()) ||
      h.head_dim != static_cast<uint32_t>(cache.head_dim())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk shape (layers=", h.layers, " kv_heads=", h.kv_heads, " head_dim=", h.head_dim,
        ") does not match the cache (layers=", cache.n_layers(), " kv_heads=", cache.kv_heads(),
        " head_dim=", cache.head_dim(), ")"));
  }
  if (static_cast<Dtype>(h.dtype) != cache.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV chunk dtype ", DtypeName(static_cast<Dtype>(h.dtype)),
        " does not match the model's KV dtype ", DtypeName(cache.dtype())));
  }
  if (h.first_position != cache.next_position()) {
    return absl::InvalidArgumentError(absl::StrCat("KV chunk starts at position ", h.first_position,
                                                   " but the cache's next is ",
                                                   cache.next_position()));
  }
  VC_RETURN_IF_ERROR(cache.Append(static_cast<int32_t>(h.tokens)));
  ForEachChunkRow(bytes, h, [&](int layer, int32_t position, const float* k, const float* v) {
    cache.Write(layer, position, k, v);
  });
  return absl::OkStatus();
}

void ForEachChunkRow(
    const std::string& bytes, const ChunkHeader& h,
    const std::function<void(int layer, int32_t position, const float* k, const float* v)>& row) {
  const size_t hd = h.head_dim;
  const size_t T = h.tokens;
  const size_t H = h.kv_heads;
  const size_t plane = H * T * hd;  // elements in one K (or V) of one layer
  const auto dtype = static_cast<Dtype>(h.dtype);
  const size_t eb = ElementBytes(h);
  std::vector<float> k(H * hd), v(H * hd);
  const char* payload = bytes.data() + kChunkHeaderBytes;
  auto read_row = [&](const char* src, float* dst) {
    if (dtype == Dtype::kF32) {
      std::memcpy(dst, src, hd * sizeof(float));
      return;
    }
    for (size_t d = 0; d < hd; ++d) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * d, 2);
      dst[d] = WidenBits(bits, dtype);
    }
  };
  for (size_t l = 0; l < h.layers; ++l) {
    const char* kbase = payload + (2 * l) * plane * eb;
    const char* vbase = kbase + plane * eb;
    for (size_t t = 0; t < T; ++t) {
      for (size_t kh = 0; kh < H; ++kh) {
        const size_t off = ((kh * T) + t) * hd * eb;
        read_row(kbase + off, k.data() + kh * hd);
        read_row(vbase + off, v.data() + kh * hd);
      }
      row(static_cast<int>(l), h.first_position + static_cast<int32_t>(t), k.data(), v.data());
    }
  }
}

}  // namespace vc::kvstore
