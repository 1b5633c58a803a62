// The safetensors reader (common/model/internal/safetensors.h) on arbitrary
// files. Invariants: every tensor of a file that opens lies inside the
// mapping after the header, its byte range matches dtype x shape, and Find
// returns each one by name.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/model/internal/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  const std::string path =
      WriteScratch("model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  auto file = vc::safetensors::File::Open(path);
  if (!file.ok()) {
    VC_FUZZ_CHECK(absl::IsInvalidArgument(file.status()), std::string(file.status().message()).c_str());
    return 0;
  }
  const std::vector<vc::safetensors::TensorInfo> tensors = file->tensors();
  for (const auto& t : tensors) {
    VC_FUZZ_CHECK(file->Find(t.name) != nullptr, "Find returns every tensor");
    VC_FUZZ_CHECK(t.end - t.begin == static_cast<uint64_t>(t.num_elements) * t.element_size,
                  "byte range matches dtype x shape");
  }
  vc::MappedFile mapping = std::move(*file).ReleaseMapping();
  VC_FUZZ_CHECK(mapping.size() == size, "the whole file is mapped");
  for (const auto& t : tensors) {
    VC_FUZZ_CHECK(t.data >= mapping.data() + 8 &&
                      t.data + (t.end - t.begin) <= mapping.data() + mapping.size(),
                  "tensor data inside the file");
  }
  return 0;
}
