// The compressed-variant codec (common/kvstore/variant_codec.h) on arbitrary
// bytes, decoded for a fixed small model shape (what a drafter does with a
// fetched variant). The first input byte's low bit reseals the rest with a
// valid SHA-256. Invariants: a variant that decodes has the model's shape,
// kept positions strictly increasing inside the prefix, key and value rows
// for each of them that all decode, and encodes back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/kv/compressed_kv.h"
#include "common/kvstore/internal/sha256.h"
#include "common/kvstore/variant_codec.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/seed_shapes.h"

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
  const vc::ModelConfig config = SeedModelConfig();
  auto prefix = vc::kvstore::DecodeCompressedPrefix(config, bytes);
  if (!prefix.ok()) return 0;
  const vc::CompressedPrefix& p = **prefix;
  VC_FUZZ_CHECK(p.n_layers() == config.n_layers, "layer count");
  VC_FUZZ_CHECK(p.prefix_len() > 0 && p.prefix_len() <= config.max_seq_len, "prefix length");
  std::vector<float> row(static_cast<size_t>(config.head_dim));
  for (int l = 0; l < p.n_layers(); ++l) {
    const vc::CompressedPrefix::Layer& layer = p.layer(l);
    VC_FUZZ_CHECK(static_cast<int>(layer.heads.size()) == config.n_kv_heads, "head count");
    for (const vc::CompressedPrefix::Head& head : layer.heads) {
      for (size_t i = 0; i < head.positions.size(); ++i) {
        VC_FUZZ_CHECK(head.positions[i] >= 0 && head.positions[i] < p.prefix_len(), "position range");
        VC_FUZZ_CHECK(i == 0 || head.positions[i] > head.positions[i - 1], "increasing positions");
      }
      for (const vc::RowStore* store : {head.keys.get(), head.values.get()}) {
        VC_FUZZ_CHECK(store != nullptr && store->dim() == config.head_dim, "row width");
        VC_FUZZ_CHECK(store->rows() == static_cast<int64_t>(head.positions.size()), "row count");
        for (int64_t i = 0; i < store->rows(); ++i) store->Decode(i, row.data());
      }
    }
  }
  VC_FUZZ_CHECK(vc::kvstore::EncodeCompressedPrefix(p) == bytes, "a variant re-encodes the same");
  return 0;
}
