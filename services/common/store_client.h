// A daemon's connection to vc-kvstore: the gRPC control plane (lookup,
// two-phase put control, get) and the data plane (TCP or UCX) that chunk
// bytes are fetched and uploaded over, on this worker's link class (fast for
// verifiers, slow for drafters). Every call has a deadline; one the store
// went away under (killed, restarting) is tried again if it may be
// (StoreRetryOptions).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/kvstore/kv_cipher.h"
#include "common/kvstore/seal.h"
#include "common/metrics/metrics.h"
#include "common/rpc/rpc.h"
#include "common/transport/data_plane.h"
#include "grpcpp/grpcpp.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc::daemon {

// When a store call that failed because the store went away (UNAVAILABLE: it
// was killed, it is restarting on its address, a connection was reset under
// the call) is tried again. One rule and one backoff for every call that may
// be repeated, all inside the caller's deadline: reads (Lookup, Get,
// ListPinHolders, a data-plane Fetch), Pin and Unpin (idempotent per holder)
// and a put not yet committed. Never tried again: any other
// code (a refusal such as PERMISSION_DENIED, UNAUTHENTICATED,
// INVALID_ARGUMENT, NOT_FOUND, or DEADLINE_EXCEEDED) and the TLS or
// authentication failures the transports report as UNAVAILABLE too.
struct StoreRetryOptions {
  int max_attempts = 4;  // 1: never tried again
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{1000};
  double multiplier = 2.0;  // each wait this many times the one before
  // Each wait is drawn from [1 - jitter, 1 + jitter] times its nominal
  // length, so that the clients that lost the store together do not come
  // back in step. 0..1.
  double jitter = 0.2;
};

// InvalidArgument naming the field unless `o` is usable.
absl::Status ValidateStoreRetryOptions(const StoreRetryOptions& o);
// Whether a store call that failed with `s` may be tried again (see
// StoreRetryOptions).
bool StoreCallMayBeRetried(const absl::Status& s);
// RetryStoreCall's rule one attempt at a time, for a caller that waits
// between attempts without a thread (the asynchronous reads below): after
// each attempt, Next says how long to wait before the next one, or that there
// is none; after a wait, StillInTime says whether to make it; Final is the
// call's status.
class StoreRetrySchedule {
 public:
  StoreRetrySchedule(const StoreRetryOptions& options,
                     std::chrono::steady_clock::time_point deadline);
  // An attempt ended with `status` (`retryable` false: it may not be made
  // again, e.g. a put whose commit was sent): the wait before the next
  // attempt, or nullopt when there is none (then Final(status)).
  std::optional<std::chrono::milliseconds> Next(const absl::Status& status, bool retryable = true);
  // After a wait: false when the deadline has passed meanwhile (then
  // Final(the last status)).
  bool StillInTime();
  // The call's status from its last attempt's: as it was after one attempt
  // that was not to be retried, otherwise saying how many attempts were made.
  absl::Status Final(absl::Status status) const;
  int attempts() const { return made_; }

 private:
  StoreRetryOptions options_;
  std::chrono::steady_clock::time_point deadline_;
  double nominal_ms_;
  int made_ = 0;
  bool retryable_ = true;
  bool out_of_time_ = false;
};

// Runs `attempt` until it succeeds, fails with a status that may not be
// retried, clears its `*retryable` (set before each attempt; e.g. a put whose
// commit was sent), has run max_attempts times, or the next wait would not
// end before `deadline`; waits the backoff between attempts. Returns the last
// status; one given up after a retry, or on a retryable status, says how many
// attempts were made. `*attempts` (optional): how many were.
absl::Status RetryStoreCall(const StoreRetryOptions& options,
                            std::chrono::steady_clock::time_point deadline,
                            absl::FunctionRef<absl::Status(bool* retryable)> attempt,
                            int* attempts = nullptr);

