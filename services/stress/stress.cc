#include "services/stress/stress.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "services/stress/internal/expected_state.h"
#include "services/stress/internal/target.h"

namespace vc::stress {
namespace {

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A thread's schedule: the same seed draws the same operations and keys.
struct Rng {
  uint64_t state;
  uint64_t Uniform(uint64_t n) { return SplitMix(state) % n; }
};

enum Op { kPut, kPutAbort, kGet, kFetch, kLookup, kDelete, kPin, kUnpin, kNumOps };
constexpr const char* kOpNames[kNumOps] = {"put",    "put_abort", "get", "fetch",
                                           "lookup", "delete",    "pin", "unpin"};
// Cumulative weights out of 100: writes, reads and maintenance in the ratio
// that keeps the budgets full and every path busy.
constexpr int kOpWeights[kNumOps] = {24, 8, 20, 12, 10, 8, 9, 9};

enum class Outcome { kOk, kMissing, kRefused, kUncertain, kUnexpected };

constexpr int kMaxLookupKeys = 8;

class Runner {
 public:
  Runner(const StressOptions& o, ExpectedState* oracle, StressTarget* target, StressReport* report)
      : o_(o),
        oracle_(oracle),
        target_(target),
        report_(report),
        remote_(o.mode == "remote"),
        ns_(oracle->key_namespace()),
        locks_(new std::mutex[oracle->num_keys()]),
        unresolved_(oracle->num_keys(), 0) {
    // LRU keeps an entry until more value bytes than its budget share were
    // written or read after it; pinned entries and puts in flight (at most
    // one per thread, counted before they land) shrink that share.
    const int64_t pins = int64_t{o.threads} * o.max_pins_per_thread;
    eviction_slack_ = (pins + 2 * int64_t{o.threads} * o.max_batch) * o.max_value_bytes;
    for (auto& c : counts_) c = {};
  }

  // Releases pins a killed run may have left in the store (they persist),
  // so pins are known again: every holder the record may name (an unpin
  // of a holder that holds none is harmless).
  void ReleaseLeftoverPins() {
    for (uint32_t i = 0; i < oracle_->num_keys() && !stop_; ++i) {
      KeyRecord r = oracle_->Get(i);
      if (r.pins == 0) continue;
      for (int p = 0; p < r.pins; ++p) {
        const absl::Status s = target_->Unpin(KeyBytes(ns_, i), PinHolder(p));
        if (s.code() == absl::StatusCode::kUnavailable) {
          NoteUnreachable();
          break;
        }
      }
      r.pins = 0;
      oracle_->Set(i, r);
    }
  }

  // The store's pins are per holder; vc-stress counts its pins on a key, and
  // its n-th pin there (from 0) is holder n. Under the key's lock a pin takes
  // the next number and an unpin gives back the last, so the pins held are
  // always those numbered below the record's count.
  static std::string PinHolder(int n) { return absl::StrCat("vc-stress/", n); }

  // Reads every key and checks it; with `resolve`, settles pending outcomes
  // to what was read (the store was restarted, or the run ended: nothing is
  // in flight). Checks that a multi-key put landed whole or not at all.
  void VerifyAll(bool after_crash) {
    struct Batch {
      std::vector<uint32_t> landed, old;
    };
    std::map<uint64_t, Batch> batches;
    for (uint32_t i = 0; i < oracle_->num_keys() && !stop_; ++i) {
      std::lock_guard<std::mutex> lock(locks_[i]);
      KeyRecord r = oracle_->Get(i);
      oracle_->AddTraffic(SizeFor(i, r));
      const int64_t issue_ms = WallMs();
      absl::StatusOr<std::string> got = target_->Get(KeyBytes(ns_, i), 0);
      const Expectation e = Expect(r, SizeFor(i, r), Ctx(issue_ms, after_crash));
      if (got.ok() || got.status().code() == absl::StatusCode::kNotFound) ++report_->verified_keys;
      if (got.ok()) {
        const uint32_t v = CheckPresent(i, r, e, *got, "verify");
        if (v == 0) continue;
        if (r.pending == PendingOp::kPut && r.batch_id != 0) {
          if (v == r.pending_version) batches[r.batch_id].landed.push_back(i);
          if (v == r.committed_version) batches[r.batch_id].old.push_back(i);
        }
        if (r.pending != PendingOp::kNone || v != r.committed_version) ++report_->resolved_keys;
        if (v != r.committed_version) {
          r.committed_version = v;
          r.state = r.state == KeyState::kCommittedUnsynced ? KeyState::kCommittedUnsynced
                                                            : KeyState::kCommittedSynced;
          r.value_hash = HashBytes(*got);
          r.commit_ack_ms = WallMs();  // landed no later than now
        }
        r.pending = PendingOp::kNone;
        r.pending_version = 0;
        r.batch_id = 0;
        oracle_->Set(i, r);
        unresolved_[i] = 0;
      } else if (got.status().code() == absl::StatusCode::kNotFound) {
        if (!CheckMissing(i, r, e, "verify")) continue;
        if (r.pending != PendingOp::kNone) ++report_->resolved_keys;
        MarkGone(i, r, e);
        unresolved_[i] = 0;
      } else if (got.status().code() == absl::StatusCode::kDataLoss) {
        Violation(absl::StrCat("verify of key ", i, ": the store reports data loss: ",
                               got.status().ToString(), " [", Describe(r, e), "]"));
      } else if (remote_ && (got.status().code() == absl::StatusCode::kUnavailable ||
                             got.status().code() == absl::StatusCode::kDeadlineExceeded)) {
        // The daemon went away (a crash loop kills it at random moments):
        // the key stays unverified; a run that stops here exits 3.
        ++report_->unverified_keys;
        NoteUnreachable();
      } else {
        ++report_->unverified_keys;
        Error(absl::StrCat("verify of key ", i, ": ", got.status().ToString()));
      }
    }
    for (const auto& [id, b] : batches) {
      if (!b.landed.empty() && !b.old.empty()) {
        Violation(absl::StrCat("a multi-key put (batch ", id, ") landed partly: keys ",
                               absl::StrJoin(b.landed, ","), " hold its values, keys ",
                               absl::StrJoin(b.old, ","), " the values from before it"));
      }
    }
  }

