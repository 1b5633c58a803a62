// The CUDA backend: the canonical primitives (kernels/kernels.h) on device 0,
// bit-identical to the CPU paths (see internal/cuda_kernels.h for how).
//
// Host pointers in, host pointers out. The engine is CPU-resident today, so
// every call copies its inputs into device buffers, launches on the backend's
// own stream, copies the result back and synchronises before returning. That
// makes each call cost a round trip; this backend is for parity and bring-up,
// not speed, until the engine keeps activations and KV on the device.
//
//  * Scratch device buffers are kept across calls and grown as needed.
//  * Matmul weight matrices go through a WeightCache (internal/weight_cache.h):
//    device copies of up to kWeightCacheBytes of weights, validated against
//    the caller's bytes on every call, so a freed-and-reused host address can
//    never serve stale weights. Biases, activations and KV rows are copied
//    every call.
//  * Errors: the factory turns every CUDA error into an absl::Status (no
//    device -> FailedPrecondition "no CUDA device: ..."), and it runs one tiny
//    kernel before returning, so a binary without code for the device fails
//    there. After that a CUDA error inside a kernel call (whose interface
//    returns void or a float) means a broken invariant - device lost, out of
//    device memory, a kernel fault - and aborts with the CUDA error's name and
//    message.
//  * Calls are serialised by a mutex (the const methods may be called from
//    several threads, as the CPU backend allows).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "kernels/cuda/internal/cuda_kernels.h"
#include "kernels/cuda/internal/weight_cache.h"
#include "kernels/internal/registry.h"
#include "kernels/kernels.h"

namespace vc::kernels {
namespace cuda {
namespace {

// Device copies of Matmul weights kept at once (plus the same again in host
// shadow copies, see WeightCache).
constexpr size_t kWeightCacheBytes = size_t{1} << 30;

std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

// Returns a CUDA error from the enclosing function (which returns cudaError_t).
#define VC_CUDA_TRY(expr)                                 \
  do {                                                    \
    const cudaError_t vc_cuda_err_ = (expr);              \
    if (vc_cuda_err_ != cudaSuccess) return vc_cuda_err_; \
  } while (false)

// For the void interface methods: a CUDA error here is a broken invariant.
void CheckCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const std::string msg = absl::StrCat("CUDA error in ", what, ": ", CudaErrorText(err));
  ::vc::internal::CheckFailed(__FILE__, __LINE__, "cudaSuccess", msg.c_str());
}

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA backend: ", what, ": ", CudaErrorText(err)));
}

struct StreamDeleter {
  void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;

struct DeviceFree {
  // Errors are ignored: at process exit the runtime may already be unloaded.
  void operator()(float* p) const noexcept { cudaFree(p); }
};

// A device array of floats whose contents are not kept when it grows.
class DeviceBuffer {
 public:
  cudaError_t Reserve(size_t count) {
    if (count <= capacity_) return cudaSuccess;
    // Grow by at least half again, so slowly rising sizes reallocate rarely.
    const size_t want = std::max(count, capacity_ + capacity_ / 2);
    ptr_.reset();
    capacity_ = 0;
    void* p = nullptr;
    VC_CUDA_TRY(cudaMalloc(&p, want * sizeof(float)));
    ptr_.reset(static_cast<float*>(p));
    capacity_ = want;
    return cudaSuccess;
  }
  float* data() const { return ptr_.get(); }

 private:
  std::unique_ptr<float, DeviceFree> ptr_;
  size_t capacity_ = 0;
};

cudaError_t ToDevice(DeviceBuffer& buf, const float* host, int64_t count, cudaStream_t s) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(count, 0));
  VC_CUDA_TRY(buf.Reserve(n));
  if (n == 0) return cudaSuccess;
  return cudaMemcpyAsync(buf.data(), host, n * sizeof(float), cudaMemcpyHostToDevice, s);
}

cudaError_t ToHost(float* host, const DeviceBuffer& buf, int64_t count, cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  return cudaMemcpyAsync(host, buf.data(), static_cast<size_t>(count) * sizeof(float),
                         cudaMemcpyDeviceToHost, s);
}

// Everything on the device, guarded by CudaBackend::mu_. Members are
// destroyed in reverse order: buffers first, then the stream.
struct DeviceState {
  explicit DeviceState(StreamPtr s) : stream(std::move(s)) {}
  StreamPtr stream;
  DeviceBuffer a, b, c, d;  // per-call scratch
  WeightCache<DeviceBuffer> weights{kWeightCacheBytes};
};

