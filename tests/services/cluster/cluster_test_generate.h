// Shared by the cluster suites: registering a prefix, the suites' seeded
// sampling, set alike on a Generate request and on its single-process
// reference, a vericache request over a registered prefix, and one Generate
// streamed to its end.
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

// A vericache request over the registered prefix `prefix_id` plus `suffix`
// (EOS ignored, `new_tokens` new), and its single-process reference's decode
// options; seeded sampling (UseSeededSampling) when `seeded`.
struct PrefixGenerate {
  vericache::v1::GenerateRequest request;
  DecodeOptions reference;
};
inline PrefixGenerate VeriCacheOverPrefix(const std::string& prefix_id,
                                          const std::vector<int32_t>& suffix,
                                          const std::string& compressor, int bits, int draft_len,
                                          int new_tokens, bool seeded, uint64_t seed) {
  PrefixGenerate g;
  vericache::v1::GenerateRequest& req = g.request;
  req.set_prefix_id(prefix_id);
  for (int32_t t : suffix) req.add_suffix_ids(t);
  req.set_mode(vericache::v1::MODE_VERICACHE);
  req.set_max_new_tokens(new_tokens);
  req.set_ignore_eos(true);
  req.set_compressor(compressor);
  req.set_bits(bits);
  req.set_draft_len(draft_len);
  g.reference.max_new_tokens = new_tokens;
  g.reference.ignore_eos = true;
  if (seeded) UseSeededSampling(seed, req, g.reference);
  return g;
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
