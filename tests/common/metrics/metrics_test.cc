#include "common/metrics/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/status_matchers.h"

namespace vc::metrics {
namespace {

using ::vc::testing::StatusIs;

// Builds the small registry whose exposition the golden text below describes.
void FillSmallRegistry(Registry& r) {
  auto requests = r.AddCounter("vc_requests_total", "Requests served.", {"method", "code"});
  ASSERT_TRUE(requests.ok()) << requests.status();
  (*requests)->Labels({"post", "500"}).Inc(1.5);
  (*requests)->Labels({"get", "200"}).Inc();
  (*requests)->Labels({"get", "200"}).Inc(2);

  auto depth = r.AddGauge("vc_queue_depth", "Queue depth.");
  ASSERT_TRUE(depth.ok()) << depth.status();
  (*depth)->Get().Set(7);
  (*depth)->Get().Dec(2);

  auto latency = r.AddHistogram("vc_latency_seconds", "Latency.", {}, {0.1, 1, 10});
  ASSERT_TRUE(latency.ok()) << latency.status();
  for (double v : {0.0625, 0.5, 0.5, 20.0}) (*latency)->Get().Observe(v);
}

// Written by hand from the text format 0.0.4 description: families sorted by
// name, HELP then TYPE, histogram buckets cumulative with le last, +Inf bucket
// equal to _count.
constexpr char kSmallGolden[] =
    "# HELP vc_latency_seconds Latency.\n"
    "# TYPE vc_latency_seconds histogram\n"
    "vc_latency_seconds_bucket{le=\"0.1\"} 1\n"
    "vc_latency_seconds_bucket{le=\"1\"} 3\n"
    "vc_latency_seconds_bucket{le=\"10\"} 3\n"
    "vc_latency_seconds_bucket{le=\"+Inf\"} 4\n"
    "vc_latency_seconds_sum 21.0625\n"
    "vc_latency_seconds_count 4\n"
    "# HELP vc_queue_depth Queue depth.\n"
    "# TYPE vc_queue_depth gauge\n"
    "vc_queue_depth 5\n"
    "# HELP vc_requests_total Requests served.\n"
    "# TYPE vc_requests_total counter\n"
    "vc_requests_total{method=\"get\",code=\"200\"} 3\n"
    "vc_requests_total{method=\"post\",code=\"500\"} 1.5\n";

TEST(MetricsTest, ExpositionMatchesGolden) {
  Registry r;
  FillSmallRegistry(r);
  EXPECT_EQ(r.Expose(), kSmallGolden);
}

TEST(MetricsTest, EmptyRegistryAndLabelledFamilyWithoutChildrenExposeNothing) {
  Registry r;
  EXPECT_EQ(r.Expose(), "");
  ASSERT_TRUE(r.AddCounter("c_total", "C.", {"a"}).ok());
  EXPECT_EQ(r.Expose(), "");
}

TEST(MetricsTest, EscapesHelpAndLabelValues) {
  Registry r;
  auto g = r.AddGauge("g", "back\\slash and\nnewline \"quotes\" stay", {"v"});
  ASSERT_TRUE(g.ok());
  (*g)->Labels({"say \"hi\"\\\nbye"}).Set(1);
  EXPECT_EQ(r.Expose(),
            "# HELP g back\\\\slash and\\nnewline \"quotes\" stay\n"
            "# TYPE g gauge\n"
            "g{v=\"say \\\"hi\\\"\\\\\\nbye\"} 1\n");
}

TEST(MetricsTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-2.5), "-2.5");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(std::strtod(FormatValue(1.0 / 3).c_str(), nullptr), 1.0 / 3);

  Registry r;
  auto g = r.AddGauge("g", "G.", {"k"});
  ASSERT_TRUE(g.ok());
  (*g)->Labels({"a"}).Set(std::numeric_limits<double>::infinity());
  (*g)->Labels({"b"}).Set(-std::numeric_limits<double>::infinity());
  (*g)->Labels({"c"}).Set(std::nan(""));
  EXPECT_EQ(r.Expose(),
            "# HELP g G.\n# TYPE g gauge\n"
            "g{k=\"a\"} +Inf\ng{k=\"b\"} -Inf\ng{k=\"c\"} NaN\n");
}

