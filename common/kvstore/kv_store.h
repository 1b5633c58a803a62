// The storage core of vc-kvstore: a byte store for KV chunks keyed by content
// (see chunk_key.h), with a DRAM LRU tier in front of RocksDB on disk.
//
// Every entry is on disk; the DRAM tier caches hot values. Both tiers have a
// byte budget and evict least recently used entries that are not pinned.
// Multi-chunk prefixes are written in two phases (BeginPut, Stage, Commit) so
// that all their chunks become visible at once (one RocksDB WriteBatch);
// staged data is invisible until Commit and is discarded by Abort, when the
// put's lease expires (put_lease_seconds after its last use), or when the
// store is destroyed. An open put belongs to its owner (the identity that
// began it, an opaque string the caller derives: the authenticated peer once
// there is one, its address before): Stage, Commit and Abort by anyone else
// read as "no open put", so a put id is not a bearer token. Bookkeeping (size,
// LRU order, write time) is stored next to each value, so the budget and the
// LRU order survive a reopen; so do pins (one synced record per holder).
//
// Thread-safe: every method takes one internal mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rocksdb {
class Env;
}  // namespace rocksdb

namespace vc::kvstore {

struct KvStoreOptions {
  // Directory of the RocksDB database; created (with its parents) if
  // missing. Required.
  std::string path;
  // Bytes of values kept on disk; least recently used unpinned entries are
  // evicted past it. Default 64 GiB.
  int64_t disk_budget_bytes = int64_t{64} << 30;
  // Bytes of values cached in DRAM (0 disables the tier). Default 1 GiB.
  int64_t dram_budget_bytes = int64_t{1} << 30;
  // Entries older than this (since written) read as missing and are deleted
  // on read, unless pinned. 0: no expiry. Default 0.
  int64_t ttl_seconds = 0;
  // fsync every commit (data and bookkeeping). Default true. Access-order
  // updates on reads are never synced.
  bool sync_writes = true;
  // Open (begun, not yet committed or aborted) puts; BeginPut fails with
  // ResourceExhausted past it. Default 256.
  int max_open_puts = 256;
  // Bytes staged (and reserved, see ReserveStage) by all open puts
  // together; Stage / ReserveStage fail with ResourceExhausted past it.
  // Default 1 GiB.
  int64_t max_staged_bytes = int64_t{1} << 30;
  // Of those, bytes staged and reserved by the open puts of one owner (the
  // identity BeginPut names), so one identity cannot take the whole staging
  // budget from the others; ResourceExhausted naming it past it. Must be
  // > 0. Default 512 MiB.
  int64_t max_staged_bytes_per_identity = int64_t{512} << 20;
  // An open put is a lease: discarded (its staged bytes freed) once this many
  // seconds pass without a BeginPut/ReserveStage/Stage on it, so an
  // abandoned put cannot hold the staging budget. Must be > 0. Default 120.
  int64_t put_lease_seconds = 120;
  // Longest key in bytes. Default 256.
  int max_key_bytes = 256;
  // Longest pin holder name in bytes, and the most holders one entry may
  // have (Pin fails with ResourceExhausted past it). Defaults 256 and 64.
  int max_holder_bytes = 256;
  int max_pin_holders = 64;
  // Wall clock in milliseconds since the epoch, for TTL; null: the system
  // clock. Tests inject a fake one.
  std::function<int64_t()> clock_ms;
  // Observers of RocksDB latency (seconds of one value read from disk, of one
  // committed write batch), e.g. for metrics. Called with the store's mutex
  // held: keep them cheap. Null: not observed.
  std::function<void(double)> on_disk_read;
  std::function<void(double)> on_disk_write;
  // Test seam: the RocksDB Env the database runs on (tests pass one whose
  // file system injects write, sync and space errors and torn writes).
  // Null: RocksDB's default. Not owned; must outlive the store.
  rocksdb::Env* env = nullptr;
  // Integrity check of an entry (e.g. its seal, seal.h): called for every
  // entry of a Put or Commit before it is written (an error refuses the
  // whole put, which is discarded, with that code), and for every value read
  // from disk (an error quarantines the entry: it is deleted and the read is
  // NotFound, so the prefix is ingested again). Called without the store's
  // mutex on commit, with it on disk reads. Null: no check.
  std::function<absl::Status(const std::string& key, const std::string& value)> check_entry;
};

// Where a key was found.
enum class Tier { kDram, kDisk };

struct KvStoreStats {
  int64_t dram_entries = 0;
  int64_t dram_bytes = 0;
  int64_t disk_entries = 0;  // every live entry (all are on disk)
  int64_t disk_bytes = 0;
  int64_t pinned_entries = 0;
  int64_t open_puts = 0;
  int64_t staged_bytes = 0;
  int64_t dram_hits = 0;  // Get served from DRAM
  int64_t disk_hits = 0;  // Get served from disk
  int64_t misses = 0;     // Get of a missing or expired key
  int64_t dram_evictions = 0;
  int64_t disk_evictions = 0;  // entries deleted to stay in the disk budget
  int64_t expirations = 0;     // entries deleted by TTL
  int64_t expired_puts = 0;    // open puts discarded when their lease ran out
  int64_t reserved_bytes = 0;  // of the staging budget, reserved by stages in flight
  int64_t refused_entries = 0;  // entries that failed check_entry on commit
  int64_t quarantined = 0;      // entries that failed check_entry when read, deleted
};

class KvStore {
 public:
  // Opens (or creates) the store at options.path. InvalidArgument for bad
  // options; the RocksDB error (with the path) if the database cannot open.
  static absl::StatusOr<std::unique_ptr<KvStore>> Open(const KvStoreOptions& options);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Writes one entry (replacing any value) and commits it. ResourceExhausted
  // if it cannot fit in the disk budget even after evicting every unpinned
  // entry.
  [[nodiscard]] absl::Status Put(const std::string& key, const std::string& value);

