// vc_single_node_bench: the single-node thesis of issue #15, measured in one
// run. A random-weight llama2.c-shaped model (default ~110M parameters: dim
// 1024, hidden 2816, 8 layers, 16 heads / 16 KV heads, vocab 8192, context
// 4096), one sequence with a random prompt, greedy decoding of --max-new
// tokens:
//  * --mode full (the baseline) and --mode vericache with the given
//    compressor, drafter weights and draft length, both through RunBatch as
//    `vericache generate` runs them, --runs pairs alternating which mode
//    goes first; the outputs are compared token for token; decode_tokens_per_s
//    = generated tokens / seconds from the end of the prompt's prefill pass
//    (RequestStats::prefill_pass_end), so prompt compression, drafting and
//    verifying all count as decode; the speedup is the median over the pairs;
//  * the verify-pass cost table: one Forward of n tokens (n = 1, 2, 4, 9, 17,
//    33) on the full KV of the prompt, median and fastest over --reps, as a multiple of
//    the 1-token step; and the drafter's 1-token step (quantised weights,
//    compressed KV) likewise.
// A random model's acceptance is not a trained model's: with tied
// embeddings a random model mostly predicts its input token again, whatever
// its layers do, so the quantised drafter agrees with it nearly always. The
// run therefore measures the cost side at (near) full acceptance, and prints
// separately, marked as a prediction, the speedup its measured costs would
// give at the acceptance of the trained test models (docs/results.md
// section 3).
//  * the warm-up check of issue 15 item 4: a fresh process (this binary,
//    re-executed) loads the model from a llama2.c file as `vericache
//    generate` does and prints its first 4 1-token passes as multiples of
//    its steady step (the median of the 16 that follow); and the first 4
//    steps after the prompt's prefill likewise against the table's step.
// --small: a ~25M-parameter model, 1500-token prompt, 32 new tokens (about a
// minute on 2 threads).
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench/int_list.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/compress/compressor.h"
#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "common/speculative/draft_verify.h"
#include "kernels/kernels.h"
#include "kernels/quantized.h"

namespace vc {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  bool small = false;
  bool table_only = false;
  bool stages = false;
  int prompt_len = 3000;
  int64_t max_new = 64;
  int threads = 2;
  std::string simd = "auto";  // kernel SIMD level: scalar | avx2 | avx512 | auto
  int draft_len = 8;
  std::string compressor = "int8";
  std::string draft_weights = "int8";
  int reps = 5;
  int runs = 3;  // pairs of generation runs (full, VeriCache)
  uint64_t seed = 1;
  bool no_fresh = false;
  int64_t warmup_tokens = EngineOptions().warmup_tokens;
  std::string fresh_process;  // internal: the child's model file
  // Tokens per verify round that trained models reach with this drafter
  // configuration, as NAME=TOKENS,...; empty: the measured table of
  // docs/results.md section 3 when the configuration is the default one.
  std::string trained_rounds;
  // Tokens per pass of the cost table's rows (1, the step, is always added).
  std::string pass_tokens = "1,2,4,9,17,33";
};

// docs/results.md section 3, "Acceptance per drafter": tokens per verify
// round (accepted drafts + the corrected or bonus token) of the trained test
// models with INT8 KV, int8 drafter weights and draft length 8, greedy.
constexpr char kTrainedRoundsInt8Int8X8[] = "stories260K=6.71,aidreams260K=8.51";

struct TrainedRounds {
  std::string model;
  double tokens_per_round = 0;
};

// The cost table's rows: a comma-separated list of tokens per pass, each in
// [1, room] (room: the context left after the prompt), 1 added if missing.
absl::StatusOr<std::vector<int>> ParsePassTokens(const std::string& text, int64_t room) {
  VC_ASSIGN_OR_RETURN(const std::vector<int64_t> items,
                      vc::bench::ParseIntList("--pass-tokens", text, 1, room));
  std::vector<int> out(items.begin(), items.end());
  if (std::find(out.begin(), out.end(), 1) == out.end()) out.push_back(1);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<std::vector<TrainedRounds>> ParseTrainedRounds(const std::string& text) {
  std::vector<TrainedRounds> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    TrainedRounds t;
    t.model = std::string(kv.first);
    if (t.model.empty() || !absl::SimpleAtod(kv.second, &t.tokens_per_round) ||
        !(t.tokens_per_round >= 1 && t.tokens_per_round <= 1000)) {
      return absl::InvalidArgumentError(
          "--trained-rounds: expected NAME=TOKENS with TOKENS in "
          "[1, 1000], got '" +
          std::string(item) + "'");
    }
    out.push_back(std::move(t));
  }
  return out;
}

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

double ProcessCpuSeconds();

