// The "nccl" collective backend: one rank per CUDA device, all in this
// process (ncclCommInitAll). Buffers passed to its Communicators are DEVICE
// pointers; each call runs on the rank's stream and returns when it has
// completed. NCCL cannot place several ranks of one communicator on the same
// GPU, so a group of size N needs N distinct devices: a worker at
// tensor-parallel degree N needs N GPUs. Built only when CUDA and NCCL are
// found; a binary that wants it links vc_collective_nccl and calls
// RegisterNcclBackend() once.
#pragma once

namespace vc::collective {

// Adds "nccl" to the collective registry.
void RegisterNcclBackend();

}  // namespace vc::collective
