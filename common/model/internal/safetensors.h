// A small reader for the safetensors format: an 8-byte little-endian header
// length N, N bytes of JSON describing each tensor's dtype, shape and byte
// range, then the raw little-endian tensor data.
//
// Open() validates the whole header up front (JSON syntax, field types, known
// dtypes, byte counts matching shapes, byte ranges inside the file and tiling
// the data section without overlaps or holes, as the reference implementation
// requires), so a caller can trust every TensorInfo it hands out. Corrupt or
// truncated files give InvalidArgument naming the path and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mapped_file.h"

namespace vc::safetensors {

struct TensorInfo {
  std::string name;
  std::string dtype;           // as written in the header, e.g. "BF16"
  size_t element_size = 0;     // bytes per element of `dtype`
  std::vector<int64_t> shape;  // empty for a scalar
  int64_t num_elements = 0;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
  const uint8_t* data = nullptr;  // points into the mapping
};

class File {
 public:
  // Maps `path` and validates its header. NotFound if the file is missing.
  static absl::StatusOr<File> Open(const std::string& path);
  // Validates an already mapped file.
  static absl::StatusOr<File> Parse(MappedFile file);

  File(File&&) = default;
  File& operator=(File&&) = default;

  const std::string& path() const { return file_.path(); }
  // In data-section order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Null if the file has no tensor of that name.
  const TensorInfo* Find(const std::string& name) const;
  // The header's "__metadata__": free-form string pairs ("format": "pt").
  // safetensors' save_model also records here each tensor it dropped as a
  // duplicate of another ("model.embed_tokens.weight": "lm_head.weight").
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Gives up the mapping; TensorInfo::data pointers stay valid for as long as
  // the returned MappedFile lives (moving a mapping does not move its bytes).
  MappedFile ReleaseMapping() && { return std::move(file_); }

 private:
  File() = default;
  MappedFile file_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Bytes per element of a safetensors dtype name; 0 if the name is unknown.
size_t DtypeSize(const std::string& dtype);

// "[4, 64]" for error messages.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace vc::safetensors
