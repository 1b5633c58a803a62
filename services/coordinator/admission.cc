#include "services/coordinator/admission.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace vc::coordinator {

AdmissionController::AdmissionController(AdmissionOptions options, AdmissionMetrics metrics)
    : options_(options), metrics_(metrics) {}

int AdmissionController::WaitingLocked() const {
  return static_cast<int>(queue_.size() - granted_.size());
}

void AdmissionController::SetGauges() {
  if (metrics_.queue_depth != nullptr) metrics_.queue_depth->Set(WaitingLocked());
  if (metrics_.active != nullptr) metrics_.active->Set(active_);
}

absl::StatusOr<AdmissionController::Entered> AdmissionController::Enter(
    const std::string& tenant_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("coordinator is shutting down");
  Tenant& tenant = tenants_[tenant_name];
  if (tenant.requests >= options_.max_requests_per_tenant) {
    if (metrics_.rejections != nullptr) metrics_.rejections->Inc();
    ForgetIfIdle(tenant_name);
    return absl::ResourceExhaustedError(
        absl::StrCat("this tenant already has ", options_.max_requests_per_tenant,
                     " requests running or queued (--max-requests-per-tenant)"));
  }
  // Free places are handed to queued requests as they free (GrantLocked),
  // so a new request finds one only when nobody waits for it.
  if (active_ < options_.max_active && WaitingLocked() == 0) {
    ++tenant.requests;
    ++active_;
    SetGauges();
    return Entered{.entry = Entry::kAdmitted};
  }
  if (WaitingLocked() >= options_.max_queued) {
    if (metrics_.rejections != nullptr) metrics_.rejections->Inc();
    ForgetIfIdle(tenant_name);
    return absl::ResourceExhaustedError(
        absl::StrCat("coordinator is full: ", active_, " requests running and ", WaitingLocked(),
                     " queued (--max-active-requests ", options_.max_active,
                     ", --max-queued-requests ", options_.max_queued, ")"));
  }
  ++tenant.requests;
  const Ticket ticket = next_ticket_++;
  queue_.emplace(ticket, Waiter{.tenant = tenant_name, .turn = nullptr});
  SetGauges();
  return Entered{.entry = Entry::kQueued, .ticket = ticket};
}

absl::StatusOr<AdmissionController::Entry> AdmissionController::TryStart(
    const std::string& tenant_name, Ticket ticket, bool gone, Clock::time_point deadline) {
  Calls calls;
  absl::StatusOr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entry = TryStartLocked(tenant_name, ticket, gone, deadline);
    GrantLocked(calls);
  }
  Tell(calls);
  return entry;
}

absl::StatusOr<AdmissionController::Entry> AdmissionController::TryStartLocked(
    const std::string& tenant_name, Ticket ticket, bool gone, Clock::time_point deadline) {
  // A ticket handed a place stays in queue_ until this call.
  auto queued = queue_.find(ticket);
  if (queued == queue_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("admission ticket ", ticket, " is not queued (already started or refused)"));
  }
  if (queued->second.tenant != tenant_name) {
    return absl::FailedPreconditionError(
        absl::StrCat("admission ticket ", ticket, " belongs to another tenant"));
  }
  queued->second.woken = false;  // this call is what the wake asked for
  const bool holds_place = granted_.erase(ticket) > 0;
  absl::Status refusal;
  if (stopping_) {
    refusal = absl::UnavailableError("coordinator is shutting down");
  } else if (gone) {
    refusal = absl::CancelledError("request cancelled while queued");
  } else if (Clock::now() >= deadline) {
    refusal = absl::DeadlineExceededError("deadline passed while queued");
  }
  if (refusal.ok() && !holds_place) return Entry::kQueued;
  queue_.erase(queued);
  if (refusal.ok()) {
    SetGauges();
    return Entry::kAdmitted;
  }
  // A refusal gives the queue's and the tenant's places back, and a place
  // handed to this ticket goes to the next in line (GrantLocked).
  if (holds_place) --active_;
  --tenants_[tenant_name].requests;
  ForgetIfIdle(tenant_name);
  SetGauges();
  return refusal;
}

void AdmissionController::GrantLocked(Calls& calls) {
  if (stopping_) return;
  for (auto it = queue_.begin(); it != queue_.end() && active_ < options_.max_active; ++it) {
    if (!granted_.insert(it->first).second) continue;  // handed a place already
    ++active_;
    if (it->second.turn) calls.push_back(std::move(it->second.turn));
    it->second.turn = nullptr;
  }
  SetGauges();
}

