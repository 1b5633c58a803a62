// The store client's retry rule (RetryStoreCall): what is tried again, how
// often, how long it waits, and that the caller's deadline bounds it. The
// calls are fakes that answer with a chosen status; the kill -9 of a real
// store under a Lookup or Get is KvStoreDaemonTest's.
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "services/common/store_client.h"

namespace vc::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Short waits without jitter, so the test is quick and its waits exact.
StoreRetryOptions Quick(int max_attempts) {
  StoreRetryOptions o;
  o.max_attempts = max_attempts;
  o.initial_backoff = milliseconds(1);
  o.max_backoff = milliseconds(4);
  o.jitter = 0;
  return o;
}

absl::Status Reset() {
  return absl::UnavailableError("vc-kvstore Lookup: recvmsg: Connection reset by peer");
}

// RetryStoreCall with a minute's deadline over a call that always answers
// `answer`; how many calls it made.
int CallsMade(const StoreRetryOptions& o, const absl::Status& answer, absl::Status* out) {
  int calls = 0;
  *out = RetryStoreCall(o, Clock::now() + std::chrono::seconds(60), [&](bool*) {
    ++calls;
    return answer;
  });
  return calls;
}

TEST(StoreRetryTest, AnUnavailableCallIsTriedAgainUntilItSucceeds) {
  int calls = 0;
  int attempts = 0;
  const absl::Status s = RetryStoreCall(
      Quick(4), Clock::now() + std::chrono::seconds(60),
      [&](bool*) { return ++calls < 3 ? Reset() : absl::OkStatus(); }, &attempts);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(attempts, 3);
}

TEST(StoreRetryTest, GivesUpAfterMaxAttemptsAndSaysSo) {
  absl::Status s;
  EXPECT_EQ(CallsMade(Quick(4), Reset(), &s), 4);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "Connection reset by peer")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "gave up after 4 attempts")) << s;
}

TEST(StoreRetryTest, OneAttemptMeansNoRetry) {
  absl::Status s;
  EXPECT_EQ(CallsMade(Quick(1), Reset(), &s), 1);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "gave up after 1 attempt)")) << s;
}

// Refusals, a deadline, and TLS or authentication failures reported as
// Unavailable would fail again: returned as they are after one attempt.
TEST(StoreRetryTest, AStatusThatMayNotBeRetriedIsReturnedAfterOneAttempt) {
  const std::vector<absl::Status> refusals = {
      absl::PermissionDeniedError("tenant may not"),
      absl::UnauthenticatedError("no API key"),
      absl::InvalidArgumentError("short key"),
      absl::NotFoundError("no such key"),
      absl::DeadlineExceededError("Deadline Exceeded"),
      absl::ResourceExhaustedError("store full"),
      absl::FailedPreconditionError("pinned"),
      absl::InternalError("answered a different number of keys"),
      absl::UnavailableError("data plane connect to 127.0.0.1:1: TLS handshake failed"),
      absl::UnavailableError("data plane authentication: bad token"),
      absl::UnavailableError("data plane TLS: no certificate"),
  };
  for (const absl::Status& refusal : refusals) {
    SCOPED_TRACE(refusal.ToString());
    EXPECT_FALSE(StoreCallMayBeRetried(refusal));
    absl::Status s;
    EXPECT_EQ(CallsMade(Quick(4), refusal, &s), 1);
    EXPECT_EQ(s, refusal);
  }
  EXPECT_TRUE(StoreCallMayBeRetried(Reset()));
}

// A refusal on a later attempt ends the retries too, naming the attempts.
TEST(StoreRetryTest, ARefusalAfterARetryEndsIt) {
  int calls = 0;
  const absl::Status s = RetryStoreCall(
      Quick(4), Clock::now() + std::chrono::seconds(60),
      [&](bool*) { return ++calls == 1 ? Reset() : absl::NotFoundError("vc-kvstore Get: gone"); });
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "gave up after 2 attempts")) << s;
}

// A put whose commit was sent may have been applied: the attempt says so
// and is not repeated, whatever the status.
TEST(StoreRetryTest, AnAttemptThatClearsRetryableIsNotRepeated) {
  int calls = 0;
  const absl::Status s =
      RetryStoreCall(Quick(4), Clock::now() + std::chrono::seconds(60), [&](bool* retryable) {
        ++calls;
        *retryable = false;
        return Reset();
      });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

// The waits grow by the multiplier up to the cap. sleep_for never wakes
// early, so each gap is at least its nominal wait however loaded the host.
TEST(StoreRetryTest, WaitsGrowExponentiallyUpToTheCap) {
  StoreRetryOptions o;
  o.max_attempts = 6;
  o.initial_backoff = milliseconds(10);
  o.max_backoff = milliseconds(40);
  o.multiplier = 2;
  o.jitter = 0;
  std::vector<Clock::time_point> starts;
  const absl::Status s = RetryStoreCall(o, Clock::now() + std::chrono::seconds(60), [&](bool*) {
    starts.push_back(Clock::now());
    return Reset();
  });
  EXPECT_TRUE(absl::IsUnavailable(s));
  ASSERT_EQ(starts.size(), 6u);
  const std::vector<int> nominal = {10, 20, 40, 40, 40};
  for (size_t i = 0; i < nominal.size(); ++i) {
    EXPECT_GE(starts[i + 1] - starts[i], milliseconds(nominal[i])) << "wait " << i;
  }
}

// However many attempts are allowed, none starts at or after the caller's
// deadline, and the error says the deadline ended the retries.
TEST(StoreRetryTest, TheDeadlineBoundsTheRetries) {
  StoreRetryOptions o;
  o.max_attempts = 1'000'000;
  o.initial_backoff = milliseconds(5);
  o.max_backoff = milliseconds(20);
  o.jitter = 0.5;
  const Clock::time_point deadline = Clock::now() + milliseconds(500);
  std::vector<Clock::time_point> starts;
  int attempts = 0;
  const absl::Status s = RetryStoreCall(
      o, deadline,
      [&](bool*) {
        starts.push_back(Clock::now());
        return Reset();
      },
      &attempts);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the deadline left no time for another")) << s;
  EXPECT_EQ(attempts, static_cast<int>(starts.size()));
  EXPECT_LT(attempts, o.max_attempts);
  for (const Clock::time_point start : starts) EXPECT_LT(start, deadline);
}

// A deadline already past: the one attempt (the call's own deadline decides
// how it ends), no retry.
TEST(StoreRetryTest, APastDeadlineAllowsNoRetry) {
  int calls = 0;
  const absl::Status s = RetryStoreCall(Quick(4), Clock::now() - milliseconds(1), [&](bool*) {
    ++calls;
    return Reset();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(absl::StrContains(s.message(), "the deadline left no time for another")) << s;
}

TEST(StoreRetryTest, BadOptionsAreRefused) {
  EXPECT_TRUE(ValidateStoreRetryOptions(StoreRetryOptions{}).ok());
  StoreRetryOptions o;
  o.max_attempts = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateStoreRetryOptions(o)));
  o = {};
  o.initial_backoff = milliseconds(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateStoreRetryOptions(o)));
  o = {};
  o.max_backoff = milliseconds(10);  // below initial_backoff
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateStoreRetryOptions(o)));
  o = {};
  o.multiplier = 0.5;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateStoreRetryOptions(o)));
  o = {};
  o.jitter = 1.5;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateStoreRetryOptions(o)));
  StoreClientOptions so;
  so.control_address = "127.0.0.1:1";
  so.retry.max_attempts = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(StoreClient::Create(so).status()));
}

}  // namespace
}  // namespace vc::daemon