  void Load() {
    const auto start = std::chrono::steady_clock::now();
    deadline_ = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(o_.duration_s));
    // A progress line a second on stderr: a crash loop that kills this
    // process still learns how many operations ran.
    std::mutex progress_mu;
    std::condition_variable progress_cv;
    bool done = false;
    std::thread progress([&] {
      std::unique_lock<std::mutex> lock(progress_mu);
      while (!progress_cv.wait_for(lock, std::chrono::seconds(1), [&] { return done; })) {
        std::fprintf(stderr, "vc-stress: progress: %lld ops, %lld violations\n",
                     static_cast<long long>(ops_issued_.load()),
                     static_cast<long long>(violations_.load()));
      }
    });
    std::vector<std::thread> threads;
    for (int t = 0; t < o_.threads; ++t) threads.emplace_back([this, t] { Worker(t); });
    for (auto& th : threads) th.join();
    {
      std::lock_guard<std::mutex> lock(progress_mu);
      done = true;
    }
    progress_cv.notify_all();
    progress.join();
    report_->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int op = 0; op < kNumOps; ++op) {
      report_->ops[kOpNames[op]] = counts_[op];
      report_->total_ops += counts_[op].issued;
    }
  }

  bool stopped() const { return stop_; }

 private:
  void Worker(int t) {
    Rng rng{o_.seed * 0x2545f4914f6cdd1dULL + static_cast<uint64_t>(t) + 1};
    std::vector<uint32_t> pins;
    OpCounts local[kNumOps] = {};
    int64_t quota = std::numeric_limits<int64_t>::max();
    if (o_.ops > 0) quota = o_.ops / o_.threads + (t < o_.ops % o_.threads ? 1 : 0);
    for (int64_t i = 0; i < quota && !stop_; ++i) {
      if (std::chrono::steady_clock::now() >= deadline_) break;
      const int64_t issued_before = local[kPut].issued + local[kPutAbort].issued +
                                    local[kGet].issued + local[kFetch].issued +
                                    local[kLookup].issued + local[kDelete].issued +
                                    local[kPin].issued + local[kUnpin].issued;
      int pick = static_cast<int>(rng.Uniform(100));
      int op = 0;
      while (pick >= kOpWeights[op]) pick -= kOpWeights[op++];
      switch (op) {
        case kPut: DoPut(rng, true, local[op]); break;
        case kPutAbort: DoPut(rng, false, local[op]); break;
        case kGet: DoGet(rng, 0, local[op]); break;
        case kFetch: DoGet(rng, remote_ ? 1 : 0, local[op]); break;
        case kLookup: DoLookup(rng, local[op]); break;
        case kDelete: DoDelete(rng, local[op]); break;
        case kPin: DoPin(rng, pins, local[op]); break;
        case kUnpin: DoUnpin(rng, pins, local[op]); break;
      }
      int64_t issued_after = 0;
      for (const OpCounts& c : local) issued_after += c.issued;
      ops_issued_ += issued_after - issued_before;
    }
    // Release this thread's pins so the final verify knows every pin.
    while (!pins.empty() && !stop_) DoUnpin(rng, pins, local[kUnpin]);
    std::lock_guard<std::mutex> lock(mu_);
    for (int op = 0; op < kNumOps; ++op) {
      counts_[op].issued += local[op].issued;
      counts_[op].ok += local[op].ok;
      counts_[op].missing += local[op].missing;
      counts_[op].refused += local[op].refused;
      counts_[op].uncertain += local[op].uncertain;
    }
  }

