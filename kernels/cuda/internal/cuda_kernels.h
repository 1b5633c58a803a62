// Private to kernels/cuda: host-callable launchers for the CUDA kernels of the
// canonical primitives (kernels/kernels.h, docs/numerics.md). Framework-free:
// only the CUDA runtime types, so the .cu file stays small and the backend
// itself is plain C++.
//
// Every pointer here is a DEVICE pointer. Layouts (row-major, float32):
//   x [tokens, in]     w [out, in]     bias [out] or null     y [tokens, out]
//   p [n]              v [n, dim]      acc [dim] (read and written)
//
// Exactness: each output element is computed by one half-warp (16 threads) in
// a fixed mapping (a half-warp may compute several elements at once, sharing
// loads between them, never operations). Thread l holds logical lane l: it adds x[i] * w[i] for
// i = l, l + 16, l + 32, ... with __fmaf_rn in increasing i, the last group
// zero-padded (__fmaf_rn(0, 0, lane)). Shuffles then sum the lanes by the
// fixed tree l[k] + l[k+8], + [k+4], + [k+2], + [k+1] with __fadd_rn. The
// bias is added after the tree (__fadd_rn), the scale multiplied last
// (__fmul_rn). That is the same sequence of IEEE operations as the CPU paths,
// so results agree bit for bit (NaN payloads aside: a CUDA NaN is always the
// canonical 0x7fffffff). The file is built with -fmad=false and without fast
// math (no FTZ, IEEE div/sqrt), so nvcc adds no fusion of its own.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace vc::kernels::cuda {

// y[t*out + o] = ((bias ? bias[o] + d : d) * (scaled ? scale : -)) where
// d = Dot(x + t*in, w + o*in, in), for t < tokens, o < out. With no bias the
// add is skipped and with scaled == false the multiply is skipped (neither is
// done with 0 or 1). Launches on `stream` with DefaultDotRowsTiling(tokens)
// and returns the launch error, if any.
cudaError_t LaunchDotRows(const float* x, int64_t tokens, const float* w, const float* bias,
                          int64_t in, int64_t out, bool scaled, float scale, float* y,
                          cudaStream_t stream);

// How a DotRows launch shares loads: each half-warp computes `rows`
// consecutive output rows for a tile of at most `tokens` tokens (tokens are
// split into near-equal tiles), so each weight element it loads serves every
// token of the tile and each x element every row. The tiling never changes an
// element's operations: every tiling gives the same bits. Each thread issues
// `loads` weight loads (loads / rows steps of 16 elements) before the FMAs
// that use them: a product is memory-bound and only 16 threads share a row,
// so loads in flight per thread are what its speed depends on.
struct DotRowsTiling {
  int rows = 1;
  int tokens = 1;
  int loads = 16;
};
inline bool operator==(const DotRowsTiling& a, const DotRowsTiling& b) {
  return a.rows == b.rows && a.tokens == b.tokens && a.loads == b.loads;
}

// The tilings that have kernels (rows x tokens / loads: 1x1/32, 1x1/64,
// 2x1/64, 1x2/64, 2x2/64, 4x4/32, 4x4/64, 4x8/64, 4x4/128), for the parity
// test and the bench to sweep.
int DotRowsTilingCount();
DotRowsTiling DotRowsTilingAt(int index);  // 0 <= index < DotRowsTilingCount()

// The tiling LaunchDotRows uses for a product of `tokens` tokens.
DotRowsTiling DefaultDotRowsTiling(int64_t tokens);

// LaunchDotRows with a given tiling; cudaErrorInvalidValue for a tiling that
// has no kernel.
cudaError_t LaunchDotRowsTiled(DotRowsTiling tiling, const float* x, int64_t tokens, const float* w,
                               const float* bias, int64_t in, int64_t out, bool scaled, float scale,
                               float* y, cudaStream_t stream);

// acc[d] = fma(p[j], v[j*dim + d], acc[d]) for j = 0..n-1 in order, d < dim.
// One thread per d runs the whole chain over j.
cudaError_t LaunchAccumulateValues(const float* p, const float* v, int64_t n, int64_t dim,
                                   float* acc, cudaStream_t stream);

}  // namespace vc::kernels::cuda
