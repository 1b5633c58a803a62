// The ring scheduler of DESIGN.md section 6: decides when each request's
// full-KV reload runs and in which slot its verify pass happens, so that no
// link and no GPU's memory is oversubscribed.
//
// It is a pure policy object: no threads, no clocks, no engine. Time is a
// sequence of slots of `slot_seconds` each; the caller (the long-context
// runtime, a coordinator, or a discrete-event simulator with a virtual clock)
// says when a slot ends by calling Advance(). Everything is booked in slot
// units over a lookahead window of W slots [now, now + W):
//  * one bandwidth ring per link: the transfer seconds booked in each slot
//    (at most slot_seconds per slot: a link moves one transfer at a time);
//  * one memory ring per GPU worker: the transient full KV booked in each slot
//    (at most that GPU's transient capacity).
//
// A booking for request r, whose full KV takes l = bytes / BW seconds to
// move, has S = max(1, ceil(l / slot_seconds)) reload slots on an empty link
// (one more when packed behind another reload, see below). Slot convention
// (one slot = one iteration of the GPU that verifies):
//
//     reload slots:  [d - S, d - 1]   the link streams r's full KV; each slot is
//                                     booked slot_seconds of transfer, the last
//                                     one the remainder (l - (S-1)*slot_seconds)
//     verify slot:   d                the iteration whose forward pass runs the
//                                     verify (the KV must have landed before it)
//     memory span:   [d - S, d]       the full KV is resident from the start of
//                                     the reload until the verify pass is over
//
// (The paper writes the span as [d-S+1, d] with d the slot the reload lands
// in; its d is our d - 1. Ours adds the verify slot to the memory span because
// the copy is still resident while the verify pass runs, and the next reload
// may already be streaming then.)
//
// Packing (pack_reloads, the default): a reload may also use the leftover of
// slots another reload partly books. It is placed just in time: walking back
// from slot d - 1 it takes each slot's free time until its transfer is
// covered, so it streams without a pause and ends as slot d begins; its first
// slot holds the remainder, and the caller issues it that far into the slot
// (Booking::issue_offset_seconds). A slot with no free time before the
// transfer is covered rejects that d (a pause would hold memory for nothing).
// Without packing the span is whole slots, S of them, the remainder in the
// last one, and every booked slot must have that share free; reloads shorter
// than a slot then leave the rest of their slot unused (31 ms reloads in
// 48 ms slots cap the link at 65%). Packing fills the link at the price of a
// memory span up to one slot longer.
//
// Admit() tries verify slots at the caller's target offset x, then x+1, x-1,
// x+2, x-2, ... (later first on ties: an earlier verify cuts a draft short),
// clamped to [max(S + 1, min_offset), W - 1] slots from now, and books the
// first whose span fits both rings; if none fits it answers "queued" and the
// caller retries next slot. Offsets >= S + 1 mean that a reload never starts
// in the current slot: the caller issues reloads at the start of a slot, before
// it admits. A reload too long for the window (S + 1 > W - 1) is booked at the
// first slot past the window where it fits, however far, so it never starves.
//
// Link-only transfers (BookTransfer): bytes that cross a link but hold no
// GPU memory and have no verify slot, e.g. the exact K/V rows of a round's
// KV refresh on the slow link (DESIGN.md section 3). A transfer is placed as
// early as it can go: from the current slot (only what is left of it after
// `elapsed_seconds` and what is already booked there) onwards it takes each
// slot's free time until it is covered; the caller issues it at the start of
// its first slot (at once if that is the current one). Transfers respect the
// per-slot limit in lock-step mode too (the ablation concerns verifies), so
// the ring is never overbooked by them. An unlimited link books nothing and
// starts now. Release() of a transfer that has started (its first slot has
// come) only forgets it: its bytes occupy the link for the booked time
// however soon the sender hears back. One not yet started gives its slots
// back (it was cancelled).
//
// Lock-step mode (the ablation baseline of the paper's Figure 6a): every
// request admitted while a round is open is put on the round's common verify
// slot; the bandwidth ring's per-slot limit is ignored (what is booked beyond
// slot_seconds is recorded as overrun) but memory is still respected: a
// request whose full KV does not fit the common slot gets the first later slot
// where it does.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc {

