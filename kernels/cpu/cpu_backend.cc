// The CPU backend: canonical primitives from the SIMD table chosen at run
// time, parallelised over output rows on a ThreadPool.
#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/cache_line_allocator.h"
#include "common/base/thread_pool.h"
#include "kernels/cpu/internal/simd_ops.h"
#include "kernels/internal/registry.h"
#include "kernels/kernels.h"

namespace vc::kernels {
namespace {

const cpu::SimdOps& OpsFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      if (cpu::Avx512Ops() != nullptr) return *cpu::Avx512Ops();
      [[fallthrough]];
    case SimdLevel::kAvx2:
      if (cpu::Avx2Ops() != nullptr) return *cpu::Avx2Ops();
      [[fallthrough]];
    case SimdLevel::kScalar:
      break;
  }
  return cpu::ScalarOps();
}

class CpuBackend final : public KernelBackend {
 public:
  CpuBackend(SimdLevel level, int threads) : level_(level), ops_(OpsFor(level)), pool_(threads) {}

  std::string name() const override { return absl::StrCat("cpu/", std::string(SimdLevelName(level_))); }
  int threads() const override { return pool_.num_threads(); }
  std::optional<SimdLevel> cpu_simd_level() const override { return level_; }
  ThreadPool& pool() override { return pool_; }

  float Dot(const float* a, const float* b, int64_t n) const override { return ops_.dot(a, b, n); }

  void Matmul(const float* x, int64_t tokens, const float* w, const float* bias, int64_t in,
              int64_t out, float* y) override {
    MatmulTyped(x, tokens, w, Dtype::kF32, bias, in, out, y);
  }

  // A bf16/f16 matrix is widened one block of kBlockRows rows at a time into
  // a thread-local buffer (16 rows: 64 KiB per 1024 columns, in cache) right
  // before the f32 kernel reads it: memory holds only the 2-byte weights, and
  // every element is the f32 kernel's over the widened row, so results equal
  // widening at load. (Widening inside the SIMD kernels' loads would save
  // the buffer round trip; the results would be the same.)
  void MatmulTyped(const float* x, int64_t tokens, const void* w, Dtype w_dtype,
                   const float* bias, int64_t in, int64_t out, float* y) override {
    if (w_dtype == Dtype::kF32) {
      MatmulF32(x, tokens, static_cast<const float*>(w), bias, 1, in, out, y);
      return;
    }
    for (int64_t ts = 0; ts < tokens; ts += kSpanTokens) {
      const int64_t span = std::min(kSpanTokens, tokens - ts);
      const RowsOfX xs = ArrangeX(x + ts * in, 1, tokens, span, in, out);
      float* ys = y + ts * out;
      ForRowRuns(out, span * in, [&](int64_t o0, int64_t o1) {
        thread_local std::vector<float> wide;
        wide.resize(static_cast<size_t>(kBlockRows * in));
        const auto* h = static_cast<const uint16_t*>(w);
        for (int64_t o = o0; o < o1; o += kBlockRows) {
          const int64_t n = std::min(kBlockRows, o1 - o);
          const uint16_t* src = h + o * in;
          if (w_dtype == Dtype::kBf16) {
            for (int64_t i = 0; i < n * in; ++i) wide[i] = Bf16BitsToF32(src[i]);
          } else {
            for (int64_t i = 0; i < n * in; ++i) wide[i] = F16BitsToF32(src[i]);
          }
          ops_.matmul_rows(xs.x, xs.ldx, span, wide.data(), bias != nullptr ? bias + o : nullptr,
                           in, 0, n, out, ys + o);
        }
      });
    }
  }

  // f32 blocks in one parallel pass: the threads claim runs of the blocks'
  // rows taken together, so the call pays one fork/join instead of one per
  // block (on the 110M shape a 1-token step's output projection was
  // 8 calls of 128 x 1024 at 17 us each against 85 us for the whole
  // 1024 x 1024 in one call). Elements are the per-block kernel's.
  void MatmulBlocks(const float* x, int64_t tokens, const void* w, Dtype w_dtype, int64_t blocks,
                    int64_t in, int64_t out, float* y) override {
    if (w_dtype != Dtype::kF32) {
      KernelBackend::MatmulBlocks(x, tokens, w, w_dtype, blocks, in, out, y);
      return;
    }
    MatmulF32(x, tokens, static_cast<const float*>(w), nullptr, blocks, in, out, y);
  }

  void AttentionScores(const float* q, const float* k, int64_t n, int64_t head_dim, float scale,
                       float* scores) const override {
    ops_.scores(q, k, n, head_dim, scale, scores);
  }

