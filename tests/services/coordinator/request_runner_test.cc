// The request runners over fake workers (worker_client.h's seam): the round
// loop of each mode, its output exact whatever the drafts, fallback when the
// drafter fails or its acceptance collapses, a worker's failure reported by
// name, EOS and cancellation, and the slow link's ring: each round's KV
// refresh booked before its Commit (none with KV refresh off), and the
// prefix a drafter's Open fetches booked before the Open (none when it
// fetches nothing); leases: one stream, the next grant ahead, drained
// before a fallback, a verifier without leases served by Round calls; a
// request waiting for full rings or for a worker's answer holds no thread. The
// fake model's output is 10, 11, 12, ... (the token at
// output position k is 10 + k); the fake drafter drafts it, wrong on demand,
// and the fake verifier accepts the drafts that match it.
#include "services/coordinator/request_runner.h"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "gtest/gtest.h"
#include "tests/services/coordinator/fake_workers.h"

namespace vc::coordinator {
namespace {

namespace pb = ::vericache::v1;

int32_t TokenAt(int64_t k) { return static_cast<int32_t>(10 + k); }

struct Calls {
  std::mutex mu;
  std::vector<std::string> names;
  void Add(std::string n) {
    std::lock_guard<std::mutex> lock(mu);
    names.push_back(std::move(n));
  }
  int Count(const std::string& n) {
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<int>(std::count(names.begin(), names.end(), n));
  }
};

class FakeDrafter;

class FakeVerifier final : public FakeVerifierBase {
 public:
  explicit FakeVerifier(Calls* calls) : FakeVerifierBase("fake-verifier:1"), calls_(calls) {}
  absl::Status Release(const WorkerCallOptions&, const pb::ReleaseRequest&,
                       pb::ReleaseResponse*) override {
    calls_->Add("v.Release");
    return absl::OkStatus();
  }
  absl::Status Open(const WorkerCallOptions&, const pb::VerifierOpenRequest& req,
                    pb::VerifierOpenResponse*) override {
    calls_->Add(req.resident() ? "v.OpenResident" : "v.Open");
    held_opens.WaitWhileHeld();
    return absl::OkStatus();
  }
  // While held_opens holds, the answer waits for its Release.
  void StartOpen(const WorkerCallOptions& o, const pb::VerifierOpenRequest& req,
                 pb::VerifierOpenResponse* resp, CallDone done) override {
    if (held_opens.Keep([done] { done(absl::OkStatus()); })) {
      calls_->Add(req.resident() ? "v.OpenResident" : "v.Open");
      return;
    }
    done(Open(o, req, resp));
  }
  absl::Status Load(const WorkerCallOptions&, const pb::LoadRequest& req,
                    pb::LoadResponse*) override {
    calls_->Add(req.resident() ? "v.LoadResident" : "v.Load");
    return absl::OkStatus();
  }
  absl::Status Verify(const WorkerCallOptions&, const pb::VerifyRequest& req,
                      pb::VerifyResponse* resp) override {
    calls_->Add("v.Verify");
    if (verify_error.has_value()) return *verify_error;
    int accepted = 0;
    while (accepted < req.drafts_size() && req.drafts(accepted) == TokenAt(pos_ + accepted))
      ++accepted;
    for (int i = 0; i <= accepted; ++i) resp->add_tokens(TokenAt(pos_ + i));
    resp->set_accepted(accepted);
    if (!req.skip_refresh()) {
      resp->mutable_refresh()->set_count(accepted + 1);
      resp->mutable_refresh()->set_chunk(
          std::string(static_cast<size_t>(refresh_bytes_per_token * (accepted + 1)), 'k'));
    }
    pos_ += accepted + 1;
    return absl::OkStatus();
  }
  // Peer rounds: the drafter this verifier calls itself (defined below).
  absl::Status Round(const WorkerCallOptions& o, const pb::RoundRequest& req,
                     pb::RoundResponse* resp) override;
  // A Round's work, for Round and for a lease's rounds.
  absl::Status RunRound(const WorkerCallOptions& o, const pb::RoundRequest& req,
                        pb::RoundResponse* resp);
  // Leases: OpenLease answers a FakeLease (below) instead of Unimplemented.
  absl::StatusOr<std::unique_ptr<LeaseStream>> OpenLease(const WorkerCallOptions& o) override;
  bool leases = false;
  std::vector<pb::LeaseGrant> grants;                   // as received
  std::function<void(const pb::LeaseGrant&)> on_grant;  // called as each is received
  std::optional<absl::Status> verify_error;
  std::optional<absl::Status> round_error;
  int refresh_bytes_per_token = 100;  // the refresh rows' size
  FakeDrafter* peer = nullptr;
  std::vector<pb::RoundRequest> rounds;  // as received
  HeldAnswers held_opens;                // Open's answers

 private:
  Calls* calls_;
  int64_t pos_ = 0;
};

class FakeDrafter final : public FakeDrafterBase {
 public:
  explicit FakeDrafter(Calls* calls) : FakeDrafterBase("fake-drafter:1"), calls_(calls) {}
  absl::Status Release(const WorkerCallOptions&, const pb::ReleaseRequest&,
                       pb::ReleaseResponse*) override {
    calls_->Add("d.Release");
    return absl::OkStatus();
  }
  absl::Status Open(const WorkerCallOptions&, const pb::DrafterOpenRequest& req,
                    pb::DrafterOpenResponse* resp) override {
    calls_->Add("d.Open");
    opened_with = req;
    if (on_open) on_open();
    resp->set_prefix_bytes(open_prefix_bytes);
    return absl::OkStatus();
  }
  absl::Status Draft(const WorkerCallOptions&, const pb::DraftRequest& req,
                     pb::DraftResponse* resp) override {
    calls_->Add(in_peer_call ? "peer d.Draft" : "d.Draft");
    if (draft_error.has_value()) return *draft_error;
    for (int i = 0; i < req.max_tokens(); ++i)
      resp->add_drafts(always_wrong ? 0 : TokenAt(pos_ + i));
    return absl::OkStatus();
  }
  absl::Status Commit(const WorkerCallOptions&, const pb::CommitRequest& req,
                      pb::CommitResponse*) override {
    calls_->Add(in_peer_call ? "peer d.Commit" : "d.Commit");
    if (commit_error.has_value()) return *commit_error;
    refresh_bytes +=
        static_cast<int64_t>(req.refresh().chunk().size()) + req.refresh_from().bytes();
    if (on_commit) on_commit();
    pos_ += req.tokens_size();
    return absl::OkStatus();
  }
  std::optional<absl::Status> draft_error;
  std::optional<absl::Status> commit_error;
  bool in_peer_call = false;  // called by the fake verifier's Round
  bool always_wrong = false;
  pb::DrafterOpenRequest opened_with;
  int64_t refresh_bytes = 0;  // received in Commits
  std::function<void()> on_commit;
  std::function<void()> on_open;
  int64_t open_prefix_bytes = 0;  // the fetch an Open reports (0: none)