  // Two-phase put: BeginPut returns an id owned by `owner`; Stage adds
  // entries to it (a later Stage of the same key wins); Commit makes all of
  // them visible at once or none (then the put is discarded too); Abort
  // discards them. Each of them is NotFound ("no open put") when the id is
  // unknown, expired, or owned by someone else (no existence oracle).
  [[nodiscard]] absl::StatusOr<uint64_t> BeginPut(const std::string& owner = "");
  [[nodiscard]] absl::Status Stage(uint64_t put_id, const std::string& key, std::string value,
                                   const std::string& owner = "");
  [[nodiscard]] absl::Status Commit(uint64_t put_id, const std::string& owner = "");
  [[nodiscard]] absl::Status Abort(uint64_t put_id, const std::string& owner = "");
  // Reserves `bytes` of the staging budget for `put_id` before an upload of
  // that size is read (the data plane calls it from the stage header, before
  // any value buffer exists): NotFound as above, ResourceExhausted if the
  // budget cannot hold it. Later Stage calls on the put draw on its
  // reservation first; ReleaseStage returns what an upload did not use (a
  // no-op once the put is gone).
  [[nodiscard]] absl::Status ReserveStage(uint64_t put_id, const std::string& owner,
                                          int64_t bytes);
  void ReleaseStage(uint64_t put_id, int64_t unused_bytes);
  // Discards the open puts whose lease ran out; how many. Every put call
  // does this too; the daemon also calls it on a timer.
  int ExpirePuts();

  // The value of `key`; NotFound if absent or expired. Counts as an access.
  [[nodiscard]] absl::StatusOr<std::string> Get(const std::string& key);
  // Which of `keys` exist, and the fastest tier holding each. Not an access.
  [[nodiscard]] absl::StatusOr<std::map<std::string, Tier>> Lookup(
      const std::vector<std::string>& keys);
  // Removes `key`; NotFound if absent, FailedPrecondition if pinned.
  [[nodiscard]] absl::Status Delete(const std::string& key);
  // A pin belongs to a holder (an opaque, non-empty name the caller
  // chooses, e.g. the prefix it keeps): an entry with any holder is never
  // evicted or expired, and Delete refuses it. Both calls are idempotent, so
  // a caller may repeat one whose answer it lost: pinning again for the same
  // holder changes nothing, and Unpin is OK when `holder` holds no pin on
  // `key` (or `key` is absent). Pins are written (synced) before the answer
  // and survive a reopen. Pin: NotFound if absent or expired,
  // ResourceExhausted past max_pin_holders.
  [[nodiscard]] absl::Status Pin(const std::string& key, const std::string& holder);
  [[nodiscard]] absl::Status Unpin(const std::string& key, const std::string& holder);
  // The holders whose names start with `prefix` and that pin at least one
  // entry, in byte order, at most `limit` of them (`truncated` when there
  // are more): how a caller that names its holders by owner (the
  // coordinator: by tenant) counts an owner's pins after it restarts.
  // InvalidArgument for a prefix longer than max_holder_bytes or a limit
  // outside [1, kMaxPinHoldersListed].
  static constexpr int kMaxPinHoldersListed = 4096;
  struct PinHolderList {
    std::vector<std::string> holders;
    bool truncated = false;
  };
  [[nodiscard]] absl::StatusOr<PinHolderList> PinHolders(const std::string& prefix,
                                                         int limit) const;

  KvStoreStats Stats() const;

 private:
  struct Impl;
  explicit KvStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vc::kvstore
