// `vericache soak`: a fixed request rate against a local cluster, RSS of
// every daemon sampled from /proc, per-window TTFT and throughput, random
// cancels during the run and serial cancel-to-freed probes after it.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/chaos/chaos.h"
#include "services/chaos/internal/cluster_ops.h"

namespace vc::chaos {

namespace pb = ::vericache::v1;
using Clock = std::chrono::steady_clock;

double LeastSquaresSlope(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  if (n < 2) return 0;
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
  }
  return sxx > 0 ? sxy / sxx : 0;
}

std::string SummaryLine(const SoakReport& r) {
  std::string slopes;
  for (const auto& [name, s] : r.rss_slope_mib_per_10min) {
    absl::StrAppend(&slopes, slopes.empty() ? "" : ",", name, "=", absl::StrFormat("%+.2f", s));
  }
  std::vector<double> p99s;
  for (const SoakWindow& w : r.windows) p99s.push_back(w.p99_ttft_ms);
  return absl::StrFormat(
      "soak: %s seed=%d duration=%.0fs requests=%d completed=%d failed=%d %s dropped=%d "
      "wrong_tokens=%d rss_slope_mib_per_10min=[%s] cancel_probes=%d "
      "p50/p99_cancel_to_freed_ms=%.1f/%.1f crashes=%d leaks=%s",
      r.ok() ? "PASS" : "FAIL", r.seed, r.duration_s, r.requests, r.completed, r.failed,
      CancelSummary(r.cancels), r.dropped, r.wrong_tokens, slopes, r.cancel_probes,
      r.p50_cancel_to_freed_ms, r.p99_cancel_to_freed_ms, r.crashes.size(),
      r.leaks.empty() ? "none" : "\"" + r.leaks + "\"");
}

