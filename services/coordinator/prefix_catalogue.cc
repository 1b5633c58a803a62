#include "services/coordinator/prefix_catalogue.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/executor.h"
#include "common/base/status_macros.h"
#include "common/compress/compressor.h"
#include "common/kvstore/kv_store.h"
#include "services/common/store_client.h"
#include "services/coordinator/request_validation.h"

namespace vc::coordinator {

namespace pb = ::vericache::v1;

namespace {

std::string Hex(const std::string& raw) { return absl::BytesToHexString(raw); }

constexpr char kLedgerMagic[] = "VCLG";
constexpr uint32_t kLedgerVersion = 1;
constexpr size_t kLedgerHeaderBytes = 4 + 4 + 8 + 4;
constexpr size_t kLedgerKeyBytes = 32;
constexpr size_t kLedgerChargeBytes = kLedgerKeyBytes + 8;

// The little-endian fields of the manifest and the tenant ledger.
void PutLittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int b = 0; b < bytes; ++b) out->push_back(static_cast<char>((v >> (8 * b)) & 0xff));
}
uint64_t GetLittleEndian(const std::string& in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int b = 0; b < bytes; ++b) v |= uint64_t{static_cast<uint8_t>(in[at + b])} << (8 * b);
  return v;
}

std::string EncodeTokens(const std::vector<int32_t>& tokens) {
  std::string out;
  out.reserve(tokens.size() * 4);
  for (const int32_t t : tokens) PutLittleEndian(static_cast<uint32_t>(t), 4, &out);
  return out;
}

absl::StatusOr<std::vector<int32_t>> DecodeTokens(const std::string& bytes) {
  if (bytes.size() % 4 != 0) return absl::DataLossError("corrupt prefix manifest");
  std::vector<int32_t> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<int32_t>(static_cast<uint32_t>(GetLittleEndian(bytes, i * 4, 4)));
  }
  return out;
}

daemon::StoreClient::KeyAction KeyAction(CatalogueStore::Action action) {
  switch (action) {
    case CatalogueStore::Action::kPin:
      return daemon::StoreClient::KeyAction::kPin;
    case CatalogueStore::Action::kUnpin:
      return daemon::StoreClient::KeyAction::kUnpin;
    case CatalogueStore::Action::kDelete:
      break;
  }
  return daemon::StoreClient::KeyAction::kDelete;
}

class StoreClientAdapter final : public CatalogueStore {
 public:
  explicit StoreClientAdapter(daemon::StoreClient* store) : store_(store) {}
  absl::StatusOr<std::vector<bool>> Lookup(const std::vector<std::string>& keys,
                                           Clock::time_point deadline) override {
    return store_->Lookup(keys, deadline);
  }
  absl::StatusOr<std::string> Get(const std::string& key, Clock::time_point deadline) override {
    return store_->Get(key, deadline);
  }
  absl::Status Put(const std::string& key, const std::string& value,
                   Clock::time_point deadline) override {
    return store_->PutAll({{key, value}}, deadline);
  }
  void StartLookup(const std::vector<std::string>& keys, Clock::time_point deadline,
                   LookupDone done) override {
    store_->StartLookup(keys, deadline, std::move(done));
  }
  void StartGet(const std::string& key, Clock::time_point deadline, GetDone done) override {
    store_->StartGet(key, deadline, std::move(done));
  }
  // The store's put (BeginPut, stages, CommitPut, retried as one) is
  // synchronous; a registration's manifest put and the tenant ledger's
  // writes run on these threads, not on the coordinator's executor. At most
  // as many wait here as registrations hold admission places, plus one
  // ledger write per tenant (AdmissionController::BeginLedgerWrite).
  void StartPut(const std::string& key, const std::string& value, Clock::time_point deadline,
                PutDone done) override {
    putter_.Post([this, key, value, deadline, done = std::move(done)] {
      done(store_->PutAll({{key, value}}, deadline));
    });
  }
  absl::Status Apply(Action action, const std::string& key, const std::string& holder,
                     Clock::time_point deadline) override {
    return store_->Apply(KeyAction(action), key, holder, deadline);
  }
  void StartApply(Action action, const std::string& key, const std::string& holder,
                  Clock::time_point deadline, ApplyDone done) override {
    store_->StartApply(KeyAction(action), key, holder, deadline, std::move(done));
  }
  absl::StatusOr<std::vector<std::string>> PinHolders(const std::string& prefix, int limit,
                                                      Clock::time_point deadline) override {
    VC_ASSIGN_OR_RETURN(daemon::StoreClient::PinHolderList list,
                        store_->PinHolders(prefix, limit, deadline));
    return std::move(list.holders);
  }
  void StartPinHolders(const std::string& prefix, int limit, Clock::time_point deadline,
                       PinHoldersDone done) override {
    store_->StartPinHolders(
        prefix, limit, deadline,
        [done = std::move(done)](absl::StatusOr<daemon::StoreClient::PinHolderList> list) {
          if (!list.ok()) {
            done(list.status());
          } else {
            done(std::move(list->holders));
          }
        });
  }