void AdmissionController::TakeTurnLocked(Waiter& waiter, Calls& calls) {
  if (waiter.turn) {
    calls.push_back(std::move(waiter.turn));
    waiter.turn = nullptr;
  } else {
    waiter.woken = true;
  }
}

void AdmissionController::Tell(Calls& calls) {
  cv_.notify_all();
  for (auto& f : calls) f();
}

absl::Status AdmissionController::Admit(const std::string& tenant_name,
                                        const std::function<bool()>& gone,
                                        Clock::time_point deadline) {
  VC_ASSIGN_OR_RETURN(const Entered entered, Enter(tenant_name));
  absl::StatusOr<Entry> entry = entered.entry;
  while (entry.ok() && *entry == Entry::kQueued) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Polled as well as woken: `gone` may turn true without a Wake.
      const uint64_t woken = wakes_;
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] {
        return stopping_ || wakes_ != woken || granted_.count(entered.ticket) > 0;
      });
    }
    entry = TryStart(tenant_name, entered.ticket, gone(), deadline);
  }
  return entry.status();
}

void AdmissionController::Leave(const std::string& tenant, bool completed) {
  Calls calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --tenants_[tenant].requests;
    ForgetIfIdle(tenant);
    --active_;
    if (completed) ++completed_;
    GrantLocked(calls);
  }
  Tell(calls);
}

void AdmissionController::Wake() {
  Calls calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++wakes_;
    for (auto& [ticket, waiter] : queue_) TakeTurnLocked(waiter, calls);
  }
  Tell(calls);
}

void AdmissionController::Wake(Ticket ticket) {
  Calls calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = queue_.find(ticket);
    if (it == queue_.end()) return;
    TakeTurnLocked(it->second, calls);
  }
  for (auto& f : calls) f();
}

void AdmissionController::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  Wake();
}

bool AdmissionController::NotifyTurn(Ticket ticket, std::function<void()> turn) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queue_.find(ticket);
  if (stopping_ || it == queue_.end() || granted_.count(ticket) > 0 || it->second.woken) {
    return false;
  }
  it->second.turn = std::move(turn);
  return true;
}

void AdmissionController::CancelNotifyTurn(Ticket ticket) {
  std::function<void()> dropped;  // destroyed outside mu_
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queue_.find(ticket);
  if (it == queue_.end()) return;
  dropped = std::move(it->second.turn);
  it->second.turn = nullptr;
}

void AdmissionController::ForgetIfIdle(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.requests == 0 && it->second.pins.empty() &&
      it->second.stored.by_prefix.empty() && it->second.stored.unlisted == 0 &&
      it->second.reserved == 0 && !it->second.ledger_writing && !it->second.ledger_behind) {
    tenants_.erase(it);
  }
}

namespace {
// a + b for non-negative byte counts, at most INT64_MAX: a ledger read from
// the store may hold any values, and an overflow would be undefined.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}
}  // namespace

int64_t StoredCharges::total() const {
  int64_t sum = unlisted;
  for (const auto& [key, bytes] : by_prefix) sum = SaturatingAdd(sum, bytes);
  return sum;
}

absl::StatusOr<StoredReservation> AdmissionController::ReserveStored(const std::string& tenant,
                                                                     int64_t estimate) {
  const int64_t limit = options_.max_stored_bytes_per_tenant;
  if (limit == 0) return StoredReservation();
  estimate = std::max<int64_t>(estimate, 0);
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  const int64_t stored = t.stored.total();
  const int64_t used = SaturatingAdd(stored, t.reserved);
  if (used < limit && estimate <= limit - used) {
    t.reserved = SaturatingAdd(t.reserved, estimate);
    return StoredReservation(this, tenant, estimate);
  }
  std::string in_flight;
  if (t.reserved > 0) absl::StrAppend(&in_flight, " (and is ingesting at least ", t.reserved, ")");
  ForgetIfIdle(tenant);  // `t` may be gone
  return absl::ResourceExhaustedError(absl::StrCat(
      "this tenant has stored ", stored, " bytes of KV", in_flight,
      "; this ingest stores at least ", estimate, " more, the limit is ", limit,
      " (--max-stored-bytes-per-tenant); delete a prefix (vericache prefix --delete)"));
}

void AdmissionController::EndStoredReservation(const std::string& tenant, int64_t estimate) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return;
  it->second.reserved = std::max<int64_t>(0, it->second.reserved - std::max<int64_t>(estimate, 0));
  ForgetIfIdle(tenant);
}

