// Link faults for a chaos run (issue 13: "cuts or throttles links"),
// contained to the run's own cluster. Enter() moves the chaos process into a
// fresh, unnamed network namespace before it starts anything, so every
// daemon it launches afterwards lives there too, on that namespace's own
// loopback: a qdisc there touches no other process of the machine (the
// host's `lo` is never shaped), and the namespace, its qdiscs and filters
// vanish with the last process in it — however the run ends (SIGINT,
// SIGTERM, kill -9), nothing is left to clean up at the next start.
//
// The namespace's loopback gets an htb root whose default class is
// unshaped; a fault adds a class for the packets to or from one daemon's
// listening ports (u32 filters on source and destination port, so both
// directions of every connection to it) and removes it again. Only htb,
// pfifo and u32 are needed (some kernels, this machine's among them, lack
// netem): a cut is that class at 8 bit/s with a one-packet queue (TCP sees
// a black hole, then retransmits once it ends), a throttle the class at a
// low rate.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::chaos::internal {

class LinkFaults {
 public:
  // FailedPrecondition with the reason unless: root, `ip` and `tc` on the
  // PATH, the process still single-threaded (a namespace change applies to
  // the calling thread and what it starts later), and the kernel's htb and
  // u32.
  static absl::StatusOr<std::unique_ptr<LinkFaults>> Enter();
  ~LinkFaults();

  // Every packet to or from `ports` (127.0.0.1) is dropped (Cut) or held to
  // `rate` (Throttle, tc units, e.g. "1mbit") until Clear(). One fault at a
  // time: a second replaces the first.
  absl::Status Cut(const std::vector<int>& ports);
  absl::Status Throttle(const std::vector<int>& ports, const std::string& rate);
  absl::Status Clear();

 private:
  LinkFaults() = default;
  absl::Status Apply(const std::vector<int>& ports, const std::string& rate, int queue_packets);
  bool active_ = false;
};

// Runs `argv` (argv[0] looked up on the PATH), waiting for it; its output
// is captured and, on a non-zero exit, part of the error.
absl::Status RunTool(const std::vector<std::string>& argv);

}  // namespace vc::chaos::internal