 private:
  daemon::StoreClient* store_;
  // Last: destroyed first, after the puts it holds have run.
  Executor putter_{ExecutorOptions{.max_threads = 2}};
};

bool AllTrue(const std::vector<bool>& hits) {
  return std::all_of(hits.begin(), hits.end(), [](bool h) { return h; });
}

}  // namespace

std::string PinHolder(const std::string& tenant, const std::string& prefix_id) {
  // The tenant's length first: a '/' in a tenant name cannot make two
  // (tenant, prefix) pairs one holder.
  return absl::StrCat("prefix:", tenant.size(), ":", tenant, "/", prefix_id);
}

std::string EncodeTenantLedger(const StoredCharges& charges) {
  std::string out(kLedgerMagic, 4);
  out.reserve(kLedgerHeaderBytes + charges.by_prefix.size() * kLedgerChargeBytes);
  PutLittleEndian(kLedgerVersion, 4, &out);
  PutLittleEndian(static_cast<uint64_t>(charges.unlisted), 8, &out);
  PutLittleEndian(charges.by_prefix.size(), 4, &out);
  for (const auto& [key, bytes] : charges.by_prefix) {
    out.append(key.substr(0, kLedgerKeyBytes));
    out.append(kLedgerKeyBytes - std::min(key.size(), kLedgerKeyBytes), '\0');
    PutLittleEndian(static_cast<uint64_t>(bytes), 8, &out);
  }
  return out;
}

absl::StatusOr<StoredCharges> DecodeTenantLedger(const std::string& value) {
  if (value.size() < kLedgerHeaderBytes || value.compare(0, 4, kLedgerMagic) != 0) {
    return absl::DataLossError(absl::StrCat("not a tenant ledger (", value.size(),
                                            " bytes; a ledger starts with ", kLedgerMagic, ")"));
  }
  const uint64_t version = GetLittleEndian(value, 4, 4);
  if (version != kLedgerVersion) {
    return absl::DataLossError(absl::StrCat("tenant ledger version ", version,
                                            " (this coordinator reads ", kLedgerVersion, ")"));
  }
  StoredCharges charges;
  charges.unlisted = static_cast<int64_t>(GetLittleEndian(value, 8, 8));
  const uint64_t count = GetLittleEndian(value, 16, 4);
  if (charges.unlisted < 0 || count > kMaxChargedPrefixes ||
      value.size() != kLedgerHeaderBytes + count * kLedgerChargeBytes) {
    return absl::DataLossError(absl::StrCat("tenant ledger of ", value.size(), " bytes with ",
                                            count, " charges and ", charges.unlisted,
                                            " unlisted bytes"));
  }
  for (size_t i = 0; i < count; ++i) {
    const size_t at = kLedgerHeaderBytes + i * kLedgerChargeBytes;
    std::string key = value.substr(at, kLedgerKeyBytes);
    const int64_t bytes = static_cast<int64_t>(GetLittleEndian(value, at + kLedgerKeyBytes, 8));
    if (bytes <= 0 || (!charges.by_prefix.empty() && key <= charges.by_prefix.rbegin()->first)) {
      return absl::DataLossError(absl::StrCat("tenant ledger charge ", i, " of ", count,
                                              " is out of order or not positive"));
    }
    charges.by_prefix.emplace_hint(charges.by_prefix.end(), std::move(key), bytes);
  }
  return charges;
}

// A variant list from a request: bounded text and count, parsed.
absl::StatusOr<std::vector<ingest::VariantSpec>> RequestVariants(const std::string& text) {
  if (text.size() > kMaxVariantsTextBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("variants is longer than the limit of ", kMaxVariantsTextBytes, " bytes"));
  }
  VC_ASSIGN_OR_RETURN(std::vector<ingest::VariantSpec> v, ingest::ParseVariantList(text));
  if (v.size() > kMaxVariantsPerPrefix) {
    return absl::InvalidArgumentError(absl::StrCat("variants names ", v.size(),
                                                   " variants, the limit is ",
                                                   kMaxVariantsPerPrefix, " per prefix"));
  }
  return v;
}

