#include "common/scheduler/prefix_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace vc {
namespace {

// FNV-1a then a splitmix finaliser: a stable hash (std::hash may differ
// between builds), so placement is reproducible.
uint64_t Score(const std::string& key, int index) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  h ^= static_cast<uint64_t>(index) + 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

}  // namespace

std::string PlacementKey(const std::string& prefix_key, uint64_t session) {
  return prefix_key.empty() ? absl::StrCat("session:", session) : prefix_key;
}

std::optional<int> PlaceByKey(const std::string& key, const std::vector<bool>& live) {
  std::optional<int> best;
  uint64_t best_score = 0;
  for (int i = 0; i < static_cast<int>(live.size()); ++i) {
    if (!live[static_cast<size_t>(i)]) continue;
    const uint64_t s = Score(key, i);
    if (!best || s > best_score) {
      best = i;
      best_score = s;
    }
  }
  return best;
}

PrefixPolicy::PrefixPolicy(std::vector<int64_t> base_capacity)
    : base_(std::move(base_capacity)), resident_(base_.size(), 0) {}

PrefixPolicy PrefixPolicy::ForScheduler(const RingScheduler& scheduler) {
  std::vector<int64_t> base;
  for (const RingGpu& g : scheduler.options().gpus) base.push_back(g.transient_capacity_bytes);
  return PrefixPolicy(std::move(base));
}

bool PrefixPolicy::Hold(const std::string& prefix, int gpu, int64_t bytes) {
  if (!Valid(gpu) || bytes <= 0) return false;
  Resident& r = copies_[{prefix, gpu}];
  if (r.holders++ > 0) return false;
  r.bytes = bytes;
  resident_[static_cast<size_t>(gpu)] += bytes;
  return true;
}

bool PrefixPolicy::Release(const std::string& prefix, int gpu) {
  auto it = copies_.find({prefix, gpu});
  if (it == copies_.end()) return false;
  if (--it->second.holders > 0) return false;
  resident_[static_cast<size_t>(gpu)] -= it->second.bytes;
  copies_.erase(it);
  return true;
}

bool PrefixPolicy::IsResident(const std::string& prefix, int gpu) const {
  return copies_.count({prefix, gpu}) > 0;
}

int PrefixPolicy::Holders(const std::string& prefix, int gpu) const {
  auto it = copies_.find({prefix, gpu});
  return it == copies_.end() ? 0 : it->second.holders;
}

int64_t PrefixPolicy::ResidentBytes(int gpu) const {
  return Valid(gpu) ? resident_[static_cast<size_t>(gpu)] : 0;
}

void PrefixPolicy::SetBaseCapacity(int gpu, int64_t bytes) {
  if (Valid(gpu)) base_[static_cast<size_t>(gpu)] = bytes;
}

int64_t PrefixPolicy::BaseCapacity(int gpu) const {
  return Valid(gpu) ? base_[static_cast<size_t>(gpu)] : 0;
}

int64_t PrefixPolicy::CapacityLeft(int gpu) const {
  return std::max<int64_t>(0, BaseCapacity(gpu) - ResidentBytes(gpu));
}

absl::Status PrefixPolicy::ApplyCapacity(RingScheduler& scheduler, int gpu) const {
  if (!Valid(gpu)) return absl::InvalidArgumentError(absl::StrCat("unknown GPU ", gpu));
  return scheduler.SetMemoryCapacity(gpu, CapacityLeft(gpu));
}

bool PrefixPolicy::WaitsForResidents(int gpu, int64_t bytes) const {
  return Valid(gpu) && bytes <= BaseCapacity(gpu) && bytes > CapacityLeft(gpu);
}

absl::StatusOr<Admission> PrefixPolicy::Admit(RingScheduler& scheduler,
                                              const AdmitRequest& r) const {
  if (WaitsForResidents(r.gpu, r.full_kv_bytes)) return Admission{};  // queued
  return scheduler.Admit(r);
}

std::optional<SharedBooking> PrefixPolicy::FindShared(const std::string& prefix, int gpu,
                                                      int64_t min_verify_slot,
                                                      int64_t max_verify_slot) const {
  auto it = shared_.find({prefix, gpu});
  if (it == shared_.end()) return std::nullopt;
  const int64_t d = it->second.verify_slot;
  if (d < min_verify_slot || d > max_verify_slot) return std::nullopt;
  return it->second;
}

bool PrefixPolicy::JoinsAtOnce(const SharedBooking& shared, int64_t target_verify_slot) {
  return shared.verify_slot <= target_verify_slot;
}

bool PrefixPolicy::JoinsInsteadOf(const SharedBooking& shared, const Admission& own) {
  return own.queued || own.booking.verify_slot >= shared.verify_slot;
}

void PrefixPolicy::NoteShared(const std::string& prefix, int gpu, const Booking& booking) {
  shared_[{prefix, gpu}] = SharedBooking{booking.id, booking.first_slot(), booking.verify_slot};
}

void PrefixPolicy::ExpireShared(int64_t now) {
  for (auto it = shared_.begin(); it != shared_.end();) {
    it = it->second.verify_slot < now ? shared_.erase(it) : std::next(it);
  }
}

void PrefixPolicy::StartUsers(int64_t booking_id) { users_[booking_id] = 1; }

bool PrefixPolicy::AddUser(int64_t booking_id) {
  auto it = users_.find(booking_id);
  if (it == users_.end()) return false;
  ++it->second;
  return true;
}

bool PrefixPolicy::DropUser(int64_t booking_id) {
  auto it = users_.find(booking_id);
  if (it == users_.end()) return true;
  if (--it->second > 0) return false;
  users_.erase(it);
  return true;
}

int PrefixPolicy::Users(int64_t booking_id) const {
  auto it = users_.find(booking_id);
  return it == users_.end() ? 0 : it->second;
}

}  // namespace vc
