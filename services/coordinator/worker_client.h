// The calls the coordinator makes on its workers (vericache.v1.Verifier and
// vericache.v1.Drafter), behind a narrow interface: the request runners and
// the prefix catalogue see only these, so their unit tests run on fake
// workers while the daemon runs on the gRPC implementation below.
//
// A failed call returns the worker's code and message as they came (no
// prefix); WithCallName adds "verifier HOST:PORT Open: " where the caller
// reports it, so a fake and the real worker fail alike.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rpc/rpc.h"
#include "vericache/v1/worker.pb.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace vc::coordinator {

struct WorkerCallOptions {
  // Every call has one (a worker that stops answering fails the call).
  std::chrono::steady_clock::time_point deadline;
  // Wait within the deadline for a reconnecting channel instead of failing
  // at once (the background release retries).
  bool wait_for_ready = false;
  // The client call this one is made for, if any: the gRPC implementation
  // makes the worker call its child, so it is cancelled with the client's
  // (an ingest must not run on for nobody). Fakes ignore it.
  const grpc::ServerContextBase* parent = nullptr;
};

// A deadline `timeout` from now.
WorkerCallOptions CallWithin(std::chrono::milliseconds timeout);

// `s` with "`what`: " before its message (OK stays OK).
absl::Status WithCallName(const absl::Status& s, const std::string& what);

// How a call started with one of the Start* methods below ends: called
// exactly once with the call's status, on a gRPC thread, or (a client with
// no asynchronous path) on the caller's thread before Start* returns. The
// request and response passed to Start* must stay valid until then.
using CallDone = std::function<void(absl::Status)>;

// The calls both kinds of worker answer.
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  virtual const std::string& address() const = 0;
  virtual absl::Status Info(const WorkerCallOptions& o, const vericache::v1::WorkerInfoRequest& req,
                            vericache::v1::WorkerInfoResponse* resp) = 0;
  virtual absl::Status Release(const WorkerCallOptions& o, const vericache::v1::ReleaseRequest& req,
                               vericache::v1::ReleaseResponse* resp) = 0;
  // Info and Release for a request (a probe after a failed call, the
  // release at its end), without holding the caller's thread (as
  // VerifierClient's Start* calls below; the defaults make the synchronous
  // call).
  virtual void StartInfo(const WorkerCallOptions& o, const vericache::v1::WorkerInfoRequest& req,
                         vericache::v1::WorkerInfoResponse* resp, CallDone done) {
    done(Info(o, req, resp));
  }
  virtual void StartRelease(const WorkerCallOptions& o, const vericache::v1::ReleaseRequest& req,
                            vericache::v1::ReleaseResponse* resp, CallDone done) {
    done(Release(o, req, resp));
  }
};

// One Verifier.Lease stream (worker.proto LeaseGrant): the runner sends
// grants and reads one progress message per grant. Destroying it cancels
// the stream if it is still open and waits until gRPC is done with it.
class LeaseStream {
 public:
  virtual ~LeaseStream() = default;
  // Queues a grant; false if the stream has ended (Next says how).
  virtual bool Send(const vericache::v1::LeaseGrant& grant) = 0;
  // The next progress message, waiting until `deadline`: true with `out`
  // filled (and `*received`, when not null, set to when it arrived), false
  // when the verifier ended the stream OK, or the stream's error;
  // DeadlineExceeded when `deadline` passed first (the stream goes on: the
  // caller may wait again, or destroy it to cancel it).
  virtual absl::StatusOr<bool> Next(std::chrono::steady_clock::time_point deadline,
                                    vericache::v1::LeaseProgress* out,
                                    std::chrono::steady_clock::time_point* received) = 0;
  // No more grants (half-close): the verifier finishes the running round
  // and ends the stream.
  virtual void Close() = 0;
  // Calls `ready()` once Next would return without waiting (a message has
  // come, or the stream is over): at once, on this thread, if it would
  // already; otherwise on the thread that sees it arrive. A later OnReady
  // replaces an earlier `ready` not called yet. `ready` must be quick (the
  // runner's posts its continuation) and may outlive the wait it was for.
  virtual void OnReady(std::function<void()> ready) = 0;
};