std::unique_ptr<CatalogueStore> StoreClientCatalogue(daemon::StoreClient* store) {
  return std::make_unique<StoreClientAdapter>(store);
}

PrefixCatalogue::PrefixCatalogue(CatalogueOptions options, CatalogueModel model,
                                 CatalogueStore* store, AdmissionController* admission,
                                 CatalogueHooks hooks)
    : options_(std::move(options)),
      model_(model),
      store_(store),
      admission_(admission),
      hooks_(std::move(hooks)) {}

absl::StatusOr<std::vector<int32_t>> PrefixCatalogue::Tokens(const std::string& id,
                                                             const std::string& salt,
                                                             Clock::time_point deadline) {
  VC_ASSIGN_OR_RETURN(const std::string raw, ParsePrefixId(id));
  return TokensOfManifest(id, raw, salt, store_->Get(raw, StoreDeadline(deadline)));
}

Task<absl::StatusOr<std::vector<int32_t>>> PrefixCatalogue::AwaitTokens(
    const RunnerContext& ctx, const std::string& id, const std::string& salt,
    Clock::time_point deadline) {
  VC_CO_ASSIGN_OR_RETURN(const std::string raw, ParsePrefixId(id));
  absl::StatusOr<std::string> manifest = co_await AwaitGet(ctx, raw, StoreDeadline(deadline));
  co_return TokensOfManifest(id, raw, salt, std::move(manifest));
}

absl::StatusOr<std::vector<int32_t>> PrefixCatalogue::TokensOfManifest(
    const std::string& id, const std::string& raw, const std::string& salt,
    absl::StatusOr<std::string> manifest) const {
  const absl::Status not_found =
      absl::NotFoundError(absl::StrCat("prefix ", id, " is not registered (vericache ingest)"));
  if (!manifest.ok()) {
    if (manifest.status().code() == absl::StatusCode::kNotFound) return not_found;
    return manifest.status();
  }
  if (manifest->size() > static_cast<size_t>(model_.context) * 4) {
    return absl::DataLossError("prefix manifest longer than the model's context");
  }
  VC_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, DecodeTokens(*manifest));
  // The id is the manifest key under the registering tenant's salt: an id
  // registered by another tenant (or a forged manifest) does not match this
  // caller's key for these tokens, and answers exactly like an unknown id.
  const kvstore::ChunkKeyOptions ko = KeyOptions(salt);
  if (kvstore::PrefixManifestKey(ko, model_.model_id, tokens).Raw() != raw) return not_found;
  return tokens;
}

Task<absl::StatusOr<std::vector<bool>>> PrefixCatalogue::AwaitLookup(
    const RunnerContext& ctx, const std::vector<std::string>& keys, Clock::time_point deadline) {
  absl::StatusOr<std::vector<bool>> hits;
  (void)co_await AwaitAnswer(ctx, &hits, [&](CatalogueStore::LookupDone answer) {
    store_->StartLookup(keys, deadline, std::move(answer));
  });
  co_return hits;
}

Task<absl::StatusOr<std::string>> PrefixCatalogue::AwaitGet(const RunnerContext& ctx,
                                                            const std::string& key,
                                                            Clock::time_point deadline) {
  absl::StatusOr<std::string> value;
  (void)co_await AwaitAnswer(ctx, &value, [&](CatalogueStore::GetDone answer) {
    store_->StartGet(key, deadline, std::move(answer));
  });
  co_return value;
}

Task<absl::Status> PrefixCatalogue::AwaitPut(const RunnerContext& ctx, const std::string& key,
                                             const std::string& value, Clock::time_point deadline) {
  absl::Status status;
  (void)co_await AwaitAnswer(ctx, &status, [&](CatalogueStore::PutDone answer) {
    store_->StartPut(key, value, deadline, std::move(answer));
  });
  co_return status;
}

Task<absl::Status> PrefixCatalogue::AwaitApply(const RunnerContext& ctx,
                                               CatalogueStore::Action action,
                                               const std::string& key, const std::string& holder,
                                               Clock::time_point deadline) {
  absl::Status status;
  (void)co_await AwaitAnswer(ctx, &status, [&](CatalogueStore::ApplyDone answer) {
    store_->StartApply(action, key, holder, deadline, std::move(answer));
  });
  co_return status;
}

