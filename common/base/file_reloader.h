// A value built from files (a TLS context from its certificate, key and CA)
// that is rebuilt when one of those files changes on disk, so a daemon picks
// up rotated certificates without a restart. Changes are noticed by
// FileStamp (no file is read until one changed), checked on each Get(), so
// the cost is a few stat() calls per new connection and nothing per request.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_stamp.h"

namespace vc {

template <typename T>
class FileReloader {
 public:
  struct File {
    std::string label;  // how errors name the file, e.g. "--tls-cert"
    std::string path;
  };
  using Build = std::function<absl::StatusOr<T>()>;

  // Stamps every file and builds the first value. Unavailable naming the
  // file if one cannot be stat'ed; otherwise the build's own error.
  static absl::StatusOr<std::unique_ptr<FileReloader>> Create(std::vector<File> files,
                                                              Build build) {
    std::unique_ptr<FileReloader> reloader(new FileReloader(std::move(files), std::move(build)));
    absl::StatusOr<std::vector<FileStamp>> stamps = reloader->StampAll();
    if (!stamps.ok()) return stamps.status();
    absl::StatusOr<T> value = reloader->build_();
    if (!value.ok()) return value.status();
    reloader->value_ = std::move(*value);
    reloader->stamps_ = std::move(*stamps);
    return reloader;
  }

  // The current value, rebuilt first if a file changed since the last try.
  // A rebuild that fails keeps the last good value (a half-written rotation
  // must not take a listener down), and that version of the files is not
  // tried again until they change once more.
  T Get() {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<std::vector<FileStamp>> stamps = StampAll();
    if (stamps.ok() && *stamps != stamps_) {
      absl::StatusOr<T> value = build_();
      if (value.ok()) {
        value_ = std::move(*value);
        ++reloads_;
      }
      stamps_ = std::move(*stamps);
    }
    return value_;
  }

  // Successful rebuilds after the first build (for tests and logs).
  int reloads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reloads_;
  }

 private:
  FileReloader(std::vector<File> files, Build build)
      : files_(std::move(files)), build_(std::move(build)) {}

  absl::StatusOr<std::vector<FileStamp>> StampAll() const {
    std::vector<FileStamp> stamps;
    stamps.reserve(files_.size());
    for (const File& file : files_) {
      std::optional<FileStamp> stamp = StampFile(file.path);
      if (!stamp)
        return absl::UnavailableError(absl::StrCat(file.label, " ", file.path, ": cannot stat"));
      stamps.push_back(*stamp);
    }
    return stamps;
  }

  const std::vector<File> files_;
  const Build build_;
  mutable std::mutex mu_;
  T value_{};
  std::vector<FileStamp> stamps_;
  int reloads_ = 0;
};

}  // namespace vc
