#include "services/openai/internal/connection_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace vc::openai::internal {
namespace {

// A loopback TCP connection: the accepted (server) side and the client side.
struct Pair {
  int server = -1, client = -1;
  int server_port = 0, client_port = 0;
  ~Pair() {
    if (server >= 0) close(server);
    if (client >= 0) close(client);
  }
};

void Connect(Pair* p) {
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(lfd, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  p->server_port = ntohs(a.sin_port);
  p->client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(p->client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  p->server = accept(lfd, nullptr, nullptr);
  ASSERT_GE(p->server, 0);
  close(lfd);
  sockaddr_in c{};
  len = sizeof c;
  ASSERT_EQ(getsockname(p->client, reinterpret_cast<sockaddr*>(&c), &len), 0);
  p->client_port = ntohs(c.sin_port);
}

TEST(ConnectionWatchTest, FindsTheServerSideByAddresses) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Connect(&p));
  EXPECT_EQ(FindConnectionFd("127.0.0.1", p.server_port, "127.0.0.1", p.client_port), p.server);
  EXPECT_EQ(FindConnectionFd("127.0.0.1", p.client_port, "127.0.0.1", p.server_port), p.client);
  EXPECT_EQ(FindConnectionFd("127.0.0.1", p.server_port, "127.0.0.2", p.client_port), -1);
}

TEST(ConnectionWatchTest, PeerClosedOnlyAfterTheClientLeaves) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(Connect(&p));
  EXPECT_FALSE(PeerClosed(p.server));
  // Bytes waiting (a pipelined request) are not a hang-up.
  ASSERT_EQ(write(p.client, "GET", 3), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(PeerClosed(p.server));
  close(p.client);
  p.client = -1;
  bool closed = false;
  for (int i = 0; i < 500 && !closed; ++i) {
    closed = PeerClosed(p.server);
    if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(closed);
}

TEST(ConnectionWatchTest, WatcherCallsBackOnceAndUnwatchStopsIt) {
  Pair p, q;
  ASSERT_NO_FATAL_FAILURE(Connect(&p));
  ASSERT_NO_FATAL_FAILURE(Connect(&q));
  ConnectionWatcher watcher(5);
  std::atomic<int> p_calls{0}, q_calls{0};
  watcher.Watch(p.server, [&] { p_calls++; });
  const int64_t hq = watcher.Watch(q.server, [&] { q_calls++; });
  watcher.Unwatch(hq);
  close(p.client);
  p.client = -1;
  close(q.client);
  q.client = -1;
  for (int i = 0; i < 1000 && p_calls.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(p_calls.load(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(p_calls.load(), 1);
  EXPECT_EQ(q_calls.load(), 0);
}

}  // namespace
}  // namespace vc::openai::internal