Task<absl::Status> PrefixCatalogue::AwaitTenantStored(const RunnerContext& ctx,
                                                      const std::string& tenant,
                                                      Clock::time_point deadline) {
  if (admission_->StoredKnown(tenant)) co_return absl::OkStatus();
  const absl::StatusOr<std::string> ledger =
      co_await AwaitGet(ctx, kvstore::TenantLedgerKey(model_.model_id, tenant).Raw(), deadline);
  StoredCharges charges;
  if (ledger.ok()) {
    absl::StatusOr<StoredCharges> decoded = DecodeTenantLedger(*ledger);
    if (decoded.ok()) {
      charges = std::move(*decoded);
    } else {
      // No tenant name in a log line (docs/security.md).
      std::fprintf(stderr, "vc-coordinator: a tenant ledger is unreadable, counted from 0: %s\n",
                   decoded.status().ToString().c_str());
    }
  } else if (ledger.status().code() != absl::StatusCode::kNotFound) {
    co_return WithCallName(ledger.status(), "store Get of the tenant ledger");
  }
  admission_->LoadStored(tenant, std::move(charges));
  co_return absl::OkStatus();
}

Task<absl::StatusOr<StoredReservation>> PrefixCatalogue::AwaitStoredBudget(
    const RunnerContext& ctx, const std::string& tenant, int32_t tokens,
    Clock::time_point deadline) {
  const absl::Status known = co_await AwaitTenantStored(ctx, tenant, deadline);
  VC_CO_RETURN_IF_ERROR(known);
  const int64_t estimate = int64_t{tokens} * model_.kv_bytes_per_token;
  absl::StatusOr<StoredReservation> reservation = admission_->ReserveStored(tenant, estimate);
  if (reservation.status().code() == absl::StatusCode::kResourceExhausted) {
    std::vector<std::string> gone;
    const std::vector<std::string> charged = admission_->PrefixesToRecheck(tenant);
    if (!charged.empty()) {
      const absl::StatusOr<std::vector<bool>> hits = co_await AwaitLookup(ctx, charged, deadline);
      if (hits.ok() && hits->size() == charged.size()) {
        for (size_t i = 0; i < charged.size(); ++i) {
          if (!(*hits)[i]) gone.push_back(charged[i]);
        }
      }
    }
    if (!gone.empty()) {
      admission_->GiveBackStored(tenant, gone);
      (void)co_await AwaitLedgerWrite(ctx, tenant, deadline);
      reservation = admission_->ReserveStored(tenant, estimate);
    }
  }
  co_return reservation;
}

Task<absl::Status> PrefixCatalogue::AwaitLedgerWrite(const RunnerContext& ctx,
                                                     const std::string& tenant,
                                                     Clock::time_point deadline) {
  // A few rounds at most: a tenant whose requests keep changing its charges
  // must not keep one of them writing for ever (the next change writes).
  constexpr int kMaxRounds = 4;
  const std::string key = kvstore::TenantLedgerKey(model_.model_id, tenant).Raw();
  absl::Status status;
  std::optional<StoredCharges> charges = admission_->BeginLedgerWrite(tenant);
  for (int round = 1; charges.has_value(); ++round) {
    status = co_await AwaitPut(ctx, key, EncodeTenantLedger(*charges), deadline);
    if (status.ok()) {
      status = co_await AwaitApply(ctx, CatalogueStore::Action::kPin, key, kTenantLedgerHolder,
                                   deadline);
    }
    if (!status.ok()) {
      std::fprintf(stderr, "vc-coordinator: a tenant ledger was not written: %s\n",
                   status.ToString().c_str());
    }
    charges = admission_->EndLedgerWrite(tenant, status.ok(), round < kMaxRounds);
  }
  co_return status;
}

Task<absl::Status> PrefixCatalogue::AwaitTenantPins(const RunnerContext& ctx,
                                                    const std::string& tenant,
                                                    Clock::time_point deadline) {
  if (admission_->PinsKnown(tenant)) co_return absl::OkStatus();
  const std::string owner = PinHolder(tenant, "");
  // One more than the quota is enough to refuse the next pin.
  const int limit = std::clamp(admission_->options().max_pins_per_tenant + 1, 1,
                               kvstore::KvStore::kMaxPinHoldersListed);
  absl::StatusOr<std::vector<std::string>> holders;
  (void)co_await AwaitAnswer(ctx, &holders, [&](CatalogueStore::PinHoldersDone answer) {
    store_->StartPinHolders(owner, limit, deadline, std::move(answer));
  });
  VC_CO_RETURN_IF_ERROR(holders.status());
  std::vector<std::string> prefix_ids;
  for (const std::string& h : *holders) {
    if (absl::StartsWith(h, owner)) prefix_ids.push_back(h.substr(owner.size()));
  }
  admission_->LoadPins(tenant, prefix_ids);
  co_return absl::OkStatus();
}