struct RingLink {
  std::string name = "link";
  // Bytes per second; <= 0 means unlimited (every reload takes one slot).
  double bytes_per_second = 0;
  // Who shares the link's time.
  //  kShared (the default): one link that serialises every reload booked on
  //    it, whatever GPU it feeds: the KV store's NIC in the remote-prefix
  //    setting, the host's PCIe link in the single-node one.
  //  kPerVerifier: a link dedicated to one GPU (`gpu`), e.g. a verifier's own
  //    NIC or PCIe lanes; only reloads into that GPU may be booked on it.
  enum class Sharing { kShared, kPerVerifier };
  Sharing sharing = Sharing::kShared;
  int gpu = -1;  // kPerVerifier only
};

struct RingGpu {
  std::string name = "gpu";
  // Bytes of GPU memory for transient full KV (what is left after weights
  // and resident KV). Must be > 0.
  int64_t transient_capacity_bytes = 0;
};

struct RingSchedulerOptions {
  double slot_seconds = 0.05;  // duration of one slot (calibrated by the caller)
  int window_slots = 64;       // W >= 3
  bool lock_step = false;
  // Let reloads use the leftover of partly booked slots (see above). Ignored
  // in lock-step mode, which does not check the link.
  bool pack_reloads = true;
  std::vector<RingLink> links = {RingLink{}};
  std::vector<RingGpu> gpus;

  absl::Status Validate() const;
};

struct AdmitRequest {
  int64_t id = 0;
  int64_t full_kv_bytes = 0;  // bytes the reload moves and keeps resident
  int target_offset = 1;      // x: the desired verify slot, in slots from now
  // The earliest verify slot (in slots from now) the caller can use, e.g. a
  // request that cannot cut its draft short passes min_offset = target.
  int min_offset = 1;
  int link = 0;
  int gpu = 0;
};

// A link-only transfer (see the header comment).
struct TransferRequest {
  int64_t id = 0;
  int64_t bytes = 0;  // what crosses the link
  int link = 0;
  // How far the current slot has already run (seconds, from the caller's
  // clock): only the rest of it can still carry the transfer. A simulator
  // that books at slot boundaries passes 0.
  double elapsed_seconds = 0;
};

struct Booking {
  int64_t id = 0;
  int link = 0;
  int gpu = 0;
  int64_t full_kv_bytes = 0;
  int64_t verify_slot = 0;  // absolute slot of the verify pass (d)
  int reload_slots = 0;     // S
  double transfer_seconds = 0;
  std::vector<double> slot_seconds;  // transfer seconds booked in each reload slot
  bool beyond_window = false;        // a long reload booked past the window
  bool lock_step = false;
  // A link-only transfer (BookTransfer): reload_slots counts the slots it
  // streams through from first_slot() (some may hold 0 seconds), verify_slot
  // is the slot after them, and no GPU memory is booked (gpu = -1).
  bool transfer_only = false;

  // The slot in which the reload is issued: d - S.
  int64_t first_slot() const { return verify_slot - reload_slots; }
  // How far into first_slot() to issue it: a packed reload's first slot
  // holds only its remainder, which streams at the end of the slot. 0 for an
  // unpacked reload (issued at the slot's start).
  double issue_offset_seconds = 0;
};

struct Admission {
  bool queued = true;  // nothing fits now: retry next slot
  Booking booking;     // when !queued
};

struct RingSchedulerStats {
  int64_t admitted = 0;
  int64_t queued = 0;  // Admit calls answered "queued"
  int64_t released = 0;
  int64_t transfers = 0;      // link-only transfers booked (BookTransfer)
  int64_t beyond_window = 0;  // long reloads booked past the window
  int64_t max_offset = 0;     // largest verify offset booked
  // Per link: seconds booked beyond the slot duration, measured when booked
  // (only lock-step books beyond the limit; a later recalibration does not
  // count), and the peak seconds booked in one passed slot.
  std::vector<double> overrun_seconds;
  std::vector<double> peak_slot_seconds;
  // Per GPU: peak transient bytes booked in one passed slot.
  std::vector<int64_t> peak_memory_bytes;
};

class RingScheduler {
 public:
  static absl::StatusOr<RingScheduler> Create(const RingSchedulerOptions& options);

