// Fake workers for the coordinator's unit tests, behind worker_client.h's
// seam: Info and Release answer OK, every other call UNIMPLEMENTED; a test
// overrides the calls it exercises.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "services/coordinator/worker_client.h"

namespace vc::coordinator {

// Answers a fake holds back from Hold until Release: a synchronous call
// waits in WaitWhileHeld, an asynchronous one (a Start* call) hands its
// answer to Keep; Release makes the kept answers on the releasing thread.
class HeldAnswers {
 public:
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
  }
  // True: `answer` is kept for Release. False (not held): the caller
  // answers now.
  bool Keep(std::function<void()> answer) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_) return false;
    kept_.push_back(std::move(answer));
    return true;
  }
  void WaitWhileHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !held_; });
  }
  void Release() {
    std::vector<std::function<void()>> kept;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = false;
      kept.swap(kept_);
    }
    cv_.notify_all();
    for (auto& answer : kept) answer();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  std::vector<std::function<void()>> kept_;
};

// Info and Release of either kind of worker.
template <typename Client>
class FakeWorkerBase : public Client {
 public:
  explicit FakeWorkerBase(std::string address) : address_(std::move(address)) {}
  const std::string& address() const override { return address_; }
  absl::Status Info(const WorkerCallOptions&, const vericache::v1::WorkerInfoRequest&,
                    vericache::v1::WorkerInfoResponse*) override {
    return absl::OkStatus();
  }
  absl::Status Release(const WorkerCallOptions&, const vericache::v1::ReleaseRequest&,
                       vericache::v1::ReleaseResponse*) override {
    return absl::OkStatus();
  }

 private:
  std::string address_;
};

class FakeVerifierBase : public FakeWorkerBase<VerifierClient> {
 public:
  using FakeWorkerBase::FakeWorkerBase;
  absl::Status Open(const WorkerCallOptions&, const vericache::v1::VerifierOpenRequest&,
                    vericache::v1::VerifierOpenResponse*) override {
    return absl::UnimplementedError("Open is not faked");
  }
  absl::Status Load(const WorkerCallOptions&, const vericache::v1::LoadRequest&,
                    vericache::v1::LoadResponse*) override {
    return absl::UnimplementedError("Load is not faked");
  }
  absl::Status Verify(const WorkerCallOptions&, const vericache::v1::VerifyRequest&,
                      vericache::v1::VerifyResponse*) override {
    return absl::UnimplementedError("Verify is not faked");
  }
  absl::Status Round(const WorkerCallOptions&, const vericache::v1::RoundRequest&,
                     vericache::v1::RoundResponse*) override {
    return absl::UnimplementedError("Round is not faked");
  }
  absl::Status Ingest(const WorkerCallOptions&, const vericache::v1::IngestRequest&,
                      vericache::v1::IngestResponse*) override {
    return absl::UnimplementedError("Ingest is not faked");
  }
};

class FakeDrafterBase : public FakeWorkerBase<DrafterClient> {
 public:
  using FakeWorkerBase::FakeWorkerBase;
  absl::Status Open(const WorkerCallOptions&, const vericache::v1::DrafterOpenRequest&,
                    vericache::v1::DrafterOpenResponse*) override {
    return absl::UnimplementedError("Open is not faked");
  }
  absl::Status Draft(const WorkerCallOptions&, const vericache::v1::DraftRequest&,
                     vericache::v1::DraftResponse*) override {
    return absl::UnimplementedError("Draft is not faked");
  }
  absl::Status Commit(const WorkerCallOptions&, const vericache::v1::CommitRequest&,
                      vericache::v1::CommitResponse*) override {
    return absl::UnimplementedError("Commit is not faked");
  }
};

}  // namespace vc::coordinator
