// vc-dataplane-probe: serve synthetic blobs over the KV data plane, or fetch
// them and report the rate. For operators checking a link (and the pacing or
// tc shaping on it) without a store, and for the netns test.
//
//   vc-dataplane-probe serve --listen 10.0.0.1:7401 --bytes 4194304 --count 4
//   vc-dataplane-probe fetch --server 10.0.0.1:7401 --count 4 --link slow
//
// Blob i is keyed "blob-i" and its byte j is (i * 131 + j * 7) mod 256, so a
// fetch can check every byte it got. Exit codes: 0 ok, 1 runtime failure,
// 2 bad flags.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/transport/data_plane.h"

namespace {

using vc::transport::DataPlaneClient;
using vc::transport::DataPlaneClientOptions;
using vc::transport::DataPlaneServer;
using vc::transport::DataPlaneServerOptions;
using vc::transport::LinkClass;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    "usage: vc-dataplane-probe serve|fetch [flags]\n"
    "\n"
    "Serve synthetic blobs over the VeriCache KV data plane, or fetch them and\n"
    "report the transfer rate.\n"
    "\n"
    "commands:\n"
    "  serve   serve --count blobs of --bytes bytes until SIGTERM/SIGINT (or --seconds)\n"
    "  fetch   fetch blobs from a serving probe, check their bytes, print the rate\n"
    "\n"
    "Run 'vc-dataplane-probe <command> --help' for the flags of a command.\n";

std::string Key(int64_t i) { return absl::StrCat("blob-", i); }

char BlobByte(int64_t blob, int64_t j) { return static_cast<char>((blob * 131 + j * 7) & 0xff); }

std::string MakeBlob(int64_t blob, int64_t bytes) {
  std::string s(static_cast<size_t>(bytes), '\0');
  for (int64_t j = 0; j < bytes; ++j) s[static_cast<size_t>(j)] = BlobByte(blob, j);
  return s;
}

int Usage(const char* command, const absl::Status& s) {
  std::fprintf(stderr, "vc-dataplane-probe %s: %s\n", command, std::string(s.message()).c_str());
  return kExitUsage;
}

absl::StatusOr<LinkClass> ParseLink(const std::string& name) {
  if (name == "fast") return LinkClass::kFast;
  if (name == "slow") return LinkClass::kSlow;
  return absl::InvalidArgumentError(absl::StrCat("--link must be fast or slow, got '", name, "'"));
}

int RunServe(int argc, char** argv) {
  DataPlaneServerOptions options;
  options.listen = "127.0.0.1:7401";
  int64_t bytes = int64_t{1} << 20;
  int64_t count = 1;
  double fast_latency_ms = 0, slow_latency_ms = 0, seconds = 0;
  vc::FlagSet flags("vc-dataplane-probe serve",
                    "Serve blobs blob-0..blob-(count-1) of --bytes bytes each.");
  flags.Add("--kind", &options.kind, "tcp|ucx", "data plane backend");
  flags.Add("--listen", &options.listen, "HOST:PORT", "address to listen on (port 0: any free)");
  flags.Add("--bytes", &bytes, "N", "bytes per blob");
  flags.Add("--count", &count, "K", "number of blobs");
  flags.Add("--fast-bytes-per-second", &options.fast.bytes_per_second, "X",
            "pacing of the fast (store->verifier) link; 0 = unpaced");
  flags.Add("--slow-bytes-per-second", &options.slow.bytes_per_second, "X",
            "pacing of the slow (store->drafter) link; 0 = unpaced");
  flags.Add("--fast-latency-ms", &fast_latency_ms, "X", "latency added per fast-link response");
  flags.Add("--slow-latency-ms", &slow_latency_ms, "X", "latency added per slow-link response");
  flags.Add("--slot-seconds", &options.slot_seconds, "X", "width of the per-slot byte counters");
  flags.Add("--seconds", &seconds, "X", "exit after this long (0: at SIGTERM/SIGINT)");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Usage("serve", s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (bytes < 0 || count < 0 || count > 1'000'000 || bytes * count > (int64_t{16} << 30)) {
    return Usage("serve", absl::InvalidArgumentError(
                              "--bytes and --count must be >= 0, count <= 1e6, total <= 16 GiB"));
  }
  options.fast.latency_seconds = fast_latency_ms / 1000;
  options.slow.latency_seconds = slow_latency_ms / 1000;
  options.max_keys_per_fetch = static_cast<int>(std::max<int64_t>(1024, count));
  options.max_response_bytes = std::max<int64_t>(options.max_response_bytes, bytes * count);

  std::vector<std::string> blobs;
  for (int64_t i = 0; i < count; ++i) blobs.push_back(MakeBlob(i, bytes));
  auto lookup = [&blobs](const std::string& key) -> absl::StatusOr<std::string> {
    int64_t i = -1;
    if (key.rfind("blob-", 0) == 0) i = std::atoll(key.c_str() + 5);
    if (i < 0 || i >= static_cast<int64_t>(blobs.size()) || key != Key(i)) {
      return absl::NotFoundError("no such blob");
    }
    return blobs[static_cast<size_t>(i)];
  };

  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = DataPlaneServer::Create(options, lookup);
  if (!server.ok()) {
    std::fprintf(stderr, "vc-dataplane-probe serve: %s\n", server.status().ToString().c_str());
    return server.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  std::printf("listening on %s kind=%s\n", (*server)->address().c_str(), options.kind.c_str());
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  while (true) {
    timespec wait{0, 100'000'000};
    if (sigtimedwait(&stop_signals, nullptr, &wait) > 0) break;
    if (seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >=
            seconds) {
      break;
    }
  }
  for (LinkClass link : {LinkClass::kFast, LinkClass::kSlow}) {
    const auto st = (*server)->Stats(link);
    std::printf(
        "link=%s bytes=%lld fetches=%lld busy_seconds=%.6f capacity_bytes_per_second=%.0f\n",
        vc::transport::LinkClassName(link), static_cast<long long>(st.bytes_total),
        static_cast<long long>(st.fetches), st.busy_seconds, st.capacity_bytes_per_second);
  }
  return kExitOk;
}

int RunFetch(int argc, char** argv) {
  DataPlaneClientOptions options;
  std::string link = "fast";
  int64_t count = 1;
  int64_t repeat = 1;
  int64_t timeout_ms = 60'000;
  vc::FlagSet flags("vc-dataplane-probe fetch",
                    "Fetch blob-0..blob-(count-1) from a serving probe in one request per repeat,\n"
                    "check every byte, and print the rate.");
  flags.Add("--kind", &options.kind, "tcp|ucx", "data plane backend (must match the server)");
  flags.Add("--server", &options.server_address, "HOST:PORT", "the serving probe (required)");
  flags.Add("--count", &count, "K", "number of blobs per fetch");
  flags.Add("--link", &link, "fast|slow", "link class (pacing bucket) the fetches use");
  flags.Add("--repeat", &repeat, "R", "number of fetches");
  flags.Add("--timeout-ms", &timeout_ms, "N", "deadline of each fetch");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Usage("fetch", s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  auto link_class = ParseLink(link);
  if (!link_class.ok()) return Usage("fetch", link_class.status());
  options.link = *link_class;
  if (options.server_address.empty()) {
    return Usage("fetch", absl::InvalidArgumentError("--server is required"));
  }
  if (count < 1 || count > 1'000'000 || repeat < 1 || timeout_ms < 1) {
    return Usage("fetch", absl::InvalidArgumentError(
                              "--count must be in [1, 1e6], --repeat and --timeout-ms >= 1"));
  }
  auto client = DataPlaneClient::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "vc-dataplane-probe fetch: %s\n", client.status().ToString().c_str());
    return client.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  std::vector<std::string> keys;
  for (int64_t i = 0; i < count; ++i) keys.push_back(Key(i));
  int64_t total = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < repeat; ++r) {
    auto values = (*client)->Fetch(
        keys, std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms));
    if (!values.ok()) {
      std::fprintf(stderr, "vc-dataplane-probe fetch: %s\n", values.status().ToString().c_str());
      return kExitFailure;
    }
    for (int64_t i = 0; i < count; ++i) {
      const std::string& v = (*values)[static_cast<size_t>(i)];
      for (size_t j = 0; j < v.size(); ++j) {
        if (v[j] != BlobByte(i, static_cast<int64_t>(j))) {
          std::fprintf(stderr, "vc-dataplane-probe fetch: blob %lld byte %zu is wrong\n",
                       static_cast<long long>(i), j);
          return kExitFailure;
        }
      }
      total += static_cast<int64_t>(v.size());
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto st = (*client)->stats();
  std::printf(
      "bytes=%lld seconds=%.6f bytes_per_second=%.0f transport_bytes=%lld kind=%s link=%s\n",
      static_cast<long long>(total), secs, secs > 0 ? total / secs : 0.0,
      static_cast<long long>(st.transport_bytes), options.kind.c_str(), link.c_str());
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string command = argv[1];
  if (command == "serve") return RunServe(argc, argv);
  if (command == "fetch") return RunFetch(argc, argv);
  std::fprintf(stderr, "vc-dataplane-probe: unknown command '%s' (see --help)\n", command.c_str());
  return kExitUsage;
}
