// The discrete-event engine behind Simulate() (see simulator.h).
//
// Events carry a time and a type; at equal times slot ticks run first (so
// the reloads of a slot are on the link before any GPU starts its next
// iteration), then link completions, messages, GPU completions and arrivals.
// After every event each idle GPU starts an iteration if it has work.
#include "common/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/base/percentile.h"
#include "common/base/status_macros.h"
#include "common/scheduler/prefix_policy.h"
#include "common/scheduler/ring_scheduler.h"

namespace vc::sim {
namespace {

// Capacity that stands for "unlimited" GPU memory in the scheduler's rings.
constexpr double kUnlimitedBytes = 1e18;
// Ticks in a row without any other event before the run is declared stuck.
constexpr int64_t kMaxIdleTicks = 200000;
constexpr double kEwmaWeight = 0.2;

double Uniform01(std::mt19937_64& rng) { return (rng() >> 11) * 0x1.0p-53; }

enum class EventType { kSlotTick = 0, kLinkDone = 1, kMessage = 2, kGpuDone = 3, kArrival = 4 };
enum class Message { kDraftsArrived, kResultArrived };
enum class TransferKind { kStartup, kReload, kRows, kRefresh };

struct Event {
  double t = 0;
  EventType type = EventType::kSlotTick;
  int64_t seq = 0;
  int64_t a = 0;  // link / gpu / request id
  int b = 0;      // message kind
  bool operator>(const Event& o) const {
    if (t != o.t) return t > o.t;
    if (type != o.type) return type > o.type;
    return seq > o.seq;
  }
};

enum class Phase {
  kWaiting,      // arrived, not admitted
  kStartup,      // initial KV on its way to the GPU
  kDrafting,     // drafting the round's x drafts
  kAwaitVerify,  // drafts done, waiting for the full KV / the verifier
  kResult,       // verified, the result travelling back (remote-prefix)
  kRefresh,      // result in, the accepted rows crossing the slow link (remote-prefix)
  kBarrier,      // lock-step: waiting for every request's verify
  kDecoding,     // full mode
  kDone,
};

struct Req {
  int64_t id = 0;
  double arrival = 0;
  int64_t prompt = 0;
  int64_t target = 0;
  int64_t generated = 0;
  Phase phase = Phase::kWaiting;
  int gpu = -1;       // long-context GPU, drafter, or full-mode GPU
  int verifier = -1;  // remote-prefix: GPU index of the booked verifier
  int round_drafts = 0;
  int drafts_done = 0;
  int cont_drafts = 0;  // speculative continuation drafts made during the verify
  bool needs_booking = false;
  bool booked = false;
  bool reload_issued = false;
  bool kv_landed = false;
  bool drafts_at_verifier = false;
  bool in_iteration = false;
  Booking booking;
  double drafts_ready_t = -1;  // drafts done (remote: arrived at the verifier)
  double kv_landed_t = -1;
  double booking_since = -1;
  double transient_bytes = 0;
  double reserved_bytes = 0;  // resident reservation on its GPU (its own part when sharing)
  int prefix = -1;            // index of its stored prefix (shared_prefixes > 0)
  bool loads_prefix = false;  // its startup loads its GPU's resident copy of the prefix
  int64_t copy = -1;          // booking whose full-KV copy its verify uses
  double own_transient = 0;   // its part of that copy (all of it unless the prefix is shared)
  bool rows_pending = false;  // a joined round's own rows still on the link
  int pending_accepted = 0;
  double result_t = -1;       // its round's result reached the drafter (kRefresh)
  double startup_since = -1;  // its startup fetch was booked (kStartup, slow link)
  double first_token_t = -1;
  double finish_t = -1;
};

struct Transfer {
  int64_t req = -1;
  double bytes = 0;
  TransferKind kind = TransferKind::kStartup;
  int64_t copy = -1;  // kReload: the booking whose copy lands
  // kRefresh, and kStartup over a slow link: its slow-link booking, released
  // when it lands (-1: not booked).
  int64_t booking = -1;
};

// A full-KV copy on a verifier (or long-context GPU) for one booking, used by
// the booking's round and by the rounds that joined it (PrefixPolicy counts
// them, as it does the coordinator's).
struct Copy {
  double shared_bytes = 0;  // the prefix part (0 unless shared), freed with the last user
  bool landed = false;
  std::vector<int64_t> members;
};

struct Link {
  std::string name;
  double bps = 0;  // 0 = unlimited
  std::deque<Transfer> queue;
  bool busy = false;
  double start = 0;
  Transfer current;
  LinkReport report;
  double busy_mark = 0;  // busy seconds at the previous time sample
  double BusyAt(double t) const { return report.busy_s + (busy ? t - start : 0); }
};

enum class Role { kLongContext, kDrafter, kVerifier, kFull };

struct Gpu {
  Role role = Role::kLongContext;
  std::string name;
  int link = -1;        // simulated link that feeds it (startup loads; long-context reloads)
  int sched_gpu = -1;   // index in the scheduler's GPUs (long-context, verifier)
  int sched_link = -1;  // scheduler link of its reloads (long-context, per-verifier)
  // A GPU behind a slow link (a drafter; in full mode too): the scheduler
  // link of that link (startup fetches, KV refresh); -1 for the others.
  int slow_ring = -1;
  bool busy = false;
  double iter_start = 0;
  std::vector<int64_t> members;  // requests it drafts / decodes
  std::vector<int64_t> pending;  // verifier: requests booked on it
  std::vector<int64_t> batch_draft, batch_verify;
  double reserved = 0;   // admission reservations (resident KV at its largest)
  double transient = 0;  // full-KV copies resident now
  double ewma_iter = 0;
  double idle_since = -1;
  GpuReport report;
};

const char* RoleName(Role r) {
  switch (r) {
    case Role::kLongContext:
      return "long-context";
    case Role::kDrafter:
      return "drafter";
    case Role::kVerifier:
      return "verifier";
    case Role::kFull:
      return "full";
  }
  return "?";
}

Percentiles Summarise(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / v.size();
  p.p50 = NearestRank(v, 0.50);
  p.p90 = NearestRank(v, 0.90);
  p.p99 = NearestRank(v, 0.99);
  p.max = v.back();
  return p;
}

class Simulation {
 public:
  explicit Simulation(const SimConfig& c) : c_(c), rng_(c.seed) {}

  absl::StatusOr<SimResult> Run();

 private:
  bool vericache() const { return c_.mode == SimConfig::Mode::kVeriCache; }
  bool remote() const { return c_.topology == SimConfig::Topology::kRemotePrefix; }
  bool lock_step() const { return vericache() && c_.schedule == SimConfig::Schedule::kLockStep; }
  double FreeHbm() const {
    return c_.hbm_bytes > 0 ? c_.hbm_bytes - c_.weight_bytes : kUnlimitedBytes;
  }
  double Kv(double tokens) const { return tokens * c_.kv_bytes_per_token; }
  double Grown(const Req& r) const { return c_.grow_kv ? static_cast<double>(r.generated) : 0.0; }
  double FullKv(const Req& r) const { return Kv(r.prompt + Grown(r)); }
  double CompressedKv(const Req& r) const { return Kv(c_.ratio * r.prompt + Grown(r)); }
  // Device bytes of one verify: the accepted sequence plus the pass's x+1 rows.
  double RoundTransient(const Req& r) const {
    return Kv(r.prompt + (c_.grow_kv ? r.generated + r.round_drafts + 1 : 0));
  }
  double FullAtEnd(const Req& r) const {
    return Kv(r.prompt + (c_.grow_kv ? r.target + c_.draft_len + 1 : 0));
  }
  double CompressedAtEnd(const Req& r) const {
    return Kv(c_.ratio * r.prompt + (c_.grow_kv ? r.target : 0));
  }
  double Resident(const Req& r) const { return vericache() ? CompressedKv(r) : FullKv(r); }
  double ResidentAtEnd(const Req& r) const {
    return vericache() ? CompressedAtEnd(r) : FullAtEnd(r);
  }
  // Prefix sharing: requests over one prefix share its copies.
  bool sharing() const { return c_.shared_prefixes > 0 && c_.prefix_sharing; }
  std::string PrefixName(const Req& r) const { return absl::StrCat("prefix:", r.prefix); }
  // The part of a request's resident KV that is its prefix's (shared on a GPU).
  double PrefixResident(const Req& r) const {
    return Kv((vericache() ? c_.ratio : 1.0) * static_cast<double>(r.prompt));
  }
  double OwnResident(const Req& r) const {
    return sharing() ? Resident(r) - PrefixResident(r) : Resident(r);
  }
  double OwnResidentAtEnd(const Req& r) const {
    return sharing() ? ResidentAtEnd(r) - PrefixResident(r) : ResidentAtEnd(r);
  }
  // Resident KV on GPU `gi`: its members' own parts plus the shared copies.
  double ResidentOn(size_t gi) const;

