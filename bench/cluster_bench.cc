// vc_cluster_bench: the four real daemons on one machine with paced links at
// the paper's slow:fast ratio (1.2 : 40 GB/s), scaled so the dimensionless
// ratio that matters matches: the time to load a prefix's full KV over the
// slow link over the time of x decode steps (--load-over-draft, default 8).
// Every scenario runs the same shared-prefix workload on a fresh cluster and
// reports TTFT and throughput; ratios are against baselines measured in the
// same run:
//   vericache vs full_remote vs full_local         (the modes)
//   staggered vs lock-step                          (the ring scheduler)
//   prefix-aware verification on vs off            (shared-prefix batches)
//   remote:local worker ratio 2 vs 1                (pool sizing)
// Outputs are checked against full_local (lossless) in every scenario.
// --compare-insecure instead runs the vericache scenario --runs times with
// TLS, API keys and seals on (the default) and as many times with
// --insecure, alternating, and prints the median throughput ratio (issue
// 11: the secure cluster within 5% of the insecure one). --kv-encryption
// also encrypts KV at rest in the secure runs (`vericache local
// --kv-encryption`).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/decode/full_decode.h"
#include "services/local/local_cluster.h"
#include "services/local/workload.h"

namespace {

namespace pb = ::vericache::v1;
using vc::local::WorkloadResult;
using vc::local::WorkloadSummary;

struct Scenario {
  std::string name;
  pb::Mode mode = pb::MODE_VERICACHE;
  bool lock_step = false;
  bool prefix_aware = true;
  int drafters = 1;
  int verifiers = 1;
};

struct Row {
  Scenario scenario;
  WorkloadSummary sum;
  int identical = 0;
};

// One line: a vericache row's rounds, where their wall time went (the
// daemons' timestamps, vericache::v1::RoundTimes) and the control overhead.
void PrintRoundTimes(const vc::local::RoundTimeSummary& t) {
  if (t.rounds == 0) return;
  const double n = static_cast<double>(t.rounds);
  std::printf(
      "  %-26s %lld rounds, ms per round: wall %.2f = draft %.2f + verify %.2f + "
      "transfer %.2f + commit %.2f + control %.2f (p50 %.2f, p90 %.2f)\n",
      "", static_cast<long long>(t.rounds), 1e3 * t.wall_seconds / n, 1e3 * t.draft_seconds / n,
      1e3 * t.verify_seconds / n, 1e3 * t.transfer_seconds / n, 1e3 * t.commit_seconds / n,
      1e3 * t.control_seconds() / n, t.p50_overhead_ms, t.p90_overhead_ms);
}

// Writes a llama2.c checkpoint with seeded random weights: a model large
// enough that one decode step costs milliseconds on this CPU, so per-round
// RPC and scheduling overheads are as small next to decoding as they are on
// a GPU serving a large model. (The test models decode a step in ~0.1 ms.)
bool WriteSyntheticModel(const std::string& path, int dim, int hidden, int layers, int heads,
                         int kv_heads, int vocab, int seq, uint64_t seed) {
  std::ofstream out(path, std::ios::binary);
  const int32_t hdr[7] = {dim, hidden, layers, heads, kv_heads, vocab, seq};
  out.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto uniform = [&state]() {  // splitmix64 -> [-1, 1)
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>((z >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
  };
  auto tensor = [&](int64_t count, float scale, bool norm) {
    std::vector<float> buf(static_cast<size_t>(count));
    for (auto& v : buf) v = norm ? 1.0f + 0.1f * uniform() : scale * uniform();
    out.write(reinterpret_cast<const char*>(buf.data()),
              static_cast<std::streamsize>(buf.size() * 4));
  };
  const int64_t d = dim, h = hidden, L = layers, kv = static_cast<int64_t>(dim) / heads * kv_heads;
  const float sd = 1.7f / std::sqrt(static_cast<float>(dim));
  const float sh = 1.7f / std::sqrt(static_cast<float>(hidden));
  tensor(vocab * d, 1.0f, false);                               // token embedding (tied classifier)
  tensor(L * d, 0, true);                                       // rms_att
  tensor(L * d * d, sd, false);                                 // wq
  tensor(L * kv * d, sd, false);                                // wk
  tensor(L * kv * d, sd, false);                                // wv
  tensor(L * d * d, sd, false);                                 // wo
  tensor(L * d, 0, true);                                       // rms_ffn
  tensor(L * h * d, sd, false);                                 // w1
  tensor(L * d * h, sh, false);                                 // w2
  tensor(L * h * d, sd, false);                                 // w3
  tensor(d, 0, true);                                           // rms_final
  tensor(static_cast<int64_t>(seq) * (dim / heads), 0, false);  // legacy freq_cis (unused)
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = vc::local::DefaultModelPath();
  std::string csv;
  bool quick = false;
  int prefixes = 4;
  int prefix_tokens = 384;
  int requests = 16;
  int concurrency = 8;
  int max_new = 96;
  int draft_len = 8;
  double load_over_draft = 8;
  double slow_to_fast = 1.2 / 40.0;
  std::string compressor = "int8";
  bool synthetic = false;
  bool no_pin = false;
  bool compare_insecure = false;
  bool kv_encryption = false;
  bool control_overhead = false;
  int runs = 5;
  vc::FlagSet flags("vc_cluster_bench",
                    "The four daemons on loopback with paced links: TTFT and throughput of the\n"
                    "modes, staggered vs lock-step, prefix-aware on/off, 1 vs 2 drafters.");
  flags.Add("--model", &model, "PATH", "model (default: stories260K)");
  flags.AddBool("--quick", &quick,
                "a smoke run: at most 8 requests of at most 32 new tokens per scenario");
  flags.Add("--csv", &csv, "PATH", "also write the rows as CSV");
  flags.Add("--prefixes", &prefixes, "N", "shared prefixes");
  flags.Add("--prefix-tokens", &prefix_tokens, "N", "tokens per prefix");
  flags.Add("--requests", &requests, "N", "requests per scenario");
  flags.Add("--concurrency", &concurrency, "N", "requests in flight");
  flags.Add("--max-new-tokens", &max_new, "N", "tokens per request");
  flags.Add("--draft-len", &draft_len, "N", "x");
  flags.Add("--load-over-draft", &load_over_draft, "R",
            "full-KV load time over the slow link / x decode steps");
  flags.Add("--slow-to-fast", &slow_to_fast, "Q", "slow link bandwidth / fast link bandwidth");
  flags.Add("--compressor", &compressor, "NAME", "drafter's KV compressor");
  flags.AddBool("--synthetic", &synthetic,
                "use a ~51M-parameter random llama2.c model (decode step of milliseconds) instead "
                "of the test model, so RPC overheads are small next to decoding as on a GPU");
  flags.AddBool("--no-pin", &no_pin,
                "do not pin the pools to cores (default: verifiers on CPU 0, drafters on CPU 1, "
                "so the remote pool is extra capacity as on separate machines)");
  flags.AddBool("--compare-insecure", &compare_insecure,
                "only the vericache scenario, --runs times secure (TLS, API keys, seals: the "
                "default) and --runs times --insecure, alternating; prints every run and the "
                "median throughput ratio secure / insecure");
  flags.Add("--runs", &runs, "N", "runs of each kind with --compare-insecure (default 5, 1..100)");
  flags.AddBool("--kv-encryption", &kv_encryption,
                "encrypt KV at rest (per-tenant AES-256-GCM) in every secure run");
  flags.AddBool("--control-overhead", &control_overhead,
                "only the vericache scenario, on unpaced links with a calibrated slot "
                "(--slot-ms 0), with 1 and then --concurrency requests in flight; prints where "
                "each round's wall time went (drafting, verifying, waiting for the reload, "
                "committing) and the control overhead left, from the daemons' timestamps; "
                "each with the rounds relayed by the coordinator (--peer-rounds=false) and "
                "with peer rounds, and the ratios peer / relayed");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "vc_cluster_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (runs < 1 || runs > 100) {
    std::fprintf(stderr, "vc_cluster_bench: --runs must be in [1, 100]\n");
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  vc::local::StopClustersOnSignal("vc_cluster_bench");
  if (quick) {
    requests = std::min(requests, 8);
    max_new = std::min(max_new, 32);
  }
  std::string synthetic_path;
  if (synthetic) {
    synthetic_path = absl::StrCat("/tmp/vc_cluster_bench_synthetic_", getpid(), ".bin");
    if (!WriteSyntheticModel(synthetic_path, 768, 2048, 8, 12, 4, 512, 512, 7)) {
      std::fprintf(stderr, "vc_cluster_bench: cannot write %s\n", synthetic_path.c_str());
      return 1;
    }
    model = synthetic_path;
  }
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      if (!path.empty()) std::remove(path.c_str());
    }
  } cleanup{synthetic_path};
  if (model.empty()) {
    std::fprintf(stderr, "vc_cluster_bench: --model is required (test model not found)\n");
    return 2;
  }
  auto loaded = vc::Model::Load(model);
  if (!loaded.ok()) {
    std::fprintf(stderr, "vc_cluster_bench: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const vc::ModelConfig& config = (*loaded)->config();
  if (prefix_tokens + 2 + max_new > config.max_seq_len) {
    std::fprintf(stderr, "vc_cluster_bench: prefix + max-new-tokens exceeds the context\n");
    return 2;
  }
  vc::EngineOptions eo;
  eo.backend.threads = 1;
  auto engine = std::move(vc::Engine::Create(**loaded, eo)).value();

  // Prefixes and the decode step time, measured here with the workers'
  // engine settings (one thread).
  std::vector<std::vector<int32_t>> prefix_list;
  double step_seconds = 0;
  for (int p = 0; p < prefixes; ++p) {
    // The first prefix's generation times the decode step (one token per
    // step, one thread: the workers' engine settings).
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> seed =
        std::move(vc::local::ModelTextPrompt(*engine, p, prefix_tokens)).value();
    if (p == 0) {
      step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                     static_cast<double>(prefix_tokens - 2);
    }
    prefix_list.push_back(seed);
  }
  const double kv_full = static_cast<double>(prefix_tokens) * config.kv_bytes_per_token();
  const double slow_bw = kv_full / (load_over_draft * draft_len * step_seconds);
  const double fast_bw = slow_bw / slow_to_fast;
  std::printf("vc_cluster_bench: pools %s\n", !no_pin && std::thread::hardware_concurrency() >= 2
                                                  ? "pinned (verifiers on CPU 0, drafters on CPU 1)"
                                                  : "unpinned (sharing every core)");
  std::printf(
      "vc_cluster_bench: %s, prefix %d tokens (%.0f kB full KV), decode step %.3f ms,\n"
      "  x=%d: slow link %.1f MB/s, fast link %.1f MB/s (slow:fast = %.4f;\n"
      "  full-KV load over the slow link = %.1f x the time of x decode steps)\n",
      model.c_str(), prefix_tokens, kv_full / 1e3, step_seconds * 1e3, draft_len, slow_bw / 1e6,
      fast_bw / 1e6, slow_to_fast, load_over_draft);
  std::fflush(stdout);

  const std::vector<Scenario> scenarios = {
      {"vericache", pb::MODE_VERICACHE, false, true, 1, 1},
      {"full_remote", pb::MODE_FULL_REMOTE, false, true, 1, 1},
      {"full_local", pb::MODE_FULL_LOCAL, false, true, 1, 1},
      {"vericache_lockstep", pb::MODE_VERICACHE, true, true, 1, 1},
      {"vericache_no_prefix_aware", pb::MODE_VERICACHE, false, false, 1, 1},
      {"vericache_2_drafters", pb::MODE_VERICACHE, false, true, 2, 1},
  };
  // Full-KV decoding of every request in this process: the reference every
  // scenario's outputs must equal.
  std::vector<std::vector<int32_t>> reference;
  for (int i = 0; i < requests; ++i) {
    std::vector<int32_t> prompt = prefix_list[i % prefixes];
    prompt.push_back(400 + i);
    vc::DecodeOptions d;
    d.max_new_tokens = max_new;
    d.ignore_eos = true;
    reference.push_back(std::move(vc::DecodeFull(*engine, prompt, d)).value().tokens);
  }
  // One scenario on a fresh cluster; false (after saying why) if the
  // cluster does not start or a prefix cannot be registered.
  bool peer_rounds = true;  // the coordinator's --peer-rounds for the next run
  bool leases = true;       // and its --leases
  auto run_scenario = [&](const Scenario& sc, bool insecure, Row* row) -> bool {
    vc::local::LocalClusterOptions o;
    o.peer_rounds = peer_rounds;
    o.leases = leases;
    o.model = model;
    // Insecure is the whole old setup: plaintext, no API keys, no seals.
    o.insecure = insecure;
    o.seal_kv = !insecure;
    o.kv_encryption = kv_encryption && !insecure;
    o.chunk_tokens = 32;
    o.ingest_variants = compressor;
    o.draft_len = draft_len;
    // --control-overhead: unpaced links (0), the slot calibrated.
    o.fast_link_bytes_per_second = control_overhead ? 0 : fast_bw;
    o.slow_link_bytes_per_second = control_overhead ? 0 : slow_bw;
    o.lock_step = sc.lock_step;
    o.prefix_aware = sc.prefix_aware;
    o.drafters = sc.drafters;
    o.verifiers = sc.verifiers;
    // Opens fetch whole prefixes over the slow link (seconds at these
    // rates, queued behind each other): deadlines sized for that.
    o.extra_flags["vc-coordinator"] = {"--rpc-timeout-ms=300000"};
    o.extra_flags["vc-drafter"] = {"--rpc-timeout-ms=300000"};
    o.extra_flags["vc-verifier"] = {"--rpc-timeout-ms=300000"};
    const bool pin = !no_pin && std::thread::hardware_concurrency() >= 2;
    if (pin) {
      o.cpus["verifier"] = {0};
      o.cpus["drafter"] = {1};
    }
    auto cluster = vc::local::LocalCluster::Start(o);
    if (!cluster.ok()) {
      std::fprintf(stderr, "vc_cluster_bench: %s\n", cluster.status().ToString().c_str());
      return false;
    }
    const vc::rpc::ClientConfig coordinator =
        (*cluster)->client();  // TLS + API key unless insecure
    std::vector<std::string> ids;
    for (const auto& p : prefix_list) {
      std::string error;
      ids.push_back(vc::local::RegisterPrefix(coordinator, p, &error));
      if (ids.back().empty()) {
        std::fprintf(stderr, "vc_cluster_bench: RegisterPrefix: %s\n", error.c_str());
        return false;
      }
    }
    std::vector<pb::GenerateRequest> reqs;
    for (int i = 0; i < requests; ++i) {
      pb::GenerateRequest r;
      r.set_prefix_id(ids[i % prefixes]);
      r.add_suffix_ids(400 + i);
      r.set_mode(sc.mode);
      r.set_max_new_tokens(max_new);
      r.set_ignore_eos(true);
      r.set_compressor(compressor);
      r.set_draft_len(draft_len);
      reqs.push_back(r);
    }
    std::vector<WorkloadResult> results;
    row->scenario = sc;
    row->sum = vc::local::RunWorkload(coordinator, reqs, concurrency, &results);
    (*cluster)->Stop();
    row->identical = 0;
    for (int i = 0; i < requests; ++i) {
      if (results[i].error.empty() && results[i].tokens == reference[i]) ++row->identical;
    }
    std::printf(
        "  %-26s %8.1f tok/s  TTFT mean %7.1f ms p50 %7.1f p90 %7.1f  %2d/%d identical%s\n",
        sc.name.c_str(), row->sum.tokens_per_s, row->sum.mean_ttft_ms, row->sum.p50_ttft_ms,
        row->sum.p90_ttft_ms, row->identical, requests,
        row->sum.errors > 0
            ? absl::StrCat("  ERRORS: ", row->sum.errors, " (", row->sum.first_error, ")").c_str()
            : "");
    if (sc.mode == pb::MODE_VERICACHE) PrintRoundTimes(row->sum.round_times);
    std::fflush(stdout);
    return true;
  };
  auto failures = [&](const std::vector<Row>& rows) {
    int errors = 0, mismatches = 0;
    for (const Row& r : rows) {
      errors += r.sum.errors;
      mismatches += requests - r.sum.errors - r.identical;
    }
    if (errors == 0 && mismatches == 0) {
      std::printf("all outputs identical to full-KV decoding\n");
    } else {
      std::printf(
          "%d requests failed (see the rows above); %d completed outputs differ from "
          "full-KV decoding\n",
          errors, mismatches);
    }
    return errors + mismatches;
  };
  if (control_overhead) {
    // One request in flight, then --concurrency; at each, the rounds relayed
    // through the coordinator (--peer-rounds=false, the first baseline), peer
    // rounds with one Round call each (--leases=false, the second) and
    // leased rounds (the default), rotating which goes first (a drift of the
    // machine falls on all alike).
    enum Protocol { kRelayed, kRound, kLease };
    constexpr const char* kProtocolNames[] = {"relayed", "round", "lease"};
    struct Measured {
      int in_flight;
      Protocol protocol;
      Row row;
    };
    std::vector<Measured> all;
    const int most_in_flight = concurrency;
    std::printf("\ncontrol overhead (unpaced links, calibrated slot), ms per round:\n");
    int turn = 0;
    for (int in_flight : {1, most_in_flight}) {
      concurrency = in_flight;
      for (int k = 0; k < 3; ++k) {
        const auto protocol = static_cast<Protocol>((k + turn) % 3);
        peer_rounds = protocol != kRelayed;
        leases = protocol == kLease;
        Scenario sc = scenarios.front();
        sc.name = absl::StrCat("vericache, ", in_flight, " in flight, ", kProtocolNames[protocol]);
        Measured m{in_flight, protocol, Row{}};
        if (!run_scenario(sc, false, &m.row)) return 1;
        all.push_back(m);
      }
      ++turn;
    }
    peer_rounds = true;
    leases = true;
    // "slots": of the overhead, the coordinator's waits for its scheduler
    // (leased: only where the verifier waited for the grant); "rpc p50": per
    // round, the overhead without them (RPCs, hand-offs).
    std::printf("\n  %-9s %-8s %7s %8s %8s %8s %9s %8s %9s %8s %8s %8s %8s %9s\n", "in flight",
                "rounds", "n", "wall", "draft", "verify", "transfer", "commit", "overhead", "p50",
                "p90", "slots", "rpc p50", "tok/s");
    for (const Measured& m : all) {
      const vc::local::RoundTimeSummary& t = m.row.sum.round_times;
      const double n = t.rounds > 0 ? static_cast<double>(t.rounds) : 1.0;
      std::printf(
          "  %-9d %-8s %7lld %8.2f %8.2f %8.2f %9.2f %8.2f %9.2f %8.2f %8.2f %8.2f %8.2f %9.1f\n",
          m.in_flight, kProtocolNames[m.protocol], static_cast<long long>(t.rounds),
          1e3 * t.wall_seconds / n, 1e3 * t.draft_seconds / n, 1e3 * t.verify_seconds / n,
          1e3 * t.transfer_seconds / n, 1e3 * t.commit_seconds / n, 1e3 * t.control_seconds() / n,
          t.p50_overhead_ms, t.p90_overhead_ms, 1e3 * t.slot_wait_seconds / n,
          t.p50_rpc_overhead_ms, m.row.sum.tokens_per_s);
    }
    // Leased rounds over each baseline, measured in this run.
    for (int in_flight : {1, most_in_flight}) {
      const Row* by[3] = {nullptr, nullptr, nullptr};
      for (const Measured& m : all) {
        if (m.in_flight == in_flight) by[m.protocol] = &m.row;
      }
      auto per_round = [](const Row& r) {
        const auto& t = r.sum.round_times;
        return t.rounds > 0 ? t.wall_seconds / static_cast<double>(t.rounds) : 0.0;
      };
      auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
      for (Protocol base : {kRelayed, kRound}) {
        if (by[base] == nullptr || by[kLease] == nullptr) continue;
        const Row& lease = *by[kLease];
        const Row& other = *by[base];
        std::printf(
            "  %d in flight, lease / %s: wall per round %.3f, overhead p50 %.3f, "
            "tokens/s %.3f\n",
            in_flight, kProtocolNames[base], ratio(per_round(lease), per_round(other)),
            ratio(lease.sum.round_times.p50_overhead_ms, other.sum.round_times.p50_overhead_ms),
            ratio(lease.sum.tokens_per_s, other.sum.tokens_per_s));
      }
    }
    std::vector<Row> rows;
    rows.reserve(all.size());
    for (const Measured& m : all) rows.push_back(m.row);
    return failures(rows) == 0 ? 0 : 1;
  }
  if (compare_insecure) {
    // Alternating, and which kind goes first alternates too, so a drift of
    // the machine (another process, thermal) falls on both kinds alike.
    std::vector<Row> all;
    std::vector<double> secure_tps, insecure_tps, pair_ratio;
    for (int run = 0; run < runs; ++run) {
      double tps[2] = {0, 0};  // [secure, insecure]
      for (int k = 0; k < 2; ++k) {
        const bool insecure = (run % 2 == 0) ? k == 1 : k == 0;
        Scenario sc = scenarios.front();
        sc.name = absl::StrCat("run ", run + 1, insecure ? " insecure" : " secure");
        Row row;
        if (!run_scenario(sc, insecure, &row)) return 1;
        tps[insecure ? 1 : 0] = row.sum.tokens_per_s;
        all.push_back(row);
      }
      secure_tps.push_back(tps[0]);
      insecure_tps.push_back(tps[1]);
      pair_ratio.push_back(tps[1] > 0 ? tps[0] / tps[1] : 0.0);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      const size_t n = v.size();
      return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    };
    const double ms = median(secure_tps), mi = median(insecure_tps);
    std::printf("\nsecure vs insecure, %d runs each (vericache, %d requests):\n", runs, requests);
    std::printf("  median throughput secure %.1f tok/s, insecure %.1f tok/s\n", ms, mi);
    std::printf("  median secure / median insecure        %.3f\n", mi > 0 ? ms / mi : 0.0);
    std::printf("  median of the per-run ratios           %.3f\n", median(pair_ratio));
    return failures(all) == 0 ? 0 : 1;
  }
  std::vector<Row> rows;
  for (const Scenario& sc : scenarios) {
    Row row;
    if (!run_scenario(sc, false, &row)) return 1;
    rows.push_back(row);
  }
  auto find = [&](const std::string& name) -> const Row& {
    for (const Row& r : rows) {
      if (r.scenario.name == name) return r;
    }
    return rows.front();
  };
  const Row& vc_row = find("vericache");
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("\nratios (same run):\n");
  std::printf("  throughput vericache / full_remote           %.2fx\n",
              ratio(vc_row.sum.tokens_per_s, find("full_remote").sum.tokens_per_s));
  std::printf("  throughput vericache / full_local            %.2fx\n",
              ratio(vc_row.sum.tokens_per_s, find("full_local").sum.tokens_per_s));
  std::printf("  TTFT full_remote / vericache                 %.2fx\n",
              ratio(find("full_remote").sum.mean_ttft_ms, vc_row.sum.mean_ttft_ms));
  std::printf("  TTFT full_local / vericache                  %.2fx\n",
              ratio(find("full_local").sum.mean_ttft_ms, vc_row.sum.mean_ttft_ms));
  std::printf("  throughput staggered / lock-step             %.2fx\n",
              ratio(vc_row.sum.tokens_per_s, find("vericache_lockstep").sum.tokens_per_s));
  std::printf(
      "  throughput prefix-aware on / off             %.2fx  (shared loads: %lld of %lld rounds)\n",
      ratio(vc_row.sum.tokens_per_s, find("vericache_no_prefix_aware").sum.tokens_per_s),
      static_cast<long long>(vc_row.sum.shared_rounds),
      static_cast<long long>(vc_row.sum.verify_rounds));
  std::printf("  throughput 2 drafters / 1 drafter (1 verifier) %.2fx\n",
              ratio(find("vericache_2_drafters").sum.tokens_per_s, vc_row.sum.tokens_per_s));
  std::printf("  vericache acceptance %.1f%% of drafts, %.2f tokens per verify round\n",
              100 * vc_row.sum.acceptance_rate, vc_row.sum.tokens_per_round);
  if (!csv.empty()) {
    std::ofstream out(csv);
    out << "scenario,mode,lock_step,prefix_aware,drafters,verifiers,requests,tokens,wall_s,"
           "tokens_per_s,ttft_mean_ms,ttft_p50_ms,ttft_p90_ms,acceptance,tokens_per_round,"
           "shared_rounds,identical,errors,slow_bw,fast_bw,step_ms\n";
    for (const Row& r : rows) {
      out << r.scenario.name << ","
          << (r.scenario.mode == pb::MODE_VERICACHE     ? "vericache"
              : r.scenario.mode == pb::MODE_FULL_REMOTE ? "full_remote"
                                                        : "full_local")
          << "," << r.scenario.lock_step << "," << r.scenario.prefix_aware << ","
          << r.scenario.drafters << "," << r.scenario.verifiers << "," << requests << ","
          << r.sum.tokens << "," << r.sum.wall_seconds << "," << r.sum.tokens_per_s << ","
          << r.sum.mean_ttft_ms << "," << r.sum.p50_ttft_ms << "," << r.sum.p90_ttft_ms << ","
          << r.sum.acceptance_rate << "," << r.sum.tokens_per_round << "," << r.sum.shared_rounds
          << "," << r.identical << "," << r.sum.errors << "," << slow_bw << "," << fast_bw << ","
          << step_seconds * 1e3 << "\n";
    }
  }
  return failures(rows) == 0 ? 0 : 1;
}