Task<absl::Status> PrefixCatalogue::AwaitAdmission(Request& r) {
  if (hooks_.admit) co_return co_await hooks_.admit(r);
  co_return admission_->Admit(
      r.tenant, [&r] { return r.gone(); }, r.deadline);
}

Task<bool> PrefixCatalogue::AwaitWorkerCheck(const RunnerContext& ctx, Worker& w,
                                             const absl::Status& s) {
  bool down = false;
  (void)co_await AwaitAnswer(ctx, &down, [&](std::function<void(bool)> answer) {
    hooks_.worker_failed(WorkerPool::kVerifier, w, s, std::move(answer));
  });
  co_return down;
}

std::vector<std::string> PrefixCatalogue::PlanKeys(const Plan& plan) {
  std::vector<std::string> keys = plan.chunk_keys;
  keys.push_back(plan.variant_key);
  return keys;
}

Task<absl::Status> PrefixCatalogue::EnsureStored(const RunnerContext& ctx, Plan& plan, Request& r) {
  if (plan.prefix_tokens == 0) co_return absl::OkStatus();
  // The chunks and the request's variant (every mode ingests both, so a
  // later request over the same prefix finds its variant too).
  const std::vector<std::string> keys = PlanKeys(plan);
  // One ingest per (prefix, variant) at a time; the others wait for it and
  // look again (a failed or narrower ingest is retried by the waiter).
  const std::string ingest_key = plan.prefix_key + "/" + Hex(plan.variant_key);
  for (int attempt = 0; attempt < 3; ++attempt) {
    VC_CO_ASSIGN_OR_RETURN(std::vector<bool> hits,
                           co_await AwaitLookup(ctx, keys, StoreDeadline(r.deadline)));
    if (AllTrue(hits)) {
      co_return absl::OkStatus();
    }
    std::shared_ptr<IngestWait> wait;
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& slot = ingesting_[ingest_key];
      if (slot == nullptr) {
        slot = std::make_shared<IngestWait>();
        mine = true;
      }
      wait = slot;
    }
    if (!mine) {
      const bool over = co_await AwaitSignal(
          ctx,
          [&](std::function<void()> signal) {
            std::unique_lock<std::mutex> lock(mu_);
            if (!wait->done) {
              wait->waiting.push_back(std::move(signal));
              return;
            }
            lock.unlock();
            signal();
          },
          std::min(r.deadline, Clock::now() + options_.rpc_timeout) + options_.rpc_timeout);
      if (!over) {
        co_return absl::DeadlineExceededError(
            "waiting for another request's ingest of this prefix");
      }
      continue;
    }
    Worker* ingest_on = nullptr;
    absl::Status status = co_await Ingest(ctx, plan, r, &ingest_on);
    std::vector<std::function<void()>> waiting;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wait->done = true;
      waiting.swap(wait->waiting);
      ingesting_.erase(ingest_key);
    }
    for (auto& signal : waiting) signal();
    // The verifier died under the ingest: look again (the prefix may be
    // stored by now) and ingest on a live one.
    bool down = false;
    if (ingest_on != nullptr && IsWorkerLost(status)) {
      down = co_await AwaitWorkerCheck(ctx, *ingest_on, status);
    }
    if (down && attempt < std::min(2, options_.max_worker_retries)) {
      if (hooks_.on_retry) hooks_.on_retry();
      continue;
    }
    co_return status;
  }
  co_return absl::UnavailableError("the prefix could not be stored (ingest kept failing)");
}