 private:
  Calls* calls_;
  int64_t pos_ = 0;
};

// What a verifier's Round does, over the fakes: Draft on the drafter,
// Verify here, Commit the tokens with the rows' reference (their bytes
// counted, never sent to the caller).
absl::Status FakeVerifier::Round(const WorkerCallOptions& o, const pb::RoundRequest& req,
                                 pb::RoundResponse* resp) {
  calls_->Add("v.Round");
  return RunRound(o, req, resp);
}

absl::Status FakeVerifier::RunRound(const WorkerCallOptions& o, const pb::RoundRequest& req,
                                    pb::RoundResponse* resp) {
  rounds.push_back(req);
  if (round_error.has_value()) return *round_error;
  peer->in_peer_call = true;
  absl::Cleanup not_in_peer = [this] { peer->in_peer_call = false; };
  auto drafter_failed = [&](const char* what, const absl::Status& s) {
    resp->set_drafter_error_code(static_cast<int32_t>(s.code()));
    resp->set_drafter_error(absl::StrCat(what, ": ", s.message()));
    return absl::OkStatus();
  };
  pb::DraftRequest dreq;
  dreq.set_session_id(req.session_id());
  dreq.set_max_tokens(req.take());
  dreq.set_min_tokens(req.take());
  dreq.set_epoch(req.epoch());
  dreq.set_round(req.round());
  pb::DraftResponse dresp;
  if (absl::Status s = peer->Draft(o, dreq, &dresp); !s.ok()) return drafter_failed("Draft", s);
  resp->set_drafted(dresp.drafts_size());
  pb::VerifyRequest vreq;
  vreq.set_session_id(req.session_id());
  vreq.mutable_drafts()->CopyFrom(dresp.drafts());
  vreq.set_skip_refresh(req.skip_refresh());
  VC_RETURN_IF_ERROR(Verify(o, vreq, resp->mutable_verify()));
  pb::CommitRequest creq;
  creq.set_session_id(req.session_id());
  creq.mutable_tokens()->CopyFrom(resp->verify().tokens());
  creq.set_epoch(req.epoch());
  creq.set_round(req.round());
  const auto bytes = static_cast<int64_t>(resp->verify().refresh().chunk().size());
  if (bytes > 0) {
    creq.mutable_refresh_from()->set_bytes(bytes);
    resp->set_refresh_bytes(bytes);
  }
  resp->mutable_verify()->clear_refresh();
  pb::CommitResponse cresp;
  if (absl::Status s = peer->Commit(o, creq, &cresp); !s.ok()) return drafter_failed("Commit", s);
  *resp->mutable_commit() = cresp;
  return absl::OkStatus();
}

// What a verifier's Lease does, over the fakes, each round run as a Round
// when its grant is sent (so a grant sent ahead has run by the time the
// runner half-closes: its progress arrives in the drain): the budget of the
// first grant kept (a grant without room for a draft is answered skipped),
// the stream ended after a round whose drafter failed, a grant after that
// or after Close not run.
class FakeLease final : public LeaseStream {
 public:
  FakeLease(FakeVerifier* v, Calls* calls, const WorkerCallOptions& o)
      : v_(v), calls_(calls), o_(o) {}
  bool Send(const pb::LeaseGrant& g) override {
    if (ended_ || closed_) return false;
    v_->grants.push_back(g);
    if (v_->on_grant) v_->on_grant(g);
    if (v_->grants.size() == 1) budget_ = g.budget();
    pb::LeaseProgress p;
    p.set_round(g.round().round());
    pb::RoundRequest req = g.round();
    const int64_t take = std::min<int64_t>(req.take(), budget_ - 1);
    absl::Cleanup ready = [this] { Ready(); };
    if (take < 1) {
      p.set_skipped(true);
      progress_.push_back(p);
      return true;
    }
    req.set_take(static_cast<int32_t>(take));
    calls_->Add("v.LeaseRound");
    const absl::Status s = v_->RunRound(o_, req, p.mutable_result());
    if (!s.ok()) {
      ended_ = true;
      status_ = s;
      return true;
    }
    budget_ -= p.result().verify().tokens_size();
    if (p.result().drafter_error_code() != 0) ended_ = true;
    if (p.result().has_verify()) {
      // As the verifier does: the verified tokens first, before the commit.
      pb::LeaseProgress verified;
      verified.set_round(p.round());
      verified.set_verified_only(true);
      *verified.mutable_result()->mutable_verify() = p.result().verify();
      verified.mutable_result()->set_drafted(p.result().drafted());
      progress_.push_back(std::move(verified));
    }
    progress_.push_back(std::move(p));
    return true;
  }
  absl::StatusOr<bool> Next(Clock::time_point deadline, pb::LeaseProgress* out,
                            Clock::time_point* received) override {
    if (!progress_.empty()) {
      *out = std::move(progress_.front());
      progress_.erase(progress_.begin());
      if (received != nullptr) *received = Clock::now();
      return true;
    }
    if (!status_.ok()) return status_;
    if (ended_ || closed_) return false;
    std::this_thread::sleep_until(deadline);
    return absl::DeadlineExceededError("fake lease: no grant to answer");
  }
  void Close() override {
    closed_ = true;
    Ready();
  }
  void OnReady(std::function<void()> ready) override {
    ready_ = std::move(ready);
    if (!progress_.empty() || !status_.ok() || ended_ || closed_) Ready();
  }

 private:
  // Next would answer at once now: the waiting OnReady's callback, once.
  void Ready() {
    std::function<void()> ready = std::move(ready_);
    ready_ = nullptr;
    if (ready) ready();
  }

