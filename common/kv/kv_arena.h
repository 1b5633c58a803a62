// A byte-budgeted memory tier for KV: the "device" arena of the single-node
// long-context mode (compressed KV resident, full KV copied in per verify),
// or a host tier. Allocations are plain heap memory; what the arena adds is
// the accounting: a hard budget, bytes in use and the high-water mark, so a
// schedule that would oversubscribe the GPU fails loudly instead of silently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace vc {

class KvArena {
 public:
  // budget_bytes <= 0: unlimited (accounting only).
  KvArena(std::string name, int64_t budget_bytes);
  KvArena(const KvArena&) = delete;
  KvArena& operator=(const KvArena&) = delete;

  // Bytes charged to the arena; returns them when destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();
    int64_t bytes() const { return bytes_; }

   private:
    friend class KvArena;
    Reservation(KvArena* arena, int64_t bytes) : arena_(arena), bytes_(bytes) {}
    KvArena* arena_ = nullptr;
    int64_t bytes_ = 0;
  };

  // ResourceExhausted (naming the arena, the request and what is free) if the
  // budget would be exceeded; nothing is charged then.
  absl::StatusOr<Reservation> Reserve(int64_t bytes);

  const std::string& name() const { return name_; }
  int64_t budget() const { return budget_; }
  int64_t in_use() const { return in_use_.load(std::memory_order_relaxed); }
  int64_t high_water() const { return high_water_.load(std::memory_order_relaxed); }

 private:
  void Release(int64_t bytes);
  const std::string name_;
  const int64_t budget_;
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> high_water_{0};
};

}  // namespace vc
