// Helpers shared by the libFuzzer targets in this folder: a byte reader over
// the input, a scratch directory for loaders that take a path, and a check
// that aborts (so libFuzzer records the input) when an invariant breaks.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace vc::fuzz {

// Aborts with a message: a broken invariant is a finding, like a crash.
#define VC_FUZZ_CHECK(cond, msg)                                                          \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz invariant failed at %s:%d: %s (%s)\n", __FILE__, __LINE__, \
                   #cond, msg);                                                           \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

// Consumes the input front to back; reads past the end give zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t left() const { return size_ - pos_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return static_cast<uint32_t>(U16()) | (static_cast<uint32_t>(U16()) << 16); }
  // Up to n bytes.
  std::string Bytes(size_t n) {
    n = n < left() ? n : left();
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::string Rest() { return Bytes(left()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Names of the files written into the scratch directory (removed at exit).
inline std::vector<std::string>& ScratchNames() {
  static auto* names = new std::vector<std::string>();
  return *names;
}

// A private directory for this process, made once (loaders that only take
// a path get the input through a file in it; files are overwritten per run)
// and removed with its files when the process exits.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    // tmpfs when there is one: rewriting a file per input on a disk mounted
    // with `discard` costs milliseconds (a TRIM per truncate).
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string tmpl = std::string(base) + "/vc-fuzz-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      for (const std::string& name : ScratchNames()) ::unlink((ScratchDir() + "/" + name).c_str());
      ::rmdir(ScratchDir().c_str());
    });
    return new std::string(tmpl);
  }();
  return *dir;
}

// Writes `bytes` to ScratchDir()/name (replacing it) and returns the path.
inline std::string WriteScratch(const std::string& name, std::string_view bytes) {
  const std::string path = ScratchDir() + "/" + name;
  std::vector<std::string>& names = ScratchNames();
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror("open scratch file");
    std::abort();
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      std::perror("write scratch file");
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

inline void RemoveScratch(const std::string& name) {
  ::unlink((ScratchDir() + "/" + name).c_str());
}

}  // namespace vc::fuzz
