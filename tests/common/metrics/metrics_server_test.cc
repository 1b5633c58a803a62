#include "common/metrics/metrics_server.h"

#include <chrono>
#include <memory>
#include <string>

#include "common/http/httplib.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/status_matchers.h"

namespace vc::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::vc::testing::StatusIs;

constexpr char kHost[] = "127.0.0.1";

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = registry_.AddCounter("vc_test_requests_total", "Test requests.", {"path"});
    ASSERT_TRUE(c.ok());
    (*c)->Labels({"/x"}).Inc(3);
    ASSERT_TRUE(RegisterBuildInfo(registry_, "9.9.9").ok());
  }
  Registry registry_;
};

TEST_F(MetricsServerTest, ServesMetricsOnPickedPort) {
  auto server = MetricsServer::Start(&registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  httplib::Client cli(kHost, port);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(5);
  auto res = cli.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->get_header_value("Content-Type"), StartsWith("text/plain; version=0.0.4"));
  EXPECT_EQ(res->body, registry_.Expose());
  EXPECT_THAT(res->body, HasSubstr("vc_test_requests_total{path=\"/x\"} 3\n"));
  EXPECT_THAT(res->body, HasSubstr("vericache_build_info{version=\"9.9.9\"} 1\n"));

  // Updates show up on the next scrape.
  (*registry_.AddCounter("vc_test_requests_total", "Test requests.", {"path"}))->Labels({"/x"}).Inc();
  res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("vc_test_requests_total{path=\"/x\"} 4\n"));

  for (const char* path : {"/", "/metricsx", "/other", "/metrics/extra"}) {
    auto r404 = cli.Get(path);
    ASSERT_TRUE(r404) << path;
    EXPECT_EQ(r404->status, 404) << path;
  }
}

// cpp-httplib notices Stop between requests, so an idle keep-alive client
// holds Stop for at most keep_alive_timeout_s (default 1 s).
TEST_F(MetricsServerTest, StopIsPromptWithOpenKeepAliveConnection) {
  auto server = MetricsServer::Start(&registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client cli(kHost, (*server)->port());
  cli.set_keep_alive(true);
  auto res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);

  const auto t0 = std::chrono::steady_clock::now();
  (*server)->Stop();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  (*server)->Stop();  // idempotent

  httplib::Client after(kHost, (*server)->port());
  after.set_connection_timeout(1);
  EXPECT_FALSE(after.Get("/metrics"));
}

TEST_F(MetricsServerTest, DestructorStopsAndRestartsAreClean) {
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto server = MetricsServer::Start(&registry_);
      ASSERT_TRUE(server.ok()) << server.status();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  }
}

TEST_F(MetricsServerTest, FixedPortAndBindErrors) {
  auto first = MetricsServer::Start(&registry_);
  ASSERT_TRUE(first.ok());
  MetricsServerOptions opts;
  opts.port = (*first)->port();
  EXPECT_THAT(MetricsServer::Start(&registry_, opts), StatusIs(absl::StatusCode::kUnavailable));

  (*first)->Stop();
  first->reset();
  // The freed port can be bound explicitly.
  auto second = MetricsServer::Start(&registry_, opts);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->port(), opts.port);
  httplib::Client cli(kHost, opts.port);
  auto res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(MetricsServerTest, RejectsBadOptions) {
  EXPECT_THAT(MetricsServer::Start(nullptr), StatusIs(absl::StatusCode::kInvalidArgument, {"registry"}));
  MetricsServerOptions opts;
  opts.port = 70000;
  EXPECT_THAT(MetricsServer::Start(&registry_, opts), StatusIs(absl::StatusCode::kInvalidArgument, {"port"}));
  opts = {};
  opts.num_threads = 0;
  EXPECT_THAT(MetricsServer::Start(&registry_, opts),
              StatusIs(absl::StatusCode::kInvalidArgument, {"num_threads"}));
  opts = {};
  opts.keep_alive_timeout_s = -1;
  EXPECT_THAT(MetricsServer::Start(&registry_, opts),
              StatusIs(absl::StatusCode::kInvalidArgument, {"keep_alive_timeout_s"}));
}

}  // namespace
}  // namespace vc::metrics
