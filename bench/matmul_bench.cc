// vc_matmul_bench: the cost of one f32 Matmul over T tokens relative to the
// 1-token Matmul of the same shape, with the weights coming from DRAM (as in
// a decode step of a model much larger than the caches).
//
// For each shape (in x out; by default the 109.5M synthetic model's
// projections) the bench allocates enough copies of the weight matrix to
// cover --footprint-mb and rotates over them, so no call finds its weights in
// the last-level cache. Each repetition times every T once, in turn (a load
// change on a shared machine then hits every T alike); a T's cost is the
// median over repetitions of the wall time and of the process CPU time per
// call, and its ratio is the median of the per-repetition ratios to T = 1.
// The backend's threads spin for at most ThreadPoolOptions::spin_us after
// a piece before they block, so CPU time counts little of the time a thread
// waited for work or for a core; it still includes memory contention.
// The "layer" rows sum one decoder layer's products (4 x dim^2, 2 x
// dim x hidden, 1 x hidden x dim, each timed separately) per repetition.
// Every T-token output is also checked, bit for bit, against T 1-token
// Matmuls (the numerics contract, kernels/kernels.h); a difference fails.
// --huge-pages asks for transparent huge pages under the copies (the
// engine's weights sit in 4 KiB pages), to show what the page walks cost.
// A shape INxOUT/B is the engine's row-parallel product (o_proj, down_proj;
// docs/numerics.md section 6): B column blocks of IN/B, one MatmulBlocks call,
// whose partial outputs the engine then sums by the blocks' tree (not timed
// here); its rows are checked against 1-token MatmulBlocks calls.
// --quantized int8,int4 adds, per shape, the 1-token QuantizedMatmul of a
// weight-quantised drafter (kernels/quantized.h) at the same SIMD level and
// threads, over its own copies (as many bytes as --footprint-mb), timed in
// the same repetitions as the f32 1-token Matmul it is compared with.
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/int_list.h"
#include "common/base/dtype.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/quantized.h"

namespace vc {
namespace {

struct Options {
  int threads = 2;
  std::string simd = "auto";
  int reps = 9;
  int64_t footprint_mb = 160;
  std::string tokens = "1,2,4,8,9,16,17,33";
  std::string shapes = "1024x1024,1024x2816,2816x1024";
  bool huge_pages = false;
  int offset_floats = 0;
  bool quick = false;
  std::string quantized;  // weight formats of the drafter products, comma-separated
};

struct Shape {
  int64_t in = 0, out = 0;
  int64_t blocks = 1;  // > 1: MatmulBlocks over column blocks of in / blocks
  int64_t BlockIn() const { return in / blocks; }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string one;
  f >> one;
  return one.empty() ? "?" : one;
}

// Values in [-1, 1) from a xorshift generator: cheap enough to fill a few
// hundred MB, and varied enough that any other summation order would show.
void Fill(uint64_t seed, float* v, int64_t n) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    float& x = v[i];
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
  }
}

// One copy of a weight matrix in a 2 MiB-aligned allocation (so that
// --huge-pages can back it with transparent huge pages); the matrix starts
// `offset` floats into it (--offset-floats: rows that do not start on a
// cache line, as in the engine's std::vector and mmap'd weights).
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
struct Matrix {
  std::unique_ptr<float[], FreeDeleter> block;
  float* data = nullptr;
};

absl::StatusOr<Matrix> AllocateMatrix(int64_t n, int offset, bool huge_pages) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t want = (static_cast<size_t>(n) + static_cast<size_t>(offset)) * sizeof(float);
  const size_t bytes = (want + kHuge - 1) / kHuge * kHuge;
  Matrix m;
  m.block.reset(static_cast<float*>(std::aligned_alloc(kHuge, bytes)));
  if (m.block == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  if (huge_pages && madvise(m.block.get(), bytes, MADV_HUGEPAGE) != 0) {
    return absl::InternalError(absl::StrCat("madvise(MADV_HUGEPAGE): errno ", errno));
  }
  m.data = m.block.get() + offset;
  return m;
}

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& text) {
  VC_ASSIGN_OR_RETURN(std::vector<int64_t> out, vc::bench::ParseIntList("--tokens", text, 1, 256));
  if (std::find(out.begin(), out.end(), 1) == out.end()) out.insert(out.begin(), 1);
  return out;
}

