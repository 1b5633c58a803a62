// The coordinator's admission controller: how many requests run and wait,
// and what each tenant may hold. At most max_active requests run; up to
// max_queued more wait (until a place frees, their caller goes away, their
// deadline passes or the coordinator stops); beyond that a request is refused
// with RESOURCE_EXHAUSTED. Per tenant: requests running or queued, prefixes
// pinned, and bytes of KV its ingests added. A tenant's bookkeeping is
// dropped once it holds nothing, so idle tenants cost no memory.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace vc::coordinator {

struct AdmissionOptions {
  int max_active = 64;
  int max_queued = 256;
  int max_requests_per_tenant = 128;
  int max_pins_per_tenant = 64;
  int64_t max_stored_bytes_per_tenant = 0;  // 0: no limit
  // How often a refused tenant's charges are checked against the store at
  // most (a lookup of up to kMaxChargedPrefixes keys each time).
  std::chrono::milliseconds stored_recheck_interval{1000};
};

// A tenant's stored bytes as the coordinator charges them: per prefix (the
// store key of its last full chunk) for up to kMaxChargedPrefixes prefixes,
// and the sum of any more (`unlisted`: never rechecked against the store,
// given back only by deletes' estimates).
inline constexpr size_t kMaxChargedPrefixes = 1024;
struct StoredCharges {
  std::map<std::string, int64_t> by_prefix;
  int64_t unlisted = 0;
  int64_t total() const;
  bool operator==(const StoredCharges&) const = default;
};

class StoredReservation;

// Where the controller reports (any may be null: unit tests).
struct AdmissionMetrics {
  metrics::Counter* rejections = nullptr;  // refused: queue full or tenant at its limit
  metrics::Gauge* queue_depth = nullptr;
  metrics::Gauge* active = nullptr;
};

class AdmissionController {
 public:
  using Clock = std::chrono::steady_clock;

  explicit AdmissionController(AdmissionOptions options, AdmissionMetrics metrics = {});

  // Takes a place for `tenant`'s request, waiting while max_active run.
  // `gone` says the caller went away (checked while waiting). OK: the request
  // runs and must Leave(); otherwise it holds nothing.
  [[nodiscard]] absl::Status Admit(const std::string& tenant, const std::function<bool()>& gone,
                                   Clock::time_point deadline);
  // Admit in steps, for a caller that waits without a thread (a coroutine):
  // Enter takes the tenant's place and a running place (kAdmitted) or a
  // place in the queue (kQueued, with its ticket), or refuses as Admit does;
  // a queued caller calls TryStart with its ticket until it is kAdmitted or
  // refused (which gives its places back). kAdmitted: it runs and must
  // Leave(). The queue is first come, first served: a freed place is handed
  // to the oldest queued request (and only it is told, NotifyTurn), and a new
  // request never starts ahead of queued ones.
  enum class Entry { kAdmitted, kQueued };
  using Ticket = uint64_t;
  struct Entered {
    Entry entry = Entry::kAdmitted;
    Ticket ticket = 0;  // kQueued: the caller's place in line
  };
  [[nodiscard]] absl::StatusOr<Entered> Enter(const std::string& tenant);
  // A ticket that was handed a place, or whose caller is gone, is past its
  // deadline or finds the controller stopped, leaves the queue here; a
  // ticket that holds a place but is refused gives it to the next in line.
  [[nodiscard]] absl::StatusOr<Entry> TryStart(const std::string& tenant, Ticket ticket, bool gone,
                                               Clock::time_point deadline);
  // Gives an admitted request's place back (to the oldest queued request, if
  // any); `completed` counts it among the completed requests (a Generate,
  // not a prefix registration).
  void Leave(const std::string& tenant, bool completed);
  // Wakes every waiter to look at its `gone` again.
  void Wake();
  // Wakes only `ticket`'s caller (a Cancel of that request, or its client
  // gone): the caller without a thread is told (NotifyTurn), or, if it is
  // between a TryStart and its NotifyTurn, that NotifyTurn returns false. A
  // thread waiting in Admit is not woken by it (it polls `gone`). A ticket
  // that is not queued is ignored, so made-up or stale tickets cost nothing.
  void Wake(Ticket ticket);
  // For a queued caller without a thread: calls `turn` once, on the thread
  // that hands the ticket a place (a Leave, or a refused ticket ahead of
  // it), or on the next Wake or Stop (its chance to TryStart again), unless
  // cancelled first. Returns false without keeping `turn` when the ticket
  // holds a place already, was woken since its last TryStart, is not queued
  // or the controller is stopped (the caller tries again at once: nothing
  // between its TryStart and this call goes unseen). At most one per ticket.
  [[nodiscard]] bool NotifyTurn(Ticket ticket, std::function<void()> turn);
  void CancelNotifyTurn(Ticket ticket);
  // Refuses new requests and ends the waits (UNAVAILABLE).
  void Stop();