  void Push(double t, EventType type, int64_t a, int b = 0) {
    events_.push({t, type, seq_++, a, b});
  }

  absl::Status Setup();
  double EstimateIteration() const;
  double AutoSlot() const;
  absl::Status NewRequest(double t);
  absl::Status TryAdmit();
  int PickGpu(const Req& r) const;
  void StartDecoding(Req& r);
  void StartRound(Req& r, int carried);
  absl::Status TryBook(Req& r);
  absl::Status RetryBookings();
  void IssueReloads();
  // Books `t` on the slow-link ring of r's GPU and sends it at the booking's
  // first slot (at once if that is the current one).
  absl::Status BookSlowTransfer(const Req& r, Transfer t);
  absl::Status SendRefresh(Req& r, double bytes);
  void IssueSlowTransfers();
  void Enqueue(int link, const Transfer& t);
  void StartLink(int link);
  absl::Status OnLinkDone(int link);
  absl::Status OnMessage(int64_t req, Message m);
  absl::Status OnGpuDone(int gpu);
  void StartIterations();
  absl::Status ApplyResult(Req& r, int accepted);
  // The drafter takes the verified round: its continuation drafts survive or
  // not, and the next round starts (or the lock-step barrier is reached).
  void Commit(Req& r, int accepted);
  // Continuation drafts the next round carries (the rest are wasted).
  int SettleContinuation(Req& r, int accepted);
  absl::Status Finish(Req& r);
  void Join(Req& r, int gi, const SharedBooking& shared);
  void Landed(Req& r);
  absl::Status DropCopyUser(int64_t copy, Gpu& v);
  void CheckBarrier();
  void UpdateCapacity(int gpu);
  void Sample();
  void NotePeaks(Gpu& g);
  // No request admitted, nothing booked, queued or moving.
  bool Idle() const;

