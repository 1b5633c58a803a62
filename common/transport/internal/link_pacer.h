// Pacing and byte accounting of one link class at the store. Shared by every
// backend: a response goes out as pieces, and each piece first passes
// Acquire(); an upload (stage request) is read in pieces, and each piece
// passes Acquire() before it is read (receiver-side pacing). Both directions
// share one bucket, so the link is modelled as one channel whose capacity
// reads and writes split between them.
//
// The bucket is kept as "the time the link is next free": a piece of n bytes
// is released at max(now, next_free) + n / bytes_per_second, i.e. at the
// end of its own transmission time, and next_free moves there. So a fetch of
// N bytes never completes in under N / bandwidth, concurrent senders share
// the bandwidth, and any window of length T holds at most
// bandwidth * T + one piece (the bytes are counted at their release time).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

#include "absl/status/status.h"
#include "common/transport/data_plane.h"

namespace vc::transport::internal {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// A one-way "stop now" flag whose sleeps wake as soon as it is raised.
class StopSignal {
 public:
  void Stop();
  bool stopped() const;
  // Sleeps until `t`; false if the signal was (or got) raised first.
  bool SleepUntil(TimePoint t) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopped_ = false;
};

// Bytes per fixed-width time slot, keeping the newest `max_slots` slots.
// Not thread-safe (LinkPacer locks around it).
class SlotCounters {
 public:
  SlotCounters(double slot_seconds, int max_slots);
  // Adds `bytes` to the slot holding `seconds` (since the epoch, >= 0). Bytes
  // for a slot older than the kept history are dropped.
  void Add(double seconds, int64_t bytes);
  LinkSlotCounters Snapshot() const;

 private:
  double slot_seconds_;
  int max_slots_;
  int64_t first_slot_ = 0;
  std::deque<int64_t> bytes_;
};

// Which way a piece crosses the link, seen from the store.
enum class Flow { kOut, kIn };
// What a bracketed exchange is, for the per-kind counts in LinkStats.
enum class Exchange { kFetch, kStage };

class LinkPacer {
 public:
  LinkPacer(const LinkPacing& pacing, TimePoint epoch, double slot_seconds, int max_slots);

  bool paced() const { return pacing_.bytes_per_second > 0; }
  double latency_seconds() const { return pacing_.latency_seconds; }

  // Waits until `bytes` may leave on this link and counts them. Unpaced:
  // returns at once. DeadlineExceeded if the release time is past
  // `deadline` (nothing is counted), Cancelled if `stop` is raised. Inbound
  // bytes are also counted in LinkStats::bytes_received.
  absl::Status Acquire(int64_t bytes, TimePoint deadline, const StopSignal& stop,
                       Flow flow = Flow::kOut);

  // Brackets one exchange, for the unpaced busy time and the fetch / stage
  // counts.
  void BeginResponse(Exchange kind = Exchange::kFetch);
  void EndResponse();

  LinkStats Stats() const;

 private:
  const LinkPacing pacing_;
  const TimePoint epoch_;
  mutable std::mutex mu_;
  TimePoint next_free_;
  SlotCounters counters_;
  int64_t bytes_total_ = 0;
  int64_t bytes_received_ = 0;
  int64_t fetches_ = 0;
  int64_t stages_ = 0;
  double busy_seconds_ = 0;
  int active_responses_ = 0;
  TimePoint busy_since_;
};

}  // namespace vc::transport::internal
