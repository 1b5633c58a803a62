#include "common/kvstore/kv_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace vc::kvstore {
namespace {

// RocksDB key space: 'd' + key -> value; 'm' + key -> metadata; 'p' + the
// key's length (4 bytes, big-endian) + key + holder -> "" (one pin).
constexpr char kDataPrefix = 'd';
constexpr char kMetaPrefix = 'm';
constexpr char kPinPrefix = 'p';
constexpr size_t kMetaBytes = 24;

std::string DataKey(const std::string& key) { return std::string(1, kDataPrefix) + key; }
std::string MetaKey(const std::string& key) { return std::string(1, kMetaPrefix) + key; }
std::string PinKey(const std::string& key, const std::string& holder) {
  std::string out(1, kPinPrefix);
  const auto n = static_cast<uint32_t>(key.size());
  for (int b = 3; b >= 0; --b) out.push_back(static_cast<char>(static_cast<uint8_t>(n >> (8 * b))));
  out += key;
  out += holder;
  return out;
}
// The key and holder named by a pin record's RocksDB key (kPinPrefix
// first, as PinKey makes it); false if it is not one.
bool DecodePinKey(const rocksdb::Slice& s, std::string& key, std::string& holder) {
  if (s.size() < 5) return false;
  uint32_t n = 0;
  for (int b = 1; b <= 4; ++b) n = (n << 8) | static_cast<uint8_t>(s.data()[b]);
  if (s.size() - 5 <= n) return false;  // a holder is never empty
  key.assign(s.data() + 5, n);
  holder.assign(s.data() + 5 + n, s.size() - 5 - n);
  return true;
}

// Wraps a RocksDB status; `what` says what was being done.
absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": rocksdb: ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsNotSupported()) return absl::UnimplementedError(msg);
  // A full disk is not retryable the way a transient I/O error is.
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return absl::UnavailableError(msg);
  if (s.IsIOError()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

struct Meta {
  int64_t size = 0;
  uint64_t seq = 0;        // access order: larger is more recent
  int64_t written_ms = 0;  // for TTL
};

std::string EncodeMeta(const Meta& m) {
  std::string out(kMetaBytes, '\0');
  const uint64_t f[3] = {static_cast<uint64_t>(m.size), m.seq, static_cast<uint64_t>(m.written_ms)};
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < 8; ++b)
      out[8 * i + b] = static_cast<char>(static_cast<uint8_t>(f[i] >> (8 * b)));
  return out;
}

bool DecodeMeta(const rocksdb::Slice& s, Meta& m) {
  if (s.size() != kMetaBytes) return false;
  uint64_t f[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < 8; ++b)
      f[i] |= uint64_t{static_cast<uint8_t>(s.data()[8 * i + b])} << (8 * b);
  m.size = static_cast<int64_t>(f[0]);
  m.seq = f[1];
  m.written_ms = static_cast<int64_t>(f[2]);
  return m.size >= 0;
}

struct DbDeleter {
  void operator()(rocksdb::DB* db) const {
    if (db == nullptr) return;
    db->Close().PermitUncheckedError();  // best effort; the destructor closes too
    delete db;
  }
};

// Below 2^62 (ids never wrap) and never 0.
uint64_t FirstPutId() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ static_cast<uint64_t>(rd());
  return (r >> 2) | 1;
}

}  // namespace

struct KvStore::Impl {
  KvStoreOptions options;
  std::unique_ptr<rocksdb::DB, DbDeleter> db;
  rocksdb::WriteOptions sync_write;
  rocksdb::WriteOptions lazy_write;  // access-order updates

