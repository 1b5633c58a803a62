// vc_kv_attention_bench: the drafter's attention cost per token over INT8 and
// KIVI-2/4 compressed KV, fused kernels (kernels/quantized_kv.h: codes read
// in place) against the dequantise-then-f32 path they replace and against
// f32 attention over the full KV, as ratios measured in one run.
//
// One "token" is one query's attention over the whole prefix in every layer
// and query head: Keys, Scores, Softmax, MixValues, exactly the calls the
// engine makes (common/engine/kv_cache.h). Two shapes: stories260K's (head
// dim 8) with a 400-token prefix, and the ~110M-parameter synthetic model's
// (16 heads of 64) with a 3000-token prefix. K/V rows are random normals;
// the compressors are the real ones (common/compress), default parameters.
// One engine thread; the fused and decoded paths' outputs are checked bit
// for bit against each other.
//
// Then a verify pass's attention over the synthetic shape's full f32 KV:
// 1, 9 and 33 queries at once (a pass of that many tokens at the end of the
// prefix, causal), as the engine runs them (ScoresBatch, SoftmaxRows,
// MixValuesBatch per layer and KV head), with each phase's time, so that
// what a multi-token pass costs beyond one token's attention is visible.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/compress/attention_stats.h"
#include "common/compress/compressor.h"
#include "common/engine/kv_cache.h"
#include "common/kv/compressed_kv.h"
#include "kernels/kernels.h"

namespace vc {
namespace {

struct Options {
  std::string simd = "auto";  // scalar | avx2 | avx512 | auto
  double min_seconds = 0.1;   // per path per sample
  int samples = 7;            // medians over this many samples
  bool quick = false;         // CI smoke: short prefixes, short samples
  bool verify_only = false;   // only RunVerifyTable
};

struct Shape {
  const char* name;
  ModelConfig config;
  int32_t prefix;
  bool verify_table = false;  // also time a verify pass's attention over the f32 KV
};

ModelConfig MakeConfig(int layers, int heads, int kv_heads, int head_dim, int32_t ctx) {
  ModelConfig c;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dim = heads * head_dim;
  c.hidden_dim = c.dim;
  c.vocab_size = 32;
  c.max_seq_len = ctx;
  return c;
}

// One token's attention over every layer and query head of `kv`; `out`
// receives every head's mixed values (for the bit-for-bit check).
void AttendOnce(const kernels::KernelBackend& backend, const ModelConfig& c, const SequenceKv& kv,
                const std::vector<float>& q, std::vector<float>* scores, std::vector<float>* out) {
  const int group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_heads; ++h) {
      const int kvh = h / group;
      const SequenceKv::KeyRange range = kv.Keys(l, kvh, 0, kv.next_position());
      scores->resize(static_cast<size_t>(range.count));
      kv.Scores(backend, l, kvh, range, &q[static_cast<size_t>(h) * c.head_dim], scale,
                scores->data());
      backend.Softmax(scores->data(), range.count);
      float* o = &(*out)[(static_cast<size_t>(l) * c.n_heads + h) * c.head_dim];
      std::fill(o, o + c.head_dim, 0.0f);
      kv.MixValues(backend, l, kvh, range, scores->data(), o);
    }
  }
}

// Seconds spent in each phase of batched attention (scores, softmax, values).
struct PhaseSeconds {
  double scores = 0, softmax = 0, values = 0;
  double Total() const { return scores + softmax + values; }
};

// The attention of a verify pass of nq tokens at the end of `kv` (causal: the
// query at position p attends keys [0, p]), as the engine runs it: per layer
// and KV head one QueryBatch of all the queries, ScoresBatch, SoftmaxRows,
// MixValuesBatch. Adds each phase's time to *t.
void AttendBatch(const kernels::KernelBackend& backend, const ModelConfig& c, const SequenceKv& kv,
                 int64_t nq, const std::vector<float>& q, std::vector<float>* scores,
                 std::vector<float>* out, PhaseSeconds* t) {
  using Clock = std::chrono::steady_clock;
  const int group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int64_t n = kv.next_position();
  const int64_t queries = nq * group;
  std::vector<SequenceKv::KeyRange> ranges(static_cast<size_t>(queries));
  std::vector<float> qs(static_cast<size_t>(queries * c.head_dim));
  std::vector<float*> rows(static_cast<size_t>(queries));
  std::vector<int64_t> counts(static_cast<size_t>(queries));
  for (int l = 0; l < c.n_layers; ++l) {
    for (int kvh = 0; kvh < c.n_kv_heads; ++kvh) {
      for (int64_t i = 0; i < queries; ++i) {
        const int64_t pos = n - nq + i / group;
        ranges[i] = kv.Keys(l, kvh, 0, static_cast<int32_t>(pos));
        const int h = kvh * group + static_cast<int>(i % group);
        std::copy_n(&q[(static_cast<size_t>(i / group) * c.n_heads + h) * c.head_dim], c.head_dim,
                    &qs[static_cast<size_t>(i) * c.head_dim]);
      }
      SequenceKv::QueryBatch b;
      b.q = qs.data();
      b.ranges = ranges.data();
      b.count = queries;
      b.head_dim = c.head_dim;
      b.base = 0;
      b.ld = n;
      scores->resize(static_cast<size_t>(queries * n));
      b.scores = scores->data();
      const auto t0 = Clock::now();
      kv.ScoresBatch(backend, l, kvh, b, scale);
      const auto t1 = Clock::now();
      for (int64_t i = 0; i < queries; ++i) {
        rows[i] = b.scores + i * b.ld;
        counts[i] = ranges[i].count;
      }
      backend.SoftmaxRows(rows.data(), counts.data(), queries);
      const auto t2 = Clock::now();
      float* o = &(*out)[static_cast<size_t>(l * c.n_kv_heads + kvh) * queries * c.head_dim];
      std::fill(o, o + queries * c.head_dim, 0.0f);
      kv.MixValuesBatch(backend, l, kvh, b, o);
      const auto t3 = Clock::now();
      t->scores += std::chrono::duration<double>(t1 - t0).count();
      t->softmax += std::chrono::duration<double>(t2 - t1).count();
      t->values += std::chrono::duration<double>(t3 - t2).count();
    }
  }
}

