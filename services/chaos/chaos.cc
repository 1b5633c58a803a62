#include "services/chaos/chaos.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/chaos/internal/cluster_ops.h"
#include "services/chaos/internal/link_faults.h"

namespace vc::chaos {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;
using internal::CodeName;

const char* FaultName(FaultType t) {
  switch (t) {
    case FaultType::kKillDrafter:
      return "kill_drafter";
    case FaultType::kKillVerifier:
      return "kill_verifier";
    case FaultType::kKillStore:
      return "kill_store";
    case FaultType::kPause:
      return "pause";
    case FaultType::kCutLink:
      return "cut_link";
    case FaultType::kThrottleLink:
      return "throttle_link";
  }
  return "?";
}

std::vector<Fault> DrawFaultSchedule(uint64_t seed, const ChaosOptions& options,
                                     const std::vector<std::string>& daemons) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(rng);
  };
  std::vector<std::string> drafters, verifiers, pausable, linked;
  for (const std::string& d : daemons) {
    if (d.rfind("drafter", 0) == 0) drafters.push_back(d);
    if (d.rfind("verifier", 0) == 0) verifiers.push_back(d);
    if (d != "openai") pausable.push_back(d);
    // The links of the topology: store <-> workers <-> coordinator.
    if (d == "kvstore" || d.rfind("drafter", 0) == 0 || d.rfind("verifier", 0) == 0) {
      linked.push_back(d);
    }
  }
  auto pick = [&](const std::vector<std::string>& v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  std::vector<Fault> out;
  const double gap = std::max(0.1, options.mean_fault_gap_s);
  // The first fault comes after a short warm-up, so some requests run clean.
  double t = uniform(1.0, 1.0 + gap);
  while (t < options.duration_s && static_cast<int>(out.size()) < options.max_faults) {
    Fault f;
    f.at_s = t;
    const double r = uniform(0, 1);
    // Drawn only with link faults on, so a seed without them replays the
    // schedule it always had.
    const double link = options.link_faults ? uniform(0, 1) : 1.0;
    if (link < 0.35 && !linked.empty()) {
      f.type = link < 0.2 ? FaultType::kCutLink : FaultType::kThrottleLink;
      f.target = pick(linked);
      f.down_s = uniform(0.5, 3.0);
    } else if (r < 0.3 && !drafters.empty()) {
      f.type = FaultType::kKillDrafter;
      f.target = pick(drafters);
      f.down_s = uniform(0.2, 2.0);
    } else if (r < 0.55 && !verifiers.empty()) {
      f.type = FaultType::kKillVerifier;
      f.target = pick(verifiers);
      f.down_s = uniform(0.2, 2.0);
    } else if (r < 0.68) {
      f.type = FaultType::kKillStore;
      f.target = "kvstore";
      f.down_s = uniform(0.2, 1.5);
    } else {
      f.type = FaultType::kPause;
      f.target = pick(pausable);
      f.down_s = uniform(0.2, 3.0);
    }
    out.push_back(f);
    // Faults run one at a time: the next starts after this one's downtime,
    // a restart allowance, and a gap.
    t += f.down_s + 1.0 + uniform(0.2 * gap, 1.8 * gap);
  }
  return out;
}

bool IsCleanFailure(const grpc::Status& status) {
  if (status.ok() || status.error_message().empty()) return false;
  switch (status.error_code()) {
    case grpc::StatusCode::UNKNOWN:
    // A valid request must never be refused as invalid, unauthenticated or
    // unsupported because a daemon died.
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::OUT_OF_RANGE:
      return false;
    default:
      return true;
  }
}

void CancelTally::Add(grpc::StatusCode code, double cancel_to_end_ms, double bound_ms) {
  ++sent;
  if (code == grpc::StatusCode::OK) {
    ++after_end;
  } else if (code == grpc::StatusCode::CANCELLED) {
    ++mid_request;
    to_end_ms.push_back(cancel_to_end_ms);
    if (cancel_to_end_ms > bound_ms) ++slow;
  } else {
    ++other;
  }
}

std::string CancelSummary(const CancelTally& t) {
  double max = 0;
  for (double v : t.to_end_ms) max = std::max(max, v);
  return absl::StrFormat(
      "cancels=%d (mid-request %d, after the end %d, other %d, slow %d) "
      "p50/p99/max_cancel_to_end_ms=%.1f/%.1f/%.1f",
      t.sent, t.mid_request, t.after_end, t.other, t.slow, internal::Percentile(t.to_end_ms, 0.5),
      internal::Percentile(t.to_end_ms, 0.99), max);
}