TEST(MetricsTest, HistogramBucketMath) {
  Registry r;
  auto h = r.AddHistogram("h_seconds", "H.", {"path"}, {1, 2, 5});
  ASSERT_TRUE(h.ok());
  Histogram& a = (*h)->Labels({"/a"});
  // Boundaries belong to their own bucket (le is "less or equal").
  for (double v : {-3.0, 1.0, 1.5, 2.0, 5.0, 5.5, 100.0}) a.Observe(v);
  const Histogram::Snapshot s = a.Collect();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 4, 5, 7}));
  EXPECT_EQ(s.count, 7u);
  EXPECT_DOUBLE_EQ(s.sum, -3 + 1 + 1.5 + 2 + 5 + 5.5 + 100);
  EXPECT_EQ(r.Expose(),
            "# HELP h_seconds H.\n"
            "# TYPE h_seconds histogram\n"
            "h_seconds_bucket{path=\"/a\",le=\"1\"} 2\n"
            "h_seconds_bucket{path=\"/a\",le=\"2\"} 4\n"
            "h_seconds_bucket{path=\"/a\",le=\"5\"} 5\n"
            "h_seconds_bucket{path=\"/a\",le=\"+Inf\"} 7\n"
            "h_seconds_sum{path=\"/a\"} 112\n"
            "h_seconds_count{path=\"/a\"} 7\n");

  // NaN is counted in +Inf only.
  Histogram& b = (*h)->Labels({"/b"});
  b.Observe(std::nan(""));
  EXPECT_EQ(b.Collect().cumulative, (std::vector<uint64_t>{0, 0, 0, 1}));
  // An empty child has all-zero buckets.
  EXPECT_EQ((*h)->Labels({"/c"}).Collect().cumulative, (std::vector<uint64_t>{0, 0, 0, 0}));
}

TEST(MetricsTest, CounterIgnoresNegativeAndNaN) {
  Registry r;
  auto c = r.AddCounter("c_total", "C.");
  ASSERT_TRUE(c.ok());
  Counter& x = (*c)->Get();
  x.Inc(2);
  x.Inc(-1);
  x.Inc(std::nan(""));
  x.Inc(0);
  EXPECT_EQ(x.Value(), 2);
  EXPECT_EQ(x.dropped_increments(), 2u);
}

TEST(MetricsTest, GaugeSetIncDec) {
  Registry r;
  auto g = r.AddGauge("g", "G.");
  ASSERT_TRUE(g.ok());
  Gauge& x = (*g)->Get();
  x.Set(10);
  x.Inc();
  x.Inc(0.5);
  x.Dec(3);
  EXPECT_EQ(x.Value(), 8.5);
  x.Dec(20);
  EXPECT_EQ(x.Value(), -11.5);
}