class CudaBackend final : public KernelBackend {
 public:
  CudaBackend(int device, std::string device_name, StreamPtr stream)
      : device_(device),
        device_name_(std::move(device_name)),
        pool_(1),
        state_(std::make_unique<DeviceState>(std::move(stream))) {}

  std::string name() const override { return absl::StrCat("cuda/", device_name_); }
  int threads() const override { return pool_.num_threads(); }
  ThreadPool& pool() override { return pool_; }

  float Dot(const float* a, const float* b, int64_t n) const override {
    float result = 0.0f;
    CheckCuda(DotImpl(a, b, n, &result), "Dot");
    return result;
  }

  void Matmul(const float* x, int64_t tokens, const float* w, const float* bias, int64_t in,
              int64_t out, float* y) override {
    CheckCuda(MatmulImpl(x, tokens, w, bias, in, out, y), "Matmul");
  }

  void AttentionScores(const float* q, const float* k, int64_t n, int64_t head_dim, float scale,
                       float* scores) const override {
    CheckCuda(AttentionScoresImpl(q, k, n, head_dim, scale, scores), "AttentionScores");
  }

  void AccumulateValues(const float* p, const float* v, int64_t n, int64_t head_dim,
                        float* out) const override {
    CheckCuda(AccumulateValuesImpl(p, v, n, head_dim, out), "AccumulateValues");
  }

  // Run by the factory: one small Dot through the whole path (copies, launch,
  // copy back), so a missing kernel image or a broken device is a Status.
  absl::Status SelfTest() const {
    float a[37], b[37];
    for (int i = 0; i < 37; ++i) {
      a[i] = static_cast<float>(i + 1);
      b[i] = 1.0f;
    }
    float got = 0.0f;
    VC_RETURN_IF_ERROR(CudaStatus(DotImpl(a, b, 37, &got), "self-test"));
    if (got != 703.0f) {  // 1 + ... + 37, exact in float in any order
      return absl::InternalError(
          absl::StrCat("CUDA backend: self-test Dot gave ", got, ", want 703"));
    }
    return absl::OkStatus();
  }

 private:
  cudaError_t DotImpl(const float* a, const float* b, int64_t n, float* result) const {
    if (n <= 0) {  // no lanes touched: the tree of +0 lanes is +0
      *result = 0.0f;
      return cudaSuccess;
    }
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState& st = *state_;
    cudaStream_t s = st.stream.get();
    VC_CUDA_TRY(cudaSetDevice(device_));
    VC_CUDA_TRY(ToDevice(st.a, a, n, s));
    VC_CUDA_TRY(ToDevice(st.b, b, n, s));
    VC_CUDA_TRY(st.c.Reserve(1));
    VC_CUDA_TRY(LaunchDotRows(st.a.data(), 1, st.b.data(), nullptr, n, 1, /*scaled=*/false, 1.0f,
                              st.c.data(), s));
    VC_CUDA_TRY(ToHost(result, st.c, 1, s));
    return cudaStreamSynchronize(s);
  }

