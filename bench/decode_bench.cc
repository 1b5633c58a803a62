// vc_decode_bench: decode throughput of the exact CPU engine against two
// machine ceilings measured in the same run.
//
// For each model (the llama2.c test model stories260K.bin and a synthetic f32
// model of ~110M parameters) and each batch size B in {1, 8, 32}: B
// independent sequences, each with a PagedKvCache prefilled with a 64-token
// context, run repeated decode steps; one step is ONE Engine::Forward call
// that adds one token (with its logits) to each of the B sequences. After each
// step every cache is truncated back to 64 tokens, so every timed step attends
// over exactly 64 + 1 positions. Warm-up steps first, then the median of the
// timed steps is reported.
//
// Ceilings (same thread count as the engine, on a vc::ThreadPool), measured
// before and after the decode runs (the higher value is the run's ceiling):
//  * read bandwidth: sum-reduction of a 1 GiB buffer with the widest vector
//    ISA the CPU has (AVX-512 / AVX2 / scalar), best of several passes;
//  * FP32 FMA peak: a register-resident loop of independent FMAs (16 zmm /
//    12 ymm accumulators per thread), best of several runs.
// --quick (CI smoke) uses a ~4M-parameter synthetic model that fits in the
// caches, a 256 MiB buffer and few steps: its ratios are not the targets'.
// On a shared VM the host's memory bandwidth drifts by tens of percent
// within seconds, so the read bandwidth is also sampled (best of 3 passes)
// right before and right after every row, and a row's %bw is against that
// nearby figure; the run's best sample is reported too.
// Derived figures: GB/s = matmul weight bytes / step time (every weight
// matrix is streamed once per step whatever B is); GFLOP/s = 2 * matmul
// parameters * B / step time (matmul FLOPs only: attention, norms, RoPE and
// SiLU are not counted).
// Targets (reported as PASS/FAIL, the exit status is 0 either way):
//  * batch-1 decode of the ~100M model >= 60% of the read bandwidth;
//  * batch-32 decode of the ~100M model >= 40% of the FMA peak.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/ceilings.h"
#include "bench/int_list.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/engine/engine.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "kernels/kernels.h"
#include "nlohmann/json.hpp"

#ifndef VC_DEFAULT_MODELS_DIR
#define VC_DEFAULT_MODELS_DIR ""
#endif

