// The stress tool's expected-state oracle: what the store may hold for each
// key, kept in a file that outlives both the store and vc-stress.
//
// The file is memory-mapped (MAP_SHARED): a record written by vc-stress is
// in the page cache the moment the store call that follows it is issued, so
// a kill -9 of the store or of vc-stress loses nothing; with `sync` the
// touched pages are also msync'd before a mutating store call is issued, so
// the oracle survives a machine crash too. Every key's record has two
// checksummed slots written alternately: a write cut short by a crash leaves
// the other (older, and still sound) slot in force.
//
// A record is written BEFORE an operation is issued (the operation becomes
// "pending": both the old and the new outcome are allowed) and settled after
// it returns. A pending record that is never settled (a crash, an error whose
// outcome is unknown) keeps both outcomes allowed until a later read resolves
// it (Resolve).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::stress {

// What the oracle last knew of a key (for reports; the rules use the fields).
enum class KeyState : uint8_t {
  kAbsent = 0,           // never written, or read as missing with no reason to care
  kCommittedSynced = 1,  // a commit acknowledged with sync: must survive a crash
  kCommittedUnsynced = 2,  // acknowledged without sync: may be lost by a crash
  kPending = 3,          // an operation was issued and its outcome is unknown
  kEvicted = 4,          // read as missing while eviction was possible
  kDeleted = 5,          // deleted by vc-stress
  kExpired = 6,          // read as missing while TTL expiry was possible
};
const char* KeyStateName(KeyState state);

enum class PendingOp : uint8_t { kNone = 0, kPut = 1, kDelete = 2 };

// One key's record. Versions count the puts of a key (committed or aborted,
// so an aborted put's version is never allowed); 0 means "no value".
struct KeyRecord {
  uint32_t committed_version = 0;  // the value the store must hold (0: none)
  uint32_t pending_version = 0;    // the put in flight (PendingOp::kPut)
  uint32_t synced_version = 0;     // last version acknowledged with sync
  uint32_t next_version = 0;       // versions handed out so far
  KeyState state = KeyState::kAbsent;
  PendingOp pending = PendingOp::kNone;
  uint8_t pins = 0;  // pins vc-stress holds on it (persisted in the store)
  uint8_t unused = 0;
  uint32_t reserved = 0;  // keeps the layout free of padding (checksummed bytes)
  uint64_t value_hash = 0;   // hash of the committed value's bytes (0: none)
  int64_t commit_g = 0;      // traffic counter before the last commit (or pending put) was issued
  int64_t commit_ms = 0;     // wall ms when that commit was issued (TTL starts no earlier)
  int64_t commit_ack_ms = 0; // wall ms when it was acknowledged (TTL starts no later)
  uint64_t batch_id = 0;     // the pending put's batch (its keys commit together)
};

// What the store may return for one key at one moment.
struct Expectation {
  std::vector<uint32_t> versions;  // versions that may be present
  bool absent_ok = false;          // whether "missing" is allowed
  std::string absent_reason;       // why missing is allowed (empty: it is not)
  KeyState absent_state = KeyState::kAbsent;  // what to record when it is read as missing
  std::string present_forbidden;   // non-empty: why presence of any value is a violation
};

// Facts about "now" that the rules need.
struct ExpectContext {
  int64_t g_now = 0;          // traffic counter when the read returned
  int64_t now_ms = 0;         // wall ms when the read returned
  int64_t issue_ms = 0;       // wall ms when the read was issued
  int64_t disk_budget = 0;    // the store's disk budget in bytes
  int64_t eviction_slack = 0; // bytes of pinned and in-flight values the bound allows for
  int64_t ttl_ms = 0;         // the store's TTL (0: none)
  bool pins_known = true;     // false: pins left by a crashed run may still be held
  bool after_crash = false;   // unsynced commits may have been lost
};

// The rules: which outcomes a read of a key whose record is `r` may have.
// A committed entry may be missing only if it may have been evicted (more
// value bytes written or read since its commit than the disk budget minus
// the slack could hold next to it; LRU never evicts it sooner), may have
// expired, or was unsynced and the store crashed. A pinned entry is never
// evicted or expired. An entry surely past its TTL (and unpinned) must not
// be served.
Expectation Expect(const KeyRecord& r, int64_t value_size, const ExpectContext& ctx);

// Keys and values: deterministic in (namespace, key index, version), so a
// value read is checked byte for byte and names the put that wrote it.
std::string KeyBytes(uint64_t ns, uint32_t index);  // 32 bytes (a raw chunk key)
std::string ValueBytes(uint64_t ns, uint32_t index, uint32_t version, int64_t min_bytes,
                       int64_t max_bytes);
int64_t ValueSize(uint64_t ns, uint32_t index, uint32_t version, int64_t min_bytes,
                  int64_t max_bytes);
uint64_t HashBytes(const std::string& bytes);
// The (index, version) a value claims in its header; InvalidArgument if the
// header is malformed.
struct ValueId {
  uint32_t index = 0;
  uint32_t version = 0;
};
absl::StatusOr<ValueId> ParseValue(const std::string& value);

struct ExpectedStateOptions {
  std::string path;              // the oracle file; created if missing
  uint32_t num_keys = 1024;      // key space (fixed when the file is created)
  int64_t min_value_bytes = 64;  // value sizes (fixed when the file is created)
  int64_t max_value_bytes = 16384;
  bool sync = true;              // msync touched pages before mutating calls
  bool create = true;            // false: the file must exist (--verify-only)
  // A new file's key namespace is drawn from this (0: from the clock), so a
  // seed replays the same keys and value sizes on a fresh store.
  uint64_t namespace_seed = 0;
};

class ExpectedState {
 public:
  // Opens or creates the file. An existing file must match num_keys and the
  // value sizes (InvalidArgument naming the mismatch); a file that is not an
  // oracle, or whose records are all corrupt, is DataLoss.
  static absl::StatusOr<std::unique_ptr<ExpectedState>> Open(const ExpectedStateOptions& options);
  ~ExpectedState();
  ExpectedState(const ExpectedState&) = delete;
  ExpectedState& operator=(const ExpectedState&) = delete;

  uint32_t num_keys() const;
  uint64_t key_namespace() const;
  int64_t min_value_bytes() const;
  int64_t max_value_bytes() const;

  // The record of key `index` (the newest valid slot). Callers serialize
  // access to one key (vc-stress holds a per-key lock).
  KeyRecord Get(uint32_t index) const;
  // Writes the record into the older slot.
  void Set(uint32_t index, const KeyRecord& record);
  // With sync: msyncs the pages of these keys' records and the header.
  // Called after recording pending operations and before issuing them.
  [[nodiscard]] absl::Status Persist(const std::vector<uint32_t>& indices);

  // Traffic counter: value bytes written or read so far (all runs). Add
  // returns the value before adding.
  int64_t AddTraffic(int64_t bytes);
  int64_t Traffic() const;
  uint64_t NextBatchId();
  // Runs that used this file (incremented by vc-stress at start).
  uint64_t BeginRun();

 private:
  struct Impl;
  explicit ExpectedState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vc::stress