  rocksdb::Status TimedWrite(rocksdb::WriteBatch& batch) {
    const auto t0 = std::chrono::steady_clock::now();
    rocksdb::Status s = db->Write(sync_write, &batch);
    if (options.on_disk_write) {
      options.on_disk_write(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return s;
  }

  mutable std::mutex mu;

  // Disk tier: every live entry, LRU list front = most recent.
  struct DiskEntry {
    Meta meta;
    std::set<std::string> holders;  // of its pins
    std::list<std::string>::iterator lru;
    bool Pinned() const { return !holders.empty(); }
  };
  std::unordered_map<std::string, DiskEntry> disk;
  // Every holder with a pin, and how many entries it pins (never 0).
  std::map<std::string, int64_t> holder_entries;
  void CountHolder(const std::string& holder, int64_t delta) {
    int64_t& n = holder_entries[holder];
    n += delta;
    if (n <= 0) holder_entries.erase(holder);
  }
  std::list<std::string> disk_lru;
  int64_t disk_bytes = 0;
  uint64_t next_seq = 1;

  // DRAM tier: a cache of values.
  struct DramEntry {
    std::string value;
    std::list<std::string>::iterator lru;
  };
  std::unordered_map<std::string, DramEntry> dram;
  std::list<std::string> dram_lru;
  int64_t dram_bytes = 0;

  // Open two-phase puts.
  struct PendingPut {
    std::map<std::string, std::string> entries;
    int64_t bytes = 0;
    int64_t reserved = 0;       // of reserved_bytes, held for this put's uploads
    std::string owner;          // who began it; nobody else may use it
    int64_t lease_end_ms = 0;   // discarded at or after this (NowMs)
  };
  std::unordered_map<uint64_t, PendingPut> puts;
  // Starts at a random id, so that ids do not repeat across a restart: a
  // writer's stage or abort for a put the old process lost must not land in
  // a put another writer (the same owner, on one host) has just begun.
  uint64_t next_put_id = FirstPutId();
  int64_t staged_bytes = 0;
  int64_t reserved_bytes = 0;
  // Staged + reserved bytes of each owner's open puts (owners with none
  // are erased, so this holds at most max_open_puts owners).
  std::unordered_map<std::string, int64_t> owner_bytes;

  int64_t OwnerBytes(const std::string& owner) const {
    auto it = owner_bytes.find(owner);
    return it == owner_bytes.end() ? 0 : it->second;
  }
  void AddOwnerBytes(const std::string& owner, int64_t delta) {
    if (delta == 0) return;
    int64_t& b = owner_bytes[owner];
    b += delta;
    if (b <= 0) owner_bytes.erase(owner);
  }
  // ResourceExhausted if `owner` growing by `more` bytes passes its cap.
  absl::Status CheckOwnerBudget(const std::string& owner, int64_t more, const char* what) const {
    const int64_t held = OwnerBytes(owner);
    if (more > 0 && held > options.max_staged_bytes_per_identity - more) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KvStore: ", what, " of ", more, " bytes exceeds max_staged_bytes_per_identity ",
          options.max_staged_bytes_per_identity, " (", held,
          " bytes staged or reserved by this identity's open puts)"));
    }
    return absl::OkStatus();
  }

  void RenewLease(PendingPut& p) { p.lease_end_ms = NowMs() + options.put_lease_seconds * 1000; }

  // The open put `id` if `owner` owns it; NotFound otherwise (the same
  // answer for "never existed", "expired" and "not yours").
  absl::StatusOr<std::unordered_map<uint64_t, PendingPut>::iterator> FindPut(
      uint64_t id, const std::string& owner) {
    ExpirePuts();
    auto it = puts.find(id);
    if (it == puts.end() || it->second.owner != owner) {
      return absl::NotFoundError(absl::StrCat("KvStore: no open put ", id));
    }
    return it;
  }

  int ExpirePuts() {
    const int64_t now = NowMs();
    int expired = 0;
    for (auto it = puts.begin(); it != puts.end();) {
      auto next = std::next(it);
      if (it->second.lease_end_ms <= now) {
        DiscardPut(it);
        ++expired;
      }
      it = next;
    }
    counters.expired_puts += expired;
    return expired;
  }

  KvStoreStats counters;  // only the counter fields are used

  int64_t NowMs() const {
    if (options.clock_ms) return options.clock_ms();
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  absl::Status CheckKey(const std::string& key) const {
    if (key.empty()) return absl::InvalidArgumentError("KvStore: empty key");
    if (key.size() > static_cast<size_t>(options.max_key_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvStore: key of ", key.size(), " bytes exceeds max_key_bytes ", options.max_key_bytes));
    }
    return absl::OkStatus();
  }

  absl::Status CheckHolder(const std::string& holder) const {
    if (holder.empty()) return absl::InvalidArgumentError("KvStore: a pin needs a holder");
    if (holder.size() > static_cast<size_t>(options.max_holder_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("KvStore: pin holder of ", holder.size(),
                                                     " bytes exceeds max_holder_bytes ",
                                                     options.max_holder_bytes));
    }
    return absl::OkStatus();
  }

  absl::Status Load() {
    std::vector<std::pair<uint64_t, std::string>> order;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    const std::string start(1, kMetaPrefix);
    for (it->Seek(start); it->Valid() && it->key().starts_with(start); it->Next()) {
      Meta m;
      const std::string key = it->key().ToString().substr(1);
      if (!DecodeMeta(it->value(), m)) {
        return absl::DataLossError(
            absl::StrCat("KvStore: corrupt metadata record in ", options.path));
      }
      DiskEntry e;
      e.meta = m;
      disk.emplace(key, std::move(e));
      order.emplace_back(m.seq, key);
      disk_bytes += m.size;
      next_seq = std::max(next_seq, m.seq + 1);
    }
    VC_RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("scanning ", options.path)));
    std::sort(order.begin(), order.end());
    for (auto it2 = order.rbegin(); it2 != order.rend(); ++it2) {
      disk_lru.push_back(it2->second);
      disk[it2->second].lru = std::prev(disk_lru.end());
    }
    return LoadPins();
  }

  // Attaches the pin records to their entries. A record whose entry is gone
  // (a commit not yet synced when the process died) is deleted.
  absl::Status LoadPins() {
    rocksdb::WriteBatch orphans;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    const std::string start(1, kPinPrefix);
    std::string key, holder;
    for (it->Seek(start); it->Valid() && it->key().starts_with(start); it->Next()) {
      if (!DecodePinKey(it->key(), key, holder)) {
        return absl::DataLossError(absl::StrCat("KvStore: corrupt pin record in ", options.path));
      }
      auto e = disk.find(key);
      if (e == disk.end()) {
        VC_RETURN_IF_ERROR(FromRocks(orphans.Delete(it->key()), "batch delete"));
      } else if (e->second.holders.insert(holder).second) {
        CountHolder(holder, 1);
      }
    }
    VC_RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("scanning ", options.path)));
    if (orphans.Count() == 0) return absl::OkStatus();
    return FromRocks(TimedWrite(orphans), absl::StrCat("deleting stale pins in ", options.path));
  }

  bool Expired(const DiskEntry& e, int64_t now) const {
    return options.ttl_seconds > 0 && !e.Pinned() &&
           now - e.meta.written_ms >= options.ttl_seconds * 1000;
  }

  void DropDram(const std::string& key) {
    auto it = dram.find(key);
    if (it == dram.end()) return;
    dram_bytes -= static_cast<int64_t>(it->second.value.size());
    dram_lru.erase(it->second.lru);
    dram.erase(it);
  }

  // Forgets `key` in memory (after its records were deleted on disk).
  void DropEntry(const std::string& key) {
    DropDram(key);
    auto it = disk.find(key);
    if (it == disk.end()) return;
    for (const std::string& h : it->second.holders) CountHolder(h, -1);
    disk_bytes -= it->second.meta.size;
    disk_lru.erase(it->second.lru);
    disk.erase(it);
  }

  absl::Status DeleteOnDisk(const std::vector<std::string>& keys) {
    rocksdb::WriteBatch batch;
    for (const std::string& k : keys) {
      VC_RETURN_IF_ERROR(FromRocks(batch.Delete(DataKey(k)), "batch delete"));
      VC_RETURN_IF_ERROR(FromRocks(batch.Delete(MetaKey(k)), "batch delete"));
      if (auto it = disk.find(k); it != disk.end()) {
        for (const std::string& h : it->second.holders) {
          VC_RETURN_IF_ERROR(FromRocks(batch.Delete(PinKey(k, h)), "batch delete"));
        }
      }
    }
    return FromRocks(TimedWrite(batch), absl::StrCat("deleting in ", options.path));
  }

  // Deletes `key` if it has expired; true if it did.
  absl::StatusOr<bool> ExpireIfDue(const std::string& key, const DiskEntry& e, int64_t now) {
    if (!Expired(e, now)) return false;
    VC_RETURN_IF_ERROR(DeleteOnDisk({key}));
    DropEntry(key);
    ++counters.expirations;
    return true;
  }

  void Touch(const std::string& key, DiskEntry& e) {
    e.meta.seq = next_seq++;
    disk_lru.splice(disk_lru.begin(), disk_lru, e.lru);
    // Best effort and unsynced: losing it only ages the entry in LRU order.
    db->Put(lazy_write, MetaKey(key), EncodeMeta(e.meta)).PermitUncheckedError();
  }

  // Caches `value` in DRAM if it fits after evicting unpinned entries.
  void CacheInDram(const std::string& key, const std::string& value) {
    DropDram(key);
    const int64_t size = static_cast<int64_t>(value.size());
    if (size > options.dram_budget_bytes) return;
    // Victims: least recent first, skipping pinned ones.
    std::vector<std::string> victims;
    int64_t freed = 0;
    for (auto it = dram_lru.rbegin();
         it != dram_lru.rend() && dram_bytes - freed + size > options.dram_budget_bytes; ++it) {
      auto d = disk.find(*it);
      if (d != disk.end() && d->second.Pinned()) continue;
      victims.push_back(*it);
      freed += static_cast<int64_t>(dram.at(*it).value.size());
    }
    if (dram_bytes - freed + size > options.dram_budget_bytes) return;
    for (const std::string& v : victims) {
      DropDram(v);
      ++counters.dram_evictions;
    }
    dram_lru.push_front(key);
    dram.emplace(key, DramEntry{value, dram_lru.begin()});
    dram_bytes += size;
  }

  // Writes `entries` atomically, evicting unpinned LRU entries (not among
  // them) to stay within the disk budget.
  absl::Status CommitEntries(const std::map<std::string, std::string>& entries) {
    int64_t added = 0;
    for (const auto& [k, v] : entries) {
      added += static_cast<int64_t>(v.size());
      auto it = disk.find(k);
      if (it != disk.end()) added -= it->second.meta.size;
    }
    std::vector<std::string> victims;
    int64_t freed = 0;
    for (auto it = disk_lru.rbegin();
         it != disk_lru.rend() && disk_bytes - freed + added > options.disk_budget_bytes; ++it) {
      const DiskEntry& e = disk.at(*it);
      if (e.Pinned() || entries.count(*it) > 0) continue;
      victims.push_back(*it);
      freed += e.meta.size;
    }
    if (disk_bytes - freed + added > options.disk_budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KvStore: put of ", entries.size(), " entries does not fit the disk budget of ",
          options.disk_budget_bytes, " bytes (", disk_bytes, " used, pinned entries stay)"));
    }
    rocksdb::WriteBatch batch;
    for (const std::string& k : victims) {
      VC_RETURN_IF_ERROR(FromRocks(batch.Delete(DataKey(k)), "batch delete"));
      VC_RETURN_IF_ERROR(FromRocks(batch.Delete(MetaKey(k)), "batch delete"));
    }
    const int64_t now = NowMs();
    std::vector<std::pair<std::string, Meta>> metas;
    for (const auto& [k, v] : entries) {
      Meta m;
      m.size = static_cast<int64_t>(v.size());
      m.seq = next_seq++;
      m.written_ms = now;
      VC_RETURN_IF_ERROR(FromRocks(batch.Put(DataKey(k), v), "batch put"));
      VC_RETURN_IF_ERROR(FromRocks(batch.Put(MetaKey(k), EncodeMeta(m)), "batch put"));
      metas.emplace_back(k, m);
    }
    VC_RETURN_IF_ERROR(
        FromRocks(TimedWrite(batch), absl::StrCat("committing to ", options.path)));
    // Durable: now update the bookkeeping.
    for (const std::string& k : victims) {
      DropEntry(k);
      ++counters.disk_evictions;
    }
    for (auto& [k, m] : metas) {
      auto it = disk.find(k);
      if (it == disk.end()) {
        disk_lru.push_front(k);
        DiskEntry e;
        e.lru = disk_lru.begin();
        it = disk.emplace(k, e).first;
      } else {
        disk_bytes -= it->second.meta.size;
        disk_lru.splice(disk_lru.begin(), disk_lru, it->second.lru);
      }
      it->second.meta = m;
      disk_bytes += m.size;
      CacheInDram(k, entries.at(k));
    }
    return absl::OkStatus();
  }

  void DiscardPut(std::unordered_map<uint64_t, PendingPut>::iterator it) {
    staged_bytes -= it->second.bytes;
    reserved_bytes -= it->second.reserved;
    AddOwnerBytes(it->second.owner, -(it->second.bytes + it->second.reserved));
    puts.erase(it);
  }
};