  FakeVerifier* v_;
  Calls* calls_;
  WorkerCallOptions o_;
  int64_t budget_ = 0;
  bool ended_ = false;
  bool closed_ = false;
  absl::Status status_;
  std::vector<pb::LeaseProgress> progress_;
  std::function<void()> ready_;
};

absl::StatusOr<std::unique_ptr<LeaseStream>> FakeVerifier::OpenLease(const WorkerCallOptions& o) {
  if (!leases) return absl::UnimplementedError("no leases");
  calls_->Add("v.Lease");
  return std::make_unique<FakeLease>(this, calls_, o);
}

struct CollectSink final : Sink {
  std::vector<int32_t> tokens;
  int messages = 0;
  std::function<void()> on_write;  // called after each message
  bool Write(const pb::GenerateResponse& msg) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      room_.wait(lock, [&] { return !full_ || abandoned_; });
      if (abandoned_) return false;
    }
    ++messages;
    tokens.insert(tokens.end(), msg.tokens().begin(), msg.tokens().end());
    if (on_write) on_write();
    return true;
  }
  // Between Fill and Drain the reader takes nothing: Writable is false and a
  // Write waits, as the coordinator's queued writer behind a client that has
  // stopped reading.
  void Fill() {
    std::lock_guard<std::mutex> lock(mu_);
    full_ = true;
  }
  void Drain() {
    std::function<void()> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      full_ = false;
      ready = std::move(ready_);
    }
    room_.notify_all();
    if (ready) ready();
  }
  // Called (no lock held) when Writable finds no room.
  std::function<void()> on_no_room;
  bool Writable() override {
    bool room;
    {
      std::lock_guard<std::mutex> lock(mu_);
      room = !full_ || abandoned_;
    }
    if (!room && on_no_room) on_no_room();
    return room;
  }
  void WhenWritable(std::function<void()> ready) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (full_ && !abandoned_) {
        ready_ = std::move(ready);
        return;
      }
    }
    ready();
  }
  void Abandon() override {
    std::function<void()> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      abandoned_ = true;
      ready = std::move(ready_);
    }
    room_.notify_all();
    if (ready) ready();
  }
  bool Abandoned() {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_;
  }

 private:
  std::mutex mu_;
  std::condition_variable room_;
  bool full_ = false;
  bool abandoned_ = false;
  std::function<void()> ready_;
};

class RunnerTest : public ::testing::Test {
 protected:
  RunnerTest() {
    UseClock(0.001, 0);
    auto v = std::make_unique<FakeVerifier>(&calls_);
    auto d = std::make_unique<FakeDrafter>(&calls_);
    fake_v_ = v.get();
    fake_d_ = d.get();
    fake_v_->peer = fake_d_;
    verifier_.address = v->address();
    verifier_.verifier = std::move(v);
    drafter_.address = d->address();
    drafter_.drafter = std::move(d);
    ctx_.eos_ids = {2};
    ctx_.executor = &executor_;
    ctx_.worker_failed = [this](WorkerPool pool, Worker&, const absl::Status& s,
                                const std::function<void(bool)>& done) {
      failures_.push_back(absl::StrCat(WorkerPoolName(pool), ": ", s.message()));
      done(true);
    };
    ctx_.release = [this](WorkerPool pool, Worker&, uint64_t, CallDone done) {
      calls_.Add(absl::StrCat("release ", WorkerPoolName(pool)));
      auto answer = [done = std::move(done)] { done(absl::OkStatus()); };
      if (!held_releases_.Keep(answer)) answer();
    };
    plan_.req.set_max_new_tokens(20);
    plan_.x = 4;
    plan_.session = 7;
    plan_.verifier = &verifier_;
    plan_.drafter = &drafter_;
    plan_.fallback = FallbackPolicy(FallbackOptions{.window = 2, .min_accepted = 0.5});
    r_.deadline = Clock::now() + std::chrono::minutes(5);
  }
  ~RunnerTest() override { clock_->Stop(); }

  // A new clock: `slow_bps` paces the slow link (0: unlimited).
  void UseClock(double slot_seconds, double slow_bps) {
    if (clock_) clock_->Stop();
    RingSchedulerOptions ro;
    ro.slot_seconds = slot_seconds;
    ro.links = {RingLink{.name = "fast"}, RingLink{.name = "slow", .bytes_per_second = slow_bps}};
    ro.gpus = {RingGpu{.name = "v0", .transient_capacity_bytes = 1 << 20}};
    clock_ = std::move(SlotClock::Create(ro)).value();
    ctx_.clock = clock_.get();
  }

  // Peer rounds on a lease, which the fake verifier serves.
  void UseLeases() {
    ctx_.options.peer_rounds = true;
    ctx_.options.leases = true;
    fake_v_->leases = true;
  }

  std::vector<int32_t> Expected(int n) {
    std::vector<int32_t> out;
    for (int k = 0; k < n; ++k) out.push_back(TokenAt(k));
    return out;
  }

  // What RunTwoOnOneThread saw.
  struct TwoRequests {
    bool first_done_before_release = false;
  };
  // Runs this fixture's request (plan_, r_) and then a second one, with
  // workers of its own and no stored prefix, both in vericache mode on an
  // executor of one thread. Once the second has finished (within 20 s: it
  // fails the test if it has not), calls `release` (what lets the first one
  // go on), and checks that both finish with the whole output.
  TwoRequests RunTwoOnOneThread(const std::function<void()>& release) {
    Executor one(ExecutorOptions{.max_threads = 1});
    ctx_.executor = &one;
    Calls calls_b;
    auto vb = std::make_unique<FakeVerifier>(&calls_b);
    auto db = std::make_unique<FakeDrafter>(&calls_b);
    vb->peer = db.get();
    Worker verifier_b, drafter_b;
    verifier_b.address = vb->address();
    verifier_b.verifier = std::move(vb);
    drafter_b.address = db->address();
    drafter_b.drafter = std::move(db);
    Plan plan_b = plan_;
    plan_b.prefix_tokens = 0;
    plan_b.prefix_key.clear();
    plan_b.verifier = &verifier_b;
    plan_b.drafter = &drafter_b;
    Request r_b;
    r_b.deadline = r_.deadline;
    CollectSink sink_b;

    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::Status> done_a, done_b;
    auto record = [&](std::optional<absl::Status>* done) {
      return [&, done](const absl::Status& s) {
        std::lock_guard<std::mutex> lock(mu);
        *done = s;
        cv.notify_all();
      };
    };
    one.Post([&] { Spawn(RunVeriCache(ctx_, plan_, r_, &sink_), record(&done_a)); });
    one.Post([&] { Spawn(RunVeriCache(ctx_, plan_b, r_b, &sink_b), record(&done_b)); });
    TwoRequests seen;
    bool second_done = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      second_done = cv.wait_for(lock, std::chrono::seconds(20), [&] { return done_b.has_value(); });
      seen.first_done_before_release = done_a.has_value();
    }
    release();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(60),
                  [&] { return done_a.has_value() && done_b.has_value(); });
    }
    EXPECT_TRUE(second_done) << "the second request did not run while the first one waited";
    EXPECT_TRUE(done_b.has_value() && done_b->ok()) << done_b.value_or(absl::OkStatus());
    EXPECT_TRUE(done_a.has_value() && done_a->ok()) << done_a.value_or(absl::OkStatus());
    EXPECT_EQ(sink_b.tokens, Expected(20));
    EXPECT_EQ(sink_.tokens, Expected(20));
    // The runs are over: nothing of them runs on `one` when it goes.
    ctx_.executor = &executor_;
    return seen;
  }

  Calls calls_;
  HeldAnswers held_releases_;  // ctx_.release's answers
  Executor executor_;          // the runners continue on it after their waits
  std::unique_ptr<SlotClock> clock_;
  FakeVerifier* fake_v_;
  FakeDrafter* fake_d_;
  Worker verifier_, drafter_;
  RunnerContext ctx_;
  Plan plan_;
  Request r_;
  CollectSink sink_;
  std::vector<std::string> failures_;
};

