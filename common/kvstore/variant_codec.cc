#include "common/kvstore/variant_codec.h"

#include <array>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvstore/internal/sha256.h"

namespace vc::kvstore {
namespace {

constexpr char kMagic[4] = {'V', 'C', 'K', 'V'};
constexpr char kChunkMagic[4] = {'V', 'C', 'K', 'C'};

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(static_cast<uint8_t>(v >> (8 * i))));
}

uint32_t GetU32(std::string_view in, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(in[off + i])} << (8 * i);
  return v;
}

std::array<uint8_t, 32> Digest(const char* data, size_t size) {
  internal::Sha256 h;
  h.UpdateRaw(data, size);
  return h.Finish();
}

}  // namespace

std::string EncodeCompressedPrefix(const CompressedPrefix& prefix) {
  const int layers = prefix.n_layers();
  const size_t kv_heads = layers > 0 ? prefix.layer(0).heads.size() : 0;
  const int head_dim = kv_heads > 0 ? prefix.layer(0).heads[0].keys->dim() : 0;
  // Build and FromParts bound the description only by memory; a reader
  // refuses more than kMaxVariantDescriptionBytes, so cut it here rather
  // than write something unreadable (Describe() strings are ~60 bytes).
  const std::string_view description =
      std::string_view(prefix.description()).substr(0, kMaxVariantDescriptionBytes);

  std::string out;
  out.reserve(kVariantHeaderBytes + description.size() + static_cast<size_t>(prefix.bytes()) +
              1024 + kVariantChecksumBytes + kSealTrailerMaxBytes);
  out.append(kMagic, 4);
  PutU32(out, kVariantFormatVersion);
  PutU32(out, static_cast<uint32_t>(layers));
  PutU32(out, static_cast<uint32_t>(kv_heads));
  PutU32(out, static_cast<uint32_t>(head_dim));
  PutU32(out, static_cast<uint32_t>(prefix.prefix_len()));
  PutU32(out, static_cast<uint32_t>(description.size()));
  PutU32(out, 0);
  out.append(description);
  for (int l = 0; l < layers; ++l) {
    const CompressedPrefix::Layer& layer = prefix.layer(l);
    PutU32(out, static_cast<uint32_t>(layer.heads.empty() ? 0 : layer.heads[0].positions.size()));
    for (const CompressedPrefix::Head& head : layer.heads) {
      for (const int32_t p : head.positions) PutU32(out, static_cast<uint32_t>(p));
      head.keys->AppendSerialized(&out);
      head.values->AppendSerialized(&out);
    }
  }
  const auto d = Digest(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(d.data()), d.size());
  return out;
}

absl::StatusOr<VariantHeader> VerifyVariant(const std::string& bytes, ChecksumCheck checksum) {
  if (bytes.size() < kVariantHeaderBytes + kVariantChecksumBytes) {
    return absl::DataLossError(absl::StrCat("compressed KV variant truncated: ", bytes.size(),
                                            " bytes, shorter than header + checksum (",
                                            kVariantHeaderBytes + kVariantChecksumBytes, ")"));
  }
  // The checksum first: any changed or missing byte, header included, is
  // DataLoss; what is left to reject afterwards was written that way.
  const size_t body = bytes.size() - kVariantChecksumBytes;
  if (checksum == ChecksumCheck::kRecompute) {
    const auto d = Digest(bytes.data(), body);
    if (std::memcmp(d.data(), bytes.data() + body, kVariantChecksumBytes) != 0) {
      return absl::DataLossError(
          "compressed KV variant: checksum mismatch (corrupt, truncated or not a variant)");
    }
  }
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) {
    if (std::memcmp(bytes.data(), kChunkMagic, 4) == 0) {
      return absl::InvalidArgumentError(
          "compressed KV variant: bad magic; this is a full-KV chunk (VCKC), not a variant");
    }
    return absl::InvalidArgumentError("compressed KV variant: bad magic (expected VCKV)");
  }
  VariantHeader h;
  h.format_version = GetU32(bytes, 4);
  h.layers = GetU32(bytes, 8);
  h.kv_heads = GetU32(bytes, 12);
  h.head_dim = GetU32(bytes, 16);
  h.prefix_len = static_cast<int32_t>(GetU32(bytes, 20));
  const uint32_t description_bytes = GetU32(bytes, 24);
  const uint32_t reserved = GetU32(bytes, 28);
  if (h.format_version != kVariantFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed KV variant: unsupported format version ", h.format_version,
                     " (expected ", kVariantFormatVersion, ")"));
  }
  if (reserved != 0) {
    return absl::InvalidArgumentError("compressed KV variant: reserved header field not 0");
  }
  constexpr uint32_t kMaxI32 = std::numeric_limits<int32_t>::max();
  if (h.layers == 0 || h.kv_heads == 0 || h.head_dim == 0 || h.prefix_len <= 0 ||
      h.layers > kMaxI32 || h.kv_heads > kMaxI32 || h.head_dim > kMaxI32) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed KV variant: bad shape layers=", h.layers, " kv_heads=", h.kv_heads,
                     " head_dim=", h.head_dim, " prefix_len=", h.prefix_len));
  }
  if (description_bytes > kMaxVariantDescriptionBytes ||
      description_bytes > body - kVariantHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("compressed KV variant: description of ",
                                                   description_bytes, " bytes does not fit"));
  }
  h.description = bytes.substr(kVariantHeaderBytes, description_bytes);
  return h;
}

