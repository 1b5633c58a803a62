// CUDA kernels of the canonical primitives. See internal/cuda_kernels.h for
// the layouts and for why the results equal the CPU paths bit for bit.
// Built with -fmad=false: every FMA below is written as __fmaf_rn, every add
// and multiply that must not be fused as __fadd_rn / __fmul_rn.
#include <algorithm>

#include "kernels/cuda/internal/cuda_kernels.h"

namespace vc::kernels::cuda {
namespace {

constexpr int kLanes = 16;                        // logical lanes of a dot product
constexpr int kRowsPerBlock = 8;                  // half-warps (output rows) per block
constexpr int kThreads = kLanes * kRowsPerBlock;  // 128
constexpr int kTokenTile = 4;                     // tokens sharing one weight load
constexpr int64_t kMaxGridX = int64_t{1} << 20;   // grid-stride loops cover the rest
constexpr int64_t kMaxGridY = 65535;

// Block layout: thread (group, lane) = (threadIdx.x / 16, threadIdx.x % 16).
// Half-warp `group` owns output row o and, for each token tile, produces
// y[t][o] for up to kTokenTile tokens t; thread `lane` is logical lane `lane`
// of each of those dot products. Tiling over tokens only decides which
// elements share a weight load, never the operations inside one element.
__global__ void __launch_bounds__(kThreads)
    DotRowsKernel(const float* __restrict__ x, int64_t tokens, const float* __restrict__ w,
                  const float* __restrict__ bias, int64_t in, int64_t out, bool scaled, float scale,
                  float* __restrict__ y) {
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int group = static_cast<int>(threadIdx.x) / kLanes;
  // Shuffle mask: the 16 threads of this half-warp. The two half-warps of a
  // warp may take different paths (one can run out of rows); each only ever
  // syncs with itself.
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int64_t padded = (in + kLanes - 1) / kLanes * kLanes;
  const int64_t tiles = (tokens + kTokenTile - 1) / kTokenTile;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;

  for (int64_t o = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + group; o < out;
       o += row_stride) {
    const float* wo = w + o * in;
    for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
      const int64_t t0 = tile * kTokenTile;
      const int64_t nt = tokens - t0 < kTokenTile ? tokens - t0 : kTokenTile;
      float acc[kTokenTile];
#pragma unroll
      for (int k = 0; k < kTokenTile; ++k) acc[k] = 0.0f;

      // Lane `lane` takes elements i = i0 + lane in increasing i0; the last
      // group is padded with zeros, which are FMA'd like everything else.
      for (int64_t i0 = 0; i0 < padded; i0 += kLanes) {
        const int64_t i = i0 + lane;
        const bool inside = i < in;
        const float wv = inside ? wo[i] : 0.0f;
#pragma unroll
        for (int k = 0; k < kTokenTile; ++k) {
          if (k < nt) {
            const float xv = inside ? x[(t0 + k) * in + i] : 0.0f;
            acc[k] = __fmaf_rn(xv, wv, acc[k]);
          }
        }
      }

#pragma unroll
      for (int k = 0; k < kTokenTile; ++k) {
        // The fixed pairwise tree. After step `width`, lane k < width holds
        // s[k] + s[k + width]; lanes >= width hold values nobody reads.
        float s = acc[k];
        s = __fadd_rn(s, __shfl_down_sync(mask, s, 8, kLanes));
        s = __fadd_rn(s, __shfl_down_sync(mask, s, 4, kLanes));
        s = __fadd_rn(s, __shfl_down_sync(mask, s, 2, kLanes));
        s = __fadd_rn(s, __shfl_down_sync(mask, s, 1, kLanes));
        if (lane == 0 && k < nt) {
          if (bias != nullptr) s = __fadd_rn(s, bias[o]);
          if (scaled) s = __fmul_rn(s, scale);
          y[(t0 + k) * out + o] = s;
        }
      }
    }
  }
}

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

cudaError_t LaunchDotRows(const float* x, int64_t tokens, const float* w, const float* bias,
                          int64_t in, int64_t out, bool scaled, float scale, float* y,
                          cudaStream_t stream) {
  if (tokens <= 0 || out <= 0) return cudaSuccess;
  if (in < 0) return cudaErrorInvalidValue;
  const int64_t blocks_x = std::min<int64_t>((out + kRowsPerBlock - 1) / kRowsPerBlock, kMaxGridX);
  const int64_t blocks_y = std::min<int64_t>((tokens + kTokenTile - 1) / kTokenTile, kMaxGridY);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y));
  // cudaGetLastError reports the last failed runtime call of this thread; the
  // callers return on every failure, so anything pending is not ours. Clear
  // it so the check below sees this launch alone.
  (void)cudaGetLastError();
  DotRowsKernel<<<grid, kThreads, 0, stream>>>(x, tokens, w, bias, in, out, scaled, scale, y);
  return cudaGetLastError();
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
