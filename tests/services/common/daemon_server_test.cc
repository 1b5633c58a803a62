// The daemons' gRPC listener (vc::daemon::Server): a port already served by
// one daemon is refused to a second one. gRPC's default SO_REUSEPORT let
// both bind, and the kernel split connections between them: a store
// restarted on its port while another process held that port served only
// some of its clients (KvStoreDaemonTest's restart saw its calls answered
// by another test's store).
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "services/common/daemon.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc::daemon {
namespace {

ServerOptions Options(const std::string& listen) {
  ServerOptions o;
  o.name = "vc-test";
  o.version = "test";
  o.listen = listen;
  return o;
}

// gRPC builds no server without a service; every call of this one answers
// UNIMPLEMENTED, which is all a listening port needs.
class AnyService : public ::vericache::v1::KvStore::Service {};

TEST(DaemonServerTest, ASecondServerOnTheSamePortIsRefused) {
  AnyService first_service;
  metrics::Registry first_registry;
  absl::StatusOr<std::unique_ptr<Server>> first =
      Server::Start(Options("127.0.0.1:0"), {&first_service}, &first_registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  ASSERT_GT(port, 0);
  AnyService second_service;
  metrics::Registry second_registry;
  absl::StatusOr<std::unique_ptr<Server>> second =
      Server::Start(Options(absl::StrCat("127.0.0.1:", port)), {&second_service}, &second_registry);
  ASSERT_FALSE(second.ok()) << "a second server bound port " << port;
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), absl::StrCat(port))) << second.status();
}

// The port is free again once its server is gone (a restart on the same
// port, as `vericache local` does, still works).
TEST(DaemonServerTest, APortIsServedAgainAfterItsServerStops) {
  AnyService first_service;
  metrics::Registry first_registry;
  absl::StatusOr<std::unique_ptr<Server>> first =
      Server::Start(Options("127.0.0.1:0"), {&first_service}, &first_registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  first->reset();
  AnyService again_service;
  metrics::Registry again_registry;
  absl::StatusOr<std::unique_ptr<Server>> again =
      Server::Start(Options(absl::StrCat("127.0.0.1:", port)), {&again_service}, &again_registry);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->port(), port);
}

// Waiting for its signal, a daemon wakes every heap_trim_seconds to trim
// its heap and goes back to waiting: it neither returns nor misses the
// signal, and then drains as before.
TEST(DaemonServerTest, TrimmingTheHeapWhileWaitingStillDrainsOnASignal) {
  AnyService service;
  metrics::Registry registry;
  ServerOptions o = Options("127.0.0.1:0");
  o.heap_trim_seconds = 1;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(o, {&service}, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  std::atomic<bool> returned{false};
  std::atomic<bool> drained{false};
  std::atomic<bool> blocked{false};
  int rc = -1;
  std::thread waiter([&] {
    // The signal goes to this thread only (pthread_kill), which blocks it as
    // a daemon's threads do, so nothing else in the test sees it.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    blocked = true;
    rc = (*server)->WaitForSignalAndDrain([&] { drained = true; });
    returned = true;
  });
  while (!blocked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two trims at least
  EXPECT_FALSE(returned) << "returned without a signal";
  EXPECT_FALSE(drained);
  // Blocked in that thread: it is taken by sigtimedwait, as the daemon's is.
  // NOLINTNEXTLINE(bugprone-bad-signal-to-kill-thread)
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(drained);
}

// A crash prints the signal and the stack with function names before the
// process dies of it, so a daemon's log says where it died (a chaos run's
// coordinator log ended with a bare glibc assertion message).
[[noreturn]] __attribute__((noinline)) void CrashInANamedFunction() { std::abort(); }

TEST(DaemonCrashReporterDeathTest, AnAbortPrintsTheSignalAndTheStackByName) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        InstallCrashReporter("/proc/self/exe");
        CrashInANamedFunction();
      },
      "SIGABRT \\(signal 6\\) received.*CrashInANamedFunction");
}

}  // namespace
}  // namespace vc::daemon
