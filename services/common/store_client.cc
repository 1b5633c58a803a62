#include "services/common/store_client.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/base/status_macros.h"
#include "common/rpc/rpc.h"
#include "grpcpp/alarm.h"
#include "services/common/daemon.h"

namespace vc::daemon {

namespace pb = ::vericache::v1;

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Create(
    const StoreClientOptions& options) {
  if (options.control_address.empty()) {
    return absl::InvalidArgumentError("--kvstore is required (the vc-kvstore gRPC address)");
  }
  if (options.stage_batch_bytes < 1 || options.stage_batch_entries < 1) {
    return absl::InvalidArgumentError("stage_batch_bytes and stage_batch_entries must be >= 1");
  }
  VC_RETURN_IF_ERROR(ValidateStoreRetryOptions(options.retry));
  VC_RETURN_IF_ERROR(ValidateStoreRetryOptions(options.fetch_retry));
  auto client = std::unique_ptr<StoreClient>(new StoreClient());
  client->options_ = options;
  if (options.metrics != nullptr) {
    metrics::CounterFamily* retries = MustCounter(
        options.metrics, "vericache_store_call_retries_total",
        "Store calls tried again after the store went away under them (UNAVAILABLE), by call.",
        {"call"});
    // In the order of Call.
    const char* const names[] = {"lookup", "get",   "put",         "fetch",
                                 "pin",    "unpin", "pin_holders", "delete"};
    static_assert(std::size(names) == std::tuple_size_v<decltype(client->retry_counters_)>);
    for (size_t i = 0; i < client->retry_counters_.size(); ++i) {
      client->retry_counters_[i] = &retries->Labels({names[i]});
    }
  }
  client->stub_ = pb::KvStore::NewStub(
      rpc::MakeChannel(options.control_address, options.max_message_bytes, options.tls));
  std::string data_address = options.data_address;
  if (data_address.empty()) {
    // The store advertises its data plane in Stat; ask until it answers (the
    // store may still be starting) within the timeout.
    const auto give_up =
        std::chrono::steady_clock::now() +
        (options.connect_timeout.count() > 0 ? options.connect_timeout : options.timeout);
    grpc::Status last;
    while (true) {
      pb::StatRequest req;
      pb::StatResponse resp;
      auto ctx = rpc::ContextWithTimeout(std::chrono::milliseconds(1000));
      ctx->set_wait_for_ready(true);
      last = client->stub_->Stat(ctx.get(), req, &resp);
      if (last.ok()) {
        if (!options.data_plane.empty() && resp.data_plane() != options.data_plane) {
          return absl::FailedPreconditionError(absl::StrCat(
              "vc-kvstore at ", options.control_address, " serves the '", resp.data_plane(),
              "' data plane, this daemon uses '", options.data_plane, "' (--data-plane)"));
        }
        data_address = resp.data_address();
        break;
      }
      if (std::chrono::steady_clock::now() >= give_up) {
        return rpc::FromGrpcStatus(last,
                                   absl::StrCat("vc-kvstore ", options.control_address, " Stat"));
      }
    }
  }
  client->data_address_ = data_address;
  if (options.data_plane.empty()) return client;
  transport::DataPlaneClientOptions dopts;
  dopts.kind = options.data_plane;
  dopts.server_address = data_address;
  dopts.link = options.link;
  dopts.tls = options.data_tls;
  VC_ASSIGN_OR_RETURN(client->data_, transport::DataPlaneClient::Create(dopts));
  return client;
}

absl::StatusOr<std::vector<std::string>> StoreClient::Fetch(
    const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline) {
  deadline = DeadlineOr(deadline);
  if (data_ == nullptr) return absl::FailedPreconditionError("this store client has no data plane");
  // A store that was restarted: while it is down connects are refused, and
  // afterwards connections pooled before the restart fail one by one (the
  // data plane client tries a second connection, not every one). A fetch is
  // a read, so it is tried again (fetch_retry), as the gRPC reads are.
  absl::StatusOr<std::vector<std::string>> fetched;
  VC_RETURN_IF_ERROR(Retry(Call::kFetch, options_.fetch_retry, deadline, [&](bool*) {
    fetched = data_->Fetch(keys, deadline);
    return fetched.status();
  }));
  std::vector<std::string> values = std::move(*fetched);
  if (options_.seal_trust == nullptr) return values;
  // The seal is checked before anyone decodes a byte of the entry.
  for (size_t i = 0; i < keys.size(); ++i) {
    auto payload = options_.seal_trust->OpenFor(keys[i], options_.seal_context, values[i]);
    if (!payload.ok()) {
      seal_failures_.fetch_add(1);
      // Quarantine: remove it so the next request misses and ingests it
      // again (a pinned entry stays; the store refuses that delete).
      (void)Apply(KeyAction::kDelete, keys[i], "");
      return absl::NotFoundError(
          absl::StrCat("vc-kvstore entry ", absl::BytesToHexString(keys[i].substr(0, 8)),
                       "...: treated as missing, its seal failed (", payload.status().message(),
                       "); removed from the store"));
    }
    values[i].resize(payload->size());  // the payload is the entry minus its trailer
  }
  return values;
}

namespace {

// The tenant key of `tenant_salt`, with an error that says what to fix.
absl::StatusOr<kvstore::TenantKey> KeyFor(const kvstore::KvKeyring& ring,
                                          absl::string_view tenant_salt) {
  if (tenant_salt.empty()) {
    return absl::FailedPreconditionError(
        "KV encryption (--kv-secret-file) needs authenticated tenants: this request has no "
        "tenant salt (turn on the coordinator's API keys, or run the workers without "
        "--kv-secret-file)");
  }
  return ring.KeyFor(tenant_salt);
}

std::string ShortKey(const std::string& key) {
  return absl::StrCat(absl::BytesToHexString(key.substr(0, 8)), "...");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> StoreClient::FetchKv(
    const std::vector<std::string>& keys, absl::string_view tenant_salt,
    std::chrono::steady_clock::time_point deadline) {
  std::optional<kvstore::TenantKey> key;
  if (options_.kv_keyring != nullptr) {
    // Before the fetch: a request that cannot be decrypted moves no bytes.
    VC_ASSIGN_OR_RETURN(key, KeyFor(*options_.kv_keyring, tenant_salt));
  }
  VC_ASSIGN_OR_RETURN(std::vector<std::string> values, Fetch(keys, deadline));
  // An opened seal recomputed the ciphertext's checksum; hash it only once.
  const kvstore::ChecksumCheck check = options_.seal_trust != nullptr
                                           ? kvstore::ChecksumCheck::kAlreadyRecomputed
                                           : kvstore::ChecksumCheck::kRecompute;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool encrypted = kvstore::LooksEncrypted(values[i]);
    if (!key.has_value()) {
      if (encrypted) {
        return absl::FailedPreconditionError(absl::StrCat(
            "vc-kvstore entry ", ShortKey(keys[i]),
            " is encrypted at rest and this worker has no KV secret (--kv-secret-file)"));
      }
      continue;
    }
    if (!encrypted) {
      return absl::FailedPreconditionError(absl::StrCat(
          "vc-kvstore entry ", ShortKey(keys[i]),
          " is not encrypted, and this worker (--kv-secret-file) reads encrypted KV only"));
    }
    absl::StatusOr<std::string> plain = kvstore::DecryptEntry(*key, keys[i], values[i], check);
    if (!plain.ok()) {
      // Not treated as missing: an entry sealed by a trusted writer that does
      // not decrypt was written under another KV secret (or tenant), and
      // ingesting it again would not fix the secret.
      return absl::Status(
          plain.status().code(),
          absl::StrCat("vc-kvstore entry ", ShortKey(keys[i]), ": ", plain.status().message(),
                       " (is --kv-secret-file the cluster's KV secret?)"));
    }
    values[i] = std::move(*plain);
  }
  return values;
}

absl::Status StoreClient::PutKv(std::vector<std::pair<std::string, std::string>> entries,
                                absl::string_view tenant_salt,
                                std::chrono::steady_clock::time_point deadline) {
  if (options_.kv_keyring != nullptr) {
    VC_ASSIGN_OR_RETURN(const kvstore::TenantKey key, KeyFor(*options_.kv_keyring, tenant_salt));
    for (auto& [store_key, value] : entries) {
      VC_ASSIGN_OR_RETURN(value, kvstore::EncryptEntry(key, store_key, value));
    }
  }
  return PutAll(std::move(entries), deadline);
}

std::chrono::steady_clock::time_point StoreClient::DeadlineOr(
    std::chrono::steady_clock::time_point d) const {
  if (d != std::chrono::steady_clock::time_point{}) return d;
  return std::chrono::steady_clock::now() + options_.timeout;
}

absl::Status StoreClient::Retry(Call call, const StoreRetryOptions& options,
                                std::chrono::steady_clock::time_point deadline,
                                absl::FunctionRef<absl::Status(bool* retryable)> attempt) {
  int attempts = 0;
  absl::Status s = RetryStoreCall(options, deadline, attempt, &attempts);
  CountRetries(call, attempts);
  return s;
}

void StoreClient::CountRetries(Call call, int attempts) {
  if (attempts <= 1) return;
  retries_.fetch_add(attempts - 1);
  metrics::Counter* counter = retry_counters_[static_cast<size_t>(call)];
  if (counter != nullptr) counter->Inc(attempts - 1);
}

std::unique_ptr<grpc::ClientContext> StoreClient::ReadOnlyContext(
    std::chrono::steady_clock::time_point deadline) const {
  const auto left = std::min(deadline - std::chrono::steady_clock::now(),
                             std::chrono::steady_clock::duration(options_.timeout));
  auto ctx = rpc::ContextWithTimeout(std::max(
      std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(left)));
  // A read-only call made while the channel reconnects (the store was just
  // restarted) waits for the connection within its deadline instead of
  // failing at once with "failed to connect to all addresses". One in
  // flight when the store dies fails (the connection is reset) and is tried
  // again (options' retry): it is a read.
  ctx->set_wait_for_ready(true);
  return ctx;
}

namespace {

pb::LookupRequest LookupRequestFor(const std::vector<std::string>& keys) {
  pb::LookupRequest req;
  for (const auto& k : keys) req.add_keys(k);
  return req;
}

// One hit per key asked, or the store answered another question.
absl::StatusOr<std::vector<bool>> HitsOf(const pb::LookupResponse& resp, size_t keys) {
  if (resp.results_size() != static_cast<int>(keys)) {
    return absl::InternalError("vc-kvstore Lookup answered a different number of keys");
  }
  std::vector<bool> hits;
  hits.reserve(keys);
  for (const auto& r : resp.results()) hits.push_back(r.hit());
  return hits;
}

// One asynchronous read (Lookup or Get) and its retries. The state is owned
// by whatever is pending for it (the attempt's gRPC callback, or the alarm's
// callback between attempts) and passed on from one to the next; the alarm
// callback moves its reference out when it runs, so the alarm, which keeps
// its callback until it is destroyed, holds no reference to the state that
// owns it.
template <typename Req, typename Resp>
struct AsyncRead {
  using Method = void (pb::KvStore::Stub::async_interface::*)(grpc::ClientContext*, const Req*,
                                                              Resp*,
                                                              std::function<void(grpc::Status)>);
  AsyncRead(pb::KvStore::Stub* stub, Method method, const char* name,
            const StoreRetryOptions& retry, std::chrono::steady_clock::time_point deadline,
            std::function<std::unique_ptr<grpc::ClientContext>()> context)
      : stub(stub),
        method(method),
        name(name),
        schedule(retry, deadline),
        context(std::move(context)) {}