absl::StatusOr<std::shared_ptr<const CompressedPrefix>> DecodeCompressedPrefix(
    const ModelConfig& config, const std::string& bytes, ChecksumCheck checksum) {
  VC_ASSIGN_OR_RETURN(VariantHeader h, VerifyVariant(bytes, checksum));
  if (h.layers != static_cast<uint32_t>(config.n_layers) ||
      h.kv_heads != static_cast<uint32_t>(config.n_kv_heads) ||
      h.head_dim != static_cast<uint32_t>(config.head_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compressed KV variant shape (layers=", h.layers, " kv_heads=", h.kv_heads,
        " head_dim=", h.head_dim, ") does not match the model (layers=", config.n_layers,
        " kv_heads=", config.n_kv_heads, " head_dim=", config.head_dim, ")"));
  }
  if (config.max_seq_len > 0 && h.prefix_len > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("compressed KV variant of a ", h.prefix_len,
                                                   "-token prefix exceeds the model's context of ",
                                                   config.max_seq_len));
  }
  // The body ends where the checksum starts; reads never cross it.
  const std::string_view body(bytes.data(), bytes.size() - kVariantChecksumBytes);
  size_t off = kVariantHeaderBytes + h.description.size();
  std::vector<CompressedPrefix::Layer> layers(h.layers);
  for (uint32_t l = 0; l < h.layers; ++l) {
    if (body.size() - off < 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("compressed KV variant: body ends before layer ", l));
    }
    const uint32_t count = GetU32(body, off);
    off += 4;
    if (count > static_cast<uint32_t>(h.prefix_len)) {
      return absl::InvalidArgumentError(absl::StrCat("compressed KV variant: layer ", l, " keeps ",
                                                     count, " positions of a ", h.prefix_len,
                                                     "-token prefix"));
    }
    layers[l].heads.resize(h.kv_heads);
    for (uint32_t kh = 0; kh < h.kv_heads; ++kh) {
      CompressedPrefix::Head& head = layers[l].heads[kh];
      if ((body.size() - off) / 4 < count) {
        return absl::InvalidArgumentError(absl::StrCat(
            "compressed KV variant: body ends inside layer ", l, " head ", kh, "'s positions"));
      }
      head.positions.resize(count);
      for (uint32_t i = 0; i < count; ++i) {
        head.positions[i] = static_cast<int32_t>(GetU32(body, off));
        off += 4;
      }
      for (std::unique_ptr<RowStore>* store : {&head.keys, &head.values}) {
        absl::StatusOr<std::unique_ptr<RowStore>> s = RowStore::Deserialize(body, &off);
        if (!s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("compressed KV variant: layer ", l,
                                                         " head ", kh, ": ", s.status().message()));
        }
        *store = std::move(s).value();
      }
    }
  }
  if (off != body.size()) {
    return absl::InvalidArgumentError(absl::StrCat("compressed KV variant: ", body.size() - off,
                                                   " unexpected bytes after the last layer"));
  }
  absl::StatusOr<std::shared_ptr<const CompressedPrefix>> prefix = CompressedPrefix::FromParts(
      config, h.prefix_len, std::move(layers), std::move(h.description));
  if (!prefix.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed KV variant: ", prefix.status().message()));
  }
  return prefix;
}

}  // namespace vc::kvstore