Task<absl::Status> PrefixCatalogue::Ingest(const RunnerContext& ctx, Plan& plan, Request& r,
                                           Worker** ingest_on) {
  absl::StatusOr<StoredReservation> reservation =
      co_await AwaitStoredBudget(ctx, r.tenant, plan.prefix_tokens, StoreDeadline(r.deadline));
  VC_CO_RETURN_IF_ERROR(reservation.status());
  // Ingest on the verifier this prefix is placed on.
  VC_CO_ASSIGN_OR_RETURN(*ingest_on, hooks_.place_verifier(plan.prefix_key));
  Worker& v = **ingest_on;
  pb::IngestRequest req;
  for (int32_t i = 0; i < plan.prefix_tokens; ++i) req.add_tokens(plan.prompt[i]);
  req.set_chunk_tokens(options_.chunk_tokens);
  req.set_tenant_salt(plan.req.tenant_salt());
  // The requested variant plus the configured defaults (without a
  // duplicate of it).
  std::string variants = options_.ingest_variants;
  if (!plan.req.compressor().empty()) {
    const CompressorOptions& c = plan.variant.compressor;
    std::string spec = c.name;
    auto compressor = CreateCompressor(c);
    if (compressor.ok() && (*compressor)->info().takes_ratio) absl::StrAppend(&spec, ":", c.ratio);
    if (compressor.ok() && (*compressor)->info().takes_bits && c.bits > 0) {
      absl::StrAppend(&spec, ":", c.bits);
    }
    const bool merged = ingest::ParseVariantList(absl::StrCat(spec, ",", variants)).ok();
    variants = merged ? absl::StrCat(spec, ",", variants) : spec;
  }
  req.set_variants(variants);
  req.set_draft_model_id(DraftModelRaw());
  pb::IngestResponse resp;
  const absl::Status s = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartIngest,
                                            IngestCallOptions(r), req, &resp);
  if (!s.ok()) co_return WithCallName(s, absl::StrCat("verifier ", v.address, " Ingest"));
  admission_->ChargeStored(r.tenant, plan.chunk_keys.back(), resp.bytes());
  reservation->End();
  (void)co_await AwaitLedgerWrite(ctx, r.tenant, StoreDeadline(r.deadline));
  bool has_variant = false;
  for (const auto& sv : resp.variants()) has_variant |= sv.key() == plan.variant_key;
  if (!has_variant) {
    co_return absl::InternalError(
        absl::StrCat("ingest did not produce the variant ", plan.variant.compressor.name));
  }
  plan.totals.set_ingested(true);
  co_return absl::OkStatus();
}

Clock::time_point PrefixCatalogue::StoreDeadline(Clock::time_point deadline) const {
  return std::min(deadline, Clock::now() + options_.rpc_timeout);
}

kvstore::ChunkKeyOptions PrefixCatalogue::KeyOptions(const std::string& salt) const {
  kvstore::ChunkKeyOptions ko;
  ko.chunk_tokens = options_.chunk_tokens;
  ko.numerics_version = model_.numerics_version;
  ko.tenant_salt = salt;
  return ko;
}

std::string PrefixCatalogue::DraftModelRaw() const {
  return model_.draft_model_id ? model_.draft_model_id->Raw() : std::string();
}

const kvstore::ModelId* PrefixCatalogue::DraftModel() const {
  return model_.draft_model_id ? &*model_.draft_model_id : nullptr;
}

Task<bool> PrefixCatalogue::Missing(const RunnerContext& ctx, const Plan& plan,
                                    Clock::time_point deadline) {
  const std::vector<std::string> keys = PlanKeys(plan);
  absl::StatusOr<std::vector<bool>> hits = co_await AwaitLookup(ctx, keys, StoreDeadline(deadline));
  co_return hits.ok() && !AllTrue(*hits);
}

WorkerCallOptions PrefixCatalogue::IngestCallOptions(const Request& r) const {
  // A child of the client's call: when the client cancels (or its deadline
  // passes) the ingest is cancelled too instead of running on for nobody.
  WorkerCallOptions o = CallWithin(options_.rpc_timeout * 6);
  o.parent = r.server_ctx;
  return o;
}

