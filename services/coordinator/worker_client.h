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
#include <memory>
#include <string>

#include "absl/status/status.h"
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

// The calls both kinds of worker answer.
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  virtual const std::string& address() const = 0;
  virtual absl::Status Info(const WorkerCallOptions& o, const vericache::v1::WorkerInfoRequest& req,
                            vericache::v1::WorkerInfoResponse* resp) = 0;
  virtual absl::Status Release(const WorkerCallOptions& o, const vericache::v1::ReleaseRequest& req,
                               vericache::v1::ReleaseResponse* resp) = 0;
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