class VerifierClient : public WorkerClient {
 public:
  virtual absl::Status Open(const WorkerCallOptions& o,
                            const vericache::v1::VerifierOpenRequest& req,
                            vericache::v1::VerifierOpenResponse* resp) = 0;
  virtual absl::Status Load(const WorkerCallOptions& o, const vericache::v1::LoadRequest& req,
                            vericache::v1::LoadResponse* resp) = 0;
  virtual absl::Status Verify(const WorkerCallOptions& o, const vericache::v1::VerifyRequest& req,
                              vericache::v1::VerifyResponse* resp) = 0;
  virtual absl::Status Round(const WorkerCallOptions& o, const vericache::v1::RoundRequest& req,
                             vericache::v1::RoundResponse* resp) = 0;
  virtual absl::Status Ingest(const WorkerCallOptions& o, const vericache::v1::IngestRequest& req,
                              vericache::v1::IngestResponse* resp) = 0;
  // Opens a Lease stream whose deadline is `o.deadline` (the request's).
  // Unimplemented here: a client without leases (the unit tests' fakes)
  // runs one Round per round instead.
  virtual absl::StatusOr<std::unique_ptr<LeaseStream>> OpenLease(const WorkerCallOptions& o) {
    (void)o;
    return absl::UnimplementedError("this verifier client has no leases");
  }

  // The calls a request's runner awaits (request_runner.h), started without
  // holding the caller's thread while they are in flight: the gRPC client
  // makes them on gRPC's callback API. The defaults make the synchronous
  // call on the caller's thread (the unit tests' fakes).
  virtual void StartOpen(const WorkerCallOptions& o, const vericache::v1::VerifierOpenRequest& req,
                         vericache::v1::VerifierOpenResponse* resp, CallDone done) {
    done(Open(o, req, resp));
  }
  virtual void StartLoad(const WorkerCallOptions& o, const vericache::v1::LoadRequest& req,
                         vericache::v1::LoadResponse* resp, CallDone done) {
    done(Load(o, req, resp));
  }
  virtual void StartVerify(const WorkerCallOptions& o, const vericache::v1::VerifyRequest& req,
                           vericache::v1::VerifyResponse* resp, CallDone done) {
    done(Verify(o, req, resp));
  }
  virtual void StartRound(const WorkerCallOptions& o, const vericache::v1::RoundRequest& req,
                          vericache::v1::RoundResponse* resp, CallDone done) {
    done(Round(o, req, resp));
  }
  virtual void StartIngest(const WorkerCallOptions& o, const vericache::v1::IngestRequest& req,
                           vericache::v1::IngestResponse* resp, CallDone done) {
    done(Ingest(o, req, resp));
  }
};

class DrafterClient : public WorkerClient {
 public:
  virtual absl::Status Open(const WorkerCallOptions& o,
                            const vericache::v1::DrafterOpenRequest& req,
                            vericache::v1::DrafterOpenResponse* resp) = 0;
  virtual absl::Status Draft(const WorkerCallOptions& o, const vericache::v1::DraftRequest& req,
                             vericache::v1::DraftResponse* resp) = 0;
  virtual absl::Status Commit(const WorkerCallOptions& o, const vericache::v1::CommitRequest& req,
                              vericache::v1::CommitResponse* resp) = 0;

  // As VerifierClient's Start* calls.
  virtual void StartOpen(const WorkerCallOptions& o, const vericache::v1::DrafterOpenRequest& req,
                         vericache::v1::DrafterOpenResponse* resp, CallDone done) {
    done(Open(o, req, resp));
  }
  virtual void StartDraft(const WorkerCallOptions& o, const vericache::v1::DraftRequest& req,
                          vericache::v1::DraftResponse* resp, CallDone done) {
    done(Draft(o, req, resp));
  }
  virtual void StartCommit(const WorkerCallOptions& o, const vericache::v1::CommitRequest& req,
                           vericache::v1::CommitResponse* resp, CallDone done) {
    done(Commit(o, req, resp));
  }
};

// The gRPC implementations: one channel per worker (TLS when `tls` names
// files), messages up to `max_message_bytes`.
std::unique_ptr<VerifierClient> MakeGrpcVerifierClient(const std::string& address,
                                                       int max_message_bytes,
                                                       const rpc::TlsFiles& tls);
std::unique_ptr<DrafterClient> MakeGrpcDrafterClient(const std::string& address,
                                                     int max_message_bytes,
                                                     const rpc::TlsFiles& tls);

}  // namespace vc::coordinator
