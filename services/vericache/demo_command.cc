// `vericache demo`: the README's main job. Starts the local cluster (the four
// daemons on loopback), registers a few shared prefixes, serves a demo
// workload in every lossless mode with several requests in flight, checks
// every output against single-process full-KV decoding, and prints a short
// report (tokens/s, TTFT, acceptance, identical-to-full-KV).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/flags.h"
#include "common/decode/full_decode.h"
#include "common/rpc/rpc.h"
#include "nlohmann/json.hpp"
#include "services/local/local_cluster.h"
#include "services/vericache/commands.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc::cli {
namespace {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

struct DemoRequest {
  std::vector<int32_t> prompt;  // prefix + suffix (for the reference)
  std::string prefix_id;
  std::vector<int32_t> suffix;
  pb::Mode mode = pb::MODE_VERICACHE;
  // Results.
  std::vector<int32_t> tokens;
  double seconds = 0;
  double ttft_ms = 0;
  int64_t rounds = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  std::string error;
  bool identical = false;
};

const char* ModeLabel(pb::Mode m) {
  switch (m) {
    case pb::MODE_FULL_LOCAL:
      return "full_local";
    case pb::MODE_FULL_REMOTE:
      return "full_remote";
    case pb::MODE_LOSSY_REMOTE:
      return "lossy_remote";
    default:
      return "vericache";
  }
}

}  // namespace