absl::StatusOr<SoakReport> RunSoak(const SoakOptions& options, std::ostream& log) {
  SoakReport report;
  report.seed = internal::PickSeed(options.seed);
  if (options.duration_s <= 0 || options.rate <= 0 || options.window_s <= 0 ||
      options.rss_interval_s <= 0 || options.setup.concurrency < 1 || options.cancels < 0 ||
      options.cancel_probes < 0) {
    return absl::InvalidArgumentError(
        "--duration, --rate, --window, --rss-interval and --concurrency must be positive");
  }
  log << "soak: seed " << report.seed << ", " << options.rate << " requests/s for "
      << options.duration_s << " s" << std::endl;
  signal(SIGPIPE, SIG_IGN);
  // The dispatcher decides which requests to cancel (paced so that
  // `cancels` land over the run), not the mix.
  ClusterSetup setup = options.setup;
  setup.cancel_fraction = 0;
  auto workload = internal::MixedWorkload::Create(setup, report.seed);
  if (!workload.ok()) return workload.status();
  std::string log_dir = setup.log_dir;
  auto cluster_or = internal::StartCluster(setup, &log_dir, log);
  if (!cluster_or.ok()) return cluster_or.status();
  local::LocalCluster& cluster = **cluster_or;
  if (absl::Status s = (*workload)->RegisterPrefixes(cluster); !s.ok()) return s;
  internal::DaemonControl control(&cluster);

  struct Record {
    double start_s = 0;
    double end_s = 0;
    double ttft_ms = -1;
    int64_t tokens = 0;
    bool ok = false;
    bool cancelled = false;  // a cancel was sent before the stream ended
    grpc::StatusCode code = grpc::StatusCode::OK;
    double cancel_to_end_ms = -1;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int64_t, bool>> queue;  // request index, cancel it
  int in_flight = 0;
  int64_t cancels_pending = 0, cancels_landed = 0;
  bool closing = false;
  std::vector<Record> records;
  const auto t0 = Clock::now();
  auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  const rpc::ClientConfig client = cluster.client();
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(client, 64 << 20));

  std::vector<std::thread> workers;
  for (int c = 0; c < setup.concurrency; ++c) {
    workers.emplace_back([&] {
      while (true) {
        int64_t i = 0;
        bool cancel = false;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return closing || !queue.empty(); });
          if (queue.empty()) return;
          std::tie(i, cancel) = queue.front();
          queue.pop_front();
        }
        Record rec;
        rec.start_s = since(Clock::now());
        internal::RequestSpec spec = (*workload)->Draw(i);
        if (cancel) {
          // A random point of its life, in tokens (see RequestSpec).
          const uint64_t h = std::hash<int64_t>{}(i * 7919 + 13);
          spec.cancel = true;
          spec.cancel_point = static_cast<double>(h % 1000) / 1000.0;
          spec.cancel_after_ms = static_cast<int>(h / 1000 % 20);
        }
        const internal::Outcome out = (*workload)->Run(spec, client, stub.get());
        const std::string wrong = (*workload)->Check(spec, out);
        rec.end_s = since(Clock::now());
        rec.ttft_ms = out.client_ttft_ms;
        rec.tokens = static_cast<int64_t>(out.streamed.size());
        rec.ok = out.status.ok();
        rec.cancelled = out.cancelled;
        rec.code = out.status.error_code();
        rec.cancel_to_end_ms = out.cancel_to_end_ms;
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
        if (cancel) --cancels_pending;
        if (out.cancelled && out.status.error_code() == grpc::StatusCode::CANCELLED) {
          ++cancels_landed;
        }
        records.push_back(rec);
        if (!wrong.empty()) {
          ++report.wrong_tokens;
          if (report.problems.size() < 50) report.problems.push_back("wrong tokens: " + wrong);
        }
        if (!out.status.ok() && !out.cancelled && !IsCleanFailure(out.status) &&
            report.problems.size() < 50) {
          report.problems.push_back(absl::StrCat("unclean failure of ", spec.request.request_id(),
                                                 ": ", internal::CodeName(out.status.error_code()),
                                                 " \"", out.status.error_message(), "\""));
        }
      }
    });
  }

  // RSS and threads of every daemon.
  std::map<std::string, std::vector<double>> rss_t, rss_mib;
  std::map<std::string, int> threads_max;
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling.load()) {
      const double t = since(Clock::now());
      for (const auto& ep : cluster.endpoints()) {
        const pid_t pid = control.Pid(ep.name);
        absl::StatusOr<double> mib = internal::RssMiB(pid);
        if (!mib.ok()) continue;
        absl::StatusOr<int> threads = internal::ThreadCount(pid);
        std::lock_guard<std::mutex> lock(mu);
        rss_t[ep.name].push_back(t);
        rss_mib[ep.name].push_back(*mib);
        if (threads.ok()) threads_max[ep.name] = std::max(threads_max[ep.name], *threads);
      }
      const auto until = Clock::now() + std::chrono::milliseconds(
                                            static_cast<int64_t>(options.rss_interval_s * 1000));
      while (sampling.load() && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });

  // The open-loop dispatcher: one request per tick; a tick that finds
  // `concurrency` in flight is dropped (counted), never queued without bound.
  const auto period = std::chrono::duration<double>(1.0 / options.rate);
  const auto end = t0 + std::chrono::milliseconds(static_cast<int64_t>(options.duration_s * 1000));
  int64_t next = 0;
  double next_window = options.window_s;
  size_t window_from = 0;
  for (auto tick = t0; tick < end; tick += std::chrono::duration_cast<Clock::duration>(period)) {
    std::this_thread::sleep_until(tick);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (in_flight >= setup.concurrency) {
        ++report.dropped;
      } else {
        // Cancel this one if the landed and pending cancels are behind the
        // pace that reaches `cancels` at the end (a cancel that did not end
        // its request CANCELLED does not count, so the pace catches up).
        const double due = static_cast<double>(options.cancels) *
                           std::min(1.0, since(tick) / options.duration_s +
                                             1.0 / (options.rate * options.duration_s));
        const bool cancel = static_cast<double>(cancels_landed + cancels_pending) < due;
        if (cancel) ++cancels_pending;
        ++in_flight;
        queue.emplace_back(next++, cancel);
      }
    }
    cv.notify_one();
    if (since(Clock::now()) >= next_window) {
      // Progress for the finished window (the final table is below).
      std::lock_guard<std::mutex> lock(mu);
      log << absl::StrFormat("soak: t=%.0fs %d requests done\n", since(Clock::now()),
                             records.size() - window_from);
      window_from = records.size();
      next_window += options.window_s;
      log.flush();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    closing = true;
  }
  cv.notify_all();
  for (auto& t : workers) t.join();
  sampling.store(false);
  sampler.join();
  report.duration_s = options.duration_s;

  // Windows by start time (TTFT) and end time (tokens/s).
  const int nwin = std::max(1, static_cast<int>(options.duration_s / options.window_s + 0.999));
  std::vector<std::vector<double>> ttfts(nwin);
  std::vector<int64_t> tokens(nwin, 0), counts(nwin, 0);
  const double cancel_bound_ms = setup.max_cancel_seconds * 1000;
  for (const Record& r : records) {
    ++report.requests;
    // A request whose cancel came after it completed counts as completed
    // too (its tokens were checked like any other).
    if (r.cancelled) report.cancels.Add(r.code, r.cancel_to_end_ms, cancel_bound_ms);
    if (r.ok) {
      ++report.completed;
    } else if (!r.cancelled) {
      ++report.failed;
    }
    const int ws = std::min(nwin - 1, static_cast<int>(r.start_s / options.window_s));
    const int we = std::min(nwin - 1, static_cast<int>(r.end_s / options.window_s));
    ++counts[ws];
    if (r.ttft_ms >= 0 && !r.cancelled) ttfts[ws].push_back(r.ttft_ms);
    tokens[we] += r.tokens;
  }
  log << "soak: window  requests  p50_ttft_ms  p99_ttft_ms  tokens/s" << std::endl;
  for (int w = 0; w < nwin; ++w) {
    SoakWindow win;
    win.start_s = w * options.window_s;
    win.requests = counts[w];
    win.p50_ttft_ms = internal::Percentile(ttfts[w], 0.50);
    win.p99_ttft_ms = internal::Percentile(ttfts[w], 0.99);
    win.tokens_per_s = static_cast<double>(tokens[w]) / options.window_s;
    report.windows.push_back(win);
    log << absl::StrFormat("soak: %5.0fs  %8d  %11.1f  %11.1f  %8.1f\n", win.start_s, win.requests,
                           win.p50_ttft_ms, win.p99_ttft_ms, win.tokens_per_s);
  }
  if (report.cancels.slow > 0) {
    report.problems.push_back(
        absl::StrFormat("%d cancels landed mid-request but their streams took over %.0f ms to end",
                        report.cancels.slow, cancel_bound_ms));
  }
  for (const auto& [name, ts] : rss_t) {
    std::vector<double> x, y;
    for (size_t i = 0; i < ts.size(); ++i) {
      if (ts[i] < options.warmup_s) continue;
      x.push_back(ts[i]);
      y.push_back(rss_mib[name][i]);
    }
    report.rss_slope_mib_per_10min[name] = LeastSquaresSlope(x, y) * 600.0;
    report.rss_last_mib[name] = rss_mib[name].empty() ? 0 : rss_mib[name].back();
    report.threads_max[name] = threads_max[name];
    if (options.max_rss_slope > 0 && name != "kvstore" &&
        report.rss_slope_mib_per_10min[name] > options.max_rss_slope) {
      report.problems.push_back(absl::StrFormat("%s RSS grows %.2f MiB per 10 min (limit %.2f)",
                                                name, report.rss_slope_mib_per_10min[name],
                                                options.max_rss_slope));
    }
    log << absl::StrFormat(
        "soak: rss %-12s last %.1f MiB, slope %+.3f MiB per 10 min (%d samples after %.0fs), "
        "threads at most %d\n",
        name, report.rss_last_mib[name], report.rss_slope_mib_per_10min[name], x.size(),
        options.warmup_s, report.threads_max[name]);
  }

  // Everything the run cancelled or finished must be released.
  internal::IdleState idle = internal::WaitIdle(
      cluster, std::chrono::milliseconds(static_cast<int64_t>(setup.drain_seconds * 1000)));
  if (!idle.idle) report.leaks = idle.detail;

  // Cancel-to-freed probes, one request at a time on the idle cluster: the
  // time from sending Cancel to every worker reporting no session and no KV
  // bytes (Info RPC, polled).
  std::vector<double> freed;
  if (idle.idle) {
    ClusterSetup probe_setup = setup;
    probe_setup.cancel_fraction = 1.0;
    auto probe_load = internal::MixedWorkload::Create(probe_setup, report.seed ^ 0x5eed);
    if (!probe_load.ok()) return probe_load.status();
    if (absl::Status s = (*probe_load)->RegisterPrefixes(cluster); !s.ok()) return s;
    std::mt19937_64 rng(report.seed);
    internal::WorkerProbe probe(cluster);
    for (int k = 0;
         k < options.cancel_probes * 4 && static_cast<int>(freed.size()) < options.cancel_probes;
         ++k) {
      internal::RequestSpec spec = (*probe_load)->Draw(1000000 + k);
      spec.cancel = true;
      spec.cancel_by_rpc = true;
      spec.cancel_point = static_cast<double>(rng() % 1000) / 1000.0;
      spec.cancel_after_ms = static_cast<int>(rng() % 20);
      spec.request.set_max_new_tokens(setup.max_new_tokens);
      spec.request.set_ignore_eos(true);
      const internal::Outcome out = (*probe_load)->Run(spec, client, stub.get());
      if (!out.cancelled || out.status.error_code() != grpc::StatusCode::CANCELLED) continue;
      const auto limit = Clock::now() + std::chrono::seconds(30);
      bool ok = false;
      while (Clock::now() < limit) {
        if (probe.Idle()) {
          ok = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (!ok) {
        report.problems.push_back(
            absl::StrCat("cancel probe ", k, ": workers not idle 30 s after Cancel"));
        break;
      }
      freed.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - out.cancel_at).count());
    }
  }
  report.cancel_probes = static_cast<int>(freed.size());
  report.p50_cancel_to_freed_ms = internal::Percentile(freed, 0.50);
  report.p99_cancel_to_freed_ms = internal::Percentile(freed, 0.99);
  if (report.leaks.empty()) {
    idle = internal::WaitIdle(
        cluster, std::chrono::milliseconds(static_cast<int64_t>(setup.drain_seconds * 1000)));
    if (!idle.idle) report.leaks = idle.detail;
  }
  for (const std::string& p : report.problems) log << "soak: " << p << std::endl;
  cluster.Stop();  // a crash on the way down counts too
  report.crashes = internal::CrashReports(log_dir);
  for (const std::string& c : report.crashes) log << "soak: daemon crash: " << c << std::endl;
  if (report.ok() && options.setup.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(log_dir, ec);
  } else if (!report.ok()) {
    log << "soak: daemon logs kept in " << log_dir << std::endl;
  }
  return report;
}

}  // namespace vc::chaos