  // ---- operations ----------------------------------------------------

  void DoPut(Rng& rng, bool commit, OpCounts& c) {
    std::vector<uint32_t> idx = PickKeys(rng, 1 + static_cast<int>(rng.Uniform(o_.max_batch)));
    const int route = static_cast<int>(rng.Uniform(2));
    const bool check_staged = rng.Uniform(4) == 0;
    auto locks = LockAll(idx);
    idx.erase(std::remove_if(idx.begin(), idx.end(), [&](uint32_t i) { return unresolved_[i] != 0; }),
              idx.end());
    if (idx.empty()) return;
    ++c.issued;
    std::vector<KeyRecord> before;
    Entries entries;
    std::vector<uint32_t> versions;
    int64_t bytes = 0;
    for (uint32_t i : idx) {
      KeyRecord r = oracle_->Get(i);
      before.push_back(r);
      const uint32_t v = ++r.next_version;
      versions.push_back(v);
      entries.emplace_back(KeyBytes(ns_, i), Value(i, v));
      bytes += static_cast<int64_t>(entries.back().second.size());
    }
    const int64_t issue_ms = WallMs();
    int64_t g0 = 0;
    if (commit) {
      // Recorded before the put is issued: a crash from here on leaves the
      // old and the new value both allowed.
      g0 = oracle_->AddTraffic(bytes);
      const uint64_t batch = idx.size() > 1 ? oracle_->NextBatchId() : 0;
      for (size_t k = 0; k < idx.size(); ++k) {
        KeyRecord r = before[k];
        r.next_version = versions[k];
        r.pending = PendingOp::kPut;
        r.pending_version = versions[k];
        r.batch_id = batch;
        if (r.committed_version == 0) {
          r.commit_g = g0;
          r.commit_ms = issue_ms;
        }
        oracle_->Set(idx[k], r);
      }
      if (!Persist(idx)) return;
    } else {
      // An aborted put's versions are used up but never allowed.
      for (size_t k = 0; k < idx.size(); ++k) {
        KeyRecord r = before[k];
        r.next_version = versions[k];
        oracle_->Set(idx[k], r);
      }
    }
    std::function<void()> between;
    if (check_staged) {
      // Staged bytes are invisible until the commit: reads see the state
      // from before the put.
      between = [&] {
        for (size_t k = 0; k < idx.size(); ++k) {
          KeyRecord r = before[k];
          r.next_version = versions[k];
          ReadAndCheck(idx[k], r, 0, "read of a staged key", nullptr, /*settle=*/false);
        }
      };
    }
    const absl::Status s = target_->Put(entries, commit, route, between);
    const Outcome out = Classify(s, {absl::StatusCode::kResourceExhausted}, "put", c);
    if (!commit) return;  // nothing was recorded as pending
    const int64_t ack_ms = WallMs();
    for (size_t k = 0; k < idx.size(); ++k) {
      KeyRecord r = oracle_->Get(idx[k]);
      if (out == Outcome::kOk) {
        r.committed_version = versions[k];
        r.value_hash = HashBytes(entries[k].second);
        r.state = o_.sync_writes ? KeyState::kCommittedSynced : KeyState::kCommittedUnsynced;
        if (o_.sync_writes) r.synced_version = versions[k];
        r.commit_g = g0;
        r.commit_ms = issue_ms;
        r.commit_ack_ms = ack_ms;
      } else if (out != Outcome::kRefused) {
        unresolved_[idx[k]] = 1;  // outcome unknown: both stay allowed
        continue;
      }
      r.pending = PendingOp::kNone;
      r.pending_version = 0;
      r.batch_id = 0;
      oracle_->Set(idx[k], r);
    }
  }

  void DoGet(Rng& rng, int route, OpCounts& c) {
    const uint32_t i = PickKeys(rng, 1)[0];
    std::lock_guard<std::mutex> lock(locks_[i]);
    ++c.issued;
    ReadAndCheck(i, oracle_->Get(i), route, route == 1 ? "fetch" : "get", &c, /*settle=*/true);
  }

