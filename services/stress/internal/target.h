// What vc-stress drives: the store in this process (KvStore on a RocksDB
// directory) or a vc-kvstore daemon over gRPC and its data plane (the
// workers' StoreClient, plus the raw control-plane RPCs for puts that are
// staged and then aborted). Both are real stores; this is a seam, not a fake.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::stress {

using Entries = std::vector<std::pair<std::string, std::string>>;

// Store counters vc-stress reports (eviction must be running all the time).
struct TargetStats {
  int64_t disk_entries = 0;
  int64_t disk_bytes = 0;
  int64_t dram_bytes = 0;
  int64_t dram_evictions = 0;
  int64_t disk_evictions = 0;
  int64_t expirations = 0;
};

class StressTarget {
 public:
  virtual ~StressTarget() = default;
  // One two-phase put of `entries`. `between` (if set) runs after every
  // entry is staged and before the commit (or abort): vc-stress reads the
  // keys there to check that staged bytes are invisible. With commit=false
  // the put is aborted after staging (OK if the abort succeeded).
  // `route` picks among the target's put paths (0 or 1).
  virtual absl::Status Put(const Entries& entries, bool commit, int route,
                           const std::function<void()>& between) = 0;
  // A value; NotFound if missing. `route` picks the read path (remote: 0 the
  // control plane's Get, 1 the data plane's Fetch).
  virtual absl::StatusOr<std::string> Get(const std::string& key, int route) = 0;
  virtual absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys) = 0;
  virtual absl::Status Delete(const std::string& key) = 0;
  virtual absl::Status Pin(const std::string& key, const std::string& holder) = 0;
  virtual absl::Status Unpin(const std::string& key, const std::string& holder) = 0;
  virtual absl::StatusOr<TargetStats> Stats() = 0;
  virtual std::string Describe() const = 0;
};

struct InprocTargetOptions {
  std::string db_dir;              // RocksDB directory (created if missing)
  int64_t dram_bytes = 256 << 10;  // DRAM tier budget
  int64_t disk_bytes = 4 << 20;    // disk tier budget
  int64_t ttl_seconds = 0;         // 0: no TTL
  bool sync_writes = true;         // fsync every commit
};
absl::StatusOr<std::unique_ptr<StressTarget>> OpenInprocTarget(const InprocTargetOptions& options);

struct RemoteTargetOptions {
  std::string address;           // vc-kvstore gRPC HOST:PORT (loopback)
  std::string data_plane = "tcp";
  int64_t timeout_ms = 5000;     // deadline of every RPC, fetch and stage
};
absl::StatusOr<std::unique_ptr<StressTarget>> OpenRemoteTarget(const RemoteTargetOptions& options);

}  // namespace vc::stress