TEST(MetricsTest, ValidatesNames) {
  EXPECT_TRUE(IsValidMetricName("a"));
  EXPECT_TRUE(IsValidMetricName("_a:b_c9"));
  EXPECT_TRUE(IsValidMetricName(":x"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9a"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName("a b"));
  EXPECT_FALSE(IsValidMetricName("a.b"));
  EXPECT_TRUE(IsValidLabelName("a"));
  EXPECT_TRUE(IsValidLabelName("_a9"));
  EXPECT_FALSE(IsValidLabelName(""));
  EXPECT_FALSE(IsValidLabelName("__a"));
  EXPECT_FALSE(IsValidLabelName("__"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("1a"));

  Registry r;
  EXPECT_THAT(r.AddCounter("bad-name", "x"), StatusIs(absl::StatusCode::kInvalidArgument, {"bad-name"}));
  EXPECT_THAT(r.AddGauge("g", "x", {"__reserved"}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"__reserved"}));
  EXPECT_THAT(r.AddGauge("g", "x", {"a:b"}), StatusIs(absl::StatusCode::kInvalidArgument, {"a:b"}));
  EXPECT_THAT(r.AddGauge("g", "x", {"a", "a"}), StatusIs(absl::StatusCode::kInvalidArgument, {"duplicate"}));
  EXPECT_THAT(r.AddHistogram("h", "x", {"le"}, {1}), StatusIs(absl::StatusCode::kInvalidArgument, {"le"}));
  EXPECT_THAT(r.AddHistogram("h", "x", {}, {}), StatusIs(absl::StatusCode::kInvalidArgument, {"no buckets"}));
  EXPECT_THAT(r.AddHistogram("h", "x", {}, {1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"strictly increasing"}));
  EXPECT_THAT(r.AddHistogram("h", "x", {}, {2, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"strictly increasing"}));
  EXPECT_THAT(r.AddHistogram("h", "x", {}, {1, std::numeric_limits<double>::infinity()}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"finite"}));
  // "le" is only reserved for histograms.
  EXPECT_TRUE(r.AddCounter("c_total", "x", {"le"}).ok());
  // Nothing invalid was registered.
  EXPECT_EQ(r.Expose(), "");
}

TEST(MetricsTest, WrongNumberOfLabelValues) {
  Registry r;
  auto c = r.AddCounter("c_total", "C.", {"a", "b"});
  ASSERT_TRUE(c.ok());
  EXPECT_THAT((*c)->TryLabels({"x"}), StatusIs(absl::StatusCode::kInvalidArgument, {"c_total"}));
  EXPECT_THAT((*c)->TryLabels({"x", "y", "z"}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE((*c)->TryLabels({"x", "y"}).ok());
}

TEST(MetricsTest, DuplicateRegistration) {
  Registry r;
  auto c1 = r.AddCounter("c_total", "C.", {"a"});
  auto c2 = r.AddCounter("c_total", "C.", {"a"});
  ASSERT_TRUE(c1.ok());
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(*c1, *c2);
  (*c1)->Labels({"x"}).Inc();
  EXPECT_EQ(&(*c1)->Labels({"x"}), &(*c2)->Labels({"x"}));

  EXPECT_THAT(r.AddGauge("c_total", "C.", {"a"}), StatusIs(absl::StatusCode::kAlreadyExists, {"c_total"}));
  EXPECT_THAT(r.AddCounter("c_total", "C.", {"b"}), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(r.AddCounter("c_total", "C.", {}), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(r.AddCounter("c_total", "Other help.", {"a"}), StatusIs(absl::StatusCode::kAlreadyExists));

  auto h1 = r.AddHistogram("h", "H.", {}, {1, 2});
  ASSERT_TRUE(h1.ok());
  auto h2 = r.AddHistogram("h", "H.", {}, {1, 2});
  ASSERT_TRUE(h2.ok());
  EXPECT_EQ(*h1, *h2);
  EXPECT_THAT(r.AddHistogram("h", "H.", {}, {1, 3}), StatusIs(absl::StatusCode::kAlreadyExists));

  // Sample names may not clash across families.
  EXPECT_THAT(r.AddCounter("h_count", "x"), StatusIs(absl::StatusCode::kAlreadyExists, {"h_count"}));
  EXPECT_THAT(r.AddGauge("h_bucket", "x"), StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_TRUE(r.AddGauge("q_sum", "x").ok());
  EXPECT_THAT(r.AddHistogram("q", "x", {}, {1}), StatusIs(absl::StatusCode::kAlreadyExists, {"q_sum"}));
}

TEST(MetricsTest, LabelSetBoundUsesOverflowChild) {
  Registry r(RegistryOptions{.max_label_sets_per_family = 3});
  auto c = r.AddCounter("c_total", "C.", {"user", "op"});
  ASSERT_TRUE(c.ok());
  CounterFamily& f = **c;
  Counter& a = f.Labels({"a", "x"});
  f.Labels({"b", "x"}).Inc();
  f.Labels({"c", "x"}).Inc();
  Counter& d = f.Labels({"d", "x"});
  Counter& e = f.Labels({"e", "x"});
  EXPECT_EQ(&d, &e);  // both went to the overflow child
  EXPECT_NE(&d, &a);
  d.Inc();
  e.Inc();
  a.Inc(5);
  EXPECT_EQ(&f.Labels({"a", "x"}), &a);  // existing sets still resolve
  EXPECT_EQ(f.size(), 3u);
  EXPECT_EQ(f.overflow_count(), 2u);
  EXPECT_EQ(r.Expose(),
            "# HELP c_total C.\n# TYPE c_total counter\n"
            "c_total{user=\"__overflow__\",op=\"__overflow__\"} 2\n"
            "c_total{user=\"a\",op=\"x\"} 5\n"
            "c_total{user=\"b\",op=\"x\"} 1\n"
            "c_total{user=\"c\",op=\"x\"} 1\n");
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  Registry r;
  auto c = r.AddCounter("c_total", "C.", {"t"});
  auto g = r.AddGauge("g", "G.");
  auto h = r.AddHistogram("h", "H.", {}, {0.5});
  ASSERT_TRUE(c.ok() && g.ok() && h.ok());
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) EXPECT_FALSE(r.Expose().empty());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& shared = (*c)->Labels({"shared"});
      const std::string mine = t % 2 == 0 ? "t0" : "t1";
      for (int i = 0; i < kIters; ++i) {
        shared.Inc();
        (*c)->Labels({mine}).Inc();  // lookup path too
        (*g)->Get().Inc();
        (*g)->Get().Dec(0.5);
        (*h)->Get().Observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (auto& th : threads) th.join();
  done.store(true);
  scraper.join();
  const double total = static_cast<double>(kThreads) * kIters;
  EXPECT_EQ((*c)->Labels({"shared"}).Value(), total);
  EXPECT_EQ((*c)->Labels({"t0"}).Value(), total / 2);
  EXPECT_EQ((*c)->Labels({"t1"}).Value(), total / 2);
  EXPECT_EQ((*g)->Get().Value(), total / 2);
  const Histogram::Snapshot s = (*h)->Get().Collect();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{kThreads * kIters / 2, kThreads * kIters}));
  EXPECT_EQ(s.sum, total / 2 * 0.25 + total / 2 * 1.0);
}

TEST(MetricsTest, BuildInfo) {
  Registry r;
  ASSERT_TRUE(RegisterBuildInfo(r, "1.2.3").ok());
  ASSERT_TRUE(RegisterBuildInfo(r, "1.2.3").ok());  // idempotent
  EXPECT_EQ(r.Expose(),
            "# HELP vericache_build_info VeriCache build information.\n"
            "# TYPE vericache_build_info gauge\n"
            "vericache_build_info{version=\"1.2.3\"} 1\n");
}

// Runs promtool's own parser and linter over our output when it is installed
// (Debian package `prometheus`, not a required dependency; VC_PROMTOOL may
// name another promtool binary).
TEST(MetricsTest, PromtoolAcceptsExposition) {
  const char* env = std::getenv("VC_PROMTOOL");
  const std::string promtool = env != nullptr && *env != '\0' ? env : "/usr/bin/promtool";
  if (access(promtool.c_str(), X_OK) != 0) GTEST_SKIP() << promtool << " not installed";
  Registry r;
  FillSmallRegistry(r);
  ASSERT_TRUE(RegisterBuildInfo(r, "0.1.0").ok());
  auto esc = r.AddGauge("vc_escape_test", "Help with \\ and\nnewline.", {"v"});
  ASSERT_TRUE(esc.ok());
  (*esc)->Labels({"q\"b\\n\nx"}).Set(std::numeric_limits<double>::infinity());
  (*esc)->Labels({"nan"}).Set(std::nan(""));
  const std::string path = ::testing::TempDir() + "/vc_metrics_promtool.txt";
  {
    std::ofstream out(path);
    out << r.Expose();
  }
  const std::string cmd = promtool + " check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) output += buf;
  const int rc = pclose(p);
  std::remove(path.c_str());
  EXPECT_EQ(rc, 0) << output;
}

}  // namespace
}  // namespace vc::metrics