namespace vc {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Options {
  int threads = 0;
  std::string simd = "auto";
  std::string models_dir;
  bool quick = false;
  bool json = false;
  int context = 64;
  std::string batches = "1,8,32";
  int64_t bandwidth_mib = 1024;
  uint64_t seed = 1234;
};

// ---------------------------------------------------------------- ceilings

enum class Isa { kScalar, kAvx2, kAvx512 };

Isa DetectIsa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

// The two ceilings, on a pool with the engine's thread count. The read
// buffer stays allocated for the whole run so that the bandwidth can also be
// sampled right next to each decode row.
class Ceilings {
 public:
  Ceilings(int threads, const Options& opt)
      : opt_(opt),
        pool_(threads),
        isa_(DetectIsa()),
        blocks_(std::max<int64_t>(1, opt.bandwidth_mib)) {
    using namespace vc::bench;  // NOLINT: the ceiling kernels
    read_sum_ = isa_ == Isa::kAvx512 ? ReadSumAvx512
                : isa_ == Isa::kAvx2 ? ReadSumAvx2
                                     : ReadSumScalar;
    fma_loop_ = isa_ == Isa::kAvx512 ? FmaLoopAvx512
                : isa_ == Isa::kAvx2 ? FmaLoopAvx2
                                     : FmaLoopScalar;
    flops_per_iter_ = isa_ == Isa::kAvx512 ? FmaFlopsPerIterAvx512()
                      : isa_ == Isa::kAvx2 ? FmaFlopsPerIterAvx2()
                                           : FmaFlopsPerIterScalar();
    buf_.reset(new float[static_cast<size_t>(blocks_ * kBlockFloats)]);
    // First touch from the pool, so pages are spread like the reads will be.
    pool_.ParallelFor(blocks_, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0 * kBlockFloats; i < b1 * kBlockFloats; ++i) {
        buf_[i] = static_cast<float>(i & 1023) * (1.0f / 1024.0f);
      }
    });
    partial_.resize(static_cast<size_t>(blocks_));
  }

  const char* IsaName() const {
    return isa_ == Isa::kAvx512 ? "avx512" : isa_ == Isa::kAvx2 ? "avx2" : "scalar";
  }
  int64_t BufferBytes() const { return blocks_ * kBlockFloats * 4; }

  // Best of `passes` vectorised sum-reductions of the whole buffer, in GB/s.
  // The buffer is split into 1 MiB blocks that the pool hands out in
  // contiguous pieces (a few per thread).
  double ReadBandwidth(int passes) {
    double best = 0;
    for (int pass = 0; pass < passes; ++pass) {
      const auto t0 = Clock::now();
      pool_.ParallelFor(blocks_, 1, [&](int64_t b0, int64_t b1) {
        partial_[b0] = read_sum_(buf_.get() + b0 * kBlockFloats, (b1 - b0) * kBlockFloats);
      });
      const double s = Seconds(t0, Clock::now());
      for (float v : partial_) sink_ += v;
      best = std::max(best, static_cast<double>(BufferBytes()) / s / 1e9);
    }
    return best;
  }

  // Best of several runs of threads * 4 equal pieces of the FMA loop, each
  // long enough (~10+ ms) that every worker wakes up and takes its share.
  double FmaPeak() {
    const int64_t pieces = int64_t{pool_.num_threads()} * 4;
    const int64_t iters = opt_.quick ? (int64_t{1} << 19) : (int64_t{1} << 22);
    const int runs = opt_.quick ? 3 : 6;
    std::vector<float> partial(static_cast<size_t>(pieces));
    double best = 0;
    for (int run = 0; run < runs; ++run) {
      const auto t0 = Clock::now();
      pool_.ParallelFor(pieces, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) partial[p] = fma_loop_(iters);
      });
      const double s = Seconds(t0, Clock::now());
      for (float v : partial) sink_ += v;
      const double flops = static_cast<double>(pieces) * static_cast<double>(iters) *
                           static_cast<double>(flops_per_iter_);
      best = std::max(best, flops / s / 1e9);
    }
    return best;
  }

  ~Ceilings() {
    if (sink_ == 12345.678f) std::fprintf(stderr, " ");  // keeps the sums live
  }

 private:
  static constexpr int64_t kBlockFloats = (int64_t{1} << 20) / 4;
  const Options& opt_;
  ThreadPool pool_;
  const Isa isa_;
  const int64_t blocks_;
  float (*read_sum_)(const float*, int64_t) = nullptr;
  float (*fma_loop_)(int64_t) = nullptr;
  int64_t flops_per_iter_ = 0;
  std::unique_ptr<float[]> buf_;
  std::vector<float> partial_;
  float sink_ = 0;
};

// ---------------------------------------------------------------- decode

// Parameters of the matrices a step multiplies by: every layer's projections
// and the classifier (the embedding lookup reads only one row per token).
int64_t MatmulParams(const ModelConfig& c) {
  const int64_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  return int64_t{c.n_layers} * (d * q + 2 * kv * d + q * d + 3 * h * d) + int64_t{c.vocab_size} * d;
}

struct Row {
  std::string model;
  int64_t params = 0;
  int64_t weight_bytes = 0;
  int batch = 0;
  int context = 0;
  int steps = 0;
  double step_s = 0;  // median
  double tokens_per_s = 0;
  double gbs = 0;
  double gflops = 0;
  double bw_near = 0;  // read bandwidth sampled right before and after this row
  double bw_ratio = 0;
  double fma_ratio = 0;
};

