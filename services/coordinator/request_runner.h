// One Generate request as the coordinator runs it, and the runners that
// decode it, one per mode, over the worker-client interface (worker_client.h):
//  * RunVeriCache (vericache): open the drafter once the prefix it fetches
//    (the compressed variant) has its slot on the slow link; per round,
//    book the verify on the ring scheduler (SlotClock: the prefix's reload
//    on the fast link and the verifier's memory, or join another request's
//    pending verify of the same prefix), Load at its slot, take the
//    drafts, Verify, stream the accepted tokens, book their exact K/V (KV
//    refresh) on the slow link and Commit them with it to the drafter at
//    the booked slot, adapt x; a drafter that fails or whose acceptance
//    collapses is dropped for RunFullLocal on the same verifier session
//    (fallback).
//  * RunFullLocal (full_local, and fallback): the verifier decodes alone
//    with the prefix resident.
//  * RunRemote (full_remote, lossy_remote): the drafter decodes alone, on
//    the full prefix fetched over the slow link or on its compressed variant
//    (lossy_remote is NOT lossless); that fetch is booked on the slow link
//    before the Open, as in vericache mode.
// The runners own the round loop and nothing else: placement, admission,
// retries on other workers and session releases at the end belong to the
// service around them, which reaches in through RunnerContext's hooks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "common/base/executor.h"
#include "common/base/task.h"
#include "common/compress/compressor.h"
#include "common/ingest/prefix_ingest.h"
#include "common/metrics/metrics.h"
#include "common/speculative/accept_rule.h"
#include "services/coordinator/slot_clock.h"
#include "services/coordinator/worker_client.h"
#include "services/coordinator/worker_health.h"
#include "vericache/v1/coordinator.pb.h"

namespace vc::coordinator {

using Clock = std::chrono::steady_clock;

// One worker of a pool as the coordinator holds it.
struct Worker {
  std::string address;
  // One of the two, by the worker's pool.
  std::unique_ptr<VerifierClient> verifier;
  std::unique_ptr<DrafterClient> drafter;
  WorkerClient& client() { return verifier ? static_cast<WorkerClient&>(*verifier) : *drafter; }
  std::atomic<int> active{0};  // sessions open on it (drafter placement)
  int index = 0;
};

struct Sink;

// A request's identity and lifetime (what GetRequest and Cancel see).
struct Request {
  std::string id;
  std::string tenant;
  // The client's call, when there is one (not for shadow checks): calls made
  // on its behalf that may run long (ingest) are cancelled with it.
  const grpc::ServerContextBase* server_ctx = nullptr;
  // A Generate (counted in completed_requests), or a prefix registration
  // that only borrows an admission place.
  bool is_generate = true;
  vericache::v1::Mode mode = vericache::v1::MODE_VERICACHE;
  std::atomic<bool> cancelled{false};
  std::string state = "queued";
  // The client's stream, while the request is queued or running (under the
  // coordinator's mu_, like state): a Cancel abandons it when its writes
  // wait for room.
  Sink* sink = nullptr;
  // While queued for admission: its ticket (AdmissionController::Ticket),
  // so that a Cancel or the client going away wakes this request alone.
  // Under the coordinator's mu_, like state.
  uint64_t admission_ticket = 0;
  std::string error;
  std::atomic<int64_t> generated{0};
  Clock::time_point start;
  Clock::time_point deadline = Clock::time_point::max();
  // True once the client has gone away (cancelled call).
  std::function<bool()> client_gone = [] { return false; };
  bool gone() const { return cancelled || client_gone(); }
};

// Where a request's messages go: the client's stream, or nowhere (the
// shadow check). Write returns false when the receiver is gone; it may wait
// for room (a bounded queue behind a slow reader), which the runners await
// first (AwaitWritable), so that a request behind a slow reader holds no
// thread. The defaults: a sink that never waits.
struct Sink {
  virtual ~Sink() = default;
  virtual bool Write(const vericache::v1::GenerateResponse& msg) = 0;
  // True when a Write now would not wait (or would fail at once).
  virtual bool Writable() { return true; }
  // Calls `ready` once Writable would be true: at once, on this thread, if
  // it is now; otherwise on the thread that makes room or ends the stream. A
  // later call replaces an earlier `ready` not called yet; `ready` must be
  // quick and may outlive the wait it was for.
  virtual void WhenWritable(std::function<void()> ready) { ready(); }
  // Stops waiting for a reader that stopped reading: the stream ends (its
  // client sees it cancelled), every later Write answers false at once and
  // a WhenWritable waiter is told. For a request cancelled while its
  // messages wait for room, which would otherwise wait until the stream's
  // write timeout.
  virtual void Abandon() {}
};

// What a request decodes and how far it got.
struct Plan {
  vericache::v1::GenerateRequest req;
  std::vector<int32_t> prompt;
  int32_t prefix_tokens = 0;
  std::vector<std::string> chunk_keys;  // raw
  std::string prefix_key;               // hex of the last chunk key ("" if none)
  ingest::VariantSpec variant;
  std::string variant_key;  // raw
  int x = 8;
  double accept_ewma = -1;
  bool adaptive = false;
  // Placement and sessions.
  Worker* verifier = nullptr;
  Worker* drafter = nullptr;
  uint64_t session = 0;
  bool verifier_open = false;
  bool drafter_open = false;
  // Peer rounds: the drafter session's epoch (new at every drafter Open,
  // unique in this process) and the last round's id in it.
  uint64_t drafter_epoch = 0;
  uint64_t round_id = 0;
  // Drafts the drafter held ready after the last commit (its surviving
  // drafts): the next verify is booked for the rest only.
  int32_t drafts_ready = 0;
  // Output.
  std::vector<int32_t> output;
  bool stopped_at_eos = false;
  vericache::v1::GenerateTotals totals;
  // Acceptance collapse (rounds with at least two drafts): common/speculative's
  // one fallback rule, with the coordinator's window and minimum.
  FallbackPolicy fallback{FallbackOptions{}};
  bool first_token_sent = false;
  Clock::time_point first_token_time;
  // Output tokens already folded into `prompt` by a retry on other workers.
  size_t resumed = 0;
  bool healed = false;  // PrepareHeal ran once
};

// The exact sizes of compressed variants as drafters reported fetching them
// (DrafterOpenResponse.prefix_bytes), by variant key: a key names one
// immutable blob (prefix, compressor, model, tenant salt), so a later Open
// of it books exactly what it fetches instead of an estimate. Bounded: past
// max_entries the oldest entry is forgotten. Thread-safe.
class VariantSizes {
 public:
  explicit VariantSizes(size_t max_entries = 4096) : max_entries_(max_entries) {}
  std::optional<int64_t> Get(const std::string& variant_key) const;
  void Note(const std::string& variant_key, int64_t bytes);