absl::StatusOr<std::vector<Shape>> ParseShapes(const std::string& text) {
  std::vector<Shape> out;
  for (const auto& part : absl::StrSplit(text, ',')) {
    std::vector<std::string> shape_blocks = absl::StrSplit(part, '/');
    std::vector<std::string> io = absl::StrSplit(shape_blocks[0], 'x');
    Shape s;
    if (shape_blocks.size() > 2 || io.size() != 2 || !absl::SimpleAtoi(io[0], &s.in) ||
        !absl::SimpleAtoi(io[1], &s.out) || s.in < 1 || s.out < 1 || s.in > (1 << 16) ||
        s.out > (1 << 18) ||
        (shape_blocks.size() == 2 && (!absl::SimpleAtoi(shape_blocks[1], &s.blocks) ||
                                      s.blocks < 1 || s.blocks > 64 || s.in % s.blocks != 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shapes: '", std::string(part),
                       "' is not INxOUT or INxOUT/B (in <= 65536, out <= 262144, B in [1, 64] "
                       "dividing in)"));
    }
    out.push_back(s);
  }
  return out;
}

struct Cost {
  std::vector<double> wall, cpu;  // seconds per call, one per repetition
};

// Times max(copies, 4) calls of call(copy), rotating `*next` over the
// copies, and adds their mean wall and CPU seconds to `cost`.
template <class Call>
void TimeCalls(size_t copies, size_t* next, Cost* cost, const Call& call) {
  const size_t calls = std::max<size_t>(copies, 4);
  const double c0 = CpuSeconds(), w0 = WallSeconds();
  for (size_t i = 0; i < calls; ++i) {
    call(*next);
    *next = (*next + 1) % copies;
  }
  const double w1 = WallSeconds(), c1 = CpuSeconds();
  cost->wall.push_back((w1 - w0) / static_cast<double>(calls));
  cost->cpu.push_back((c1 - c0) / static_cast<double>(calls));
}

// The product the bench times for shape `s`, of T tokens over weights `w`:
// Matmul, or MatmulBlocks over the shape's column blocks (x and y laid out
// as MatmulBlocks lays them: block b's token t at row b * tokens + t).
void Product(kernels::KernelBackend& be, const Shape& s, const float* x, int64_t tokens,
             const float* w, float* y) {
  if (s.blocks > 1) {
    be.MatmulBlocks(x, tokens, w, Dtype::kF32, s.blocks, s.BlockIn(), s.out, y);
  } else {
    be.Matmul(x, tokens, w, nullptr, s.in, s.out, y);
  }
}

// Times Matmuls of T tokens over the weight copies.
void TimeOne(kernels::KernelBackend& be, const Shape& s, const std::vector<Matrix>& w,
             const std::vector<float>& x, int64_t tokens, std::vector<float>* y, size_t* next,
             Cost* cost) {
  TimeCalls(w.size(), next, cost,
            [&](size_t c) { Product(be, s, x.data(), tokens, w[c].data, y->data()); });
}

// Times 1-token QuantizedMatmuls over the quantised copies.
void TimeQuantized(kernels::SimdLevel level, ThreadPool& pool,
                   const std::vector<kernels::QuantizedMatrix>& w, const std::vector<float>& x,
                   std::vector<float>* y, size_t* next, Cost* cost) {
  TimeCalls(w.size(), next, cost, [&](size_t c) {
    kernels::QuantizedMatmul(level, &pool, x.data(), 1, w[c], nullptr, y->data());
  });
}

