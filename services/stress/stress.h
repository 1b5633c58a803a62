// vc-stress: a db_stress-style load and checking tool for the KV chunk
// store. Threads issue puts (multi-chunk, committed and aborted), gets,
// lookups, deletes, pins and unpins against a real store (in this process,
// or a vc-kvstore daemon over gRPC and the data plane), with budgets small
// enough that eviction runs all the time, and check every answer against an
// expected-state oracle persisted in a file (internal/expected_state.h), so
// a run can resume, or verify, after the store (or vc-stress) was killed.
//
// A run first verifies (and resolves) every key against the oracle, then
// runs the load, then verifies every key again. Bounded: it stops after
// `ops` operations or `duration_s` seconds, whichever comes first.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vc::stress {

struct StressOptions {
  std::string mode = "inproc";      // "inproc" (KvStore on db_dir) or "remote" (vc-kvstore)
  std::string db_dir;               // inproc: the RocksDB directory
  std::string store_address;        // remote: vc-kvstore's gRPC HOST:PORT (loopback only)
  std::string data_plane = "tcp";   // remote: the store's data plane kind
  std::string oracle_path;          // the expected-state file (required)
  int threads = 4;                  // worker threads, 1..256
  int64_t ops = 0;                  // total operations (0: bounded by duration only)
  double duration_s = 10;           // wall-clock bound of the load, seconds (0 < d <= 86400)
  uint64_t seed = 0;                // 0: drawn from the clock (printed)
  int64_t keys = 1024;              // key space (fixed by the oracle file)
  int64_t min_value_bytes = 64;     // value sizes (fixed by the oracle file)
  int64_t max_value_bytes = 16384;
  int max_batch = 4;                // keys per put, 1..64
  int max_pins_per_thread = 2;      // pins a thread holds at once
  int64_t dram_bytes = 256 << 10;   // the store's DRAM budget (inproc: set; remote: informative)
  int64_t disk_bytes = 4 << 20;     // the store's disk budget (remote: must match the daemon's)
  int64_t ttl_seconds = 0;          // the store's TTL (remote: must match the daemon's)
  bool sync_writes = true;          // inproc: fsync every commit (false: commits are "unsynced")
  bool oracle_sync = true;          // msync the oracle before every mutating call
  bool verify_only = false;         // only verify (and resolve) every key
  int64_t rpc_timeout_ms = 5000;    // remote: deadline of every call
  double max_unreachable_s = 3;     // remote: stop once the store stayed unreachable this long
  int max_reported_violations = 20; // violations printed in full
};

struct OpCounts {
  int64_t issued = 0;
  int64_t ok = 0;
  int64_t missing = 0;    // NotFound, and allowed by the oracle
  int64_t refused = 0;    // an expected refusal (budget full, pinned, not pinned)
  int64_t uncertain = 0;  // failed with an unknown outcome (store unreachable, deadline)
};

struct StressReport {
  uint64_t seed = 0;
  uint64_t run = 0;                      // runs that used the oracle, this one included
  double seconds = 0;                    // of the load phase
  std::map<std::string, OpCounts> ops;   // by operation
  int64_t total_ops = 0;
  int64_t verified_keys = 0;             // keys read by the verify passes
  int64_t unverified_keys = 0;           // keys a verify pass could not read
  int64_t resolved_keys = 0;             // pending outcomes resolved by a verify pass
  int64_t observed_evicted = 0;          // committed entries found gone where eviction allowed it
  int64_t observed_expired = 0;          // ... where expiry allowed it (eviction may have too)
  int64_t violations = 0;
  std::vector<std::string> violation_messages;  // the first max_reported_violations
  int64_t unexpected_errors = 0;         // errors the store should not return (bugs)
  std::vector<std::string> error_messages;
  bool store_unreachable = false;        // remote: stopped because the store went away
  std::string store_stats;               // the store's counters at the end
};

// Runs vc-stress. InvalidArgument for bad options; errors opening the oracle
// or the store. Violations are in the report, not the status.
absl::StatusOr<StressReport> RunStress(const StressOptions& options);

// Per-op table, violations and the one-line summary.
std::string FormatReport(const StressReport& report);
// 0: no violation or error; 1: violations or unexpected errors; 3: the
// store became unreachable (remote), or some key could not be verified, with
// no violation.
int ExitCode(const StressReport& report);

}  // namespace vc::stress