  // Takes `estimate` bytes (the least that an ingest about to run will
  // store) of the tenant's stored-bytes budget for as long as the returned
  // reservation is held: RESOURCE_EXHAUSTED when its charges (StoredCharges)
  // and the ingests it has in flight already reach
  // max_stored_bytes_per_tenant, or would pass it with this one. Reserved
  // before the ingest, not merely checked, so that a tenant's concurrent
  // ingests cannot pass the limit together. With no limit set nothing is
  // reserved.
  [[nodiscard]] absl::StatusOr<StoredReservation> ReserveStored(const std::string& tenant,
                                                                int64_t estimate);
  // Charges an ingest's bytes of KV to the tenant under `prefix_key` (the
  // store key of the prefix's last full chunk), replacing the prefix's
  // earlier charge: a prefix ingested again after the store dropped it is
  // not counted twice.
  void ChargeStored(const std::string& tenant, const std::string& prefix_key, int64_t bytes);
  // Gives back the charges of `prefix_keys` (prefixes the store no longer
  // holds). GiveBackPrefix: one deleted prefix's; if it has no charge of its
  // own (charged among the unlisted), `unlisted_estimate` comes off those.
  void GiveBackStored(const std::string& tenant, const std::vector<std::string>& prefix_keys);
  void GiveBackPrefix(const std::string& tenant, const std::string& prefix_key,
                      int64_t unlisted_estimate);
  // The prefixes the tenant is charged for, to look up in the store when it
  // is refused (what was evicted or expired is given back); empty unless
  // stored_recheck_interval has passed since the tenant's last recheck.
  std::vector<std::string> PrefixesToRecheck(const std::string& tenant);
  // The charges are kept in the store too (the catalogue's tenant ledger),
  // since charges in memory alone would restart from zero with the
  // coordinator. Whether the tenant's charges are known to this process:
  // they are after LoadStored, and until the tenant's bookkeeping is
  // dropped. A coordinator that starts knows nobody's; the caller reads the
  // ledger (LoadStored) before it checks or changes them.
  bool StoredKnown(const std::string& tenant) const;
  // Sets the tenant's charges from its ledger, unless they are known already
  // (a load that lost a race with another request's would undo its charge).
  void LoadStored(const std::string& tenant, StoredCharges charges);
  // One ledger writer per tenant at a time, so that writes land in the
  // order of the changes. BeginLedgerWrite: the charges to write, or nothing
  // when another write is in flight (its writer writes this change after
  // it). EndLedgerWrite after a write (`written`: it succeeded): the charges
  // to write next when the write succeeded, they changed meanwhile and
  // `again`; else nothing (the writer is done; a change not written, or a
  // failed write, waits for the next BeginLedgerWrite and keeps the tenant's
  // bookkeeping until then).
  std::optional<StoredCharges> BeginLedgerWrite(const std::string& tenant);
  std::optional<StoredCharges> EndLedgerWrite(const std::string& tenant, bool written, bool again);
  // The sum of the tenant's charges (0 if it has no bookkeeping).
  int64_t stored_bytes(const std::string& tenant) const;
  // RESOURCE_EXHAUSTED when pinning `prefix_id` would pass max_pins_per_tenant.
  [[nodiscard]] absl::Status CheckPin(const std::string& tenant, const std::string& prefix_id);
  // Whether the tenant's pins are known to this process: they are after
  // LoadPins, and until the tenant's bookkeeping is dropped (it holds
  // nothing). A coordinator that starts knows nobody's: the store keeps the
  // pins, and the caller lists them there (LoadPins) before CheckPin.
  bool PinsKnown(const std::string& tenant) const;
  // Adds the prefixes the store says the tenant pins to its pins.
  void LoadPins(const std::string& tenant, const std::vector<std::string>& prefix_ids);
  // After a pin, unpin or delete of `prefix_id` was applied: `pinned` is
  // whether it is pinned now.
  void NotePrefix(const std::string& tenant, const std::string& prefix_id, bool pinned);

