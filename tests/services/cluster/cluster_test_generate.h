// Shared by the cluster suites: registering a prefix, the suites' seeded
// sampling, set alike on a Generate request and on its single-process
// reference, and one Generate streamed to its end.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/decode/full_decode.h"
#include "common/rpc/rpc.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc::clustertest {

// Registers `tokens` as a prefix (120 s deadline): its id, or the RPC's status.
inline absl::StatusOr<std::string> RegisterPrefix(vericache::v1::Coordinator::Stub* stub,
                                                  const std::vector<int32_t>& tokens) {
  vericache::v1::RegisterPrefixRequest request;
  for (int32_t t : tokens) request.add_tokens(t);
  vericache::v1::RegisterPrefixResponse response;
  auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(120));
  if (absl::Status st = rpc::FromGrpcStatus(stub->RegisterPrefix(ctx.get(), request, &response),
                                            "RegisterPrefix");
      !st.ok()) {
    return st;
  }
  return response.prefix_id();
}

// Seeded sampling (temperature 0.9, top-k 40, top-p 0.95) with `seed`, on the
// request and on the reference's decode options.
inline void UseSeededSampling(uint64_t seed, vericache::v1::GenerateRequest& request,
                              DecodeOptions& reference) {
  auto* s = request.mutable_sampling();
  s->set_mode(vericache::v1::SamplingConfig::SEEDED);
  s->set_temperature(0.9f);
  s->set_top_k(40);
  s->set_top_p(0.95f);
  s->set_seed(seed);
  reference.sampling.temperature = 0.9f;
  reference.sampling.top_k = 40;
  reference.sampling.top_p = 0.95f;
  reference.sampling.seed = seed;
}

// Streams one Generate (120 s deadline) to its end: the final message's
// totals, or the stream's status.
inline absl::StatusOr<vericache::v1::GenerateTotals> GenerateTotals(
    vericache::v1::Coordinator::Stub* stub, const vericache::v1::GenerateRequest& request) {
  auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(120));
  auto reader = stub->Generate(ctx.get(), request);
  vericache::v1::GenerateResponse msg;
  vericache::v1::GenerateTotals totals;
  while (reader->Read(&msg)) {
    if (msg.final()) totals = msg.totals();
  }
  if (absl::Status st = rpc::FromGrpcStatus(reader->Finish(), "Generate"); !st.ok()) return st;
  return totals;
}

}  // namespace vc::clustertest