// Copies of one random matrix quantised to `format`, enough to cover
// `footprint_mb` (each copy differs in its first element, so no two are the
// same bytes).
absl::StatusOr<std::vector<kernels::QuantizedMatrix>> QuantizedCopies(const Shape& s,
                                                                      kernels::WeightFormat format,
                                                                      int64_t footprint_mb) {
  std::vector<float> w(static_cast<size_t>(s.in * s.out));
  Fill(7, w.data(), s.in * s.out);
  std::vector<kernels::QuantizedMatrix> out;
  int64_t bytes = 0;
  while (out.size() < 2 || bytes < (footprint_mb << 20)) {
    w[0] = static_cast<float>(out.size() % 97) * 0x1p-7f - 0.375f;
    VC_ASSIGN_OR_RETURN(kernels::QuantizedMatrix m,
                        kernels::Quantize(w.data(), s.out, s.in, format));
    bytes += m.bytes();
    out.push_back(std::move(m));
  }
  return out;
}

// x holds blocks x tokens rows of block_in (block b's token t at row
// b * tokens + t), y blocks x tokens rows of out, as MatmulBlocks lays them
// out (with one block: Matmul's rows).
absl::Status CheckRows(kernels::KernelBackend& be, const Shape& s, const float* w,
                       const std::vector<float>& x, int64_t tokens) {
  const int64_t bin = s.BlockIn();
  std::vector<float> all(static_cast<size_t>(s.blocks * tokens * s.out));
  std::vector<float> one(static_cast<size_t>(s.blocks * s.out)), x1(static_cast<size_t>(s.in));
  Product(be, s, x.data(), tokens, w, all.data());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t b = 0; b < s.blocks; ++b) {
      std::memcpy(&x1[b * bin], &x[(b * tokens + t) * bin], bin * sizeof(float));
    }
    Product(be, s, x1.data(), 1, w, one.data());
    for (int64_t b = 0; b < s.blocks; ++b) {
      if (std::memcmp(&one[b * s.out], &all[(b * tokens + t) * s.out], s.out * sizeof(float)) !=
          0) {
        return absl::InternalError(absl::StrCat(
            "Matmul ", s.in, "x", s.out, s.blocks > 1 ? absl::StrCat("/", s.blocks) : "", ": row ",
            t, " of ", tokens, " tokens differs from the 1-token product"));
      }
    }
  }
  return absl::OkStatus();
}

// One table row: `cost`'s median wall and CPU time, the medians of their
// per-repetition ratios to `base`, and `bytes` per median wall time; `tail`
// ends the line.
void PrintRow(const std::string& label, const Cost& cost, const Cost& base, double bytes,
              const std::string& tail) {
  std::vector<double> wall_ratio, cpu_ratio;
  for (size_t r = 0; r < cost.wall.size(); ++r) {
    wall_ratio.push_back(cost.wall[r] / base.wall[r]);
    cpu_ratio.push_back(cost.cpu[r] / base.cpu[r]);
  }
  const double wall = Median(cost.wall);
  std::printf("  %6s %10.3f %8.2f %10.3f %8.2f %8.1f%s\n", label.c_str(), wall * 1e3,
              Median(wall_ratio), Median(cost.cpu) * 1e3, Median(cpu_ratio), bytes / wall * 1e-9,
              tail.c_str());
}

void PrintRows(const std::vector<int64_t>& tokens, const std::map<int64_t, Cost>& costs,
               double weight_bytes) {
  for (int64_t t : tokens) {
    PrintRow(std::to_string(t), costs.at(t), costs.at(1), weight_bytes, "");
  }
}