Task<absl::Status> PrefixCatalogue::Register(const RunnerContext& ctx, std::string salt,
                                             const pb::RegisterPrefixRequest& req, Request& r,
                                             pb::RegisterPrefixResponse* resp) {
  // Sizes first, before the tokens are copied or anything is built.
  if (req.tokens_size() >= model_.context) {
    co_return absl::InvalidArgumentError(absl::StrCat("a prefix of ", req.tokens_size(),
                                                      " tokens leaves no room in the context of ",
                                                      model_.context));
  }
  const std::string variants = req.variants().empty() ? options_.ingest_variants : req.variants();
  VC_CO_RETURN_IF_ERROR(RequestVariants(variants).status());
  VC_CO_RETURN_IF_ERROR(ValidateRegisterPrefix(
      req, {model_.vocab, model_.context, options_.chunk_tokens}, options_.ingest_variants));
  std::vector<int32_t> tokens(req.tokens().begin(), req.tokens().end());
  const kvstore::ChunkKeyOptions ko = KeyOptions(salt);
  const int32_t whole =
      static_cast<int32_t>(tokens.size()) / options_.chunk_tokens * options_.chunk_tokens;
  VC_CO_ASSIGN_OR_RETURN(
      const std::vector<kvstore::ChunkKey> keys,
      kvstore::ChunkKeysForTokens(ko, model_.model_id, absl::MakeConstSpan(tokens).first(whole)));
  const kvstore::ChunkKey manifest = kvstore::PrefixManifestKey(ko, model_.model_id, tokens);
  resp->set_prefix_id(manifest.Hex());
  resp->set_prefix_tokens(whole);
  // Keys are under the tenant's own salt: already_stored says only whether
  // this tenant stored the prefix, never whether another one did.
  std::vector<std::string> lookup;
  lookup.reserve(keys.size() + 1);
  for (const auto& k : keys) lookup.push_back(k.Raw());
  lookup.push_back(manifest.Raw());
  absl::StatusOr<std::vector<bool>> hits =
      co_await AwaitLookup(ctx, lookup, StoreDeadline(r.deadline));
  VC_CO_RETURN_IF_ERROR(hits.status());
  if (AllTrue(*hits)) {
    resp->set_already_stored(true);
    co_return absl::OkStatus();
  }
  // The ingest is admitted like a request (it holds a verifier as long as a
  // prefill) and ends when its caller goes away.
  absl::StatusOr<StoredReservation> reservation =
      co_await AwaitStoredBudget(ctx, r.tenant, whole, StoreDeadline(r.deadline));
  VC_CO_RETURN_IF_ERROR(reservation.status());
  const absl::Status admitted = co_await AwaitAdmission(r);
  VC_CO_RETURN_IF_ERROR(admitted);
  absl::StatusOr<Worker*> placed = hooks_.place_verifier(keys.back().Hex());
  if (!placed.ok()) {
    admission_->Leave(r.tenant, false);
    co_return placed.status();
  }
  Worker& v = **placed;
  pb::IngestRequest ireq;
  for (int32_t i = 0; i < whole; ++i) ireq.add_tokens(tokens[i]);
  ireq.set_chunk_tokens(options_.chunk_tokens);
  ireq.set_tenant_salt(salt);
  ireq.set_variants(variants);
  ireq.set_draft_model_id(DraftModelRaw());
  pb::IngestResponse iresp;
  const absl::Status s = co_await AwaitCall(ctx, *v.verifier, &VerifierClient::StartIngest,
                                            IngestCallOptions(r), ireq, &iresp);
  if (!s.ok()) {
    admission_->Leave(r.tenant, false);
    hooks_.worker_failed(WorkerPool::kVerifier, v,
                         WithCallName(s, absl::StrCat("verifier ", v.address, " Ingest")),
                         [](bool) {});
    co_return s;
  }
  admission_->ChargeStored(r.tenant, keys.back().Raw(), iresp.bytes());
  reservation->End();
  (void)co_await AwaitLedgerWrite(ctx, r.tenant, StoreDeadline(r.deadline));
  *resp->mutable_variants() = iresp.variants();
  // The manifest last (a registered id always names a stored prefix), and
  // while the registration still holds its place: the puts waiting on the
  // store client's threads are as many as the places.
  const absl::Status put =
      co_await AwaitPut(ctx, manifest.Raw(), EncodeTokens(tokens), StoreDeadline(r.deadline));
  admission_->Leave(r.tenant, false);
  co_return put;
}