  pb::KvStore::Stub* const stub;
  const Method method;
  const char* const name;
  StoreRetrySchedule schedule;
  const std::function<std::unique_ptr<grpc::ClientContext>()> context;  // one per attempt
  Req req;
  Resp resp;
  std::unique_ptr<grpc::ClientContext> ctx;  // the attempt's, while it runs
  std::unique_ptr<grpc::Alarm> alarm;        // the last wait's
  absl::Status last;                         // the last attempt's status
  // The call's status (resp is the answer when it is OK) and its attempts.
  std::function<void(absl::Status, int attempts, Resp* resp)> done;
};

template <typename Req, typename Resp>
void FinishRead(const std::shared_ptr<AsyncRead<Req, Resp>>& read) {
  read->done(read->schedule.Final(read->last), read->schedule.attempts(), &read->resp);
}

template <typename Req, typename Resp>
void AttemptRead(std::shared_ptr<AsyncRead<Req, Resp>> read) {
  read->resp.Clear();
  read->ctx = read->context();
  AsyncRead<Req, Resp>& r = *read;
  (r.stub->async()->*r.method)(
      r.ctx.get(), &r.req, &r.resp, [read = std::move(read)](const grpc::Status& g) mutable {
        read->ctx.reset();
        read->last = rpc::FromGrpcStatus(g, read->name);
        const std::optional<std::chrono::milliseconds> wait = read->schedule.Next(read->last);
        if (!wait) {
          FinishRead(read);
          return;
        }
        // A new alarm per wait: the one before may still be returning from
        // the callback that made this attempt (its implementation is
        // reference-counted, so destroying it here is safe).
        read->alarm = std::make_unique<grpc::Alarm>();
        grpc::Alarm& alarm = *read->alarm;
        alarm.Set(std::chrono::system_clock::now() + *wait,
                  [read = std::move(read)](bool fired) mutable {
                    std::shared_ptr<AsyncRead<Req, Resp>> own = std::move(read);
                    if (fired && own->schedule.StillInTime()) {
                      AttemptRead(std::move(own));
                    } else {
                      FinishRead(own);
                    }
                  });
      });
}

}  // namespace

absl::StatusOr<std::vector<bool>> StoreClient::Lookup(
    const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline) {
  deadline = DeadlineOr(deadline);
  const pb::LookupRequest req = LookupRequestFor(keys);
  pb::LookupResponse resp;
  VC_RETURN_IF_ERROR(Retry(Call::kLookup, options_.retry, deadline, [&](bool*) {
    resp.Clear();
    auto ctx = ReadOnlyContext(deadline);
    return rpc::FromGrpcStatus(stub_->Lookup(ctx.get(), req, &resp), "vc-kvstore Lookup");
  }));
  return HitsOf(resp, keys.size());
}

void StoreClient::StartLookup(const std::vector<std::string>& keys,
                              std::chrono::steady_clock::time_point deadline, LookupDone done) {
  deadline = DeadlineOr(deadline);
  using Read = AsyncRead<pb::LookupRequest, pb::LookupResponse>;
  auto read = std::make_shared<Read>(
      stub_.get(), Read::Method{&pb::KvStore::Stub::async_interface::Lookup}, "vc-kvstore Lookup",
      options_.retry, deadline, [this, deadline] { return ReadOnlyContext(deadline); });
  read->req = LookupRequestFor(keys);
  read->done = [this, n = keys.size(), done = std::move(done)](absl::Status s, int attempts,
                                                               pb::LookupResponse* resp) {
    CountRetries(Call::kLookup, attempts);
    if (!s.ok()) {
      done(std::move(s));
    } else {
      done(HitsOf(*resp, n));
    }
  };
  AttemptRead(std::move(read));
}

void StoreClient::StartGet(const std::string& key, std::chrono::steady_clock::time_point deadline,
                           GetDone done) {
  deadline = DeadlineOr(deadline);
  using Read = AsyncRead<pb::GetRequest, pb::GetResponse>;
  auto read = std::make_shared<Read>(
      stub_.get(), Read::Method{&pb::KvStore::Stub::async_interface::Get}, "vc-kvstore Get",
      options_.retry, deadline, [this, deadline] { return ReadOnlyContext(deadline); });
  read->req.set_key(key);
  read->done = [this, done = std::move(done)](absl::Status s, int attempts, pb::GetResponse* resp) {
    CountRetries(Call::kGet, attempts);
    if (!s.ok()) {
      done(std::move(s));
    } else {
      done(std::move(*resp->mutable_value()));
    }
  };
  AttemptRead(std::move(read));
}

namespace {

StoreClient::PinHolderList HoldersOf(pb::ListPinHoldersResponse* resp) {
  StoreClient::PinHolderList list;
  list.holders.reserve(resp->holders_size());
  for (std::string& h : *resp->mutable_holders()) list.holders.push_back(std::move(h));
  list.truncated = resp->truncated();
  return list;
}

}  // namespace

absl::StatusOr<StoreClient::PinHolderList> StoreClient::PinHolders(
    const std::string& prefix, int limit, std::chrono::steady_clock::time_point deadline) {
  deadline = DeadlineOr(deadline);
  pb::ListPinHoldersRequest req;
  req.set_prefix(prefix);
  req.set_limit(limit);
  pb::ListPinHoldersResponse resp;
  VC_RETURN_IF_ERROR(Retry(Call::kPinHolders, options_.retry, deadline, [&](bool*) {
    resp.Clear();
    auto ctx = ReadOnlyContext(deadline);
    return rpc::FromGrpcStatus(stub_->ListPinHolders(ctx.get(), req, &resp),
                               "vc-kvstore ListPinHolders");
  }));
  return HoldersOf(&resp);
}

void StoreClient::StartPinHolders(const std::string& prefix, int limit,
                                  std::chrono::steady_clock::time_point deadline,
                                  PinHoldersDone done) {
  deadline = DeadlineOr(deadline);
  using Read = AsyncRead<pb::ListPinHoldersRequest, pb::ListPinHoldersResponse>;
  auto read = std::make_shared<Read>(
      stub_.get(), Read::Method{&pb::KvStore::Stub::async_interface::ListPinHolders},
      "vc-kvstore ListPinHolders", options_.retry, deadline,
      [this, deadline] { return ReadOnlyContext(deadline); });
  read->req.set_prefix(prefix);
  read->req.set_limit(limit);
  read->done = [this, done = std::move(done)](absl::Status s, int attempts,
                                              pb::ListPinHoldersResponse* resp) {
    CountRetries(Call::kPinHolders, attempts);
    if (!s.ok()) {
      done(std::move(s));
    } else {
      done(HoldersOf(resp));
    }
  };
  AttemptRead(std::move(read));
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key,
                                             std::chrono::steady_clock::time_point deadline) {
  deadline = DeadlineOr(deadline);
  pb::GetRequest req;
  req.set_key(key);
  pb::GetResponse resp;
  VC_RETURN_IF_ERROR(Retry(Call::kGet, options_.retry, deadline, [&](bool*) {
    resp.Clear();
    auto ctx = ReadOnlyContext(deadline);
    return rpc::FromGrpcStatus(stub_->Get(ctx.get(), req, &resp), "vc-kvstore Get");
  }));
  return std::move(*resp.mutable_value());
}

absl::Status StoreClient::PutAll(std::vector<std::pair<std::string, std::string>> entries,
                                 std::chrono::steady_clock::time_point deadline) {
  // Sealed in place when this client signs (the producer of the entries):
  // a signature over each entry's checksum, appended, no payload copied.
  if (options_.seal_signer != nullptr) {
    for (auto& entry : entries) {
      VC_RETURN_IF_ERROR(
          options_.seal_signer->Seal(entry.first, options_.seal_context, &entry.second));
    }
  }
  const bool caller_deadline = deadline != std::chrono::steady_clock::time_point{};
  deadline = DeadlineOr(deadline);
  // A store restarted under a put loses it (its puts are not persisted; a
  // stage on a connection pooled before the restart fails). The put is then
  // begun again and every entry staged again on a fresh connection, never
  // resumed: nothing of the lost attempt becomes visible, and each attempt
  // commits all of its entries or none.
  const auto call_limit = caller_deadline ? deadline : std::chrono::steady_clock::time_point{};
  return Retry(Call::kPut, options_.retry, deadline,
               [&](bool* retryable) { return PutOnce(entries, call_limit, retryable); });
}

absl::Status StoreClient::PutOnce(const std::vector<std::pair<std::string, std::string>>& entries,
                                  std::chrono::steady_clock::time_point deadline, bool* retryable) {
  *retryable = true;
  // Each call's deadline: the options' timeout, cut to the caller's deadline.
  auto call_deadline = [&] {
    const auto own = std::chrono::steady_clock::now() + options_.timeout;
    return deadline == std::chrono::steady_clock::time_point{} ? own : std::min(own, deadline);
  };
  auto context = [&] {
    const auto left = call_deadline() - std::chrono::steady_clock::now();
    return rpc::ContextWithTimeout(std::max(
        std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(left)));
  };
  pb::BeginPutRequest begin;
  pb::BeginPutResponse began;
  {
    // Nothing is sent before the channel is ready, so waiting for it (a
    // store that is restarting) cannot open a put twice.
    auto ctx = context();
    ctx->set_wait_for_ready(true);
    const grpc::Status s = stub_->BeginPut(ctx.get(), begin, &began);
    if (!s.ok()) return rpc::FromGrpcStatus(s, "vc-kvstore BeginPut");
  }
  const uint64_t id = began.put_id();
  auto abort = [&](absl::Status error) {
    pb::AbortPutRequest req;
    req.set_put_id(id);
    pb::AbortPutResponse resp;
    auto ctx = rpc::ContextWithTimeout(options_.timeout);
    (void)stub_->AbortPut(ctx.get(), req, &resp);
    return error;
  };
  if (data_ != nullptr) {
    // Consecutive slices of `entries` (no copies), each within the batch
    // bounds, each its own stage call with its own deadline.
    const absl::Span<const std::pair<std::string, std::string>> all(entries);
    size_t begin_at = 0;
    while (begin_at < all.size()) {
      size_t end_at = begin_at;
      int64_t bytes = 0;
      while (end_at < all.size() &&
             static_cast<int64_t>(end_at - begin_at) < options_.stage_batch_entries &&
             (end_at == begin_at || bytes + static_cast<int64_t>(all[end_at].second.size()) <=
                                        options_.stage_batch_bytes)) {
        bytes += static_cast<int64_t>(all[end_at].second.size());
        ++end_at;
      }
      const absl::Status s =
          data_->Stage(id, all.subspan(begin_at, end_at - begin_at), call_deadline());
      if (!s.ok()) {
        return abort(absl::Status(s.code(), absl::StrCat("vc-kvstore data plane stage (",
                                                         data_address_, "): ", s.message())));
      }
      begin_at = end_at;
    }
  } else {
    // No data plane (the coordinator's small manifests): the control
    // plane's StageChunk, one entry per message.
    for (const auto& [key, value] : entries) {
      pb::StageChunkRequest req;
      req.set_put_id(id);
      req.set_key(key);
      req.set_value(value);
      pb::StageChunkResponse resp;
      auto ctx = context();
      const grpc::Status s = stub_->StageChunk(ctx.get(), req, &resp);
      if (!s.ok()) return abort(rpc::FromGrpcStatus(s, "vc-kvstore StageChunk"));
    }
  }
  pb::CommitPutRequest req;
  req.set_put_id(id);
  pb::CommitPutResponse resp;
  auto ctx = context();
  const grpc::Status s = stub_->CommitPut(ctx.get(), req, &resp);
  // A failed commit discards the put in the store. Not tried again: a
  // commit whose answer was lost may have been applied.
  if (!s.ok()) {
    *retryable = false;
    return rpc::FromGrpcStatus(s, "vc-kvstore CommitPut");
  }
  return absl::OkStatus();
}

namespace {

// Starts a Delete, Pin or Unpin of `key` (for `holder`: Pin and Unpin),
// tried again as a read; `done` gets its status and attempts.
template <typename Req, typename Resp>
void StartKeyRead(pb::KvStore::Stub* stub, typename AsyncRead<Req, Resp>::Method method,
                  const char* name, const StoreRetryOptions& retry,
                  std::chrono::steady_clock::time_point deadline,
                  std::function<std::unique_ptr<grpc::ClientContext>()> context,
                  const std::string& key, const std::string& holder,
                  std::function<void(absl::Status, int attempts)> done) {
  auto read = std::make_shared<AsyncRead<Req, Resp>>(stub, method, name, retry, deadline,
                                                     std::move(context));
  read->req.set_key(key);
  if constexpr (requires(Req & r) { r.set_holder(holder); }) read->req.set_holder(holder);
  read->done = [done = std::move(done)](absl::Status s, int attempts, Resp*) {
    done(std::move(s), attempts);
  };
  AttemptRead(std::move(read));
}

}  // namespace

template <typename Req, typename Resp>
absl::Status StoreClient::KeyCall(Call call, const char* name,
                                  grpc::Status (pb::KvStore::Stub::*method)(grpc::ClientContext*,
                                                                            const Req&, Resp*),
                                  const std::string& key, const std::string& holder,
                                  std::chrono::steady_clock::time_point deadline) {
  deadline = DeadlineOr(deadline);
  Req req;
  req.set_key(key);
  if constexpr (requires { req.set_holder(holder); }) req.set_holder(holder);
  return Retry(call, options_.retry, deadline, [&](bool*) {
    Resp resp;
    auto ctx = ReadOnlyContext(deadline);
    return rpc::FromGrpcStatus((stub_.get()->*method)(ctx.get(), req, &resp), name);
  });
}

absl::Status StoreClient::Apply(KeyAction action, const std::string& key, const std::string& holder,
                                std::chrono::steady_clock::time_point deadline) {
  switch (action) {
    case KeyAction::kDelete:
      return KeyCall(Call::kDelete, "vc-kvstore Delete", &pb::KvStore::Stub::Delete, key, holder,
                     deadline);
    case KeyAction::kPin:
      return KeyCall(Call::kPin, "vc-kvstore Pin", &pb::KvStore::Stub::Pin, key, holder, deadline);
    case KeyAction::kUnpin:
      return KeyCall(Call::kUnpin, "vc-kvstore Unpin", &pb::KvStore::Stub::Unpin, key, holder,
                     deadline);
  }
  return absl::InvalidArgumentError("unknown key action");
}

void StoreClient::StartApply(KeyAction action, const std::string& key, const std::string& holder,
                             std::chrono::steady_clock::time_point deadline, ApplyDone done) {
  using Async = pb::KvStore::Stub::async_interface;
  deadline = DeadlineOr(deadline);
  auto context = [this, deadline] { return ReadOnlyContext(deadline); };
  const Call call = action == KeyAction::kPin     ? Call::kPin
                    : action == KeyAction::kUnpin ? Call::kUnpin
                                                  : Call::kDelete;
  auto counted = [this, call, done = std::move(done)](absl::Status s, int attempts) {
    CountRetries(call, attempts);
    done(std::move(s));
  };
  switch (action) {
    case KeyAction::kDelete:
      StartKeyRead<pb::DeleteRequest, pb::DeleteResponse>(
          stub_.get(), &Async::Delete, "vc-kvstore Delete", options_.retry, deadline,
          std::move(context), key, holder, std::move(counted));
      return;
    case KeyAction::kPin:
      StartKeyRead<pb::PinRequest, pb::PinResponse>(stub_.get(), &Async::Pin, "vc-kvstore Pin",
                                                    options_.retry, deadline, std::move(context),
                                                    key, holder, std::move(counted));
      return;
    case KeyAction::kUnpin:
      StartKeyRead<pb::UnpinRequest, pb::UnpinResponse>(
          stub_.get(), &Async::Unpin, "vc-kvstore Unpin", options_.retry, deadline,
          std::move(context), key, holder, std::move(counted));
      return;
  }
  done(absl::InvalidArgumentError("unknown key action"));
}

transport::ClientStats StoreClient::data_stats() const {
  return data_ ? data_->stats() : transport::ClientStats{};
}

}  // namespace vc::daemon
