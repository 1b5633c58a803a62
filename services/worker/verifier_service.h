// vc-verifier's gRPC service (vericache.v1.Verifier): the local pool's side
// of the draft/verify protocol (DESIGN.md sections 3 and 7).
//
// Per request it keeps a VerifySession (the exact K/V of the suffix and the
// accepted output). The prefix's full K/V is fetched from vc-kvstore over
// the fast link when the coordinator says its reload begins (Load), attached
// for the verify pass, and dropped after it, unless the session is resident
// (plain full-KV decoding). With prefix-aware verification, requests over
// the same stored prefix share one loaded copy: loaded once, verified in the
// same pass when they are due together.
//
// One batch thread runs every Forward call (the engine is single-threaded):
// verify jobs that arrive within the gather window form one pass; ingest
// jobs (prefill a prefix, store its chunks and variants) run between passes.
// Loader threads fetch prefixes. Every queue is bounded; idle sessions are
// reaped, so a coordinator that dies frees its KV here too.
//
// Peer rounds (Round): the verifier takes a round's drafts from the
// drafter itself (an asynchronous Drafter.Draft), verifies them in its next
// pass like any Verify, leaves the refresh rows in its PeerRowsOutbox and
// commits to the drafter (Drafter.Commit naming them), at the slow-link
// slot the coordinator booked; only then does the Round answer. No thread
// waits on a peer: the calls are asynchronous and the slot is an alarm.
//
// Leases (Lease): the same rounds granted on one stream per session; each
// starts as soon as the one before has committed and its grant is here, so
// the coordinator makes no call between rounds (worker.proto LeaseGrant).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
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
#include "common/rpc/rpc.h"
#include "grpcpp/alarm.h"
#include "services/common/store_client.h"
#include "services/worker/peer_rows.h"
#include "services/worker/worker_common.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc::worker {

struct VerifierOptions {
  int max_sessions = 256;
  bool prefix_aware = true;
  // Bytes of KV this worker holds: transient prefixes plus session tails.
  int64_t arena_bytes = int64_t{1} << 30;
  int max_batch_requests = 64;
  // How long the batch thread waits for more due verifies after the first.
  std::chrono::microseconds gather{2000};
  int max_queued_jobs = 1024;
  int loader_threads = 2;
  // Sessions untouched this long are released (their coordinator is gone).
  std::chrono::seconds session_idle{120};
  std::string data_plane = "tcp";
  // 0: the engine's model's, NumericsVersionFor(config) (what chunk keys,
  // seals and Info carry; the coordinator refuses a worker whose version
  // differs from the first worker's).
  uint32_t numerics_version = 0;
  // A separate draft model (--draft-model), used only to make its prefix
  // variants at ingest (IngestRequest.draft_model_id), never to verify:
  // null when the pool's drafters run the target. Must outlive the service.
  Engine* draft_engine = nullptr;
  kvstore::ModelId draft_model_id{};
  // Peer rounds: where the refresh rows wait for their drafter (null:
  // Round is refused with FailedPrecondition; must outlive the service),
  // and the calls to drafters: their TLS (this worker's certificate), the
  // largest message, the deadline cap (the Round's own deadline is earlier
  // when it is), and how many drafters' channels are held at once.
  PeerRowsOutbox* peer_rows = nullptr;
  rpc::TlsFiles peer_tls;
  int peer_max_message_bytes = 64 << 20;
  std::chrono::milliseconds peer_timeout{10000};
  int max_peer_channels = 64;
  // Test seam (null in the daemon): called in Open once the session is
  // built, just before it is kept, so that a test can hold an Open there
  // until its caller has given up.
  std::function<void(grpc::CallbackServerContext*)> before_open_kept;
};

class VerifierService final : public vericache::v1::Verifier::CallbackService {
 public:
  // `engine` and `store` must outlive the service; `registry` gets the
  // vericache_worker_* families (role="verifier").
  VerifierService(Engine* engine, const kvstore::ModelId& model_id, daemon::StoreClient* store,
                  metrics::Registry* registry, const VerifierOptions& options);
  ~VerifierService() override;

