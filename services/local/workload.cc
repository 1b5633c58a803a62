#include "services/local/workload.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "common/base/percentile.h"
#include "common/decode/full_decode.h"
#include "common/rpc/rpc.h"

namespace vc::local {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

WorkloadSummary RunWorkload(const rpc::ClientConfig& coordinator,
                            const std::vector<pb::GenerateRequest>& requests, int concurrency,
                            std::vector<WorkloadResult>* results, std::chrono::seconds timeout) {
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(coordinator, 64 << 20));
  results->assign(requests.size(), WorkloadResult{});
  std::atomic<size_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < std::max(1, concurrency); ++c) {
    threads.emplace_back([&] {
      for (size_t i = next.fetch_add(1); i < requests.size(); i = next.fetch_add(1)) {
        WorkloadResult& r = (*results)[i];
        auto ctx = rpc::ContextWithTimeout(coordinator, timeout);
        const auto start = Clock::now();
        auto reader = stub->Generate(ctx.get(), requests[i]);
        pb::GenerateResponse msg;
        bool first = true;
        while (reader->Read(&msg)) {
          if (first && msg.tokens_size() > 0) {
            r.client_ttft_ms =
                std::chrono::duration<double, std::milli>(Clock::now() - start).count();
            first = false;
          }
          if (msg.has_round() && msg.round().prefix_shared()) ++r.shared_rounds;
          if (msg.final()) {
            const pb::GenerateTotals& t = msg.totals();
            r.tokens.assign(t.tokens().begin(), t.tokens().end());
            r.ttft_ms = t.ttft_ms();
            r.verify_rounds = t.verify_rounds();
            r.drafted = t.drafted_tokens();
            r.accepted = t.accepted_drafts();
            r.fallbacks = t.fallbacks();
            r.round_times = t.round_times();
          }
        }
        const grpc::Status s = reader->Finish();
        r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (!s.ok()) r.error = s.error_message().empty() ? "error" : s.error_message();
      }
    });
  }
  for (auto& t : threads) t.join();
  WorkloadSummary sum;
  sum.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttfts;
  std::vector<float> overheads;
  std::vector<float> rpc_overheads;
  int64_t drafted = 0, accepted = 0;
  for (const WorkloadResult& r : *results) {
    if (!r.error.empty()) {
      ++sum.errors;
      if (sum.first_error.empty()) sum.first_error = r.error;
      continue;
    }
    ++sum.ok;
    sum.tokens += static_cast<int64_t>(r.tokens.size());
    ttfts.push_back(r.ttft_ms);
    drafted += r.drafted;
    accepted += r.accepted;
    sum.verify_rounds += r.verify_rounds;
    sum.shared_rounds += r.shared_rounds;
    const pb::RoundTimes& rt = r.round_times;
    RoundTimeSummary& st = sum.round_times;
    st.rounds += rt.rounds();
    st.wall_seconds += rt.wall_seconds();
    st.draft_seconds += rt.draft_seconds();
    st.verify_seconds += rt.verify_seconds();
    st.transfer_seconds += rt.transfer_seconds();
    st.commit_seconds += rt.commit_seconds();
    st.slot_wait_seconds += rt.slot_wait_seconds();
    overheads.insert(overheads.end(), rt.overhead_ms().begin(), rt.overhead_ms().end());
    rpc_overheads.insert(rpc_overheads.end(), rt.rpc_overhead_ms().begin(),
                         rt.rpc_overhead_ms().end());
  }
  if (!rpc_overheads.empty()) {
    std::sort(rpc_overheads.begin(), rpc_overheads.end());
    sum.round_times.p50_rpc_overhead_ms = NearestRank(rpc_overheads, 0.5);
  }
  if (!overheads.empty()) {
    std::sort(overheads.begin(), overheads.end());
    sum.round_times.p50_overhead_ms = NearestRank(overheads, 0.5);
    sum.round_times.p90_overhead_ms = NearestRank(overheads, 0.9);
  }
  if (!ttfts.empty()) {
    std::sort(ttfts.begin(), ttfts.end());
    double total = 0;
    for (double t : ttfts) total += t;
    sum.mean_ttft_ms = total / static_cast<double>(ttfts.size());
    // The simulator's definition (its predicted-vs-measured table).
    sum.p50_ttft_ms = NearestRank(ttfts, 0.5);
    sum.p90_ttft_ms = NearestRank(ttfts, 0.9);
  }
  sum.tokens_per_s = sum.wall_seconds > 0 ? static_cast<double>(sum.tokens) / sum.wall_seconds : 0;
  sum.acceptance_rate =
      drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0;
  sum.tokens_per_round = sum.verify_rounds > 0 ? static_cast<double>(sum.tokens) /
                                                     static_cast<double>(sum.verify_rounds)
                                               : 0;
  return sum;
}

absl::StatusOr<std::vector<int32_t>> ModelTextPrompt(Engine& engine, int index, int tokens) {
  std::vector<int32_t> prompt = {1, 300 + 17 * index};
  if (tokens <= 2) return prompt;
  DecodeOptions d;
  d.max_new_tokens = tokens - 2;
  d.ignore_eos = true;
  absl::StatusOr<DecodeResult> r = DecodeFull(engine, prompt, d);
  if (!r.ok()) return r.status();
  prompt.insert(prompt.end(), r->tokens.begin(), r->tokens.end());
  return prompt;
}

std::string RegisterPrefix(const rpc::ClientConfig& coordinator, const std::vector<int32_t>& tokens,
                           std::string* error) {
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(coordinator, 64 << 20));
  pb::RegisterPrefixRequest req;
  for (int32_t t : tokens) req.add_tokens(t);
  pb::RegisterPrefixResponse resp;
  auto ctx = rpc::ContextWithTimeout(coordinator, std::chrono::seconds(120));
  const grpc::Status s = stub->RegisterPrefix(ctx.get(), req, &resp);
  if (!s.ok()) {
    *error = s.error_message();
    return "";
  }
  return resp.prefix_id();
}

}  // namespace vc::local
