#include "common/scheduler/ring_scheduler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace vc {
namespace {

// Slack when comparing seconds booked with the slot duration, so that a slot
// filled exactly by floating-point shares still counts as fitting.
constexpr double kSlack = 1e-9;

}  // namespace

absl::Status RingSchedulerOptions::Validate() const {
  if (!(slot_seconds > 0) || !std::isfinite(slot_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat("slot_seconds must be > 0, got ", slot_seconds));
  }
  if (window_slots < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("window_slots must be >= 3, got ", window_slots));
  }
  if (links.empty()) return absl::InvalidArgumentError("at least one link is needed");
  if (gpus.empty()) return absl::InvalidArgumentError("at least one GPU is needed");
  for (const RingGpu& g : gpus) {
    if (g.transient_capacity_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU '", g.name, "': transient capacity must be > 0"));
    }
  }
  for (const RingLink& l : links) {
    if (!std::isfinite(l.bytes_per_second)) {
      return absl::InvalidArgumentError(absl::StrCat("link '", l.name, "': bad bandwidth"));
    }
    if (l.sharing == RingLink::Sharing::kPerVerifier &&
        (l.gpu < 0 || l.gpu >= static_cast<int>(gpus.size()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("link '", l.name, "': a per-verifier link needs a valid gpu, got ", l.gpu));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RingScheduler> RingScheduler::Create(const RingSchedulerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return RingScheduler(options);
}

RingScheduler::RingScheduler(const RingSchedulerOptions& options)
    : options_(options), link_(options.links.size()), mem_(options.gpus.size()) {
  stats_.overrun_seconds.assign(options.links.size(), 0.0);
  stats_.peak_slot_seconds.assign(options.links.size(), 0.0);
  stats_.peak_memory_bytes.assign(options.gpus.size(), 0);
}

int RingScheduler::ReloadSlots(int64_t bytes, int link) const {
  const double bw = options_.links[link].bytes_per_second;
  if (bw <= 0 || bytes <= 0) return 1;
  const double l = static_cast<double>(bytes) / bw;
  const double slots = std::ceil(l / options_.slot_seconds - kSlack);
  return static_cast<int>(std::clamp(slots, 1.0, 1e9));
}

void RingScheduler::EnsureTracked(int64_t slot) {
  const size_t need = static_cast<size_t>(slot - now_ + 1);
  for (auto& ring : link_) {
    if (ring.size() < need) ring.resize(need, 0.0);
  }
  for (auto& ring : mem_) {
    if (ring.size() < need) ring.resize(need, 0);
  }
}

double& RingScheduler::LinkAt(int link, int64_t slot) { return link_[link][slot - now_]; }
int64_t& RingScheduler::MemAt(int gpu, int64_t slot) { return mem_[gpu][slot - now_]; }

double RingScheduler::LinkBooked(int link, int64_t slot) const {
  if (link < 0 || link >= static_cast<int>(link_.size()) || slot < now_) return 0;
  const auto& ring = link_[link];
  return slot - now_ < static_cast<int64_t>(ring.size()) ? ring[slot - now_] : 0.0;
}

int64_t RingScheduler::MemoryBooked(int gpu, int64_t slot) const {
  if (gpu < 0 || gpu >= static_cast<int>(mem_.size()) || slot < now_) return 0;
  const auto& ring = mem_[gpu];
  return slot - now_ < static_cast<int64_t>(ring.size()) ? ring[slot - now_] : 0;
}

std::vector<double> RingScheduler::LinkOccupancy(int link, int count) const {
  std::vector<double> out(std::max(0, count));
  for (int i = 0; i < count; ++i) out[i] = LinkBooked(link, now_ + i);
  return out;
}

std::vector<int64_t> RingScheduler::MemoryOccupancy(int gpu, int count) const {
  std::vector<int64_t> out(std::max(0, count));
  for (int i = 0; i < count; ++i) out[i] = MemoryBooked(gpu, now_ + i);
  return out;
}

int64_t RingScheduler::PeakMemoryBooked(int gpu) const {
  if (gpu < 0 || gpu >= static_cast<int>(mem_.size())) return 0;
  int64_t peak = 0;
  for (const int64_t b : mem_[gpu]) peak = std::max(peak, b);
  return peak;
}

const Booking* RingScheduler::Find(int64_t id) const {
  auto it = bookings_.find(id);
  return it == bookings_.end() ? nullptr : &it->second;
}

bool RingScheduler::PackReload(int link, int64_t d, double transfer_seconds,
                               std::vector<double>* shares) const {
  const double t = options_.slot_seconds;
  // Walk back from the verify slot taking each slot's free time until the
  // transfer is covered: the reload streams without a pause and ends as the
  // verify slot begins (just in time), and its first slot may be one that
  // another reload already partly uses. A slot with no free time before the
  // transfer is covered means it would have to pause: it does not fit here.
  // Reloads never start in the current slot.
  std::vector<double> backwards;
  double remaining = transfer_seconds;
  for (int64_t slot = d - 1; remaining > t * kSlack; --slot) {
    if (slot <= now_) return false;
    const double take = std::min(std::max(0.0, t - LinkBooked(link, slot)), remaining);
    if (take <= t * kSlack) return false;
    backwards.push_back(take);
    remaining -= take;
  }
  shares->assign(backwards.rbegin(), backwards.rend());
  return true;
}

bool RingScheduler::Fits(const AdmitRequest& r, int64_t d, bool check_link, Booking* b) const {
  const double t = options_.slot_seconds;
  const double l = b->transfer_seconds;
  b->issue_offset_seconds = 0;
  if (check_link && l > 0 && options_.pack_reloads) {
    if (!PackReload(r.link, d, l, &b->slot_seconds)) return false;
    b->issue_offset_seconds = std::max(0.0, t - b->slot_seconds[0]);
    b->reload_slots = static_cast<int>(b->slot_seconds.size());
  } else {
    // Whole slots, then the remainder (an unlimited link books one slot of
    // nothing).
    const int s = ReloadSlots(r.full_kv_bytes, r.link);
    b->slot_seconds.assign(static_cast<size_t>(s), t);
    b->slot_seconds[static_cast<size_t>(s - 1)] = std::max(0.0, l - (s - 1) * t);
    b->reload_slots = s;
    if (check_link) {
      for (int i = 0; i < s; ++i) {
        if (LinkBooked(r.link, d - s + i) + b->slot_seconds[i] > t * (1 + kSlack)) return false;
      }
    }
  }
  const int64_t cap = options_.gpus[r.gpu].transient_capacity_bytes;
  for (int64_t slot = d - b->reload_slots; slot <= d; ++slot) {
    if (MemoryBooked(r.gpu, slot) + r.full_kv_bytes > cap) return false;
  }
  b->verify_slot = d;
  return true;
}

void RingScheduler::Book(const Booking& b) {
  EnsureTracked(b.verify_slot);
  const double t = options_.slot_seconds;
  for (int i = 0; i < b.reload_slots; ++i) {
    double& booked = LinkAt(b.link, b.first_slot() + i);
    // Only lock-step books past the limit: record by how much.
    const double over_before = std::max(0.0, booked - t);
    booked += b.slot_seconds[i];
    stats_.overrun_seconds[b.link] += std::max(0.0, booked - t) - over_before;
  }
  for (int64_t slot = b.first_slot(); slot <= b.verify_slot; ++slot) {
    MemAt(b.gpu, slot) += b.full_kv_bytes;
  }
  bookings_.emplace(b.id, b);
  ++stats_.admitted;
  stats_.max_offset = std::max(stats_.max_offset, b.verify_slot - now_);
}

absl::StatusOr<Admission> RingScheduler::Admit(const AdmitRequest& r) {
  if (r.link < 0 || r.link >= static_cast<int>(options_.links.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown link ", r.link));
  }
  if (r.gpu < 0 || r.gpu >= static_cast<int>(options_.gpus.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown gpu ", r.gpu));
  }
  const RingLink& link = options_.links[r.link];
  if (link.sharing == RingLink::Sharing::kPerVerifier && link.gpu != r.gpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("link '", link.name, "' is dedicated to gpu ", link.gpu, ", not gpu ", r.gpu));
  }
  if (r.full_kv_bytes < 0) return absl::InvalidArgumentError("negative full_kv_bytes");
  if (bookings_.count(r.id) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, " is already booked"));
  }
  if (r.full_kv_bytes > options_.gpus[r.gpu].transient_capacity_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request ", r.id, ": full KV of ", r.full_kv_bytes, " bytes exceeds gpu '",
                     options_.gpus[r.gpu].name, "' transient capacity of ",
                     options_.gpus[r.gpu].transient_capacity_bytes, " bytes"));
  }

  // S on an empty link: the fewest reload slots any placement can have.
  const int s = ReloadSlots(r.full_kv_bytes, r.link);
  const double l = link.bytes_per_second > 0
                       ? static_cast<double>(r.full_kv_bytes) / link.bytes_per_second
                       : 0.0;

  Booking b;
  b.id = r.id;
  b.link = r.link;
  b.gpu = r.gpu;
  b.full_kv_bytes = r.full_kv_bytes;
  b.transfer_seconds = l;
  b.lock_step = options_.lock_step;

  const int64_t w = options_.window_slots;
  const int64_t lo = std::max<int64_t>(s + 1, std::max(1, r.min_offset));
  const int64_t hi = w - 1;
  // Past the last tracked slot every ring is empty, so an upward search
  // always ends by then.
  const auto search_up = [&](int64_t from, bool check_link) {
    const int64_t tracked_end = now_ + static_cast<int64_t>(mem_[r.gpu].size());
    int64_t d = from;
    while (!Fits(r, d, check_link, &b) && d <= tracked_end + s + 1) ++d;
    return d;
  };

  Admission a;
  if (options_.lock_step) {
    if (lock_step_slot_ < now_ + lo) {
      // Open a new round at the target (within the window when possible).
      lock_step_slot_ = now_ + std::clamp<int64_t>(r.target_offset, lo, std::max(lo, hi));
    }
    search_up(lock_step_slot_, /*check_link=*/false);
    b.beyond_window = b.verify_slot - now_ > hi;
    if (b.beyond_window) ++stats_.beyond_window;
    Book(b);
    a.queued = false;
    a.booking = b;
    return a;
  }

  if (lo > hi) {
    // A reload too long for the window (or a caller that cannot verify
    // within it): book it at the first slot where it fits, however far.
    search_up(now_ + lo, /*check_link=*/true);
    b.beyond_window = true;
    ++stats_.beyond_window;
    Book(b);
    a.queued = false;
    a.booking = b;
    return a;
  }
  const int64_t anchor = std::clamp<int64_t>(r.target_offset, lo, hi);
  for (int64_t k = 0; anchor + k <= hi || anchor - k >= lo; ++k) {
    // x, then x+1 before x-1, x+2 before x-2, ...; the anchor once.
    for (const int64_t off : {anchor + k, anchor - k}) {
      if (off >= lo && off <= hi && Fits(r, now_ + off, /*check_link=*/true, &b)) {
        Book(b);
        a.queued = false;
        a.booking = b;
        return a;
      }
      if (k == 0) break;
    }
  }
  ++stats_.queued;
  return a;
}

