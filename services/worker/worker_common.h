// Pieces vc-verifier and vc-drafter share: request validation into the
// session types, the Info answer, the worker metric families, and finishing
// a callback-API call with an absl::Status.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster/remote_session.h"
#include "common/kvstore/chunk_key.h"
#include "common/metrics/metrics.h"
#include "common/transport/data_plane.h"
#include "grpcpp/grpcpp.h"
#include "vericache/v1/worker.pb.h"

namespace vc::worker {

// Finishes `ctx`'s default reactor with `status` and returns it.
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& status);

struct PrefixRequest {
  int32_t tokens = 0;
  std::vector<std::string> chunk_keys;  // raw 32-byte keys
};
// Checks a request's stored-prefix reference against its prompt and model:
// 32-byte keys, prefix_tokens = keys x a chunk size that divides it, at most
// prompt length - 1, and at most the context. InvalidArgument otherwise.
absl::StatusOr<PrefixRequest> ValidatePrefix(const vericache::v1::PrefixRef& prefix,
                                             const std::vector<int32_t>& prompt,
                                             const ModelConfig& config);

// The largest tenant salt a worker takes (the coordinator's limit,
// coordinator_service.h kMaxTenantSaltBytes; its derived salts are 32 bytes).
inline constexpr size_t kMaxTenantSaltBytes = 64;
// InvalidArgument if `salt` is longer than kMaxTenantSaltBytes.
absl::Status ValidateTenantSalt(const std::string& salt);

// A draft distribution on the wire keeps only its non-zero entries (top-k /
// top-p leave few); FromDraftDistributions rebuilds each one's dense vector
// of `vocab_size` entries, InvalidArgument for ids outside the vocabulary,
// unsorted or repeated ids, or mismatched lengths.
void ToDraftDistribution(const std::vector<double>& q, vericache::v1::DraftDistribution* out);
absl::StatusOr<std::vector<std::vector<double>>> FromDraftDistributions(
    const google::protobuf::RepeatedPtrField<vericache::v1::DraftDistribution>& wire,
    int32_t vocab_size);

// The Info answer: identity, model facts, load, and the data plane's counters.
// `draft_model_id`: the worker's separate draft model (null: none).
void FillWorkerInfo(const std::string& role, const ModelConfig& config,
                    const kvstore::ModelId& model_id, uint32_t numerics_version,
                    const std::string& data_plane, int32_t sessions, int64_t kv_bytes,
                    const transport::ClientStats& data, vericache::v1::WorkerInfoResponse* out,
                    const kvstore::ModelId* draft_model_id = nullptr);

// The vericache_worker_* families, children for `role`.
struct WorkerMetrics {
  metrics::Gauge* sessions;
  metrics::Gauge* kv_device;
  metrics::Gauge* kv_transient;
  metrics::Histogram* forward_seconds;
  metrics::Histogram* fetch_seconds;
  metrics::Counter* fetch_bytes_full;        // full chunks
  metrics::Counter* fetch_bytes_compressed;  // compressed variants
  metrics::Counter* prefix_loads;
};
WorkerMetrics RegisterWorkerMetrics(metrics::Registry* registry, const std::string& role);

}  // namespace vc::worker
