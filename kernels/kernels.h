// Compute kernels for the forward pass, behind one backend interface.
//
// Every backend follows one numerics contract (docs/numerics.md) so that a
// value never depends on batch size, thread count or SIMD width:
//  * A dot product of length n has 16 logical lanes: element i is added into
//    lane i % 16 with a fused multiply-add, in increasing i (a partial last
//    group is padded with zeros). The lanes are then summed by one fixed
//    pairwise tree: l[k] + l[k+8], then + [k+4], then + [k+2], then + [k+1].
//  * Matmul output element (t, o) is exactly bias[o] + Dot(x[t], w[o]); work
//    is split only across output elements.
//  * Weighted value sums run sequentially over keys, one FMA per key and lane.
//  * exp (and so softmax and SiLU) has one implementation, kernels::Exp.
// The scalar, AVX2 and AVX-512 CPU paths all implement this exact sequence of
// IEEE operations, so they agree bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"

namespace vc {
class ThreadPool;
}

namespace vc::kernels {

enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The widest level this CPU supports.
SimdLevel DetectSimdLevel();
std::string_view SimdLevelName(SimdLevel level);
// Accepts "scalar", "avx2", "avx512" and "auto" (the detected level); a level
// the CPU lacks is an InvalidArgument error.
absl::StatusOr<SimdLevel> ParseSimdLevel(std::string_view name);

// The one exp used by every kernel (softmax, SiLU, sampling): a Cephes-style
// polynomial built from plain multiplies and adds, so it is identical on every
// path and machine (unlike libm's expf). Max relative error ~2 ulp.
float Exp(float x);
// x * sigmoid(x) = x / (1 + Exp(-x)).
float Silu(float x);

struct BackendOptions {
  std::string name = "cpu";  // registry name
  int threads = 0;           // worker threads including the caller; 0 = hardware threads
  std::string simd = "auto"; // cpu only: scalar | avx2 | avx512 | auto
};

// Rows of head_dim floats that a caller of the multi-query attention
// kernels reads next (the next block of a paged KV cache, or the values after
// the last key block): a backend may stream them toward its caches while it
// works on the current rows, so that a pass whose arithmetic outlasts its
// loads (a verify pass's 9 or 33 queries) does not wait on memory at every
// block's start. A hint: it never changes a value, and a backend may ignore
// it; `rows` must stay valid for the call.
struct RowsAhead {
  const float* rows = nullptr;
  int64_t count = 0;
};

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  // e.g. "cpu/avx512".
  virtual std::string name() const = 0;
  virtual int threads() const = 0;
  // The SIMD level of a CPU backend's kernels, so that kernels outside the
  // backend (the fused compressed-KV attention, kernels/quantized_kv.h) run
  // at the same level on the same host memory; nullopt for other backends.
  virtual std::optional<SimdLevel> cpu_simd_level() const { return std::nullopt; }
  // The pool that the backend's own kernels use; callers may run their own
  // element-parallel loops on it (never from inside a kernel).
  virtual ThreadPool& pool() = 0;

  // Canonical dot product (see the header comment).
  virtual float Dot(const float* a, const float* b, int64_t n) const = 0;

  // y[t*out + o] = (bias ? bias[o] : 0) + Dot(x + t*in, w + o*in, in)
  // for t < tokens, o < out. w is row-major [out, in]. Multithreaded.
  // (With no bias the add is skipped, not done with 0.)
  virtual void Matmul(const float* x, int64_t tokens, const float* w, const float* bias,
                      int64_t in, int64_t out, float* y) = 0;

  // Matmul with w stored in `w_dtype` (f32, bf16 or f16): each element is
  // widened (exactly) as it is read, so y is bit-identical to Matmul on the
  // widened matrix. This default widens bounded tiles of rows and calls
  // Matmul; backends may fuse the widening into their kernels.
  virtual void MatmulTyped(const float* x, int64_t tokens, const void* w, Dtype w_dtype,
                           const float* bias, int64_t in, int64_t out, float* y);

