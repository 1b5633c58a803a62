// The admission controller on its own: limits, the bounded queue and what
// ends a wait (a place freeing, the caller going away, the deadline, Stop),
// and the per-tenant quotas (requests, pins, stored bytes), with idle
// tenants forgotten. Waits are on other threads with generous deadlines; no
// timing is asserted.
#include "services/coordinator/admission.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vc::coordinator {
namespace {

using Clock = AdmissionController::Clock;

constexpr auto kLong = std::chrono::seconds(120);
bool Never() { return false; }

// Polls `pred` for up to two minutes (a loaded machine is slow, never wrong).
template <typename Pred>
bool Eventually(Pred pred) {
  const auto until = Clock::now() + kLong;
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(AdmissionTest, QueuesBeyondMaxActiveAndRefusesBeyondTheQueue) {
  metrics::Counter rejections;
  metrics::Gauge depth, active;
  AdmissionController a({.max_active = 1, .max_queued = 1}, {&rejections, &depth, &active});
  ASSERT_TRUE(a.Admit("t", Never, Clock::now() + kLong).ok());
  EXPECT_EQ(active.Value(), 1);
  absl::Status waiter_status = absl::UnknownError("not run");
  std::thread waiter([&] { waiter_status = a.Admit("t", Never, Clock::now() + kLong); });
  ASSERT_TRUE(Eventually([&] { return a.queued() == 1; }));
  EXPECT_EQ(depth.Value(), 1);
  const absl::Status third = a.Admit("t", Never, Clock::now() + kLong);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(third.message(),
            "coordinator is full: 1 requests running and 1 queued (--max-active-requests 1, "
            "--max-queued-requests 1)");
  EXPECT_EQ(rejections.Value(), 1);
  a.Leave("t", /*completed=*/true);
  waiter.join();
  EXPECT_TRUE(waiter_status.ok()) << waiter_status;
  EXPECT_EQ(a.active(), 1);
  EXPECT_EQ(a.queued(), 0);
  EXPECT_EQ(a.completed(), 1);
  a.Leave("t", /*completed=*/false);
  EXPECT_EQ(a.completed(), 1) << "a prefix registration is not a completed request";
  EXPECT_EQ(a.active(), 0);
  EXPECT_EQ(a.tenants(), 0u) << "an idle tenant is forgotten";
}

TEST(AdmissionTest, AQueuedRequestEndsWhenItsCallerGoesItsDeadlinePassesOrTheCoordinatorStops) {
  AdmissionController a({.max_active = 1, .max_queued = 4});
  ASSERT_TRUE(a.Admit("t", Never, Clock::now() + kLong).ok());
  std::atomic<bool> gone{false};
  absl::Status cancelled;
  std::thread t1([&] {
    cancelled = a.Admit(
        "u", [&] { return gone.load(); }, Clock::now() + kLong);
  });
  ASSERT_TRUE(Eventually([&] { return a.queued() == 1; }));
  gone = true;
  a.Wake();
  t1.join();
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  const absl::Status late = a.Admit("u", Never, Clock::now() + std::chrono::milliseconds(1));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  absl::Status stopped;
  std::thread t2([&] { stopped = a.Admit("u", Never, Clock::now() + kLong); });
  ASSERT_TRUE(Eventually([&] { return a.queued() == 1; }));
  a.Stop();
  t2.join();
  EXPECT_EQ(stopped.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.Admit("u", Never, Clock::now() + kLong).code(), absl::StatusCode::kUnavailable);
  a.Leave("t", true);
  EXPECT_EQ(a.tenants(), 0u) << "refused requests hold nothing";
}

using Entry = AdmissionController::Entry;
using Ticket = AdmissionController::Ticket;

// Enter for a request that must queue: its ticket.
Ticket Queue(AdmissionController& a, const std::string& tenant) {
  absl::StatusOr<AdmissionController::Entered> e = a.Enter(tenant);
  EXPECT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e.ok() && e->entry == Entry::kQueued);
  return e.ok() ? e->ticket : 0;
}

// The queue without a waiting thread (the coordinator's coroutines): a
// queued request is told when a place is handed to it, and a notification
// is not kept when the ticket holds a place already (nothing between a
// TryStart and the registration goes unseen) or after Stop.
TEST(AdmissionTest, AQueuedRequestIsToldWhenAPlaceIsHandedToIt) {
  AdmissionController a({.max_active = 1, .max_queued = 4});
  ASSERT_EQ(a.Enter("t")->entry, Entry::kAdmitted);
  const Ticket u = Queue(a, "u");
  ASSERT_EQ(*a.TryStart("u", u, false, Clock::now() + kLong), Entry::kQueued);
  int told = 0;
  ASSERT_TRUE(a.NotifyTurn(u, [&] { ++told; }));
  // A cancelled notification is never called.
  const Ticket v = Queue(a, "v");
  int cancelled_told = 0;
  ASSERT_TRUE(a.NotifyTurn(v, [&] { ++cancelled_told; }));
  a.CancelNotifyTurn(v);
  a.Leave("t", true);
  EXPECT_EQ(told, 1);
  EXPECT_EQ(cancelled_told, 0);
  EXPECT_EQ(a.active(), 1) << "the place went to u";
  EXPECT_EQ(a.queued(), 1);
  // u holds a place now: nothing to wait for, the caller tries at once.
  EXPECT_FALSE(a.NotifyTurn(u, [&] { ++told; }));
  EXPECT_EQ(*a.TryStart("u", u, false, Clock::now() + kLong), Entry::kAdmitted);
  EXPECT_EQ(a.TryStart("u", u, false, Clock::now() + kLong).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "a started ticket is not queued any more";
  // Told once only: the notification went with the Leave that called it.
  a.Wake();
  EXPECT_EQ(told, 1);
  // v had no notification registered when woken: the wake is kept, and v
  // must TryStart again before it may wait.
  int stop_told = 0;
  EXPECT_FALSE(a.NotifyTurn(v, [&] { ++stop_told; }));
  EXPECT_EQ(*a.TryStart("v", v, false, Clock::now() + kLong), Entry::kQueued);
  // Stop tells the waiters, and keeps no notification after it.
  ASSERT_TRUE(a.NotifyTurn(v, [&] { ++stop_told; }));
  a.Stop();
  EXPECT_EQ(stop_told, 1);
  EXPECT_FALSE(a.NotifyTurn(v, [&] { ++stop_told; }));
  EXPECT_EQ(a.TryStart("v", v, false, Clock::now() + kLong).status().code(),
            absl::StatusCode::kUnavailable);
  a.Leave("u", true);
  EXPECT_EQ(a.active(), 0);
  EXPECT_EQ(a.tenants(), 0u);
}

// First come, first served: each freed place goes to the oldest queued
// request, only that request is told, and a request arriving meanwhile
// queues behind the others even while a place is free.
TEST(AdmissionTest, FreedPlacesGoToQueuedRequestsInArrivalOrder) {
  metrics::Gauge depth, active;
  AdmissionController a({.max_active = 2, .max_queued = 8}, {nullptr, &depth, &active});
  ASSERT_EQ(a.Enter("x")->entry, Entry::kAdmitted);
  ASSERT_EQ(a.Enter("x")->entry, Entry::kAdmitted);
  std::vector<Ticket> tickets;
  std::vector<int> told(4, 0);
  for (int i = 0; i < 4; ++i) {
    tickets.push_back(Queue(a, "q"));
    ASSERT_TRUE(a.NotifyTurn(tickets[i], [&told, i] { ++told[i]; }));
  }
  EXPECT_EQ(depth.Value(), 4);
  a.Leave("x", true);
  EXPECT_EQ(told, (std::vector<int>{1, 0, 0, 0}));
  EXPECT_EQ(active.Value(), 2) << "the freed place is held for the oldest request";
  EXPECT_EQ(depth.Value(), 3);
  // A later request does not start ahead of the queue, nor does a younger
  // queued one that asks first.
  const Ticket late = Queue(a, "late");
  EXPECT_EQ(*a.TryStart("q", tickets[2], false, Clock::now() + kLong), Entry::kQueued);
  EXPECT_EQ(*a.TryStart("q", tickets[0], false, Clock::now() + kLong), Entry::kAdmitted);
  // The oldest queued request gives up while holding the next freed place:
  // the place goes on to the one behind it.
  a.Leave("x", true);
  EXPECT_EQ(told, (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(a.TryStart("q", tickets[1], /*gone=*/true, Clock::now() + kLong).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(told, (std::vector<int>{1, 1, 1, 0}));
  EXPECT_EQ(*a.TryStart("q", tickets[2], false, Clock::now() + kLong), Entry::kAdmitted);
  // A queued request whose deadline passed leaves the line without a place.
  EXPECT_EQ(a.TryStart("q", tickets[3], false, Clock::now()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  a.Leave("q", true);
  EXPECT_EQ(*a.TryStart("late", late, false, Clock::now() + kLong), Entry::kAdmitted);
  EXPECT_EQ(a.queued(), 0);
  EXPECT_EQ(a.active(), 2);
  a.Leave("q", true);
  a.Leave("late", true);
  EXPECT_EQ(a.active(), 0);
  EXPECT_EQ(a.tenants(), 0u);
}

// A Cancel (or a client going away) wakes its own request only: the others
// stay asleep. A wake that comes while the request has no notification
// registered (between a TryStart and its NotifyTurn) is not lost, and a
// ticket that is not queued wakes nobody.
TEST(AdmissionTest, WakingOneTicketTellsOnlyThatRequest) {
  AdmissionController a({.max_active = 1, .max_queued = 8});
  ASSERT_EQ(a.Enter("x")->entry, Entry::kAdmitted);
  std::vector<Ticket> tickets;
  std::vector<int> told(3, 0);
  for (int i = 0; i < 3; ++i) {
    tickets.push_back(Queue(a, "q"));
    ASSERT_TRUE(a.NotifyTurn(tickets[i], [&told, i] { ++told[i]; }));
  }
  a.Wake(tickets[1]);
  EXPECT_EQ(told, (std::vector<int>{0, 1, 0}));
  a.Wake(tickets[1]);  // no notification registered now: remembered
  EXPECT_EQ(told, (std::vector<int>{0, 1, 0}));
  EXPECT_FALSE(a.NotifyTurn(tickets[1], [&told] { ++told[1]; }))
      << "woken since its last TryStart: the caller must try again at once";
  EXPECT_EQ(a.TryStart("q", tickets[1], /*gone=*/true, Clock::now() + kLong).status().code(),
            absl::StatusCode::kCancelled);
  // Unknown, left and never-issued tickets are ignored.
  a.Wake(tickets[1]);
  a.Wake(0);
  a.Wake(tickets[2] + 1000);
  EXPECT_EQ(told, (std::vector<int>{0, 1, 0}));
  // TryStart clears a wake: the next NotifyTurn is kept.
  a.Wake(tickets[0]);
  EXPECT_EQ(told, (std::vector<int>{1, 1, 0}));
  a.Wake(tickets[0]);
  EXPECT_EQ(*a.TryStart("q", tickets[0], false, Clock::now() + kLong), Entry::kQueued);
  EXPECT_TRUE(a.NotifyTurn(tickets[0], [&told] { ++told[0]; }));
  // The place still goes to the oldest request.
  a.Leave("x", true);
  EXPECT_EQ(told, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(*a.TryStart("q", tickets[0], false, Clock::now() + kLong), Entry::kAdmitted);
  a.Leave("q", true);
  EXPECT_EQ(told, (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(*a.TryStart("q", tickets[2], false, Clock::now() + kLong), Entry::kAdmitted);
  a.Leave("q", true);
  EXPECT_EQ(a.active(), 0);
  EXPECT_EQ(a.tenants(), 0u);
}

// Threads waiting in Admit are served in arrival order too.
TEST(AdmissionTest, WaitingThreadsStartInArrivalOrder) {
  AdmissionController a({.max_active = 1, .max_queued = 8});
  ASSERT_TRUE(a.Admit("t", Never, Clock::now() + kLong).ok());
  std::mutex order_mu;
  std::vector<int> order;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&, i] {
      ASSERT_TRUE(a.Admit("t", Never, Clock::now() + kLong).ok());
      {
        std::lock_guard<std::mutex> lock(order_mu);
        order.push_back(i);
      }
      a.Leave("t", true);
    });
    // The next thread enters only once this one is queued.
    ASSERT_TRUE(Eventually([&] { return a.queued() == i + 1; }));
  }
  a.Leave("t", true);
  for (auto& w : waiters) w.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(a.active(), 0);
}

TEST(AdmissionTest, ATenantAtItsRequestLimitIsRefusedOthersAreNot) {
  metrics::Counter rejections;
  AdmissionController a({.max_active = 8, .max_queued = 8, .max_requests_per_tenant = 2},
                        {&rejections});
  ASSERT_TRUE(a.Admit("a", Never, Clock::now() + kLong).ok());
  ASSERT_TRUE(a.Admit("a", Never, Clock::now() + kLong).ok());
  const absl::Status s = a.Admit("a", Never, Clock::now() + kLong);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "this tenant already has 2 requests running or queued (--max-requests-per-tenant)");
  EXPECT_EQ(rejections.Value(), 1);
  EXPECT_TRUE(a.Admit("b", Never, Clock::now() + kLong).ok());
  a.Leave("a", true);
  EXPECT_TRUE(a.Admit("a", Never, Clock::now() + kLong).ok());
}

TEST(AdmissionTest, PinsAndStoredBytesAreCountedPerTenant) {
  AdmissionController a({.max_pins_per_tenant = 1, .max_stored_bytes_per_tenant = 100});
  EXPECT_TRUE(a.CheckPin("a", "p1").ok());
  a.NotePrefix("a", "p1", /*pinned=*/true);
  EXPECT_TRUE(a.CheckPin("a", "p1").ok()) << "pinning again is no new pin";
  const absl::Status s = a.CheckPin("a", "p2");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "this tenant already pins 1 prefixes, the limit is 1 (--max-pins-per-tenant); unpin "
            "one first");
  EXPECT_TRUE(a.CheckPin("b", "p2").ok());
  {
    const absl::StatusOr<StoredReservation> ingest = a.ReserveStored("a", 40);
    ASSERT_TRUE(ingest.ok());
    a.ChargeStored("a", "k1", 150);  // more than the estimate (the variants)
  }
  const absl::Status over = a.ReserveStored("a", 0).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "this tenant has stored 150 bytes of KV; this ingest stores at least 0 more, the "
            "limit is 100 (--max-stored-bytes-per-tenant); delete a prefix (vericache prefix "
            "--delete)");
  EXPECT_TRUE(a.ReserveStored("b", 10).ok());
  a.NotePrefix("a", "p1", /*pinned=*/false);
  EXPECT_TRUE(a.CheckPin("a", "p2").ok());
  a.ChargeStored("a", "k1", 60);  // the same prefix ingested again: replaced
  EXPECT_EQ(a.stored_bytes("a"), 60);
  EXPECT_TRUE(a.ReserveStored("a", 40).ok());
  a.GiveBackPrefix("a", "k1", 1000);
  EXPECT_EQ(a.stored_bytes("a"), 0);
  EXPECT_EQ(a.tenants(), 1u) << "kept until its ledger has the charges";
  ASSERT_TRUE(a.BeginLedgerWrite("a").has_value());
  EXPECT_EQ(a.EndLedgerWrite("a", /*written=*/true, /*again=*/true), std::nullopt);
  EXPECT_EQ(a.tenants(), 0u) << "a tenant holding nothing is forgotten";
}

// Charges per prefix up to kMaxChargedPrefixes, the rest unlisted; a delete
// of an unlisted prefix gives back its estimate from the unlisted sum, and
// a recheck lists the charged prefixes at most once per interval.
TEST(AdmissionTest, ChargesArePerPrefixUpToTheBoundAndRecheckedAtMostOncePerInterval) {
  AdmissionController a({.stored_recheck_interval = std::chrono::hours(1)});
  for (size_t i = 0; i < kMaxChargedPrefixes + 2; ++i)
    a.ChargeStored("a", absl::StrCat("k", i), 10);
  EXPECT_EQ(a.stored_bytes("a"), int64_t{10} * static_cast<int64_t>(kMaxChargedPrefixes + 2));
  const std::vector<std::string> listed = a.PrefixesToRecheck("a");
  EXPECT_EQ(listed.size(), kMaxChargedPrefixes);
  EXPECT_TRUE(a.PrefixesToRecheck("a").empty()) << "not again within the interval";
  a.GiveBackStored("a", {listed[0], listed[1], "not charged"});
  EXPECT_EQ(a.stored_bytes("a"), int64_t{10} * static_cast<int64_t>(kMaxChargedPrefixes));
  a.GiveBackPrefix("a", "unlisted one", 15);  // 20 unlisted, minus its estimate
  EXPECT_EQ(a.stored_bytes("a"), int64_t{10} * static_cast<int64_t>(kMaxChargedPrefixes) - 15);
  a.GiveBackPrefix("a", "another", 15);  // never below zero
  EXPECT_EQ(a.stored_bytes("a"), int64_t{10} * static_cast<int64_t>(kMaxChargedPrefixes - 2));
  a.ChargeStored("a", "k0", 0);  // nothing to charge
  EXPECT_EQ(a.stored_bytes("a"), int64_t{10} * static_cast<int64_t>(kMaxChargedPrefixes - 2));
}

// A restarted coordinator loads a tenant's charges from its ledger once; a
// load that comes after another request's load and charge changes nothing.
TEST(AdmissionTest, StoredChargesAreLoadedOnceAndThenOnlyChanged) {
  AdmissionController a({.max_stored_bytes_per_tenant = 100});
  EXPECT_FALSE(a.StoredKnown("a"));
  a.LoadStored("a", StoredCharges{.by_prefix = {{"k1", 100}}, .unlisted = 20});
  EXPECT_TRUE(a.StoredKnown("a"));
  EXPECT_EQ(a.ReserveStored("a", 0).status().code(), absl::StatusCode::kResourceExhausted);
  a.ChargeStored("a", "k2", 30);
  a.LoadStored("a", StoredCharges{});  // a late load: ignored
  EXPECT_EQ(a.stored_bytes("a"), 150);
  EXPECT_FALSE(a.StoredKnown("b"));
  a.LoadStored("b", StoredCharges{});
  EXPECT_EQ(a.tenants(), 1u) << "a tenant whose ledger says nothing is forgotten";
  EXPECT_FALSE(a.StoredKnown("b"));
}

// One ledger writer per tenant; changes made while it writes are written
// by it after its write, a failed write is left to the next writer, and a
// tenant with a write outstanding keeps its bookkeeping.
TEST(AdmissionTest, LedgerWritesAreOneAtATimeAndEndWithTheLatestCharges) {
  AdmissionController a({});
  a.LoadStored("a", StoredCharges{});
  a.ChargeStored("a", "k1", 10);
  const auto first = a.BeginLedgerWrite("a");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->total(), 10);
  a.ChargeStored("a", "k2", 5);
  EXPECT_EQ(a.BeginLedgerWrite("a"), std::nullopt) << "one writer at a time";
  a.ChargeStored("a", "k3", 7);
  const auto next = a.EndLedgerWrite("a", /*written=*/true, /*again=*/true);
  ASSERT_TRUE(next.has_value()) << "the writer writes the latest charges next";
  EXPECT_EQ(next->total(), 22);
  EXPECT_EQ(a.EndLedgerWrite("a", true, true), std::nullopt) << "nothing changed since";

  a.GiveBackStored("a", {"k1", "k2", "k3"});
  EXPECT_EQ(a.BeginLedgerWrite("a"), std::optional<StoredCharges>(StoredCharges{}));
  EXPECT_EQ(a.EndLedgerWrite("a", /*written=*/false, true), std::nullopt)
      << "a failed write is not tried again by its writer";
  EXPECT_EQ(a.tenants(), 1u) << "its charges are still to be written";
  EXPECT_EQ(a.BeginLedgerWrite("a"), std::optional<StoredCharges>(StoredCharges{}))
      << "the next writer writes them";
  EXPECT_EQ(a.EndLedgerWrite("a", true, true), std::nullopt);
  EXPECT_EQ(a.tenants(), 0u) << "written and holding nothing: forgotten";

  a.ChargeStored("b", "k", 1);
  ASSERT_TRUE(a.BeginLedgerWrite("b").has_value());
  a.ChargeStored("b", "k", 2);
  EXPECT_EQ(a.EndLedgerWrite("b", true, /*again=*/false), std::nullopt)
      << "a writer out of rounds stops";
  const auto later = a.BeginLedgerWrite("b");
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->total(), 2);
}

// Ingests in flight hold their estimates: a tenant's concurrent ingests
// cannot pass the limit together (each was checked against the charges
// alone before), and an ingest whose estimate alone passes it is refused.
TEST(AdmissionTest, StoredBytesAreReservedForIngestsInFlight) {
  AdmissionController a({.max_stored_bytes_per_tenant = 100});
  absl::StatusOr<StoredReservation> first = a.ReserveStored("a", 40);
  absl::StatusOr<StoredReservation> second = a.ReserveStored("a", 40);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(second.ok());
  const absl::Status third = a.ReserveStored("a", 40).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(third.message(),
            "this tenant has stored 0 bytes of KV (and is ingesting at least 80); this ingest "
            "stores at least 40 more, the limit is 100 (--max-stored-bytes-per-tenant); delete a "
            "prefix (vericache prefix --delete)");
  absl::StatusOr<StoredReservation> other = a.ReserveStored("b", 100);
  EXPECT_TRUE(other.ok()) << "another tenant has its own budget";
  EXPECT_EQ(a.ReserveStored("c", 101).status().code(), absl::StatusCode::kResourceExhausted)
      << "one ingest past the limit on its own";
  second->End();  // an ingest that failed
  absl::StatusOr<StoredReservation> fourth = a.ReserveStored("a", 20);
  EXPECT_TRUE(fourth.ok());
  a.ChargeStored("a", "k", 50);  // the first one stored
  first->End();
  EXPECT_EQ(a.ReserveStored("a", 31).status().code(), absl::StatusCode::kResourceExhausted)
      << "50 stored and 20 in flight";
  fourth->End();
  other->End();
  a.GiveBackStored("a", {"k"});
  ASSERT_TRUE(a.BeginLedgerWrite("a").has_value());
  EXPECT_EQ(a.EndLedgerWrite("a", true, true), std::nullopt);
  EXPECT_EQ(a.tenants(), 0u) << "no reservation is left behind";
  {
    absl::StatusOr<StoredReservation> held = a.ReserveStored("a", 60);
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(a.ReserveStored("a", 41).status().code(), absl::StatusCode::kResourceExhausted);
    StoredReservation moved;
    moved = std::move(*held);
    EXPECT_EQ(a.ReserveStored("a", 41).status().code(), absl::StatusCode::kResourceExhausted)
        << "the reservation moved, it did not end";
  }
  EXPECT_EQ(a.tenants(), 0u) << "the reservation ended with its scope";
}

TEST(AdmissionTest, NoPinsAllowedMeansNone) {
  AdmissionController a({.max_pins_per_tenant = 0});
  EXPECT_EQ(a.CheckPin("a", "p").code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace vc::coordinator
