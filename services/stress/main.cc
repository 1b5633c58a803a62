// `vc-stress`: stress the KV chunk store against a persisted expected-state
// oracle (services/stress/stress.h). Exit codes: 0 no violation, 1
// violations or unexpected store errors, 2 bad flags, 3 the store became
// unreachable (remote mode; a crash loop kills it on purpose).
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "services/stress/stress.h"

namespace {
constexpr char kName[] = "vc-stress";
}  // namespace

int main(int argc, char** argv) {
  vc::stress::StressOptions o;
  vc::FlagSet flags(kName,
                    "Stress the KV chunk store (in-process or a vc-kvstore daemon) and check "
                    "every answer against a persisted expected-state oracle.");
  flags.Add("--mode", &o.mode, "inproc|remote", "the store in this process, or a vc-kvstore daemon");
  flags.Add("--db", &o.db_dir, "DIR", "inproc: RocksDB directory (created if missing)");
  flags.Add("--store", &o.store_address, "HOST:PORT", "remote: vc-kvstore gRPC address (loopback)");
  flags.Add("--data-plane", &o.data_plane, "tcp|ucx", "remote: the store's data plane");
  flags.Add("--oracle", &o.oracle_path, "FILE", "expected-state file (created if missing; required)");
  flags.Add("--threads", &o.threads, "N", "worker threads");
  flags.Add("--ops", &o.ops, "N", "stop after N operations in total (0: --duration only)");
  flags.Add("--duration", &o.duration_s, "SECONDS", "stop the load after this long");
  flags.Add("--seed", &o.seed, "N", "schedule seed (0: from the clock; printed, replays the schedule)");
  flags.Add("--keys", &o.keys, "N", "key space (fixed when the oracle is created)");
  flags.Add("--min-value-bytes", &o.min_value_bytes, "N", "smallest value (fixed by the oracle)");
  flags.Add("--max-value-bytes", &o.max_value_bytes, "N", "largest value (fixed by the oracle)");
  flags.Add("--max-batch", &o.max_batch, "N", "keys per put (multi-chunk puts commit together)");
  flags.Add("--max-pins-per-thread", &o.max_pins_per_thread, "N", "pins a thread holds at once");
  flags.Add("--dram-bytes", &o.dram_bytes, "N", "the store's DRAM budget (inproc)");
  flags.Add("--disk-bytes", &o.disk_bytes, "N",
            "the store's disk budget (remote: must equal vc-kvstore --disk-budget-bytes)");
  flags.Add("--ttl-seconds", &o.ttl_seconds, "N",
            "the store's TTL, 0: none (remote: must equal vc-kvstore --ttl-seconds)");
  flags.AddBool("--sync-writes", &o.sync_writes,
                "inproc: fsync every commit (=false: commits are unsynced, may be lost)");
  flags.AddBool("--oracle-sync", &o.oracle_sync,
                "msync the oracle before every mutating call (=false: survives kill -9 only)");
  flags.AddBool("--verify-only", &o.verify_only, "only verify every key against the oracle");
  flags.Add("--rpc-timeout-ms", &o.rpc_timeout_ms, "MS", "remote: deadline of every call");
  flags.Add("--max-unreachable-s", &o.max_unreachable_s, "SECONDS",
            "remote: stop once the store stayed unreachable this long (exit 3)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s: %s (see %s --help)\n", kName, std::string(s.message()).c_str(), kName);
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  const absl::StatusOr<vc::stress::StressReport> report = vc::stress::RunStress(o);
  if (!report.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, report.status().ToString().c_str());
    const absl::StatusCode code = report.status().code();
    if (code == absl::StatusCode::kInvalidArgument) return 2;
    // The daemon was not there to connect to (a crash loop may have just
    // killed it): the same exit as losing it mid-run.
    if (o.mode == "remote" &&
        (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded)) {
      return 3;
    }
    return 1;
  }
  std::fputs(vc::stress::FormatReport(*report).c_str(), stdout);
  std::fflush(stdout);
  return vc::stress::ExitCode(*report);
}