absl::StatusOr<std::vector<Row>> BenchModel(const std::string& label, const Model& model,
                                            const Options& opt, const std::vector<int>& batches,
                                            Ceilings& ceilings) {
  const ModelConfig& c = model.config();
  EngineOptions eo;
  eo.backend.threads = opt.threads;
  eo.backend.simd = opt.simd;
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  eo.max_batch_tokens = std::max<int64_t>(int64_t{max_batch} * opt.context, max_batch);
  VC_ASSIGN_OR_RETURN(auto engine, Engine::Create(model, eo));
  if (opt.context + 1 > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context ", opt.context, " does not fit the model's max_seq_len ", c.max_seq_len));
  }

  // Prefill max_batch sequences once (one batched Forward, no logits); the
  // smaller batches use the first B of them.
  std::mt19937 rng(static_cast<uint32_t>(opt.seed));
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  PagedKvCache::Options ko;
  ko.max_tokens = opt.context + 1;
  std::vector<std::unique_ptr<PagedKvCache>> kvs;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(max_batch));
  std::vector<SequenceInput> batch;
  for (int b = 0; b < max_batch; ++b) {
    kvs.push_back(std::make_unique<PagedKvCache>(c, ko));
    prompts[b].resize(static_cast<size_t>(opt.context));
    for (auto& t : prompts[b]) t = tok(rng);
  }
  std::vector<float> logits;
  if (opt.context > 0) {
    for (int b = 0; b < max_batch; ++b) {
      SequenceInput in;
      in.kv = kvs[b].get();
      in.tokens = prompts[b];
      in.first_logit = static_cast<int64_t>(prompts[b].size());
      batch.push_back(in);
    }
    const auto t0 = Clock::now();
    VC_RETURN_IF_ERROR(engine->Forward(batch, &logits));
    if (!opt.json) {
      std::printf("  %s: prefilled %d x %d tokens in %.2f s\n", label.c_str(), max_batch,
                  opt.context, Seconds(t0, Clock::now()));
      std::fflush(stdout);
    }
  }

  const int64_t params = MatmulParams(c);
  std::vector<Row> rows;
  std::vector<int32_t> next(static_cast<size_t>(max_batch));
  for (int b = 0; b < max_batch; ++b) next[b] = tok(rng);
  for (int batch_size : batches) {
    batch.clear();
    for (int b = 0; b < batch_size; ++b) {
      SequenceInput in;
      in.kv = kvs[b].get();
      in.tokens = std::span<const int32_t>(&next[b], 1);
      in.first_logit = 0;  // a real decode step needs the logits
      batch.push_back(in);
    }
    auto step = [&]() -> absl::StatusOr<double> {
      const auto t0 = Clock::now();
      VC_RETURN_IF_ERROR(engine->Forward(batch, &logits));
      const double s = Seconds(t0, Clock::now());
      for (int b = 0; b < batch_size; ++b) kvs[b]->Truncate(opt.context);
      return s;
    };
    // Warm up for a few steps (at least ~0.2 s), then time at least
    // min_steps steps and ~min_time seconds.
    // The read bandwidth of a shared machine drifts (other tenants), so it is
    // also sampled right before and right after this row.
    const int probe_passes = opt.quick ? 1 : 3;
    const double bw_before = ceilings.ReadBandwidth(probe_passes);
    const int warmup = opt.quick ? 1 : 3;
    const int min_steps = opt.quick ? 3 : 15;
    const double min_time = opt.quick ? 0.05 : 1.0;
    const int max_steps = opt.quick ? 50 : 2000;
    double warm_time = 0;
    for (int i = 0; i < warmup || (!opt.quick && warm_time < 0.2 && i < 1000); ++i) {
      VC_ASSIGN_OR_RETURN(double s, step());
      warm_time += s;
    }
    std::vector<double> times;
    double total = 0;
    while (static_cast<int>(times.size()) < max_steps &&
           (static_cast<int>(times.size()) < min_steps || total < min_time)) {
      VC_ASSIGN_OR_RETURN(double s, step());
      times.push_back(s);
      total += s;
    }
    const double bw_after = ceilings.ReadBandwidth(probe_passes);
    Row r;
    r.bw_near = std::max(bw_before, bw_after);
    r.model = label;
    r.params = params;
    r.weight_bytes = params * 4;
    r.batch = batch_size;
    r.context = opt.context;
    r.steps = static_cast<int>(times.size());
    r.step_s = Median(times);
    r.tokens_per_s = batch_size / r.step_s;
    r.gbs = static_cast<double>(r.weight_bytes) / r.step_s / 1e9;
    r.gflops = 2.0 * static_cast<double>(params) * batch_size / r.step_s / 1e9;
    rows.push_back(r);
  }
  return rows;
}