TEST_F(RunnerTest, VeriCacheRoundsStreamExactlyTheVerifiedTokens) {
  metrics::Counter rounds;
  ctx_.metrics.rounds = &rounds;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(sink_.tokens, Expected(20));
  // x = 4 drafts and one bonus token per round: 20 tokens in 4 rounds.
  EXPECT_EQ(plan_.totals.verify_rounds(), 4);
  EXPECT_EQ(rounds.Value(), 4);
  EXPECT_EQ(plan_.totals.accepted_drafts(), 16);
  EXPECT_EQ(plan_.totals.fallbacks(), 0);
  // The last round completes the request: no Commit after it.
  EXPECT_EQ(calls_.Count("d.Commit"), 3);
  EXPECT_TRUE(plan_.verifier_open);
  EXPECT_TRUE(plan_.drafter_open);
  EXPECT_EQ(r_.generated, 20);
}

// The report of a failed drafter starts the service's probe and goes on:
// the request falls back and finishes while the probe has not answered.
TEST_F(RunnerTest, AFailedDrafterIsReportedWithoutWaitingForItsProbe) {
  fake_d_->draft_error = absl::UnavailableError("connection refused");
  std::vector<std::function<void(bool)>> probes;
  ctx_.worker_failed = [&](WorkerPool, Worker&, const absl::Status&,
                           std::function<void(bool)> done) { probes.push_back(std::move(done)); };
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  ASSERT_EQ(probes.size(), 1u) << "the probe was started and not waited for";
  probes[0](true);  // its answer, after the request ended, changes nothing
}

TEST_F(RunnerTest, ADrafterThatDiesFallsBackToTheVerifierAndStaysExact) {
  fake_d_->draft_error = absl::UnavailableError("connection refused");
  metrics::Counter fallbacks;
  ctx_.metrics.fallbacks = &fallbacks;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  EXPECT_EQ(fallbacks.Value(), 1);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0], "drafter: drafter fake-drafter:1 Draft: connection refused");
  EXPECT_EQ(calls_.Count("release drafter"), 1) << "the drafter's session is let go";
  EXPECT_EQ(calls_.Count("v.LoadResident"), 1) << "the same verifier session, now resident";
  EXPECT_FALSE(plan_.drafter_open);
}

TEST_F(RunnerTest, ACollapsedAcceptanceFallsBackAfterTheWindow) {
  fake_d_->always_wrong = true;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20)) << "rejected drafts never reach the output";
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  EXPECT_EQ(plan_.totals.verify_rounds(), 2) << "the window is two rounds";
  EXPECT_TRUE(failures_.empty());
}

TEST_F(RunnerTest, ADrafterRefusingTheRequestFailsItWithTheWorkersName) {
  fake_d_->draft_error = absl::InvalidArgumentError("bad lookahead");
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "drafter fake-drafter:1 Draft: bad lookahead");
  EXPECT_TRUE(plan_.output.empty());
}

TEST_F(RunnerTest, AFailedVerifyFailsTheRequestAfterTheVerifiedTokens) {
  fake_v_->verify_error = absl::UnavailableError("socket closed");
  const absl::Status s = BlockOn(RunFullLocal(ctx_, plan_, r_, &sink_, false));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "verifier fake-verifier:1 Verify: socket closed");
  EXPECT_EQ(calls_.Count("v.OpenResident"), 1);
}

TEST_F(RunnerTest, FullLocalStopsAtEos) {
  ctx_.eos_ids = {TokenAt(5)};
  ASSERT_TRUE(BlockOn(RunFullLocal(ctx_, plan_, r_, &sink_, false)).ok());
  EXPECT_EQ(plan_.output, Expected(6));
  EXPECT_TRUE(plan_.stopped_at_eos);
  EXPECT_EQ(sink_.messages, 6) << "one token per full-KV step";
}