KvStore::KvStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvStore::~KvStore() = default;

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const KvStoreOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("KvStore: options.path is empty");
  if (options.disk_budget_bytes <= 0 || options.dram_budget_bytes < 0 || options.ttl_seconds < 0 ||
      options.max_open_puts <= 0 || options.max_staged_bytes <= 0 ||
      options.max_staged_bytes_per_identity <= 0 || options.max_key_bytes <= 0 ||
      options.max_holder_bytes <= 0 || options.max_pin_holders <= 0 ||
      options.put_lease_seconds <= 0 || options.put_lease_seconds > int64_t{1} << 31) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvStore: bad options: disk_budget_bytes=", options.disk_budget_bytes,
        " (must be > 0), dram_budget_bytes=", options.dram_budget_bytes, " (>= 0), ttl_seconds=",
        options.ttl_seconds, " (>= 0), max_open_puts=", options.max_open_puts,
        " (> 0), max_staged_bytes=", options.max_staged_bytes,
        " (> 0), max_staged_bytes_per_identity=", options.max_staged_bytes_per_identity,
        " (> 0), max_key_bytes=", options.max_key_bytes, " (> 0), max_holder_bytes=",
        options.max_holder_bytes, " (> 0), max_pin_holders=", options.max_pin_holders,
        " (> 0), put_lease_seconds=", options.put_lease_seconds, " (in [1, 2^31])"));
  }
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("KvStore: cannot create database directory ",
                                                      options.path, ": ", ec.message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->sync_write.sync = options.sync_writes;
  impl->lazy_write.sync = false;
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.max_open_files = 256;  // bounded file handles
  db_options.keep_log_file_num = 4;
  if (options.env != nullptr) db_options.env = options.env;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(db_options, options.path, &raw);
  impl->db.reset(raw);
  VC_RETURN_IF_ERROR(FromRocks(s, absl::StrCat("KvStore: opening database at ", options.path)));
  if (impl->db == nullptr) return absl::InternalError("KvStore: rocksdb returned no database");
  VC_RETURN_IF_ERROR(impl->Load());
  return std::unique_ptr<KvStore>(new KvStore(std::move(impl)));
}

