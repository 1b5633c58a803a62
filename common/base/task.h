// Coroutines for code that waits without holding a thread (the coordinator's
// request runners: a request waiting for its slot on a link, or for the next
// message of a lease, is a suspended coroutine, not a blocked thread).
//
//  * Task<T>: a coroutine returning T, started lazily when awaited;
//    `co_await task` runs it to completion and resumes the awaiter on the
//    thread that finished it. T is usually absl::Status or
//    absl::StatusOr<U>. (A task that finishes without suspending resumes
//    its awaiter by symmetric transfer, which gcc turns into a tail call
//    only when optimising: keep loops of such awaits short between real
//    suspensions.)
//  * Spawn(task, done): starts a task from ordinary code; `done(T)` runs
//    where the task finished.
//  * BlockOn(task): runs a task to completion from ordinary code and waits
//    for it (tests, and the few callers that may block).
//  * Suspend(executor, start): the bridge from callbacks: `start(resume)`
//    registers `resume` with whatever will call it (a timer, a stream), and
//    the coroutine continues on `executor` once it has been called.
//
// No exceptions cross these (the project does not use them): a coroutine
// that throws terminates the process.
#pragma once

#include <atomic>
#include <condition_variable>
#include <coroutine>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "common/base/executor.h"

namespace vc {

template <typename T>
class [[nodiscard]] Task {
 public:
  struct promise_type {
    std::optional<T> value;
    std::coroutine_handle<> continuation;

    Task get_return_object() {
      return Task(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        std::coroutine_handle<> next = h.promise().continuation;
        return next ? next : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    template <typename U>
    void return_value(U&& v) {
      value.emplace(std::forward<U>(v));
    }
    void unhandled_exception() noexcept { std::terminate(); }
  };

  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  Task& operator=(Task&& other) = delete;
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (handle_) handle_.destroy();
  }

  // Awaiting runs the task; the awaiter resumes when it has returned.
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiting) noexcept {
    handle_.promise().continuation = awaiting;
    return handle_;
  }
  T await_resume() { return std::move(*handle_.promise().value); }

 private:
  explicit Task(std::coroutine_handle<promise_type> h) : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

namespace internal {
// A coroutine nobody awaits: it runs at once and frees itself at its end.
struct DetachedCoroutine {
  struct promise_type {
    DetachedCoroutine get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};
}  // namespace internal

// Starts `task` on this thread (it runs until its first suspension);
// `done(T)` is called with its result on whichever thread finishes it.
template <typename T, typename Done>
void Spawn(Task<T> task, Done done) {
  [](Task<T> t, Done d) -> internal::DetachedCoroutine { d(co_await std::move(t)); }(
                            std::move(task), std::move(done));
}

// Runs `task` to completion, blocking this thread until it has.
template <typename T>
T BlockOn(Task<T> task) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<T> out;
  Spawn(std::move(task), [&](T v) {
    std::lock_guard<std::mutex> lock(mu);
    out.emplace(std::move(v));
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return out.has_value(); });
  return std::move(*out);
}

// `co_await Suspend(executor, start)`: suspends, calls `start(resume)`, and
// continues on `executor` once `resume()` has been called (exactly once, from
// any thread, possibly inside `start`) and `start` has returned: whatever
// `start` registers and touches stays valid until it returns, and the
// coroutine's frame lives until it has. `resume` must not be called twice.
template <typename Start>
class Suspend {
 public:
  Suspend(Executor* executor, Start start) : executor_(executor), start_(std::move(start)) {}
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    // The second of (`resume` called, `start` returned) posts the
    // continuation; nothing of this awaiter (in the frame) is touched after.
    Start start = std::move(start_);
    auto arrivals = std::make_shared<std::atomic<int>>(0);
    auto arrive = [arrivals, executor = executor_, h] {
      if (arrivals->fetch_add(1) == 1) executor->Post([h] { h.resume(); });
    };
    start(arrive);
    arrive();
  }
  void await_resume() const noexcept {}

 private:
  Executor* executor_;
  Start start_;
};

}  // namespace vc