absl::StatusOr<Booking> RingScheduler::BookTransfer(const TransferRequest& r) {
  if (r.link < 0 || r.link >= static_cast<int>(options_.links.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown link ", r.link));
  }
  if (r.bytes < 0) return absl::InvalidArgumentError("negative transfer bytes");
  if (!(r.elapsed_seconds >= 0) || !std::isfinite(r.elapsed_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("elapsed_seconds must be finite and >= 0, got ", r.elapsed_seconds));
  }
  if (bookings_.count(r.id) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, " is already booked"));
  }
  const double t = options_.slot_seconds;
  const double bw = options_.links[r.link].bytes_per_second;
  Booking b;
  b.id = r.id;
  b.link = r.link;
  b.gpu = -1;
  b.transfer_only = true;
  b.lock_step = options_.lock_step;
  b.transfer_seconds = bw > 0 ? static_cast<double>(r.bytes) / bw : 0.0;
  // Earliest placement: from the current slot on, each slot's free time
  // until the transfer is covered. The current slot offers only what is
  // left of it, less all it has booked (that may still be ahead of us).
  // Slots past the tracked range are free, so the walk ends.
  int64_t first = now_;
  double remaining = b.transfer_seconds;
  for (int64_t slot = now_; remaining > t * kSlack; ++slot) {
    double free = t - LinkBooked(r.link, slot);
    if (slot == now_) free -= r.elapsed_seconds;
    if (free <= t * kSlack) {
      // A full slot: before the start it delays the start; after it, the
      // transfer streams on in the next free slot (0 booked here).
      if (!b.slot_seconds.empty()) b.slot_seconds.push_back(0.0);
      continue;
    }
    if (b.slot_seconds.empty()) first = slot;
    const double take = std::min(free, remaining);
    b.slot_seconds.push_back(take);
    remaining -= take;
  }
  // Nothing to move (an unlimited link, no bytes): one slot of nothing, now.
  if (b.slot_seconds.empty()) b.slot_seconds.push_back(0.0);
  b.reload_slots = static_cast<int>(b.slot_seconds.size());
  b.verify_slot = first + b.reload_slots;
  EnsureTracked(b.verify_slot - 1);
  for (int i = 0; i < b.reload_slots; ++i) LinkAt(b.link, first + i) += b.slot_seconds[i];
  bookings_.emplace(b.id, b);
  ++stats_.transfers;
  return b;
}

