#include "services/chaos/internal/cluster_ops.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/decode/full_decode.h"
#include "common/rpc/rpc.h"
#include "httplib.h"
#include "services/local/workload.h"
#include "vericache/v1/kvstore.grpc.pb.h"
#include "vericache/v1/worker.grpc.pb.h"

namespace vc::chaos::internal {

namespace pb = ::vericache::v1;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// Sum of every sample of `metric` (all label sets) in a Prometheus text page.
double SumMetric(const std::string& page, const std::string& metric) {
  double sum = 0;
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (!StartsWith(line, metric)) continue;
    const char next = line.size() > metric.size() ? line[metric.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    sum += std::strtod(line.c_str() + space + 1, nullptr);
  }
  return sum;
}

absl::StatusOr<std::string> Scrape(const std::string& hostport) {
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError("bad metrics address " + hostport);
  httplib::Client client(hostport.substr(0, colon), std::atoi(hostport.c_str() + colon + 1));
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET http://", hostport, "/metrics failed"));
  }
  return res->body;
}

}  // namespace

std::vector<std::string> CrashReports(const std::string& log_dir) {
  // Bounded: a daemon that reports the same error in a loop fills its log,
  // not the summary.
  constexpr size_t kMaxCrashReports = 100;
  // The first line of each kind of report; a report's later lines (its
  // stack) match none of these.
  static constexpr std::string_view kMarkers[] = {
      "*** SIG",                  // services/common/daemon.cc's crash reporter
      "ERROR: AddressSanitizer",  // ASan
      "ERROR: LeakSanitizer",
      ": runtime error: ",         // UBSan
      "WARNING: ThreadSanitizer",  // TSan
      "terminate called",          // std::terminate
      "Assertion `",               // glibc assert: "...: Assertion `x' failed."
      "Fatal glibc error",         // glibc's own checks
  };
  std::vector<std::string> reports;
  std::error_code ec;
  std::vector<std::filesystem::path> logs;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir, ec)) {
    if (entry.path().extension() == ".log") logs.push_back(entry.path());
  }
  std::sort(logs.begin(), logs.end());
  for (const auto& path : logs) {
    std::ifstream in(path);
    std::string line;
    while (reports.size() < kMaxCrashReports && std::getline(in, line)) {
      for (std::string_view marker : kMarkers) {
        if (line.find(marker) == std::string::npos) continue;
        // Bounded: a line of a report, not a whole log.
        if (line.size() > 300) line = line.substr(0, 300) + "...";
        reports.push_back(absl::StrCat(path.filename().string(), ": ", line));
        break;
      }
    }
  }
  return reports;
}

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return absl::StrCat("CODE_", static_cast<int>(code));
  }
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

// --- DaemonControl ---------------------------------------------------------

DaemonControl::DaemonControl(local::LocalCluster* cluster) : cluster_(cluster) {}

DaemonControl::~DaemonControl() {
  std::vector<std::string> paused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, pid] : paused_) paused.push_back(name);
  }
  for (const auto& name : paused) (void)Resume(name);
}

pid_t DaemonControl::Pid(const std::string& name) const {
  const local::Endpoint* ep = cluster_->Find(name);
  return ep ? ep->pid : -1;
}

absl::Status DaemonControl::Kill(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_.erase(name);
  }
  return cluster_->Kill(name);
}

absl::Status DaemonControl::Restart(const std::string& name) { return cluster_->Restart(name); }

absl::Status DaemonControl::Pause(const std::string& name) {
  const pid_t pid = Pid(name);
  if (pid <= 0) return absl::NotFoundError(absl::StrCat("no running daemon ", name));
  if (kill(pid, SIGSTOP) != 0) return absl::InternalError(std::strerror(errno));
  std::lock_guard<std::mutex> lock(mu_);
  paused_[name] = pid;
  return absl::OkStatus();
}

