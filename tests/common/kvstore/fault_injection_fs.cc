#include "tests/common/kvstore/fault_injection_fs.h"

#include <filesystem>
#include <random>
#include <system_error>
#include <utility>

namespace vc::kvstore::testing {
namespace {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

// Reports every append and sync of one file to the file system.
class FaultFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultFile(std::unique_ptr<rocksdb::FSWritableFile> base, std::string fname, FaultInjectionFs* fs)
      : FSWritableFileOwnerWrapper(std::move(base)), fname_(std::move(fname)), fs_(fs) {}

  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = fs_->BeforeAppend(fname_, data.size());
    if (s.ok()) s = target()->Append(data, options, dbg);
    if (s.ok()) fs_->AfterAppend(fname_, data.size());
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& options,
                  const rocksdb::DataVerificationInfo& info, IODebugContext* dbg) override {
    IOStatus s = fs_->BeforeAppend(fname_, data.size());
    if (s.ok()) s = target()->Append(data, options, info, dbg);
    if (s.ok()) fs_->AfterAppend(fname_, data.size());
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            IODebugContext* dbg) override {
    IOStatus s = fs_->BeforeAppend(fname_, data.size());
    if (s.ok()) s = target()->PositionedAppend(data, offset, options, dbg);
    if (s.ok()) fs_->AfterAppend(fname_, data.size());
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const rocksdb::DataVerificationInfo& info,
                            IODebugContext* dbg) override {
    IOStatus s = fs_->BeforeAppend(fname_, data.size());
    if (s.ok()) s = target()->PositionedAppend(data, offset, options, info, dbg);
    if (s.ok()) fs_->AfterAppend(fname_, data.size());
    return s;
  }
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    return DoSync([&] { return target()->Sync(options, dbg); });
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    return DoSync([&] { return target()->Fsync(options, dbg); });
  }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                     IODebugContext* dbg) override {
    // A range sync does not make the whole file durable: only fail it.
    IOStatus s = fs_->BeforeSync();
    return s.ok() ? target()->RangeSync(offset, nbytes, options, dbg) : s;
  }

 private:
  template <typename F>
  IOStatus DoSync(F&& sync) {
    IOStatus s = fs_->BeforeSync();
    if (s.ok()) s = sync();
    if (s.ok()) fs_->AfterSync(fname_);
    return s;
  }
  std::string fname_;
  FaultInjectionFs* fs_;
};

}  // namespace

FaultInjectionFs::FaultInjectionFs(const std::shared_ptr<rocksdb::FileSystem>& base)
    : FileSystemWrapper(base) {}

void FaultInjectionFs::FailWrites(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_writes_ = on;
}
void FaultInjectionFs::FailSyncs(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_syncs_ = on;
}
void FaultInjectionFs::SetSpaceLeft(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  space_left_ = bytes;
}
int64_t FaultInjectionFs::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

IOStatus FaultInjectionFs::BeforeAppend(const std::string& fname, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fail_writes_) {
    ++injected_;
    return IOStatus::IOError("injected write error", fname);
  }
  if (space_left_ >= 0) {
    if (static_cast<int64_t>(bytes) > space_left_) {
      ++injected_;
      return IOStatus::NoSpace("injected full disk", fname);
    }
    space_left_ -= static_cast<int64_t>(bytes);
  }
  return IOStatus::OK();
}

void FaultInjectionFs::AfterAppend(const std::string& fname, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  files_[fname].written += static_cast<int64_t>(bytes);
}

IOStatus FaultInjectionFs::BeforeSync() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fail_syncs_) {
    ++injected_;
    return IOStatus::IOError("injected sync error");
  }
  return IOStatus::OK();
}

void FaultInjectionFs::AfterSync(const std::string& fname) {
  std::lock_guard<std::mutex> lock(mu_);
  FileState& f = files_[fname];
  f.synced = f.written;
}

IOStatus FaultInjectionFs::NewWritableFile(const std::string& fname,
                                           const rocksdb::FileOptions& opts,
                                           std::unique_ptr<rocksdb::FSWritableFile>* result,
                                           IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSWritableFile> base;
  IOStatus s = target()->NewWritableFile(fname, opts, &base, dbg);
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    files_[fname] = FileState{};  // created (or truncated) empty
  }
  *result = std::make_unique<FaultFile>(std::move(base), fname, this);
  return s;
}

IOStatus FaultInjectionFs::ReopenWritableFile(const std::string& fname,
                                              const rocksdb::FileOptions& opts,
                                              std::unique_ptr<rocksdb::FSWritableFile>* result,
                                              IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSWritableFile> base;
  IOStatus s = target()->ReopenWritableFile(fname, opts, &base, dbg);
  if (!s.ok()) return s;
  {
    // What was there before is treated as synced; new appends are not.
    std::error_code ec;
    const auto size = std::filesystem::file_size(fname, ec);
    std::lock_guard<std::mutex> lock(mu_);
    FileState& f = files_[fname];
    if (!ec) f.written = f.synced = static_cast<int64_t>(size);
  }
  *result = std::make_unique<FaultFile>(std::move(base), fname, this);
  return s;
}

IOStatus FaultInjectionFs::RenameFile(const std::string& src, const std::string& dst,
                                      const IOOptions& opts, IODebugContext* dbg) {
  IOStatus s = target()->RenameFile(src, dst, opts, dbg);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(src);
  if (it != files_.end()) {
    files_[dst] = it->second;
    files_.erase(src);
  } else {
    files_.erase(dst);
  }
  return s;
}

IOStatus FaultInjectionFs::DeleteFile(const std::string& fname, const IOOptions& opts,
                                      IODebugContext* dbg) {
  IOStatus s = target()->DeleteFile(fname, opts, dbg);
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    files_.erase(fname);
  }
  return s;
}

int64_t FaultInjectionFs::CopyAsCrashed(const std::string& db_dir,
                                        const std::string& crashed_dir, bool torn,
                                        uint64_t seed) {
  namespace fs = std::filesystem;
  std::lock_guard<std::mutex> lock(mu_);  // no append or sync while copying
  std::map<std::string, FileState> by_name;
  for (const auto& [name, f] : files_) by_name[fs::path(name).filename().string()] = f;
  std::mt19937_64 rng(seed);
  std::error_code ec;
  fs::create_directories(crashed_dir, ec);
  if (ec) return -1;
  int64_t dropped = 0;
  for (const auto& entry : fs::directory_iterator(db_dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    const fs::path dst = fs::path(crashed_dir) / name;
    fs::copy_file(entry.path(), dst, fs::copy_options::overwrite_existing, ec);
    if (ec) return -1;
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;  // not written since this file system started
    const auto size = static_cast<int64_t>(fs::file_size(dst, ec));
    if (ec) return -1;
    int64_t keep = it->second.synced;
    if (torn && it->second.written > it->second.synced) {
      keep += static_cast<int64_t>(
          rng() % static_cast<uint64_t>(it->second.written - it->second.synced + 1));
    }
    if (keep < size) {
      fs::resize_file(dst, static_cast<uintmax_t>(keep), ec);
      if (ec) return -1;
      dropped += size - keep;
    }
  }
  if (ec) return -1;
  return dropped;
}

}  // namespace vc::kvstore::testing