  void DoLookup(Rng& rng, OpCounts& c) {
    std::vector<uint32_t> idx = PickKeys(rng, 1 + static_cast<int>(rng.Uniform(kMaxLookupKeys)));
    auto locks = LockAll(idx);
    ++c.issued;
    std::vector<std::string> keys;
    std::vector<KeyRecord> records;
    for (uint32_t i : idx) {
      keys.push_back(KeyBytes(ns_, i));
      records.push_back(oracle_->Get(i));
    }
    const int64_t issue_ms = WallMs();
    const absl::StatusOr<std::vector<bool>> hits = target_->Lookup(keys);
    if (Classify(hits.status(), {}, "lookup", c) != Outcome::kOk) return;
    if (hits->size() != idx.size()) {
      Violation(absl::StrCat("lookup of ", idx.size(), " keys answered ", hits->size()));
      return;
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      KeyRecord r = records[k];
      const Expectation e = Expect(r, SizeFor(idx[k], r), Ctx(issue_ms, false));
      if ((*hits)[k]) {
        if (e.versions.empty()) {
          Violation(absl::StrCat("lookup found key ", idx[k], ", which must be absent [",
                                 Describe(r, e), "]"));
        } else if (!e.present_forbidden.empty()) {
          Violation(absl::StrCat("lookup found key ", idx[k], ": ", e.present_forbidden, " [",
                                 Describe(r, e), "]"));
        }
      } else if (CheckMissing(idx[k], r, e, "lookup") && r.pending == PendingOp::kNone &&
                 unresolved_[idx[k]] == 0) {
        MarkGone(idx[k], r, e);
      }
    }
  }

  void DoDelete(Rng& rng, OpCounts& c) {
    const uint32_t i = PickKeys(rng, 1)[0];
    std::lock_guard<std::mutex> lock(locks_[i]);
    if (unresolved_[i] != 0) return;
    ++c.issued;
    KeyRecord r = oracle_->Get(i);
    const std::string key = KeyBytes(ns_, i);
    if (r.pins > 0) {
      // The store must refuse to delete a pinned entry.
      const absl::Status s = target_->Delete(key);
      const Outcome out = Classify(s, {absl::StatusCode::kFailedPrecondition}, "delete", c);
      if (out == Outcome::kOk) {
        Violation(absl::StrCat("delete of key ", i, " succeeded while vc-stress pins it"));
      } else if (out == Outcome::kMissing) {
        Violation(absl::StrCat("delete of pinned key ", i, " says it is missing: ",
                               s.ToString()));
      }
      return;
    }
    const KeyRecord before = r;
    r.pending = PendingOp::kDelete;
    oracle_->Set(i, r);
    if (!Persist({i})) return;
    const int64_t issue_ms = WallMs();
    const absl::Status s = target_->Delete(key);
    const Outcome out = Classify(s, {}, "delete", c);
    const Expectation e = Expect(before, SizeFor(i, before), Ctx(issue_ms, false));
    if (out == Outcome::kOk || out == Outcome::kMissing) {
      if (out == Outcome::kOk && e.versions.empty()) {
        Violation(absl::StrCat("delete found key ", i, ", which must be absent [",
                               Describe(before, e), "]"));
      }
      if (out == Outcome::kMissing) CheckMissing(i, before, e, "delete");
      r = before;
      r.committed_version = 0;
      r.value_hash = 0;
      r.state = out == Outcome::kOk ? KeyState::kDeleted : e.absent_state;
      oracle_->Set(i, r);
    } else {
      unresolved_[i] = 1;
    }
  }

  void DoPin(Rng& rng, std::vector<uint32_t>& pins, OpCounts& c) {
    if (static_cast<int>(pins.size()) >= o_.max_pins_per_thread) return;
    const uint32_t i = PickKeys(rng, 1)[0];
    std::lock_guard<std::mutex> lock(locks_[i]);
    if (unresolved_[i] != 0) return;
    KeyRecord r = oracle_->Get(i);
    if (r.pins == 255) return;  // the record's counter is full
    ++c.issued;
    const KeyRecord before = r;
    // Counted before the call: a crash leaves at most extra pins to release.
    ++r.pins;
    oracle_->Set(i, r);
    const int64_t issue_ms = WallMs();
    const absl::Status s = target_->Pin(KeyBytes(ns_, i), PinHolder(before.pins));
    const Outcome out = Classify(s, {}, "pin", c);
    const Expectation e = Expect(before, SizeFor(i, before), Ctx(issue_ms, false));
    if (out == Outcome::kOk) {
      pins.push_back(i);
      if (e.versions.empty()) {
        Violation(absl::StrCat("pin of key ", i, " succeeded, but it must be absent [",
                               Describe(before, e), "]"));
      } else if (!e.present_forbidden.empty()) {
        Violation(absl::StrCat("pin of key ", i, " succeeded: ", e.present_forbidden));
      }
      return;
    }
    if (out == Outcome::kMissing) {
      r = before;
      if (CheckMissing(i, before, e, "pin") && before.pending == PendingOp::kNone) {
        MarkGone(i, r, e);
      } else {
        oracle_->Set(i, r);
      }
      return;
    }
    unresolved_[i] = 1;  // the pin may or may not be held
  }