absl::Status DaemonControl::Resume(const std::string& name) {
  pid_t pid = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = paused_.find(name);
    if (it == paused_.end()) return absl::OkStatus();
    pid = it->second;
    paused_.erase(it);
  }
  if (kill(pid, SIGCONT) != 0) return absl::InternalError(std::strerror(errno));
  return absl::OkStatus();
}

// --- idle checks -------------------------------------------------------------

IdleState CheckIdle(const local::LocalCluster& cluster) {
  IdleState st;
  std::vector<std::string> held;
  const auto rpc_timeout = std::chrono::seconds(5);
  for (const local::Endpoint& ep : cluster.endpoints()) {
    const bool verifier = StartsWith(ep.name, "verifier");
    const bool drafter = StartsWith(ep.name, "drafter");
    if (verifier || drafter) {
      auto channel = rpc::MakeChannel(cluster.internal(ep.address), 4 << 20);
      pb::WorkerInfoRequest req;
      pb::WorkerInfoResponse resp;
      auto ctx = rpc::ContextWithTimeout(cluster.internal(ep.address), rpc_timeout);
      const grpc::Status s = verifier ? pb::Verifier::NewStub(channel)->Info(ctx.get(), req, &resp)
                                      : pb::Drafter::NewStub(channel)->Info(ctx.get(), req, &resp);
      if (!s.ok()) {
        held.push_back(absl::StrCat(ep.name, " Info: ", s.error_message()));
      } else if (resp.sessions() != 0 || resp.kv_bytes() != 0) {
        held.push_back(absl::StrCat(ep.name, " holds ", resp.sessions(), " sessions, ",
                                    resp.kv_bytes(), " KV bytes (Info)"));
      }
      if (!ep.metrics.empty()) {
        absl::StatusOr<std::string> page = Scrape(ep.metrics);
        if (!page.ok()) {
          held.push_back(absl::StrCat(ep.name, " ", page.status().message()));
        } else {
          const double sessions = SumMetric(*page, "vericache_worker_sessions");
          const double kv = SumMetric(*page, "vericache_worker_kv_bytes");
          if (sessions != 0 || kv != 0) {
            held.push_back(absl::StrFormat("%s holds %g sessions, %g KV bytes (/metrics)", ep.name,
                                           sessions, kv));
          }
        }
      }
    } else if (ep.name == "kvstore") {
      auto channel = rpc::MakeChannel(cluster.internal(ep.address), 4 << 20);
      pb::StatRequest req;
      pb::StatResponse resp;
      auto ctx = rpc::ContextWithTimeout(cluster.internal(ep.address), rpc_timeout);
      const grpc::Status s = pb::KvStore::NewStub(channel)->Stat(ctx.get(), req, &resp);
      if (!s.ok()) {
        held.push_back(absl::StrCat("kvstore Stat: ", s.error_message()));
      } else if (resp.open_puts() != 0 || resp.staged_bytes() != 0) {
        held.push_back(absl::StrCat("kvstore holds ", resp.open_puts(), " open puts, ",
                                    resp.staged_bytes(), " staged bytes"));
      }
    } else if (ep.name == "coordinator") {
      const rpc::ClientConfig client = cluster.client();
      auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(client, 4 << 20));
      pb::ClusterStatusRequest req;
      pb::ClusterStatusResponse resp;
      auto ctx = rpc::ContextWithTimeout(client, rpc_timeout);
      const grpc::Status s = stub->ClusterStatus(ctx.get(), req, &resp);
      if (!s.ok()) {
        held.push_back(absl::StrCat("coordinator ClusterStatus: ", s.error_message()));
      } else if (resp.active_requests() != 0 || resp.queued_requests() != 0) {
        held.push_back(absl::StrCat("coordinator has ", resp.active_requests(), " active, ",
                                    resp.queued_requests(), " queued requests"));
      }
      if (!ep.metrics.empty()) {
        absl::StatusOr<std::string> page = Scrape(ep.metrics);
        if (page.ok() && SumMetric(*page, "vericache_active_requests") != 0) {
          held.push_back("coordinator /metrics: vericache_active_requests != 0");
        }
      }
    }
  }
  st.idle = held.empty();
  for (size_t i = 0; i < held.size(); ++i) st.detail += (i ? "; " : "") + held[i];
  return st;
}