// Seconds per call of fn, over calls filling at least min_seconds.
template <typename Fn>
double TimePerCall(double min_seconds, Fn fn) {
  int64_t calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return elapsed / static_cast<double>(calls);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The shape's prefix of random-normal K/V rows, appended to `kv`.
absl::Status FillRandom(const Shape& shape, std::mt19937& rng, PagedKvCache* kv) {
  const ModelConfig& c = shape.config;
  VC_RETURN_IF_ERROR(kv->Append(shape.prefix));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int32_t p = 0; p < shape.prefix; ++p) {
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      kv->Write(l, p, k.data(), v.data());
    }
  }
  return absl::OkStatus();
}

absl::Status RunShape(const Options& o, const kernels::KernelBackend& backend, const Shape& shape,
                      bool* all_identical) {
  const ModelConfig& c = shape.config;
  PagedKvCache full(c);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  VC_RETURN_IF_ERROR(FillRandom(shape, rng, &full));
  std::vector<float> q(static_cast<size_t>(c.n_heads) * c.head_dim);
  for (float& x : q) x = normal(rng);
  std::vector<float> scores, out_f32(static_cast<size_t>(c.n_layers) * c.n_heads * c.head_dim);
  std::vector<float> out_decoded(out_f32.size()), out_fused(out_f32.size());
  struct Method {
    const char* label;
    const char* name;
    int bits;
  };
  for (const Method& m :
       {Method{"int8", "int8", 8}, Method{"kivi-4", "kivi", 4}, Method{"kivi-2", "kivi", 2}}) {
    CompressorOptions co;
    co.name = m.name;
    co.bits = m.bits;
    VC_ASSIGN_OR_RETURN(std::unique_ptr<Compressor> compressor, CreateCompressor(co));
    AttentionStats stats(c, shape.prefix, co.window);  // unused by quantisers
    VC_ASSIGN_OR_RETURN(std::shared_ptr<const CompressedPrefix> prefix,
                        compressor->Compress(c, full, shape.prefix, stats));
    CompressedSequenceKv kv(c, prefix);
    // The three paths take turns within each sample, so that a change in
    // the machine's load hits all three; ratios are taken per sample.
    std::vector<double> f32, decoded, fused, dec_ratio, fused_ratio, speedup;
    for (int s = 0; s < o.samples; ++s) {
      f32.push_back(
          TimePerCall(o.min_seconds, [&] { AttendOnce(backend, c, full, q, &scores, &out_f32); }));
      kv.set_fused_attention(false);
      decoded.push_back(TimePerCall(o.min_seconds,
                                    [&] { AttendOnce(backend, c, kv, q, &scores, &out_decoded); }));
      kv.set_fused_attention(true);
      fused.push_back(
          TimePerCall(o.min_seconds, [&] { AttendOnce(backend, c, kv, q, &scores, &out_fused); }));
      dec_ratio.push_back(decoded.back() / f32.back());
      fused_ratio.push_back(fused.back() / f32.back());
      speedup.push_back(decoded.back() / fused.back());
    }
    const bool same =
        std::memcmp(out_decoded.data(), out_fused.data(), out_fused.size() * sizeof(float)) == 0;
    *all_identical = *all_identical && same;
    std::printf("%-12s %6d %-7s %10.1f %10.1f %10.1f %9.2f %9.2f %9.2f%s\n", shape.name,
                shape.prefix, m.label, Median(f32) * 1e6, Median(decoded) * 1e6,
                Median(fused) * 1e6, Median(dec_ratio), Median(fused_ratio), Median(speedup),
                same ? "" : "  OUTPUTS DIFFER");
  }
  return absl::OkStatus();
}