struct StoreClientOptions {
  std::string control_address;  // vc-kvstore --listen
  // Data plane: kind must match the store's --data-plane; the address comes
  // from the store (its Stat answer) unless set here. Empty: control plane
  // only (the coordinator), Fetch fails.
  std::string data_plane = "tcp";
  std::string data_address;
  transport::LinkClass link = transport::LinkClass::kFast;
  // Mutual TLS on the data plane (tcp only): this daemon's --tls-cert,
  // --tls-key and --tls-ca; empty = plaintext (must match the store's).
  transport::DataPlaneTlsOptions data_tls;
  // Deadline of each control RPC, fetch and stage call. Default 10 s.
  // The reads, Pin, Unpin and BeginPut wait within it for a reconnecting
  // channel.
  std::chrono::milliseconds timeout{10000};
  // The reads, Pin, Unpin and PutAll after the store went away
  // (StoreRetryOptions).
  StoreRetryOptions retry;
  // Fetch after the store went away. A data-plane connect to a store that
  // is down is refused at once (where a gRPC attempt waits for its channel),
  // so a fetch tries more often at shorter waits, until about the default
  // timeout.
  StoreRetryOptions fetch_retry{.max_attempts = 64,
                                .initial_backoff = std::chrono::milliseconds(20),
                                .max_backoff = std::chrono::milliseconds(250)};
  // How long Create waits for the store's first Stat answer (the store may
  // still be starting); 0 = `timeout`.
  std::chrono::milliseconds connect_timeout{0};
  int max_message_bytes = 64 << 20;
  // TLS of the control channel (the daemon's --tls-* files); empty: plaintext.
  rpc::TlsFiles tls;
  // PutAll over the data plane sends a put in stage calls of at most this
  // many value bytes and entries (one larger entry goes alone; the store's
  // data plane bounds it). Defaults 64 MiB and 1024 (the store's default
  // max_entries_per_stage).
  int64_t stage_batch_bytes = int64_t{64} << 20;
  int stage_batch_entries = 1024;
  // Seals (common/kvstore/seal.h; docs/security.md "Sealed KV"). With a
  // signer, PutAll seals every entry it writes for `seal_context`. With a
  // trust set, Fetch checks every value's seal against its key and
  // `seal_context` before returning it (without the seal): a value that
  // does not verify is treated as missing — NotFound naming the key — and
  // deleted from the store (quarantined), so the prefix is ingested again.
  // Null: entries are written and read unsealed (--insecure, tests).
  std::shared_ptr<const kvstore::SealSigner> seal_signer;
  std::shared_ptr<const kvstore::SealTrust> seal_trust;
  kvstore::SealContext seal_context;
  // Encryption of KV at rest (kv_cipher.h; docs/security.md): the worker's
  // --kv-secret-file. With it, PutKv encrypts every entry under its
  // tenant's key before sealing it and FetchKv decrypts after opening the
  // seal (an entry that is not encrypted is refused). Null: PutKv writes
  // plaintext and FetchKv refuses encrypted entries (FailedPrecondition
  // naming the flag) rather than misparse them.
  std::shared_ptr<const kvstore::KvKeyring> kv_keyring;
  // The daemon's /metrics registry (must outlive the client). With it,
  // Create registers the counter vericache_store_call_retries_total{call}
  // (call: lookup, get, put, fetch); each call adds its retries to it when
  // it ends, so an operator sees a store that keeps going away even while
  // the calls still succeed. Null: only retries() counts them (tools, tests).
  metrics::Registry* metrics = nullptr;
};

class StoreClient {
 public:
  static absl::StatusOr<std::unique_ptr<StoreClient>> Create(const StoreClientOptions& options);