struct RunResult {
  std::vector<int32_t> tokens;
  double prefill_seconds = 0, decode_seconds = 0, mean_accepted = 0;
  // CPU seconds of the process after RunBatch's first step (the prefill
  // pass, then compressing the prompt's KV: `compress_seconds` of wall
  // time): unlike wall time, not inflated by waiting for a core on a shared
  // machine.
  double decode_cpu_seconds = 0, compress_seconds = 0;
  // CPU seconds of RunBatch's first step: the prefill pass (and the
  // compression, which follows it inside that step).
  double prefill_cpu_seconds = 0;
  int64_t verify_rounds = 0, fallbacks = 0;
  // Wall time of the steps by phase (each from the end of the step before
  // it, so what RunBatch and the request do between passes counts too).
  double draft_step_seconds = 0, verify_pass_seconds = 0, full_step_seconds = 0;
  int64_t draft_steps = 0, full_steps = 0;
};

absl::StatusOr<RunResult> Generate(Engine& engine, Engine* draft_engine,
                                   const std::vector<int32_t>& prompt, const RequestOptions& ro) {
  VC_ASSIGN_OR_RETURN(auto req, SpeculativeRequest::Create(engine, prompt, ro));
  std::vector<std::unique_ptr<SpeculativeRequest>> batch;
  batch.push_back(std::move(req));
  const auto start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  double cpu_mark = -1;
  // Each step's wall time by the phase it ran: the phase the request was
  // in after the step before it.
  SpeculativeRequest::Phase next_phase = SpeculativeRequest::Phase::kPrefill;
  auto last = start;
  RunResult r;
  auto after_step = [&] {
    const auto now = Clock::now();
    if (cpu_mark < 0) cpu_mark = ProcessCpuSeconds();
    const double dt = std::chrono::duration<double>(now - last).count();
    if (next_phase == SpeculativeRequest::Phase::kDraft) {
      r.draft_step_seconds += dt;
      ++r.draft_steps;
    } else if (next_phase == SpeculativeRequest::Phase::kVerify) {
      r.verify_pass_seconds += dt;
    } else if (next_phase == SpeculativeRequest::Phase::kFullDecode) {
      r.full_step_seconds += dt;
      ++r.full_steps;
    }
    next_phase = batch[0]->phase();
    last = now;
  };
  VC_RETURN_IF_ERROR(RunBatch(engine, draft_engine, batch, after_step).status());
  const auto end = Clock::now();
  const double cpu_end = ProcessCpuSeconds();
  const RequestStats& st = batch[0]->stats();
  r.tokens = batch[0]->output();
  r.prefill_seconds = std::chrono::duration<double>(st.prefill_pass_end - start).count();
  r.decode_seconds = std::chrono::duration<double>(end - st.prefill_pass_end).count();
  r.decode_cpu_seconds = cpu_end - cpu_mark;
  r.prefill_cpu_seconds = cpu_mark - cpu_start;
  r.compress_seconds = st.after_prefill_seconds;
  r.verify_rounds = st.verify_rounds;
  r.fallbacks = st.fallbacks;
  if (!st.accept_lengths.empty()) {
    r.mean_accepted = std::accumulate(st.accept_lengths.begin(), st.accept_lengths.end(), 0.0) /
                      st.accept_lengths.size();
  }
  return r;
}

// Writes `model` as a llama2.c checkpoint (f32 weights only), so that a fresh
// process can load it the way `vericache generate` and the daemons do.
absl::Status WriteLlama2c(const Model& model, const std::string& path) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  if (c.dtype != Dtype::kF32 || c.qkv_bias) {
    return absl::InvalidArgumentError("a llama2.c file holds f32 weights without biases only");
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError("cannot create " + path);
  bool ok = true;
  auto put = [&](const void* p, int64_t floats) {
    ok = ok && std::fwrite(p, sizeof(float), floats, f) == static_cast<size_t>(floats);
  };
  const int32_t hdr[7] = {c.dim,        c.hidden_dim,
                          c.n_layers,   c.n_heads,
                          c.n_kv_heads, c.tied_embeddings ? c.vocab_size : -c.vocab_size,
                          c.max_seq_len};
  ok = std::fwrite(hdr, sizeof hdr, 1, f) == 1;
  const int64_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim(), vocab = c.vocab_size;
  put(w.token_embedding.f32(), vocab * d);
  for (const auto& l : w.layers) put(l.rms_att, d);
  for (const auto& l : w.layers) put(l.wq.f32(), q * d);
  for (const auto& l : w.layers) put(l.wk.f32(), kv * d);
  for (const auto& l : w.layers) put(l.wv.f32(), kv * d);
  for (const auto& l : w.layers) put(l.wo.f32(), d * q);
  for (const auto& l : w.layers) put(l.rms_ffn, d);
  for (const auto& l : w.layers) put(l.w1.f32(), h * d);
  for (const auto& l : w.layers) put(l.w2.f32(), d * h);
  for (const auto& l : w.layers) put(l.w3.f32(), h * d);
  put(w.rms_final, d);
  const std::vector<float> freq_cis(static_cast<size_t>(c.max_seq_len) * c.head_dim, 0.0f);
  put(freq_cis.data(), static_cast<int64_t>(freq_cis.size()));
  if (!c.tied_embeddings) put(w.classifier.f32(), vocab * d);
  ok = std::fclose(f) == 0 && ok;
  return ok ? absl::OkStatus() : absl::InternalError("cannot write " + path);
}

