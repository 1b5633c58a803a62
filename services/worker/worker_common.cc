#include "services/worker/worker_common.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/rpc.h"
#include "services/common/daemon.h"

namespace vc::worker {

namespace pb = ::vericache::v1;

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

absl::Status ValidateTenantSalt(const std::string& salt) {
  if (salt.size() > kMaxTenantSaltBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant_salt is ", salt.size(), " bytes, the limit is ", kMaxTenantSaltBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<PrefixRequest> ValidatePrefix(const pb::PrefixRef& prefix,
                                             const std::vector<int32_t>& prompt,
                                             const ModelConfig& config) {
  PrefixRequest out;
  out.tokens = prefix.prefix_tokens();
  const int keys = prefix.chunk_keys_size();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt.size(),
                                                   " tokens, more than the context length ",
                                                   config.max_seq_len));
  }
  if (out.tokens < 0 || (keys == 0) != (out.tokens == 0) ||
      (keys > 0 && out.tokens % keys != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("prefix of ", out.tokens, " tokens in ", keys,
                                                   " chunks is not a whole number of chunks"));
  }
  if (out.tokens > static_cast<int32_t>(prompt.size()) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stored prefix of ", out.tokens, " tokens leaves no suffix token of the ", prompt.size(),
        "-token prompt"));
  }
  for (int i = 0; i < keys; ++i) {
    if (prefix.chunk_keys(i).size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat("chunk_keys[", i, "] has ",
                                                     prefix.chunk_keys(i).size(),
                                                     " bytes, expected 32"));
    }
    out.chunk_keys.push_back(prefix.chunk_keys(i));
  }
  return out;
}

void ToDraftDistribution(const std::vector<double>& q, pb::DraftDistribution* out) {
  for (size_t t = 0; t < q.size(); ++t) {
    if (q[t] == 0) continue;
    out->add_tokens(static_cast<int32_t>(t));
    out->add_probs(q[t]);
  }
}

namespace {

absl::StatusOr<std::vector<double>> FromDraftDistribution(const pb::DraftDistribution& d,
                                                          int32_t vocab_size) {
  if (d.tokens_size() != d.probs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("draft distribution has ", d.tokens_size(),
                                                   " tokens but ", d.probs_size(),
                                                   " probabilities"));
  }
  std::vector<double> q(static_cast<size_t>(vocab_size), 0.0);
  int32_t previous = -1;
  for (int i = 0; i < d.tokens_size(); ++i) {
    const int32_t t = d.tokens(i);
    if (t <= previous || t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "draft distribution token ", t, " is out of order or outside the vocabulary [0, ",
          vocab_size, ")"));
    }
    q[static_cast<size_t>(t)] = d.probs(i);
    previous = t;
  }
  return q;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<double>>> FromDraftDistributions(
    const google::protobuf::RepeatedPtrField<pb::DraftDistribution>& wire, int32_t vocab_size) {
  std::vector<std::vector<double>> dense;
  dense.reserve(static_cast<size_t>(wire.size()));
  for (int i = 0; i < wire.size(); ++i) {
    absl::StatusOr<std::vector<double>> q = FromDraftDistribution(wire.Get(i), vocab_size);
    if (!q.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("draft ", i, ": ", q.status().message()));
    }
    dense.push_back(*std::move(q));
  }
  return dense;
}

void FillWorkerInfo(const std::string& role, const ModelConfig& config,
                    const kvstore::ModelId& model_id, uint32_t numerics_version,
                    const std::string& data_plane, int32_t sessions, int64_t kv_bytes,
                    const transport::ClientStats& data, pb::WorkerInfoResponse* out,
                    const kvstore::ModelId* draft_model_id) {
  out->set_role(role);
  if (draft_model_id != nullptr) out->set_draft_model_id(draft_model_id->Raw());
  out->set_model_id(model_id.Raw());
  out->set_vocab_size(config.vocab_size);
  out->set_context_length(config.max_seq_len);
  out->set_kv_bytes_per_token(config.kv_bytes_per_token());
  out->set_bos_id(config.bos_id);
  out->set_eos_id(config.eos_id);
  for (const int32_t id : config.eos_ids) out->add_eos_ids(id);
  out->set_numerics_version(numerics_version);
  out->set_data_plane(data_plane);
  out->set_sessions(sessions);
  out->set_kv_bytes(kv_bytes);
  out->set_data_plane_bytes(data.bytes);
  out->set_data_plane_transport_bytes(data.transport_bytes);
  out->set_data_plane_fetches(data.fetches);
}

WorkerMetrics RegisterWorkerMetrics(metrics::Registry* registry, const std::string& role) {
  WorkerMetrics m;
  m.sessions = &daemon::MustGauge(registry, "vericache_worker_sessions",
                                  "Request sessions held by the worker.", {"role"})
                    ->Labels({role});
  auto* kv = daemon::MustGauge(registry, "vericache_worker_kv_bytes",
                               "KV bytes held by the worker, by tier (device: sessions' own "
                               "KV; transient: full prefixes loaded for verification).",
                               {"role", "tier"});
  m.kv_device = &kv->Labels({role, "device"});
  m.kv_transient = &kv->Labels({role, "transient"});
  m.forward_seconds = &daemon::MustHistogram(registry, "vericache_worker_forward_seconds",
                                             "Seconds per forward pass (one batch).", {"role"},
                                             daemon::SecondsBuckets())
                           ->Labels({role});
  m.fetch_seconds = &daemon::MustHistogram(registry, "vericache_worker_fetch_seconds",
                                           "Seconds per KV fetch from the store.", {"role"},
                                           daemon::SecondsBuckets())
                         ->Labels({role});
  auto* fetched = daemon::MustCounter(registry, "vericache_worker_fetch_bytes_total",
                                      "KV bytes fetched from the store, by variant (full chunks "
                                      "or compressed variants).",
                                      {"role", "variant"});
  m.fetch_bytes_full = &fetched->Labels({role, "full"});
  m.fetch_bytes_compressed = &fetched->Labels({role, "compressed"});
  m.prefix_loads = &daemon::MustCounter(registry, "vericache_prefix_loads_total",
                                        "Prefix KV loads from the store.", {"role"})
                        ->Labels({role});
  return m;
}

}  // namespace vc::worker
