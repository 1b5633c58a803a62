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
};

struct Shape {
  const char* name;
  ModelConfig config;
  int32_t prefix;
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

absl::Status RunShape(const Options& o, const kernels::KernelBackend& backend, const Shape& shape,
                      bool* all_identical) {
  const ModelConfig& c = shape.config;
  PagedKvCache full(c);
  VC_RETURN_IF_ERROR(full.Append(shape.prefix));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(c.kv_dim()), v(c.kv_dim());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int32_t p = 0; p < shape.prefix; ++p) {
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      full.Write(l, p, k.data(), v.data());
    }
  }
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

absl::Status Main(int argc, char** argv) {
  Options o;
  FlagSet flags("vc_kv_attention_bench",
                "Drafter attention per token over INT8/KIVI KV: fused vs dequantise vs f32.");
  flags.Add("--simd", &o.simd, "LEVEL", "scalar | avx2 | avx512 | auto");
  flags.Add("--min-seconds", &o.min_seconds, "S", "length of one timed sample");
  flags.Add("--samples", &o.samples, "N", "timed samples per path (the median is reported)");
  flags.AddBool("--quick", &o.quick, "CI smoke run: short prefixes and samples");
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
      {"synth-110M", MakeConfig(8, 16, 16, 64, 4096), o.quick ? 100 : 3000}};
  std::printf(
      "vc_kv_attention_bench: %s, 1 thread, microseconds of attention per token (every "
      "layer and head over the prefix); medians of %d samples, ratios taken per sample\n",
      backend->name().c_str(), o.samples);
  std::printf("%-12s %6s %-7s %10s %10s %10s %9s %9s %9s\n", "shape", "prefix", "kv", "f32 us",
              "decoded us", "fused us", "dec/f32", "fused/f32", "dec/fused");
  bool identical = true;
  for (const Shape& s : shapes) VC_RETURN_IF_ERROR(RunShape(o, *backend, s, &identical));
  std::printf("fused outputs bit-identical to the decode path: %s\n", identical ? "yes" : "NO");
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