  // Values of `keys` over the data plane (DataLoss/NotFound/Unavailable as
  // the transport reports; NotFound for a value whose seal fails, see
  // StoreClientOptions); the deadline is the options' timeout unless
  // `deadline` is given, and an UNAVAILABLE fetch is tried again within it
  // (the options' `fetch_retry`). Decode them with fetched_checksum().
  absl::StatusOr<std::vector<std::string>> Fetch(
      const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline = {});
  // KV entries (full-KV chunks, compressed variants) of the tenant whose
  // salt is `tenant_salt`: Fetch, then decrypt with the keyring (see
  // StoreClientOptions::kv_keyring). Decode them with fetched_checksum().
  absl::StatusOr<std::vector<std::string>> FetchKv(
      const std::vector<std::string>& keys, absl::string_view tenant_salt,
      std::chrono::steady_clock::time_point deadline = {});
  // How a caller decodes what Fetch or FetchKv returned: with a trust set
  // every value's seal was opened, which recomputed its checksum, so the
  // codec need not hash it again (kAlreadyRecomputed); with a keyring,
  // FetchKv's values were decrypted, and the GCM tag authenticated every
  // plaintext byte, inner checksum included, as the writer's
  // (kAlreadyRecomputed); otherwise kRecompute.
  kvstore::ChecksumCheck fetched_checksum() const {
    return options_.seal_trust != nullptr || options_.kv_keyring != nullptr
               ? kvstore::ChecksumCheck::kAlreadyRecomputed
               : kvstore::ChecksumCheck::kRecompute;
  }
  bool encrypts_kv() const { return options_.kv_keyring != nullptr; }
  // Which keys the store holds (control plane). Lookup and Get are tried
  // again after the store went away (options' `retry`) until `deadline`
  // (default: the options' timeout from now).
  absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys,
                                           std::chrono::steady_clock::time_point deadline = {});
  // One value over the control plane (small entries such as manifests).
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::steady_clock::time_point deadline = {});
  // Lookup and Get for a caller that must not hold a thread while the store
  // answers (the coordinator's request coroutines): each attempt is made on
  // gRPC's callback API and the waits between attempts run on a gRPC alarm,
  // with the synchronous calls' rule, deadline and retry counting. `done` is
  // called once, on one of gRPC's threads, with what the synchronous call
  // would have returned. The client must outlive every `done`.
  using LookupDone = std::function<void(absl::StatusOr<std::vector<bool>>)>;
  void StartLookup(const std::vector<std::string>& keys,
                   std::chrono::steady_clock::time_point deadline, LookupDone done);
  using GetDone = std::function<void(absl::StatusOr<std::string>)>;
  void StartGet(const std::string& key, std::chrono::steady_clock::time_point deadline,
                GetDone done);
  // Writes every entry in one two-phase put: all become visible at once or
  // none (aborted on any error). BeginPut and CommitPut/AbortPut go over
  // gRPC; the entries' bytes go over the data plane in stage calls (batched
  // by stage_batch_bytes / _entries), or, for a client without a data
  // plane, in one StageChunk RPC each. Taken by value so that a signer
  // seals each entry in place (move the entries in to avoid a copy).
  // A put the store lost (it went away: Unavailable before the commit) is
  // begun again and staged again in full, never resumed (the options'
  // `retry`), within `deadline` (default: the options' timeout from now;
  // each call's own deadline is the timeout, cut to a given `deadline`).
  absl::Status PutAll(std::vector<std::pair<std::string, std::string>> entries,
                      std::chrono::steady_clock::time_point deadline = {});
  // PutAll of KV entries of the tenant whose salt is `tenant_salt`, each
  // encrypted first when this client has a keyring (then sealed as usual).
  absl::Status PutKv(std::vector<std::pair<std::string, std::string>> entries,
                     absl::string_view tenant_salt,
                     std::chrono::steady_clock::time_point deadline = {});

  // Per-key maintenance (control plane): Delete, Pin, Unpin. `holder` names
  // the pin's holder (Pin, Unpin; Delete ignores it). All three are tried
  // again like reads (options' retry, within `deadline`, default the
  // options' timeout from now): Pin and Unpin are idempotent in the store,
  // and a Delete whose first attempt was applied but whose answer was lost
  // answers NotFound when repeated, which ManagePrefix takes as deleted (and
  // the quarantine of an entry whose seal failed ignores the answer).
  enum class KeyAction { kDelete, kPin, kUnpin };
  absl::Status Apply(KeyAction action, const std::string& key, const std::string& holder,
                     std::chrono::steady_clock::time_point deadline = {});
  // Apply on gRPC's callback API, for a caller that must not hold a thread
  // while the store answers (a retry's backoff waits on a gRPC alarm):
  // `done` is called once, on one of gRPC's threads, with what Apply would
  // have returned. The client must outlive every `done`.
  using ApplyDone = std::function<void(absl::Status)>;
  void StartApply(KeyAction action, const std::string& key, const std::string& holder,
                  std::chrono::steady_clock::time_point deadline, ApplyDone done);

  // The store's pin holders whose names start with `prefix`, at most
  // `limit` (KvStore::PinHolders); read like Lookup (tried again within
  // `deadline`), and on gRPC's callback API with StartPinHolders.
  struct PinHolderList {
    std::vector<std::string> holders;
    bool truncated = false;
  };
  absl::StatusOr<PinHolderList> PinHolders(const std::string& prefix, int limit,
                                           std::chrono::steady_clock::time_point deadline = {});
  using PinHoldersDone = std::function<void(absl::StatusOr<PinHolderList>)>;
  void StartPinHolders(const std::string& prefix, int limit,
                       std::chrono::steady_clock::time_point deadline, PinHoldersDone done);

  transport::ClientStats data_stats() const;
  // Values whose seal failed in Fetch (and were quarantined) so far.
  int64_t seal_failures() const { return seal_failures_.load(); }
  // Attempts beyond each call's first (the store went away under it) so far.
  int64_t retries() const { return retries_.load(); }
  const std::string& data_address() const { return data_address_; }

 private:
  StoreClient() = default;
  // The calls that are tried again, as the retry counter's `call` label.
  enum class Call { kLookup, kGet, kPut, kFetch, kPin, kUnpin, kPinHolders, kDelete };
  // Deadline `timeout`, cut to `deadline`, waiting for the channel to be
  // ready (idempotent calls).
  std::unique_ptr<grpc::ClientContext> ReadOnlyContext(
      std::chrono::steady_clock::time_point deadline) const;
  // Deadline `deadline` or, when that is unset, the options' timeout from now.
  std::chrono::steady_clock::time_point DeadlineOr(std::chrono::steady_clock::time_point d) const;
  // Adds a call's attempts beyond its first to retries() and its counter.
  void CountRetries(Call call, int attempts);
  absl::Status Retry(Call call, const StoreRetryOptions& options,
                     std::chrono::steady_clock::time_point deadline,
                     absl::FunctionRef<absl::Status(bool* retryable)> attempt);
  // A Delete, Pin or Unpin (`method`) of `key` (for `holder`: Pin and
  // Unpin), tried again as a read (see Apply).
  template <typename Req, typename Resp>
  absl::Status KeyCall(Call call, const char* name,
                       grpc::Status (vericache::v1::KvStore::Stub::*method)(grpc::ClientContext*,
                                                                            const Req&, Resp*),
                       const std::string& key, const std::string& holder,
                       std::chrono::steady_clock::time_point deadline);
  // One attempt of PutAll: BeginPut, every stage, CommitPut (the put
  // aborted on a stage error). `*retryable` false once the commit was sent.
  absl::Status PutOnce(const std::vector<std::pair<std::string, std::string>>& entries,
                       std::chrono::steady_clock::time_point deadline, bool* retryable);
  StoreClientOptions options_;
  std::string data_address_;
  std::unique_ptr<vericache::v1::KvStore::Stub> stub_;
  std::unique_ptr<transport::DataPlaneClient> data_;
  std::atomic<int64_t> seal_failures_{0};
  std::atomic<int64_t> retries_{0};
  // Per Call; null without options_.metrics.
  std::array<metrics::Counter*, 8> retry_counters_{};
};

}  // namespace vc::daemon