  void DoUnpin(Rng& rng, std::vector<uint32_t>& pins, OpCounts& c) {
    if (pins.empty()) return;
    const size_t pos = rng.Uniform(pins.size());
    const uint32_t i = pins[pos];
    pins.erase(pins.begin() + static_cast<std::ptrdiff_t>(pos));
    std::lock_guard<std::mutex> lock(locks_[i]);
    ++c.issued;
    KeyRecord r = oracle_->Get(i);
    if (r.pins == 0) return;  // nothing to give back
    const absl::Status s = target_->Unpin(KeyBytes(ns_, i), PinHolder(r.pins - 1));
    const Outcome out = Classify(s, {}, "unpin", c);
    if (out == Outcome::kOk) {
      --r.pins;
      oracle_->Set(i, r);
    }
  }

  // ---- checking ------------------------------------------------------

  // Reads key `i` (whose record is `r`) and checks the answer. With
  // `settle`, a read that finds a committed entry gone records that.
  void ReadAndCheck(uint32_t i, KeyRecord r, int route, const char* what, OpCounts* c,
                    bool settle) {
    oracle_->AddTraffic(SizeFor(i, r));  // a hit moves the entry to the LRU front
    const int64_t issue_ms = WallMs();
    OpCounts scratch;
    const absl::StatusOr<std::string> got = target_->Get(KeyBytes(ns_, i), route);
    const Outcome out = Classify(got.status(), {}, what, c != nullptr ? *c : scratch);
    const Expectation e = Expect(r, SizeFor(i, r), Ctx(issue_ms, false));
    if (out == Outcome::kOk) {
      CheckPresent(i, r, e, *got, what);
    } else if (out == Outcome::kMissing) {
      if (CheckMissing(i, r, e, what) && settle && r.pending == PendingOp::kNone &&
          unresolved_[i] == 0) {
        MarkGone(i, r, e);
      }
    } else if (got.status().code() == absl::StatusCode::kDataLoss) {
      Violation(absl::StrCat(what, " of key ", i, ": the store reports data loss: ",
                             got.status().ToString()));
    }
  }

  // Checks a value read for key `i`; its version, or 0 after a violation.
  uint32_t CheckPresent(uint32_t i, const KeyRecord& r, const Expectation& e,
                        const std::string& value, const char* what) {
    const absl::StatusOr<ValueId> id = ParseValue(value);
    if (!id.ok() || id->index != i) {
      Violation(absl::StrCat(what, " of key ", i, " returned different bytes (",
                             id.ok() ? absl::StrCat("a value of key ", id->index)
                                     : id.status().ToString(),
                             ", ", value.size(), " bytes, hash ",
                             absl::Hex(HashBytes(value)), ") [", Describe(r, e), "]"));
      return 0;
    }
    if (value != Value(i, id->version)) {
      Violation(absl::StrCat(what, " of key ", i, " returned version ", id->version,
                             " with different bytes (hash ", absl::Hex(HashBytes(value)),
                             ", expected ", absl::Hex(HashBytes(Value(i, id->version))), ") [",
                             Describe(r, e), "]"));
      return 0;
    }
    if (std::find(e.versions.begin(), e.versions.end(), id->version) == e.versions.end()) {
      Violation(absl::StrCat(
          what, " of key ", i, " returned version ", id->version, ", ",
          id->version > r.next_version ? "which was never written"
                                       : "an aborted, overwritten, deleted or evicted value",
          " [", Describe(r, e), "]"));
      return 0;
    }
    if (!e.present_forbidden.empty()) {
      Violation(absl::StrCat(what, " of key ", i, " served it: ", e.present_forbidden, " [",
                             Describe(r, e), "]"));
      return 0;
    }
    return id->version;
  }

  bool CheckMissing(uint32_t i, const KeyRecord& r, const Expectation& e, const char* what) {
    if (e.absent_ok) return true;
    Violation(absl::StrCat(what, " of key ", i,
                           ": missing, but the oracle records no eviction, expiry or deletion "
                           "that allows it [",
                           Describe(r, e), "]"));
    return false;
  }

