#include "common/kv/kv_arena.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace vc {

KvArena::KvArena(std::string name, int64_t budget_bytes)
    : name_(std::move(name)), budget_(budget_bytes) {}

absl::StatusOr<KvArena::Reservation> KvArena::Reserve(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("negative reservation");
  int64_t cur = in_use_.load(std::memory_order_relaxed);
  for (;;) {
    if (budget_ > 0 && cur + bytes > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat("arena '", name_, "': ", bytes,
                                                       " bytes requested, ", budget_ - cur,
                                                       " of ", budget_, " free"));
    }
    if (in_use_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed)) break;
  }
  int64_t hw = high_water_.load(std::memory_order_relaxed);
  while (cur + bytes > hw && !high_water_.compare_exchange_weak(hw, cur + bytes)) {
  }
  return Reservation(this, bytes);
}

void KvArena::Release(int64_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }

KvArena::Reservation::Reservation(Reservation&& other) noexcept { *this = std::move(other); }

KvArena::Reservation& KvArena::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (arena_ != nullptr) arena_->Release(bytes_);
    arena_ = std::exchange(other.arena_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

KvArena::Reservation::~Reservation() {
  if (arena_ != nullptr) arena_->Release(bytes_);
}

}  // namespace vc