absl::Status RingScheduler::ShrinkTransfer(int64_t id, int64_t bytes) {
  auto it = bookings_.find(id);
  if (it == bookings_.end()) return absl::NotFoundError(absl::StrCat("no booking for ", id));
  Booking& b = it->second;
  if (!b.transfer_only) {
    return absl::InvalidArgumentError(absl::StrCat("booking ", id, " is not a transfer"));
  }
  if (bytes < 0) return absl::InvalidArgumentError("negative transfer bytes");
  const double bw = options_.links[b.link].bytes_per_second;
  const double seconds = bw > 0 ? static_cast<double>(bytes) / bw : 0.0;
  if (seconds > b.transfer_seconds * (1 + kSlack) + kSlack) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer ", id, " moved ", bytes, " bytes, more than it booked"));
  }
  // The bytes stream from the booking's start at the booked pace, so they
  // used its first `seconds`; what follows, where still ahead, is free.
  double kept = 0;
  for (int i = 0; i < b.reload_slots; ++i) {
    const double keep = std::min(b.slot_seconds[i], std::max(0.0, seconds - kept));
    const double excess = b.slot_seconds[i] - keep;
    kept += keep;
    const int64_t slot = b.first_slot() + i;
    if (excess <= 0 || slot < now_) continue;
    LinkAt(b.link, slot) = std::max(0.0, LinkAt(b.link, slot) - excess);
    b.slot_seconds[i] = keep;
  }
  b.transfer_seconds = seconds;
  return absl::OkStatus();
}

