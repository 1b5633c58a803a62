// vc_dataplane_tls_bench: what mutual TLS costs the tcp data plane. One
// server and one client on loopback, unpaced; the client fetches
// --keys-per-fetch chunks of --chunk-bytes each, over and over, for
// --seconds, alternating plaintext and TLS runs (--runs of each) so a
// shared machine's load hits both alike. Prints each run and the medians
// (value bytes per second, and per CPU-second of the whole process, since
// client and server share it).
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/transport/data_plane.h"
#include "tests/common/transport/tls_test_certs.h"

namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct Result {
  double bytes_per_second = 0;
  double bytes_per_cpu_second = 0;
};

Result Run(const vc::transport::DataPlaneTlsOptions& server_tls,
           const vc::transport::DataPlaneTlsOptions& client_tls, int64_t chunk_bytes,
           int keys_per_fetch, double seconds) {
  auto blob = std::make_shared<std::string>(static_cast<size_t>(chunk_bytes), 'x');
  for (size_t i = 0; i < blob->size(); i += 4096) (*blob)[i] = static_cast<char>(i * 31);
  vc::transport::DataPlaneServerOptions so;
  so.tls = server_tls;
  auto server = vc::transport::DataPlaneServer::Create(
      so, [blob](const std::string&) -> absl::StatusOr<std::string> { return *blob; });
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  vc::transport::DataPlaneClientOptions co;
  co.server_address = (*server)->address();
  co.tls = client_tls;
  auto client = vc::transport::DataPlaneClient::Create(co);
  if (!client.ok()) std::exit(1);
  std::vector<std::string> keys;
  for (int i = 0; i < keys_per_fetch; ++i) {
    std::string key = std::to_string(i);
    key.insert(key.begin(), 'k');
    keys.push_back(std::move(key));
  }
  // One warm-up fetch: connects (and handshakes) outside the timing.
  if (!(*client)->Fetch(keys, Clock::now() + std::chrono::seconds(60)).ok()) std::exit(1);
  int64_t bytes = 0;
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
    auto values = (*client)->Fetch(keys, Clock::now() + std::chrono::seconds(60));
    if (!values.ok()) {
      std::fprintf(stderr, "fetch: %s\n", values.status().ToString().c_str());
      std::exit(1);
    }
    for (const auto& v : *values) bytes += static_cast<int64_t>(v.size());
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  return {bytes / wall, cpu > 0 ? bytes / cpu : 0};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t chunk_bytes = int64_t{4} << 20;
  int keys_per_fetch = 16;
  double seconds = 1.0;
  int runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--chunk-bytes") chunk_bytes = std::atoll(argv[i + 1]);
    else if (flag == "--keys-per-fetch") keys_per_fetch = std::atoi(argv[i + 1]);
    else if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (flag == "--runs") runs = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  char tmpl[] = "/tmp/vc_dp_tls_bench_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  vc::transport::testing::TestCa ca("vc-bench-ca");
  ca.WriteCa(dir + "/ca.crt");
  const auto server_tls = ca.Leaf(dir, "vc-kvstore", dir + "/ca.crt");
  const auto client_tls = ca.Leaf(dir, "vc-verifier", dir + "/ca.crt");

  std::vector<double> plain_bps, tls_bps, plain_cpu, tls_cpu;
  for (int r = 0; r < runs; ++r) {
    Result p = Run({}, {}, chunk_bytes, keys_per_fetch, seconds);
    Result t = Run(server_tls, client_tls, chunk_bytes, keys_per_fetch, seconds);
    std::printf("run %d: plaintext %.3f GB/s (%.3f GB/cpu-s)  tls %.3f GB/s (%.3f GB/cpu-s)\n", r,
                p.bytes_per_second / 1e9, p.bytes_per_cpu_second / 1e9, t.bytes_per_second / 1e9,
                t.bytes_per_cpu_second / 1e9);
    plain_bps.push_back(p.bytes_per_second);
    tls_bps.push_back(t.bytes_per_second);
    plain_cpu.push_back(p.bytes_per_cpu_second);
    tls_cpu.push_back(t.bytes_per_cpu_second);
  }
  std::printf(
      "median of %d: plaintext %.3f GB/s (%.3f GB per CPU-second), TLS %.3f GB/s (%.3f GB per "
      "CPU-second); TLS/plaintext %.2f (wall), %.2f (CPU)\n",
      runs, Median(plain_bps) / 1e9, Median(plain_cpu) / 1e9, Median(tls_bps) / 1e9,
      Median(tls_cpu) / 1e9, Median(tls_bps) / Median(plain_bps),
      Median(tls_cpu) / Median(plain_cpu));
  std::filesystem::remove_all(dir);
  return 0;
}