  // `blocks` independent products without bias, as one call: for b <
  // blocks, y + b*tokens*out = MatmulTyped(x + b*tokens*in, tokens, w_b,
  // w_dtype, nullptr, in, out), where w_b starts b*out*in elements into w
  // (x, w and y hold the blocks back to back). Each element equals that
  // block's MatmulTyped; a backend may stream the blocks in one parallel
  // pass instead of one per block (the engine's row-parallel products, whose
  // column blocks are 128..352 wide on the 110M shape).
  virtual void MatmulBlocks(const float* x, int64_t tokens, const void* w, Dtype w_dtype,
                            int64_t blocks, int64_t in, int64_t out, float* y);

  // scores[j] = Dot(q, k + j*head_dim, head_dim) * scale, j < n.
  virtual void AttentionScores(const float* q, const float* k, int64_t n, int64_t head_dim,
                               float scale, float* scores) const = 0;

  // out[d] = fma(p[j], v[j*head_dim + d], out[d]) for j = 0..n-1 in order.
  virtual void AccumulateValues(const float* p, const float* v, int64_t n, int64_t head_dim,
                                float* out) const = 0;

  // AttentionScores for nq queries at once (query t at q + t*head_dim):
  // scores[t*ld + j] = Dot(q + t*head_dim, k + j*head_dim, head_dim) * scale.
  // The same values as nq AttentionScores calls; a backend may read each key
  // once for all the queries (a multi-token pass then streams the KV once).
  // Single-threaded: called from inside the engine's parallel loops.
  // `ahead`: the rows the caller reads next (below).
  virtual void AttentionScoresMulti(const float* q, int64_t nq, const float* k, int64_t n,
                                    int64_t head_dim, float scale, float* scores, int64_t ld,
                                    RowsAhead ahead) const;

  // AccumulateValues for nq queries over the same n values: query t's
  // weights are p + t*ldp and its output out + t*head_dim; each output is
  // exactly what AccumulateValues alone computes. Single-threaded.
  virtual void AccumulateValuesMulti(const float* p, int64_t ldp, int64_t nq, const float* v,
                                     int64_t n, int64_t head_dim, float* out,
                                     RowsAhead ahead) const;

  // gate[i] = Silu(gate[i]) * up[i] for i < n (SwiGLU's elementwise step),
  // bit-identical to that scalar expression; backends may vectorise it and
  // split it over their threads.
  virtual void SwiGlu(float* gate, const float* up, int64_t n);

  // Bit-identical to kernels::Softmax below; backends may vectorise it.
  virtual void Softmax(float* s, int64_t n) const;
  // Softmax of `count` independent rows (row i: rows[i], n[i] scores), each
  // bit-identical to Softmax on it alone; a backend may interleave the rows.
  virtual void SoftmaxRows(float* const* rows, const int64_t* n, int64_t count) const;
};

// Creates a backend by registry name ("cpu"; "cuda" when built with CUDA and
// a device is present).
absl::StatusOr<std::unique_ptr<KernelBackend>> CreateBackend(const BackendOptions& options);
// Names of the registered backends.
std::vector<std::string> RegisteredBackends();
// OK if `name` is registered; else InvalidArgument naming the registered
// ones (what CreateBackend says), for flags checked before a model loads.
absl::Status CheckBackendName(const std::string& name);

// Elementwise helpers shared by every backend (cheap, scalar, exact).
// out[i] = g[i] * (x[i] * r), r = 1 / sqrt(Dot(x, x) / n + eps).
void RmsNorm(const KernelBackend& backend, const float* x, const float* g, int64_t n, float eps,
             float* out);
// In-place softmax over n scores: e_j = Exp(s_j - max); sum in order; s_j = e_j / sum.
void Softmax(float* s, int64_t n);

}  // namespace vc::kernels