absl::Status KvStore::Put(const std::string& key, const std::string& value) {
  VC_RETURN_IF_ERROR(impl_->CheckKey(key));
  if (impl_->options.check_entry) {
    if (absl::Status s = impl_->options.check_entry(key, value); !s.ok()) {
      std::lock_guard<std::mutex> lock(impl_->mu);
      ++impl_->counters.refused_entries;
      return s;
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->CommitEntries({{key, value}});
}

absl::StatusOr<uint64_t> KvStore::BeginPut(const std::string& owner) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->ExpirePuts();
  if (impl_->puts.size() >= static_cast<size_t>(impl_->options.max_open_puts)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KvStore: ", impl_->puts.size(), " puts already open (max_open_puts)"));
  }
  const uint64_t id = impl_->next_put_id++;
  Impl::PendingPut& p = impl_->puts.emplace(id, Impl::PendingPut{}).first->second;
  p.owner = owner;
  impl_->RenewLease(p);
  return id;
}

absl::Status KvStore::ReserveStage(uint64_t put_id, const std::string& owner, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("KvStore: negative reservation");
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  VC_ASSIGN_OR_RETURN(auto it, m.FindPut(put_id, owner));
  if (m.staged_bytes + m.reserved_bytes > m.options.max_staged_bytes - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvStore: an upload of ", bytes, " bytes exceeds max_staged_bytes ",
        m.options.max_staged_bytes, " (", m.staged_bytes, " staged, ", m.reserved_bytes,
        " reserved)"));
  }
  VC_RETURN_IF_ERROR(m.CheckOwnerBudget(owner, bytes, "an upload"));
  it->second.reserved += bytes;
  m.reserved_bytes += bytes;
  m.AddOwnerBytes(owner, bytes);
  m.RenewLease(it->second);
  return absl::OkStatus();
}

