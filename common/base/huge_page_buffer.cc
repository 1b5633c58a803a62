#include "common/base/huge_page_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace vc {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Freed mappings kept for the next Allocate: a mapping handed back to the
// kernel is faulted in afresh by the next one (a prompt's KV of the 110M
// synthetic shape, 196 MB, added 0.3-0.8 s to every prefill that way on the
// development VM), where a kept one costs a memset.
struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free;  // mapped size -> start
  size_t bytes = 0;
};

Pool& TheFreePool() {
  static Pool* pool = new Pool;  // never destroyed: buffers may outlive statics
  return *pool;
}

// Takes a kept mapping of at least `mapped` bytes and at most twice that.
void* TakeKept(size_t mapped, size_t* got) {
  Pool& pool = TheFreePool();
  std::lock_guard<std::mutex> lock(pool.mu);
  auto it = pool.free.lower_bound(mapped);
  if (it == pool.free.end() || it->first > 2 * mapped) return nullptr;
  void* p = it->second;
  *got = it->first;
  pool.bytes -= it->first;
  pool.free.erase(it);
  return p;
}

// Keeps a freed mapping if the pool has room for it.
bool Keep(void* p, size_t mapped) {
  Pool& pool = TheFreePool();
  std::lock_guard<std::mutex> lock(pool.mu);
  if (pool.bytes + mapped > HugePageBuffer::kKeptBytes) return false;
  pool.free.emplace(mapped, p);
  pool.bytes += mapped;
  return true;
}

}  // namespace

absl::StatusOr<HugePageBuffer> HugePageBuffer::Allocate(size_t bytes) {
  HugePageBuffer b;
  if (bytes == 0) return b;
  if (bytes > SIZE_MAX - 2 * kHugePage) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes"));
  }
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  size_t kept_size = 0;
  if (void* kept = TakeKept(mapped, &kept_size); kept != nullptr) {
    std::memset(kept, 0, bytes);
    b.data_ = kept;
    b.size_ = bytes;
    b.mapped_ = kept_size;
    return b;
  }
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
  if (data_ != nullptr && !Keep(data_, mapped_)) ::munmap(data_, mapped_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
}

}  // namespace vc