  const SimConfig c_;
  std::mt19937_64 rng_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  int64_t seq_ = 0;
  double now_ = 0;
  std::unique_ptr<RingScheduler> sched_;
  // The coordinator's prefix rules, over the simulated GPUs (gpus_ indices).
  std::unique_ptr<PrefixPolicy> policy_;
  std::map<int64_t, Copy> copies_;  // by booking id
  int64_t next_booking_ = 0;
  // Resident prefix copies still on their way to a GPU: the requests that
  // wait for them before decoding.
  std::map<std::pair<std::string, int>, std::vector<int64_t>> loading_;
  std::mt19937_64 prefix_rng_;          // the stored prefixes and each request's pick
  std::vector<int64_t> prefix_tokens_;  // per stored prefix
  std::vector<bool> verifiers_live_;
  std::vector<int> sched_link_to_sim_;
  std::vector<int> sched_gpu_to_sim_;
  std::vector<Link> links_;
  std::vector<Gpu> gpus_;
  std::vector<Req> reqs_;
  std::deque<int64_t> waiting_;
  std::deque<int64_t> to_book_;
  std::multimap<int64_t, int64_t> reloads_due_;  // first slot -> request
  // First slot -> booked slow-link transfer (startup fetch, KV refresh); in
  // booking order within a slot.
  std::multimap<int64_t, Transfer> slow_due_;
  std::vector<double> arrivals_;  // Poisson arrival times
  int64_t created_ = 0;
  int64_t scheduled_ = 0;  // closed loop: arrivals pushed so far
  int64_t finished_ = 0;
  double slot_ = 0;
  double last_sample_t_ = 0;
  int64_t idle_ticks_ = 0;
  // Totals.
  double stall_s_ = 0, booking_wait_s_ = 0, reload_link_s_ = 0;
  int64_t verifies_ = 0, accepted_sum_ = 0, tokens_sum_ = 0, drafted_ = 0, wasted_ = 0, kept_ = 0;
  int64_t lock_step_rounds_ = 0;
  int64_t memory_deferred_ = 0;
  double startup_bytes_ = 0, reload_bytes_ = 0;
  double refresh_bytes_ = 0, refresh_wait_s_ = 0, startup_wait_s_ = 0;
  int64_t shared_joins_ = 0, shared_resident_ = 0;
  int64_t tentative_ = 0;  // own bookings given up for a join (not admissions)
  bool barrier_dirty_ = false;
  std::vector<TimeSample> samples_;
};

double Simulation::EstimateIteration() const {
  // Requests one drafting GPU holds at once, as far as the configuration says.
  const double prompt = c_.prompt_tokens.Mean();
  const double out = c_.grow_kv ? c_.output_tokens.Mean() / 2 : 0;
  const double k = Kv(prompt + out);
  const int drafting_gpus =
      remote() ? (vericache() ? c_.drafters : c_.drafters + c_.verifiers) : c_.gpus;
  double batch = static_cast<double>(c_.arrival == SimConfig::Arrival::kClosed
                                         ? std::min<int64_t>(c_.concurrency, c_.requests)
                                         : c_.requests) /
                 drafting_gpus;
  if (c_.max_batch > 0) batch = std::min<double>(batch, c_.max_batch);
  const double per_request = vericache() ? Kv(c_.ratio * prompt + out) : k;
  if (c_.hbm_bytes > 0 && per_request > 0) {
    batch = std::min(batch,
                     std::max(1.0, std::floor((FreeHbm() - (vericache() ? k : 0)) / per_request)));
  }
  batch = std::max(1.0, batch);
  double bytes = c_.weight_bytes + batch * per_request;
  double tokens = batch;
  if (vericache() && !remote()) {
    bytes += batch * k / c_.draft_len;  // the verifies of the iteration, on average
    tokens += batch;
  }
  double t = bytes / c_.hbm_bytes_per_second;
  if (c_.flops > 0) t = std::max(t, 2 * c_.params * tokens / c_.flops);
  return std::max(t + c_.iteration_overhead_s, 1e-9);
}

double Simulation::AutoSlot() const {
  // A reload books whole slots plus one remainder, and the ring never puts a
  // second reload into a slot's leftover, so a reload of l seconds in slots
  // of t wastes up to t - (l mod t) of link time. The default slot is
  // therefore the reload time cut into whole pieces no longer than an
  // iteration: l / ceil(l / T_iter).
  const double t_iter = EstimateIteration();
  if (!vericache()) return t_iter;
  const double bps = remote() ? c_.fast_link_bytes_per_second : c_.host_link_bytes_per_second;
  if (bps <= 0) return t_iter;
  const double reload =
      Kv(c_.prompt_tokens.Mean() + (c_.grow_kv ? c_.output_tokens.Mean() / 2 : 0)) / bps;
  if (!(reload > 0)) return t_iter;
  return reload / std::ceil(reload / t_iter);
}

absl::Status Simulation::Setup() {
  // Links and GPUs.
  auto add_link = [&](std::string name, double bps) {
    Link l;
    l.name = name;
    l.bps = bps;
    l.report.name = std::move(name);
    l.report.bytes_per_second = bps;
    links_.push_back(std::move(l));
    return static_cast<int>(links_.size()) - 1;
  };
  auto add_gpu = [&](Role role, std::string name, int link) {
    Gpu g;
    g.role = role;
    g.name = name;
    g.link = link;
    g.report.name = std::move(name);
    g.report.role = RoleName(role);
    gpus_.push_back(std::move(g));
    return static_cast<int>(gpus_.size()) - 1;
  };
  RingSchedulerOptions so;
  so.lock_step = lock_step();
  so.window_slots = c_.window_slots;
  so.pack_reloads = c_.pack_reloads;
  so.links.clear();
  if (!remote()) {
    for (int g = 0; g < c_.gpus; ++g) {
      const int l = add_link(absl::StrCat("pcie", g), c_.host_link_bytes_per_second);
      const int id =
          add_gpu(vericache() ? Role::kLongContext : Role::kFull, absl::StrCat("gpu", g), l);
      if (vericache()) {
        // Each GPU's PCIe lanes are its own: a per-verifier link.
        RingLink rl;
        rl.name = links_[l].name;
        rl.bytes_per_second = c_.host_link_bytes_per_second;
        rl.sharing = c_.gpus == 1 ? RingLink::Sharing::kShared : RingLink::Sharing::kPerVerifier;
        rl.gpu = g;
        so.links.push_back(rl);
        sched_link_to_sim_.push_back(l);
        so.gpus.push_back(RingGpu{gpus_[id].name, static_cast<int64_t>(FreeHbm())});
        sched_gpu_to_sim_.push_back(id);
        gpus_[id].sched_gpu = g;
        gpus_[id].sched_link = g;
      }
    }
  } else {
    // Fast links first: their indices are the scheduler's link indices.
    std::vector<int> fast;
    if (c_.fast_link_shared) {
      fast.assign(c_.verifiers, add_link("fast", c_.fast_link_bytes_per_second));
    } else {
      for (int v = 0; v < c_.verifiers; ++v) {
        fast.push_back(add_link(absl::StrCat("fast", v), c_.fast_link_bytes_per_second));
      }
    }
    std::vector<int> slow;
    if (c_.slow_link_shared) {
      slow.assign(c_.drafters, add_link("slow", c_.slow_link_bytes_per_second));
    } else {
      for (int d = 0; d < c_.drafters; ++d) {
        slow.push_back(add_link(absl::StrCat("slow", d), c_.slow_link_bytes_per_second));
      }
    }
    std::vector<int> drafter_ids;
    drafter_ids.reserve(static_cast<size_t>(c_.drafters));
    for (int d = 0; d < c_.drafters; ++d) {
      drafter_ids.push_back(
          add_gpu(vericache() ? Role::kDrafter : Role::kFull, absl::StrCat("drafter", d), slow[d]));
    }
    for (int v = 0; v < c_.verifiers; ++v) {
      const int id = add_gpu(vericache() ? Role::kVerifier : Role::kFull,
                             absl::StrCat("verifier", v), fast[v]);
      if (vericache()) {
        so.gpus.push_back(RingGpu{gpus_[id].name, static_cast<int64_t>(FreeHbm())});
        sched_gpu_to_sim_.push_back(id);
        gpus_[id].sched_gpu = v;
      }
    }
    if (vericache()) {
      if (c_.fast_link_shared) {
        RingLink rl;
        rl.name = "fast";
        rl.bytes_per_second = c_.fast_link_bytes_per_second;
        so.links.push_back(rl);
        sched_link_to_sim_.push_back(fast[0]);
        for (int v = 0; v < c_.verifiers; ++v) gpus_[sched_gpu_to_sim_[v]].sched_link = 0;
      } else {
        for (int v = 0; v < c_.verifiers; ++v) {
          RingLink rl;
          rl.name = links_[fast[v]].name;
          rl.bytes_per_second = c_.fast_link_bytes_per_second;
          rl.sharing = RingLink::Sharing::kPerVerifier;
          rl.gpu = v;
          so.links.push_back(rl);
          sched_link_to_sim_.push_back(fast[v]);
          gpus_[sched_gpu_to_sim_[v]].sched_link = v;
        }
      }
    }
    // The slow links after the fast ones (alone in full mode), one ring per
    // simulated link, for link-only transfers (no verifier, no memory): the
    // startup fetches of the GPUs behind them and the KV refresh. Full mode
    // books them too: its GPUs behind a slow link fetch the full KV as
    // full_remote's drafters do, whose Open the coordinator books (RunRemote).
    for (int d = 0; d < c_.drafters; ++d) {
      const auto same = std::find(sched_link_to_sim_.begin(), sched_link_to_sim_.end(), slow[d]);
      if (same == sched_link_to_sim_.end()) {
        RingLink rl;
        rl.name = links_[slow[d]].name;
        rl.bytes_per_second = c_.slow_link_bytes_per_second;
        so.links.push_back(rl);
        sched_link_to_sim_.push_back(slow[d]);
      }
      gpus_[drafter_ids[d]].slow_ring = static_cast<int>(
          std::find(sched_link_to_sim_.begin(), sched_link_to_sim_.end(), slow[d]) -
          sched_link_to_sim_.begin());
    }
  }
  policy_ = std::make_unique<PrefixPolicy>(
      std::vector<int64_t>(gpus_.size(), static_cast<int64_t>(FreeHbm())));
  verifiers_live_.assign(static_cast<size_t>(c_.verifiers), true);
  if (c_.shared_prefixes > 0) {
    // A generator of its own, so the workload is the same with and without
    // sharing (the main one also draws acceptances, in event order).
    prefix_rng_.seed(c_.seed ^ 0x5eed5eedULL);
    for (int p = 0; p < c_.shared_prefixes; ++p) {
      prefix_tokens_.push_back(std::max<int64_t>(1, c_.prompt_tokens.Sample(prefix_rng_)));
    }
  }
  slot_ = c_.slot_seconds > 0 ? c_.slot_seconds : AutoSlot();
  for (Gpu& g : gpus_) g.ewma_iter = EstimateIteration();
  if (!so.links.empty()) {
    // Full mode books only link-only transfers, which hold no GPU memory;
    // the scheduler still wants a GPU (this one is never booked or reported).
    if (so.gpus.empty()) so.gpus.push_back(RingGpu{"unbooked", 1});
    so.slot_seconds = slot_;
    VC_ASSIGN_OR_RETURN(RingScheduler s, RingScheduler::Create(so));
    sched_ = std::make_unique<RingScheduler>(std::move(s));
  }
  // Arrivals.
  if (c_.arrival == SimConfig::Arrival::kPoisson) {
    double t = 0;
    for (int64_t i = 0; i < c_.requests; ++i) {
      t += -std::log(1 - Uniform01(rng_)) / c_.arrival_rate;
      Push(t, EventType::kArrival, i);
    }
  } else {
    for (; scheduled_ < std::min<int64_t>(c_.concurrency, c_.requests); ++scheduled_) {
      Push(0, EventType::kArrival, scheduled_);
    }
  }
  Push(0, EventType::kSlotTick, 0);
  return absl::OkStatus();
}

absl::Status Simulation::NewRequest(double t) {
  Req r;
  r.id = created_++;
  r.arrival = t;
  if (c_.shared_prefixes > 0) {
    r.prefix = static_cast<int>(prefix_rng_() % static_cast<uint64_t>(c_.shared_prefixes));
    r.prompt = prefix_tokens_[static_cast<size_t>(r.prefix)];
  } else {
    r.prompt = std::max<int64_t>(1, c_.prompt_tokens.Sample(rng_));
  }
  r.target = std::max<int64_t>(1, c_.output_tokens.Sample(rng_));
  // A request that could never fit would wait forever: refuse the config.
  const double free = FreeHbm();
  if (vericache()) {
    if (!remote() && CompressedAtEnd(r) + FullAtEnd(r) > free) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request of ", r.prompt, "+", r.target, " tokens needs ",
          CompressedAtEnd(r) + FullAtEnd(r),
          " bytes of KV on one GPU (compressed + one full copy) but only ", free, " are free"));
    }
    if (remote() && (FullAtEnd(r) > free || CompressedAtEnd(r) > free)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request of ", r.prompt, "+", r.target, " tokens: its KV (", FullAtEnd(r),
                       " bytes full) exceeds a GPU's free memory (", free, ")"));
    }
  } else if (FullAtEnd(r) > free) {
    return absl::InvalidArgumentError(
        absl::StrCat("request of ", r.prompt, "+", r.target, " tokens: its full KV (", FullAtEnd(r),
                     " bytes) exceeds a GPU's free memory (", free, ")"));
  }
  reqs_.push_back(r);
  waiting_.push_back(r.id);
  return absl::OkStatus();
}