void KvStore::ReleaseStage(uint64_t put_id, int64_t unused_bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->puts.find(put_id);
  if (it == impl_->puts.end() || unused_bytes <= 0) return;
  const int64_t give = std::min(unused_bytes, it->second.reserved);
  it->second.reserved -= give;
  impl_->reserved_bytes -= give;
  impl_->AddOwnerBytes(it->second.owner, -give);
}

int KvStore::ExpirePuts() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ExpirePuts();
}

absl::Status KvStore::Stage(uint64_t put_id, const std::string& key, std::string value,
                            const std::string& owner) {
  VC_RETURN_IF_ERROR(impl_->CheckKey(key));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  VC_ASSIGN_OR_RETURN(auto it, m.FindPut(put_id, owner));
  Impl::PendingPut& p = it->second;
  auto old = p.entries.find(key);
  const int64_t old_size = old == p.entries.end() ? 0 : static_cast<int64_t>(old->second.size());
  const int64_t delta = static_cast<int64_t>(value.size()) - old_size;
  // An upload's bytes were reserved from its header: draw on that first.
  const int64_t take = std::min(p.reserved, static_cast<int64_t>(value.size()));
  if (m.staged_bytes + (m.reserved_bytes - take) + delta > m.options.max_staged_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KvStore: staging ", value.size(), " bytes exceeds max_staged_bytes ",
                     m.options.max_staged_bytes, " (", m.staged_bytes, " staged)"));
  }
  VC_RETURN_IF_ERROR(m.CheckOwnerBudget(owner, delta - take, "staging"));
  p.reserved -= take;
  m.reserved_bytes -= take;
  p.entries[key] = std::move(value);
  p.bytes += delta;
  m.staged_bytes += delta;
  m.AddOwnerBytes(owner, delta - take);
  m.RenewLease(p);
  return absl::OkStatus();
}

