// Private to kernels/cuda: keeps device copies of host arrays that callers
// pass again and again (model weights), so that a Matmul need not re-upload
// its weight matrix every call.
//
// The KernelBackend interface takes host pointers and says nothing about
// their lifetime, so a host pointer alone is not a safe key: a model can be
// freed and another allocated at the same address (tests do this all the
// time). The cache therefore never trusts the pointer. It keeps a host shadow
// copy of each cached array and, on every lookup, compares the caller's bytes
// with it (memcmp); any difference re-uploads. A hit costs one host memcmp
// instead of a host-to-device copy, and a stale device copy can never be
// used. The price is host memory equal to the cached bytes, which the budget
// bounds: least recently used entries are evicted to stay within it, and an
// array larger than the whole budget is never cached.
//
// Header-only and device-agnostic (the payload type and the upload function
// are the caller's) so the bookkeeping is unit-tested without a GPU. Not
// thread-safe: the owner serialises calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <utility>
#include <vector>

namespace vc::kernels::cuda {

template <typename Payload>
class WeightCache {
 public:
  explicit WeightCache(size_t budget_bytes) : budget_(budget_bytes) {}
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  // Returns the payload holding the `bytes` bytes at `host`, or nullptr when
  // they are not cacheable (0 bytes, or more than the budget); the caller then
  // uploads them itself. On a miss, or when the bytes differ from the cached
  // shadow, calls upload(host, bytes, payload), which must leave `payload`
  // holding a copy of them; its result (true = success) is returned through
  // `ok`, and a failed upload drops the entry. The returned pointer stays
  // valid until the next call of Get or Clear (a later Get may evict it).
  template <typename Upload>
  Payload* Get(const void* host, size_t bytes, Upload&& upload, bool* ok) {
    *ok = true;
    if (bytes == 0 || bytes > budget_) return nullptr;
    const Key key{reinterpret_cast<uintptr_t>(host), bytes};
    auto found = index_.find(key);
    if (found != index_.end()) {
      auto it = found->second;
      lru_.splice(lru_.begin(), lru_, it);  // most recently used first
      if (std::memcmp(it->shadow.data(), host, bytes) == 0) {
        ++hits_;
        return &it->payload;
      }
      // Same address and size, different contents: refresh.
      ++refreshes_;
      std::memcpy(it->shadow.data(), host, bytes);
      if (!upload(host, bytes, it->payload)) {
        *ok = false;
        Erase(it);
        return nullptr;
      }
      return &it->payload;
    }
    ++misses_;
    while (used_ + bytes > budget_ && !lru_.empty()) Erase(std::prev(lru_.end()));
    lru_.emplace_front();
    Entry& e = lru_.front();
    e.key = key;
    e.shadow.assign(static_cast<const unsigned char*>(host),
                    static_cast<const unsigned char*>(host) + bytes);
    index_.emplace(key, lru_.begin());
    used_ += bytes;
    if (!upload(host, bytes, e.payload)) {
      *ok = false;
      Erase(lru_.begin());
      return nullptr;
    }
    return &e.payload;
  }

  void Clear() {
    lru_.clear();
    index_.clear();
    used_ = 0;
  }

  size_t budget_bytes() const { return budget_; }
  size_t bytes_used() const { return used_; }
  size_t entries() const { return lru_.size(); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int64_t refreshes() const { return refreshes_; }

 private:
  using Key = std::pair<uintptr_t, size_t>;  // (host address, bytes)
  struct Entry {
    Key key;
    std::vector<unsigned char> shadow;  // the host bytes the payload holds
    Payload payload;
  };
  using Iter = typename std::list<Entry>::iterator;

  void Erase(Iter it) {
    used_ -= it->key.second;
    index_.erase(it->key);
    lru_.erase(it);
  }

  const size_t budget_;
  size_t used_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::map<Key, Iter> index_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  int64_t refreshes_ = 0;
};

}  // namespace vc::kernels::cuda
