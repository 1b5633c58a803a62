#include "services/coordinator/admission.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace vc::coordinator {

AdmissionController::AdmissionController(AdmissionOptions options, AdmissionMetrics metrics)
    : options_(options), metrics_(metrics) {}

void AdmissionController::SetGauges() {
  if (metrics_.queue_depth != nullptr) metrics_.queue_depth->Set(queued_);
  if (metrics_.active != nullptr) metrics_.active->Set(active_);
}

absl::StatusOr<AdmissionController::Entry> AdmissionController::Enter(
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
  if (active_ < options_.max_active) {
    ++tenant.requests;
    ++active_;
    SetGauges();
    return Entry::kAdmitted;
  }
  if (queued_ >= options_.max_queued) {
    if (metrics_.rejections != nullptr) metrics_.rejections->Inc();
    ForgetIfIdle(tenant_name);
    return absl::ResourceExhaustedError(
        absl::StrCat("coordinator is full: ", active_, " requests running and ", queued_,
                     " queued (--max-active-requests ", options_.max_active,
                     ", --max-queued-requests ", options_.max_queued, ")"));
  }
  ++tenant.requests;
  ++queued_;
  SetGauges();
  return Entry::kQueued;
}

absl::StatusOr<AdmissionController::Entry> AdmissionController::TryStart(
    const std::string& tenant_name, bool gone, Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  return TryStartLocked(tenant_name, gone, deadline);
}

absl::StatusOr<AdmissionController::Entry> AdmissionController::TryStartLocked(
    const std::string& tenant_name, bool gone, Clock::time_point deadline) {
  // A refusal gives the queue's and the tenant's places back.
  auto refuse = [&](absl::Status s) {
    --queued_;
    --tenants_[tenant_name].requests;
    ForgetIfIdle(tenant_name);
    SetGauges();
    return s;
  };
  if (stopping_) return refuse(absl::UnavailableError("coordinator is shutting down"));
  if (gone) return refuse(absl::CancelledError("request cancelled while queued"));
  if (Clock::now() >= deadline) {
    return refuse(absl::DeadlineExceededError("deadline passed while queued"));
  }
  if (active_ >= options_.max_active) return Entry::kQueued;
  --queued_;
  ++active_;
  SetGauges();
  return Entry::kAdmitted;
}

absl::Status AdmissionController::Admit(const std::string& tenant_name,
                                        const std::function<bool()>& gone,
                                        Clock::time_point deadline) {
  absl::StatusOr<Entry> entry = Enter(tenant_name);
  std::unique_lock<std::mutex> lock(mu_);
  while (entry.ok() && *entry == Entry::kQueued) {
    // Polled as well as woken: `gone` may turn true without a Wake.
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    entry = TryStartLocked(tenant_name, gone(), deadline);
  }
  return entry.status();
}

void AdmissionController::Leave(const std::string& tenant, bool completed) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --tenants_[tenant].requests;
    ForgetIfIdle(tenant);
    --active_;
    if (completed) ++completed_;
    SetGauges();
  }
  WakeAll();
}

void AdmissionController::Wake() { WakeAll(); }

void AdmissionController::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  WakeAll();
}

void AdmissionController::WakeAll() {
  std::map<uint64_t, std::function<void()>> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    freed.swap(freed_);
  }
  cv_.notify_all();
  // Outside mu_: a waiter's TryStart takes it.
  for (auto& [id, f] : freed) f();
}

uint64_t AdmissionController::NotifyFreed(std::function<void()> freed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || active_ < options_.max_active) return 0;
  const uint64_t id = next_freed_id_++;
  freed_.emplace(id, std::move(freed));
  return id;
}

void AdmissionController::CancelNotifyFreed(uint64_t id) {
  std::function<void()> dropped;  // destroyed outside mu_
  std::lock_guard<std::mutex> lock(mu_);
  auto it = freed_.find(id);
  if (it == freed_.end()) return;
  dropped = std::move(it->second);
  freed_.erase(it);
}

void AdmissionController::ForgetIfIdle(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.requests == 0 && it->second.pins.empty() &&
      it->second.stored_bytes == 0) {
    tenants_.erase(it);
  }
}

absl::Status AdmissionController::CheckStoredBudget(const std::string& tenant) {
  if (options_.max_stored_bytes_per_tenant == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.stored_bytes >= options_.max_stored_bytes_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this tenant has stored ", it->second.stored_bytes, " bytes of KV, the limit is ",
        options_.max_stored_bytes_per_tenant,
        " (--max-stored-bytes-per-tenant); delete a prefix (vericache prefix --delete)"));
  }
  return absl::OkStatus();
}

void AdmissionController::ChargeStored(const std::string& tenant, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  t.stored_bytes = std::max<int64_t>(0, t.stored_bytes + bytes);
  ForgetIfIdle(tenant);
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

void AdmissionController::NotePrefix(const std::string& tenant, const std::string& prefix_id,
                                     bool pinned, int64_t freed_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Tenant& t = tenants_[tenant];
  if (pinned) {
    t.pins.insert(prefix_id);
  } else {
    t.pins.erase(prefix_id);
  }
  t.stored_bytes = std::max<int64_t>(0, t.stored_bytes - freed_bytes);
  ForgetIfIdle(tenant);
}

int AdmissionController::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

int AdmissionController::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
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