  // The scores of several queries against a run of keys: the level's own
  // kernel for the head dims it covers (AVX-512: multiples of 16 up to 128,
  // every real head), else a small matmul (queries x keys, no bias), whose
  // elements are canonical Dots too. Either reads each key row once for all
  // the queries; the scale is one multiply afterwards, as in
  // AttentionScores.
  void AttentionScoresMulti(const float* q, int64_t nq, const float* k, int64_t n, int64_t head_dim,
                            float scale, float* scores, int64_t ld,
                            RowsAhead ahead) const override {
    if (ops_.scores_multi != nullptr &&
        ops_.scores_multi(q, nq, k, n, head_dim, scale, scores, ld, ahead.rows, ahead.count)) {
      return;
    }
    ops_.matmul_rows(q, head_dim, nq, k, nullptr, head_dim, 0, n, ld, scores);
    for (int64_t t = 0; t < nq; ++t) {
      for (int64_t j = 0; j < n; ++j) scores[t * ld + j] *= scale;
    }
  }

  void AccumulateValuesMulti(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t n,
                             int64_t head_dim, float* out, RowsAhead ahead) const override {
    if (ops_.accumulate_multi != nullptr) {
      ops_.accumulate_multi(p, ldp, nq, v, n, head_dim, out, ahead.rows, ahead.count);
      return;
    }
    for (int64_t t = 0; t < nq; ++t)
      ops_.accumulate(p + t * ldp, v, n, head_dim, out + t * head_dim);
  }

  // Silu(g) * u = g / (1 + Exp(-g)) * u: the level's whole expression a
  // vector at a time where it has one (AVX2, AVX-512), else its vectorised
  // Exp (bit for bit kernels::Exp) over a stack block and the divide, add
  // and multiply in the scalar expression's order: the same IEEE operations.
  void SwiGlu(float* gate, const float* up, int64_t n) override {
    constexpr int64_t kBlock = 256;
    // Elementwise, so split over the pool: on the caller's thread alone,
    // while the other waited, a 33-token pass's 8 x 93K elements took
    // 0.39-1.15 ms, on two 0.24-0.27 (vc_single_node_bench --stages, the
    // 110M shape). A 1-token step's 2816 stay inline.
    pool_.ParallelFor((n + kBlock - 1) / kBlock, 16, [&](int64_t b0, int64_t b1) {
      if (ops_.swiglu != nullptr) {
        const int64_t i0 = b0 * kBlock;
        ops_.swiglu(gate + i0, up + i0, std::min(n, b1 * kBlock) - i0);
        return;
      }
      float e[kBlock];
      for (int64_t i0 = b0 * kBlock; i0 < std::min(n, b1 * kBlock); i0 += kBlock) {
        const int64_t m = std::min(kBlock, n - i0);
        float* g = gate + i0;
        const float* u = up + i0;
        for (int64_t i = 0; i < m; ++i) e[i] = -g[i];
        ops_.exp_inplace(e, m);
        for (int64_t i = 0; i < m; ++i) g[i] = g[i] / (1.0f + e[i]) * u[i];
      }
    });
  }

  void Softmax(float* s, int64_t n) const override { SoftmaxWith(s, n, softmax_); }
  void SoftmaxRows(float* const* rows, const int64_t* n, int64_t count) const override {
    SoftmaxRowsWith(rows, n, count, softmax_);
  }

  void AccumulateValues(const float* p, const float* v, int64_t n, int64_t head_dim,
                        float* out) const override {
    ops_.accumulate(p, v, n, head_dim, out);
  }

 private:
  static constexpr int64_t kBlockRows = 16;
  // Tokens per kernel call: longer products (a prefill) go in spans, each
  // span's x arranged once (bounding the copy) and passing over all the
  // weights while it stays in L2.
  static constexpr int64_t kSpanTokens = 48;

  struct RowsOfX {
    const float* x;
    int64_t ldx;           // floats from one row to the next
    int64_t block_stride;  // floats from one block's rows to the next's
  };

