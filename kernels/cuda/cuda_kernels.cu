// CUDA kernels of the canonical primitives. See internal/cuda_kernels.h for
// the layouts and for why the results equal the CPU paths bit for bit.
// Built with -fmad=false: every FMA below is written as __fmaf_rn, every add
// and multiply that must not be fused as __fadd_rn / __fmul_rn.
#include <algorithm>

#include "kernels/cuda/internal/cuda_kernels.h"

namespace vc::kernels::cuda {
namespace {

constexpr int kLanes = 16;                        // logical lanes of a dot product
constexpr int kRowsPerBlock = 8;                  // half-warps per block
constexpr int kThreads = kLanes * kRowsPerBlock;  // 128
constexpr int64_t kMaxGridX = int64_t{1} << 20;   // grid-stride loops cover the rest
constexpr int64_t kMaxGridY = 65535;

// Block layout: thread (group, lane) = (threadIdx.x / 16, threadIdx.x % 16).
// Half-warp `group` owns R consecutive output rows and, for each token tile
// of at most T tokens, produces y[t][o] for all of them: every weight element
// it loads is used for up to T tokens and every x element for R rows. Thread
// `lane` is logical lane `lane` of each of those R * T dot products. Tiling
// only decides which elements share a load, never the operations inside one
// element.
//
// Grid: x = token tiles, y = row blocks. Blocks are dispatched x-first, so
// the token tiles of one row block run at about the same time and share its
// weight lines in L2: a pass reads its weights from HBM about once.
//
// Speed comes from loads in flight, not from arithmetic: a product is
// memory-bound, and only 16 threads work on a row, so each thread issues the
// weight loads of kSteps consecutive 16-element steps before the FMAs that
// consume them (R * kSteps = L loads in flight per thread).
template <int R, int T, int L>
__global__ void __launch_bounds__(kThreads)
    DotRowsKernel(const float* __restrict__ x, int64_t tokens, const float* __restrict__ w,
                  const float* __restrict__ bias, int64_t in, int64_t out, bool scaled, float scale,
                  float* __restrict__ y) {
  constexpr int kSteps = L / R;
  static_assert(kSteps >= 1 && kSteps * R == L);
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int group = static_cast<int>(threadIdx.x) / kLanes;
  // Shuffle mask: the 16 threads of this half-warp. The two half-warps of a
  // warp may take different paths (one can run out of rows); each only ever
  // syncs with itself.
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int64_t padded = (in + kLanes - 1) / kLanes * kLanes;
  // Elements [0, bulk) are read without bounds checks, kSteps steps at a time.
  const int64_t bulk = in / (kLanes * kSteps) * (kLanes * kSteps);
  // Near-equal token tiles (9 tokens with T = 4: 3 + 3 + 3, not 4 + 4 + 1).
  const int64_t tiles = (tokens + T - 1) / T;
  const int64_t row_stride = static_cast<int64_t>(gridDim.y) * kRowsPerBlock * R;

  for (int64_t o0 = (static_cast<int64_t>(blockIdx.y) * kRowsPerBlock + group) * R; o0 < out;
       o0 += row_stride) {
    const int64_t nr = out - o0 < R ? out - o0 : R;
    // Rows past the end read row o0 instead (their results are not stored),
    // so the bulk loop needs no row checks.
    const float* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = w + (o0 + (r < nr ? r : 0)) * in + lane;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t t0 = tokens * tile / tiles;
      const int nt = static_cast<int>(tokens * (tile + 1) / tiles - t0);
      const float* xt = x + t0 * in + lane;
      float acc[R][T];
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int k = 0; k < T; ++k) acc[r][k] = 0.0f;
      }

      // Lane `lane` takes elements i = i0 + lane in increasing i0; the last
      // group is padded with zeros, which are FMA'd like everything else.
      int64_t i0 = 0;
      for (; i0 < bulk; i0 += kLanes * kSteps) {
        float wv[kSteps][R];
#pragma unroll
        for (int u = 0; u < kSteps; ++u) {
#pragma unroll
          for (int r = 0; r < R; ++r) wv[u][r] = __ldg(wr[r] + i0 + u * kLanes);
        }
#pragma unroll
        for (int u = 0; u < kSteps; ++u) {
#pragma unroll
          for (int k = 0; k < T; ++k) {
            if (k < nt) {
              const float xv = __ldg(xt + k * in + i0 + u * kLanes);
#pragma unroll
              for (int r = 0; r < R; ++r) acc[r][k] = __fmaf_rn(xv, wv[u][r], acc[r][k]);
            }
          }
        }
      }
      for (; i0 < padded; i0 += kLanes) {
        const bool inside = i0 + lane < in;
        float wv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r] = inside ? __ldg(wr[r] + i0) : 0.0f;
#pragma unroll
        for (int k = 0; k < T; ++k) {
          if (k < nt) {
            const float xv = inside ? __ldg(xt + k * in + i0) : 0.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][k] = __fmaf_rn(xv, wv[r], acc[r][k]);
          }
        }
      }