struct PassTime {
  double median = 0, min = 0, cpu = 0;  // cpu: median CPU seconds of the process's threads
  // The cost table's rows: the medians over repetitions of this pass's wall
  // and CPU time divided by the 1-token pass's in the same repetition.
  double step_ratio = 0, cpu_step_ratio = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Median and fastest seconds of one Forward of each count of tokens in
// `counts`, appended to `kv` (truncated back after each), and the median CPU
// time the pass's threads used. On a shared machine the fastest pass is the
// one least disturbed by other processes, and CPU time counts little of the
// time the threads waited for a core (the engine's threads spin for at most
// ThreadPoolOptions::spin_us before they block), so all three are printed.
// Each of `reps` repetitions (after one warm-up) times every count in turn,
// so that a change in the machine's load or memory bandwidth during the
// table hits every row alike; when `counts` holds 1, the rows' ratios to the
// 1-token pass are taken per repetition. With `stages`, each timed pass of
// counts[i] also adds its stages to (*stages)[i] (Engine::set_stage_times).
absl::StatusOr<std::vector<PassTime>> PassTable(Engine& engine, SequenceKv& kv,
                                                const std::vector<int>& counts, int reps,
                                                std::mt19937_64& rng,
                                                std::vector<StageTimes>* stages = nullptr) {
  if (stages != nullptr) stages->assign(counts.size(), StageTimes());
  const int32_t base = kv.next_position();
  std::uniform_int_distribution<int32_t> tok(0, engine.config().vocab_size - 1);
  std::vector<float> logits;
  std::vector<std::vector<double>> t(counts.size()), cpu(counts.size());
  for (int rep = 0; rep < reps + 1; ++rep) {
    for (size_t i = 0; i < counts.size(); ++i) {
      std::vector<int32_t> tokens(counts[i]);
      for (int32_t& x : tokens) x = tok(rng);
      SequenceInput in{&kv, tokens, 0};
      engine.set_stage_times(stages != nullptr && rep > 0 ? &(*stages)[i] : nullptr);
      const auto t0 = Clock::now();
      const double c0 = ProcessCpuSeconds();
      const absl::Status status = engine.Forward({&in, 1}, &logits);
      engine.set_stage_times(nullptr);
      VC_RETURN_IF_ERROR(status);
      if (rep > 0) {  // 1 warm-up
        t[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        cpu[i].push_back(ProcessCpuSeconds() - c0);
      }
      kv.Truncate(base);
    }
  }
  const size_t one =
      static_cast<size_t>(std::find(counts.begin(), counts.end(), 1) - counts.begin());
  std::vector<PassTime> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    out[i] = PassTime{Median(t[i]), *std::min_element(t[i].begin(), t[i].end()), Median(cpu[i])};
    if (one == counts.size()) continue;
    std::vector<double> ratio, cpu_ratio;
    for (size_t r = 0; r < t[i].size(); ++r) {
      ratio.push_back(t[i][r] / t[one][r]);
      cpu_ratio.push_back(cpu[i][r] / cpu[one][r]);
    }
    out[i].step_ratio = Median(ratio);
    out[i].cpu_step_ratio = Median(cpu_ratio);
  }
  return out;
}

// Each row's stages against the step's: a second PassTable with the
// engine's stage clock on (the cost table above runs without it); prints
// each stage's mean ms per pass and, for the counts other than 1, its
// multiple of the 1-token pass's.
absl::Status PrintStages(Engine& engine, SequenceKv& kv, const std::vector<int>& counts, int reps,
                         std::mt19937_64& rng) {
  std::vector<StageTimes> times;
  VC_RETURN_IF_ERROR(PassTable(engine, kv, counts, reps, rng, &times).status());
  // ms[i][st]: mean ms per pass of counts[i] in stage st; the last column
  // is their sum.
  std::vector<std::vector<double>> ms(counts.size(), std::vector<double>(StageTimes::kCount + 1));
  for (size_t i = 0; i < counts.size(); ++i) {
    for (int st = 0; st < StageTimes::kCount; ++st) {
      ms[i][st] = times[i].seconds[st] * 1e3 / static_cast<double>(times[i].passes);
      ms[i][StageTimes::kCount] += ms[i][st];
    }
  }
  const size_t one =
      static_cast<size_t>(std::find(counts.begin(), counts.end(), 1) - counts.begin());
  const bool ratios = one < counts.size();
  std::printf("\nstages of a pass (mean ms over %d passes of each; x: the 1-token pass's):\n%-16s",
              reps, "stage");
  for (size_t i = 0; i < counts.size(); ++i) {
    std::printf(" %7d tok%s", counts[i], ratios && i != one ? "        " : "");
  }
  std::printf("\n");
  for (int st = 0; st <= StageTimes::kCount; ++st) {
    std::printf("%-16s", st < StageTimes::kCount ? StageTimes::Name(st) : "sum");
    for (size_t i = 0; i < counts.size(); ++i) {
      std::printf(" %11.3f", ms[i][st]);
      if (ratios && i != one) {
        std::printf(" %6.2fx", ms[one][st] > 0 ? ms[i][st] / ms[one][st] : 0.0);
      }
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

// PassTable for one count of tokens (no ratios).
absl::StatusOr<PassTime> PassSeconds(Engine& engine, SequenceKv& kv, int n, int reps,
                                     std::mt19937_64& rng) {
  VC_ASSIGN_OR_RETURN(const std::vector<PassTime> one, PassTable(engine, kv, {n}, reps, rng));
  return one[0];
}

struct StepSample {
  double wall = 0, cpu = 0;  // seconds
  long minflt = 0;           // minor page faults of the process
};

// Times 1-token passes appended to `kv` (kept), one sample each.
absl::StatusOr<std::vector<StepSample>> Steps(Engine& engine, SequenceKv& kv, int n,
                                              std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> tok(0, engine.config().vocab_size - 1);
  std::vector<float> logits;
  std::vector<StepSample> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = tok(rng);
    SequenceInput in{&kv, {&t, 1}, 0};
    rusage r0{}, r1{};
    getrusage(RUSAGE_SELF, &r0);
    const double c0 = ProcessCpuSeconds();
    const auto t0 = Clock::now();
    VC_RETURN_IF_ERROR(engine.Forward({&in, 1}, &logits));
    StepSample sm;
    sm.wall = std::chrono::duration<double>(Clock::now() - t0).count();
    sm.cpu = ProcessCpuSeconds() - c0;
    getrusage(RUSAGE_SELF, &r1);
    sm.minflt = r1.ru_minflt - r0.ru_minflt;
    out.push_back(sm);
  }
  return out;
}

// Prints the first 4 samples as multiples of `step` (wall) and `step_cpu`.
void PrintFirst(const char* what, const std::vector<StepSample>& first, double step,
                double step_cpu) {
  std::printf("%s (x the steady step %.2f ms, CPU %.2f ms):\n  wall", what, step * 1e3,
              step_cpu * 1e3);
  for (int i = 0; i < 4; ++i) std::printf(" %.2f", first[i].wall / step);
  std::printf("   CPU");
  for (int i = 0; i < 4; ++i) std::printf(" %.2f", first[i].cpu / step_cpu);
  std::printf("   minor faults");
  for (int i = 0; i < 4; ++i) std::printf(" %ld", first[i].minflt);
  double worst = 0, worst_cpu = 0;
  for (int i = 0; i < 4; ++i) {
    worst = std::max(worst, first[i].wall / step);
    worst_cpu = std::max(worst_cpu, first[i].cpu / step_cpu);
  }
  // Judged on CPU time: first-touch costs (page faults, and a hypervisor's
  // work behind them) are CPU time of this process, while wall time on a
  // shared machine also counts the waits for a core.
  std::printf("\n  worst: wall %.2fx, CPU %.2fx (target <= 2x, judged on CPU time): %s\n", worst,
              worst_cpu, worst_cpu <= 2.0 ? "ok" : "OVER");
}

// The child: a fresh process loads `path` and runs 20 1-token passes from
// position 0; the steady step is the median of the last 16.
absl::Status FreshProcess(const Options& o) {
  const auto t0 = Clock::now();
  VC_ASSIGN_OR_RETURN(auto model, Model::Load(o.fresh_process));
  EngineOptions eo;
  eo.backend.threads = o.threads;
  eo.backend.simd = o.simd;
  eo.warmup_tokens = o.warmup_tokens;
  VC_ASSIGN_OR_RETURN(auto engine, Engine::Create(*model, eo));
  const double load = std::chrono::duration<double>(Clock::now() - t0).count();
  PagedKvCache kv(model->config());
  std::mt19937_64 rng(o.seed + 2);
  VC_ASSIGN_OR_RETURN(const auto s, Steps(*engine, kv, 20, rng));
  std::vector<double> wall, cpu;
  for (size_t i = 4; i < s.size(); ++i) {
    wall.push_back(s[i].wall);
    cpu.push_back(s[i].cpu);
  }
  std::printf("\nfresh process: model file loaded and engine created in %.2f s\n", load);
  const double step = Median(wall), step_cpu = Median(cpu);
  PrintFirst("first 4 1-token passes of the fresh process", s, step, step_cpu);
  // How far single steady steps stray on this machine: a first pass within
  // this spread is noise, not a first-touch cost.
  std::printf("  the 16 steady steps themselves: up to wall %.2fx, CPU %.2fx\n",
              *std::max_element(wall.begin(), wall.end()) / step,
              *std::max_element(cpu.begin(), cpu.end()) / step_cpu);
  return absl::OkStatus();
}

// Writes the model to a temporary llama2.c file and runs FreshProcess in a
// new process of this binary.
absl::Status SpawnFresh(const Options& o, const Model& model) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("vc_single_node_bench." + std::to_string(::getpid()) + ".bin"))
                               .string();
  if (absl::Status s = WriteLlama2c(model, path); !s.ok()) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return absl::Status(s.code(), std::string(s.message()) + " (--no-fresh skips the check)");
  }
  std::vector<std::string> args = {"vc_single_node_bench",
                                   "--fresh-process",
                                   path,
                                   "--threads",
                                   std::to_string(o.threads),
                                   "--simd",
                                   o.simd,
                                   "--seed",
                                   std::to_string(o.seed),
                                   "--warmup-tokens",
                                   std::to_string(o.warmup_tokens)};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = 0;
  const int err = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
  int status = 0;
  if (err == 0) ::waitpid(pid, &status, 0);
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (err != 0) return absl::InternalError("cannot start the fresh process (--no-fresh skips it)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError("the fresh process failed (--no-fresh skips it)");
  }
  return absl::OkStatus();
}