absl::Status Main(int argc, char** argv) {
  Options o;
  FlagSet flags("vc_matmul_bench",
                "f32 Matmul cost of T tokens relative to 1 token, weights from DRAM.");
  flags.Add("--threads", &o.threads, "N", "backend threads (including the caller)");
  flags.Add("--simd", &o.simd, "LEVEL", "scalar | avx2 | avx512 | auto");
  flags.Add("--reps", &o.reps, "N", "repetitions (medians are reported)");
  flags.Add("--footprint-mb", &o.footprint_mb, "MB", "weight copies rotated over, per shape");
  flags.Add("--tokens", &o.tokens, "LIST", "token counts, comma-separated (1 is always added)");
  flags.Add("--shapes", &o.shapes, "LIST",
            "INxOUT or INxOUT/B (B column blocks, as the engine's row-parallel products), "
            "comma-separated (default: the 109.5M model's layer)");
  flags.Add("--offset-floats", &o.offset_floats, "N",
            "start each weight matrix N floats (0-15) past a cache line");
  flags.AddBool("--huge-pages", &o.huge_pages,
                "back the weight copies with transparent huge pages (madvise)");
  flags.AddBool("--quick", &o.quick,
                "CI smoke run: small shapes and footprint, 1 repetition, --quantized int8,int4");
  flags.Add("--quantized", &o.quantized, "LIST",
            "also time 1-token products over quantised weights (int8,int4) against the f32 one");
  VC_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return absl::OkStatus();
  }
  if (o.quick) {
    o.reps = 1;
    o.footprint_mb = 4;
    if (!flags.was_set("--shapes")) o.shapes = "256x704,704x256";
    if (!flags.was_set("--quantized")) o.quantized = "int8,int4";
  }
  if (o.reps < 1 || o.reps > 1000 || o.footprint_mb < 1 || o.footprint_mb > (1 << 16) ||
      o.threads < 1 || o.threads > 1024 || o.offset_floats < 0 || o.offset_floats > 15) {
    return absl::InvalidArgumentError(
        "--reps must be in [1, 1000], --footprint-mb in [1, 65536], --threads in [1, 1024], "
        "--offset-floats in [0, 15]");
  }
  VC_ASSIGN_OR_RETURN(const std::vector<int64_t> tokens, ParseList(o.tokens));
  VC_ASSIGN_OR_RETURN(const std::vector<Shape> shapes, ParseShapes(o.shapes));
  std::vector<kernels::WeightFormat> formats;
  if (!o.quantized.empty()) {
    for (const auto& name : absl::StrSplit(o.quantized, ',')) {
      VC_ASSIGN_OR_RETURN(const kernels::WeightFormat f,
                          kernels::ParseWeightFormat(std::string_view(name.data(), name.size())));
      if (f == kernels::WeightFormat::kF32) {
        return absl::InvalidArgumentError(
            "--quantized takes int8 and/or int4 (f32 is the baseline)");
      }
      formats.push_back(f);
    }
  }
  VC_ASSIGN_OR_RETURN(const kernels::SimdLevel level, kernels::ParseSimdLevel(o.simd));
  VC_ASSIGN_OR_RETURN(std::unique_ptr<kernels::KernelBackend> be,
                      kernels::CreateBackend({.threads = o.threads, .simd = o.simd}));
  std::printf("vc_matmul_bench: %s, %d threads, %d repetitions, weights rotating over >= %" PRId64
              " MB per shape, starting %d bytes past a cache line%s; load average %s\n",
              be->name().c_str(), be->threads(), o.reps, o.footprint_mb, 4 * o.offset_floats,
              o.huge_pages ? ", huge pages" : "", LoadAverage().c_str());
  const int64_t max_tokens = *std::max_element(tokens.begin(), tokens.end());
  // Per-shape costs, kept for the layer sum (which needs the model's shapes).
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::map<int64_t, Cost>> all;
  for (const Shape& s : shapes) {
    const int64_t bytes = s.in * s.out * int64_t{4};
    const int64_t copies = std::max<int64_t>(2, (o.footprint_mb << 20) / bytes + 1);
    std::vector<Matrix> w;
    for (int64_t c = 0; c < copies; ++c) {
      VC_ASSIGN_OR_RETURN(Matrix m, AllocateMatrix(s.in * s.out, o.offset_floats, o.huge_pages));
      Fill(static_cast<uint64_t>(c) + 1, m.data, s.in * s.out);
      w.push_back(std::move(m));
    }
    std::vector<float> x(static_cast<size_t>(max_tokens * s.in));
    Fill(1000, x.data(), static_cast<int64_t>(x.size()));
    std::vector<float> y(static_cast<size_t>(max_tokens * s.out * s.blocks));
    for (int64_t t : tokens) VC_RETURN_IF_ERROR(CheckRows(*be, s, w[0].data, x, t));
    std::map<int64_t, Cost>& costs = all[{s.in, s.out, s.blocks}];
    size_t next = 0;
    const std::string load0 = LoadAverage();
    for (int64_t t : tokens) {  // warm-up: page in, wake the pool
      Cost ignored;
      TimeOne(*be, s, w, x, t, &y, &next, &ignored);
    }
    // The drafter's quantised products have no column blocks.
    const size_t nf = s.blocks > 1 ? 0 : formats.size();
    std::vector<std::vector<kernels::QuantizedMatrix>> qw;
    for (size_t f = 0; f < nf; ++f) {
      VC_ASSIGN_OR_RETURN(auto copies_f, QuantizedCopies(s, formats[f], o.footprint_mb));
      qw.push_back(std::move(copies_f));
    }
    std::vector<Cost> qcosts(nf);
    std::vector<size_t> qnext(nf, 0);
    for (size_t f = 0; f < nf; ++f) {  // warm-up
      Cost ignored;
      TimeQuantized(level, be->pool(), qw[f], x, &y, &qnext[f], &ignored);
    }
    for (int r = 0; r < o.reps; ++r) {
      for (int64_t t : tokens) TimeOne(*be, s, w, x, t, &y, &next, &costs[t]);
      for (size_t f = 0; f < nf; ++f) {
        TimeQuantized(level, be->pool(), qw[f], x, &y, &qnext[f], &qcosts[f]);
      }
    }
    const std::string blocks =
        s.blocks > 1 ? absl::StrCat(" in ", s.blocks, " column blocks (MatmulBlocks)") : "";
    std::printf("\nMatmul in %" PRId64 " x out %" PRId64 "%s (%.1f MB, %" PRId64
                " copies); load %s -> %s; rows of T tokens bit-identical to 1-token Matmuls\n",
                s.in, s.out, blocks.c_str(), static_cast<double>(bytes) * 1e-6, copies,
                load0.c_str(), LoadAverage().c_str());
    std::printf("  %6s %10s %8s %10s %8s %8s\n", "tokens", "wall ms", "x T=1", "CPU ms", "x T=1",
                "GB/s");
    PrintRows(tokens, costs, static_cast<double>(bytes));
    for (size_t f = 0; f < nf; ++f) {
      PrintRow(std::string(kernels::WeightFormatName(formats[f])), qcosts[f], costs.at(1),
               static_cast<double>(qw[f][0].bytes()),
               absl::StrCat("   (1 token, ", qw[f].size(), " copies; x the f32 1-token product)"));
    }
  }
  // One decoder layer of the 109.5M model (dim 1024, hidden 2816), when its
  // shapes were measured: q, k, v, o + w1, w3 + w2.
  const std::vector<std::pair<std::tuple<int64_t, int64_t, int64_t>, int>> layer = {
      {{1024, 1024, 1}, 4}, {{1024, 2816, 1}, 2}, {{2816, 1024, 1}, 1}};
  bool have_layer = true;
  for (const auto& [shape, n] : layer) have_layer = have_layer && all.count(shape) > 0;
  if (have_layer) {
    std::map<int64_t, Cost> sum;
    for (int64_t t : tokens) {
      Cost& c = sum[t];
      c.wall.assign(static_cast<size_t>(o.reps), 0.0);
      c.cpu.assign(static_cast<size_t>(o.reps), 0.0);
      for (const auto& [shape, n] : layer) {
        const Cost& part = all[shape][t];
        for (size_t r = 0; r < c.wall.size(); ++r) {
          c.wall[r] += n * part.wall[r];
          c.cpu[r] += n * part.cpu[r];
        }
      }
    }
    std::printf(
        "\nlayer of the 109.5M model (4 x 1024x1024 + 2 x 1024x2816 + 2816x1024, summed "
        "per repetition)\n");
    std::printf("  %6s %10s %8s %10s %8s %8s\n", "tokens", "wall ms", "x T=1", "CPU ms", "x T=1",
                "GB/s");
    PrintRows(tokens, sum, (4.0 * 1024 * 1024 + 3.0 * 1024 * 2816) * 4);
  }
  std::printf("\nload average at the end: %s\n", LoadAverage().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) {
  const absl::Status s = vc::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "vc_matmul_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
