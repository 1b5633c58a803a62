// The "cpu" collective backend: ranks are threads of one process sharing one
// rendezvous. Each call is two phases around a generation counter: every rank
// publishes its buffer pointer and waits (condition variable) until all have
// arrived; then every rank reads what it needs from the others' buffers and
// waits again until all have finished reading, so no buffer is reused early.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/collective/collective.h"
#include "common/collective/internal/registry.h"

namespace vc::collective {
namespace {

class Rendezvous {
 public:
  explicit Rendezvous(int size) : size_(size), slots_(size, nullptr), sizes_(size, 0) {}

  // Publishes (ptr, n) for `rank` and blocks until all ranks have; returns the
  // generation's views. Then the caller must call Leave().
  void Arrive(int rank, float* ptr, int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    // Wait until the previous call has fully drained.
    cv_.wait(lock, [&] { return leaving_ == 0; });
    slots_[rank] = ptr;
    sizes_[rank] = n;
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      leaving_ = size_;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }
  void Leave() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = drain_generation_;
    if (--leaving_ == 0) {
      ++drain_generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return drain_generation_ != gen; });
    }
  }
  float* slot(int r) const { return slots_[r]; }
  int64_t slot_size(int r) const { return sizes_[r]; }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float*> slots_;
  std::vector<int64_t> sizes_;
  int arrived_ = 0;
  int leaving_ = 0;
  uint64_t generation_ = 0;
  uint64_t drain_generation_ = 0;
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Rendezvous> rv, int rank, int size)
      : rv_(std::move(rv)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllGather(const float* send, int64_t n, float* recv) override {
    rv_->Arrive(rank_, const_cast<float*>(send), n);
    absl::Status status = CheckSizes(n, "AllGather");
    if (status.ok()) {
      for (int r = 0; r < size_; ++r) {
        if (n > 0) std::memcpy(recv + r * n, rv_->slot(r), sizeof(float) * n);
      }
    }
    rv_->Leave();
    return status;
  }

  absl::Status Broadcast(float* buf, int64_t n, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("Broadcast root ", root, " outside [0, ", size_, ")"));
    }
    rv_->Arrive(rank_, buf, n);
    absl::Status status = CheckSizes(n, "Broadcast");
    if (status.ok() && rank_ != root && n > 0) {
      std::memcpy(buf, rv_->slot(root), sizeof(float) * n);
    }
    rv_->Leave();
    return status;
  }

  absl::Status AllReduceSum(float* buf, int64_t n) override {
    std::vector<float> copy(buf, buf + n);
    rv_->Arrive(rank_, copy.data(), n);
    absl::Status status = CheckSizes(n, "AllReduceSum");
    if (status.ok()) {
      for (int64_t j = 0; j < n; ++j) {
        float s = rv_->slot(0)[j];
        for (int r = 1; r < size_; ++r) s = s + rv_->slot(r)[j];
        buf[j] = s;
      }
    }
    rv_->Leave();
    return status;
  }

  absl::Status Barrier() override {
    rv_->Arrive(rank_, nullptr, 0);
    rv_->Leave();
    return absl::OkStatus();
  }

 private:
  // Every rank sees the same sizes, so every rank returns the same error.
  absl::Status CheckSizes(int64_t n, const char* op) const {
    for (int r = 0; r < size_; ++r) {
      if (rv_->slot_size(r) != n) {
        return absl::InvalidArgumentError(absl::StrCat(op, ": rank ", r, " passed ",
                                                       rv_->slot_size(r), " floats, rank ",
                                                       rank_, " passed ", n));
      }
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Rendezvous> rv_;
  const int rank_, size_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateCpuGroup(
    const CollectiveOptions& options) {
  auto rv = std::make_shared<Rendezvous>(options.size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < options.size; ++r) {
    out.push_back(std::make_unique<CpuCommunicator>(rv, r, options.size));
  }
  return out;
}

}  // namespace vc::collective