 private:
  const size_t max_entries_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> sizes_;
  std::deque<std::string> order_;  // keys of sizes_, oldest first
};

// The bytes of a compressed variant made with `variant` from a prefix whose
// full K/V is `full_bytes`, before any drafter has reported its size: the
// kept fraction (`ratio`; 1 for a pure quantiser) times the code width
// relative to 16-bit rows (`bits`, or the quantiser's default bits, over
// 16; 1 for a method that quantises nothing). The
// stored layout (kept positions, quantiser scales, a composite sizing its
// ratio as f32) moves the real size a little either way; for a model with
// f32 rows, or a draft model smaller than the target, it over-states.
int64_t EstimateVariantBytes(int64_t full_bytes, const CompressorOptions& variant);

struct RunnerOptions {
  // Adaptive x is kept within [1, max_draft_len].
  int max_draft_len = 32;
  bool kv_refresh = true;
  // vericache rounds worker to worker (Verifier.Round), or relayed here.
  bool peer_rounds = false;
  // With peer_rounds: the rounds granted on one Verifier.Lease stream per
  // request, the next granted while the one before runs (no call of the
  // coordinator's between rounds), instead of one Round call each.
  bool leases = false;
  int baseline_chunk = 16;  // tokens per Draft call in the remote baselines
  std::chrono::milliseconds rpc_timeout{10000};
};

// The runners' metrics (any may be null: unit tests).
struct RunnerMetrics {
  metrics::HistogramFamily* ttft = nullptr;  // by mode
  metrics::Histogram* accepted_per_round = nullptr;
  metrics::Counter* wasted = nullptr;
  metrics::Counter* rounds = nullptr;
  metrics::Counter* fallbacks = nullptr;
  metrics::Counter* scheduler_queued = nullptr;
};

struct RunnerContext {
  RunnerOptions options;
  SlotClock* clock = nullptr;
  // Where a runner continues after a wait; required.
  Executor* executor = nullptr;
  // The ids that end generation (the workers').
  std::vector<int32_t> eos_ids = {2};
  int64_t kv_bytes_per_token = 0;
  // The drafters' separate draft model (ShortModelId; empty: the target),
  // reported in the totals.
  std::string draft_model;
  // Sizes of the variants drafters have fetched (booked on the slow link at
  // their next Open); never null unless a caller sets it so.
  std::shared_ptr<VariantSizes> variant_sizes = std::make_shared<VariantSizes>();
  RunnerMetrics metrics;
  // Hooks into the service (unset: no-ops). A call to `w` failed with `s`:
  // the service probes it now (without holding the caller's thread) and
  // marks it down if it is gone; `done(down)` is told the verdict, once, on
  // any thread (the runners do not wait for it).
  std::function<void(WorkerPool pool, Worker& w, const absl::Status& s,
                     std::function<void(bool down)> done)>
      worker_failed;
  // Starts the release of a session; `done` is told how it went, once, on
  // any thread (a failed release is queued for a retry off the request path
  // before `done` is called).
  std::function<void(WorkerPool pool, Worker& w, uint64_t session, CallDone done)> release;
  // A drafter's measured step time (auto slot).
  std::function<void(double step_seconds)> calibrate;
  // The scheduler's bookings changed.
  std::function<void()> update_gauges;