  // Books `r` (see the header comment) or answers queued. InvalidArgument for
  // an unknown link or GPU, a per-verifier link of another GPU, an id already
  // booked, or negative bytes; ResourceExhausted if r's full KV exceeds the
  // GPU's transient capacity (it could never fit).
  absl::StatusOr<Admission> Admit(const AdmitRequest& r);

  // Books a link-only transfer (see the header comment): the earliest
  // placement from the current slot on, never more than a slot's duration
  // in any slot, however many are booked. InvalidArgument for an unknown
  // link, an id already booked, negative bytes or a negative or non-finite
  // elapsed_seconds.
  absl::StatusOr<Booking> BookTransfer(const TransferRequest& r);

  // A transfer booked for more bytes than it turned out to move (booked at
  // an upper bound before its size was known, e.g. a peer round's KV
  // refresh): it keeps the link time `bytes` take from its start, and the
  // rest of its booking, in the current slot and later ones, is given back.
  // NotFound for an unknown id; InvalidArgument for a booking that is not a
  // transfer, negative bytes, or more bytes than were booked.
  absl::Status ShrinkTransfer(int64_t id, int64_t bytes);

  // Frees a booking's slots from now on (its verify finished, or it was
  // cancelled); a transfer that has started keeps its link time (see the
  // header comment). NotFound for an unknown id.
  absl::Status Release(int64_t id);

  // Ends the current slot: the window slides by `slots`. Bookings whose
  // verify slot has passed stay until released.
  void Advance(int64_t slots = 1);

  // Recalibration: later admissions and per-slot limits use the new duration;
  // seconds already booked stay as booked.
  absl::Status SetSlotSeconds(double seconds);
  // The transient memory of a GPU changes when resident KV comes or goes.
  // Lowering it below what is booked is allowed (nothing is moved); later
  // admissions see the new limit.
  absl::Status SetMemoryCapacity(int gpu, int64_t bytes);

  int64_t now() const { return now_; }
  double slot_seconds() const { return options_.slot_seconds; }
  int window_slots() const { return options_.window_slots; }
  bool lock_step() const { return options_.lock_step; }
  const RingSchedulerOptions& options() const { return options_; }

  // S for a reload of `bytes` on `link` at the current slot duration.
  int ReloadSlots(int64_t bytes, int link) const;

  const Booking* Find(int64_t id) const;
  const std::map<int64_t, Booking>& bookings() const { return bookings_; }

  // Occupancy, for metrics and plots: seconds booked on a link / bytes booked
  // on a GPU in absolute slot `slot` (0 outside the tracked range).
  double LinkBooked(int link, int64_t slot) const;
  int64_t MemoryBooked(int gpu, int64_t slot) const;
  // The same for slots [now, now + count).
  std::vector<double> LinkOccupancy(int link, int count) const;
  std::vector<int64_t> MemoryOccupancy(int gpu, int count) const;
  // Largest memory booked on `gpu` in any slot from now on.
  int64_t PeakMemoryBooked(int gpu) const;

  const RingSchedulerStats& stats() const { return stats_; }

 private:
  explicit RingScheduler(const RingSchedulerOptions& options);
  // Whether r's reload fits with verify slot `d`; if so, sets b's
  // verify_slot, reload_slots and slot_seconds (b->transfer_seconds is read).
  bool Fits(const AdmitRequest& r, int64_t d, bool check_link, Booking* b) const;
  // Packs a transfer of `transfer_seconds` into the free time of slots
  // (now, d) on `link`: the latest start whose free time covers it, then
  // streaming in each slot's free time from there. False if it cannot end
  // before slot d.
  bool PackReload(int link, int64_t d, double transfer_seconds, std::vector<double>* shares) const;
  void Book(const Booking& b);
  void EnsureTracked(int64_t slot);
  double& LinkAt(int link, int64_t slot);
  int64_t& MemAt(int gpu, int64_t slot);

  RingSchedulerOptions options_;
  int64_t now_ = 0;
  // ring[k] is slot now_ + k; grown on demand past the window for long
  // reloads, popped on Advance.
  std::vector<std::deque<double>> link_;
  std::vector<std::deque<int64_t>> mem_;
  std::map<int64_t, Booking> bookings_;
  int64_t lock_step_slot_ = -1;  // the open round's common verify slot
  RingSchedulerStats stats_;
};

}  // namespace vc