Task<absl::Status> PrefixCatalogue::Manage(const RunnerContext& ctx, std::string salt,
                                           const pb::ManagePrefixRequest& req, Request& r,
                                           pb::ManagePrefixResponse* resp) {
  const std::string& tenant = r.tenant;
  const Clock::time_point deadline = r.deadline;
  CatalogueStore::Action action;
  switch (req.action()) {
    case pb::ManagePrefixRequest::PIN:
      action = CatalogueStore::Action::kPin;
      break;
    case pb::ManagePrefixRequest::UNPIN:
      action = CatalogueStore::Action::kUnpin;
      break;
    case pb::ManagePrefixRequest::DELETE:
      action = CatalogueStore::Action::kDelete;
      break;
    default:
      co_return absl::InvalidArgumentError("action must be PIN, UNPIN or DELETE");
  }
  const std::string variants_text =
      req.variants().empty() ? options_.ingest_variants : req.variants();
  VC_CO_ASSIGN_OR_RETURN(const std::vector<ingest::VariantSpec> variants,
                         RequestVariants(variants_text));
  // Another tenant's prefix id answers NOT_FOUND, like an unknown one.
  absl::StatusOr<std::vector<int32_t>> tokens =
      co_await AwaitTokens(ctx, req.prefix_id(), salt, deadline);
  VC_CO_RETURN_IF_ERROR(tokens.status());
  if (action == CatalogueStore::Action::kPin) {
    const absl::Status known = co_await AwaitTenantPins(ctx, tenant, StoreDeadline(deadline));
    VC_CO_RETURN_IF_ERROR(known);
    VC_CO_RETURN_IF_ERROR(admission_->CheckPin(tenant, req.prefix_id()));
  }
  if (action == CatalogueStore::Action::kDelete) {
    // What the delete gives back comes off the charges in the ledger, not
    // off charges that restarted from zero.
    const absl::Status known = co_await AwaitTenantStored(ctx, tenant, StoreDeadline(deadline));
    VC_CO_RETURN_IF_ERROR(known);
  }
  const kvstore::ChunkKeyOptions ko = KeyOptions(salt);
  const int32_t whole =
      static_cast<int32_t>(tokens->size()) / options_.chunk_tokens * options_.chunk_tokens;
  VC_CO_ASSIGN_OR_RETURN(
      const std::vector<kvstore::ChunkKey> chunks,
      kvstore::ChunkKeysForTokens(ko, model_.model_id, absl::MakeConstSpan(*tokens).first(whole)));
  std::vector<std::string> keys;
  keys.reserve(chunks.size() + variants.size());
  for (const auto& k : chunks) keys.push_back(k.Raw());
  if (!chunks.empty()) {
    for (const auto& v : variants) {
      absl::StatusOr<kvstore::ChunkKey> vk = ingest::VariantKeyFor(chunks.back(), v, DraftModel());
      if (vk.ok()) keys.push_back(vk->Raw());
    }
  }
  // Only what is stored (variants may never have been made); the manifest
  // goes last on delete so a half-done delete can be repeated.
  absl::StatusOr<std::vector<bool>> hits = co_await AwaitLookup(ctx, keys, StoreDeadline(deadline));
  VC_CO_RETURN_IF_ERROR(hits.status());
  std::vector<std::string> present;
  for (size_t i = 0; i < keys.size(); ++i) {
    if ((*hits)[i]) present.push_back(keys[i]);
  }
  present.push_back(absl::HexStringToBytes(req.prefix_id()));  // the manifest
  // The store's pins are per holder, and this prefix of this tenant is one
  // holder: a pin or unpin cut short and repeated leaves every key pinned
  // once or not at all, and prefixes that share chunks keep them pinned
  // until the last of them is unpinned.
  const std::string holder = PinHolder(tenant, req.prefix_id());
  int32_t applied = 0;
  absl::Status status;
  for (const auto& key : present) {
    // Shutdown (r.cancelled) stops between keys; a caller that goes away
    // does not stop the call (it ends within its deadline either way).
    if (r.cancelled) {
      status = absl::CancelledError("ManagePrefix stopped: the coordinator is shutting down");
      break;
    }
    const absl::Status s = co_await AwaitApply(ctx, action, key, holder, StoreDeadline(deadline));
    if (!s.ok() &&
        !(action == CatalogueStore::Action::kDelete && s.code() == absl::StatusCode::kNotFound)) {
      status = s;
      break;
    }
    ++applied;
  }
  // Cut short, the quotas stay on the safe side: a prefix counts as pinned
  // once any of its keys is (else a caller could pin keys past its quota by
  // going away mid-call), and an unpin or delete gives nothing back. A
  // delete gives back the prefix's charge (what its ingest stored), or for a
  // prefix charged among the unlisted, its full chunks' size (the variants'
  // is not known here: an estimate on the low side, erring towards refusing).
  const bool pin = action == CatalogueStore::Action::kPin;
  if (status.ok() || (pin && applied > 0)) admission_->NotePrefix(tenant, req.prefix_id(), pin);
  if (status.ok() && action == CatalogueStore::Action::kDelete && !chunks.empty()) {
    admission_->GiveBackPrefix(tenant, chunks.back().Raw(),
                               int64_t{whole} * model_.kv_bytes_per_token);
    (void)co_await AwaitLedgerWrite(ctx, tenant, StoreDeadline(deadline));
  }
  resp->set_entries(applied);
  co_return status;
}

}  // namespace vc::coordinator
