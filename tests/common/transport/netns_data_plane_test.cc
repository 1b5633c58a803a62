// The data plane over a kernel-shaped link: deploy/scripts/netns_topology.sh
// builds the store/verifier/drafter namespaces with tc on the store's side,
// a vc-dataplane-probe serves in the store namespace and another fetches
// from the drafter namespace over the slow link. The transfer cannot beat the
// shaped rate (a lower bound on time only). Skips unless run as root with ip
// and tc available.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/transport/subprocess.h"

namespace vc::transport {
namespace {

using testing::RunCommand;
using testing::Subprocess;

const std::string kScript = VC_NETNS_SCRIPT;
const std::string kProbe = VC_DATAPLANE_PROBE;

bool Executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

std::string FindTool(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (Executable(path)) return path;
  }
  return "";
}

// "key=value" from a probe's output line.
double Field(const std::string& output, const std::string& key) {
  const size_t at = output.find(key + "=");
  if (at == std::string::npos) return -1;
  const size_t begin = at + key.size() + 1;
  const size_t end = output.find_first_of(" \n", begin);
  double v = -1;
  if (!absl::SimpleAtod(output.substr(begin, end - begin), &v)) return -1;
  return v;
}

class NetnsDataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces and tc)";
    if (FindTool("ip").empty() || FindTool("tc").empty()) {
      GTEST_SKIP() << "needs iproute2's ip and tc";
    }
    prefix_ = absl::StrCat("vct", ::getpid());
    auto [rc, out] = RunCommand({kScript, "up", "--prefix", prefix_, "--net", "10.214",
                                 "--slow-rate", "80mbit", "--fast-rate", "2gbit"});
    up_ = true;  // tear down whatever part was built
    ASSERT_EQ(rc, 0) << out;
  }
  void TearDown() override {
    if (!up_) return;
    auto [rc, out] = RunCommand({kScript, "down", "--prefix", prefix_});
    EXPECT_EQ(rc, 0) << out;
    auto [lrc, list] = RunCommand({FindTool("ip"), "netns", "list"});
    EXPECT_EQ(list.find(prefix_), std::string::npos) << "namespaces left behind:\n" << list;
  }

  std::vector<std::string> InNamespace(const std::string& role, std::vector<std::string> cmd) {
    std::vector<std::string> argv = {kScript, "exec", role, "--prefix", prefix_, "--"};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return argv;
  }

  std::string prefix_;
  bool up_ = false;
};

TEST_F(NetnsDataPlaneTest, SlowLinkTransferIsBoundedByTheShapedRate) {
  constexpr int64_t kBytes = 4'000'000;
  constexpr double kSlowBytesPerSecond = 80e6 / 8;  // 80mbit
  constexpr int64_t kBurst = 65536;                 // the script's default tbf bucket
  // Unpaced data plane: only tc limits the rate.
  Subprocess server(
      InNamespace("store", {kProbe, "serve", "--kind", "tcp", "--listen", "0.0.0.0:7401", "--bytes",
                            std::to_string(kBytes), "--count", "1", "--seconds", "120"}));
  ASSERT_GT(server.pid(), 0);
  ASSERT_TRUE(server.WaitForLine("listening on", 30)) << server.output();

  auto [rc, out] = RunCommand(InNamespace("drafter", {kProbe, "fetch", "--kind", "tcp", "--server",
                                                      "10.214.2.1:7401", "--link", "slow"}));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(Field(out, "bytes"), kBytes) << out;
  const double seconds = Field(out, "seconds");
  EXPECT_GE(seconds, (kBytes - kBurst) / kSlowBytesPerSecond) << out;

  // The verifier reaches the store only over the fast link.
  auto [frc, fout] =
      RunCommand(InNamespace("verifier", {kProbe, "fetch", "--kind", "tcp", "--server",
                                          "10.214.1.1:7401", "--link", "fast"}));
  EXPECT_EQ(frc, 0) << fout;

  server.Signal(SIGTERM);
  EXPECT_EQ(server.Finish(30), 0) << server.output();
  EXPECT_NE(server.output().find("link=slow bytes="), std::string::npos) << server.output();
}

TEST_F(NetnsDataPlaneTest, UpIsIdempotentAndStatusShowsTheShaping) {
  auto [rc, out] = RunCommand({kScript, "up", "--prefix", prefix_, "--net", "10.214", "--slow-rate",
                               "80mbit", "--fast-rate", "2gbit"});
  ASSERT_EQ(rc, 0) << out;
  auto [src, status] = RunCommand({kScript, "status", "--prefix", prefix_});
  ASSERT_EQ(src, 0) << status;
  EXPECT_NE(status.find("tbf"), std::string::npos) << status;
  EXPECT_NE(status.find("80Mbit"), std::string::npos) << status;
  EXPECT_NE(status.find("10.214.2.2"), std::string::npos) << status;
}

}  // namespace
}  // namespace vc::transport