// A verify pass's attention over the shape's full f32 KV, T queries at once
// (T = 1, 9, 33), as a multiple of one query's, split by phase.
absl::Status RunVerifyTable(const Options& o, const kernels::KernelBackend& backend,
                            const Shape& shape) {
  const ModelConfig& c = shape.config;
  PagedKvCache full(c);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  VC_RETURN_IF_ERROR(FillRandom(shape, rng, &full));
  std::vector<float> scores;
  // Verify-pass attention over the full f32 KV: T queries at once vs one.
  std::printf("  verify-pass attention over the f32 KV (%s, %d tokens), per pass:\n", shape.name,
              shape.prefix);
  std::printf("  %6s %10s %8s %10s %10s %10s\n", "tokens", "us", "x T=1", "scores us", "softmax us",
              "values us");
  std::vector<float> qn, out;
  double one = 0;
  for (int64_t nq : {1, 9, 33}) {
    qn.resize(static_cast<size_t>(nq) * c.n_heads * c.head_dim);
    for (float& x : qn) x = normal(rng);
    out.assign(static_cast<size_t>(c.n_layers) * c.n_heads * nq * c.head_dim, 0.0f);
    std::vector<PhaseSeconds> samples;
    for (int s = 0; s < o.samples; ++s) {
      PhaseSeconds t;
      int64_t calls = 0;
      do {
        AttendBatch(backend, c, full, nq, qn, &scores, &out, &t);
        ++calls;
      } while (t.Total() < o.min_seconds);
      t.scores /= calls;
      t.softmax /= calls;
      t.values /= calls;
      samples.push_back(t);
    }
    std::sort(samples.begin(), samples.end(),
              [](const PhaseSeconds& a, const PhaseSeconds& b) { return a.Total() < b.Total(); });
    const PhaseSeconds& m = samples[samples.size() / 2];
    if (nq == 1) one = m.Total();
    std::printf("  %6lld %10.1f %8.2f %10.1f %10.1f %10.1f\n", static_cast<long long>(nq),
                m.Total() * 1e6, m.Total() / one, m.scores * 1e6, m.softmax * 1e6, m.values * 1e6);
  }
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  Options o;
  FlagSet flags("vc_kv_attention_bench",
                "Drafter attention per token over INT8/KIVI KV: fused vs dequantise vs f32.");
  flags.Add("--simd", &o.simd, "LEVEL", "scalar | avx2 | avx512 | auto");
  flags.Add("--min-seconds", &o.min_seconds, "S", "length of one timed sample");
  flags.Add("--samples", &o.samples, "N", "timed samples per path (the median is reported)");
  flags.AddBool("--quick", &o.quick, "CI smoke run: short prefixes and samples");
  flags.AddBool("--verify-only", &o.verify_only,
                "only the verify-pass table (skips the drafter's per-token comparison)");
  VC_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return absl::OkStatus();
  }
  if (o.samples < 1 || !(o.min_seconds >= 0)) {
    return absl::InvalidArgumentError("--samples must be >= 1 and --min-seconds >= 0");
  }
  if (o.quick) {
    o.min_seconds = 0.01;
    o.samples = 1;
  }
  VC_ASSIGN_OR_RETURN(std::unique_ptr<kernels::KernelBackend> backend,
                      kernels::CreateBackend({.name = "cpu", .threads = 1, .simd = o.simd}));
  const std::vector<Shape> shapes = {
      {"stories260K", MakeConfig(5, 8, 4, 8, 512), o.quick ? 100 : 400},
      {"synth-110M", MakeConfig(8, 16, 16, 64, 4096), o.quick ? 100 : 3000, true}};
  std::printf(
      "vc_kv_attention_bench: %s, 1 thread, microseconds of attention per token (every "
      "layer and head over the prefix); medians of %d samples, ratios taken per sample\n",
      backend->name().c_str(), o.samples);
  std::printf("%-12s %6s %-7s %10s %10s %10s %9s %9s %9s\n", "shape", "prefix", "kv", "f32 us",
              "decoded us", "fused us", "dec/f32", "fused/f32", "dec/fused");
  bool identical = true;
  if (!o.verify_only) {
    for (const Shape& s : shapes) VC_RETURN_IF_ERROR(RunShape(o, *backend, s, &identical));
    std::printf("fused outputs bit-identical to the decode path: %s\n", identical ? "yes" : "NO");
  }
  for (const Shape& s : shapes) {
    if (s.verify_table) VC_RETURN_IF_ERROR(RunVerifyTable(o, *backend, s));
  }
  if (!identical) return absl::InternalError("fused attention differs from the decode path");
  return absl::OkStatus();
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) {
  const absl::Status s = vc::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "vc_kv_attention_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
