// vc_single_node_bench: the single-node thesis of issue #15, measured in one
// run. A random-weight llama2.c-shaped model (default ~110M parameters: dim
// 1024, hidden 2816, 8 layers, 16 heads / 16 KV heads, vocab 8192, context
// 4096), one sequence with a random prompt, greedy decoding of --max-new
// tokens:
//  * --mode full (the baseline) and --mode vericache with the given
//    compressor, drafter weights and draft length, both through RunBatch as
//    `vericache generate` runs them; the outputs are compared token for
//    token; decode_tokens_per_s = generated tokens / seconds from the end of
//    the prompt's prefill pass (RequestStats::prefill_pass_end), so prompt
//    compression, drafting and verifying all count as decode;
//  * the verify-pass cost table: one Forward of n tokens (n = 1, 2, 4, 9, 17,
//    33) on the full KV of the prompt, median and fastest over --reps, as a multiple of
//    the 1-token step; and the drafter's 1-token step (quantised weights,
//    compressed KV) likewise.
// A random model's acceptance is not a trained model's: with tied
// embeddings a random model mostly predicts its input token again, whatever
// its layers do, so the quantised drafter agrees with it nearly always. The
// run therefore measures the cost side at (near) full acceptance; nothing is
// extrapolated.
// --small: a ~25M-parameter model, 1500-token prompt, 32 new tokens (about a
// minute on 2 threads).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/compress/compressor.h"
#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "common/speculative/draft_verify.h"
#include "kernels/quantized.h"

namespace vc {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  bool small = false;
  bool table_only = false;
  int prompt_len = 3000;
  int64_t max_new = 64;
  int threads = 2;
  int draft_len = 8;
  std::string compressor = "int8";
  std::string draft_weights = "int8";
  int reps = 5;
  uint64_t seed = 1;
};

ModelConfig BenchConfig(bool small) {
  ModelConfig c;
  c.architecture = "llama2c";
  if (small) {  // ~25M parameters
    c.dim = 512;
    c.hidden_dim = 1408;
    c.n_layers = 6;
    c.n_heads = 8;
    c.n_kv_heads = 8;
    c.vocab_size = 8192;
    c.max_seq_len = 2048;
  } else {  // ~110M parameters
    c.dim = 1024;
    c.hidden_dim = 2816;
    c.n_layers = 8;
    c.n_heads = 16;
    c.n_kv_heads = 16;
    c.vocab_size = 8192;
    c.max_seq_len = 4096;
  }
  c.head_dim = c.dim / c.n_heads;
  c.tied_embeddings = true;
  return c;
}

struct RunResult {
  std::vector<int32_t> tokens;
  double prefill_seconds = 0, decode_seconds = 0, mean_accepted = 0;
  int64_t verify_rounds = 0, fallbacks = 0;
};

absl::StatusOr<RunResult> Generate(Engine& engine, Engine* draft_engine,
                                   const std::vector<int32_t>& prompt, const RequestOptions& ro) {
  VC_ASSIGN_OR_RETURN(auto req, SpeculativeRequest::Create(engine, prompt, ro));
  std::vector<std::unique_ptr<SpeculativeRequest>> batch;
  batch.push_back(std::move(req));
  const auto start = Clock::now();
  VC_RETURN_IF_ERROR(RunBatch(engine, draft_engine, batch).status());
  const auto end = Clock::now();
  const RequestStats& st = batch[0]->stats();
  RunResult r;
  r.tokens = batch[0]->output();
  r.prefill_seconds = std::chrono::duration<double>(st.prefill_pass_end - start).count();
  r.decode_seconds = std::chrono::duration<double>(end - st.prefill_pass_end).count();
  r.verify_rounds = st.verify_rounds;
  r.fallbacks = st.fallbacks;
  if (!st.accept_lengths.empty()) {
    r.mean_accepted = std::accumulate(st.accept_lengths.begin(), st.accept_lengths.end(), 0.0) /
                      st.accept_lengths.size();
  }
  return r;
}