int Simulation::PickGpu(const Req& r) const {
  const double free = FreeHbm();
  int best = -1;
  double best_load = std::numeric_limits<double>::max();
  for (size_t i = 0; i < gpus_.size(); ++i) {
    const Gpu& g = gpus_[i];
    if (g.role == Role::kVerifier) continue;
    if (c_.max_batch > 0 && static_cast<int>(g.members.size()) >= c_.max_batch) continue;
    // A prefix already resident here costs nothing more (one copy per GPU).
    const bool resident = sharing() && policy_->IsResident(PrefixName(r), static_cast<int>(i));
    double need = g.reserved + policy_->ResidentBytes(static_cast<int>(i)) +
                  (resident ? OwnResidentAtEnd(r) : ResidentAtEnd(r));
    if (g.role == Role::kLongContext) {
      // Room for the full-KV copies its verifies keep in flight: with B
      // requests, each verifying every x+1 iterations and holding its copy
      // for S reload iterations plus the verify, ceil(B*(S+1)/(x+1)) on
      // average (at least one; the largest copy on this GPU counts for all).
      // Admitting past that starves the reloads of memory and throughput
      // falls as the batch grows.
      double largest = FullAtEnd(r);
      for (int64_t m : g.members) largest = std::max(largest, FullAtEnd(reqs_[m]));
      const double bps = links_[g.link].bps;
      const double reload_iters = bps > 0 ? std::ceil(largest / bps / g.ewma_iter - 1e-9) : 1.0;
      const double batch = static_cast<double>(g.members.size() + 1);
      const int period = c_.continuation ? c_.draft_len : c_.draft_len + 1;
      const double copies =
          std::max(1.0, std::ceil(batch * (std::max(1.0, reload_iters) + 1) / period - 1e-9));
      need += copies * largest;
    }
    if (need > free) continue;
    double load = static_cast<double>(g.members.size());
    if (c_.max_batch > 0) load /= c_.max_batch;
    // Full mode, remote-prefix: on ties the GPU behind the faster link wins.
    const double bps = links_[g.link].bps;
    load += bps > 0 ? 1e-12 / bps : 0;
    if (load < best_load) {
      best_load = load;
      best = static_cast<int>(i);
    }
  }
  return best;
}

absl::Status Simulation::TryAdmit() {
  std::vector<int64_t> admitted;
  while (!waiting_.empty()) {
    Req& r = reqs_[waiting_.front()];
    const int g = PickGpu(r);
    if (g < 0) break;  // first come, first served: the head waits for room
    waiting_.pop_front();
    r.gpu = g;
    r.reserved_bytes = OwnResidentAtEnd(r);
    gpus_[g].reserved += r.reserved_bytes;
    if (sharing()) {
      r.loads_prefix = policy_->Hold(PrefixName(r), g, static_cast<int64_t>(PrefixResident(r)));
      if (!r.loads_prefix) ++shared_resident_;
    }
    gpus_[g].members.push_back(r.id);
    UpdateCapacity(g);
    admitted.push_back(r.id);
  }
  // Rounds are booked only once every admission of this instant has taken
  // its memory out of the ring's capacity.
  for (int64_t id : admitted) {
    Req& r = reqs_[id];
    if (c_.startup_transfer) {
      r.phase = Phase::kStartup;
      if (sharing() && !r.loads_prefix) {
        // The prefix is resident (or on its way): only the request's own
        // rows, none at admission, so it decodes once the copy is there.
        auto loading = loading_.find({PrefixName(r), r.gpu});
        if (loading != loading_.end()) {
          loading->second.push_back(r.id);
        } else {
          StartDecoding(r);
        }
        continue;
      }
      if (r.loads_prefix) loading_[{PrefixName(r), r.gpu}];
      startup_bytes_ += Resident(r);
      const Transfer t{r.id, Resident(r), TransferKind::kStartup};
      if (gpus_[r.gpu].slow_ring >= 0) {
        // Over a slow link: booked on its ring, as the coordinator books the
        // drafter's Open (BookedDrafterOpen), so a burst of new requests
        // queues there with the refreshes.
        r.startup_since = now_;
        VC_RETURN_IF_ERROR(BookSlowTransfer(r, t));
      } else {
        Enqueue(gpus_[r.gpu].link, t);
      }
    } else {
      StartDecoding(r);
    }
  }
  return absl::OkStatus();
}

void Simulation::UpdateCapacity(int gpu) {
  const Gpu& g = gpus_[gpu];
  if (sched_ == nullptr || g.role != Role::kLongContext) return;
  // What the admitted requests' own KV leaves is the configured capacity;
  // the policy takes the resident prefix copies out of it.
  policy_->SetBaseCapacity(gpu, static_cast<int64_t>(std::max(0.0, FreeHbm() - g.reserved)));
  (void)sched_->SetMemoryCapacity(g.sched_gpu, policy_->CapacityLeft(gpu)).ok();
}

void Simulation::StartDecoding(Req& r) {
  if (!vericache()) {
    r.phase = Phase::kDecoding;
    return;
  }
  if (lock_step()) {
    r.phase = Phase::kBarrier;
    barrier_dirty_ = true;  // released after the event, once everyone is in
    return;
  }
  StartRound(r, 0);
}

void Simulation::StartRound(Req& r, int carried) {
  r.round_drafts = c_.draft_len;
  r.drafts_done = std::min(carried, r.round_drafts);
  r.cont_drafts = 0;
  r.kv_landed = false;
  r.reload_issued = false;
  r.drafts_at_verifier = false;
  r.drafts_ready_t = -1;
  r.kv_landed_t = -1;
  r.verifier = remote() ? -1 : r.gpu;
  if (r.drafts_done >= r.round_drafts) {
    r.phase = Phase::kAwaitVerify;
    r.drafts_ready_t = now_ + (remote() ? c_.rtt_s / 2 : 0);
    if (remote())
      Push(r.drafts_ready_t, EventType::kMessage, r.id, static_cast<int>(Message::kDraftsArrived));
  } else {
    r.phase = Phase::kDrafting;
  }
  r.needs_booking = true;
  r.booking_since = now_;
  to_book_.push_back(r.id);
  // Booked now if it fits; otherwise retried every slot.
  (void)TryBook(r).ok();
}