IdleState WaitIdle(const local::LocalCluster& cluster, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds poll) {
  const auto deadline = Clock::now() + timeout;
  IdleState st = CheckIdle(cluster);
  while (!st.idle && Clock::now() < deadline) {
    std::this_thread::sleep_for(poll);
    st = CheckIdle(cluster);
  }
  return st;
}

WorkerProbe::WorkerProbe(const local::LocalCluster& cluster) {
  for (const local::Endpoint& ep : cluster.endpoints()) {
    if (StartsWith(ep.name, "verifier")) {
      verifier_cfg_.push_back(cluster.internal(ep.address));
      verifiers_.push_back(pb::Verifier::NewStub(rpc::MakeChannel(verifier_cfg_.back(), 4 << 20)));
    } else if (StartsWith(ep.name, "drafter")) {
      drafter_cfg_.push_back(cluster.internal(ep.address));
      drafters_.push_back(pb::Drafter::NewStub(rpc::MakeChannel(drafter_cfg_.back(), 4 << 20)));
    }
  }
}

bool WorkerProbe::Idle() {
  pb::WorkerInfoRequest req;
  for (size_t i = 0; i < verifiers_.size(); ++i) {
    pb::WorkerInfoResponse resp;
    auto ctx = rpc::ContextWithTimeout(verifier_cfg_[i], std::chrono::seconds(5));
    const grpc::Status s = verifiers_[i]->Info(ctx.get(), req, &resp);
    if (!s.ok() || resp.sessions() != 0 || resp.kv_bytes() != 0) return false;
  }
  for (size_t i = 0; i < drafters_.size(); ++i) {
    pb::WorkerInfoResponse resp;
    auto ctx = rpc::ContextWithTimeout(drafter_cfg_[i], std::chrono::seconds(5));
    const grpc::Status s = drafters_[i]->Info(ctx.get(), req, &resp);
    if (!s.ok() || resp.sessions() != 0 || resp.kv_bytes() != 0) return false;
  }
  return true;
}

namespace {

// The number after `field` (e.g. "VmRSS:") in /proc/<pid>/status.
absl::StatusOr<double> StatusField(pid_t pid, const char* field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  if (!in) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (StartsWith(line, field)) return std::strtod(line.c_str() + std::strlen(field), nullptr);
  }
  return absl::NotFoundError(absl::StrCat("no ", field, " for ", pid));
}

}  // namespace

absl::StatusOr<double> RssMiB(pid_t pid) {
  VC_ASSIGN_OR_RETURN(const double kib, StatusField(pid, "VmRSS:"));
  return kib / 1024.0;
}

absl::StatusOr<int> ThreadCount(pid_t pid) {
  VC_ASSIGN_OR_RETURN(const double threads, StatusField(pid, "Threads:"));
  return static_cast<int>(threads);
}

// --- the workload ------------------------------------------------------------

namespace {
constexpr int kPrefixes = 2;
constexpr int kPrefixTokens = 96;  // three 32-token chunks

struct Compressor {
  const char* name;
  double ratio;
  int bits;
};
constexpr Compressor kCompressors[] = {
    {"snapkv", 0.3, 0}, {"int8", 0, 0}, {"kivi", 0, 4}, {"streamingllm", 0.5, 0}};
}  // namespace

const char* MixedWorkload::IngestVariants() { return "snapkv:0.3,int8,kivi:4"; }