// One pair of runs: the same prompt in full mode and in VeriCache mode.
struct RunPair {
  RunResult full, vericache;
  bool same = false;
  double Speedup() const {
    return (vericache.tokens.size() / vericache.decode_seconds) /
           (full.tokens.size() / full.decode_seconds);
  }
};

// Every pair's row, then the median speedup over the pairs: the first pair
// is the process's first request of each mode (it faults in memory that
// later requests reuse), so one pair alone overstates what a serving
// process pays per request.
void PrintRuns(const Options& o, const std::vector<RunPair>& pairs) {
  std::printf("\n%-4s %-58s %10s %10s %12s %9s\n", "run", "mode", "prefill s", "decode s",
              "decode tok/s", "accepted");
  const std::string label = "vericache --compressor " + o.compressor + " --draft-weights " +
                            o.draft_weights + " --draft-len " + std::to_string(o.draft_len);
  std::vector<double> speedups;
  bool all_same = true;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const RunPair& p = pairs[i];
    const RunResult& f = p.full;
    const RunResult& v = p.vericache;
    std::printf("%-4zu %-58s %10.2f %10.3f %12.2f %9s\n", i + 1, "full", f.prefill_seconds,
                f.decode_seconds, f.tokens.size() / f.decode_seconds, "-");
    std::printf("%-4zu %-58s %10.2f %10.3f %12.2f %9.2f\n", i + 1, label.c_str(), v.prefill_seconds,
                v.decode_seconds, v.tokens.size() / v.decode_seconds, v.mean_accepted);
    std::printf(
        "     identical token for token: %s (%zu tokens); verify rounds %lld, fallbacks %lld; "
        "speedup %.3fx; decode CPU s full %.3f, vericache %.3f; compressing the prompt's KV "
        "%.3f s wall\n",
        p.same ? "yes" : "NO", f.tokens.size(), static_cast<long long>(v.verify_rounds),
        static_cast<long long>(v.fallbacks), p.Speedup(), f.decode_cpu_seconds,
        v.decode_cpu_seconds, v.compress_seconds);
    std::printf(
        "     per step: full %.2f ms (%lld steps); vericache draft %.2f ms (%lld steps), verify "
        "%.2f ms (%lld passes)\n",
        f.full_steps > 0 ? f.full_step_seconds / f.full_steps * 1e3 : 0.0,
        static_cast<long long>(f.full_steps),
        v.draft_steps > 0 ? v.draft_step_seconds / v.draft_steps * 1e3 : 0.0,
        static_cast<long long>(v.draft_steps),
        v.verify_rounds > 0 ? v.verify_pass_seconds / v.verify_rounds * 1e3 : 0.0,
        static_cast<long long>(v.verify_rounds));
    speedups.push_back(p.Speedup());
    all_same = all_same && p.same;
  }
  std::printf(
      "outputs identical token for token in every run: %s\n"
      "decode speedup (vericache / full), median of %zu runs: %.3fx (each run: ",
      all_same ? "yes" : "NO", speedups.size(), Median(speedups));
  for (size_t i = 0; i < speedups.size(); ++i) {
    std::printf("%s%.3fx", i == 0 ? "" : ", ", speedups[i]);
  }
  std::printf("; target 1.7x)\n");
  std::printf(
      "prefill step CPU time of run 1: full %.3f s (the process's first request), vericache "
      "%.3f s (with the compression)\n",
      pairs[0].full.prefill_cpu_seconds, pairs[0].vericache.prefill_cpu_seconds);
}