#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int k = 0; k < T; ++k) {
          // The fixed pairwise tree. After step `width`, lane k < width holds
          // s[k] + s[k + width]; lanes >= width hold values nobody reads.
          float s = acc[r][k];
          s = __fadd_rn(s, __shfl_down_sync(mask, s, 8, kLanes));
          s = __fadd_rn(s, __shfl_down_sync(mask, s, 4, kLanes));
          s = __fadd_rn(s, __shfl_down_sync(mask, s, 2, kLanes));
          s = __fadd_rn(s, __shfl_down_sync(mask, s, 1, kLanes));
          if (lane == 0 && k < nt && r < nr) {
            const int64_t o = o0 + r;
            if (bias != nullptr) s = __fadd_rn(s, bias[o]);
            if (scaled) s = __fmul_rn(s, scale);
            y[(t0 + k) * out + o] = s;
          }
        }
      }
    }
  }
}

using DotRowsFn = void (*)(const float*, int64_t, const float*, const float*, int64_t, int64_t,
                           bool, float, float*);

// The instantiated tilings: those that were fastest for some product in
// vc_cuda_matmul_bench on an H200, and the defaults.
#define VC_DOT_ROWS_TILINGS(X) \
  X(1, 1, 32)                  \
  X(1, 1, 64) X(2, 1, 64) X(1, 2, 64) X(2, 2, 64) X(4, 4, 32) X(4, 4, 64) X(4, 8, 64) X(4, 4, 128)
#define VC_TILING(r, t, l) DotRowsTiling{r, t, l},
constexpr DotRowsTiling kTilings[] = {VC_DOT_ROWS_TILINGS(VC_TILING)};
#undef VC_TILING
#define VC_KERNEL(r, t, l) &DotRowsKernel<r, t, l>,
constexpr DotRowsFn kKernels[] = {VC_DOT_ROWS_TILINGS(VC_KERNEL)};
#undef VC_KERNEL
#undef VC_DOT_ROWS_TILINGS
constexpr int kNumTilings = static_cast<int>(sizeof(kTilings) / sizeof(kTilings[0]));

// One thread per output element d; the chain over keys j is sequential.
// Consecutive threads read consecutive v elements (coalesced).
__global__ void __launch_bounds__(kThreads)
    AccumulateValuesKernel(const float* __restrict__ p, const float* __restrict__ v, int64_t n,
                           int64_t dim, float* __restrict__ acc) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; d < dim;
       d += stride) {
    float a = acc[d];
    for (int64_t j = 0; j < n; ++j) a = __fmaf_rn(p[j], v[j * dim + d], a);
    acc[d] = a;
  }
}

}  // namespace

int DotRowsTilingCount() { return kNumTilings; }

DotRowsTiling DotRowsTilingAt(int index) { return kTilings[index]; }

DotRowsTiling DefaultDotRowsTiling(int64_t tokens) {
  // From vc_cuda_matmul_bench on an H200 (docs/results.md, "The CUDA backend
  // on an H200"): over a Llama-2-7B layer's products, one row per half-warp
  // with 64 loads in flight was fastest for 1-2 tokens, 4 rows x 4 tokens
  // with 64 for 3-33 (each within a few percent of the best tiling of each
  // product, except 4x4/128 at 17 tokens).
  if (tokens <= 2) return {1, 1, 64};
  return {4, 4, 64};
}

cudaError_t LaunchDotRowsTiled(DotRowsTiling tiling, const float* x, int64_t tokens, const float* w,
                               const float* bias, int64_t in, int64_t out, bool scaled, float scale,
                               float* y, cudaStream_t stream) {
  if (tokens <= 0 || out <= 0) return cudaSuccess;
  if (in < 0) return cudaErrorInvalidValue;
  int index = -1;
  for (int k = 0; k < kNumTilings; ++k) {
    if (kTilings[k] == tiling) index = k;
  }
  if (index < 0) return cudaErrorInvalidValue;
  const int64_t rows_per_block = int64_t{kRowsPerBlock} * tiling.rows;
  const int64_t blocks_x =
      std::min<int64_t>((tokens + tiling.tokens - 1) / tiling.tokens, kMaxGridX);
  const int64_t blocks_y =
      std::min<int64_t>((out + rows_per_block - 1) / rows_per_block, kMaxGridY);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y));
  // cudaGetLastError reports the last failed runtime call of this thread; the
  // callers return on every failure, so anything pending is not ours. Clear
  // it so the check below sees this launch alone.
  (void)cudaGetLastError();
  kKernels[index]<<<grid, kThreads, 0, stream>>>(x, tokens, w, bias, in, out, scaled, scale, y);
  return cudaGetLastError();
}

cudaError_t LaunchDotRows(const float* x, int64_t tokens, const float* w, const float* bias,
                          int64_t in, int64_t out, bool scaled, float scale, float* y,
                          cudaStream_t stream) {
  return LaunchDotRowsTiled(DefaultDotRowsTiling(tokens), x, tokens, w, bias, in, out, scaled,
                            scale, y, stream);
}

cudaError_t LaunchAccumulateValues(const float* p, const float* v, int64_t n, int64_t dim,
                                   float* acc, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((dim + kThreads - 1) / kThreads, kMaxGridX);
  (void)cudaGetLastError();  // as in LaunchDotRows
  AccumulateValuesKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, v, n, dim, acc);
  return cudaGetLastError();
}

}  // namespace vc::kernels::cuda