ModelConfig SyntheticConfig(bool quick) {
  ModelConfig c;
  c.architecture = "synthetic";
  if (quick) {  // ~5M parameters: a CI smoke run
    c.dim = 256;
    c.hidden_dim = 688;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 4;
    c.head_dim = 64;
    c.vocab_size = 4096;
  } else {  // ~110M parameters, ~440 MB of f32
    c.dim = 768;
    c.hidden_dim = 2048;
    c.n_layers = 12;
    c.n_heads = 12;
    c.n_kv_heads = 12;
    c.head_dim = 64;
    c.vocab_size = 32000;
  }
  c.max_seq_len = 256;
  c.tied_embeddings = true;
  return c;
}

absl::StatusOr<std::vector<int>> ParseBatches(const std::string& s) {
  VC_ASSIGN_OR_RETURN(const std::vector<int64_t> items,
                      vc::bench::ParseIntList("--batches", s, 1, 4096));
  return std::vector<int>(items.begin(), items.end());
}

std::string Human(int64_t params) {
  if (params >= 1000000) return absl::StrFormat("%.1fM", params / 1e6);
  return absl::StrFormat("%.0fK", params / 1e3);
}

int Run(int argc, char** argv) {
  Options opt;
  if (const char* env = std::getenv("VC_MODELS_DIR"); env != nullptr && *env != '\0') {
    opt.models_dir = env;
  } else {
    opt.models_dir = VC_DEFAULT_MODELS_DIR;
  }
  FlagSet flags("vc_decode_bench",
                "Decode tokens/s at several batch sizes vs the measured read bandwidth and FMA "
                "peak of this machine.");
  flags.Add("--threads", &opt.threads, "N", "engine and ceiling threads (0: hardware threads)");
  flags.Add("--simd", &opt.simd, "LEVEL", "kernel SIMD level: scalar | avx2 | avx512 | auto");
  flags.Add("--models-dir", &opt.models_dir, "DIR",
            "directory with stories260K.bin (from $VC_MODELS_DIR when set)");
  flags.AddBool("--quick", &opt.quick, "CI smoke run: small synthetic model, few iterations");
  flags.AddBool("--json", &opt.json, "print the results as one JSON object instead of a table");
  flags.Add("--context", &opt.context, "N", "context tokens prefilled per sequence");
  flags.Add("--batches", &opt.batches, "LIST", "comma-separated batch sizes");
  flags.Add("--bandwidth-mib", &opt.bandwidth_mib, "MIB",
            "buffer size of the read-bandwidth ceiling (--quick: 256)");
  flags.Add("--seed", &opt.seed, "N", "seed of the synthetic weights and the tokens");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Help().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (opt.quick && !flags.was_set("--bandwidth-mib")) opt.bandwidth_mib = 256;
  if (opt.context < 0) {
    std::fprintf(stderr, "--context must be >= 0\n");
    return 2;
  }
  auto batches = ParseBatches(opt.batches);
  if (!batches.ok()) {
    std::fprintf(stderr, "%s\n", std::string(batches.status().message()).c_str());
    return 2;
  }
  auto level = kernels::ParseSimdLevel(opt.simd);
  if (!level.ok()) {
    std::fprintf(stderr, "%s\n", std::string(level.status().message()).c_str());
    return 2;
  }
  if (opt.threads < 0 || opt.threads > 1024) {
    std::fprintf(stderr, "--threads must be in [0, 1024]\n");
    return 2;
  }
  const int threads = opt.threads > 0
                          ? opt.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  opt.threads = threads;

  const std::string kernel_name = absl::StrCat("cpu/", std::string(kernels::SimdLevelName(*level)));
  if (!opt.json) {
    std::printf("vc_decode_bench: threads=%d kernels=%s context=%d%s\n", threads,
                kernel_name.c_str(), opt.context, opt.quick ? " (quick)" : "");
  }
  // The ceilings are measured before and after the decode runs (the higher
  // value is the run's ceiling); the read bandwidth is also sampled around
  // every row, see BenchModel.
  Ceilings ceilings(threads, opt);
  const int passes = opt.quick ? 3 : 8;
  struct Sample {
    double read_gbs, fma_gflops;
  };
  auto measure = [&](const char* when) {
    const Sample m{ceilings.ReadBandwidth(passes), ceilings.FmaPeak()};
    if (!opt.json) {
      std::printf(
          "ceilings %s (%s, %d threads): read bandwidth %.1f GB/s (%.0f MiB buffer, best of %d "
          "passes); FP32 FMA peak %.1f GFLOP/s (best run)\n",
          when, ceilings.IsaName(), threads, m.read_gbs, ceilings.BufferBytes() / 1048576.0, passes,
          m.fma_gflops);
      std::fflush(stdout);
    }
    return m;
  };
  const Sample before = measure("before");

  std::vector<Row> rows;
  std::vector<std::string> notes;
  // The test model.
  const std::string test_path = opt.models_dir.empty() ? "" : opt.models_dir + "/stories260K.bin";
  {
    auto model = test_path.empty()
                     ? absl::StatusOr<std::unique_ptr<Model>>(absl::NotFoundError("no models dir"))
                     : Model::Load(test_path);
    if (!model.ok()) {
      notes.push_back(absl::StrCat("test model skipped: ", std::string(model.status().message())));
      if (!opt.json) std::printf("  %s\n", notes.back().c_str());
    } else {
      auto r = BenchModel("stories260K", **model, opt, *batches, ceilings);
      if (!r.ok()) {
        std::fprintf(stderr, "stories260K: %s\n", std::string(r.status().message()).c_str());
        return 1;
      }
      rows.insert(rows.end(), r->begin(), r->end());
    }
  }
  // The synthetic model.
  const ModelConfig sc = SyntheticConfig(opt.quick);
  std::string synth_label;
  {
    const auto t0 = Clock::now();
    auto model = Model::CreateRandom(sc, opt.seed);
    if (!model.ok()) {
      std::fprintf(stderr, "synthetic model: %s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    synth_label = absl::StrCat("synthetic-", Human(sc.num_parameters()));
    if (!opt.json) {
      std::printf(
          "  %s: dim=%d hidden=%d layers=%d heads=%d vocab=%d, %lld params, created in "
          "%.1f s\n",
          synth_label.c_str(), sc.dim, sc.hidden_dim, sc.n_layers, sc.n_heads, sc.vocab_size,
          static_cast<long long>(sc.num_parameters()), Seconds(t0, Clock::now()));
      std::fflush(stdout);
    }
    auto r = BenchModel(synth_label, **model, opt, *batches, ceilings);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", synth_label.c_str(),
                   std::string(r.status().message()).c_str());
      return 1;
    }
    rows.insert(rows.end(), r->begin(), r->end());
  }

  const Sample after = measure("after ");
  const double fma_peak = std::max(before.fma_gflops, after.fma_gflops);
  double read_best = std::max(before.read_gbs, after.read_gbs);
  for (const Row& r : rows) read_best = std::max(read_best, r.bw_near);
  for (Row& r : rows) {
    r.bw_ratio = r.gbs / r.bw_near;
    r.fma_ratio = r.gflops / fma_peak;
  }

  // Targets on the synthetic model.
  const Row* b1 = nullptr;
  const Row* b32 = nullptr;
  for (const Row& r : rows) {
    if (r.model != synth_label) continue;
    if (r.batch == 1) b1 = &r;
    if (r.batch == 32) b32 = &r;
  }
  struct Target {
    std::string name;
    bool present = false;
    double ratio = 0, goal = 0;
  };
  Target t_bw{"batch-1 weight streaming >= 60% of read bandwidth", b1 != nullptr,
              b1 ? b1->bw_ratio : 0, 0.60};
  const double b1_vs_best = b1 ? b1->gbs / read_best : 0;
  Target t_fma{"batch-32 matmul GFLOP/s >= 40% of FMA peak", b32 != nullptr,
               b32 ? b32->fma_ratio : 0, 0.40};

  if (opt.json) {
    nlohmann::json j;
    j["threads"] = threads;
    j["kernels"] = kernel_name;
    j["context"] = opt.context;
    j["quick"] = opt.quick;
    j["ceilings"] = {{"isa", ceilings.IsaName()},
                     {"buffer_bytes", ceilings.BufferBytes()},
                     {"read_bandwidth_gbs_before", before.read_gbs},
                     {"read_bandwidth_gbs_after", after.read_gbs},
                     {"read_bandwidth_gbs_run_best", read_best},
                     {"fma_peak_gflops_before", before.fma_gflops},
                     {"fma_peak_gflops_after", after.fma_gflops},
                     {"fma_peak_gflops", fma_peak}};
    j["flops_counted"] = "matmul only: 2 * matmul params * batch per step";
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      j["rows"].push_back({{"model", r.model},
                           {"matmul_params", r.params},
                           {"weight_bytes", r.weight_bytes},
                           {"batch", r.batch},
                           {"context", r.context},
                           {"steps", r.steps},
                           {"ms_per_step", r.step_s * 1e3},
                           {"tokens_per_s", r.tokens_per_s},
                           {"weight_gbs", r.gbs},
                           {"matmul_gflops", r.gflops},
                           {"read_bandwidth_gbs_near", r.bw_near},
                           {"bandwidth_ratio", r.bw_ratio},
                           {"bandwidth_ratio_vs_run_best", r.gbs / read_best},
                           {"fma_ratio", r.fma_ratio}});
    }
    j["targets"] = nlohmann::json::array();
    for (const Target* t : {&t_bw, &t_fma}) {
      j["targets"].push_back({{"name", t->name},
                              {"present", t->present},
                              {"ratio", t->ratio},
                              {"goal", t->goal},
                              {"pass", t->present && t->ratio >= t->goal}});
    }
    j["notes"] = notes;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf(
      "\nrun ceilings (higher of before/after): FP32 FMA peak %.1f GFLOP/s; read bandwidth %.1f "
      "GB/s (best sample of the run)\n",
      fma_peak, read_best);
  std::printf("\n%-18s %8s %5s %7s %10s %9s %8s %9s %9s %7s %6s %6s\n", "model", "params", "batch",
              "context", "tokens/s", "ms/step", "GB/s", "GFLOP/s", "bw-near", "%bw", "%fma",
              "steps");
  for (const Row& r : rows) {
    std::printf("%-18s %8s %5d %7d %10.1f %9.3f %8.2f %9.2f %9.1f %6.1f%% %5.1f%% %6d\n",
                r.model.c_str(), Human(r.params).c_str(), r.batch, r.context, r.tokens_per_s,
                r.step_s * 1e3, r.gbs, r.gflops, r.bw_near, 100 * r.bw_ratio, 100 * r.fma_ratio,
                r.steps);
  }
  std::printf(
      "\nms/step: median of the timed steps; one step = one Forward adding 1 token to each of "
      "the B sequences (KV truncated back to the context after each step).\n"
      "GB/s = f32 matmul weight bytes / step time; GFLOP/s = 2 * matmul params * batch / step "
      "time (matmul FLOPs only: attention, norms, RoPE, SiLU not counted).\n"
      "bw-near: read bandwidth (GB/s) sampled right before and after the row; %%bw = GB/s / "
      "bw-near; %%fma = GFLOP/s / run FMA peak.\n\n");
  const char* quick_note =
      opt.quick ? " [--quick: small cache-resident model, indicative only]" : "";
  if (!t_bw.present) {
    std::printf("SKIP %s (%s: batch not run)\n", t_bw.name.c_str(), synth_label.c_str());
  } else {
    std::printf(
        "%s %s (%s: %.1f%% of the %.1f GB/s measured around it; %.1f%% of the run's best "
        "%.1f GB/s)%s\n",
        t_bw.ratio >= t_bw.goal ? "PASS" : "FAIL", t_bw.name.c_str(), synth_label.c_str(),
        100 * t_bw.ratio, b1->bw_near, 100 * b1_vs_best, read_best, quick_note);
  }
  if (!t_fma.present) {
    std::printf("SKIP %s (%s: batch not run)\n", t_fma.name.c_str(), synth_label.c_str());
  } else {
    std::printf("%s %s (%s: %.1f%% of %.1f GFLOP/s)%s\n",
                t_fma.ratio >= t_fma.goal ? "PASS" : "FAIL", t_fma.name.c_str(),
                synth_label.c_str(), 100 * t_fma.ratio, fma_peak, quick_note);
  }
  return 0;
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) { return vc::Run(argc, argv); }