  // Fails queued jobs with Unavailable and stops the threads (drain).
  void Shutdown();

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx,
                                 const vericache::v1::WorkerInfoRequest* req,
                                 vericache::v1::WorkerInfoResponse* resp) override;
  grpc::ServerUnaryReactor* Open(grpc::CallbackServerContext* ctx,
                                 const vericache::v1::VerifierOpenRequest* req,
                                 vericache::v1::VerifierOpenResponse* resp) override;
  grpc::ServerUnaryReactor* Load(grpc::CallbackServerContext* ctx,
                                 const vericache::v1::LoadRequest* req,
                                 vericache::v1::LoadResponse* resp) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* ctx,
                                   const vericache::v1::VerifyRequest* req,
                                   vericache::v1::VerifyResponse* resp) override;
  grpc::ServerUnaryReactor* Round(grpc::CallbackServerContext* ctx,
                                  const vericache::v1::RoundRequest* req,
                                  vericache::v1::RoundResponse* resp) override;
  grpc::ServerBidiReactor<vericache::v1::LeaseGrant, vericache::v1::LeaseProgress>* Lease(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const vericache::v1::ReleaseRequest* req,
                                    vericache::v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* Ingest(grpc::CallbackServerContext* ctx,
                                   const vericache::v1::IngestRequest* req,
                                   vericache::v1::IngestResponse* resp) override;

 private:
  struct Prefix;
  struct Session;
  struct Job;
  struct RoundCall;
  class LeaseReactor;

  void BatchLoop();
  // A Round's (or lease grant's) fields, checked before anything runs.
  absl::Status CheckRound(const vericache::v1::RoundRequest& req) const;
  // Marks the round's session used and, with req.load, pins its prefix;
  // `hold` keeps that pin past the session's current verify (a lease grant
  // that arrived ahead of its round: DropLeaseHold gives it back).
  absl::Status TouchRoundSession(const vericache::v1::RoundRequest& req, bool hold);
  void DropLeaseHold(uint64_t session_id);
  // Starts `call` (req, ctx, resp and finish set): tracks it and sends its
  // Draft to the drafter; `deadline` is the end of the caller's budget.
  absl::Status StartRound(const std::shared_ptr<RoundCall>& call,
                          std::chrono::system_clock::time_point deadline);
  // The steps of a Round, each run when the one before completes.
  void OnPeerDraft(const std::shared_ptr<RoundCall>& call, const grpc::Status& status);
  void OnRoundVerified(const std::shared_ptr<RoundCall>& call, const absl::Status& status);
  void StartPeerCommit(const std::shared_ptr<RoundCall>& call);
  void OnPeerCommit(const std::shared_ptr<RoundCall>& call, const grpc::Status& status);
  void FinishRound(const std::shared_ptr<RoundCall>& call, const absl::Status& status);
  // A round, counted until it is deleted (Shutdown waits for that).
  std::shared_ptr<RoundCall> NewRoundCall();
  // A stub for the drafter at `address` (channels cached, bounded).
  std::shared_ptr<vericache::v1::Drafter::Stub> PeerStub(const std::string& address);
  // Enqueues a verify job; the caller finishes it on error.
  absl::Status EnqueueVerify(Job job, grpc::ServerUnaryReactor** reactor);
  void LoaderLoop();
  // mu_ held. Pins the session's prefix (loading it if needed); true if it
  // was already loaded.
  bool PinPrefix(Session& s);
  void UnpinPrefix(Session& s);
  void RunVerifies(std::vector<Job>& jobs);
  void RunIngest(Job& job);
  void ReapIdleSessions();
  void UpdateGauges();

  Engine* engine_;
  const ModelConfig& config_;
  kvstore::ModelId model_id_;
  daemon::StoreClient* store_;
  VerifierOptions options_;
  KvArena arena_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // batch thread: jobs or a finished load
  std::condition_variable load_cv_;  // loader threads
  bool stopping_ = false;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::map<std::string, std::shared_ptr<Prefix>> prefixes_;  // by table key
  std::deque<std::shared_ptr<Prefix>> load_queue_;
  std::deque<Job> jobs_;
  std::vector<std::thread> loaders_;
  std::thread batcher_;

  // Rounds between their start and their answer (Shutdown waits for them:
  // their peer calls and alarm call back into this service).
  std::mutex rounds_mu_;
  std::condition_variable rounds_cv_;
  std::set<std::shared_ptr<RoundCall>> rounds_;  // in flight (Shutdown cancels their calls)
  int live_round_calls_ = 0;                     // made by NewRoundCall and not yet deleted
  std::map<std::string, std::shared_ptr<vericache::v1::Drafter::Stub>> peer_stubs_;  // rounds_mu_

  WorkerMetrics metrics_;  // the vericache_worker_* children of this role
  metrics::Histogram* batch_requests_;
  metrics::Counter* prefix_shared_;
  metrics::Counter* ingests_cancelled_;
  metrics::Counter* peer_rounds_;
  metrics::Counter* peer_refresh_bytes_;
  metrics::Counter* peer_drafts_with_commit_;
};

}  // namespace vc::worker