TEST_F(RunnerTest, RemoteDecodesOnTheDrafterAloneWithSeededSampling) {
  r_.mode = pb::MODE_FULL_REMOTE;
  plan_.req.mutable_sampling()->set_mode(pb::SamplingConfig::REJECTION);
  ctx_.options.baseline_chunk = 8;
  ASSERT_TRUE(BlockOn(RunRemote(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(fake_d_->opened_with.sampling().mode(), pb::SamplingConfig::SEEDED)
      << "nothing is judged: rejection sampling is plain seeded sampling";
  EXPECT_TRUE(fake_d_->opened_with.full_prefix());
  EXPECT_EQ(calls_.Count("d.Draft"), 3) << "8 + 8 + 4 tokens";
  EXPECT_EQ(plan_.totals.compressor(), "full");
  EXPECT_EQ(calls_.Count("v.Verify"), 0);
}

TEST_F(RunnerTest, ACancelledRequestEndsAtTheNextRound) {
  r_.cancelled = true;
  EXPECT_EQ(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(BlockOn(RunRemote(ctx_, plan_, r_, &sink_)).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(sink_.tokens.empty());
}

TEST_F(RunnerTest, OnAnUnpacedSlowLinkEachRefreshIsBookedForNothing) {
  // The default clock's slow link is unpaced: the refreshes are booked
  // (for no time) and sent at once.
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(clock_->stats().transfers, 3) << "one per Commit";
  EXPECT_EQ(clock_->stats().released, 3);
  EXPECT_EQ(fake_d_->refresh_bytes, 3 * 5 * 100) << "5 tokens of 100 bytes per round";
  EXPECT_EQ(plan_.totals.refresh_bytes(), 3 * 5 * 100);
  EXPECT_EQ(clock_->stats().peak_slot_seconds[kSlowLink], 0.0) << "an unpaced link books no time";
}

TEST_F(RunnerTest, EachRefreshIsBookedOnThePacedSlowLinkBeforeItsCommit) {
  // 500 bytes at 50 kB/s are 10 ms, two 5 ms slots per refresh; the slow
  // link's current slot is never booked beyond its length.
  UseClock(0.005, 50e3);
  std::vector<double> occupancy;
  fake_d_->on_commit = [&] { occupancy.push_back(clock_->LinkOccupancy()[kSlowLink]); };
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(clock_->stats().transfers, 3);
  EXPECT_EQ(clock_->stats().released, 3) << "released once each Commit was answered";
  ASSERT_EQ(occupancy.size(), 3u);
  for (double o : occupancy) EXPECT_LE(o, 1.0 + 1e-9);
  // Let the last refresh's slot pass: the link time it used stays counted.
  ASSERT_TRUE(clock_->WaitForSlot(clock_->now() + 2, Clock::now() + std::chrono::seconds(30)));
  EXPECT_GT(clock_->stats().peak_slot_seconds[kSlowLink], 0.0);
  EXPECT_LE(clock_->stats().peak_slot_seconds[kSlowLink], 0.005 * (1 + 1e-9));
}

TEST_F(RunnerTest, WithoutKvRefreshNothingIsBookedOnTheSlowLink) {
  UseClock(0.005, 50e3);
  ctx_.options.kv_refresh = false;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(clock_->stats().transfers, 0);
  EXPECT_EQ(fake_d_->refresh_bytes, 0) << "the verifier was told to skip them";
  EXPECT_EQ(plan_.totals.refresh_bytes(), 0);
}

TEST_F(RunnerTest, ARequestWhoseDeadlinePassesWaitingForTheSlowLinkFailsWithoutCommitting) {
  // 1 s slots at 100 B/s: another transfer holds the slow link for the
  // next 100 slots, so this round's refresh could only go then.
  UseClock(1.0, 100);
  ASSERT_TRUE(clock_->BookTransfer(clock_->NewBookingId(), int64_t{100} * 100, kSlowLink).ok());
  r_.deadline = Clock::now() + std::chrono::seconds(1);
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(s.message(), "request deadline passed waiting for the slow link (KV refresh)");
  EXPECT_EQ(calls_.Count("d.Commit"), 0);
  EXPECT_EQ(plan_.output, Expected(5)) << "the verified tokens were streamed";
  EXPECT_EQ(clock_->stats().transfers, 2);
  EXPECT_EQ(clock_->stats().released, 1) << "the request's own booking is let go";
}

// ------------------------------------------------ the drafter Open's fetch

class OpenBookingTest : public RunnerTest {
 protected:
  OpenBookingTest() {
    // A stored prefix of 64 tokens at 100 B/token (6,400 full bytes); its
    // variant keeps a quarter of the tokens: about 1,600 bytes.
    plan_.prefix_tokens = 64;
    ctx_.kv_bytes_per_token = 100;
    plan_.variant.compressor.name = "snapkv";
    plan_.variant.compressor.ratio = 0.25;
    plan_.variant_key = std::string(32, 'v');
  }

  // Slots of 1 s at 100 B/s (one slot per 100 bytes); inside the Open, how
  // many slots from now a 1-byte transfer booked after it has to wait: the
  // slots the Open's booking took (-1 when the Open was never sent).
  int64_t SlotsBookedBeforeTheOpen(const std::function<absl::Status()>& run) {
    UseClock(1.0, 100);
    int64_t waited = -1;
    fake_d_->on_open = [&] {
      absl::StatusOr<Booking> probe = clock_->BookTransfer(clock_->NewBookingId(), 1, kSlowLink);
      if (probe.ok()) waited = probe->first_slot() - clock_->now();
    };
    EXPECT_TRUE(run().ok());
    fake_d_->on_open = nullptr;
    return waited;
  }

  absl::Status RunLossyRemote() {
    r_.mode = pb::MODE_LOSSY_REMOTE;
    plan_.output.clear();
    return BlockOn(RunRemote(ctx_, plan_, r_, &sink_));
  }
};

TEST(VariantSizeEstimateTest, KeepsTheRatioAndTheCodeWidthOf16BitRows) {
  EXPECT_EQ(EstimateVariantBytes(6400, CompressorOptions{.name = "snapkv", .ratio = 0.25}), 1600);
  EXPECT_EQ(EstimateVariantBytes(6400, CompressorOptions{.name = "kivi", .bits = 4}), 1600);
  EXPECT_EQ(
      EstimateVariantBytes(6400, CompressorOptions{.name = "snapkv+kivi", .ratio = 0.5, .bits = 2}),
      400);
  EXPECT_EQ(EstimateVariantBytes(6400, CompressorOptions{.name = "kivi"}), 1600)
      << "no bits named: kivi's default, 4";
  EXPECT_EQ(EstimateVariantBytes(6400, CompressorOptions{.name = "int8"}), 3200);
  EXPECT_EQ(EstimateVariantBytes(6400, CompressorOptions{.name = "snapkv+int8", .ratio = 0.5}),
            1600);
  EXPECT_EQ(EstimateVariantBytes(0, CompressorOptions{.name = "snapkv", .ratio = 0.25}), 0);
}

TEST(VariantSizesTest, RemembersExactSizesWithinItsBound) {
  VariantSizes sizes(2);
  EXPECT_FALSE(sizes.Get("a").has_value());
  sizes.Note("a", 10);
  sizes.Note("b", 20);
  sizes.Note("a", 11);  // updated, not a new entry
  EXPECT_EQ(sizes.Get("a"), 11);
  sizes.Note("c", 30);  // over the bound: the oldest ("a") goes
  EXPECT_FALSE(sizes.Get("a").has_value());
  EXPECT_EQ(sizes.Get("b"), 20);
  EXPECT_EQ(sizes.Get("c"), 30);
  sizes.Note("d", 0);  // nothing fetched: nothing learned
  EXPECT_FALSE(sizes.Get("d").has_value());
}

TEST_F(OpenBookingTest, TheVariantsFetchIsBookedOnTheSlowLinkBeforeTheOpen) {
  // 1,600 bytes at 100 B/s: 16 slots (15 to 17 as the current slot runs
  // and ends while the test books).
  const int64_t slots = SlotsBookedBeforeTheOpen([&] { return RunLossyRemote(); });
  EXPECT_GE(slots, 14);
  EXPECT_LE(slots, 17);
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(clock_->stats().transfers, 2) << "the Open's and the probe";
  EXPECT_EQ(clock_->stats().released, 1) << "the Open's, once it returned";
}

TEST_F(OpenBookingTest, AVariantsReportedSizeIsBookedAtItsNextOpen) {
  // The first Open estimates (1,600 bytes); the drafter reports fetching
  // 800, and the next Open of the same variant books those: 8 slots.
  fake_d_->open_prefix_bytes = 800;
  ASSERT_GE(SlotsBookedBeforeTheOpen([&] { return RunLossyRemote(); }), 14);
  EXPECT_EQ(ctx_.variant_sizes->Get(plan_.variant_key), 800);
  const int64_t slots = SlotsBookedBeforeTheOpen([&] { return RunLossyRemote(); });
  EXPECT_GE(slots, 6);
  EXPECT_LE(slots, 9);
}

TEST_F(OpenBookingTest, AReportedSizeIsBelievedOnlyUpToTwiceTheFullPrefix) {
  // A drafter reports fetching 10^9 bytes of a 6,400-byte prefix: the next
  // Open books at most 12,800 bytes (128 slots), not 10^7 seconds.
  fake_d_->open_prefix_bytes = int64_t{1'000'000'000};
  ASSERT_GE(SlotsBookedBeforeTheOpen([&] { return RunLossyRemote(); }), 14);
  const int64_t slots = SlotsBookedBeforeTheOpen([&] { return RunLossyRemote(); });
  EXPECT_GE(slots, 126);
  EXPECT_LE(slots, 129);
}

TEST_F(OpenBookingTest, FullRemoteBooksTheFullChunks) {
  // 6,400 bytes at 100 B/s: 64 slots.
  r_.mode = pb::MODE_FULL_REMOTE;
  const int64_t slots =
      SlotsBookedBeforeTheOpen([&] { return BlockOn(RunRemote(ctx_, plan_, r_, &sink_)); });
  EXPECT_GE(slots, 62);
  EXPECT_LE(slots, 65);
  EXPECT_FALSE(ctx_.variant_sizes->Get(plan_.variant_key).has_value())
      << "full chunks are no variant";
}

TEST_F(OpenBookingTest, VeriCacheBooksTheOpenAndEachRefresh) {
  // The default clock (1 ms slots, unpaced slow link): the Open and the
  // three refreshes are booked for no time and go at once.
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(calls_.Count("d.Open"), 1);
  EXPECT_EQ(clock_->stats().transfers, 1 + 3) << "the Open and three refreshes";
  EXPECT_EQ(clock_->stats().released, 4 + 1 + 3) << "four verifies' reloads too";
  EXPECT_EQ(clock_->stats().peak_slot_seconds[kSlowLink], 0.0) << "an unpaced link books no time";
}

TEST_F(OpenBookingTest, AnOpenThatFetchesNothingBooksNothing) {
  // No whole stored chunk: the drafter fetches no prefix. KV refresh off,
  // so nothing at all crosses the slow link.
  UseClock(0.005, 50e3);
  plan_.prefix_tokens = 0;
  ctx_.options.kv_refresh = false;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(calls_.Count("d.Open"), 1);
  EXPECT_EQ(clock_->stats().transfers, 0);
  EXPECT_EQ(clock_->stats().peak_slot_seconds[kSlowLink], 0.0);
}

TEST_F(OpenBookingTest, ADeadlinePassedWaitingForTheSlowLinkFailsWithoutOpening) {
  // Another transfer holds the slow link for the next 100 slots of 1 s: the
  // Open's fetch could only go after them.
  UseClock(1.0, 100);
  ASSERT_TRUE(clock_->BookTransfer(clock_->NewBookingId(), int64_t{100} * 100, kSlowLink).ok());
  r_.deadline = Clock::now() + std::chrono::seconds(1);
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(s.message(), "request deadline passed waiting for the slow link (drafter Open)");
  EXPECT_EQ(calls_.Count("d.Open"), 0);
  EXPECT_TRUE(failures_.empty()) << "the drafter did nothing wrong";
  EXPECT_FALSE(plan_.drafter_open);
  EXPECT_TRUE(plan_.verifier_open) << "the service releases it";
  EXPECT_TRUE(plan_.output.empty());
  EXPECT_EQ(clock_->stats().transfers, 2);
  EXPECT_EQ(clock_->stats().released, 1) << "the Open's booking is given back";
  // Given back before its first slot: another transfer books where it was.
  absl::StatusOr<Booking> after =
      clock_->BookTransfer(clock_->NewBookingId(), int64_t{100} * 16, kSlowLink);
  ASSERT_TRUE(after.ok());
  EXPECT_LE(after->first_slot() - clock_->now(), 101);
}

}  // namespace
}  // namespace vc::coordinator

namespace vc::coordinator {
namespace {

// ---------------------------------------------------------- peer rounds

TEST_F(RunnerTest, PeerRoundsStreamExactlyWithNoDraftOrRowThroughTheCoordinator) {
  ctx_.options.peer_rounds = true;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(plan_.totals.verify_rounds(), 4);
  EXPECT_EQ(plan_.totals.accepted_drafts(), 16);
  EXPECT_EQ(plan_.totals.drafted_tokens(), 16);
  // The coordinator made no Draft, Verify-with-drafts or Commit of its own:
  // every one was the verifier's, worker to worker.
  EXPECT_EQ(calls_.Count("v.Round"), 4);
  EXPECT_EQ(calls_.Count("d.Draft"), 0);
  EXPECT_EQ(calls_.Count("d.Commit"), 0);
  EXPECT_EQ(calls_.Count("peer d.Draft"), 4);
  EXPECT_EQ(calls_.Count("peer d.Commit"), 4);
  // Each round's rows: the count the verifier reported, none relayed.
  EXPECT_EQ(plan_.totals.refresh_bytes(), 4 * 5 * 100);
  EXPECT_EQ(fake_d_->refresh_bytes, 4 * 5 * 100);
  // Rounds carry the drafter session's epoch (set at its Open) and ids 1..4.
  ASSERT_EQ(fake_v_->rounds.size(), 4u);
  EXPECT_NE(fake_d_->opened_with.epoch(), 0u);
  for (size_t i = 0; i < fake_v_->rounds.size(); ++i) {
    EXPECT_EQ(fake_v_->rounds[i].epoch(), fake_d_->opened_with.epoch());
    EXPECT_EQ(fake_v_->rounds[i].round(), i + 1);
    EXPECT_EQ(fake_v_->rounds[i].drafter(), "fake-drafter:1");
    EXPECT_EQ(fake_v_->rounds[i].take(), 4);
    EXPECT_FALSE(fake_v_->rounds[i].skip_refresh());
  }
}

TEST_F(RunnerTest, LeasedRoundsStreamExactlyOnOneStreamWithTheNextGrantAhead) {
  UseLeases();
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(plan_.totals.verify_rounds(), 4);
  EXPECT_EQ(plan_.totals.accepted_drafts(), 16);
  // One stream, no Round call; every draft and commit worker to worker.
  EXPECT_EQ(calls_.Count("v.Lease"), 1);
  EXPECT_EQ(calls_.Count("v.Round"), 0);
  EXPECT_EQ(calls_.Count("v.LeaseRound"), 4);
  EXPECT_EQ(calls_.Count("peer d.Draft"), 4);
  EXPECT_EQ(calls_.Count("peer d.Commit"), 4);
  EXPECT_EQ(calls_.Count("d.Draft") + calls_.Count("d.Commit"), 0);
  // The last round's verified tokens complete the request: its commit (and
  // its rows' count) is not waited for.
  EXPECT_EQ(plan_.totals.refresh_bytes(), 3 * 5 * 100);
  // The grants: ids 1.. of the drafter session's epoch, the budget on the
  // first, one granted ahead of the last round (answered skipped: the
  // budget left it no room).
  ASSERT_EQ(fake_v_->grants.size(), 5u);
  EXPECT_EQ(fake_v_->grants[0].budget(), 20);
  for (size_t i = 0; i < fake_v_->grants.size(); ++i) {
    const pb::RoundRequest& g = fake_v_->grants[i].round();
    EXPECT_EQ(g.round(), i + 1);
    EXPECT_EQ(g.epoch(), fake_d_->opened_with.epoch());
    EXPECT_EQ(g.drafter(), "fake-drafter:1");
    if (i > 0) {
      EXPECT_EQ(fake_v_->grants[i].budget(), 0) << "the budget is the first grant's";
    }
  }
  // Each round's times but the last's (it ends the request), as for Rounds.
  EXPECT_EQ(plan_.totals.round_times().rounds(), 3);
}

// x adapts as soon as a leased round is verified, before its commit, and
// no grant is booked before the round two ahead of it is verified: after
// round 1's drafts are all rejected, round 3's grant asks for fewer drafts;
// round 2's (booked before any verify) still for x. (Granting further ahead
// would send takes that have not seen the latest acceptance.)
TEST_F(RunnerTest, ALeaseGrantsWithXAdaptedToTheRoundVerifiedBefore) {
  UseLeases();
  plan_.adaptive = true;
  ctx_.options.max_draft_len = 8;
  plan_.fallback = FallbackPolicy(FallbackOptions{.window = 8, .min_accepted = 0});
  fake_d_->always_wrong = true;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  ASSERT_GE(fake_v_->grants.size(), 3u);
  EXPECT_EQ(fake_v_->grants[0].round().take(), 4);
  EXPECT_EQ(fake_v_->grants[1].round().take(), 4);
  EXPECT_EQ(fake_v_->grants[2].round().take(), 1) << "x after a round with nothing accepted";
}

TEST_F(RunnerTest, ALeaseReadsTheRunningRoundsProgressWhileItsNextBookingWaitsForFullRings) {
  UseLeases();
  plan_.prompt.assign(20, 5);
  plan_.prefix_tokens = 16;
  plan_.prefix_key = "p";
  ctx_.kv_bytes_per_token = 100;
  // After round 1 is booked and granted, the verifier's memory is taken (a
  // resident prefix of another request's as large as the ring), so round 2
  // cannot be booked; it is given back only when round 1's tokens reach the
  // client. Waiting for the rings instead of reading round 1's progress
  // would hold the request until its deadline.
  bool held = false;
  fake_v_->on_grant = [&](const pb::LeaseGrant& g) {
    if (g.round().round() != 1) return;
    clock_->HoldResident("other", 0, int64_t{1} << 20);
    held = true;
    // Round 1's verify slot passes, so round 2 cannot join its booking.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  sink_.on_write = [&] {
    if (!held) return;
    clock_->ReleaseResident("other", 0);
    held = false;
  };
  r_.deadline = Clock::now() + std::chrono::seconds(20);
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(plan_.totals.fallbacks(), 0);
  EXPECT_EQ(calls_.Count("v.Lease"), 1);
  EXPECT_GE(fake_v_->grants.size(), 4u);
}

// The runners wait without a thread: with one executor thread, a request
// whose verify cannot be booked (the verifier's memory is held) is
// suspended between its tries, and another request runs to its end on that
// thread meanwhile. A runner that blocked its thread while it waited would
// keep the second from starting until the memory came back.
TEST_F(RunnerTest, ARequestWaitingForFullRingsHoldsNoThread) {
  plan_.prompt.assign(20, 5);
  plan_.prefix_tokens = 16;
  // (From a std::string: assigning the literal, inlined here, trips GCC
  // 12's false -Wrestrict, which CI treats as an error.)
  plan_.prefix_key = std::string("p");
  ctx_.kv_bytes_per_token = 100;
  clock_->HoldResident("other", 0, int64_t{1} << 20);
  const TwoRequests two = RunTwoOnOneThread([&] { clock_->ReleaseResident("other", 0); });
  EXPECT_FALSE(two.first_done_before_release)
      << "the second request waited for the first one's rings";
}

// Worker calls are awaited, not waited on: with one executor thread, a
// request whose verifier has not answered its Open yet is suspended, and
// another request runs to its end on that thread meanwhile. A synchronous
// call held the only thread until the answer came.
TEST_F(RunnerTest, ARequestWaitingForAWorkerHoldsNoThread) {
  fake_v_->held_opens.Hold();
  const TwoRequests two = RunTwoOnOneThread([&] { fake_v_->held_opens.Release(); });
  EXPECT_FALSE(two.first_done_before_release) << "the first request's Open was held";
  EXPECT_EQ(calls_.Count("v.Open"), 1);
}

// The same for a session's release: a request that falls back releases its
// drafter session and is suspended until the release is answered.
TEST_F(RunnerTest, ARequestWaitingForAReleaseHoldsNoThread) {
  fake_d_->always_wrong = true;
  held_releases_.Hold();
  const TwoRequests two = RunTwoOnOneThread([&] { held_releases_.Release(); });
  EXPECT_FALSE(two.first_done_before_release) << "the first request's release was held";
  EXPECT_EQ(calls_.Count("release drafter"), 1);
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
}

// And for room to write: a request whose client has stopped reading is
// suspended before its next message, and another request runs to its end on
// the only thread meanwhile.
TEST_F(RunnerTest, ARequestBehindAStalledReaderHoldsNoThread) {
  sink_.Fill();
  const TwoRequests two = RunTwoOnOneThread([&] { sink_.Drain(); });
  EXPECT_FALSE(two.first_done_before_release) << "the first request's reader took nothing";
  EXPECT_EQ(sink_.tokens, Expected(20));
}

// A request cancelled while its reader is behind (the Cancel landed after
// the request last looked, when the queue was not yet full): its next wait
// for room abandons the stream instead of waiting for a reader who reads
// nothing, and the request ends cancelled without another message.
TEST_F(RunnerTest, ACancelledRequestBehindAStalledReaderAbandonsItsStream) {
  sink_.on_write = [&] {
    if (sink_.messages == 1) sink_.Fill();
  };
  sink_.on_no_room = [&] { r_.cancelled = true; };
  // Were it to wait, the reader comes back after 20 s (the test then fails
  // instead of hanging).
  std::promise<void> done;
  std::thread reader([&, ended = done.get_future()] {
    if (ended.wait_for(std::chrono::seconds(20)) != std::future_status::ready) sink_.Drain();
  });
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  done.set_value();
  reader.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_TRUE(sink_.Abandoned());
  EXPECT_EQ(sink_.messages, 1);
}

TEST_F(RunnerTest, ALeaseDrainsTheRoundGrantedAheadBeforeFallingBack) {
  UseLeases();
  fake_d_->always_wrong = true;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  // The window (two rounds) collapsed after round 2; rounds 3 and 4,
  // granted ahead (the next grant goes once the round before is verified),
  // had run on the verifier: their verified tokens are streamed before the
  // fallback decodes the rest on the same session.
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(plan_.totals.verify_rounds(), 4);
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  EXPECT_EQ(calls_.Count("v.LoadResident"), 1);
  EXPECT_TRUE(failures_.empty());
}

TEST_F(RunnerTest, ALeasedDrafterThatDiesIsReportedAndFallsBackExactly) {
  UseLeases();
  fake_d_->draft_error = absl::UnavailableError("connection refused");
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(plan_.output, Expected(20));
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0],
            "drafter: drafter fake-drafter:1 Draft: connection refused (from verifier "
            "fake-verifier:1)");
  EXPECT_EQ(calls_.Count("v.LeaseRound"), 1) << "the lease ends with the drafter's failure";
}

TEST_F(RunnerTest, ALeasedCommitThatFailsStreamsItsVerifiedTokensOnceAndFallsBack) {
  UseLeases();
  fake_d_->commit_error = absl::UnavailableError("connection reset");
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  // Round 1's tokens went out with its verified progress, before the
  // failed commit; its full progress did not send them again.
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(plan_.totals.verify_rounds(), 1);
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  ASSERT_EQ(failures_.size(), 1u);
}

TEST_F(RunnerTest, AFailedLeaseFailsTheRequestWithTheVerifiersName) {
  UseLeases();
  fake_v_->verify_error = absl::UnavailableError("socket closed");
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "verifier fake-verifier:1 Lease: socket closed");
}

TEST_F(RunnerTest, AVerifierWithoutLeasesGetsOneRoundCallPerRound) {
  ctx_.options.peer_rounds = true;
  ctx_.options.leases = true;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(calls_.Count("v.Round"), 4);
  EXPECT_EQ(calls_.Count("v.LeaseRound"), 0);
}

TEST_F(RunnerTest, EachDrafterOpenGetsANewEpoch) {
  ctx_.options.peer_rounds = true;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  const uint64_t first = fake_d_->opened_with.epoch();
  Plan again = plan_;
  again.output.clear();
  again.round_id = 0;
  CollectSink sink;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, again, r_, &sink)).ok());
  EXPECT_NE(fake_d_->opened_with.epoch(), first);
  EXPECT_EQ(fake_v_->rounds.back().epoch(), fake_d_->opened_with.epoch());
}

