// Issue 14: the slow link's ring books what crosses it, end to end on the
// four real daemons (LocalCluster): each round's KV refresh and each
// drafter Open's fetch of the compressed variant. With a paced slow link and
// several concurrent vericache requests with refresh on, every output equals
// full-KV decoding, the coordinator's scraped
// `vericache_scheduler_link_occupancy_ratio{link="slow"}` shows the booked
// traffic (> 0) and never exceeds 1, and ClusterStatus reports no slot of the
// slow ring booked beyond its length. With --no-kv-refresh no refresh is
// booked, but the Opens' variant fetches still are: the gauge rises from
// them alone, within the same bounds.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/decode/full_decode.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"
#include "services/local/local_cluster.h"
#include "tests/scratch_dir.h"
#include "tests/services/cluster/cluster_test_generate.h"
#include "tests/services/cluster/cluster_test_metrics.h"
#include "tests/services/cluster/cluster_test_text.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc {
namespace {

namespace pb = ::vericache::v1;

constexpr double kSlotMs = 5;
// stories260K holds 1280 bytes of KV per token: a round of 4 drafts
// refreshes up to 5 tokens, 6.4 kB, 43 ms (about 9 slots) at 150 kB/s:
// six requests contend for the link.
constexpr double kSlowBytesPerSecond = 150e3;
constexpr int kRequests = 6;

// The value of `vericache_scheduler_link_occupancy_ratio{link="slow"}` on a
// /metrics page, or -1 if the page has no such sample.
double SlowOccupancy(const std::string& page) {
  const std::string name = "\nvericache_scheduler_link_occupancy_ratio{link=\"slow\"} ";
  const size_t at = page.find(name);
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + name.size()));
}

class SlowRingClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_path_)) {
      GTEST_SKIP() << "test model not found: " << model_path_;
    }
    model_ = std::move(Model::Load(model_path_)).value();
    EngineOptions eo;
    eo.backend.threads = 1;
    engine_ = std::move(Engine::Create(*model_, eo)).value();
  }

  void TearDown() override {
    if (cluster_) cluster_->Stop();
  }

  void StartCluster(bool kv_refresh) {
    local::LocalClusterOptions o;
    o.bin_dir = VC_DAEMON_DIR;
    o.model = model_path_;
    o.chunk_tokens = 32;
    o.ingest_variants = "int8";
    o.slow_link_bytes_per_second = kSlowBytesPerSecond;
    o.slot_ms = kSlotMs;
    if (!kv_refresh) o.extra_flags["vc-coordinator"] = {"--no-kv-refresh"};
    const std::string& logs = logs_.path();
    o.log_dir = logs;
    auto c = local::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status() << " (daemon logs in " << logs << ")";
    cluster_ = std::move(*c);
    stub_ = pb::Coordinator::NewStub(rpc::MakeChannel(cluster_->client(), 64 << 20));
  }

  // What one run of kRequests concurrent requests showed.
  struct Run {
    std::vector<int64_t> refresh_bytes;  // per request
    double max_scraped = -1;             // largest slow-link gauge seen
    int scrapes = 0;
    pb::ClusterStatusResponse status;
  };

  // Runs kRequests concurrent vericache requests (int8 drafter, x = 4, 24
  // new tokens over 100-token prompts), checks each against full-KV
  // decoding, and scrapes the coordinator's /metrics while they run.
  Run RunRequests() {
    Run run;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<int32_t>> expected;
    for (int i = 0; i < kRequests; ++i) {
      prompts.push_back(clustertest::ModelText(*engine_, 100, 200 + i));
      DecodeOptions d;
      d.max_new_tokens = 24;
      d.ignore_eos = true;
      expected.push_back(std::move(DecodeFull(*engine_, prompts.back(), d)).value().tokens);
    }
    const std::string metrics = cluster_->Find("coordinator")->metrics;
    std::atomic<bool> done{false};
    std::thread scraper([&] {
      while (!done) {
        const double v = SlowOccupancy(clustertest::MetricsPage(metrics));
        run.max_scraped = std::max(run.max_scraped, v);
        ++run.scrapes;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    std::vector<absl::StatusOr<pb::GenerateTotals>> out(kRequests, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    threads.reserve(kRequests);
    for (int i = 0; i < kRequests; ++i) {
      threads.emplace_back([&, i] {
        pb::GenerateRequest req;
        for (int32_t t : prompts[i]) req.add_prompt_ids(t);
        req.set_mode(pb::MODE_VERICACHE);
        req.set_max_new_tokens(24);
        req.set_ignore_eos(true);
        req.set_compressor("int8");
        req.set_draft_len(4);
        out[i] = clustertest::GenerateTotals(stub_.get(), req);
      });
    }
    for (auto& th : threads) th.join();
    // One more scrape after the last Commit, then stop.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    done = true;
    scraper.join();
    for (int i = 0; i < kRequests; ++i) {
      EXPECT_TRUE(out[i].ok()) << "request " << i << ": " << out[i].status();
      if (!out[i].ok()) continue;
      EXPECT_EQ(std::vector<int32_t>(out[i]->tokens().begin(), out[i]->tokens().end()), expected[i])
          << "request " << i;
      run.refresh_bytes.push_back(out[i]->refresh_bytes());
    }
    pb::ClusterStatusRequest req;
    auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
    const grpc::Status st = stub_->ClusterStatus(ctx.get(), req, &run.status);
    EXPECT_TRUE(st.ok()) << st.error_message();
    const double peak = run.status.link_peak_slot_seconds_size() > 1
                            ? run.status.link_peak_slot_seconds(1) / (kSlotMs / 1000)
                            : -1;
    std::fprintf(stderr, "slow link: %d scrapes, largest occupancy %.3f, peak slot %.3f\n",
                 run.scrapes, run.max_scraped, peak);
    return run;
  }

  // The slow ring held `what`: the scraped gauge rose above 0 and never
  // above 1, and every passed slot was booked, never beyond its length.
  static void ExpectSlowRingBookedWithinItsSlots(const Run& run, const char* what) {
    EXPECT_GT(run.scrapes, 0);
    EXPECT_GT(run.max_scraped, 0.0) << "the slow link's gauge shows " << what;
    EXPECT_LE(run.max_scraped, 1.0 + 1e-9) << "never booked beyond one slot";
    ASSERT_EQ(run.status.link_peak_slot_seconds_size(), 2);
    ASSERT_EQ(run.status.link_overrun_seconds_size(), 2);
    EXPECT_GT(run.status.link_peak_slot_seconds(1), 0.0);
    EXPECT_LE(run.status.link_peak_slot_seconds(1), kSlotMs / 1000 * (1 + 1e-9));
    EXPECT_EQ(run.status.link_overrun_seconds(1), 0.0);
  }

  const std::string model_path_ = clustertest::StoriesModelPath();
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  test_support::ScratchDir logs_{"slow-ring-cluster-logs-"};  // outlives the cluster
  std::unique_ptr<local::LocalCluster> cluster_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

TEST_F(SlowRingClusterTest, RefreshIsBookedOnThePacedSlowRingWithinItsCapacity) {
  StartCluster(/*kv_refresh=*/true);
  const Run run = RunRequests();
  for (int64_t b : run.refresh_bytes) EXPECT_GT(b, 0) << "refresh rows were sent";
  ExpectSlowRingBookedWithinItsSlots(run, "the booked refresh");
}

TEST_F(SlowRingClusterTest, WithoutKvRefreshTheSlowRingHoldsTheOpensFetchesAlone) {
  // Six distinct 96-token prefixes (three stored chunks each): each Open
  // fetches an INT8 variant, booked at its estimate (INT8 of 16-bit rows:
  // half of 96 x 1280 bytes, 0.4 s at 150 kB/s) while no drafter has
  // reported its size yet.
  StartCluster(/*kv_refresh=*/false);
  const Run run = RunRequests();
  for (int64_t b : run.refresh_bytes) EXPECT_EQ(b, 0) << "no refresh rows were sent";
  ExpectSlowRingBookedWithinItsSlots(run, "the Opens' fetches");
}

}  // namespace
}  // namespace vc
