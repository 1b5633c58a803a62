#include "services/stress/internal/expected_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace vc::stress {
namespace {

constexpr char kMagic[8] = {'V', 'C', 'O', 'R', 'A', 'C', 'L', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kSlotBytes = 128;
constexpr size_t kRecordBytes = 2 * kSlotBytes;
constexpr size_t kSlotPayloadOffset = 16;  // after seq and checksum
constexpr uint32_t kValueMagic = 0x56534356;  // "VCSV" little-endian
constexpr size_t kValueHeaderBytes = 16;
// Clock slack between vc-stress's reading of the wall clock and the store's.
constexpr int64_t kClockSlackMs = 250;
// An unsynced commit lost by a crash may reveal any of this many older
// versions (the ones committed since the last synced one).
constexpr uint32_t kMaxUnsyncedVersions = 64;

static_assert(std::is_trivially_copyable_v<KeyRecord>);
static_assert(sizeof(KeyRecord) == 64, "KeyRecord has padding: keep its layout explicit");
static_assert(kSlotPayloadOffset + sizeof(KeyRecord) <= kSlotBytes);

// The file's first page. The counters are updated with atomic_ref.
struct Header {
  char magic[8];
  uint32_t format_version;
  uint32_t num_keys;
  uint64_t key_namespace;
  int64_t min_value_bytes;
  int64_t max_value_bytes;
  uint64_t checksum;  // of the fields above
  int64_t traffic;
  uint64_t next_batch;
  uint64_t runs;
};
static_assert(std::is_trivially_copyable_v<Header>);
static_assert(sizeof(Header) <= kHeaderBytes);

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Hash(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then a final mix
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return Mix(h ^ n);
}

// Over the slot's sequence number and record (not the checksum field).
uint64_t SlotChecksum(const char* slot) {
  return Mix(Hash(slot, 8) ^ Hash(slot + kSlotPayloadOffset, sizeof(KeyRecord)));
}

uint64_t HeaderChecksum(const Header& h) {
  return Hash(&h, offsetof(Header, checksum));
}

void PutU32(char* p, uint32_t v) {
  for (int b = 0; b < 4; ++b) p[b] = static_cast<char>(static_cast<uint8_t>(v >> (8 * b)));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int b = 0; b < 4; ++b) v |= uint32_t{static_cast<uint8_t>(p[b])} << (8 * b);
  return v;
}

uint64_t ValueSeed(uint64_t ns, uint32_t index, uint32_t version) {
  return Mix(ns ^ Mix((uint64_t{index} << 32) | version));
}

}  // namespace

const char* KeyStateName(KeyState state) {
  switch (state) {
    case KeyState::kAbsent: return "absent";
    case KeyState::kCommittedSynced: return "committed-synced";
    case KeyState::kCommittedUnsynced: return "committed-unsynced";
    case KeyState::kPending: return "pending";
    case KeyState::kEvicted: return "possibly-evicted";
    case KeyState::kDeleted: return "deleted";
    case KeyState::kExpired: return "expired";
  }
  return "unknown";
}

