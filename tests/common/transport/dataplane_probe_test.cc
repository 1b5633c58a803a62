// vc-dataplane-probe as a process: its CLI contract (help, exit codes), a
// checked fetch from a serving probe, and a server killed with SIGKILL in
// the middle of a fetch failing that fetch with Unavailable (not a hang)
// over both backends.
#include <signal.h>

#include <string>
#include <thread>

#include "common/transport/data_plane.h"
#include "gtest/gtest.h"
#include "tests/common/transport/subprocess.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport {
namespace {

using testing::HasCode;
using testing::In;
using testing::RunCommand;
using testing::Subprocess;

const std::string kProbe = VC_DATAPLANE_PROBE;

// The address from the probe's "listening on HOST:PORT kind=..." line.
std::string ListenAddress(const std::string& output) {
  const std::string tag = "listening on ";
  const size_t at = output.find(tag);
  if (at == std::string::npos) return "";
  const size_t begin = at + tag.size();
  return output.substr(begin, output.find(' ', begin) - begin);
}

TEST(DataplaneProbeCliTest, HelpListsEveryFlag) {
  auto [rc, out] = RunCommand({kProbe, "serve", "--help"});
  EXPECT_EQ(rc, 0);
  for (const char* flag : {"--kind", "--listen", "--bytes", "--count", "--fast-bytes-per-second",
                           "--slow-bytes-per-second", "--fast-latency-ms", "--slow-latency-ms",
                           "--slot-seconds", "--seconds"}) {
    EXPECT_NE(out.find(flag), std::string::npos) << flag << "\n" << out;
  }
  std::tie(rc, out) = RunCommand({kProbe, "fetch", "--help"});
  EXPECT_EQ(rc, 0);
  for (const char* flag : {"--kind", "--server", "--count", "--link", "--repeat", "--timeout-ms"}) {
    EXPECT_NE(out.find(flag), std::string::npos) << flag << "\n" << out;
  }
  std::tie(rc, out) = RunCommand({kProbe, "--help"});
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("serve"), std::string::npos);
}

TEST(DataplaneProbeCliTest, BadInputExitsTwo) {
  EXPECT_EQ(RunCommand({kProbe}).first, 2);
  EXPECT_EQ(RunCommand({kProbe, "teleport"}).first, 2);
  EXPECT_EQ(RunCommand({kProbe, "serve", "--no-such-flag"}).first, 2);
  EXPECT_EQ(RunCommand({kProbe, "serve", "--kind", "pigeon", "--listen", "127.0.0.1:0"}).first, 2);
  EXPECT_EQ(RunCommand({kProbe, "fetch"}).first, 2);  // --server is required
  EXPECT_EQ(RunCommand({kProbe, "fetch", "--server", "127.0.0.1:1", "--link", "medium"}).first, 2);
}

class DataplaneProbeProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "ucx") {
      const std::string reason = testing::UcxUnavailableReason();
      if (!reason.empty())
        GTEST_SKIP() << "UCX cannot create a context on this machine: " << reason;
    }
  }
};

TEST_P(DataplaneProbeProcessTest, FetchChecksEveryByte) {
  Subprocess server({kProbe, "serve", "--kind", GetParam(), "--listen", "127.0.0.1:0", "--bytes",
                     "300000", "--count", "3", "--seconds", "60"});
  ASSERT_TRUE(server.WaitForLine("listening on", 30)) << server.output();
  auto [rc, out] = RunCommand({kProbe, "fetch", "--kind", GetParam(), "--server",
                               ListenAddress(server.output()), "--count", "3", "--repeat", "2"});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("bytes=1800000 "), std::string::npos) << out;
  // A blob the server does not have.
  std::tie(rc, out) = RunCommand({kProbe, "fetch", "--kind", GetParam(), "--server",
                                  ListenAddress(server.output()), "--count", "4"});
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Finish(30), 0) << server.output();
  EXPECT_NE(server.output().find("link=fast bytes="), std::string::npos) << server.output();
}

TEST_P(DataplaneProbeProcessTest, KilledServerFailsTheFetchWithUnavailable) {
  // 32 MB over a 4 MB/s paced link: the fetch is still running when the
  // server dies.
  Subprocess server({kProbe, "serve", "--kind", GetParam(), "--listen", "127.0.0.1:0", "--bytes",
                     "32000000", "--count", "1", "--slow-bytes-per-second", "4000000", "--seconds",
                     "120"});
  ASSERT_TRUE(server.WaitForLine("listening on", 30)) << server.output();
  DataPlaneClientOptions o;
  o.kind = GetParam();
  o.server_address = ListenAddress(server.output());
  o.link = LinkClass::kSlow;
  auto client = DataPlaneClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::vector<std::string>> result;
  std::thread fetcher([&] { result = (*client)->Fetch({"blob-0"}, In(120)); });
  // Wait until bytes are arriving, then kill the server.
  for (int i = 0; i < 3000 && (*client)->stats().transport_bytes == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server.Signal(SIGKILL);
  fetcher.join();
  EXPECT_TRUE(HasCode(result, absl::StatusCode::kUnavailable));
}

INSTANTIATE_TEST_SUITE_P(Kinds, DataplaneProbeProcessTest, ::testing::Values("tcp", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace vc::transport