  // Records that key `i` was read as missing (so it must stay missing).
  void MarkGone(uint32_t i, KeyRecord r, const Expectation& e) {
    if (r.committed_version != 0) {
      if (e.absent_state == KeyState::kEvicted) ++observed_evicted_;
      if (e.absent_state == KeyState::kExpired) ++observed_expired_;
    }
    r.committed_version = 0;
    r.value_hash = 0;
    r.state = r.pending == PendingOp::kDelete ? KeyState::kDeleted : e.absent_state;
    r.pending = PendingOp::kNone;
    r.pending_version = 0;
    r.batch_id = 0;
    oracle_->Set(i, r);
  }

  std::string Describe(const KeyRecord& r, const Expectation& e) const {
    std::string s = absl::StrCat("oracle: ", KeyStateName(r.state));
    if (r.committed_version != 0) {
      absl::StrAppend(&s, " v", r.committed_version, " hash ", absl::Hex(r.value_hash));
    }
    if (r.pending == PendingOp::kPut) absl::StrAppend(&s, ", pending put v", r.pending_version);
    if (r.pending == PendingOp::kDelete) absl::StrAppend(&s, ", pending delete");
    if (r.pins > 0) absl::StrAppend(&s, ", pins ", r.pins);
    absl::StrAppend(&s, "; allowed versions {", absl::StrJoin(e.versions, ","), "}, missing ",
                    e.absent_ok ? absl::StrCat("allowed: ", e.absent_reason) : "not allowed");
    return s;
  }

  Outcome Classify(const absl::Status& s, std::initializer_list<absl::StatusCode> refused,
                   const char* what, OpCounts& c) {
    if (s.ok()) {
      ++c.ok;
      unreachable_since_ms_ = 0;
      return Outcome::kOk;
    }
    if (s.code() == absl::StatusCode::kNotFound) {
      ++c.missing;
      return Outcome::kMissing;
    }
    for (absl::StatusCode code : refused) {
      if (s.code() == code) {
        ++c.refused;
        return Outcome::kRefused;
      }
    }
    switch (s.code()) {
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kCancelled:
      case absl::StatusCode::kAborted:
        ++c.uncertain;
        // A daemon that went away is expected in a crash loop; a store in
        // this process failing an I/O is not.
        if (!remote_) Error(absl::StrCat(what, ": ", s.ToString()));
        if (s.code() == absl::StatusCode::kUnavailable) NoteUnreachable();
        return Outcome::kUncertain;
      default:
        ++c.uncertain;
        if (s.code() != absl::StatusCode::kDataLoss) Error(absl::StrCat(what, ": ", s.ToString()));
        return Outcome::kUnexpected;
    }
  }

  void NoteUnreachable() {
    const int64_t now = WallMs();
    int64_t since = unreachable_since_ms_.load();
    if (since == 0) {
      unreachable_since_ms_.compare_exchange_strong(since, now);
    } else if (now - since >= static_cast<int64_t>(o_.max_unreachable_s * 1000)) {
      std::lock_guard<std::mutex> lock(mu_);
      report_->store_unreachable = true;
      stop_ = true;
    }
    // Back off instead of spinning on a store that is not there.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  void Violation(const std::string& message) {
    ++violations_;
    std::lock_guard<std::mutex> lock(mu_);
    ++report_->violations;
    if (static_cast<int>(report_->violation_messages.size()) < o_.max_reported_violations) {
      report_->violation_messages.push_back(message);
    }
  }
  void Error(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    ++report_->unexpected_errors;
    if (static_cast<int>(report_->error_messages.size()) < o_.max_reported_violations) {
      report_->error_messages.push_back(message);
    }
  }

  // ---- helpers -------------------------------------------------------

  bool Persist(const std::vector<uint32_t>& idx) {
    const absl::Status s = oracle_->Persist(idx);
    if (s.ok()) return true;
    Error(s.ToString());
    stop_ = true;
    return false;
  }

  ExpectContext Ctx(int64_t issue_ms, bool after_crash) const {
    ExpectContext ctx;
    ctx.g_now = oracle_->Traffic();
    ctx.now_ms = WallMs();
    ctx.issue_ms = issue_ms;
    ctx.disk_budget = o_.disk_bytes;
    ctx.eviction_slack = eviction_slack_;
    ctx.ttl_ms = o_.ttl_seconds * 1000;
    ctx.pins_known = true;
    ctx.after_crash = after_crash;
    return ctx;
  }

  std::string Value(uint32_t i, uint32_t version) const {
    return ValueBytes(ns_, i, version, o_.min_value_bytes, o_.max_value_bytes);
  }
  int64_t SizeOf(uint32_t i, uint32_t version) const {
    return version == 0 ? 0 : ValueSize(ns_, i, version, o_.min_value_bytes, o_.max_value_bytes);
  }
  // The larger of the sizes the key may hold (what a read of it may touch).
  int64_t SizeFor(uint32_t i, const KeyRecord& r) const {
    return std::max(SizeOf(i, r.committed_version),
                    r.pending == PendingOp::kPut ? SizeOf(i, r.pending_version) : 0);
  }