absl::Status RingScheduler::Release(int64_t id) {
  auto it = bookings_.find(id);
  if (it == bookings_.end()) return absl::NotFoundError(absl::StrCat("no booking for ", id));
  const Booking& b = it->second;
  // A transfer that has started occupies the link for its booked time
  // however soon its sender hears back (bytes handed to a paced link are
  // still streaming): freeing that time would let the next transfers
  // oversubscribe the link. Only one not yet started gives its slots back.
  const bool started = b.transfer_only && b.first_slot() <= now_;
  for (int i = 0; i < b.reload_slots && !started; ++i) {
    const int64_t slot = b.first_slot() + i;
    if (slot >= now_)
      LinkAt(b.link, slot) = std::max(0.0, LinkAt(b.link, slot) - b.slot_seconds[i]);
  }
  for (int64_t slot = std::max(now_, b.first_slot()); !b.transfer_only && slot <= b.verify_slot;
       ++slot) {
    MemAt(b.gpu, slot) -= b.full_kv_bytes;
  }
  bookings_.erase(it);
  ++stats_.released;
  return absl::OkStatus();
}

void RingScheduler::Advance(int64_t slots) {
  for (int64_t i = 0; i < slots; ++i) {
    for (size_t l = 0; l < link_.size(); ++l) {
      auto& ring = link_[l];
      if (ring.empty()) continue;
      stats_.peak_slot_seconds[l] = std::max(stats_.peak_slot_seconds[l], ring.front());
      ring.pop_front();
    }
    for (size_t g = 0; g < mem_.size(); ++g) {
      auto& ring = mem_[g];
      if (ring.empty()) continue;
      stats_.peak_memory_bytes[g] = std::max(stats_.peak_memory_bytes[g], ring.front());
      ring.pop_front();
    }
    ++now_;
  }
}

absl::Status RingScheduler::SetSlotSeconds(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return absl::InvalidArgumentError(absl::StrCat("slot_seconds must be > 0, got ", seconds));
  }
  options_.slot_seconds = seconds;
  return absl::OkStatus();
}

absl::Status RingScheduler::SetMemoryCapacity(int gpu, int64_t bytes) {
  if (gpu < 0 || gpu >= static_cast<int>(options_.gpus.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown gpu ", gpu));
  }
  if (bytes < 0) return absl::InvalidArgumentError("negative capacity");
  options_.gpus[gpu].transient_capacity_bytes = bytes;
  return absl::OkStatus();
}

}  // namespace vc
