#include "common/base/huge_page_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace vc {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

absl::StatusOr<HugePageBuffer> HugePageBuffer::Allocate(size_t bytes) {
  HugePageBuffer b;
  if (bytes == 0) return b;
  if (bytes > SIZE_MAX - 2 * kHugePage) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes"));
  }
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Over-map by one huge page and trim, so that the buffer starts on a huge
  // page boundary (mmap only promises 4 KiB).
  const size_t span = mapped + kHugePage;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes: ", std::strerror(errno)));
  }
  char* raw = static_cast<char*>(p);
  const size_t lead = (kHugePage - reinterpret_cast<uintptr_t>(raw) % kHugePage) % kHugePage;
  char* aligned = raw + lead;
  if (lead > 0) ::munmap(raw, lead);
  if (span - lead > mapped) ::munmap(aligned + mapped, span - lead - mapped);
  // Advice only: without THP (or with it off) the mapping is still good.
  (void)::madvise(aligned, mapped, MADV_HUGEPAGE);
  b.data_ = aligned;
  b.size_ = bytes;
  b.mapped_ = mapped;
  return b;
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept { *this = std::move(other); }

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

HugePageBuffer::~HugePageBuffer() { Reset(); }

void HugePageBuffer::Reset() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
}

}  // namespace vc
