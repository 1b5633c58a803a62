#include "common/collective/nccl/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "common/collective/internal/registry.h"

namespace vc::collective {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
absl::Status NcclError(ncclResult_t r, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int device, int rank, int size)
      : comm_(comm), stream_(stream), device_(device), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    (void)cudaSetDevice(device_);
    (void)ncclCommDestroy(comm_);
    (void)cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllGather(const float* send, int64_t n, float* recv) override {
    return Run(ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat, comm_, stream_),
               "ncclAllGather");
  }
  absl::Status Broadcast(float* buf, int64_t n, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("Broadcast root ", root, " outside [0, ", size_, ")"));
    }
    return Run(ncclBroadcast(buf, buf, static_cast<size_t>(n), ncclFloat, root, comm_, stream_),
               "ncclBroadcast");
  }
  // NCCL chooses the summation order (ring/tree): not for values that must
  // be identical across degrees.
  absl::Status AllReduceSum(float* buf, int64_t n) override {
    return Run(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, stream_),
               "ncclAllReduce");
  }
  absl::Status Barrier() override {
    // A zero-byte all-reduce is not a barrier in NCCL; reduce one float.
    if (scratch_ == nullptr) {
      if (cudaError_t e = cudaMalloc(&scratch_, sizeof(float)); e != cudaSuccess) {
        return CudaError(e, "cudaMalloc");
      }
    }
    return Run(ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_), "barrier");
  }

 private:
  absl::Status Run(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) return NcclError(r, what);
    // Blocking synchronisation (the device was set to yield, not spin).
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      return CudaError(e, "cudaStreamSynchronize");
    }
    return absl::OkStatus();
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int device_, rank_, size_;
  float* scratch_ = nullptr;
};

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    const CollectiveOptions& options) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) count = 0;
  std::vector<int> devices = options.devices;
  if (devices.empty()) {
    for (int i = 0; i < options.size; ++i) devices.push_back(i);
  }
  if (static_cast<int>(devices.size()) != options.size) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ", devices.size(), " devices for ",
                                                   options.size, " ranks"));
  }
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size()) {
    return absl::InvalidArgumentError(
        "nccl: two ranks on one GPU; NCCL needs one GPU per rank (a worker at tensor-parallel "
        "degree N needs N GPUs)");
  }
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nccl: a group of ", options.size, " ranks needs ", options.size,
          " GPUs (one per rank); device ", d, " is not among the ", count, " visible"));
    }
  }
  std::vector<ncclComm_t> comms(devices.size());
  if (ncclResult_t r = ncclCommInitAll(comms.data(), options.size, devices.data()); r != ncclSuccess) {
    return NcclError(r, "ncclCommInitAll");
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < options.size; ++r) {
    (void)cudaSetDevice(devices[r]);
    (void)cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    cudaStream_t stream = nullptr;
    if (cudaError_t e = cudaStreamCreate(&stream); e != cudaSuccess) {
      for (int q = r; q < options.size; ++q) (void)ncclCommDestroy(comms[q]);
      return CudaError(e, "cudaStreamCreate");
    }
    out.push_back(std::make_unique<NcclCommunicator>(comms[r], stream, devices[r], r, options.size));
  }
  return out;
}

}  // namespace

void RegisterNcclBackend() { RegisterBackend("nccl", &CreateNcclGroup); }

}  // namespace vc::collective
