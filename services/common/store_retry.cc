// The store client's one retry rule and backoff (StoreRetryOptions in
// store_client.h), shared by its reads and its puts.
#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/store_client.h"

namespace vc::daemon {

absl::Status ValidateStoreRetryOptions(const StoreRetryOptions& o) {
  if (o.max_attempts < 1) return absl::InvalidArgumentError("retry max_attempts must be >= 1");
  if (o.initial_backoff.count() < 0 || o.max_backoff < o.initial_backoff) {
    return absl::InvalidArgumentError(
        "retry backoffs must satisfy 0 <= initial_backoff <= max_backoff");
  }
  if (!(o.multiplier >= 1.0) || !std::isfinite(o.multiplier)) {
    return absl::InvalidArgumentError("retry multiplier must be a finite number >= 1");
  }
  if (!(o.jitter >= 0.0 && o.jitter <= 1.0)) {
    return absl::InvalidArgumentError("retry jitter must be within 0..1");
  }
  return absl::OkStatus();
}

bool StoreCallMayBeRetried(const absl::Status& s) {
  if (!absl::IsUnavailable(s)) return false;
  // TLS set-up, a handshake or data plane authentication that refuses this
  // client: reported as Unavailable, and it would refuse again.
  for (const char* refusal : {"TLS handshake", "data plane TLS:", "data plane authentication"}) {
    if (absl::StrContains(s.message(), refusal)) return false;
  }
  return true;
}

namespace {

// A uniform draw in [0, 1), per thread (the store client is shared by every
// request thread of a daemon).
double Draw() {
  thread_local std::minstd_rand gen{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

StoreRetrySchedule::StoreRetrySchedule(const StoreRetryOptions& options,
                                       std::chrono::steady_clock::time_point deadline)
    : options_(options),
      deadline_(deadline),
      nominal_ms_(static_cast<double>(options.initial_backoff.count())) {}

std::optional<std::chrono::milliseconds> StoreRetrySchedule::Next(const absl::Status& status,
                                                                  bool retryable) {
  using std::chrono::duration;
  using std::chrono::milliseconds;
  ++made_;
  retryable_ = retryable;
  if (status.ok() || !retryable || !StoreCallMayBeRetried(status) ||
      made_ >= options_.max_attempts) {
    return std::nullopt;
  }
  const double factor = 1.0 + options_.jitter * (2.0 * Draw() - 1.0);
  const auto wait =
      std::chrono::duration_cast<milliseconds>(duration<double, std::milli>(nominal_ms_ * factor));
  // Never past the deadline: a wait that would end there leaves no time for
  // another attempt.
  if (std::chrono::steady_clock::now() + wait >= deadline_) {
    out_of_time_ = true;
    return std::nullopt;
  }
  nominal_ms_ = std::min(nominal_ms_ * options_.multiplier,
                         static_cast<double>(options_.max_backoff.count()));
  return wait;
}

bool StoreRetrySchedule::StillInTime() {
  // A loaded host may oversleep: no attempt starts at the deadline.
  if (std::chrono::steady_clock::now() < deadline_) return true;
  out_of_time_ = true;
  return false;
}

absl::Status StoreRetrySchedule::Final(absl::Status status) const {
  if (status.ok() || (made_ == 1 && !(retryable_ && StoreCallMayBeRetried(status)))) {
    return status;
  }
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), " (gave up after ", made_,
                   made_ == 1 ? " attempt" : " attempts",
                   out_of_time_ ? ": the deadline left no time for another" : "", ")"));
}

absl::Status RetryStoreCall(const StoreRetryOptions& options,
                            std::chrono::steady_clock::time_point deadline,
                            absl::FunctionRef<absl::Status(bool* retryable)> attempt,
                            int* attempts) {
  StoreRetrySchedule schedule(options, deadline);
  absl::Status status;
  while (true) {
    bool retryable = true;
    status = attempt(&retryable);
    const std::optional<std::chrono::milliseconds> wait = schedule.Next(status, retryable);
    if (!wait) break;
    std::this_thread::sleep_for(*wait);
    if (!schedule.StillInTime()) break;
  }
  if (attempts != nullptr) *attempts = schedule.attempts();
  return schedule.Final(std::move(status));
}

}  // namespace vc::daemon