struct PassTime {
  double median = 0, min = 0, cpu = 0;  // cpu: median CPU seconds of the process's threads
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Median and fastest seconds of one Forward of `n` tokens appended to `kv`
// (truncated back after each), and the median CPU time the pass's threads
// used. On a shared machine the fastest pass is the one least disturbed by
// other processes, and CPU time does not count the time the threads waited
// for a core (the engine's threads block rather than spin), so all three
// are printed.
absl::StatusOr<PassTime> PassSeconds(Engine& engine, SequenceKv& kv, int n, int reps,
                                     std::mt19937_64& rng) {
  const int32_t base = kv.next_position();
  std::uniform_int_distribution<int32_t> tok(0, engine.config().vocab_size - 1);
  std::vector<int32_t> tokens(n);
  std::vector<float> logits;
  std::vector<double> t, cpu;
  for (int rep = 0; rep < reps + 1; ++rep) {
    for (int32_t& x : tokens) x = tok(rng);
    SequenceInput in{&kv, tokens, 0};
    const auto t0 = Clock::now();
    const double c0 = ProcessCpuSeconds();
    VC_RETURN_IF_ERROR(engine.Forward({&in, 1}, &logits));
    if (rep > 0) {  // 1 warm-up
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      cpu.push_back(ProcessCpuSeconds() - c0);
    }
    kv.Truncate(base);
  }
  std::sort(t.begin(), t.end());
  std::sort(cpu.begin(), cpu.end());
  return PassTime{t[t.size() / 2], t.front(), cpu[cpu.size() / 2]};
}

void PrintRuns(const Options& o, const RunResult& f, const RunResult& v, bool same) {
  const double f_tps = f.tokens.size() / f.decode_seconds;
  const double v_tps = v.tokens.size() / v.decode_seconds;
  std::printf("\n%-58s %10s %10s %12s %9s\n", "mode", "prefill s", "decode s", "decode tok/s",
              "accepted");
  std::printf("%-58s %10.2f %10.3f %12.2f %9s\n", "full", f.prefill_seconds, f.decode_seconds,
              f_tps, "-");
  const std::string label = "vericache --compressor " + o.compressor + " --draft-weights " +
                            o.draft_weights + " --draft-len " + std::to_string(o.draft_len);
  std::printf("%-58s %10.2f %10.3f %12.2f %9.2f\n", label.c_str(), v.prefill_seconds,
              v.decode_seconds, v_tps, v.mean_accepted);
  std::printf(
      "outputs identical token for token: %s (%zu tokens); verify rounds %lld, "
      "fallbacks %lld\n",
      same ? "yes" : "NO", f.tokens.size(), static_cast<long long>(v.verify_rounds),
      static_cast<long long>(v.fallbacks));
  std::printf("decode speedup (vericache / full): %.3fx (target 1.7x)\n", v_tps / f_tps);
}

absl::Status Run(const Options& o) {
  const ModelConfig c = BenchConfig(o.small);
  VC_ASSIGN_OR_RETURN(const kernels::WeightFormat wf, kernels::ParseWeightFormat(o.draft_weights));
  if (o.prompt_len < 2 || o.prompt_len + o.max_new > c.max_seq_len) {
    return absl::InvalidArgumentError("prompt + new tokens exceed the context");
  }
  std::printf("model: random llama2.c-shaped, dim %d hidden %d layers %d heads %d/%d vocab %d "
              "ctx %d (%.1fM parameters); prompt %d tokens, %lld new, --threads %d\n",
              c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
              c.max_seq_len, c.num_parameters() / 1e6, o.prompt_len,
              static_cast<long long>(o.max_new), o.threads);
  VC_ASSIGN_OR_RETURN(auto model, Model::CreateRandom(c, o.seed));
  EngineOptions eo;
  eo.backend.threads = o.threads;
  eo.max_batch_tokens = std::max(4096, o.prompt_len);
  VC_ASSIGN_OR_RETURN(auto engine, Engine::Create(*model, eo));
  std::unique_ptr<QuantizedWeights> quantized;
  std::unique_ptr<Engine> draft_engine;
  if (wf != kernels::WeightFormat::kF32) {
    const auto t0 = Clock::now();
    QuantizeOptions qo;
    qo.format = wf;
    VC_ASSIGN_OR_RETURN(quantized, QuantizedWeights::Create(*model, qo));
    EngineOptions de = eo;
    de.quantized = quantized.get();
    VC_ASSIGN_OR_RETURN(draft_engine, Engine::Create(*model, de));
    std::printf("drafter weights %s: %.1f MB (f32 %.1f MB), quantised in %.2f s\n",
                o.draft_weights.c_str(), quantized->bytes() / 1e6, c.num_parameters() * 4 / 1e6,
                std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::mt19937_64 rng(o.seed + 1);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<int32_t> prompt(o.prompt_len);
  for (int32_t& t : prompt) t = tok(rng);
  prompt[0] = c.bos_id;

  RequestOptions full;
  full.mode = DecodeMode::kFull;
  full.max_new_tokens = o.max_new;
  full.ignore_eos = true;
  RequestOptions vc = full;
  vc.mode = DecodeMode::kVeriCache;
  vc.compressor.name = o.compressor;
  vc.draft.draft_len = o.draft_len;
  bool same = true;
  if (!o.table_only) {
    VC_ASSIGN_OR_RETURN(const RunResult f, Generate(*engine, nullptr, prompt, full));
    VC_ASSIGN_OR_RETURN(const RunResult v, Generate(*engine, draft_engine.get(), prompt, vc));
    same = f.tokens == v.tokens;
    PrintRuns(o, f, v, same);
  }

  // The verify-pass cost table on the prompt's full KV.
  PagedKvCache kv(c);
  {
    std::vector<float> logits;
    SequenceInput in{&kv, prompt, static_cast<int64_t>(prompt.size())};
    VC_RETURN_IF_ERROR(engine->Forward({&in, 1}, &logits));
  }
  std::printf(
      "\nverify-pass cost on %d tokens of full KV (median, fastest and median CPU time "
      "of %d):\n",
      o.prompt_len, o.reps);
  std::printf("%8s %10s %8s %10s %8s %10s %8s\n", "tokens", "median ms", "x step", "min ms",
              "x step", "CPU ms", "x step");
  PassTime step;
  for (int n : {1, 2, 4, 9, 17, 33}) {
    VC_ASSIGN_OR_RETURN(const PassTime p, PassSeconds(*engine, kv, n, o.reps, rng));
    if (n == 1) step = p;
    std::printf("%8d %10.2f %8.2f %10.2f %8.2f %10.2f %8.2f\n", n, p.median * 1e3,
                p.median / step.median, p.min * 1e3, p.min / step.min, p.cpu * 1e3,
                p.cpu / step.cpu);
  }
  if (draft_engine != nullptr) {
    // The drafter's step: quantised weights over the compressed prompt KV.
    VC_ASSIGN_OR_RETURN(auto compressor, CreateCompressor(vc.compressor));
    const AttentionStats no_stats(c, 0, 0);
    VC_ASSIGN_OR_RETURN(auto prefix, compressor->Compress(c, kv, o.prompt_len, no_stats));
    CompressedSequenceKv dkv(c, std::move(prefix), 0, nullptr);
    VC_ASSIGN_OR_RETURN(const PassTime dp, PassSeconds(*draft_engine, dkv, 1, o.reps, rng));
    VC_ASSIGN_OR_RETURN(const PassTime d32p, PassSeconds(*engine, dkv, 1, o.reps, rng));
    const double d = dp.median, d32 = d32p.median;
    std::printf(
        "drafter 1-token step (%s weights, %s KV): %.2f ms = %.2f x the full step; "
        "with f32 weights on the same KV: %.2f ms = %.2f x\n",
        o.draft_weights.c_str(), o.compressor.c_str(), d * 1e3, d / step.median, d32 * 1e3,
        d32 / step.median);
  }
  return same ? absl::OkStatus() : absl::InternalError("outputs differ");
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) {
  vc::Options o;
  vc::FlagSet flags("vc_single_node_bench",
                    "Single-node decode: VeriCache with a weight-quantised drafter vs full-KV "
                    "decoding on a random llama2.c-shaped model, plus the verify-pass cost table.");
  flags.AddBool("--small", &o.small, "~25M-parameter model, 1500-token prompt, 32 new tokens");
  flags.AddBool("--table-only", &o.table_only,
                "only the verify-pass cost table (skips the two generation runs)");
  flags.Add("--prompt-len", &o.prompt_len, "N", "prompt tokens");
  flags.Add("--max-new", &o.max_new, "N", "tokens to generate");
  flags.Add("--threads", &o.threads, "N", "engine threads");
  flags.Add("--draft-len", &o.draft_len, "X", "VeriCache draft length");
  flags.Add("--compressor", &o.compressor, "NAME", "KV compressor of the drafter");
  flags.Add("--draft-weights", &o.draft_weights, "FORMAT", "f32 | int8 | int4");
  flags.Add("--reps", &o.reps, "N", "timed passes per row of the cost table");
  flags.Add("--seed", &o.seed, "N", "seed of the weights and the prompt");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Help().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (o.small) {
    if (!flags.was_set("--prompt-len")) o.prompt_len = 1500;
    if (!flags.was_set("--max-new")) o.max_new = 32;
  }
  if (absl::Status s = vc::Run(o); !s.ok()) {
    std::fprintf(stderr, "vc_single_node_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