absl::Status KvStore::Commit(uint64_t put_id, const std::string& owner) {
  std::map<std::string, std::string> entries;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    VC_ASSIGN_OR_RETURN(auto it, impl_->FindPut(put_id, owner));
    entries.swap(it->second.entries);
    impl_->DiscardPut(it);  // committed or refused below, never reopened
  }
  // The integrity check reads every byte: outside the mutex.
  if (impl_->options.check_entry) {
    for (const auto& [key, value] : entries) {
      if (absl::Status s = impl_->options.check_entry(key, value); !s.ok()) {
        std::lock_guard<std::mutex> lock(impl_->mu);
        ++impl_->counters.refused_entries;
        return absl::Status(s.code(),
                            absl::StrCat("KvStore: put ", put_id, " refused: ", s.message()));
      }
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->CommitEntries(entries);
}

absl::Status KvStore::Abort(uint64_t put_id, const std::string& owner) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  VC_ASSIGN_OR_RETURN(auto it, impl_->FindPut(put_id, owner));
  impl_->DiscardPut(it);
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::Get(const std::string& key) {
  VC_RETURN_IF_ERROR(impl_->CheckKey(key));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  auto it = m.disk.find(key);
  if (it == m.disk.end()) {
    ++m.counters.misses;
    return absl::NotFoundError("KvStore: key not found");
  }
  VC_ASSIGN_OR_RETURN(const bool expired, m.ExpireIfDue(key, it->second, m.NowMs()));
  if (expired) {
    ++m.counters.misses;
    return absl::NotFoundError("KvStore: key not found (expired)");
  }
  m.Touch(key, it->second);
  auto d = m.dram.find(key);
  if (d != m.dram.end()) {
    m.dram_lru.splice(m.dram_lru.begin(), m.dram_lru, d->second.lru);
    ++m.counters.dram_hits;
    return d->second.value;
  }
  std::string value;
  const auto read_start = std::chrono::steady_clock::now();
  const rocksdb::Status s = m.db->Get(rocksdb::ReadOptions(), DataKey(key), &value);
  if (m.options.on_disk_read) {
    m.options.on_disk_read(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count());
  }
  if (s.IsNotFound()) {
    return absl::DataLossError("KvStore: metadata present but value missing on disk");
  }
  VC_RETURN_IF_ERROR(FromRocks(s, "KvStore: reading value"));
  if (static_cast<int64_t>(value.size()) != it->second.meta.size) {
    return absl::DataLossError(absl::StrCat("KvStore: value on disk is ", value.size(),
                                            " bytes, metadata says ", it->second.meta.size));
  }
  if (m.options.check_entry) {
    if (absl::Status bad = m.options.check_entry(key, value); !bad.ok()) {
      // Corrupted (or replaced) underneath the store: quarantine it, so
      // readers miss and the prefix is ingested again.
      if (!it->second.Pinned()) {
        VC_RETURN_IF_ERROR(m.DeleteOnDisk({key}));
        m.DropEntry(key);
      }
      ++m.counters.quarantined;
      ++m.counters.misses;
      return absl::NotFoundError(
          absl::StrCat("KvStore: entry failed its integrity check and was removed (", bad.message(),
                       ")"));
    }
  }
  ++m.counters.disk_hits;
  m.CacheInDram(key, value);
  return value;
}

absl::StatusOr<std::map<std::string, Tier>> KvStore::Lookup(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  const int64_t now = m.NowMs();
  std::map<std::string, Tier> out;
  for (const std::string& key : keys) {
    auto it = m.disk.find(key);
    if (it == m.disk.end()) continue;
    VC_ASSIGN_OR_RETURN(const bool expired, m.ExpireIfDue(key, it->second, now));
    if (expired) continue;
    out[key] = m.dram.count(key) > 0 ? Tier::kDram : Tier::kDisk;
  }
  return out;
}

absl::Status KvStore::Delete(const std::string& key) {
  VC_RETURN_IF_ERROR(impl_->CheckKey(key));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  auto it = m.disk.find(key);
  if (it == m.disk.end()) return absl::NotFoundError("KvStore: delete of a missing key");
  if (it->second.Pinned()) {
    return absl::FailedPreconditionError("KvStore: cannot delete a pinned entry");
  }
  VC_RETURN_IF_ERROR(m.DeleteOnDisk({key}));
  m.DropEntry(key);
  return absl::OkStatus();
}

absl::Status KvStore::Pin(const std::string& key, const std::string& holder) {
  VC_RETURN_IF_ERROR(impl_->CheckKey(key));
  VC_RETURN_IF_ERROR(impl_->CheckHolder(holder));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  auto it = m.disk.find(key);
  if (it == m.disk.end()) return absl::NotFoundError("KvStore: pin of a missing key");
  VC_ASSIGN_OR_RETURN(const bool expired, m.ExpireIfDue(key, it->second, m.NowMs()));
  if (expired) return absl::NotFoundError("KvStore: pin of an expired key");
  std::set<std::string>& holders = it->second.holders;
  if (holders.count(holder) > 0) return absl::OkStatus();
  if (holders.size() >= static_cast<size_t>(m.options.max_pin_holders)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvStore: the entry already has ", holders.size(), " pin holders (max_pin_holders)"));
  }
  rocksdb::WriteBatch batch;
  VC_RETURN_IF_ERROR(FromRocks(batch.Put(PinKey(key, holder), ""), "batch put"));
  VC_RETURN_IF_ERROR(FromRocks(m.TimedWrite(batch), absl::StrCat("pinning in ", m.options.path)));
  holders.insert(holder);
  m.CountHolder(holder, 1);
  return absl::OkStatus();
}

absl::Status KvStore::Unpin(const std::string& key, const std::string& holder) {
  VC_RETURN_IF_ERROR(impl_->CheckKey(key));
  VC_RETURN_IF_ERROR(impl_->CheckHolder(holder));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  auto it = m.disk.find(key);
  if (it == m.disk.end() || it->second.holders.count(holder) == 0) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  VC_RETURN_IF_ERROR(FromRocks(batch.Delete(PinKey(key, holder)), "batch delete"));
  VC_RETURN_IF_ERROR(FromRocks(m.TimedWrite(batch), absl::StrCat("unpinning in ", m.options.path)));
  it->second.holders.erase(holder);
  m.CountHolder(holder, -1);
  return absl::OkStatus();
}

absl::StatusOr<KvStore::PinHolderList> KvStore::PinHolders(const std::string& prefix,
                                                           int limit) const {
  if (prefix.size() > static_cast<size_t>(impl_->options.max_holder_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("KvStore: holder prefix of ", prefix.size(),
                                                   " bytes exceeds max_holder_bytes ",
                                                   impl_->options.max_holder_bytes));
  }
  if (limit < 1 || limit > kMaxPinHoldersListed) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvStore: a pin holder list's limit must be in [1, ", kMaxPinHoldersListed,
                     "], not ", limit));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  PinHolderList list;
  for (auto it = impl_->holder_entries.lower_bound(prefix);
       it != impl_->holder_entries.end() && it->first.starts_with(prefix); ++it) {
    if (static_cast<int>(list.holders.size()) == limit) {
      list.truncated = true;
      break;
    }
    list.holders.push_back(it->first);
  }
  return list;
}

KvStoreStats KvStore::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Impl& m = *impl_;
  KvStoreStats s = m.counters;
  s.dram_entries = static_cast<int64_t>(m.dram.size());
  s.dram_bytes = m.dram_bytes;
  s.disk_entries = static_cast<int64_t>(m.disk.size());
  s.disk_bytes = m.disk_bytes;
  s.pinned_entries = 0;
  for (const auto& [k, e] : m.disk) s.pinned_entries += e.Pinned() ? 1 : 0;
  s.open_puts = static_cast<int64_t>(m.puts.size());
  s.staged_bytes = m.staged_bytes;
  s.reserved_bytes = m.reserved_bytes;
  return s;
}

}  // namespace vc::kvstore
