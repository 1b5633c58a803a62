// Collectives for tensor parallelism: a group of `size` ranks exchanging
// float buffers (AllGather, Broadcast, AllReduce, Barrier), behind one small
// interface chosen by registry name.
//
// Backends:
//  * "cpu":  ranks are threads of one process; a call blocks on a condition
//            variable until every rank has arrived (no busy-spinning, so TP = 4
//            runs on 2 cores). Used by the tests and the CPU engine.
//  * "nccl": built only when CUDA and NCCL are found. One rank per GPU: NCCL
//            cannot put several ranks of one communicator on the same device,
//            so a worker at tensor-parallel degree N needs N GPUs.
//
// Every rank must make the same sequence of calls with the same sizes (as
// with MPI/NCCL). Invariance note: AllReduce sums in a backend-defined order;
// the engine never uses it for values that must be bit-identical across
// degrees. It gathers partials with AllGather and combines them in one fixed
// order itself (docs/numerics.md, "Tensor parallelism").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::collective {

// One rank's handle on its group. Calls are collective and blocking; a
// handle is used by one thread at a time.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv[i * n + j] = rank i's send[j], for every rank (rank order).
  [[nodiscard]] virtual absl::Status AllGather(const float* send, int64_t n, float* recv) = 0;
  // Every rank's buf becomes root's buf.
  [[nodiscard]] virtual absl::Status Broadcast(float* buf, int64_t n, int root) = 0;
  // buf[j] becomes the sum over ranks of buf[j]. The cpu backend adds in rank
  // order 0, 1, ..., size-1; other backends choose their own order.
  [[nodiscard]] virtual absl::Status AllReduceSum(float* buf, int64_t n) = 0;
  // Returns once every rank has called it.
  [[nodiscard]] virtual absl::Status Barrier() = 0;
};

struct CollectiveOptions {
  std::string backend = "cpu";  // registry name: "cpu", or "nccl" when built
  int size = 1;                 // ranks in the group (the tensor-parallel degree)
  // nccl only: the CUDA devices of ranks 0..size-1 (empty = 0..size-1).
  std::vector<int> devices;
};

// Creates the handles of all `size` ranks of one group living in this
// process (rank i is element i); each is then driven by its own thread.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateGroup(
    const CollectiveOptions& options);

// Names of the registered backends (always "cpu"; "nccl" when built with it).
std::vector<std::string> RegisteredBackends();

}  // namespace vc::collective
