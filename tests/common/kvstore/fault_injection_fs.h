// Test-only: a RocksDB FileSystem that wraps the real one and injects the
// faults a disk can have (in the spirit of RocksDB's FaultInjectionTestFS,
// written here from its description): failed writes, failed syncs, a full
// disk, and a crash that loses every byte written after a file's last sync,
// optionally keeping a random prefix of them (a torn write).
//
// Give it to KvStore through KvStoreOptions::env (rocksdb::NewCompositeEnv).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <rocksdb/file_system.h>

namespace vc::kvstore::testing {

class FaultInjectionFs : public rocksdb::FileSystemWrapper {
 public:
  explicit FaultInjectionFs(const std::shared_ptr<rocksdb::FileSystem>& base);
  static const char* kClassName() { return "VcFaultInjectionFs"; }
  const char* Name() const override { return kClassName(); }

  // Appends fail with an I/O error while on.
  void FailWrites(bool on);
  // Sync/Fsync/RangeSync fail with an I/O error while on.
  void FailSyncs(bool on);
  // Appends fail with NoSpace once this many more bytes were written
  // (negative: unlimited, the default).
  void SetSpaceLeft(int64_t bytes);
  // Faults injected so far.
  int64_t injected() const;

  // Simulates a machine crash of the database in `db_dir` (open or not):
  // copies its files to `crashed_dir` as a disk would hold them after the
  // crash. Every file written through this file system is cut back to the
  // bytes it had at its last successful sync; with `torn`, a random prefix
  // (drawn from `seed`) of the unsynced bytes is kept, as a write torn by the
  // crash would. Returns the unsynced bytes dropped, or -1 if a copy failed.
  int64_t CopyAsCrashed(const std::string& db_dir, const std::string& crashed_dir, bool torn,
                        uint64_t seed);

  // Writers report here (the file wrapper calls these).
  rocksdb::IOStatus BeforeAppend(const std::string& fname, size_t bytes);
  void AfterAppend(const std::string& fname, size_t bytes);
  rocksdb::IOStatus BeforeSync();
  void AfterSync(const std::string& fname);

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& dst,
                               const rocksdb::IOOptions& opts,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& fname, const rocksdb::IOOptions& opts,
                               rocksdb::IODebugContext* dbg) override;

 private:
  struct FileState {
    int64_t written = 0;  // bytes appended through this file system
    int64_t synced = 0;   // of them, bytes covered by the last successful sync
  };
  mutable std::mutex mu_;
  std::map<std::string, FileState> files_;
  bool fail_writes_ = false;
  bool fail_syncs_ = false;
  int64_t space_left_ = -1;
  int64_t injected_ = 0;
};

}  // namespace vc::kvstore::testing