  const AdmissionOptions& options() const { return options_; }
  int active() const;
  int queued() const;
  int64_t completed() const;
  // Tenants with bookkeeping (for tests: idle ones are dropped).
  size_t tenants() const;

 private:
  friend class StoredReservation;
  // Gives back what ReserveStored took (the reservation's end).
  void EndStoredReservation(const std::string& tenant, int64_t estimate);
  struct Tenant {
    int requests = 0;               // running or queued
    std::set<std::string> pins;     // prefix ids pinned through ManagePrefix
    bool pins_loaded = false;       // LoadPins was called
    StoredCharges stored;           // what its ingests added
    int64_t reserved = 0;           // ReserveStored's estimates of ingests in flight
    bool stored_loaded = false;     // LoadStored was called
    bool ledger_writing = false;    // a BeginLedgerWrite's writer has not ended
    bool ledger_behind = false;     // the charges changed since the last write began
    Clock::time_point rechecked{};  // the last PrefixesToRecheck that listed any
  };
  // A queued request: its tenant, what to call when its turn comes, and
  // whether it was woken with no `turn` registered (its next NotifyTurn
  // then answers false; TryStart clears it).
  struct Waiter {
    std::string tenant;
    std::function<void()> turn;
    bool woken = false;
  };
  using Calls = std::vector<std::function<void()>>;
  absl::StatusOr<Entry> TryStartLocked(const std::string& tenant, Ticket ticket, bool gone,
                                       Clock::time_point deadline);  // mu_ held
  // Hands free places to the oldest queued tickets; their notifications
  // are added to `calls` (made outside mu_). mu_ held.
  void GrantLocked(Calls& calls);
  // `waiter`'s notification, taken (or, with none registered, the waiter
  // marked woken). mu_ held.
  static void TakeTurnLocked(Waiter& waiter, Calls& calls);
  // Makes `calls` (outside mu_) and wakes the threads waiting in Admit.
  void Tell(Calls& calls);
  int WaitingLocked() const;                     // queued, not handed a place; mu_ held
  void ForgetIfIdle(const std::string& tenant);  // mu_ held
  void SetGauges();                              // mu_ held

  const AdmissionOptions options_;
  const AdmissionMetrics metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int active_ = 0;  // running, and handed a place but not started yet
  int64_t completed_ = 0;
  std::map<std::string, Tenant> tenants_;
  // The queue in arrival order (tickets increase), and the tickets handed a
  // place that have not called TryStart since (counted in active_).
  std::map<Ticket, Waiter> queue_;
  std::set<Ticket> granted_;
  Ticket next_ticket_ = 1;
  uint64_t wakes_ = 0;  // Wake calls, for the threads waiting in Admit
};

// An ingest's reservation of stored bytes (AdmissionController::ReserveStored),
// ended by End() once the ingest's bytes are charged, or when it goes out of
// scope (the ingest failed).
class StoredReservation {
 public:
  StoredReservation() = default;  // holds nothing
  StoredReservation(StoredReservation&& other) noexcept { *this = std::move(other); }
  StoredReservation& operator=(StoredReservation&& other) noexcept;
  StoredReservation(const StoredReservation&) = delete;
  StoredReservation& operator=(const StoredReservation&) = delete;
  ~StoredReservation() { End(); }
  void End();

 private:
  friend class AdmissionController;
  StoredReservation(AdmissionController* admission, std::string tenant, int64_t bytes)
      : admission_(admission), tenant_(std::move(tenant)), bytes_(bytes) {}

  AdmissionController* admission_ = nullptr;  // null: nothing held
  std::string tenant_;
  int64_t bytes_ = 0;
};

}  // namespace vc::coordinator
