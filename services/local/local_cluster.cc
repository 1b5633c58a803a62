#include "services/local/local_cluster.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/base/stop_signals.h"
#include "common/http/httplib.h"
#include "common/kvstore/kv_cipher.h"
#include "common/kvstore/seal.h"
#include "common/rpc/rpc.h"
#include "nlohmann/json.hpp"

namespace vc::local {
namespace {

namespace fs = std::filesystem;

// Every running child of every LocalCluster in this process, and the
// clusters' own temporary data dirs, so that StopClustersOnSignal can reach
// them from its thread. A pid leaves the set before it is reaped (ReapChild):
// until then it cannot be reused, so a signal to a member never reaches
// another process.
struct ChildRegistry {
  std::mutex mu;
  std::set<pid_t> pids;
  std::set<std::string> temp_dirs;
};

ChildRegistry& Registry() {
  static auto* registry = new ChildRegistry();  // never destroyed: used up to _Exit
  return *registry;
}

// Whether child `pid` has ended (waiting for that when `block`), leaving it
// unreaped.
bool HasEnded(pid_t pid, bool block) {
  siginfo_t info{};
  int r;
  do {
    r = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
  } while (r < 0 && errno == EINTR);
  return r < 0 || info.si_pid != 0;  // ECHILD: not (or no longer) a child of ours
}

// Reaps child `pid` once it has ended (waiting for that when `block`): its
// wait status, -1 if it was not a child of ours, nullopt while it runs.
std::optional<int> ReapChild(pid_t pid, bool block) {
  if (!HasEnded(pid, block)) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(Registry().mu);
    Registry().pids.erase(pid);
  }
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  return r == pid ? status : -1;
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  ReapChild(pid, /*block=*/true);
}

std::string SelfDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

// Reads one line from `fd` within `timeout` (the daemon's "listening" line).
absl::StatusOr<std::string> ReadLine(int fd, std::chrono::steady_clock::time_point deadline,
                                     const std::string& who) {
  std::string line;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(who, " did not report its address in time"));
    }
    fd_set set;
    FD_ZERO(&set);
    FD_SET(fd, &set);
    timeval tv{static_cast<time_t>(left.count() / 1000),
               static_cast<suseconds_t>((left.count() % 1000) * 1000)};
    const int ready = select(fd + 1, &set, nullptr, nullptr, &tv);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char c;
    const ssize_t n = read(fd, &c, 1);
    if (n <= 0) return absl::UnavailableError(absl::StrCat(who, " exited before it was ready"));
    if (c == '\n') return line;
    line.push_back(c);
    if (line.size() > 4096) return absl::InternalError(absl::StrCat(who, " printed a line too long"));
  }
}

// "<name> listening on HOST:PORT [data tcp HOST:PORT] [peer_data HOST:PORT]
// metrics HOST:PORT|disabled"
void ParseListening(const std::string& line, Endpoint* ep) {
  std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == "on") ep->address = words[i + 1];
    if (words[i] == "metrics" && words[i + 1] != "disabled") ep->metrics = words[i + 1];
    if (words[i] == "data" && i + 2 < words.size()) ep->data = words[i + 2];
    if (words[i] == "peer_data") ep->peer_data = words[i + 1];
  }
}

}  // namespace

std::string DefaultModelPath() {
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv("VC_MODELS_DIR")) candidates.push_back(fs::path(dir) / "stories260K.bin");
  // build/bin/vericache -> <repo>/../shared/models
  const fs::path self = SelfDir();
  candidates.push_back(self / "../../../shared/models/stories260K.bin");
  candidates.push_back(self / "../../shared/models/stories260K.bin");
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::exists(c, ec)) return fs::weakly_canonical(c, ec).string();
  }
  return "";
}

