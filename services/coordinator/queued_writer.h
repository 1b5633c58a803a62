// A server-streaming call on gRPC's callback API whose messages come from a
// thread of the service's own (the coordinator's request runners), not from
// gRPC's reactions: messages wait in a bounded queue and are written one at
// a time, Write blocks while the queue is full (so a client that stops
// reading holds its writer up; a coroutine awaits room first, WhenWritable,
// instead of blocking its thread), and the call finishes once the queue has
// drained. A failed write, a cancelled call or Break makes every later Write
// answer false.
//
// Why it is a class of its own: gRPC deletes a server reactor (OnDone) once
// it is finished and none of its reactions runs, and a call made from
// another thread is not a reaction, so after that thread calls Finish the
// reactor may be gone before Finish returns. Nothing of the reactor may be
// touched after Finish on such a thread: not even the release of its own
// lock (Generate's call did exactly that once and aborted the coordinator).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace vc::coordinator {

template <typename Message>
class QueuedWriteReactor : public grpc::ServerWriteReactor<Message> {
 public:
  explicit QueuedWriteReactor(size_t max_queued) : max_queued_(max_queued) {}

  // Queues `msg` (waiting while max_queued messages are queued); false once
  // a write has failed or the call was cancelled. Not after FinishWhenWritten.
  bool Write(const Message& msg) {
    std::unique_lock<std::mutex> lock(mu_);
    room_.wait(lock, [&] { return broken_ || queue_.size() < max_queued_; });
    if (broken_) return false;
    queue_.push_back(msg);
    if (queue_.size() == 1) StartNextWrite();
    return true;
  }

  // True when a Write now would not wait for room (or would fail at once).
  bool Writable() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_ || queue_.size() < max_queued_;
  }

  // Calls `ready` once Writable would be true: at once (on this thread) if
  // it is now, otherwise from the reaction that makes room or breaks the
  // call. A later call replaces a `ready` not called yet. `ready` must be
  // quick and must not call back into this reactor. Not after
  // FinishWhenWritten.
  void WhenWritable(std::function<void()> ready) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_ && queue_.size() >= max_queued_) {
        ready_ = std::move(ready);
        return;
      }
    }
    ready();
  }

  // Gives up on the reader: the messages not yet started are dropped, every
  // later Write answers false at once and a WhenWritable waiter is told, as
  // after a failed write. For a writer whose reader stopped reading and that
  // should not wait for it any longer; the caller cancels the call too
  // (TryCancel on its context), which ends the write in flight.
  void Break() {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    if (queue_.size() > 1) queue_.erase(queue_.begin() + 1, queue_.end());
    room_.notify_all();
    TellReady();
  }

  // Finishes the call with `status` once the queued messages are written
  // (at once when nothing is queued, or a write has failed). Called once,
  // after the last Write; the call may be gone on return.
  void FinishWhenWritten(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty()) {
        finish_ = status;  // OnWriteDone, a reaction, finishes the call
        return;
      }
    }
    // Nothing can be queued in between (no Write after this call), and the
    // lock is released before Finish: see the file comment.
    this->Finish(status);
  }

  void OnWriteDone(bool ok) final {
    std::lock_guard<std::mutex> lock(mu_);
    WriteEnded();
    queue_.pop_front();
    if (!ok || broken_) {
      broken_ = true;
      queue_.clear();
    }
    room_.notify_all();
    TellReady();
    if (!queue_.empty()) {
      StartNextWrite();
    } else if (finish_) {
      // Inside a reaction: OnDone waits for it to return.
      this->Finish(*finish_);
      finish_.reset();
    }
  }

  void OnCancel() final {
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = true;
      room_.notify_all();
      TellReady();
    }
    Cancelled();
  }

  void OnDone() final { delete this; }

 protected:
  ~QueuedWriteReactor() override = default;

  // A write of the queue's front starts / ends (the queue's lock held).
  virtual void WriteStarted() {}
  virtual void WriteEnded() {}
  // The client cancelled or went away (no lock held).
  virtual void Cancelled() {}

 private:
  void TellReady() {  // mu_ held; the queue has room or the call broke
    if (!ready_) return;
    std::function<void()> ready = std::move(ready_);
    ready_ = nullptr;
    ready();
  }
  void StartNextWrite() {  // mu_ held, queue_ not empty
    WriteStarted();
    this->StartWrite(&queue_.front());
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable room_;  // the queue shrank, or the call broke
  std::deque<Message> queue_;     // the front is being written
  bool broken_ = false;
  std::optional<grpc::Status> finish_;
  std::function<void()> ready_;  // WhenWritable's, until there is room
};

}  // namespace vc::coordinator