Expectation Expect(const KeyRecord& r, int64_t value_size, const ExpectContext& ctx) {
  Expectation e;
  const uint32_t c = r.committed_version;
  if (c != 0) {
    e.versions.push_back(c);
  } else {
    e.absent_ok = true;
    e.absent_reason = absl::StrCat("no committed value (", KeyStateName(r.state), ")");
    e.absent_state = r.state == KeyState::kDeleted || r.state == KeyState::kEvicted ||
                             r.state == KeyState::kExpired
                         ? r.state
                         : KeyState::kAbsent;
  }
  const bool pinned = r.pins > 0 && ctx.pins_known;
  if (c != 0 && !pinned) {
    const int64_t window = ctx.disk_budget - ctx.eviction_slack - value_size;
    const int64_t since = ctx.g_now - r.commit_g;
    if (since > window) {
      e.absent_ok = true;
      e.absent_reason = absl::StrCat("possibly evicted (", since,
                                     " value bytes written or read since its commit; LRU keeps it "
                                     "for at least ",
                                     std::max<int64_t>(window, 0), ")");
      e.absent_state = KeyState::kEvicted;
    }
    if (ctx.ttl_ms > 0 && ctx.now_ms - r.commit_ms >= ctx.ttl_ms - kClockSlackMs) {
      e.absent_ok = true;
      e.absent_reason = absl::StrCat("possibly expired (written ", ctx.now_ms - r.commit_ms,
                                     " ms ago, TTL ", ctx.ttl_ms, " ms)");
      e.absent_state = KeyState::kExpired;
    }
    if (ctx.ttl_ms > 0 && ctx.pins_known && r.pins == 0 && r.pending == PendingOp::kNone &&
        ctx.issue_ms - r.commit_ack_ms >= ctx.ttl_ms + kClockSlackMs) {
      e.present_forbidden = absl::StrCat("expired: acknowledged ", ctx.issue_ms - r.commit_ack_ms,
                                         " ms before the read, TTL ", ctx.ttl_ms, " ms, unpinned");
    }
  }
  if (c != 0 && ctx.after_crash && r.state == KeyState::kCommittedUnsynced) {
    e.absent_ok = true;
    e.absent_reason = "an unsynced commit lost by a crash";
    e.absent_state = KeyState::kAbsent;
    const uint32_t lo = std::max<uint32_t>(r.synced_version, c > kMaxUnsyncedVersions
                                                                 ? c - kMaxUnsyncedVersions
                                                                 : 1);
    for (uint32_t v = lo; v < c; ++v) e.versions.push_back(v);
  }
  if (r.pending == PendingOp::kPut) {
    e.versions.push_back(r.pending_version);
  } else if (r.pending == PendingOp::kDelete) {
    e.absent_ok = true;
    e.absent_reason = "a delete whose outcome is unknown";
    e.absent_state = KeyState::kDeleted;
  }
  return e;
}

std::string KeyBytes(uint64_t ns, uint32_t index) {
  std::string key(32, '\0');
  uint64_t words[4] = {ns, Mix(ns ^ index), Mix(Mix(ns) + index), (uint64_t{index} << 32) | 0x5354u};
  for (int w = 0; w < 4; ++w)
    for (int b = 0; b < 8; ++b) key[8 * w + b] = static_cast<char>(static_cast<uint8_t>(words[w] >> (8 * b)));
  return key;
}

int64_t ValueSize(uint64_t ns, uint32_t index, uint32_t version, int64_t min_bytes,
                  int64_t max_bytes) {
  const int64_t lo = std::max<int64_t>(min_bytes, kValueHeaderBytes);
  const int64_t hi = std::max(lo, max_bytes);
  return lo + static_cast<int64_t>(Mix(ValueSeed(ns, index, version) ^ 0x5132e) %
                                   static_cast<uint64_t>(hi - lo + 1));
}

std::string ValueBytes(uint64_t ns, uint32_t index, uint32_t version, int64_t min_bytes,
                       int64_t max_bytes) {
  const int64_t size = ValueSize(ns, index, version, min_bytes, max_bytes);
  std::string v(static_cast<size_t>(size), '\0');
  PutU32(v.data(), kValueMagic);
  PutU32(v.data() + 4, index);
  PutU32(v.data() + 8, version);
  PutU32(v.data() + 12, static_cast<uint32_t>(size));
  uint64_t state = ValueSeed(ns, index, version);
  for (size_t i = kValueHeaderBytes; i < v.size(); i += 8) {
    state = Mix(state);
    for (size_t b = 0; b < 8 && i + b < v.size(); ++b) v[i + b] = static_cast<char>(state >> (8 * b));
  }
  return v;
}

uint64_t HashBytes(const std::string& bytes) { return Hash(bytes.data(), bytes.size()); }

absl::StatusOr<ValueId> ParseValue(const std::string& value) {
  if (value.size() < kValueHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of ", value.size(),
                                                   " bytes is shorter than its header"));
  }
  if (GetU32(value.data()) != kValueMagic) {
    return absl::InvalidArgumentError("value header has the wrong magic");
  }
  if (GetU32(value.data() + 12) != value.size()) {
    return absl::InvalidArgumentError(absl::StrCat("value header says ", GetU32(value.data() + 12),
                                                   " bytes, value has ", value.size()));
  }
  return ValueId{GetU32(value.data() + 4), GetU32(value.data() + 8)};
}

struct ExpectedState::Impl {
  ExpectedStateOptions options;
  int fd = -1;
  char* base = nullptr;
  size_t bytes = 0;
  long page = 4096;

