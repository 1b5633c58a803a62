// An allocator whose blocks start on a 64-byte cache line, for the weight
// tensors a model owns (generated or converted at load): with glibc's
// default 16-byte alignment every 64-byte vector load of a row spans two
// cache lines, which cost the f32 products 5-20% (docs/results.md
// section 8, "Where the weights start matters").
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace vc {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};

  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>& /*other*/) {}  // NOLINT: rebinding

  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t /*n*/) { ::operator delete(p, kAlignment); }

  template <class U>
  bool operator==(const CacheLineAllocator<U>& /*other*/) const {
    return true;
  }
};

// A vector whose elements start on a cache line.
template <class T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace vc