int RunDemo(int argc, char** argv) {
  const std::string cmd = "demo";
  local::LocalClusterOptions o;
  o.model = local::DefaultModelPath();
  o.ingest_variants = "int8,snapkv:0.3";
  o.chunk_tokens = 32;
  int prefixes = 3;
  int prefix_tokens = 192;
  int requests_per_mode = 12;
  int concurrency = 8;
  int max_new_tokens = 96;
  std::string compressor = "int8";
  double ratio = 0;
  int bits = 0;
  bool json = false;
  FlagSet flags("vericache demo",
                "Start the local cluster, register shared prefixes, serve a demo workload in the\n"
                "vericache, full_local and full_remote modes, check every output against\n"
                "full-KV decoding in this process, and print a report.");
  flags.Add("--model", &o.model, "PATH", "model file (default: the test model stories260K)");
  flags.Add("--prefixes", &prefixes, "N", "shared prefixes to register");
  flags.Add("--prefix-tokens", &prefix_tokens, "N", "tokens per prefix");
  flags.Add("--requests", &requests_per_mode, "N", "requests per mode");
  flags.Add("--concurrency", &concurrency, "N", "requests in flight at once");
  flags.Add("--max-new-tokens", &max_new_tokens, "N", "tokens generated per request");
  flags.Add("--compressor", &compressor, "NAME", "drafter's KV compressor");
  flags.Add("--ratio", &ratio, "C", "token-dropping ratio (for dropping compressors)");
  flags.Add("--bits", &bits, "B", "quantiser bits");
  flags.Add("--drafters", &o.drafters, "N", "drafter workers");
  flags.Add("--verifiers", &o.verifiers, "N", "verifier workers");
  flags.Add("--draft-len", &o.draft_len, "N", "draft length x");
  flags.Add("--slow-link-bytes-per-second", &o.slow_link_bytes_per_second, "N",
            "pace store->drafter (0: unpaced)");
  flags.Add("--fast-link-bytes-per-second", &o.fast_link_bytes_per_second, "N",
            "pace store->verifier (0: unpaced)");
  flags.Add("--log-dir", &o.log_dir, "DIR", "daemon logs (default: none)");
  flags.AddBool("--json", &json, "print the report as one JSON object");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (o.model.empty()) return BadInput(cmd, "--model is required (the test model was not found)");
  if (prefixes < 1 || requests_per_mode < 1 || concurrency < 1 || max_new_tokens < 1 ||
      prefix_tokens < o.chunk_tokens) {
    return BadInput(cmd, "--prefixes, --requests, --concurrency, --max-new-tokens must be >= 1 "
                         "and --prefix-tokens >= 32");
  }
  signal(SIGPIPE, SIG_IGN);

  // The reference engine, in this process.
  auto model = Model::Load(o.model);
  if (!model.ok()) return Fail(cmd, model.status());
  if (prefix_tokens + 8 + max_new_tokens > (*model)->config().max_seq_len) {
    return BadInput(cmd, "--prefix-tokens + --max-new-tokens + 8 exceeds the model's context");
  }
  EngineOptions eo;
  eo.backend.threads = 1;
  auto engine = Engine::Create(**model, eo);
  if (!engine.ok()) return Fail(cmd, engine.status());

  std::fprintf(stderr, "[1/4] starting the local cluster (%d verifier, %d drafter)...\n",
               o.verifiers, o.drafters);
  auto cluster = local::LocalCluster::Start(o);
  if (!cluster.ok()) return Fail(cmd, cluster.status());
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel((*cluster)->coordinator(), 64 << 20));

  // Prefixes: the model's own greedy continuations of short seeds (text it
  // finds likely, like a shared system prompt or document).
  std::fprintf(stderr, "[2/4] registering %d prefixes of %d tokens...\n", prefixes, prefix_tokens);
  std::vector<std::vector<int32_t>> prefix_tokens_list;
  std::vector<std::string> prefix_ids;
  for (int p = 0; p < prefixes; ++p) {
    std::vector<int32_t> seed = {1, 300 + 17 * p};
    DecodeOptions d;
    d.max_new_tokens = prefix_tokens - 2;
    d.ignore_eos = true;
    auto r = DecodeFull(**engine, seed, d);
    if (!r.ok()) return Fail(cmd, r.status());
    seed.insert(seed.end(), r->tokens.begin(), r->tokens.end());
    pb::RegisterPrefixRequest req;
    for (int32_t t : seed) req.add_tokens(t);
    pb::RegisterPrefixResponse resp;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(120));
    const grpc::Status s = stub->RegisterPrefix(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(cmd, rpc::FromGrpcStatus(s, "RegisterPrefix"));
    prefix_tokens_list.push_back(seed);
    prefix_ids.push_back(resp.prefix_id());
  }

  std::vector<DemoRequest> work;
  for (const pb::Mode mode : {pb::MODE_VERICACHE, pb::MODE_FULL_LOCAL, pb::MODE_FULL_REMOTE}) {
    for (int i = 0; i < requests_per_mode; ++i) {
      DemoRequest r;
      r.mode = mode;
      const int p = i % prefixes;
      r.prefix_id = prefix_ids[p];
      r.suffix = {static_cast<int32_t>(400 + i), static_cast<int32_t>(260 + 3 * i)};
      r.prompt = prefix_tokens_list[p];
      r.prompt.insert(r.prompt.end(), r.suffix.begin(), r.suffix.end());
      work.push_back(r);
    }
  }
  std::fprintf(stderr, "[3/4] serving %zu requests (%d at a time, %d new tokens each)...\n",
               work.size(), concurrency, max_new_tokens);
  std::map<pb::Mode, double> mode_seconds;
  for (const pb::Mode mode : {pb::MODE_VERICACHE, pb::MODE_FULL_LOCAL, pb::MODE_FULL_REMOTE}) {
    std::atomic<size_t> next{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < concurrency; ++c) {
      threads.emplace_back([&] {
        while (true) {
          size_t i = next.fetch_add(1);
          while (i < work.size() && work[i].mode != mode) i = next.fetch_add(1);
          if (i >= work.size()) return;
          DemoRequest& r = work[i];
          pb::GenerateRequest req;
          req.set_prefix_id(r.prefix_id);
          for (int32_t t : r.suffix) req.add_suffix_ids(t);
          req.set_mode(r.mode);
          req.set_max_new_tokens(max_new_tokens);
          req.set_ignore_eos(true);
          req.set_compressor(compressor);
          req.set_ratio(ratio);
          req.set_bits(bits);
          auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(300));
          const auto start = Clock::now();
          auto reader = stub->Generate(ctx.get(), req);
          pb::GenerateResponse msg;
          while (reader->Read(&msg)) {
            if (msg.final()) {
              r.tokens.assign(msg.totals().tokens().begin(), msg.totals().tokens().end());
              r.ttft_ms = msg.totals().ttft_ms();
              r.rounds = msg.totals().verify_rounds();
              r.drafted = msg.totals().drafted_tokens();
              r.accepted = msg.totals().accepted_drafts();
            }
          }
          const grpc::Status s = reader->Finish();
          r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
          if (!s.ok()) r.error = s.error_message();
        }
      });
    }
    for (auto& t : threads) t.join();
    mode_seconds[mode] = std::chrono::duration<double>(Clock::now() - t0).count();
  }

  std::fprintf(stderr, "[4/4] checking every output against full-KV decoding...\n");
  for (DemoRequest& r : work) {
    if (!r.error.empty()) continue;
    DecodeOptions d;
    d.max_new_tokens = max_new_tokens;
    d.ignore_eos = true;
    auto ref = DecodeFull(**engine, r.prompt, d);
    r.identical = ref.ok() && ref->tokens == r.tokens;
  }
  (*cluster)->Stop();

  nlohmann::json report;
  report["model"] = o.model;
  report["compressor"] = compressor;
  report["requests_per_mode"] = requests_per_mode;
  report["concurrency"] = concurrency;
  report["max_new_tokens"] = max_new_tokens;
  bool all_identical = true;
  for (const pb::Mode mode : {pb::MODE_VERICACHE, pb::MODE_FULL_LOCAL, pb::MODE_FULL_REMOTE}) {
    int ok = 0, identical = 0, errors = 0;
    int64_t tokens = 0, rounds = 0, drafted = 0, accepted = 0;
    double ttft = 0;
    std::string first_error;
    for (const DemoRequest& r : work) {
      if (r.mode != mode) continue;
      if (!r.error.empty()) {
        ++errors;
        if (first_error.empty()) first_error = r.error;
        continue;
      }
      ++ok;
      identical += r.identical ? 1 : 0;
      tokens += static_cast<int64_t>(r.tokens.size());
      rounds += r.rounds;
      drafted += r.drafted;
      accepted += r.accepted;
      ttft += r.ttft_ms;
    }
    all_identical = all_identical && identical == requests_per_mode;
    nlohmann::json m;
    m["requests"] = requests_per_mode;
    m["errors"] = errors;
    if (!first_error.empty()) m["first_error"] = first_error;
    m["identical_to_full_kv"] = identical;
    m["tokens"] = tokens;
    m["seconds"] = mode_seconds[mode];
    m["tokens_per_s"] = mode_seconds[mode] > 0 ? tokens / mode_seconds[mode] : 0.0;
    m["mean_ttft_ms"] = ok > 0 ? ttft / ok : 0.0;
    if (mode == pb::MODE_VERICACHE) {
      m["verify_rounds"] = rounds;
      m["mean_accepted_per_round"] = rounds > 0 ? static_cast<double>(accepted) / rounds : 0.0;
      m["acceptance_rate"] = drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0;
      m["tokens_per_round"] = rounds > 0 ? static_cast<double>(tokens) / rounds : 0.0;
    }
    report["modes"][ModeLabel(mode)] = m;
  }
  report["all_identical"] = all_identical;
  if (json) {
    std::cout << report.dump() << std::endl;
  } else {
    std::printf("\nVeriCache local cluster demo: %s, %d prefixes x %d tokens, %d requests per mode "
                "(%d in flight), %d new tokens each, drafter compressor %s\n\n",
                o.model.c_str(), prefixes, prefix_tokens, requests_per_mode, concurrency,
                max_new_tokens, compressor.c_str());
    std::printf("%-12s %10s %12s %14s %12s %s\n", "mode", "tokens/s", "mean TTFT", "identical",
                "errors", "acceptance");
    for (const char* mode : {"vericache", "full_local", "full_remote"}) {
      const auto& m = report["modes"][mode];
      std::string acc = "-";
      if (m.contains("acceptance_rate")) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "%.0f%% of drafts, %.1f tokens/round",
                      100 * m["acceptance_rate"].get<double>(), m["tokens_per_round"].get<double>());
        acc = buf;
      }
      std::printf("%-12s %10.1f %9.1f ms %7d / %-4d %12d %s\n", mode, m["tokens_per_s"].get<double>(),
                  m["mean_ttft_ms"].get<double>(), m["identical_to_full_kv"].get<int>(),
                  requests_per_mode, m["errors"].get<int>(), acc.c_str());
    }
    std::printf("\n%s\n", all_identical
                              ? "every output is identical to full-KV decoding"
                              : "MISMATCH: some outputs differ from full-KV decoding (see above)");
  }
  return all_identical ? kExitOk : kExitFailure;
}

}  // namespace vc::cli