TEST_F(RunnerTest, PeerRoundsBookTheMostTheRowsCanBeBeforeTheRound) {
  // 4 drafts plus the one unverified token: at most 5 rows of
  // kv_bytes_per_token each, with the chunk's header and checksum.
  UseClock(0.005, 1e6);
  ctx_.options.peer_rounds = true;
  ctx_.kv_bytes_per_token = 100;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(clock_->stats().transfers, 4) << "one booking per round";
  EXPECT_EQ(clock_->stats().released, 4);
  for (const pb::RoundRequest& rr : fake_v_->rounds) {
    EXPECT_GE(rr.refresh_delay_us(), 0);
    EXPECT_LE(rr.refresh_delay_us(), 1000000);
  }
}

TEST_F(RunnerTest, PeerRoundsGiveBackTheBookedLinkTimeTheirRowsDidNotUse) {
  // Slots of 1 s on a 100 B/s slow link: each round books the most its rows
  // can be (5 rows of 100 bytes and the chunk's framing, about 5 s of link)
  // but sends 5 rows of 20 bytes (1 s). Kept at the bound, the four rounds'
  // refreshes would queue about 5 s apart; shrunk to what crossed, 1 s.
  UseClock(1.0, 100);
  ctx_.options.peer_rounds = true;
  ctx_.kv_bytes_per_token = 100;
  fake_v_->refresh_bytes_per_token = 20;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  ASSERT_EQ(fake_v_->rounds.size(), 4u);
  EXPECT_EQ(plan_.totals.refresh_bytes(), 4 * 5 * 20);
  EXPECT_LE(fake_v_->rounds.back().refresh_delay_us(), 4500000)
      << "the last round's rows queued behind the earlier rounds' unused bounds";
  // What the four rounds left booked: 4 s, so a new transfer starts within
  // a few slots (behind 20 s of bounds it would start 20 slots out).
  absl::StatusOr<Booking> next = clock_->BookTransfer(clock_->NewBookingId(), 100, kSlowLink);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_LE(next->first_slot() - clock_->now(), 6);
}