absl::StatusOr<std::unique_ptr<MixedWorkload>> MixedWorkload::Create(const ClusterSetup& setup,
                                                                     uint64_t seed) {
  auto w = std::unique_ptr<MixedWorkload>(new MixedWorkload());
  w->setup_ = setup;
  w->seed_ = seed;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(setup.model);
  if (!model.ok()) return model.status();
  w->model_ = std::move(*model);
  EngineOptions eo;
  eo.backend.threads = 1;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*w->model_, eo);
  if (!engine.ok()) return engine.status();
  w->engine_ = std::move(*engine);
  const int need = kPrefixTokens + 16 + setup.max_new_tokens;
  if (need > w->model_->config().max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-new-tokens too large for the model's context (",
                     w->model_->config().max_seq_len, " tokens)"));
  }
  for (int p = 0; p < kPrefixes; ++p) {
    absl::StatusOr<std::vector<int32_t>> text =
        local::ModelTextPrompt(*w->engine_, 5 + p, kPrefixTokens);
    if (!text.ok()) return text.status();
    w->prefixes_.push_back(*text);
  }
  w->prefix_ids_.assign(kPrefixes, "");
  return w;
}

absl::Status MixedWorkload::RegisterPrefixes(const local::LocalCluster& cluster) {
  for (size_t p = 0; p < prefixes_.size(); ++p) {
    std::string error;
    prefix_ids_[p] = local::RegisterPrefix(cluster.client(), prefixes_[p], &error);
    if (prefix_ids_[p].empty())
      return absl::UnavailableError("registering a prefix failed: " + error);
  }
  return absl::OkStatus();
}

RequestSpec MixedWorkload::Draw(int64_t index) const {
  // Each request is a function of (seed, index): reruns draw the same mix.
  std::mt19937_64 rng(seed_ ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(index + 1)));
  auto uniform = [&](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(rng);
  };
  auto pick = [&](int n) {
    return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng));
  };
  const int vocab = model_->config().vocab_size;
  RequestSpec spec;
  pb::GenerateRequest& req = spec.request;
  req.set_request_id(absl::StrFormat("chaos-%x-%d", seed_, index));
  const double m = uniform(0, 1);
  req.set_mode(m < 0.5    ? pb::MODE_VERICACHE
               : m < 0.75 ? pb::MODE_FULL_REMOTE
                          : pb::MODE_FULL_LOCAL);
  if (req.mode() == pb::MODE_VERICACHE) {
    const Compressor& c = kCompressors[pick(4)];
    req.set_compressor(c.name);
    req.set_ratio(c.ratio);
    req.set_bits(c.bits);
    const int lens[] = {0, 4, 8};
    req.set_draft_len(lens[pick(3)]);
  }
  // Prompt: a shared prefix (registered id, or the same leading tokens) or
  // a distinct one.
  const double p = uniform(0, 1);
  std::vector<int32_t> suffix;
  const int suffix_len = 4 + pick(13);
  for (int i = 0; i < suffix_len; ++i) suffix.push_back(3 + pick(vocab - 3));
  if (p < 0.6) {
    const int which = pick(kPrefixes);
    spec.prompt = prefixes_[which];
    spec.prompt.insert(spec.prompt.end(), suffix.begin(), suffix.end());
    if (p < 0.3 && !prefix_ids_[which].empty()) {
      req.set_prefix_id(prefix_ids_[which]);
      for (int32_t t : suffix) req.add_suffix_ids(t);
    } else {
      for (int32_t t : spec.prompt) req.add_prompt_ids(t);
    }
  } else {
    spec.prompt = {1};
    const int len = 24 + pick(80);
    for (int i = 0; i < len; ++i) spec.prompt.push_back(3 + pick(vocab - 3));
    for (int32_t t : spec.prompt) req.add_prompt_ids(t);
  }
  req.set_max_new_tokens(4 + pick(std::max(1, setup_.max_new_tokens - 3)));
  req.set_ignore_eos(uniform(0, 1) < 0.5);
  const double s = uniform(0, 1);
  if (s >= 0.4) {
    auto* sc = req.mutable_sampling();
    sc->set_mode(s < 0.75 ? pb::SamplingConfig::SEEDED : pb::SamplingConfig::REJECTION);
    sc->set_temperature(0.9f);
    sc->set_top_k(40);
    sc->set_top_p(0.95f);
    sc->set_seed(rng() % 100000);
  }
  // Rejection sampling through drafts is distribution-identical, not
  // token-identical; without drafts it is seeded sampling.
  spec.exact =
      !(req.sampling().mode() == pb::SamplingConfig::REJECTION && req.mode() == pb::MODE_VERICACHE);
  spec.cancel = uniform(0, 1) < setup_.cancel_fraction;
  spec.cancel_by_rpc = uniform(0, 1) < 0.5;
  spec.cancel_point = uniform(0, 1);
  spec.cancel_after_ms = pick(20);
  spec.shape = absl::StrCat(req.max_new_tokens(), "/", req.ignore_eos(), "/",
                            req.sampling().mode() == pb::SamplingConfig::GREEDY ? 0 : 1, "/",
                            req.sampling().seed(), "/");
  for (int32_t t : spec.prompt) absl::StrAppend(&spec.shape, t, ",");
  return spec;
}