// The speedup this run's measured costs would give at the acceptance of the
// trained test models, printed as a prediction (a random model's acceptance
// is not a trained one's). Two estimates: from the cost table (a round =
// draft_len drafter steps + one pass of draft_len + 1 tokens, against one
// full step per token) and from the generation runs (the VeriCache run's
// cost per round, its prompt compression once, against the full run's
// decode time).
absl::Status PrintPrediction(const Options& o, const RunPair* runs, double step, double verify_pass,
                             double draft_step) {
  std::string text = o.trained_rounds;
  if (text.empty()) {
    if (o.compressor != "int8" || o.draft_weights != "int8" || o.draft_len != 8) {
      std::printf(
          "prediction at trained acceptance: skipped (the measured table is for --compressor "
          "int8 --draft-weights int8 --draft-len 8; give --trained-rounds for others)\n");
      return absl::OkStatus();
    }
    text = kTrainedRoundsInt8Int8X8;
  }
  VC_ASSIGN_OR_RETURN(const std::vector<TrainedRounds> trained, ParseTrainedRounds(text));
  const double round_steps = (o.draft_len * draft_step + verify_pass) / step;
  std::printf(
      "\nPREDICTION, not a measurement: the speedup these costs would give at the tokens per "
      "round\nof the trained test models (docs/results.md section 3); a round = %d drafter "
      "steps + one %d-token pass = %.2f full steps (median wall times above)\n",
      o.draft_len, o.draft_len + 1, round_steps);
  double round_s = 0, compress_s = 0, full_decode_s = 0;
  int64_t decode_tokens = 0;
  if (runs != nullptr && runs->vericache.verify_rounds > 0) {
    const RunResult& f = runs->full;
    const RunResult& v = runs->vericache;
    compress_s = v.compress_seconds;
    round_s = std::max(0.0, v.decode_seconds - compress_s) / v.verify_rounds;
    full_decode_s = f.decode_seconds;
    // The prefill's logits give the first token; the rest is decode.
    decode_tokens = static_cast<int64_t>(f.tokens.size()) - 1;
    std::printf(
        "from the last run: a round cost %.2f ms (decode s less the compression's %.3f s, over "
        "%lld rounds)\n",
        round_s * 1e3, compress_s, static_cast<long long>(v.verify_rounds));
  }
  std::printf("%-16s %16s %22s %22s\n", "trained model", "tokens/round", "speedup (cost table)",
              "speedup (the runs)");
  for (const TrainedRounds& t : trained) {
    const double a = std::min(t.tokens_per_round, static_cast<double>(o.draft_len + 1));
    std::printf("%-16s %16.2f %21.2fx", t.model.c_str(), a, a / round_steps);
    if (round_s > 0 && decode_tokens > 0) {
      const double predicted = compress_s + decode_tokens / a * round_s;
      std::printf(" %21.2fx", full_decode_s / predicted);
    } else {
      std::printf(" %22s", "-");
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

absl::Status Run(const Options& o) {
  const ModelConfig c = BenchConfig(o.small);
  VC_ASSIGN_OR_RETURN(const kernels::WeightFormat wf, kernels::ParseWeightFormat(o.draft_weights));
  if (o.prompt_len < 2 || o.prompt_len + o.max_new > c.max_seq_len) {
    return absl::InvalidArgumentError("prompt + new tokens exceed the context");
  }
  if (o.runs < 1 || o.runs > 100 || o.reps < 1 || o.reps > 1000) {
    return absl::InvalidArgumentError("--runs must be in [1, 100] and --reps in [1, 1000]");
  }
  if (o.draft_len < 1 || o.draft_len > 64 || o.prompt_len + o.draft_len + 1 > c.max_seq_len) {
    return absl::InvalidArgumentError("--draft-len must be in [1, 64] and fit the context");
  }
  // Checked before the long runs, not after them.
  VC_RETURN_IF_ERROR(ParseTrainedRounds(o.trained_rounds).status());
  VC_RETURN_IF_ERROR(kernels::ParseSimdLevel(o.simd).status());
  std::printf(
      "model: random llama2.c-shaped, dim %d hidden %d layers %d heads %d/%d vocab %d "
      "ctx %d (%.1fM parameters); prompt %d tokens, %lld new, --threads %d, --simd %s\n",
      c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.max_seq_len,
      c.num_parameters() / 1e6, o.prompt_len, static_cast<long long>(o.max_new), o.threads,
      o.simd.c_str());
  VC_ASSIGN_OR_RETURN(std::vector<int> pass_tokens,
                      ParsePassTokens(o.pass_tokens, c.max_seq_len - o.prompt_len));
  VC_ASSIGN_OR_RETURN(auto model, Model::CreateRandom(c, o.seed));
  // First, while this process's own passes cannot disturb it.
  if (!o.no_fresh) VC_RETURN_IF_ERROR(SpawnFresh(o, *model));
  EngineOptions eo;
  eo.backend.threads = o.threads;
  eo.backend.simd = o.simd;
  eo.max_batch_tokens = std::max(4096, o.prompt_len);
  eo.warmup_tokens = o.warmup_tokens;
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
  double full_cpu_per_step = 0;
  std::vector<RunPair> pairs;
  if (!o.table_only) {
    for (int i = 0; i < o.runs; ++i) {
      // Alternating which mode goes first, so that neither always runs
      // right after the other's memory traffic.
      RunPair p;
      if (i % 2 == 0) {
        VC_ASSIGN_OR_RETURN(p.full, Generate(*engine, nullptr, prompt, full));
        VC_ASSIGN_OR_RETURN(p.vericache, Generate(*engine, draft_engine.get(), prompt, vc));
      } else {
        VC_ASSIGN_OR_RETURN(p.vericache, Generate(*engine, draft_engine.get(), prompt, vc));
        VC_ASSIGN_OR_RETURN(p.full, Generate(*engine, nullptr, prompt, full));
      }
      p.same = p.full.tokens == p.vericache.tokens;
      same = same && p.same;
      std::fprintf(stderr, "run %d of %d: speedup %.3fx\n", i + 1, o.runs, p.Speedup());
      pairs.push_back(std::move(p));
    }
    const RunResult& f = pairs.back().full;
    // The prefill's logits give the first token: tokens - 1 decode steps.
    if (f.tokens.size() > 1) full_cpu_per_step = f.decode_cpu_seconds / (f.tokens.size() - 1);
    PrintRuns(o, pairs);
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
      "of %d repetitions, each running every row's pass in turn; x step: median of the "
      "per-repetition ratios to the 1-token pass, fastest / fastest):\n",
      o.prompt_len, o.reps);
  std::printf("%8s %10s %8s %10s %8s %10s %8s\n", "tokens", "median ms", "x step", "min ms",
              "x step", "CPU ms", "x step");
  // The first steps right after the prefill, timed before anything else
  // runs on this KV (then dropped again).
  VC_ASSIGN_OR_RETURN(const auto after_prefill, Steps(*engine, kv, 4, rng));
  kv.Truncate(o.prompt_len);
  PassTime step, verify_pass;  // verify_pass: draft_len + 1 tokens, a VeriCache round's
  if (std::find(pass_tokens.begin(), pass_tokens.end(), o.draft_len + 1) == pass_tokens.end()) {
    pass_tokens.push_back(o.draft_len + 1);
    std::sort(pass_tokens.begin(), pass_tokens.end());
  }
  VC_ASSIGN_OR_RETURN(const std::vector<PassTime> table,
                      PassTable(*engine, kv, pass_tokens, o.reps, rng));
  for (size_t i = 0; i < pass_tokens.size(); ++i) {
    if (pass_tokens[i] == 1) step = table[i];
    if (pass_tokens[i] == o.draft_len + 1) verify_pass = table[i];
  }
  for (size_t i = 0; i < pass_tokens.size(); ++i) {
    const PassTime& p = table[i];
    std::printf("%8d %10.2f %8.2f %10.2f %8.2f %10.2f %8.2f\n", pass_tokens[i], p.median * 1e3,
                p.step_ratio, p.min * 1e3, p.min / step.min, p.cpu * 1e3, p.cpu_step_ratio);
  }
  {
    // What the step streams (f32 weights: every matrix, the classifier's
    // whole table, one embedding row; the KV of every position), so a
    // reader can tell which phase of the machine's memory bandwidth a run
    // met: the ratios above move with it (a slower stream hides more of a
    // pass's arithmetic).
    const double weights =
        4.0 * static_cast<double>(c.num_parameters() -
                                  (c.tied_embeddings ? 0 : int64_t{c.vocab_size} * c.dim));
    const double kv_bytes = 4.0 * 2 * c.n_layers * c.kv_dim() * (o.prompt_len + 1.0);
    std::printf(
        "the 1-token step streams %.0f MB (f32 weights %.0f, KV %.0f): %.1f GB/s at its median, "
        "%.1f at its fastest\n",
        (weights + kv_bytes) / 1e6, weights / 1e6, kv_bytes / 1e6,
        (weights + kv_bytes) / step.median / 1e9, (weights + kv_bytes) / step.min / 1e9);
  }
  PrintFirst("first 4 1-token steps after the prompt's prefill", after_prefill, step.median,
             step.cpu);
  if (o.stages) VC_RETURN_IF_ERROR(PrintStages(*engine, kv, pass_tokens, o.reps, rng));
  if (full_cpu_per_step > 0) {
    std::printf("full decode in RunBatch: %.2f ms CPU per step = %.2f x the isolated step's CPU\n",
                full_cpu_per_step * 1e3, full_cpu_per_step / step.cpu);
  }
  if (draft_engine != nullptr) {
    // The drafter's step: quantised weights over the compressed prompt KV.
    VC_ASSIGN_OR_RETURN(auto compressor, CreateCompressor(vc.compressor));
    const AttentionStats no_stats(c, 0, 0);
    rusage r0{}, r1{};
    getrusage(RUSAGE_SELF, &r0);
    const double c0 = ProcessCpuSeconds();
    const auto t0 = Clock::now();
    VC_ASSIGN_OR_RETURN(auto prefix, compressor->Compress(c, kv, o.prompt_len, no_stats));
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = ProcessCpuSeconds() - c0;
    getrusage(RUSAGE_SELF, &r1);
    std::printf(
        "compressing the prompt's KV (%s): %.2f ms wall, %.2f ms CPU = %.2f x the full "
        "step's CPU, %ld minor faults\n",
        o.compressor.c_str(), wall * 1e3, cpu * 1e3, cpu / step.cpu, r1.ru_minflt - r0.ru_minflt);
    CompressedSequenceKv dkv(c, std::move(prefix), 0, nullptr);
    VC_ASSIGN_OR_RETURN(const PassTime dp, PassSeconds(*draft_engine, dkv, 1, o.reps, rng));
    VC_ASSIGN_OR_RETURN(const PassTime d32p, PassSeconds(*engine, dkv, 1, o.reps, rng));
    const double d = dp.median, d32 = d32p.median;
    std::printf(
        "drafter 1-token step (%s weights, %s KV): %.2f ms = %.2f x the full step; "
        "with f32 weights on the same KV: %.2f ms = %.2f x\n",
        o.draft_weights.c_str(), o.compressor.c_str(), d * 1e3, d / step.median, d32 * 1e3,
        d32 / step.median);
    VC_RETURN_IF_ERROR(PrintPrediction(o, pairs.empty() ? nullptr : &pairs.back(), step.median,
                                       verify_pass.median, d));
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
                "only the verify-pass cost table (skips the generation runs)");
  flags.AddBool("--stages", &o.stages,
                "after the cost table, each row's pass split into the engine's stages");
  flags.Add("--prompt-len", &o.prompt_len, "N", "prompt tokens");
  flags.Add("--max-new", &o.max_new, "N", "tokens to generate");
  flags.Add("--threads", &o.threads, "N", "engine threads");
  flags.Add("--simd", &o.simd, "LEVEL", "kernel SIMD level: scalar | avx2 | avx512 | auto");
  flags.Add("--draft-len", &o.draft_len, "X", "VeriCache draft length");
  flags.Add("--compressor", &o.compressor, "NAME", "KV compressor of the drafter");
  flags.Add("--draft-weights", &o.draft_weights, "FORMAT", "f32 | int8 | int4");
  flags.Add("--reps", &o.reps, "N", "timed passes per row of the cost table");
  flags.Add("--pass-tokens", &o.pass_tokens, "LIST",
            "tokens per pass of the cost table's rows, comma-separated (1 is always added; "
            "draft length + 1 too)");
  flags.Add("--runs", &o.runs, "N",
            "pairs of generation runs (full and VeriCache, alternating which goes first); the "
            "speedup is their median");
  flags.Add("--seed", &o.seed, "N", "seed of the weights and the prompt");
  flags.Add("--warmup-tokens", &o.warmup_tokens, "N",
            "tokens of the engines' warm-up pass at creation (EngineOptions::warmup_tokens; 0: "
            "none)");
  flags.Add("--trained-rounds", &o.trained_rounds, "NAME=TOKENS,...",
            "tokens per verify round of trained models for the printed prediction (default: "
            "docs/results.md section 3's table for int8 KV, int8 weights, draft length 8)");
  flags.AddBool("--no-fresh", &o.no_fresh,
                "skip the fresh-process warm-up check (it writes the model to a temporary file)");
  flags.Add("--fresh-process", &o.fresh_process, "FILE",
            "internal: be the fresh process of the warm-up check on this llama2.c file");
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
  if (absl::Status s = o.fresh_process.empty() ? vc::Run(o) : vc::FreshProcess(o); !s.ok()) {
    std::fprintf(stderr, "vc_single_node_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