absl::StatusOr<Endpoint> LocalCluster::Spawn(const std::string& name, const std::string& role,
                                             const std::string& binary,
                                             const std::vector<std::string>& args,
                                             bool grpc_health) {
  const std::string path = (fs::path(bin_dir_) / binary).string();
  if (access(path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("daemon binary ", path, " not found (build it first)"));
  }
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  int err_fd = -1;
  if (!options_.log_dir.empty()) {
    const std::string log = (fs::path(options_.log_dir) / (name + ".log")).string();
    err_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  std::vector<std::string> argv_s = {path};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  auto extra = options_.extra_flags.find(binary);
  if (extra != options_.extra_flags.end()) {
    argv_s.insert(argv_s.end(), extra->second.begin(), extra->second.end());
  }
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  cpu_set_t cpu_set;
  CPU_ZERO(&cpu_set);
  bool pin = false;
  if (auto it = options_.cpus.find(role); it != options_.cpus.end() && !it->second.empty()) {
    for (int cpu : it->second) CPU_SET(cpu, &cpu_set);
    pin = true;
  }
  // The registry's lock is held across fork so that a stop signal either
  // finds the new pid registered or comes before the fork (and ends the
  // process while holding the lock). The child never returns into this
  // scope: it execs or _exits.
  std::unique_lock<std::mutex> registered(Registry().mu);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    // The launcher blocks SIGTERM/SIGINT to wait for them; children start
    // with a clean mask.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (pin) sched_setaffinity(0, sizeof(cpu_set), &cpu_set);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  Registry().pids.insert(pid);
  registered.unlock();
  close(out[1]);
  if (err_fd >= 0) close(err_fd);
  Endpoint ep;
  ep.name = name;
  ep.pid = pid;
  // Recorded at once so Stop() reaps it even if it never gets ready.
  size_t index = endpoints_.size();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (endpoints_[i].name == name) index = i;
  }
  if (index == endpoints_.size()) {
    endpoints_.push_back(ep);
    children_.emplace_back();
  } else {
    endpoints_[index].pid = pid;
  }
  Child& child = children_[index];
  child.role = role;
  child.binary = binary;
  child.args = args;
  child.grpc_health = grpc_health;
  child.started = std::chrono::steady_clock::now();
  // Later starts come back on the ports this one got.
  auto pin_ports = [&] {
    for (std::string& a : child.args) {
      if (a.starts_with("--listen=")) a = "--listen=" + ep.address;
      if (a.starts_with("--metrics-listen=") && !ep.metrics.empty()) a = "--metrics-listen=" + ep.metrics;
      if (a.starts_with("--data-listen=") && !ep.data.empty()) a = "--data-listen=" + ep.data;
      if (a.starts_with("--peer-data-listen=") && !ep.peer_data.empty()) {
        a = "--peer-data-listen=" + ep.peer_data;
      }
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + options_.start_timeout;
  absl::StatusOr<std::string> line = ReadLine(out[0], deadline, binary);
  if (!line.ok()) {
    close(out[0]);
    return line.status();
  }
  ParseListening(*line, &ep);
  // Keep draining the daemon's stdout so it never blocks on a full pipe.
  std::thread([fd = out[0]] {
    char buf[256];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
  }).detach();
  if (ep.address.empty()) {
    return absl::InternalError(absl::StrCat(binary, " printed an unexpected line: ", *line));
  }
  ep.url = endpoints_[index].url;  // set by Start() for HTTP endpoints
  pin_ports();
  if (!grpc_health) {
    endpoints_[index] = ep;
    return ep;
  }
  // Ready means healthy over gRPC, not just bound (over mTLS when secure:
  // the client certificate works on every port).
  auto channel = rpc::MakeChannel(internal(ep.address), 4 << 20);
  absl::Status health = absl::UnavailableError("not checked");
  while (std::chrono::steady_clock::now() < deadline && !stopping_.load()) {
    health = rpc::CheckHealth(channel, std::chrono::milliseconds(1000));
    if (health.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!health.ok()) {
    return absl::UnavailableError(absl::StrCat(binary, " at ", ep.address,
                                               " is not healthy: ", health.message()));
  }
  endpoints_[index] = ep;
  return ep;
}

absl::Status LocalCluster::WaitHttpHealthy(const std::string& url) const {
  // Over TLS the check verifies the gateway's certificate against the
  // cluster CA by the address clients use, as the endpoints file promises.
  httplib::Client client(url);
  if (creds_) {
    client.set_ca_cert_path(creds_->ca.c_str());
    client.enable_server_certificate_verification(true);
  }
  client.set_connection_timeout(1, 0);
  client.set_read_timeout(5, 0);
  const auto deadline = std::chrono::steady_clock::now() + options_.start_timeout;
  std::string last = "not checked";
  while (std::chrono::steady_clock::now() < deadline) {
    httplib::Result res = client.Get("/health");
    if (res && res->status == 200) return absl::OkStatus();
    last = res ? absl::StrCat("HTTP ", res->status, " ", res->body) : httplib::to_string(res.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat("vc-openai at ", url, " is not healthy: ", last));
}

// A throwaway seal key pair for this cluster in `dir`: the private key
// (PEM, mode 0600) for the workers that write KV, the trust file (its
// public key) for the store and the readers.
static absl::Status WriteSealKeyPair(const std::string& dir, std::string* key_path,
                                     std::string* trust_path) {
  VC_ASSIGN_OR_RETURN(auto signer, kvstore::SealSigner::Generate());
  VC_ASSIGN_OR_RETURN(std::string pem, signer->PrivateKeyPem());
  *key_path = (fs::path(dir) / "seal-key.pem").string();
  *trust_path = (fs::path(dir) / "seal-trust.txt").string();
  const int fd = ::open(key_path->c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", *key_path, ": ", std::strerror(errno)));
  }
  const bool written = ::write(fd, pem.data(), pem.size()) == static_cast<ssize_t>(pem.size());
  ::close(fd);
  std::ofstream trust(*trust_path, std::ios::trunc);
  trust << "# vericache local: seal public key (key id " << signer->key_id() << ")\n"
        << signer->PublicKeyHex() << "\n";
  if (!written || !trust.good()) {
    return absl::InternalError(absl::StrCat("cannot write the seal key pair in ", dir));
  }
  return absl::OkStatus();
}

// A random KV secret (kvstore::kKvSecretMinBytes raw bytes) at `path`,
// mode 0600 from its creation on.
static absl::Status WriteKvSecret(const std::string& path) {
  std::string secret(kvstore::kKvSecretMinBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()),
                 static_cast<int>(secret.size())) != 1) {
    return absl::InternalError("RAND_bytes failed making the KV secret");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  const bool written =
      ::write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size());
  ::close(fd);
  if (!written) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& o) {
  if (o.model.empty()) return absl::InvalidArgumentError("--model is required (no default model found)");
  if (o.kv_encryption && o.insecure) {
    return absl::InvalidArgumentError(
        "--kv-encryption needs the secure setup (keys are per authenticated tenant); drop "
        "--insecure");
  }
  if (o.verifiers < 1 || o.drafters < 1) {
    return absl::InvalidArgumentError("need at least one verifier and one drafter");
  }
  auto cluster = std::unique_ptr<LocalCluster>(new LocalCluster());
  cluster->options_ = o;
  cluster->bin_dir_ = o.bin_dir.empty() ? SelfDir() : o.bin_dir;
  if (o.data_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "vericache-local-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    cluster->data_dir_ = tmpl;
    cluster->own_data_dir_ = true;
    std::lock_guard<std::mutex> lock(Registry().mu);
    Registry().temp_dirs.insert(tmpl);
  } else {
    cluster->data_dir_ = o.data_dir;
  }
  if (!o.log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.log_dir, ec);
  }
  const std::string metrics = o.metrics ? "127.0.0.1:0" : "";
  auto fail = [&](absl::Status s) -> absl::Status {
    cluster->Stop(std::chrono::milliseconds(2000));
    return s;
  };
  // Every daemon's TLS flags (none when insecure).
  std::vector<std::string> tls_args;
  if (!o.insecure) {
    const std::string tls_dir = (fs::path(cluster->data_dir_) / "tls").string();
    std::error_code ec;
    fs::create_directories(tls_dir, ec);
    fs::permissions(tls_dir, fs::perms::owner_all, fs::perm_options::replace, ec);
    if (ec) return fail(absl::InternalError("cannot create " + tls_dir));
    absl::StatusOr<ClusterCredentials> creds = MakeClusterCredentials(tls_dir);
    if (!creds.ok()) return fail(creds.status());
    cluster->creds_ = *creds;
    tls_args = {"--tls-cert=" + creds->daemon.cert, "--tls-key=" + creds->daemon.key,
                "--tls-ca=" + creds->daemon.ca};
  }
  auto with_tls = [&](std::vector<std::string> args) {
    args.insert(args.end(), tls_args.begin(), tls_args.end());
    return args;
  };
  std::vector<std::string> kvstore_args = {
      "--listen=127.0.0.1:0",
      "--data-listen=127.0.0.1:0",
      "--data-dir=" + (fs::path(cluster->data_dir_) / "kvstore").string(),
      "--metrics-listen=" + metrics,
      "--data-plane=" + o.data_plane,
      absl::StrCat("--fast-link-bytes-per-second=", o.fast_link_bytes_per_second),
      absl::StrCat("--slow-link-bytes-per-second=", o.slow_link_bytes_per_second),
      absl::StrCat("--fast-link-latency-ms=", o.fast_link_latency_ms),
      absl::StrCat("--slow-link-latency-ms=", o.slow_link_latency_ms),
      absl::StrCat("--link-slot-seconds=", o.slot_ms > 0 ? o.slot_ms / 1000.0 : 0.01)};
  std::vector<std::string> verifier_seal, drafter_seal;
  if (o.seal_kv) {
    std::string key_path, trust_path;
    if (absl::Status s = WriteSealKeyPair(cluster->data_dir_, &key_path, &trust_path); !s.ok()) {
      return fail(s);
    }
    kvstore_args.push_back("--seal-trust=" + trust_path);
    verifier_seal = {"--seal-key=" + key_path, "--seal-trust=" + trust_path};
    drafter_seal = {"--seal-trust=" + trust_path};  // drafters only read KV
  }
  if (o.kv_encryption) {
    const std::string secret_path = (fs::path(cluster->data_dir_) / "kv-secret").string();
    if (absl::Status s = WriteKvSecret(secret_path); !s.ok()) return fail(s);
    verifier_seal.push_back("--kv-secret-file=" + secret_path);
    drafter_seal.push_back("--kv-secret-file=" + secret_path);
  }
  absl::StatusOr<Endpoint> store = cluster->Spawn("kvstore", "kvstore", "vc-kvstore", with_tls(kvstore_args));
  if (!store.ok()) return fail(store.status());
  std::vector<std::string> verifiers, drafters;
  for (int i = 0; i < o.verifiers; ++i) {
    const std::string name = i == 0 ? "verifier" : absl::StrCat("verifier-", i);
    std::vector<std::string> args = {
        "--listen=127.0.0.1:0", "--model=" + o.model, "--kvstore=" + store->address,
        "--data-plane=" + o.data_plane, "--metrics-listen=" + metrics,
        absl::StrCat("--threads=", o.worker_threads), "--backend=" + o.worker_backend,
        absl::StrCat("--prefix-aware=", o.prefix_aware ? "true" : "false"),
        absl::StrCat("--warmup-tokens=", o.warmup_tokens),
        // Peer rounds: the refresh rows cross the slow link from here.
        "--peer-data-listen=127.0.0.1:0",
        absl::StrCat("--slow-link-bytes-per-second=", o.slow_link_bytes_per_second),
        absl::StrCat("--slow-link-latency-ms=", o.slow_link_latency_ms)};
    if (!o.draft_model.empty()) args.push_back("--draft-model=" + o.draft_model);
    args.insert(args.end(), verifier_seal.begin(), verifier_seal.end());
    absl::StatusOr<Endpoint> ep = cluster->Spawn(name, "verifier", "vc-verifier", with_tls(args));
    if (!ep.ok()) return fail(ep.status());
    verifiers.push_back(ep->address);
  }
  for (int i = 0; i < o.drafters; ++i) {
    const std::string name = i == 0 ? "drafter" : absl::StrCat("drafter-", i);
    std::vector<std::string> args = {"--listen=127.0.0.1:0",
                                     "--model=" + o.model,
                                     "--kvstore=" + store->address,
                                     "--data-plane=" + o.data_plane,
                                     "--metrics-listen=" + metrics,
                                     absl::StrCat("--threads=", o.worker_threads),
                                     "--backend=" + o.worker_backend,
                                     absl::StrCat("--continuation-tokens=", o.continuation_tokens),
                                     "--draft-weights=" + o.draft_weights,
                                     absl::StrCat("--warmup-tokens=", o.warmup_tokens)};
    if (!o.draft_model.empty()) args.push_back("--draft-model=" + o.draft_model);
    args.insert(args.end(), drafter_seal.begin(), drafter_seal.end());
    absl::StatusOr<Endpoint> ep = cluster->Spawn(name, "drafter", "vc-drafter", with_tls(args));
    if (!ep.ok()) return fail(ep.status());
    drafters.push_back(ep->address);
  }
  std::vector<std::string> coord_args = {
      "--listen=127.0.0.1:0",
      "--kvstore=" + store->address,
      "--verifiers=" + absl::StrJoin(verifiers, ","),
      "--drafters=" + absl::StrJoin(drafters, ","),
      "--metrics-listen=" + metrics,
      absl::StrCat("--slot-ms=", o.slot_ms),
      absl::StrCat("--fast-link-bytes-per-second=", o.fast_link_bytes_per_second),
      absl::StrCat("--slow-link-bytes-per-second=", o.slow_link_bytes_per_second),
      absl::StrCat("--chunk-tokens=", o.chunk_tokens),
      "--ingest-variants=" + o.ingest_variants,
      absl::StrCat("--draft-len=", o.draft_len),
      absl::StrCat("--lossless-check-fraction=", o.lossless_check_fraction),
      absl::StrCat("--max-active-requests=", o.max_active_requests),
      absl::StrCat("--peer-rounds=", o.peer_rounds ? "true" : "false"),
      absl::StrCat("--leases=", o.leases ? "true" : "false")};
  if (o.lock_step) coord_args.push_back("--lock-step");
  coord_args = with_tls(coord_args);
  if (cluster->creds_) {
    coord_args.push_back("--api-keys-file=" + cluster->creds_->api_keys_file);
    coord_args.push_back("--cluster-secret-file=" + cluster->creds_->cluster_secret_file);
  }
  absl::StatusOr<Endpoint> coord = cluster->Spawn("coordinator", "coordinator", "vc-coordinator", coord_args);
  if (!coord.ok()) return fail(coord.status());
  if (o.openai) {
    std::vector<std::string> args = {"--listen=127.0.0.1:0", "--coordinator=" + coord->address,
                                     "--model=" + o.model, "--metrics-listen=" + metrics};
    if (!o.tokenizer.empty()) args.push_back("--tokenizer=" + o.tokenizer);
    if (!o.chat_template.empty()) args.push_back("--chat-template=" + o.chat_template);
    // The gateway is a client of the public port: TLS to it, no certificate
    // of its own (each HTTP caller's API key rides on its calls). Its own
    // listener is public too: HTTPS with the daemons' certificate (SANs
    // 127.0.0.1 and localhost), no client certificate asked for.
    if (cluster->creds_) {
      args.push_back("--coordinator-tls-ca=" + cluster->creds_->ca);
      args.push_back("--tls-cert=" + cluster->creds_->daemon.cert);
      args.push_back("--tls-key=" + cluster->creds_->daemon.key);
    }
    absl::StatusOr<Endpoint> gw = cluster->Spawn("openai", "openai", "vc-openai", args, /*grpc_health=*/false);
    if (!gw.ok()) return fail(gw.status());
    const std::string url = absl::StrCat(cluster->creds_ ? "https://" : "http://", gw->address);
    if (absl::Status s = cluster->WaitHttpHealthy(url); !s.ok()) return fail(s);
    cluster->endpoints_.back().url = url + "/v1";
  }
  if (o.supervise) cluster->supervisor_ = std::thread([c = cluster.get()] { c->Supervise(); });
  return cluster;
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::Stop(std::chrono::milliseconds grace) {
  // No restarts from here on: the supervisor is gone before anything is
  // signalled.
  // Set before taking mu_: a restart in progress holds it and watches this
  // flag to give up early.
  stopping_.store(true);
  cv_.notify_all();
  if (supervisor_.joinable()) supervisor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  // Coordinator first (it releases sessions), store last.
  for (auto it = endpoints_.rbegin(); it != endpoints_.rend(); ++it) {
    if (it->pid > 0) kill(it->pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto& ep : endpoints_) {
    if (ep.pid <= 0) continue;
    while (!ReapChild(ep.pid, /*block=*/false)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        KillAndReap(ep.pid);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ep.pid = -1;
  }
  if (own_data_dir_ && !data_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(data_dir_, ec);
    own_data_dir_ = false;
    std::lock_guard<std::mutex> registry_lock(Registry().mu);
    Registry().temp_dirs.erase(data_dir_);
  }
}

const Endpoint* LocalCluster::Find(const std::string& name) const {
  for (const auto& ep : endpoints_) {
    if (ep.name == name) return &ep;
  }
  return nullptr;
}

std::string LocalCluster::coordinator() const {
  const Endpoint* ep = Find("coordinator");
  return ep ? ep->address : "";
}

rpc::ClientConfig LocalCluster::client(const std::string& tenant) const {
  rpc::ClientConfig c(coordinator());
  if (creds_) {
    c.tls.ca = creds_->ca;  // server TLS: the public port asks for no certificate
    auto it = creds_->api_keys.find(tenant);
    if (it != creds_->api_keys.end()) c.api_key = it->second;
  }
  return c;
}

rpc::ClientConfig LocalCluster::internal(const std::string& address) const {
  rpc::ClientConfig c(address);
  if (creds_) c.tls = creds_->client;
  return c;
}

std::string LocalCluster::EndpointsJson() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& ep : endpoints_) {
    j[ep.name] = ep.url.empty() ? ep.address : ep.url;
    if (!ep.metrics.empty()) j[ep.name + "_metrics"] = ep.metrics;
    if (ep.name == "kvstore" && !ep.data.empty()) j["kvstore_data"] = ep.data;
  }
  if (creds_) {
    j["tls_ca"] = creds_->ca;
    j["api_keys"] = creds_->api_keys;
  }
  return j.dump();
}

absl::Status LocalCluster::Kill(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    Endpoint& ep = endpoints_[i];
    if (ep.name == name && ep.pid > 0) {
      KillAndReap(ep.pid);
      ep.pid = -1;
      if (options_.supervise && !stopping_.load()) {
        // An unexpected death as far as the supervisor is concerned.
        Child& child = children_[i];
        const auto now = std::chrono::steady_clock::now();
        ScheduleRestart(&child, now);
        child.exit_reason = "killed by Kill()";
        cv_.notify_all();
      }
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("no running daemon '", name, "'"));
}

std::chrono::milliseconds LocalCluster::ScheduleRestart(Child* child,
                                                        std::chrono::steady_clock::time_point died) {
  const auto now = std::chrono::steady_clock::now();
  // A daemon that ran a good while is not crash-looping: start over.
  if (died != std::chrono::steady_clock::time_point{} &&
      died - child->started >= options_.restart_backoff_reset) {
    child->crashes = 0;
  }
  std::chrono::milliseconds delay = options_.restart_backoff;
  for (int i = 0; i < child->crashes && delay < options_.restart_backoff_max; ++i) delay *= 2;
  delay = std::min(delay, options_.restart_backoff_max);
  ++child->crashes;
  child->restart_pending = true;
  child->restart_at = now + delay;
  return delay;
}

absl::Status LocalCluster::RestartLocked(size_t i) {
  if (stopping_.load()) return absl::FailedPreconditionError("the cluster is stopping");
  Endpoint& ep = endpoints_[i];
  if (ep.pid > 0) {
    KillAndReap(ep.pid);
    ep.pid = -1;
  }
  const Child child = children_[i];  // Spawn rewrites the slot
  absl::StatusOr<Endpoint> started = Spawn(ep.name, child.role, child.binary, child.args, child.grpc_health);
  children_[i].crashes = child.crashes;
  children_[i].restart_pending = false;
  if (!started.ok()) {
    // Not healthy in time: do not leave a half-started daemon behind.
    if (endpoints_[i].pid > 0) {
      KillAndReap(endpoints_[i].pid);
      endpoints_[i].pid = -1;
    }
    return started.status();
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Restart(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (endpoints_[i].name == name) return RestartLocked(i);
  }
  return absl::NotFoundError(absl::StrCat("no daemon '", name, "' in this cluster"));
}

void LocalCluster::Supervise() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_.load()) {
    // Polls the children a few times a second (WNOHANG on our own pids
    // only: the embedding process may have other children).
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (stopping_.load()) break;
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      Endpoint& ep = endpoints_[i];
      Child& child = children_[i];
      if (ep.pid > 0) {
        const std::optional<int> status = ReapChild(ep.pid, /*block=*/false);
        if (!status) continue;
        ep.pid = -1;
        if (*status >= 0 && WIFSIGNALED(*status)) {
          child.exit_reason = absl::StrCat("killed by signal ", WTERMSIG(*status));
        } else if (*status >= 0 && WIFEXITED(*status)) {
          child.exit_reason = absl::StrCat("exited with status ", WEXITSTATUS(*status));
        } else {
          child.exit_reason = "gone";
        }
        ScheduleRestart(&child, now);
      }
      if (ep.pid > 0 || !child.restart_pending || now < child.restart_at) continue;
      const std::string reason = child.exit_reason;
      const int attempt = child.crashes;
      absl::Status s = RestartLocked(i);
      if (stopping_.load()) break;
      if (s.ok()) {
        supervisor_restarts_.fetch_add(1);
        std::fprintf(stderr, "vericache local: %s %s; restarted on %s (pid %d, restart %d in a row)\n",
                     ep.name.c_str(), reason.c_str(), ep.address.c_str(), static_cast<int>(ep.pid),
                     attempt);
      } else {
        const auto delay = ScheduleRestart(&child, std::chrono::steady_clock::time_point{});
        std::fprintf(stderr, "vericache local: %s %s; restart failed (%s), next try in %lld ms\n",
                     ep.name.c_str(), reason.c_str(), std::string(s.message()).c_str(),
                     static_cast<long long>(delay.count()));
      }
    }
  }
}

void StopClustersOnSignal(std::string tool, std::chrono::milliseconds grace) {
  const sigset_t stop = BlockSignals({SIGTERM, SIGINT, SIGHUP});
  std::thread([stop, tool = std::move(tool), grace] {
    const int sig = WaitForSignal(stop);
    ChildRegistry& registry = Registry();
    // Held until the process ends: no cluster forks or reaps a child from
    // here on, so every pid below stays ours.
    registry.mu.lock();
    std::fprintf(stderr, "%s: signal %d (%s); stopping %zu daemon(s)\n", tool.c_str(), sig,
                 strsignal(sig), registry.pids.size());
    for (pid_t pid : registry.pids) {
      kill(pid, SIGTERM);
      kill(pid, SIGCONT);
    }
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (pid_t pid : registry.pids) {
      while (!HasEnded(pid, /*block=*/false)) {
        if (std::chrono::steady_clock::now() >= deadline) {
          kill(pid, SIGKILL);
          HasEnded(pid, /*block=*/true);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    for (const std::string& dir : registry.temp_dirs) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
    std::fflush(nullptr);
    std::_Exit(128 + sig);
  }).detach();
}

}  // namespace vc::local