std::string SummaryLine(const ChaosReport& r) {
  std::string faults;
  for (const auto& [type, n] : r.faults_by_type)
    absl::StrAppend(&faults, faults.empty() ? "" : ",", type, "=", n);
  std::string codes;
  for (const auto& [code, n] : r.failures_by_code)
    absl::StrAppend(&codes, codes.empty() ? "" : ",", code, "=", n);
  return absl::StrFormat(
      "chaos: %s seed=%d requests=%d completed=%d (exact-checked %d) failed=%d [%s] %s "
      "failed_after_recovery=%d/%d faults=%d [%s] fault_errors=%d wrong_tokens=%d "
      "unclean_failures=%d crashes=%d leaks=%s wall=%.0fs",
      r.ok() ? "PASS" : "FAIL", r.seed, r.requests, r.completed, r.exact_checked, r.failed,
      codes.empty() ? "none" : codes, CancelSummary(r.cancels), r.failed_after_recovery,
      r.after_recovery, r.faults, faults.empty() ? "none" : faults, r.fault_errors, r.wrong_tokens,
      r.unclean_failures, r.crashes.size(), r.leaks.empty() ? "none" : "\"" + r.leaks + "\"",
      r.wall_seconds);
}

namespace internal {

uint64_t PickSeed(uint64_t seed) {
  if (seed != 0) return seed;
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) % 1000000000ULL + 1;
}

absl::StatusOr<std::unique_ptr<local::LocalCluster>> StartCluster(const ClusterSetup& setup,
                                                                  std::string* log_dir,
                                                                  std::ostream& log) {
  if (log_dir->empty()) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "vericache-chaos-logs-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    *log_dir = tmpl;
  }
  local::LocalClusterOptions o;
  o.model = setup.model;
  o.bin_dir = setup.bin_dir;
  o.insecure = setup.insecure;
  o.verifiers = setup.verifiers;
  o.drafters = setup.drafters;
  o.log_dir = *log_dir;
  o.chunk_tokens = 32;
  o.ingest_variants = MixedWorkload::IngestVariants();
  o.max_active_requests = std::max(64, setup.concurrency * 2);
  const std::string idle = absl::StrCat("--session-idle-seconds=", setup.session_idle_seconds);
  o.extra_flags["vc-verifier"] = {idle};
  o.extra_flags["vc-drafter"] = {idle};
  o.extra_flags["vc-kvstore"] = {absl::StrCat("--put-lease-seconds=", setup.put_lease_seconds)};
  log << "starting the cluster: " << setup.verifiers << " verifiers, " << setup.drafters
      << " drafters, " << (setup.insecure ? "insecure" : "mTLS + API keys") << " (daemon logs in "
      << *log_dir << ")" << std::endl;
  return local::LocalCluster::Start(o);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<LinkFaultNamespace>> LinkFaultNamespace::Enter() {
  absl::StatusOr<std::unique_ptr<internal::LinkFaults>> links = internal::LinkFaults::Enter();
  if (!links.ok()) return links.status();
  return std::unique_ptr<LinkFaultNamespace>(new LinkFaultNamespace(std::move(*links)));
}

LinkFaultNamespace::LinkFaultNamespace(std::unique_ptr<internal::LinkFaults> links)
    : links_(std::move(links)) {}

LinkFaultNamespace::~LinkFaultNamespace() = default;

