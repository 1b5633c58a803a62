// vc-drafter's gRPC service (vericache.v1.Drafter): the remote pool's side
// of the draft/verify protocol (DESIGN.md sections 3 and 7).
//
// Open fetches the request's compressed prefix variant (or, for the
// full_remote baseline, its full chunks) over the slow link, once per prefix
// while any session uses it, and starts a DraftSession. One batch thread drafts for every session
// that is below its lookahead in a single Forward call per step (continuous batching), so drafts
// are ready before the coordinator asks for them, and it keeps drafting past the window being
// verified (speculative continuation, up to
// --continuation-tokens); Commit keeps what the verifier's tokens confirm and
// rolls back the rest. Draft answers as soon as enough drafts exist, or when
// no more can be drafted, within the call's deadline. With online_update,
// Commit also folds the session's settled tokens into its compressed view
// (DraftSession's online update), so the view stays near the budget; the
// folded prefix is the session's own (charged to the arena), while the
// fetched variant stays shared by the sessions that have not folded yet.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/remote_session.h"
#include "common/engine/engine.h"
#include "common/kvstore/chunk_key.h"
#include "common/metrics/metrics.h"
#include "services/common/store_client.h"
#include "services/worker/peer_rows.h"
#include "services/worker/worker_common.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc::worker {

struct DrafterOptions {
  int max_sessions = 256;
  // Drafts kept ready past the window the coordinator asked for (x): the
  // work that speculative continuation can save. 0 disables it.
  int continuation_tokens = 8;
  int64_t arena_bytes = int64_t{1} << 30;
  int max_waiting_drafts = 1024;  // Draft calls waiting at once
  int max_open_queue = 256;       // Open calls waiting for their fetch
  std::chrono::seconds session_idle{120};
  std::string data_plane = "tcp";
  // 0: the engine's model's, NumericsVersionFor(config) (what chunk keys,
  // seals and Info carry; the coordinator refuses a worker whose version
  // differs from the first worker's).
  uint32_t numerics_version = 0;
  // Set when the engine runs a separate draft model (--draft-model): the
  // target's config, which Info reports (vocabulary, context, stop ids) and
  // whose context bounds sessions (the draft model's KV extends past its
  // trained length, as in one process). Sessions then fetch the variants
  // made from the draft model's prefill (keyed with draft_model_id), and
  // take no KV refresh: the verifier's rows are another model's, so
  // rejected rows are rolled back and accepted tokens re-run here.
  const ModelConfig* target_config = nullptr;
  kvstore::ModelId draft_model_id{};
  // Fetching the refresh rows a verifier's peer Commit names (its kind and
  // TLS are the cluster's data plane's).
  PeerRowsFetcherOptions peer_rows;
};

class DrafterService final : public vericache::v1::Drafter::CallbackService {
 public:
  DrafterService(Engine* engine, const kvstore::ModelId& model_id, daemon::StoreClient* store,
                 metrics::Registry* registry, const DrafterOptions& options);
  ~DrafterService() override;
  void Shutdown();

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx,
                                 const vericache::v1::WorkerInfoRequest* req,
                                 vericache::v1::WorkerInfoResponse* resp) override;
  grpc::ServerUnaryReactor* Open(grpc::CallbackServerContext* ctx,
                                 const vericache::v1::DrafterOpenRequest* req,
                                 vericache::v1::DrafterOpenResponse* resp) override;
  grpc::ServerUnaryReactor* Draft(grpc::CallbackServerContext* ctx,
                                  const vericache::v1::DraftRequest* req,
                                  vericache::v1::DraftResponse* resp) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx,
                                   const vericache::v1::CommitRequest* req,
                                   vericache::v1::CommitResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const vericache::v1::ReleaseRequest* req,
                                    vericache::v1::ReleaseResponse* resp) override;

 private:
  struct Session;
  struct SharedVariant;
  struct Waiter;
  struct OpenJob;

  void BatchLoop();
  void OpenLoop();
  void RunOpen(OpenJob& job);
  // mu_ held: answers waiters that can be answered (or have expired).
  void ServeWaiters();
  // mu_ held: takes `req`'s drafts for `w` (a Draft, or a Commit's next
  // round): checks its round, then queues `w` and answers it if it can.
  absl::Status QueueDraftWaiter(const vericache::v1::DraftRequest& req, Waiter w);
  void ReapIdleSessions();
  void UpdateGauges();

  Engine* engine_;
  // The engine's model's config; with a separate draft model, its context
  // is the target's (DrafterOptions::target_config).
  ModelConfig config_;
  kvstore::ModelId model_id_;
  daemon::StoreClient* store_;
  DrafterOptions options_;
  KvArena arena_;

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable open_cv_;
  bool stopping_ = false;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::vector<Waiter> waiters_;
  // Prefixes fetched for live sessions, by variant key / last chunk key:
  // requests over one prefix share one fetch and one copy.
  std::map<std::string, std::weak_ptr<const SharedVariant>> variant_cache_;
  std::map<std::string, std::weak_ptr<const PagedKvCache>> full_cache_;
  std::deque<OpenJob> open_queue_;
  // Sessions of Opens queued or running, and those of them released before
  // the Open finished: the caller gave up on the Open (it timed out) and
  // released the session, so the Open must not open it when its fetch
  // completes. Both bounded by the open queue.
  std::multiset<uint64_t> opening_;
  std::set<uint64_t> released_while_opening_;
  std::thread batcher_;
  std::thread opener_;
  double step_seconds_ewma_ = 0;  // guarded by mu_

  PeerRowsFetcher peer_rows_;

  WorkerMetrics metrics_;  // the vericache_worker_* children of this role
  metrics::Counter* continuation_hits_;
  metrics::Counter* rolled_back_;
  metrics::Counter* online_folds_;
};

}  // namespace vc::worker
