// Private to kernels/: the backend registry. Built-in backends are added
// explicitly the first time the registry is used (static registration objects
// in a static library are dropped by the linker when nothing references them).
#pragma once

#include <functional>
#include <string>

#include "kernels/kernels.h"

namespace vc::kernels {

using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<KernelBackend>>(const BackendOptions&)>;

// Returns true so it can initialise a namespace-scope constant.
bool RegisterBackend(const std::string& name, BackendFactory factory);

// The parts of kernels::Softmax a backend may vectorise; each must give the
// scalar definition's results bit for bit.
struct SoftmaxParts {
  void (*exp_inplace)(float* x, int64_t n);  // x[i] = kernels::Exp(x[i])
  // *max = the max of x[0, n) and true, or false when x holds a NaN (then
  // the sequential std::max chain decides). Null: always the chain.
  bool (*max_no_nan)(const float* x, int64_t n, float* max);
  // x[i] = kernels::Exp(x[i] - m) in one pass. Null: a shift, then
  // exp_inplace.
  void (*shift_exp)(float* x, int64_t n, float m) = nullptr;
  // x[i] *= s. Null: a plain loop.
  void (*scale_inplace)(float* x, int64_t n, float s) = nullptr;
};

// kernels::Softmax with a backend's parts.
void SoftmaxWith(float* s, int64_t n, const SoftmaxParts& parts);
// SoftmaxWith over `count` rows, with the sequential sum chains of up to 16
// rows interleaved (each row's own additions in its own order).
void SoftmaxRowsWith(float* const* rows, const int64_t* n, int64_t count,
                     const SoftmaxParts& parts);

// Built-in factories.
absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCpuBackend(const BackendOptions& options);
// Defined only in CUDA builds (kernels/cuda/, VC_HAVE_CUDA): FailedPrecondition
// "no CUDA device: ..." when the machine has none.
absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace vc::kernels
