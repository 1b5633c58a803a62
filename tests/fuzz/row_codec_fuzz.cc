// The row store serialisation (common/kv/row_codec.h, RowStore::Deserialize)
// on arbitrary bytes: f32, per-token and per-channel quantised stores with
// residual rows. Invariants: a store that parses decodes every row, its
// AppendSerialized reproduces exactly the bytes it consumed, and Rebuild
// (the online re-encoding) over it either works or fails with a Status.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/row_codec.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  size_t offset = 0;
  auto store = vc::RowStore::Deserialize(bytes, &offset);
  if (!store.ok()) {
    VC_FUZZ_CHECK(offset == 0, "a failed parse does not advance the offset");
    return 0;
  }
  VC_FUZZ_CHECK(offset <= size, "the offset stays inside the input");
  const vc::RowStore& s = **store;
  const int64_t rows = s.rows();
  const int dim = s.dim();
  // Codes take at least 2 bits a value, so rows * dim <= 4 * size + dim.
  std::vector<float> out(static_cast<size_t>(rows * dim));
  if (rows > 0) s.DecodeRows(0, rows, out.data());
  for (int64_t i = 0; i < rows; ++i) s.Decode(i, out.data());
  std::string again;
  s.AppendSerialized(&again);
  VC_FUZZ_CHECK(again == bytes.substr(0, offset), "serialisation round-trips");

  // Keep every other row, append one new row, in the store's own format.
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < rows; i += 2) keep.push_back(i);
  std::vector<float> extra(static_cast<size_t>(dim), 0.5f);
  vc::RowCodecSpec spec;
  Input in(data, size);  // the spec's fields as the header stores them
  spec.kind = static_cast<vc::RowCodecSpec::Kind>(in.U32());
  spec.bits = static_cast<int>(in.U32());
  spec.group = static_cast<int>(in.U32());
  spec.residual = static_cast<int>(in.U32());
  auto rebuilt = vc::RowStore::Rebuild(s, keep, extra.data(), 1, spec);
  if (rebuilt.ok()) {
    VC_FUZZ_CHECK((*rebuilt)->rows() == static_cast<int64_t>(keep.size()) + 1, "rebuilt row count");
  }
  return 0;
}