absl::Status Simulation::TryBook(Req& r) {
  if (!r.needs_booking || r.phase == Phase::kDone) return absl::OkStatus();
  const Gpu& drafter = gpus_[r.gpu];
  const int remaining = r.round_drafts - r.drafts_done;
  // When the drafts will be ready, and the slot that time falls in: the
  // verify slot d, whose start the reload must beat.
  const double ready = now_ + remaining * drafter.ewma_iter + (remote() ? c_.rtt_s / 2 : 0);
  const int64_t now_slot = sched_->now();
  const int64_t d = static_cast<int64_t>(std::floor(ready / slot_ + 1e-9));
  const int offset = static_cast<int>(std::clamp<int64_t>(d - now_slot, 1, 1 << 30));
  r.transient_bytes = RoundTransient(r);

  std::vector<int> candidates;
  if (!remote()) {
    candidates.push_back(r.gpu);
  } else if (c_.shared_prefixes > 0) {
    // The coordinator's placement: one verifier per prefix.
    const std::optional<int> v =
        PlaceByKey(PlacementKey(PrefixName(r), static_cast<uint64_t>(r.id)), verifiers_live_);
    if (v) candidates.push_back(sched_gpu_to_sim_[static_cast<size_t>(*v)]);
  } else {
    // Verifiers with the least booked memory first.
    for (int v = 0; v < c_.verifiers; ++v) candidates.push_back(sched_gpu_to_sim_[v]);
    std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
      return sched_->PeakMemoryBooked(gpus_[a].sched_gpu) <
             sched_->PeakMemoryBooked(gpus_[b].sched_gpu);
    });
  }
  for (int gi : candidates) {
    const Gpu& g = gpus_[gi];
    AdmitRequest a;
    a.id = next_booking_++;
    a.full_kv_bytes = static_cast<int64_t>(r.transient_bytes);
    a.target_offset = offset;
    a.min_offset = offset;
    a.link = g.sched_link;
    a.gpu = g.sched_gpu;
    // A booking of the prefix on this GPU whose verify is still ahead (the
    // copy stays until every joiner's verify, even one whose drafts come
    // later).
    std::optional<SharedBooking> shared;
    if (sharing() && !lock_step()) {
      shared =
          policy_->FindShared(PrefixName(r), gi, now_slot + 1, std::numeric_limits<int64_t>::max());
      if (shared && copies_.count(shared->booking_id) == 0) shared.reset();
      if (shared && PrefixPolicy::JoinsAtOnce(*shared, now_slot + offset)) {
        Join(r, gi, *shared);
        return absl::OkStatus();
      }
    }
    // Not what is left of the GPU's memory now (other bookings' reservations,
    // resident copies): retried next slot.
    const bool fits = a.full_kv_bytes <= policy_->CapacityLeft(gi) &&
                      a.full_kv_bytes <= sched_->options().gpus[a.gpu].transient_capacity_bytes;
    Admission adm;
    if (fits) {
      VC_ASSIGN_OR_RETURN(adm, sched_->Admit(a));
    }
    if (shared && PrefixPolicy::JoinsInsteadOf(*shared, adm)) {
      if (!adm.queued) {
        VC_RETURN_IF_ERROR(sched_->Release(adm.booking.id));
        ++tentative_;
      }
      Join(r, gi, *shared);
      return absl::OkStatus();
    }
    if (adm.queued) continue;
    r.booking = adm.booking;
    r.booked = true;
    r.needs_booking = false;
    r.verifier = gi;
    booking_wait_s_ += now_ - r.booking_since;
    Copy& copy = copies_[adm.booking.id];
    policy_->StartUsers(adm.booking.id);
    copy.shared_bytes = sharing() ? Kv(static_cast<double>(r.prompt)) : 0.0;
    copy.members = {r.id};
    r.copy = adm.booking.id;
    r.own_transient = r.transient_bytes - copy.shared_bytes;
    if (sharing()) policy_->NoteShared(PrefixName(r), gi, adm.booking);
    reloads_due_.emplace(r.booking.first_slot(), r.id);
    if (remote()) gpus_[gi].pending.push_back(r.id);
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

void Simulation::Join(Req& r, int gi, const SharedBooking& shared) {
  Copy& copy = copies_[shared.booking_id];
  // Tracked: FindShared offers only bookings whose verify is still ahead.
  (void)policy_->AddUser(shared.booking_id);
  copy.members.push_back(r.id);
  ++shared_joins_;
  r.booking = Booking{};
  r.booking.id = shared.booking_id;
  r.booking.verify_slot = shared.verify_slot;
  r.booked = true;
  r.needs_booking = false;
  r.reload_issued = true;  // nothing of its own for IssueReloads
  r.verifier = gi;
  r.copy = shared.booking_id;
  booking_wait_s_ += now_ - r.booking_since;
  Gpu& v = gpus_[gi];
  // Its own rows (the accepted sequence past the prefix and the pass's x+1)
  // join the copy; they move now, unbooked (small next to the prefix).
  r.own_transient = r.transient_bytes - copy.shared_bytes;
  v.transient += r.own_transient;
  NotePeaks(v);
  if (remote()) v.pending.push_back(r.id);
  const double rows = FullKv(r) - copy.shared_bytes;
  if (rows > 0) {
    r.rows_pending = true;
    reload_bytes_ += rows;
    Enqueue(sched_link_to_sim_[static_cast<size_t>(v.sched_link)],
            {r.id, rows, TransferKind::kRows});
  } else if (copy.landed) {
    Landed(r);
  }
}

void Simulation::Landed(Req& r) {
  r.kv_landed = true;
  r.kv_landed_t = now_;
}

absl::Status Simulation::DropCopyUser(int64_t id, Gpu& v) {
  auto it = copies_.find(id);
  if (it == copies_.end()) return absl::InternalError(absl::StrCat("no copy for booking ", id));
  if (!policy_->DropUser(id)) return absl::OkStatus();
  v.transient -= it->second.shared_bytes;
  copies_.erase(it);
  return sched_->Release(id);
}

absl::Status Simulation::RetryBookings() {
  std::deque<int64_t> still;
  while (!to_book_.empty()) {
    Req& r = reqs_[to_book_.front()];
    to_book_.pop_front();
    if (!r.needs_booking || r.phase == Phase::kDone) continue;
    VC_RETURN_IF_ERROR(TryBook(r));
    if (r.needs_booking) still.push_back(r.id);
  }
  to_book_ = std::move(still);
  return absl::OkStatus();
}

void Simulation::IssueReloads() {
  std::vector<int64_t> deferred;
  while (!reloads_due_.empty() && reloads_due_.begin()->first <= sched_->now()) {
    const int64_t id = reloads_due_.begin()->second;
    reloads_due_.erase(reloads_due_.begin());
    Req& r = reqs_[id];
    if (!r.booked || r.reload_issued) continue;
    Gpu& v = gpus_[r.verifier];
    // The plan can slip (a reload lands late, so a verify and its memory run
    // past the booked span), so memory is checked again before a copy starts,
    // as the long-context runtime does; a deferred reload is retried next slot.
    const double in_use = (v.role == Role::kLongContext ? v.reserved : 0.0) + v.transient;
    if (in_use + r.transient_bytes > FreeHbm()) {
      ++memory_deferred_;
      deferred.push_back(id);
      continue;
    }
    r.reload_issued = true;
    v.transient += r.transient_bytes;
    NotePeaks(v);
    reload_bytes_ += FullKv(r);
    Enqueue(sched_link_to_sim_[r.booking.link],
            {r.id, FullKv(r), TransferKind::kReload, r.booking.id});
  }
  for (int64_t id : deferred) reloads_due_.emplace(sched_->now() + 1, id);
}

absl::Status Simulation::BookSlowTransfer(const Req& r, Transfer t) {
  const Gpu& g = gpus_[r.gpu];
  TransferRequest tr;
  tr.id = next_booking_++;
  tr.bytes = static_cast<int64_t>(std::ceil(t.bytes));
  tr.link = g.slow_ring;
  // Mid-slot: only the rest of the current slot can carry it.
  tr.elapsed_seconds = std::clamp(now_ - static_cast<double>(sched_->now()) * slot_, 0.0, slot_);
  VC_ASSIGN_OR_RETURN(Booking b, sched_->BookTransfer(tr));
  t.booking = b.id;
  if (b.first_slot() <= sched_->now()) {
    Enqueue(g.link, t);
  } else {
    slow_due_.emplace(b.first_slot(), t);
  }
  return absl::OkStatus();
}

absl::Status Simulation::SendRefresh(Req& r, double bytes) {
  refresh_bytes_ += bytes;
  return BookSlowTransfer(r, {r.id, bytes, TransferKind::kRefresh});
}

void Simulation::IssueSlowTransfers() {
  while (!slow_due_.empty() && slow_due_.begin()->first <= sched_->now()) {
    const Transfer t = slow_due_.begin()->second;
    slow_due_.erase(slow_due_.begin());
    const Req& r = reqs_[t.req];
    if (t.kind == TransferKind::kStartup) startup_wait_s_ += now_ - r.startup_since;
    Enqueue(gpus_[r.gpu].link, t);
  }
}

void Simulation::Enqueue(int link, const Transfer& t) {
  links_[link].queue.push_back(t);
  if (!links_[link].busy) StartLink(link);
}

void Simulation::StartLink(int link) {
  Link& l = links_[link];
  if (l.busy || l.queue.empty()) return;
  l.current = l.queue.front();
  l.queue.pop_front();
  l.busy = true;
  l.start = now_;
  const double seconds = l.bps > 0 ? l.current.bytes / l.bps : 0.0;
  Push(now_ + seconds, EventType::kLinkDone, link);
}

absl::Status Simulation::OnLinkDone(int link) {
  Link& l = links_[link];
  const Transfer t = l.current;
  const double seconds = now_ - l.start;
  l.report.busy_s += seconds;
  l.report.bytes += t.bytes;
  ++l.report.transfers;
  // Booked: a reload, and whatever carries a slow-link booking. Not: a joined
  // round's rows, a startup load over a host or fast link.
  if (t.kind != TransferKind::kReload && t.booking < 0) l.report.unbooked_s += seconds;
  l.busy = false;
  Req& r = reqs_[t.req];
  switch (t.kind) {
    case TransferKind::kStartup:
      // Landed, so the drafter's Open would return: the booking goes (a
      // started transfer keeps its booked time, RingScheduler::Release).
      if (t.booking >= 0) VC_RETURN_IF_ERROR(sched_->Release(t.booking));
      StartDecoding(r);
      if (r.loads_prefix) {
        // The GPU's copy of the prefix is there: whoever waited for it decodes.
        auto loading = loading_.find({PrefixName(r), r.gpu});
        if (loading != loading_.end()) {
          for (int64_t id : loading->second) StartDecoding(reqs_[id]);
          loading_.erase(loading);
        }
      }
      break;
    case TransferKind::kReload: {
      reload_link_s_ += seconds;
      Landed(r);
      auto copy = copies_.find(t.copy);
      if (copy != copies_.end()) {
        copy->second.landed = true;
        for (int64_t id : copy->second.members) {
          Req& m = reqs_[id];
          if (id != r.id && !m.rows_pending) Landed(m);
        }
      }
      break;
    }
    case TransferKind::kRows: {
      r.rows_pending = false;
      auto copy = copies_.find(r.copy);
      if (copy != copies_.end() && copy->second.landed) Landed(r);
      break;
    }
    case TransferKind::kRefresh:
      // Sent, so it keeps its booked link time (RingScheduler::Release).
      VC_RETURN_IF_ERROR(sched_->Release(t.booking));
      if (r.phase == Phase::kRefresh) {
        refresh_wait_s_ += now_ - r.result_t;
        Commit(r, r.pending_accepted);
      }
      break;
  }
  StartLink(link);
  return absl::OkStatus();
}

absl::Status Simulation::OnMessage(int64_t id, Message m) {
  Req& r = reqs_[id];
  if (m == Message::kDraftsArrived) {
    r.drafts_at_verifier = true;
    return absl::OkStatus();
  }
  return ApplyResult(r, r.pending_accepted);
}

double Simulation::ResidentOn(size_t gi) const {
  double resident = policy_->ResidentBytes(static_cast<int>(gi));
  for (int64_t m : gpus_[gi].members) {
    const Req& r = reqs_[m];
    if (r.phase != Phase::kStartup) resident += OwnResident(r);
  }
  return resident;
}

void Simulation::NotePeaks(Gpu& g) {
  const double resident = ResidentOn(static_cast<size_t>(&g - gpus_.data()));
  g.report.peak_resident_bytes = std::max(g.report.peak_resident_bytes, resident);
  g.report.peak_transient_bytes = std::max(g.report.peak_transient_bytes, g.transient);
  g.report.peak_hbm_bytes =
      std::max(g.report.peak_hbm_bytes, c_.weight_bytes + resident + g.transient);
}

void Simulation::StartIterations() {
  for (size_t gi = 0; gi < gpus_.size(); ++gi) {
    Gpu& g = gpus_[gi];
    if (g.busy) continue;
    g.batch_draft.clear();
    g.batch_verify.clear();
    double bytes = c_.weight_bytes;
    double tokens = 0;
    const int cont_max = c_.continuation ? c_.draft_len : 0;
    if (g.role == Role::kVerifier) {
      for (int64_t id : g.pending) {
        Req& r = reqs_[id];
        if (r.phase == Phase::kAwaitVerify && r.kv_landed && r.drafts_at_verifier) {
          g.batch_verify.push_back(id);
        }
      }
    } else {
      for (int64_t id : g.members) {
        Req& r = reqs_[id];
        switch (r.phase) {
          case Phase::kDecoding:
          case Phase::kDrafting:
            g.batch_draft.push_back(id);
            break;
          case Phase::kAwaitVerify:
            if (g.role == Role::kLongContext && r.kv_landed) g.batch_verify.push_back(id);
            if (r.cont_drafts < cont_max) g.batch_draft.push_back(id);
            break;
          case Phase::kResult:
          case Phase::kRefresh:
            if (r.cont_drafts < cont_max) g.batch_draft.push_back(id);
            break;
          default:
            break;
        }
      }
    }
    const bool has_work = g.role == Role::kVerifier ? !g.pending.empty() : !g.members.empty();
    if (g.batch_draft.empty() && g.batch_verify.empty()) {
      if (has_work && g.idle_since < 0) g.idle_since = now_;
      continue;
    }
    if (g.idle_since >= 0) {
      g.report.idle_with_work_s += now_ - g.idle_since;
      g.idle_since = -1;
    }
    for (int64_t id : g.batch_draft) {
      const Req& r = reqs_[id];
      bytes += vericache() ? CompressedKv(r) : FullKv(r);
      tokens += 1;
    }
    for (int64_t id : g.batch_verify) {
      const Req& r = reqs_[id];
      bytes += FullKv(r);
      tokens += r.round_drafts + 1;
    }
    double t = bytes / c_.hbm_bytes_per_second;
    if (c_.flops > 0) t = std::max(t, 2 * c_.params * tokens / c_.flops);
    t += c_.iteration_overhead_s;
    g.busy = true;
    g.iter_start = now_;
    NotePeaks(g);
    Push(now_ + t, EventType::kGpuDone, static_cast<int64_t>(gi));
  }
}

absl::Status Simulation::OnGpuDone(int gi) {
  Gpu& g = gpus_[gi];
  const double seconds = now_ - g.iter_start;
  g.busy = false;
  ++g.report.iterations;
  g.report.busy_s += seconds;
  if (g.role != Role::kVerifier) {
    g.ewma_iter = (1 - kEwmaWeight) * g.ewma_iter + kEwmaWeight * seconds;
  }
  // Verifies first: a long-context request verified in this pass also drafted
  // its first continuation token in it (that is what continuation buys).
  std::vector<int64_t> verified = g.batch_verify;
  for (int64_t id : g.batch_draft) {
    Req& r = reqs_[id];
    if (r.phase == Phase::kDecoding) {
      ++r.generated;
      if (r.first_token_t < 0) r.first_token_t = now_;
      if (r.generated >= r.target) VC_RETURN_IF_ERROR(Finish(r));
    } else if (r.phase == Phase::kDrafting) {
      ++drafted_;
      if (++r.drafts_done >= r.round_drafts) {
        r.phase = Phase::kAwaitVerify;
        r.drafts_ready_t = now_ + (remote() ? c_.rtt_s / 2 : 0);
        if (remote()) {
          Push(r.drafts_ready_t, EventType::kMessage, r.id,
               static_cast<int>(Message::kDraftsArrived));
        }
      }
    } else if (r.phase == Phase::kAwaitVerify || r.phase == Phase::kResult ||
               r.phase == Phase::kRefresh) {
      ++drafted_;
      ++r.cont_drafts;
    }
  }
  for (int64_t id : verified) {
    Req& r = reqs_[id];
    if (r.phase != Phase::kAwaitVerify) continue;
    ++verifies_;
    if (r.kv_landed_t > r.drafts_ready_t) stall_s_ += r.kv_landed_t - r.drafts_ready_t;
    r.booked = false;
    Gpu& v = gpus_[r.verifier];
    v.transient -= r.own_transient;
    VC_RETURN_IF_ERROR(DropCopyUser(r.copy, v));
    if (remote()) {
      auto& p = v.pending;
      p.erase(std::remove(p.begin(), p.end(), r.id), p.end());
    }
    const int accepted = c_.acceptance.Sample(r.round_drafts, rng_);
    if (remote()) {
      r.phase = Phase::kResult;
      r.pending_accepted = accepted;
      Push(now_ + c_.rtt_s / 2, EventType::kMessage, r.id,
           static_cast<int>(Message::kResultArrived));
    } else {
      VC_RETURN_IF_ERROR(ApplyResult(r, accepted));
    }
  }
  return absl::OkStatus();
}

absl::Status Simulation::ApplyResult(Req& r, int accepted) {
  accepted_sum_ += accepted;
  tokens_sum_ += accepted + 1;
  wasted_ += r.round_drafts - accepted;
  const int64_t tokens = accepted + 1;
  r.generated = std::min(r.target, r.generated + tokens);
  if (r.first_token_t < 0) r.first_token_t = now_;
  const double refresh = remote() && c_.kv_refresh ? Kv(static_cast<double>(tokens)) : 0.0;
  if (refresh > 0) VC_RETURN_IF_ERROR(SendRefresh(r, refresh));
  if (r.generated >= r.target) {
    SettleContinuation(r, accepted);
    return Finish(r);
  }
  if (refresh > 0) {
    // The drafter commits once the rows have landed (OnLinkDone).
    r.phase = Phase::kRefresh;
    r.pending_accepted = accepted;
    r.result_t = now_;
    return absl::OkStatus();
  }
  Commit(r, accepted);
  return absl::OkStatus();
}

int Simulation::SettleContinuation(Req& r, int accepted) {
  if (r.cont_drafts == 0) return 0;
  if (accepted == r.round_drafts && Uniform01(rng_) < c_.acceptance.BonusMatch()) {
    kept_ += r.cont_drafts;
    return r.cont_drafts;
  }
  wasted_ += r.cont_drafts;
  return 0;
}

void Simulation::Commit(Req& r, int accepted) {
  const int carried = SettleContinuation(r, accepted);
  if (lock_step()) {
    r.phase = Phase::kBarrier;
    r.cont_drafts = carried;  // kept for the next round
    barrier_dirty_ = true;
    return;
  }
  StartRound(r, carried);
}

absl::Status Simulation::Finish(Req& r) {
  r.phase = Phase::kDone;
  r.finish_t = now_;
  Gpu& g = gpus_[r.gpu];
  g.members.erase(std::remove(g.members.begin(), g.members.end(), r.id), g.members.end());
  g.reserved -= r.reserved_bytes;
  if (sharing()) policy_->Release(PrefixName(r), r.gpu);
  UpdateCapacity(r.gpu);
  ++finished_;
  // Closed loop: a finished request makes room for the next one. Counted
  // when scheduled, since several requests can finish at one instant.
  if (c_.arrival == SimConfig::Arrival::kClosed && scheduled_ < c_.requests) {
    Push(now_, EventType::kArrival, scheduled_++);
  }
  barrier_dirty_ = true;
  return TryAdmit();
}

void Simulation::CheckBarrier() {
  if (!lock_step() || !barrier_dirty_) return;
  barrier_dirty_ = false;
  std::vector<int64_t> at;
  for (const Gpu& g : gpus_) {
    for (int64_t id : g.members) {
      const Req& r = reqs_[id];
      if (r.phase == Phase::kStartup) continue;
      if (r.phase != Phase::kBarrier) return;  // someone is still mid-round
      at.push_back(id);
    }
  }
  if (at.empty()) return;
  ++lock_step_rounds_;
  std::sort(at.begin(), at.end());
  for (int64_t id : at) {
    Req& r = reqs_[id];
    StartRound(r, r.cont_drafts);
  }
}

void Simulation::Sample() {
  TimeSample s;
  s.t = now_;
  const double dt = now_ - last_sample_t_;
  for (Link& l : links_) {
    const double busy = l.BusyAt(now_);
    s.link_busy.push_back(dt > 0 ? std::min(1.0, (busy - l.busy_mark) / dt) : 0.0);
    l.busy_mark = busy;
  }
  if (sched_ != nullptr) {
    for (size_t i = 0; i < sched_link_to_sim_.size(); ++i) {
      s.link_booked.push_back(sched_->LinkBooked(static_cast<int>(i), sched_->now()) / slot_);
    }
    for (size_t i = 0; i < sched_gpu_to_sim_.size(); ++i) {
      const double cap = static_cast<double>(sched_->options().gpus[i].transient_capacity_bytes);
      s.memory_booked.push_back(
          cap > 0 ? sched_->MemoryBooked(static_cast<int>(i), sched_->now()) / cap : 0.0);
    }
  }
  for (size_t gi = 0; gi < gpus_.size(); ++gi) {
    const Gpu& g = gpus_[gi];
    const double resident = ResidentOn(gi);
    s.hbm_used.push_back(
        c_.hbm_bytes > 0 ? (c_.weight_bytes + resident + g.transient) / c_.hbm_bytes : 0.0);
    s.transient_bytes.push_back(g.transient);
    s.active += static_cast<int>(g.members.size());
  }
  s.waiting = static_cast<int>(waiting_.size());
  last_sample_t_ = now_;
  samples_.push_back(std::move(s));
}

bool Simulation::Idle() const {
  if (!waiting_.empty() || !to_book_.empty() || !reloads_due_.empty() || !slow_due_.empty()) {
    return false;
  }
  for (const Gpu& g : gpus_) {
    if (g.busy || !g.members.empty() || !g.pending.empty()) return false;
  }
  for (const Link& l : links_) {
    if (l.busy) return false;
  }
  return true;
}

absl::StatusOr<SimResult> Simulation::Run() {
  VC_RETURN_IF_ERROR(Setup());
  int64_t tick = 0;
  while (!events_.empty() && finished_ < c_.requests) {
    const Event e = events_.top();
    events_.pop();
    if (e.t > c_.max_sim_seconds) {
      return absl::DeadlineExceededError(
          absl::StrCat("simulation passed max_sim_seconds = ", c_.max_sim_seconds, " with ",
                       finished_, " of ", c_.requests, " requests finished"));
    }
    now_ = e.t;
    switch (e.type) {
      case EventType::kSlotTick: {
        tick = e.a;
        if (sched_ != nullptr && tick > sched_->now()) sched_->Advance(tick - sched_->now());
        if (sched_ != nullptr) policy_->ExpireShared(sched_->now());
        if (sched_ != nullptr) {
          IssueReloads();
          IssueSlowTransfers();
          VC_RETURN_IF_ERROR(RetryBookings());
        }
        Sample();
        if (++idle_ticks_ > kMaxIdleTicks) {
          return absl::FailedPreconditionError(absl::StrCat(
              "simulation made no progress for ", kMaxIdleTicks, " slots at t = ", now_, " s (",
              finished_, " of ", c_.requests, " requests finished, ", waiting_.size(),
              " waiting): the configuration cannot run"));
        }
        int64_t next = tick + 1;
        if (Idle() && !events_.empty()) {
          // Nothing in flight: skip the empty slots up to the next event.
          next = std::max(next, static_cast<int64_t>(std::floor(events_.top().t / slot_)));
        }
        Push(next * slot_, EventType::kSlotTick, next);
        break;
      }
      case EventType::kLinkDone:
        idle_ticks_ = 0;
        VC_RETURN_IF_ERROR(OnLinkDone(static_cast<int>(e.a)));
        break;
      case EventType::kMessage:
        idle_ticks_ = 0;
        VC_RETURN_IF_ERROR(OnMessage(e.a, static_cast<Message>(e.b)));
        break;
      case EventType::kGpuDone:
        idle_ticks_ = 0;
        VC_RETURN_IF_ERROR(OnGpuDone(static_cast<int>(e.a)));
        break;
      case EventType::kArrival:
        idle_ticks_ = 0;
        VC_RETURN_IF_ERROR(NewRequest(now_));
        VC_RETURN_IF_ERROR(TryAdmit());
        break;
    }
    // Events at the same instant are simultaneous: requests that arrive
    // together enter the same lock-step round, and a GPU starts its next
    // iteration knowing everything that happened at this instant.
    if (!events_.empty() && events_.top().t == now_) continue;
    CheckBarrier();
    StartIterations();
  }
  if (finished_ < c_.requests) {
    return absl::InternalError("simulation ran out of events before every request finished");
  }
  VC_CHECK(static_cast<int64_t>(reqs_.size()) == c_.requests, "simulated more requests than asked");
  for (Gpu& g : gpus_) {
    if (g.idle_since >= 0) g.report.idle_with_work_s += now_ - g.idle_since;
  }

  SimResult res;
  res.makespan_s = now_;
  res.requests = finished_;
  std::vector<double> ttft, tpot, latency;
  for (const Req& r : reqs_) {
    res.output_tokens += r.generated;
    ttft.push_back(r.first_token_t - r.arrival);
    latency.push_back(r.finish_t - r.arrival);
    if (r.generated > 1) tpot.push_back((r.finish_t - r.first_token_t) / (r.generated - 1));
  }
  res.tokens_per_s = res.makespan_s > 0 ? res.output_tokens / res.makespan_s : 0;
  res.requests_per_s = res.makespan_s > 0 ? res.requests / res.makespan_s : 0;
  res.ttft_s = Summarise(ttft);
  res.tpot_s = Summarise(tpot);
  res.latency_s = Summarise(latency);
  res.verify_stall_s = stall_s_;
  res.booking_wait_s = booking_wait_s_;
  res.verifies = verifies_;
  res.mean_accepted = verifies_ > 0 ? static_cast<double>(accepted_sum_) / verifies_ : 0;
  res.tokens_per_round = verifies_ > 0 ? static_cast<double>(tokens_sum_) / verifies_ : 0;
  res.drafted_tokens = drafted_;
  res.wasted_drafts = wasted_;
  res.continuation_kept = kept_;
  res.slot_seconds = slot_;
  res.lock_step_rounds = lock_step_rounds_;
  res.memory_deferred = memory_deferred_;
  res.startup_bytes = startup_bytes_;
  res.reload_bytes = reload_bytes_;
  res.refresh_bytes = refresh_bytes_;
  res.refresh_wait_s = refresh_wait_s_;
  res.startup_wait_s = startup_wait_s_;
  res.shared_joins = shared_joins_;
  res.shared_resident = shared_resident_;
  res.link_seconds_per_round = lock_step_rounds_ > 0 ? reload_link_s_ / lock_step_rounds_ : 0;
  double iter_s = 0;
  int64_t iters = 0;
  for (Gpu& g : gpus_) {
    g.report.mean_iteration_s = g.report.iterations > 0 ? g.report.busy_s / g.report.iterations : 0;
    if (g.role != Role::kVerifier) {
      iter_s += g.report.busy_s;
      iters += g.report.iterations;
    }
    res.gpus.push_back(g.report);
  }
  res.mean_iteration_s = iters > 0 ? iter_s / iters : 0;
  for (Link& l : links_) {
    l.report.utilisation = res.makespan_s > 0 ? l.report.busy_s / res.makespan_s : 0;
    res.links.push_back(l.report);
  }
  if (sched_ != nullptr) {
    const RingSchedulerStats& st = sched_->stats();
    res.admitted = st.admitted - tentative_;
    res.queued = st.queued;
    res.beyond_window = st.beyond_window;
    res.max_offset = st.max_offset;
    for (size_t i = 0; i < sched_link_to_sim_.size(); ++i) {
      LinkReport& lr = res.links[sched_link_to_sim_[i]];
      lr.booked_peak_slot_s = std::max(lr.booked_peak_slot_s, st.peak_slot_seconds[i]);
      lr.overrun_s += st.overrun_seconds[i];
      res.scheduler_links.push_back(sched_->options().links[i].name);
    }
    for (size_t i = 0; i < sched_gpu_to_sim_.size(); ++i) {
      res.scheduler_gpus.push_back(sched_->options().gpus[i].name);
      res.peak_memory_booked_bytes =
          std::max(res.peak_memory_booked_bytes, st.peak_memory_bytes[i]);
    }
  }
  // Downsample the time series by averaging neighbours.
  const size_t cap = static_cast<size_t>(std::max(1, c_.timeseries_max_points));
  if (samples_.size() > cap) {
    const size_t group = (samples_.size() + cap - 1) / cap;
    std::vector<TimeSample> out;
    for (size_t i = 0; i < samples_.size(); i += group) {
      const size_t end = std::min(samples_.size(), i + group);
      TimeSample s = samples_[end - 1];
      auto avg = [&](std::vector<double> TimeSample::*field) {
        std::vector<double>& v = s.*field;
        for (size_t k = 0; k < v.size(); ++k) {
          double sum = 0;
          for (size_t j = i; j < end; ++j) sum += (samples_[j].*field)[k];
          v[k] = sum / (end - i);
        }
      };
      avg(&TimeSample::link_busy);
      avg(&TimeSample::link_booked);
      avg(&TimeSample::memory_booked);
      avg(&TimeSample::hbm_used);
      avg(&TimeSample::transient_bytes);
      out.push_back(std::move(s));
    }
    samples_ = std::move(out);
  }
  res.timeseries = std::move(samples_);
  return res;
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const SimConfig& config) {
  VC_RETURN_IF_ERROR(config.Validate());
  Simulation sim(config);
  return sim.Run();
}

}  // namespace vc::sim