  std::vector<uint32_t> PickKeys(Rng& rng, int n) {
    std::vector<uint32_t> idx;
    while (static_cast<int>(idx.size()) < n) {
      const auto i = static_cast<uint32_t>(rng.Uniform(oracle_->num_keys()));
      if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
      if (static_cast<uint32_t>(idx.size()) >= oracle_->num_keys()) break;
    }
    return idx;
  }
  // Locks keys in index order (no deadlock between multi-key operations).
  std::vector<std::unique_lock<std::mutex>> LockAll(std::vector<uint32_t>& idx) {
    std::sort(idx.begin(), idx.end());
    std::vector<std::unique_lock<std::mutex>> locks;
    for (uint32_t i : idx) locks.emplace_back(locks_[i]);
    return locks;
  }

 public:
  int64_t observed_evicted() const { return observed_evicted_; }
  int64_t observed_expired() const { return observed_expired_; }

 private:
  const StressOptions& o_;
  ExpectedState* oracle_;
  StressTarget* target_;
  StressReport* report_;
  const bool remote_;
  const uint64_t ns_;
  std::unique_ptr<std::mutex[]> locks_;  // one per key
  std::vector<uint8_t> unresolved_;      // guarded by the key's lock
  int64_t eviction_slack_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> unreachable_since_ms_{0};
  std::atomic<int64_t> observed_evicted_{0};
  std::atomic<int64_t> observed_expired_{0};
  std::atomic<int64_t> ops_issued_{0};
  std::atomic<int64_t> violations_{0};
  std::mutex mu_;  // guards report_ messages and counts_
  OpCounts counts_[kNumOps];
};

absl::Status Validate(const StressOptions& o) {
  if (o.mode != "inproc" && o.mode != "remote") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode must be inproc or remote, got '", o.mode, "'"));
  }
  if (o.mode == "inproc" && o.db_dir.empty()) {
    return absl::InvalidArgumentError("--db is required with --mode inproc");
  }
  if (o.mode == "remote" && o.store_address.empty()) {
    return absl::InvalidArgumentError("--store is required with --mode remote");
  }
  if (o.oracle_path.empty()) return absl::InvalidArgumentError("--oracle is required");
  if (o.threads < 1 || o.threads > 256) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be in [1, 256], got ", o.threads));
  }
  if (o.ops < 0) return absl::InvalidArgumentError("--ops must be >= 0");
  if (!(o.duration_s > 0) || o.duration_s > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("--duration must be in (0, 86400] seconds, got ", o.duration_s));
  }
  if (o.keys < 1 || o.keys > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError("--keys must be in [1, 16777216]");
  }
  if (o.max_batch < 1 || o.max_batch > 64) {
    return absl::InvalidArgumentError("--max-batch must be in [1, 64]");
  }
  if (o.max_pins_per_thread < 0 || o.max_pins_per_thread > 64) {
    return absl::InvalidArgumentError("--max-pins-per-thread must be in [0, 64]");
  }
  if (o.disk_bytes <= 0 || o.dram_bytes < 0) {
    return absl::InvalidArgumentError("--disk-bytes must be > 0 and --dram-bytes >= 0");
  }
  if (o.ttl_seconds < 0) return absl::InvalidArgumentError("--ttl-seconds must be >= 0");
  if (!(o.max_unreachable_s > 0)) return absl::InvalidArgumentError("--max-unreachable-s must be > 0");
  if (o.mode == "remote" && !o.sync_writes) {
    return absl::InvalidArgumentError("--sync-writes=false is for --mode inproc (vc-kvstore always syncs)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StressReport> RunStress(const StressOptions& options) {
  VC_RETURN_IF_ERROR(Validate(options));
  StressOptions o = options;
  if (o.seed == 0) {
    o.seed = static_cast<uint64_t>(
        std::chrono::steady_clock::now().time_since_epoch().count() ^ WallMs());
    if (o.seed == 0) o.seed = 1;
  }
  ExpectedStateOptions eo;
  eo.path = o.oracle_path;
  eo.num_keys = static_cast<uint32_t>(o.keys);
  eo.min_value_bytes = o.min_value_bytes;
  eo.max_value_bytes = o.max_value_bytes;
  eo.sync = o.oracle_sync;
  eo.create = !o.verify_only;
  eo.namespace_seed = o.seed;
  VC_ASSIGN_OR_RETURN(auto oracle, ExpectedState::Open(eo));
  std::unique_ptr<StressTarget> target;
  if (o.mode == "inproc") {
    InprocTargetOptions io;
    io.db_dir = o.db_dir;
    io.dram_bytes = o.dram_bytes;
    io.disk_bytes = o.disk_bytes;
    io.ttl_seconds = o.ttl_seconds;
    io.sync_writes = o.sync_writes;
    VC_ASSIGN_OR_RETURN(target, OpenInprocTarget(io));
  } else {
    RemoteTargetOptions ro;
    ro.address = o.store_address;
    ro.data_plane = o.data_plane;
    ro.timeout_ms = o.rpc_timeout_ms;
    VC_ASSIGN_OR_RETURN(target, OpenRemoteTarget(ro));
  }
  StressReport report;
  report.seed = o.seed;
  report.run = oracle->BeginRun();
  std::fprintf(stderr,
               "vc-stress: run %llu, seed %llu (replay the schedule with --seed %llu), %s, %lld keys, "
               "%d threads, disk budget %lld, DRAM budget %lld, TTL %lld s, oracle %s\n",
               static_cast<unsigned long long>(report.run),
               static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.seed),
               target->Describe().c_str(), static_cast<long long>(o.keys), o.threads,
               static_cast<long long>(o.disk_bytes), static_cast<long long>(o.dram_bytes),
               static_cast<long long>(o.ttl_seconds), o.oracle_path.c_str());
  Runner runner(o, oracle.get(), target.get(), &report);
  // Every run starts as after a crash: the last one may have been killed.
  runner.ReleaseLeftoverPins();
  if (!runner.stopped()) runner.VerifyAll(/*after_crash=*/true);
  if (!o.verify_only && !runner.stopped()) {
    runner.Load();
    if (!runner.stopped()) runner.VerifyAll(/*after_crash=*/false);
  }
  report.observed_evicted = runner.observed_evicted();
  report.observed_expired = runner.observed_expired();
  if (!report.store_unreachable) {
    const absl::StatusOr<TargetStats> st = target->Stats();
    if (st.ok()) {
      report.store_stats = absl::StrCat(
          "store: ", st->disk_entries, " entries, ", st->disk_bytes, " disk bytes, ",
          st->dram_bytes, " DRAM bytes; evictions: ", st->dram_evictions, " DRAM, ",
          st->disk_evictions, " disk; expirations ", st->expirations, " (since it started)");
    }
  }
  return report;
}