absl::StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, std::ostream& log,
                                     LinkFaultNamespace* ns) {
  ChaosReport report;
  report.seed = internal::PickSeed(options.seed);
  log << "chaos: seed " << report.seed << " (replay with --seed " << report.seed << ")"
      << std::endl;
  if (options.setup.concurrency < 1 || options.duration_s <= 0 || options.max_requests < 1 ||
      options.max_faults < 0) {
    return absl::InvalidArgumentError("--concurrency, --duration and --requests must be positive");
  }
  signal(SIGPIPE, SIG_IGN);
  // The namespace the cluster and its link faults live in, entered by the
  // caller before any thread started (LinkFaultNamespace).
  internal::LinkFaults* links = nullptr;
  if (options.link_faults) {
    if (ns == nullptr) {
      return absl::FailedPreconditionError(
          "--link-faults: the network namespace was not entered (LinkFaultNamespace::Enter)");
    }
    links = &ns->links();
    log << "chaos: link faults on: the cluster runs in a network namespace of its own "
           "(its loopback shaped with tc; nothing outside it is touched)"
        << std::endl;
  }
  auto workload = internal::MixedWorkload::Create(options.setup, report.seed);
  if (!workload.ok()) return workload.status();
  std::string log_dir = options.setup.log_dir;
  auto cluster_or = internal::StartCluster(options.setup, &log_dir, log);
  if (!cluster_or.ok()) return cluster_or.status();
  local::LocalCluster& cluster = **cluster_or;
  if (absl::Status s = (*workload)->RegisterPrefixes(cluster); !s.ok()) return s;
  internal::DaemonControl control(&cluster);

  std::vector<std::string> daemons;
  for (const auto& ep : cluster.endpoints()) daemons.push_back(ep.name);
  if (!links) {
    log << "chaos: link faults off (--link-faults: needs root, ip and tc)" << std::endl;
  }
  // A daemon's link = every packet to or from its listening ports (gRPC and,
  // for the store, the data plane; for a verifier, its peer data plane);
  // restarts keep the ports.
  auto ports_of = [&](const std::string& name) {
    std::vector<int> ports;
    const local::Endpoint* ep = cluster.Find(name);
    if (ep == nullptr) return ports;
    for (const std::string* a : {&ep->address, &ep->data, &ep->peer_data}) {
      const size_t colon = a->rfind(':');
      if (colon != std::string::npos) ports.push_back(std::atoi(a->c_str() + colon + 1));
    }
    return ports;
  };
  const std::vector<Fault> schedule = DrawFaultSchedule(report.seed, options, daemons);
  log << "chaos: " << schedule.size() << " faults scheduled over " << options.duration_s << " s"
      << std::endl;
  for (size_t i = 0; i < schedule.size(); ++i) {
    log << absl::StrFormat("  fault %d at %.1fs: %s %s for %.1fs\n", i, schedule[i].at_s,
                           FaultName(schedule[i].type), schedule[i].target, schedule[i].down_s);
  }
  log.flush();

  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::milliseconds(static_cast<int64_t>(options.duration_s * 1000));
  std::mutex mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::atomic<bool> fault_active{false};
  std::atomic<int64_t> faults_started{0};
  std::atomic<int64_t> last_fault_end_ms{-1000000};

  // Faults: one at a time, in schedule order.
  std::thread faults([&] {
    for (const Fault& f : schedule) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (stop_cv.wait_until(lock,
                               t0 + std::chrono::milliseconds(static_cast<int64_t>(f.at_s * 1000)),
                               [&] { return stopping; })) {
          return;
        }
      }
      if (Clock::now() >= end) return;
      const auto down = std::chrono::milliseconds(static_cast<int64_t>(f.down_s * 1000));
      fault_active.store(true);
      faults_started.fetch_add(1);
      absl::Status s;
      if (f.type == FaultType::kCutLink || f.type == FaultType::kThrottleLink) {
        s = f.type == FaultType::kCutLink
                ? links->Cut(ports_of(f.target))
                : links->Throttle(ports_of(f.target), options.throttle_rate);
        std::this_thread::sleep_for(down);
        if (absl::Status r = links->Clear(); !r.ok() && s.ok()) s = r;
      } else if (f.type == FaultType::kPause) {
        s = control.Pause(f.target);
        std::this_thread::sleep_for(down);
        if (absl::Status r = control.Resume(f.target); !r.ok() && s.ok()) s = r;
      } else {
        s = control.Kill(f.target);
        std::this_thread::sleep_for(down);
        // A daemon that does not come back is a finding, not a reason to
        // stop: try a few times.
        absl::Status r = absl::UnknownError("not tried");
        for (int attempt = 0; attempt < 3 && !r.ok(); ++attempt) {
          r = control.Restart(f.target);
        }
        if (!r.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          ++report.fault_errors;
          report.problems.push_back(
              absl::StrCat("restart of ", f.target, " failed: ", r.message()));
        }
      }
      last_fault_end_ms.store(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
      fault_active.store(false);
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok()) {
        ++report.fault_errors;
        report.problems.push_back(
            absl::StrCat(FaultName(f.type), " ", f.target, ": ", s.message()));
        continue;
      }
      ++report.faults;
      ++report.faults_by_type[FaultName(f.type)];
      log << absl::StrFormat("chaos: t=%.1fs %s %s (%.1fs) done\n",
                             std::chrono::duration<double>(Clock::now() - t0).count(),
                             FaultName(f.type), f.target, f.down_s);
      log.flush();
    }
  });

  // Requests: `concurrency` clients until the duration or the bound.
  std::atomic<int64_t> next{0};
  std::map<std::string, int64_t> failure_kinds;
  const rpc::ClientConfig client = cluster.client();
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(client, 64 << 20));
  std::vector<std::thread> clients;
  for (int c = 0; c < options.setup.concurrency; ++c) {
    clients.emplace_back([&] {
      while (Clock::now() < end) {
        const int64_t i = next.fetch_add(1);
        if (i >= options.max_requests) return;
        const internal::RequestSpec spec = (*workload)->Draw(i);
        const int64_t start_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
        const int64_t faults_before = faults_started.load();
        bool recovered = !fault_active.load() && start_ms - last_fault_end_ms.load() >= 3000;
        const internal::Outcome out = (*workload)->Run(spec, client, stub.get());
        recovered = recovered && faults_started.load() == faults_before;  // none began meanwhile
        const std::string wrong = (*workload)->Check(spec, out);
        std::lock_guard<std::mutex> lock(mu);
        ++report.requests;
        if (recovered) ++report.after_recovery;
        if (out.cancelled) {
          const double bound_ms = options.setup.max_cancel_seconds * 1000;
          report.cancels.Add(out.status.error_code(), out.cancel_to_end_ms, bound_ms);
          if (out.status.error_code() == grpc::StatusCode::CANCELLED &&
              out.cancel_to_end_ms > bound_ms && report.problems.size() < 50) {
            report.problems.push_back(
                absl::StrFormat("slow cancel: %s ended %.0f ms after its cancel (bound %.0f ms)",
                                spec.request.request_id(), out.cancel_to_end_ms, bound_ms));
          }
        }
        if (out.status.ok()) {
          ++report.completed;
          if (spec.exact) ++report.exact_checked;
        } else if (!out.cancelled) {
          ++report.failed;
          if (recovered) ++report.failed_after_recovery;
          const std::string code = CodeName(out.status.error_code());
          // Failure kinds, numbers and addresses masked, for the end report.
          std::string kind = code + ": " + out.status.error_message().substr(0, 100);
          for (char& ch : kind) {
            if (ch >= '0' && ch <= '9') ch = '#';
          }
          ++failure_kinds[kind];
          if (++report.failures_by_code[code] == 1) {
            log << "chaos: first " << code << " failure: " << out.status.error_message()
                << std::endl;
          }
        }
        if (!out.status.ok() && !IsCleanFailure(out.status)) {
          ++report.unclean_failures;
          if (report.problems.size() < 50) {
            report.problems.push_back(absl::StrCat("unclean failure of ", spec.request.request_id(),
                                                   ": ", CodeName(out.status.error_code()), " \"",
                                                   out.status.error_message(), "\""));
          }
        }
        if (!wrong.empty()) {
          ++report.wrong_tokens;
          if (report.problems.size() < 50) report.problems.push_back("wrong tokens: " + wrong);
        }
        if (report.requests % 50 == 0) {
          log << absl::StrFormat(
              "chaos: t=%.0fs %d requests (%d ok, %d failed, %d cancelled (%d mid-request), %d "
              "wrong)\n",
              std::chrono::duration<double>(Clock::now() - t0).count(), report.requests,
              report.completed, report.failed, report.cancels.sent, report.cancels.mid_request,
              report.wrong_tokens);
          log.flush();
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
  }
  stop_cv.notify_all();
  faults.join();
  log << "chaos: requests drained; waiting for every daemon to go idle" << std::endl;
  const internal::IdleState idle = internal::WaitIdle(
      cluster, std::chrono::milliseconds(static_cast<int64_t>(options.setup.drain_seconds * 1000)));
  if (!idle.idle) report.leaks = idle.detail;
  report.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (report.faults < options.min_faults || report.requests < options.min_requests) {
    report.below_minimum = true;
    report.problems.push_back(absl::StrCat(
        report.faults, " faults and ", report.requests, " requests, fewer than the minimum (",
        options.min_faults, " faults, ", options.min_requests, " requests)"));
  }
  {
    std::vector<std::pair<int64_t, std::string>> kinds;
    for (const auto& [k, n] : failure_kinds) kinds.emplace_back(n, k);
    std::sort(kinds.rbegin(), kinds.rend());
    for (size_t i = 0; i < kinds.size() && i < 10; ++i) {
      log << "chaos: failures: " << kinds[i].first << " x " << kinds[i].second << std::endl;
    }
  }
  for (const std::string& p : report.problems) log << "chaos: " << p << std::endl;
  cluster.Stop();  // a crash on the way down counts too
  report.crashes = internal::CrashReports(log_dir);
  for (const std::string& c : report.crashes) log << "chaos: daemon crash: " << c << std::endl;
  if (report.ok() && options.setup.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(log_dir, ec);
  } else if (!report.ok()) {
    log << "chaos: daemon logs kept in " << log_dir << std::endl;
  }
  return report;
}

}  // namespace vc::chaos
