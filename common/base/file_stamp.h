// Which version of a file is on disk, without reading it: its mtime, inode
// and size. Enough to notice a rewrite in place or an atomic rename (how
// certificates and keys files are rotated), so the daemons that reload such
// files re-read them only when one changed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace vc {

struct FileStamp {
  int64_t mtime_ns = -1;
  int64_t size = -1;
  uint64_t inode = 0;
  bool operator==(const FileStamp&) const = default;
};

// nullopt if `path` cannot be stat'ed (callers name the flag in their error).
std::optional<FileStamp> StampFile(const std::string& path);

}  // namespace vc
