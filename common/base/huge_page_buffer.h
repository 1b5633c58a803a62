// Zeroed memory for large, long-lived buffers (a KV cache's slabs): mapped on
// its own, 2 MiB-aligned and advised for transparent huge pages. Where the
// kernel grants them (THP "madvise" or "always"), a 24 MB slab is a dozen
// page faults instead of ~6,000, and a kernel streaming it crosses no 4 KiB
// page boundary (a new translation under a hypervisor's nested paging, and a
// stop for the hardware prefetchers). Where it does not, the buffer is plain
// anonymous memory, zeroed by the kernel on first touch. Freed buffers'
// mappings are kept (up to kKeptBytes in all) for later ones of about the
// same size, which are then zeroed with a memset instead of being faulted
// in again.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"

namespace vc {

class HugePageBuffer {
 public:
  // Freed mappings kept for reuse, at most, in the whole process.
  static constexpr size_t kKeptBytes = size_t{1} << 30;

  // ResourceExhausted (with the size) when the mapping fails; an empty
  // buffer for 0 bytes.
  static absl::StatusOr<HugePageBuffer> Allocate(size_t bytes);

  HugePageBuffer() = default;
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  ~HugePageBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }  // as asked for

 private:
  void Reset();
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // size_ rounded up to whole huge pages
};

}  // namespace vc