  // The options of one call on `r`'s behalf: the earlier of its deadline and
  // rpc_timeout from now.
  WorkerCallOptions CallOptions(const Request& r) const;
};

// A worker call started by `start(done)`, awaited without holding a
// thread: the caller is suspended until `done` has its status and continues
// on ctx.executor.
Task<absl::Status> AwaitStartedCall(const RunnerContext& ctx,
                                    std::function<void(CallDone done)> start);

// `(client.*start)(o, req, resp, done)`, a call of worker_client.h's Start*
// kind, awaited as AwaitStartedCall; `client`, `req` and `resp` must outlive
// the task (co_await it at once). (Not a coroutine itself: clang 14 with
// ASan failed to assemble template coroutines, "Cannot represent a
// difference across sections".)
template <typename Client, typename Req, typename Resp>
Task<absl::Status> AwaitCall(const RunnerContext& ctx, Client& client,
                             void (Client::*start)(const WorkerCallOptions&, const Req&, Resp*,
                                                   CallDone),
                             const WorkerCallOptions& o, const Req& req, Resp* resp) {
  return AwaitStartedCall(ctx, [&client, start, o, &req, resp](CallDone done) {
    (client.*start)(o, req, resp, std::move(done));
  });
}

// `start(answer)` begins something that calls `answer(value)` once, on any
// thread (a store read, a worker check); awaited as AwaitStartedCall, with
// the value in *out once resumed. `out` must outlive the task (co_await it
// at once). (A plain template, as AwaitCall.)
template <typename T>
Task<absl::Status> AwaitAnswer(
    const RunnerContext& ctx, T* out,
    std::type_identity_t<std::function<void(std::function<void(T)> answer)>> start) {
  return AwaitStartedCall(ctx, [out, start = std::move(start)](CallDone done) {
    start([out, done = std::move(done)](T value) {
      *out = std::move(value);  // read once resumed: the executor's queue orders it
      done(absl::OkStatus());
    });
  });
}

// Suspends the caller until a signal or `wake` (or the clock's Stop),
// whichever comes first; it continues on ctx.executor. `arm(signal)` hands
// `signal` to whatever will give it: it may be called from any thread, at
// once (inside `arm`), more than once, and after the wait has ended (to no
// effect). True when the signal came first.
Task<bool> AwaitSignal(const RunnerContext& ctx,
                       const std::function<void(std::function<void()> signal)>& arm,
                       Clock::time_point wake);

// Suspends the caller until `writer` is Writable, or until r's deadline
// (false); it continues on ctx.executor. Only one coroutine writes to a
// sink, so a Write right after it does not wait for room.
Task<bool> AwaitWritable(const RunnerContext& ctx, const Request& r, Sink* writer);

// Releases `session` on `w` through ctx.release (OK without one), awaited as
// AwaitStartedCall: the request's thread is not held while the worker
// answers. The status is the release's (a failed one is already queued for a
// retry off the request path).
Task<absl::Status> ReleaseSession(const RunnerContext& ctx, WorkerPool pool, Worker& w,
                                  uint64_t session);

// The runners are coroutines (common/base/task.h): a request waiting for a
// slot, for its lease's next message, for a worker's answer (the Start*
// calls of worker_client.h, each bounded by rpc_timeout), for a release or
// for room to write to its client is suspended and holds no thread; it
// continues on ctx.executor. `ctx`, `plan`, `r` and `sink` must outlive the
// task.
//
// vericache mode; falls back to RunFullLocal on the same verifier session.
Task<absl::Status> RunVeriCache(const RunnerContext& ctx, Plan& plan, Request& r, Sink* sink);
// full_local mode, and the fallback (`already_open`: the verifier session of
// a vericache run, now loaded resident).
Task<absl::Status> RunFullLocal(const RunnerContext& ctx, Plan& plan, Request& r, Sink* sink,
                                bool already_open);
// full_remote and lossy_remote modes.
Task<absl::Status> RunRemote(const RunnerContext& ctx, Plan& plan, Request& r, Sink* sink);

}  // namespace vc::coordinator