TEST_F(RunnerTest, PeerRoundsWithoutKvRefreshBookNothingAndAskForNoRows) {
  UseClock(0.005, 50e3);
  ctx_.options.peer_rounds = true;
  ctx_.options.kv_refresh = false;
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(clock_->stats().transfers, 0);
  EXPECT_EQ(plan_.totals.refresh_bytes(), 0);
  for (const pb::RoundRequest& rr : fake_v_->rounds) EXPECT_TRUE(rr.skip_refresh());
}

TEST_F(RunnerTest, APeerDrafterThatDiesFallsBackToTheVerifierAndStaysExact) {
  ctx_.options.peer_rounds = true;
  fake_d_->draft_error = absl::UnavailableError("connection refused");
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20));
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0],
            "drafter: drafter fake-drafter:1 Draft: connection refused (from verifier "
            "fake-verifier:1)");
  EXPECT_EQ(calls_.Count("v.LoadResident"), 1);
}

TEST_F(RunnerTest, APeerCommitThatFailsKeepsTheVerifiedTokensAndFallsBack) {
  ctx_.options.peer_rounds = true;
  fake_d_->commit_error = absl::UnavailableError("socket closed");
  ASSERT_TRUE(BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_)).ok());
  EXPECT_EQ(sink_.tokens, Expected(20)) << "the first round's 5 tokens stand, then full KV";
  EXPECT_EQ(plan_.totals.verify_rounds(), 1);
  EXPECT_EQ(plan_.totals.fallbacks(), 1);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_NE(failures_[0].find("Commit: socket closed"), std::string::npos) << failures_[0];
}

TEST_F(RunnerTest, APeerDrafterRefusingTheRequestFailsIt) {
  ctx_.options.peer_rounds = true;
  fake_d_->draft_error = absl::InvalidArgumentError("bad lookahead");
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "drafter fake-drafter:1 Draft: bad lookahead (from verifier fake-verifier:1)");
}

TEST_F(RunnerTest, AFailedRoundFailsTheRequestWithTheVerifiersName) {
  ctx_.options.peer_rounds = true;
  fake_v_->round_error = absl::UnavailableError("socket closed");
  const absl::Status s = BlockOn(RunVeriCache(ctx_, plan_, r_, &sink_));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "verifier fake-verifier:1 Round: socket closed");
  EXPECT_TRUE(sink_.tokens.empty());
}

}  // namespace
}  // namespace vc::coordinator