std::string FormatReport(const StressReport& r) {
  std::string out;
  if (!r.ops.empty() && r.total_ops > 0) {
    absl::StrAppend(&out, absl::StrFormat("%-10s %10s %10s %10s %10s %10s\n", "op", "issued", "ok",
                                          "missing", "refused", "uncertain"));
    for (const auto& [name, c] : r.ops) {
      absl::StrAppend(&out, absl::StrFormat("%-10s %10d %10d %10d %10d %10d\n", name, c.issued,
                                            c.ok, c.missing, c.refused, c.uncertain));
    }
  }
  if (!r.store_stats.empty()) absl::StrAppend(&out, r.store_stats, "\n");
  for (const std::string& m : r.violation_messages) absl::StrAppend(&out, "VIOLATION: ", m, "\n");
  if (r.violations > static_cast<int64_t>(r.violation_messages.size())) {
    absl::StrAppend(&out, "... and ", r.violations - static_cast<int64_t>(r.violation_messages.size()),
                    " more violations\n");
  }
  for (const std::string& m : r.error_messages) absl::StrAppend(&out, "ERROR: ", m, "\n");
  const char* verdict = ExitCode(r) == 0 ? "PASS" : ExitCode(r) == 3 ? "STORE-UNREACHABLE" : "FAIL";
  absl::StrAppend(
      &out,
      absl::StrFormat("vc-stress: %s run %d: %d ops in %.1f s (%.0f/s), %d keys verified (%d "
                      "unreachable), %d resolved after a crash, entries found gone %d times "
                      "where eviction and %d where expiry allowed it, %d violations, %d "
                      "unexpected errors, seed %d\n",
                      verdict, r.run, r.total_ops, r.seconds,
                      r.seconds > 0 ? static_cast<double>(r.total_ops) / r.seconds : 0.0,
                      r.verified_keys, r.unverified_keys, r.resolved_keys, r.observed_evicted, r.observed_expired,
                      r.violations, r.unexpected_errors, r.seed));
  return out;
}

int ExitCode(const StressReport& r) {
  if (r.violations > 0 || r.unexpected_errors > 0) return 1;
  if (r.store_unreachable || r.unverified_keys > 0) return 3;
  return 0;
}

}  // namespace vc::stress