  ~Impl() {
    if (base != nullptr) munmap(base, bytes);
    if (fd >= 0) close(fd);
  }
  Header* header() const { return reinterpret_cast<Header*>(base); }
  char* slot(uint32_t index, int which) const {
    return base + kHeaderBytes + static_cast<size_t>(index) * kRecordBytes + which * kSlotBytes;
  }
  // 1: valid, 0: never written (all zero), -1: corrupt.
  static int SlotState(const char* s, uint64_t* seq) {
    uint64_t stored_seq = 0, sum = 0;
    std::memcpy(&stored_seq, s, 8);
    std::memcpy(&sum, s + 8, 8);
    *seq = stored_seq;
    if (stored_seq == 0) {
      for (size_t i = 0; i < kSlotBytes; ++i)
        if (s[i] != 0) return -1;
      return 0;
    }
    return sum == SlotChecksum(s) ? 1 : -1;
  }
  // Which slot holds the record (-1: none written) and its sequence number.
  int Current(uint32_t index, uint64_t* seq, bool* corrupt) const {
    uint64_t s0 = 0, s1 = 0;
    const int v0 = SlotState(slot(index, 0), &s0);
    const int v1 = SlotState(slot(index, 1), &s1);
    *corrupt = v0 < 0 && v1 < 0;
    int best = -1;
    *seq = 0;
    if (v0 > 0) {
      best = 0;
      *seq = s0;
    }
    if (v1 > 0 && s1 > *seq) {
      best = 1;
      *seq = s1;
    }
    return best;
  }
  absl::Status SyncRange(size_t offset, size_t length) const {
    const size_t start = offset - offset % static_cast<size_t>(page);
    if (msync(base + start, offset + length - start, MS_SYNC) != 0) {
      return absl::UnavailableError(
          absl::StrCat("msync of the oracle ", options.path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
};

ExpectedState::ExpectedState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExpectedState::~ExpectedState() = default;

absl::StatusOr<std::unique_ptr<ExpectedState>> ExpectedState::Open(
    const ExpectedStateOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("oracle: path is empty");
  if (options.num_keys == 0 || options.num_keys > (1u << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("oracle: num_keys must be in [1, 16777216], got ", options.num_keys));
  }
  if (options.min_value_bytes < static_cast<int64_t>(kValueHeaderBytes) ||
      options.max_value_bytes < options.min_value_bytes || options.max_value_bytes > (64 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "oracle: value sizes must satisfy ", kValueHeaderBytes, " <= min <= max <= 64 MiB, got ",
        options.min_value_bytes, " and ", options.max_value_bytes));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->page = sysconf(_SC_PAGESIZE);
  const int flags = O_RDWR | O_CLOEXEC | (options.create ? O_CREAT : 0);
  impl->fd = open(options.path.c_str(), flags, 0644);
  if (impl->fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("oracle file ", options.path, " does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the oracle file ", options.path, ": ", std::strerror(err)));
  }
  struct stat st;
  if (fstat(impl->fd, &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot stat the oracle file ", options.path, ": ", std::strerror(errno)));
  }
  const bool fresh = st.st_size == 0;
  uint32_t num_keys = options.num_keys;
  if (!fresh) {
    if (static_cast<size_t>(st.st_size) < kHeaderBytes) {
      return absl::DataLossError(absl::StrCat(options.path, " is not a vc-stress oracle (",
                                              st.st_size, " bytes)"));
    }
    Header h;
    if (pread(impl->fd, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h)) ||
        std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.checksum != HeaderChecksum(h) ||
        h.format_version != kFormatVersion) {
      return absl::DataLossError(
          absl::StrCat(options.path, " is not a vc-stress oracle (bad header)"));
    }
    if (h.min_value_bytes != options.min_value_bytes || h.max_value_bytes != options.max_value_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "oracle ", options.path, " was created with values of ", h.min_value_bytes, "..",
          h.max_value_bytes, " bytes, not ", options.min_value_bytes, "..", options.max_value_bytes));
    }
    if (h.num_keys != options.num_keys) {
      return absl::InvalidArgumentError(absl::StrCat("oracle ", options.path, " was created with ",
                                                     h.num_keys, " keys, not ", options.num_keys));
    }
    num_keys = h.num_keys;
  }
  impl->bytes = kHeaderBytes + static_cast<size_t>(num_keys) * kRecordBytes;
  if (fresh) {
    if (ftruncate(impl->fd, static_cast<off_t>(impl->bytes)) != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot size the oracle file ", options.path, ": ", std::strerror(errno)));
    }
  } else if (static_cast<size_t>(st.st_size) != impl->bytes) {
    return absl::DataLossError(absl::StrCat("oracle ", options.path, " is ", st.st_size,
                                            " bytes, expected ", impl->bytes));
  }
  void* m = mmap(nullptr, impl->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, impl->fd, 0);
  if (m == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map the oracle file ", options.path, ": ", std::strerror(errno)));
  }
  impl->base = static_cast<char*>(m);
  if (fresh) {
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.format_version = kFormatVersion;
    h.num_keys = num_keys;
    // A namespace per oracle: two oracles never share keys in one store.
    h.key_namespace = options.namespace_seed != 0
                          ? Mix(options.namespace_seed ^ 0x6e616d6573706163ULL)
                          : Mix(static_cast<uint64_t>(getpid()) ^
                                static_cast<uint64_t>(st.st_ino) ^
                                static_cast<uint64_t>(time(nullptr)) << 20);
    h.min_value_bytes = options.min_value_bytes;
    h.max_value_bytes = options.max_value_bytes;
    h.checksum = HeaderChecksum(h);
    std::memcpy(impl->base, &h, sizeof(h));
    if (msync(impl->base, impl->bytes, MS_SYNC) != 0 || fsync(impl->fd) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot sync the new oracle ", options.path, ": ", std::strerror(errno)));
    }
  } else {
    for (uint32_t i = 0; i < num_keys; ++i) {
      uint64_t seq = 0;
      bool corrupt = false;
      impl->Current(i, &seq, &corrupt);
      if (corrupt) {
        return absl::DataLossError(
            absl::StrCat("oracle ", options.path, ": both slots of key ", i, " are corrupt"));
      }
    }
  }
  return std::unique_ptr<ExpectedState>(new ExpectedState(std::move(impl)));
}

uint32_t ExpectedState::num_keys() const { return impl_->header()->num_keys; }
uint64_t ExpectedState::key_namespace() const { return impl_->header()->key_namespace; }
int64_t ExpectedState::min_value_bytes() const { return impl_->header()->min_value_bytes; }
int64_t ExpectedState::max_value_bytes() const { return impl_->header()->max_value_bytes; }

KeyRecord ExpectedState::Get(uint32_t index) const {
  KeyRecord r;
  uint64_t seq = 0;
  bool corrupt = false;
  const int which = impl_->Current(index, &seq, &corrupt);
  if (which >= 0) std::memcpy(&r, impl_->slot(index, which) + kSlotPayloadOffset, sizeof(r));
  return r;
}

void ExpectedState::Set(uint32_t index, const KeyRecord& record) {
  uint64_t seq = 0;
  bool corrupt = false;
  const int current = impl_->Current(index, &seq, &corrupt);
  const int target = current == 0 ? 1 : 0;
  char buf[kSlotBytes] = {};
  const uint64_t next = seq + 1;
  std::memcpy(buf, &next, 8);
  std::memcpy(buf + kSlotPayloadOffset, &record, sizeof(record));
  const uint64_t sum = SlotChecksum(buf);
  std::memcpy(buf + 8, &sum, 8);
  std::memcpy(impl_->slot(index, target), buf, kSlotBytes);
  // The store call that follows must not be issued before these stores.
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

absl::Status ExpectedState::Persist(const std::vector<uint32_t>& indices) {
  if (!impl_->options.sync) return absl::OkStatus();
  absl::Status s = impl_->SyncRange(0, sizeof(Header));
  for (uint32_t i : indices) {
    if (!s.ok()) break;
    s = impl_->SyncRange(kHeaderBytes + static_cast<size_t>(i) * kRecordBytes, kRecordBytes);
  }
  return s;
}

int64_t ExpectedState::AddTraffic(int64_t bytes) {
  return std::atomic_ref<int64_t>(impl_->header()->traffic).fetch_add(bytes);
}
int64_t ExpectedState::Traffic() const {
  return std::atomic_ref<int64_t>(impl_->header()->traffic).load();
}
uint64_t ExpectedState::NextBatchId() {
  return std::atomic_ref<uint64_t>(impl_->header()->next_batch).fetch_add(1) + 1;
}
uint64_t ExpectedState::BeginRun() {
  return std::atomic_ref<uint64_t>(impl_->header()->runs).fetch_add(1) + 1;
}

}  // namespace vc::stress
