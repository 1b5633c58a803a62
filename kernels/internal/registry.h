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

// kernels::Softmax with the exps computed by `exp_inplace` (which must equal
// kernels::Exp bit for bit); backends pass their vectorised exp.
void SoftmaxWithExp(float* s, int64_t n, void (*exp_inplace)(float*, int64_t));
// SoftmaxWithExp over `count` rows, with the sequential max and sum chains of
// up to 8 rows interleaved (each row's own operations in its own order).
void SoftmaxRowsWithExp(float* const* rows, const int64_t* n, int64_t count,
                        void (*exp_inplace)(float*, int64_t));

// Built-in factories.
absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCpuBackend(const BackendOptions& options);
// Defined only in CUDA builds (kernels/cuda/, VC_HAVE_CUDA): FailedPrecondition
// "no CUDA device: ..." when the machine has none.
absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace vc::kernels
