// Prefix sharing and residency: the rules that decide where requests over one
// stored prefix go and how they share that prefix's KV, next to the ring
// scheduler that books the reloads. A pure policy object like RingScheduler
// (no threads, no clock), run by the coordinator (through SlotClock, under
// wall time) and by the simulator (under its virtual clock), so both apply the
// same rules:
//  * placement: one home per prefix. Requests over a prefix go to the live
//    worker that rendezvous hashing picks for the prefix (a prompt without a
//    stored prefix by its session), so they meet on one verifier; only the
//    keys of a worker that goes down move.
//  * residency: a worker keeps one copy of a prefix's KV however many requests
//    use it (refcounted per (prefix, worker)); resident bytes lower the memory
//    capacity the ring scheduler may book reloads into on that worker.
//  * admission: a reload that fits the worker's configured capacity but not
//    what the resident copies leave waits (queued) until they are released;
//    one that exceeds the configured capacity is the scheduler's error.
//  * joining: a round over a prefix may join the latest booking of that prefix
//    on the same worker while its verify slot is still ahead (verified in the
//    same pass, loaded once) instead of booking a second reload. It joins when
//    that verify is no later than the round wants it, or when a booking of
//    its own would verify no earlier (or would have to wait): then joining
//    costs no time and saves the reload (JoinsAtOnce, JoinsInsteadOf); the
//    booking is released when its last user leaves (StartUsers, AddUser,
//    DropUser).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/scheduler/ring_scheduler.h"

namespace vc {

// The placement key of a request: its prefix, or its session when the prompt
// has no stored prefix (`prefix_key` empty).
std::string PlacementKey(const std::string& prefix_key, uint64_t session);

// The live worker for `key` by rendezvous hashing over `live` (one entry per
// worker); nullopt when none is live. Deterministic across processes and
// builds (a fixed hash, not std::hash).
std::optional<int> PlaceByKey(const std::string& key, const std::vector<bool>& live);

// A booking other rounds over the same prefix may join.
struct SharedBooking {
  int64_t booking_id = 0;  // the RingScheduler booking that holds the copy
  int64_t first_slot = 0;
  int64_t verify_slot = 0;
};

class PrefixPolicy {
 public:
  // One configured capacity (bytes of transient memory) per worker, the
  // RingScheduler's GPUs in the same order.
  explicit PrefixPolicy(std::vector<int64_t> base_capacity);
  // The capacities of `scheduler`'s GPUs as configured.
  static PrefixPolicy ForScheduler(const RingScheduler& scheduler);

  int workers() const { return static_cast<int>(base_.size()); }

  // Residency. Hold makes `prefix` resident on `gpu` (its first holder sets
  // the bytes; later holders share that copy) and returns true when the
  // resident bytes changed; Release drops one holder and returns true when
  // the last one left. An unknown gpu, bytes <= 0, or a prefix not held are
  // ignored (false): callers hold for every session, whether or not it has a
  // prefix.
  bool Hold(const std::string& prefix, int gpu, int64_t bytes);
  bool Release(const std::string& prefix, int gpu);
  bool IsResident(const std::string& prefix, int gpu) const;
  int Holders(const std::string& prefix, int gpu) const;
  // Bytes of resident copies on `gpu` (0 for an unknown gpu).
  int64_t ResidentBytes(int gpu) const;

  // The configured capacity may change (the simulator's long-context GPUs
  // reserve each admitted request's own KV); ignored for an unknown gpu.
  void SetBaseCapacity(int gpu, int64_t bytes);
  int64_t BaseCapacity(int gpu) const;
  // What the resident copies leave of the configured capacity (>= 0).
  int64_t CapacityLeft(int gpu) const;
  // Sets `scheduler`'s memory capacity of `gpu` to CapacityLeft(gpu).
  absl::Status ApplyCapacity(RingScheduler& scheduler, int gpu) const;

  // The admission rule: true when a reload of `bytes` into `gpu` fits the
  // configured capacity but not what resident copies leave (it must wait
  // for them to go, rather than be refused).
  bool WaitsForResidents(int gpu, int64_t bytes) const;
  // RingScheduler::Admit under that rule: queued while WaitsForResidents.
  absl::StatusOr<Admission> Admit(RingScheduler& scheduler, const AdmitRequest& r) const;

  // Joining. The latest booking of `prefix` on `gpu` whose verify slot lies in
  // [min_verify_slot, max_verify_slot], if any.
  std::optional<SharedBooking> FindShared(const std::string& prefix, int gpu,
                                          int64_t min_verify_slot, int64_t max_verify_slot) const;
  // The join rule, in two steps around the round's own admission attempt.
  // Before it: true when `shared`'s verify is no later than the round's
  // target verify slot (join; book nothing).
  static bool JoinsAtOnce(const SharedBooking& shared, int64_t target_verify_slot);
  // After it: true when the round's own admission (`own`) was queued or
  // would verify no earlier than `shared` (release it, if booked, and join).
  static bool JoinsInsteadOf(const SharedBooking& shared, const Admission& own);
  // Records `booking` as the one later rounds over `prefix` on `gpu` join.
  void NoteShared(const std::string& prefix, int gpu, const Booking& booking);
  // Forgets the bookings whose verify slot is before `now` (nobody can join
  // them any more).
  void ExpireShared(int64_t now);

  // Users of a booking: the round that booked it and the rounds that joined
  // it, all verifying on the one copy it loads. The booking goes back to the
  // ring only when its last user leaves, so a joined round's copy stays
  // booked until its own verify is over. StartUsers: a new booking's first
  // user. AddUser: one more; false when the booking is not tracked (its
  // users are gone and it was released: nothing to join). DropUser: true
  // when the caller must now release the booking on the ring (its last user
  // left, or it was never tracked).
  void StartUsers(int64_t booking_id);
  bool AddUser(int64_t booking_id);
  bool DropUser(int64_t booking_id);
  int Users(int64_t booking_id) const;

 private:
  struct Resident {
    int64_t bytes = 0;
    int holders = 0;
  };
  bool Valid(int gpu) const { return gpu >= 0 && gpu < workers(); }

  std::vector<int64_t> base_;      // per worker, as configured
  std::vector<int64_t> resident_;  // per worker
  std::map<std::pair<std::string, int>, Resident> copies_;
  std::map<std::pair<std::string, int>, SharedBooking> shared_;
  std::map<int64_t, int> users_;  // booking id -> users
};

}  // namespace vc