  cudaError_t MatmulImpl(const float* x, int64_t tokens, const float* w, const float* bias,
                         int64_t in, int64_t out, float* y) {
    if (tokens <= 0 || out <= 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState& st = *state_;
    cudaStream_t s = st.stream.get();
    VC_CUDA_TRY(cudaSetDevice(device_));
    VC_CUDA_TRY(ToDevice(st.a, x, tokens * in, s));
    const float* dw = nullptr;
    VC_CUDA_TRY(WeightsToDevice(st, w, out * in, s, &dw));
    const float* dbias = nullptr;
    if (bias != nullptr) {
      VC_CUDA_TRY(ToDevice(st.c, bias, out, s));
      dbias = st.c.data();
    }
    VC_CUDA_TRY(st.d.Reserve(static_cast<size_t>(tokens * out)));
    VC_CUDA_TRY(LaunchDotRows(st.a.data(), tokens, dw, dbias, in, out, /*scaled=*/false, 1.0f,
                              st.d.data(), s));
    VC_CUDA_TRY(ToHost(y, st.d, tokens * out, s));
    return cudaStreamSynchronize(s);
  }

  cudaError_t AttentionScoresImpl(const float* q, const float* k, int64_t n, int64_t head_dim,
                                  float scale, float* scores) const {
    if (n <= 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState& st = *state_;
    cudaStream_t s = st.stream.get();
    VC_CUDA_TRY(cudaSetDevice(device_));
    VC_CUDA_TRY(ToDevice(st.a, q, head_dim, s));
    VC_CUDA_TRY(ToDevice(st.b, k, n * head_dim, s));
    VC_CUDA_TRY(st.d.Reserve(static_cast<size_t>(n)));
    // scores = Dot(q, k_j) * scale: q is the single "token", k the rows.
    VC_CUDA_TRY(LaunchDotRows(st.a.data(), 1, st.b.data(), nullptr, head_dim, n,
                              /*scaled=*/true, scale, st.d.data(), s));
    VC_CUDA_TRY(ToHost(scores, st.d, n, s));
    return cudaStreamSynchronize(s);
  }

  cudaError_t AccumulateValuesImpl(const float* p, const float* v, int64_t n, int64_t head_dim,
                                   float* out) const {
    if (n <= 0 || head_dim <= 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState& st = *state_;
    cudaStream_t s = st.stream.get();
    VC_CUDA_TRY(cudaSetDevice(device_));
    VC_CUDA_TRY(ToDevice(st.a, p, n, s));
    VC_CUDA_TRY(ToDevice(st.b, v, n * head_dim, s));
    VC_CUDA_TRY(ToDevice(st.d, out, head_dim, s));
    VC_CUDA_TRY(LaunchAccumulateValues(st.a.data(), st.b.data(), n, head_dim, st.d.data(), s));
    VC_CUDA_TRY(ToHost(out, st.d, head_dim, s));
    return cudaStreamSynchronize(s);
  }

  // Sets *dw to a device copy of the `count` floats at `w`: the cached copy
  // when the cache takes them, else scratch buffer b. Called with mu_ held.
  static cudaError_t WeightsToDevice(DeviceState& st, const float* w, int64_t count, cudaStream_t s,
                                     const float** dw) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 0)) * sizeof(float);
    cudaError_t upload_err = cudaSuccess;
    auto upload = [&](const void* host, size_t n, DeviceBuffer& buf) {
      upload_err = buf.Reserve(n / sizeof(float));
      if (upload_err == cudaSuccess) {
        upload_err = cudaMemcpyAsync(buf.data(), host, n, cudaMemcpyHostToDevice, s);
      }
      return upload_err == cudaSuccess;
    };
    bool ok = true;
    DeviceBuffer* cached = st.weights.Get(w, bytes, upload, &ok);
    if (cached != nullptr) {
      *dw = cached->data();
      return cudaSuccess;
    }
    if (!ok) {
      if (upload_err != cudaErrorMemoryAllocation) return upload_err;
      // Out of device memory for the cache: clear the error that the failed
      // cudaMalloc left behind, free the cache and go uncached.
      cudaGetLastError();
      st.weights.Clear();
    }
    VC_CUDA_TRY(ToDevice(st.b, w, count, s));
    *dw = st.b.data();
    return cudaSuccess;
  }

  const int device_;
  const std::string device_name_;
  ThreadPool pool_;
  mutable std::mutex mu_;
  const std::unique_ptr<DeviceState> state_;  // pointee mutable from const methods; under mu_
};

}  // namespace
}  // namespace cuda

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateCudaBackend(const BackendOptions& options) {
  // options.threads and options.simd do not apply: kernels run on the device
  // and the host-side pool has one thread. Device 0 is used (choose another
  // with CUDA_VISIBLE_DEVICES).
  (void)options;
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess) {
    cudaGetLastError();  // not sticky; leave no error behind for later calls
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: cudaGetDeviceCount failed with ", cuda::CudaErrorText(count_err)));
  }
  if (count <= 0) {
    return absl::FailedPreconditionError("no CUDA device: cudaGetDeviceCount found 0 devices");
  }
  constexpr int kDevice = 0;
  VC_RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(kDevice), "cudaSetDevice"));
  cudaDeviceProp prop{};
  VC_RETURN_IF_ERROR(
      cuda::CudaStatus(cudaGetDeviceProperties(&prop, kDevice), "cudaGetDeviceProperties"));
  cudaStream_t raw = nullptr;
  VC_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking),
                                      "cudaStreamCreateWithFlags"));
  cuda::StreamPtr stream(raw);
  auto backend =
      std::make_unique<cuda::CudaBackend>(kDevice, std::string(prop.name), std::move(stream));
  VC_RETURN_IF_ERROR(backend->SelfTest());
  return std::unique_ptr<KernelBackend>(std::move(backend));
}

}  // namespace vc::kernels