StoredReservation& StoredReservation::operator=(StoredReservation&& other) noexcept {
  if (this != &other) {
    End();
    admission_ = std::exchange(other.admission_, nullptr);
    tenant_ = std::move(other.tenant_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void StoredReservation::End() {
  if (admission_ != nullptr) admission_->EndStoredReservation(tenant_, bytes_);
  admission_ = nullptr;
}

void AdmissionController::ChargeStored(const std::string& tenant, const std::string& prefix_key,
                                       int64_t bytes) {
  if (bytes <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  StoredCharges& c = t.stored;
  auto it = c.by_prefix.find(prefix_key);
  if (it != c.by_prefix.end()) {
    it->second = bytes;
  } else if (c.by_prefix.size() < kMaxChargedPrefixes) {
    c.by_prefix.emplace(prefix_key, bytes);
  } else {
    c.unlisted = SaturatingAdd(c.unlisted, bytes);
  }
  t.ledger_behind = true;
}

void AdmissionController::GiveBackStored(const std::string& tenant,
                                         const std::vector<std::string>& prefix_keys) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return;
  for (const std::string& key : prefix_keys) {
    it->second.ledger_behind |= it->second.stored.by_prefix.erase(key) > 0;
  }
  ForgetIfIdle(tenant);
}

void AdmissionController::GiveBackPrefix(const std::string& tenant, const std::string& prefix_key,
                                         int64_t unlisted_estimate) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return;
  StoredCharges& c = it->second.stored;
  if (c.by_prefix.erase(prefix_key) > 0) {
    it->second.ledger_behind = true;
  } else if (c.unlisted > 0 && unlisted_estimate > 0) {
    c.unlisted = std::max<int64_t>(0, c.unlisted - unlisted_estimate);
    it->second.ledger_behind = true;
  }
  ForgetIfIdle(tenant);
}

std::vector<std::string> AdmissionController::PrefixesToRecheck(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  std::vector<std::string> keys;
  if (it == tenants_.end() || it->second.stored.by_prefix.empty()) return keys;
  const Clock::time_point now = Clock::now();
  if (it->second.rechecked != Clock::time_point{} &&
      now - it->second.rechecked < options_.stored_recheck_interval) {
    return keys;
  }
  it->second.rechecked = now;
  keys.reserve(it->second.stored.by_prefix.size());
  for (const auto& [key, bytes] : it->second.stored.by_prefix) keys.push_back(key);
  return keys;
}

bool AdmissionController::StoredKnown(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  return it != tenants_.end() && it->second.stored_loaded;
}

void AdmissionController::LoadStored(const std::string& tenant, StoredCharges charges) {
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  if (!t.stored_loaded) {
    t.stored = std::move(charges);
    t.stored_loaded = true;
  }
  ForgetIfIdle(tenant);
}

std::optional<StoredCharges> AdmissionController::BeginLedgerWrite(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  if (t.ledger_writing) {
    t.ledger_behind = true;
    return std::nullopt;
  }
  t.ledger_writing = true;
  t.ledger_behind = false;
  return t.stored;
}

std::optional<StoredCharges> AdmissionController::EndLedgerWrite(const std::string& tenant,
                                                                 bool written, bool again) {
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  if (written && t.ledger_behind && again) {
    t.ledger_behind = false;
    return t.stored;
  }
  t.ledger_behind |= !written;
  t.ledger_writing = false;
  ForgetIfIdle(tenant);
  return std::nullopt;
}

int64_t AdmissionController::stored_bytes(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.stored.total();
}

absl::Status AdmissionController::CheckPin(const std::string& tenant,
                                           const std::string& prefix_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  const size_t pins = it == tenants_.end() ? 0 : it->second.pins.size();
  const bool pinned = it != tenants_.end() && it->second.pins.count(prefix_id) > 0;
  if (pinned || static_cast<int>(pins) < options_.max_pins_per_tenant) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("this tenant already pins ", pins, " prefixes, the limit is ",
                   options_.max_pins_per_tenant, " (--max-pins-per-tenant); unpin one first"));
}

bool AdmissionController::PinsKnown(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  return it != tenants_.end() && it->second.pins_loaded;
}

void AdmissionController::LoadPins(const std::string& tenant,
                                   const std::vector<std::string>& prefix_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  t.pins.insert(prefix_ids.begin(), prefix_ids.end());
  t.pins_loaded = true;
  ForgetIfIdle(tenant);
}

void AdmissionController::NotePrefix(const std::string& tenant, const std::string& prefix_id,
                                     bool pinned) {
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  if (pinned) {
    t.pins.insert(prefix_id);
  } else {
    t.pins.erase(prefix_id);
  }
  ForgetIfIdle(tenant);
}

int AdmissionController::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

int AdmissionController::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return WaitingLocked();
}

int64_t AdmissionController::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

size_t AdmissionController::tenants() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tenants_.size();
}

}  // namespace vc::coordinator
