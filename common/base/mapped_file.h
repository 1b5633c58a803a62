// Read-only memory mapping of a whole file, with an error Status (path and
// errno text) instead of a crash when the file is missing or unreadable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace vc {

class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace vc
