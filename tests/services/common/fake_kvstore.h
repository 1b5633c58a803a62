// A vc-kvstore control plane in the test process, for the store client's
// seams: Stat answers with no data plane; the first `unavailable` Lookups
// and Gets answer UNAVAILABLE (as a store that went away under them), and
// the ones after answer a miss; with `hang`, Lookup and Get never answer
// and return only when their caller cancels them or the server stops (a
// SIGSTOPped store). Everything else is UNIMPLEMENTED.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "tests/loopback_server.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc::testing {

class FakeKvStore final : public ::vericache::v1::KvStore::Service {
 public:
  FakeKvStore() : loopback_(test_support::ServeOnLoopback(this)) {}
  ~FakeKvStore() override {
    stopping_ = true;
    // Calls still hanging are cancelled at the deadline.
    if (loopback_.server != nullptr)
      loopback_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  bool started() const { return loopback_.server != nullptr && loopback_.port > 0; }
  std::string address() const { return loopback_.address; }

  // Lookups and Gets answered UNAVAILABLE before the first real answer.
  std::atomic<int> unavailable{0};
  std::atomic<bool> hang{false};
  std::atomic<int> calls{0};

  grpc::Status Stat(grpc::ServerContext*, const ::vericache::v1::StatRequest*,
                    ::vericache::v1::StatResponse* resp) override {
    resp->set_data_plane("");
    return grpc::Status::OK;
  }
  grpc::Status Lookup(grpc::ServerContext* ctx, const ::vericache::v1::LookupRequest* req,
                      ::vericache::v1::LookupResponse* resp) override {
    if (grpc::Status s = Answer(ctx); !s.ok()) return s;
    for (int i = 0; i < req->keys_size(); ++i) resp->add_results()->set_hit(false);
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext* ctx, const ::vericache::v1::GetRequest*,
                   ::vericache::v1::GetResponse*) override {
    if (grpc::Status s = Answer(ctx); !s.ok()) return s;
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such key");
  }

 private:
  grpc::Status Answer(grpc::ServerContext* ctx) {
    calls.fetch_add(1);
    if (hang.load()) {
      while (!ctx->IsCancelled() && !stopping_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return grpc::Status(grpc::StatusCode::CANCELLED, "the fake store never answered");
    }
    if (unavailable.fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Connection reset by peer");
    }
    unavailable.store(0);
    return grpc::Status::OK;
  }

  std::atomic<bool> stopping_{false};
  test_support::LoopbackServer loopback_;
};

}  // namespace vc::testing