Outcome MixedWorkload::Run(const RequestSpec& spec, const rpc::ClientConfig& coordinator,
                           pb::Coordinator::Stub* stub) {
  Outcome out;
  // The cancel point in tokens: [0, expected - 1], so it comes before the
  // last token (the request still running) unless one round delivers the
  // rest at once or the reference length was only a guess.
  int64_t cancel_after_tokens = 0;
  if (spec.cancel) {
    const int64_t expected = ExpectedTokens(spec);
    cancel_after_tokens =
        std::clamp<int64_t>(static_cast<int64_t>(spec.cancel_point * static_cast<double>(expected)),
                            0, std::max<int64_t>(0, expected - 1));
  }
  auto ctx =
      rpc::ContextWithTimeout(coordinator, std::chrono::seconds(setup_.request_timeout_seconds));
  const auto start = Clock::now();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int64_t streamed = 0;  // mirrors out.streamed.size() under mu
  Clock::time_point cancel_at{};
  int64_t cancelled_at_tokens = -1;
  std::thread canceller;
  if (spec.cancel) {
    canceller = std::thread([&] {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done || streamed >= cancel_after_tokens; });
      if (done) return;
      if (cancel_after_tokens == 0 &&
          cv.wait_for(lock, std::chrono::milliseconds(spec.cancel_after_ms),
                      [&] { return done; })) {
        return;
      }
      cancel_at = Clock::now();
      cancelled_at_tokens = streamed;
      lock.unlock();
      if (spec.cancel_by_rpc) {
        // Before the first token the coordinator may not have recorded the
        // request yet (existed = false): try again while the stream is open.
        for (int attempt = 0; attempt < 400; ++attempt) {
          pb::CancelRequest creq;
          creq.set_request_id(spec.request.request_id());
          pb::CancelResponse cresp;
          auto cctx = rpc::ContextWithTimeout(coordinator, std::chrono::seconds(10));
          const grpc::Status s = stub->Cancel(cctx.get(), creq, &cresp);
          if (!s.ok() || cresp.existed()) break;  // a failed Cancel leaves a completed request
          lock.lock();
          const bool ended = cv.wait_for(lock, std::chrono::milliseconds(5), [&] { return done; });
          lock.unlock();
          if (ended) break;
        }
      } else {
        ctx->TryCancel();
      }
    });
  }
  auto reader = stub->Generate(ctx.get(), spec.request);
  pb::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.final()) {
      out.tokens.assign(msg.totals().tokens().begin(), msg.totals().tokens().end());
    } else if (msg.tokens_size() > 0) {
      if (out.client_ttft_ms < 0) {
        out.client_ttft_ms =
            std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      }
      out.streamed.insert(out.streamed.end(), msg.tokens().begin(), msg.tokens().end());
      if (spec.cancel) {
        {
          std::lock_guard<std::mutex> lock(mu);
          streamed = static_cast<int64_t>(out.streamed.size());
        }
        cv.notify_all();
      }
    }
  }
  out.status = reader->Finish();
  const auto end = Clock::now();
  out.seconds = std::chrono::duration<double>(end - start).count();
  if (canceller.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
    canceller.join();
    if (cancel_at != Clock::time_point{}) {
      out.cancelled = true;
      out.cancel_at = cancel_at;
      out.cancel_after_tokens = cancelled_at_tokens;
      out.cancel_to_end_ms = std::chrono::duration<double, std::milli>(end - cancel_at).count();
    }
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> MixedWorkload::Reference(const RequestSpec& spec) {
  const pb::GenerateRequest& req = spec.request;
  std::lock_guard<std::mutex> lock(engine_mu_);
  auto it = references_.find(spec.shape);
  if (it == references_.end()) {
    DecodeOptions d;
    d.max_new_tokens = req.max_new_tokens();
    d.ignore_eos = req.ignore_eos();
    if (req.sampling().mode() != pb::SamplingConfig::GREEDY) {
      d.sampling.temperature = req.sampling().temperature();
      d.sampling.top_k = req.sampling().top_k();
      d.sampling.top_p = req.sampling().top_p();
      d.sampling.seed = req.sampling().seed();
    }
    absl::StatusOr<DecodeResult> r = DecodeFull(*engine_, spec.prompt, d);
    if (!r.ok()) return r.status();
    it = references_.emplace(spec.shape, r->tokens).first;
  }
  return it->second;
}

int64_t MixedWorkload::ExpectedTokens(const RequestSpec& spec) {
  if (spec.request.ignore_eos()) return spec.request.max_new_tokens();
  absl::StatusOr<std::vector<int32_t>> ref = Reference(spec);
  return ref.ok() ? static_cast<int64_t>(ref->size()) : spec.request.max_new_tokens();
}

std::string MixedWorkload::Check(const RequestSpec& spec, const Outcome& out) {
  const pb::GenerateRequest& req = spec.request;
  const int vocab = model_->config().vocab_size;
  if (out.status.ok() && out.tokens != out.streamed) {
    return absl::StrCat(req.request_id(), ": final tokens (", out.tokens.size(),
                        ") differ from the streamed ones (", out.streamed.size(), ")");
  }
  for (int32_t t : out.streamed) {
    if (t < 0 || t >= vocab)
      return absl::StrCat(req.request_id(), ": token ", t, " outside the vocabulary");
  }
  if (static_cast<int64_t>(out.streamed.size()) > req.max_new_tokens()) {
    return absl::StrCat(req.request_id(), ": ", out.streamed.size(), " tokens > max_new_tokens ",
                        req.max_new_tokens());
  }
  if (!spec.exact) {
    if (out.status.ok() && req.ignore_eos() &&
        static_cast<int64_t>(out.tokens.size()) != req.max_new_tokens()) {
      return absl::StrCat(req.request_id(), ": ", out.tokens.size(),
                          " tokens with ignore_eos, wanted ", req.max_new_tokens());
    }
    return "";
  }
  absl::StatusOr<std::vector<int32_t>> reference = Reference(spec);
  if (!reference.ok()) {
    return absl::StrCat(req.request_id(),
                        ": reference decoding failed: ", reference.status().message());
  }
  const std::vector<int32_t>& ref = *reference;
  const std::vector<int32_t>& got = out.status.ok() ? out.tokens : out.streamed;
  const bool match =
      out.status.ok() ? got == ref
                      : got.size() <= ref.size() && std::equal(got.begin(), got.end(), ref.begin());
  if (match) return "";
  size_t i = 0;
  while (i < got.size() && i < ref.size() && got[i] == ref[i]) ++i;
  return absl::StrCat(req.request_id(), " (mode ", pb::Mode_Name(req.mode()), ", ",
                      req.compressor(), "): ", got.size(), " tokens, full KV ", ref.size(),
                      ", first difference at ", i,
                      out.status.ok() ? "" : " (streamed before a failure)");
}

}  // namespace vc::chaos::internal
