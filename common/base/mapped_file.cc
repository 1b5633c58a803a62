#include "common/base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace vc {

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    auto msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    // MAP_POPULATE faults every page in now: every caller reads the whole
    // file, and a model's weights faulted in on first touch made a fresh
    // process's first forward passes ~20x a steady step.
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(err)));
    }
    f.data_ = static_cast<const uint8_t*>(p);
    // MAP_POPULATE alone is not enough: under a hypervisor the first CPU
    // access of each mapped page can still cost microseconds (1.4-1.6 us per
    // 4 KiB page on the 2-vCPU development VM, invisible to the guest's
    // fault counters; vc_page_touch_bench), which made a fresh process's
    // first 1-token pass 4-9x a steady one. Reading one byte per page here
    // moves that cost to load time (docs/results.md section 8).
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    uint8_t sum = 0;
    for (size_t i = 0; i < f.size_; i += page) sum ^= f.data_[i];
    volatile uint8_t keep = sum;  // the reads must not be optimised away
    (void)keep;
  }
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace vc