  // `span` rows of x for each of `blocks` blocks (block b's rows start
  // b * block_rows rows into x; rows are `in` floats apart), as the SIMD
  // kernels read them best. Rows whose stride is a multiple of 2 KiB alias in
  // L1 (the same offset of every token row falls into the same few sets as
  // the weight rows', and the tile's operands evict each other), and rows
  // that do not start on a cache line make most vector loads span two lines
  // (a 9..33-token 2816 x 1024 product cost up to 15% more). Such rows are
  // copied, exactly, into this thread's buffer: rows on cache lines, 64 bytes
  // longer than a multiple of 16 floats. The copy is made once per call and
  // span, before the rows are split among the threads (not once per run of
  // rows a thread claims). 1-token products, small ones (under 64 outputs
  // or 256-wide rows) and the scalar level read x in place.
  RowsOfX ArrangeX(const float* x, int64_t blocks, int64_t block_rows, int64_t span, int64_t in,
                   int64_t out) const {
    const bool off_line =
        reinterpret_cast<uintptr_t>(x) % 64 != 0 || in % 16 != 0 || (block_rows * in) % 16 != 0;
    const bool arrange = level_ != SimdLevel::kScalar && span > 1 &&
                         (in % 512 == 0 || (off_line && in >= 256 && out >= 64));
    if (!arrange) return {x, in, block_rows * in};
    const int64_t ldx = (in + 15) / 16 * 16 + 16;
    thread_local CacheLineVector<float> arranged;
    arranged.resize(static_cast<size_t>(blocks * span * ldx));
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t t = 0; t < span; ++t) {
        std::copy_n(x + (b * block_rows + t) * in, in, &arranged[(b * span + t) * ldx]);
      }
    }
    return {arranged.data(), ldx, span * ldx};
  }

  // The f32 products of `blocks` matrices (as MatmulBlocks lays them out;
  // `bias`, if any, added in every block): each span of kSpanTokens tokens
  // gets its x arranged once, and its rows split over the pool once for all
  // the blocks.
  void MatmulF32(const float* x, int64_t tokens, const float* w, const float* bias, int64_t blocks,
                 int64_t in, int64_t out, float* y) {
    for (int64_t ts = 0; ts < tokens; ts += kSpanTokens) {
      const int64_t span = std::min(kSpanTokens, tokens - ts);
      const RowsOfX xs = ArrangeX(x + ts * in, blocks, tokens, span, in, out);
      // The blocks' rows as one run of blocks * out rows, in the order they
      // lie in memory, so that each thread streams one contiguous stretch
      // of weights instead of its rows' slice of every block in turn (8
      // short streams 512 KiB apart on the 110M shape): the 9-token
      // 1024x1024/8 product 0.235-0.245 -> 0.190-0.199 ms, 2816x1024/8
      // 0.347-0.362 -> 0.315-0.336, the 1-token ones 3-8% less
      // (vc_matmul_bench --shapes 1024x1024/8,2816x1024/8, three
      // alternations; docs/results.md section 8).
      ForRowRuns(blocks * out, span * in, [&](int64_t g0, int64_t g1) {
        while (g0 < g1) {
          const int64_t b = g0 / out, o0 = g0 % out, o1 = std::min(out, o0 + (g1 - g0));
          ops_.matmul_rows(xs.x + b * xs.block_stride, xs.ldx, span, w + b * out * in, bias, in, o0,
                           o1, out, y + (b * tokens + ts) * out);
          g0 += o1 - o0;
        }
      });
    }
  }

  // Runs fn(o0, o1) over [0, out) in row ranges on the pool. Work is split
  // only over output rows (blocks of kBlockRows), so the split never changes
  // a value. The threads claim contiguous runs of blocks from a shared
  // counter, each run half the remaining share of a thread (at least `grain`
  // blocks): long contiguous weight streams first, small runs at the end so
  // that both threads finish together even when the worker wakes up late
  // (~25 us on a VM). `fma_per_row` sizes the grain: each run stays above
  // ~64K multiply-adds, so small products stay inline.
  template <typename Fn>
  void ForRowRuns(int64_t out, int64_t fma_per_row, const Fn& fn) {
    const int64_t blocks = (out + kBlockRows - 1) / kBlockRows;
    auto rows = [&](int64_t b0, int64_t b1) {
      fn(b0 * kBlockRows, std::min(out, b1 * kBlockRows));
    };
    const int64_t fma_per_block = std::max<int64_t>(1, kBlockRows * fma_per_row);
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / fma_per_block);
    const int64_t threads = pool_.num_threads();
    if (threads == 1 || blocks <= grain) {
      rows(0, blocks);
      return;
    }
    std::atomic<int64_t> next{0};
    pool_.ParallelFor(threads, 1, [&](int64_t, int64_t) {
      int64_t b0 = next.load(std::memory_order_relaxed);
      for (;;) {
        int64_t size = 0;
        while (b0 < blocks) {
          size = std::max(grain, (blocks - b0) / (2 * threads));
          if (next.compare_exchange_weak(b0, b0 + size, std::memory_order_relaxed)) break;
        }
        if (b0 >= blocks) return;
        rows(b0, std::min(blocks, b0 + size));
        b0 = next.load(std::memory_order_relaxed);
      }
    });
  }

  const SimdLevel level_;
  const cpu::SimdOps& ops_;
  const SoftmaxParts softmax_{.exp_inplace = ops_.exp_inplace,
                              .max_no_nan = ops_.max_no_nan,
                              .shift_exp = ops_.shift_exp,
                              .scale_inplace = ops_.scale_inplace};
  ThreadPool pool_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCpuBackend(const BackendOptions& options) {
  auto level = ParseSimdLevel(options.simd);
  if (!level.ok()) return level.status();
  if (options.threads < 0 || options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be in [0, 1024], got ", options.threads));
  }
  int threads = options.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<KernelBackend>(std::make_unique<CpuBackend>(*level, threads));
}

}  // namespace vc::kernels
