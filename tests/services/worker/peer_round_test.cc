// Peer rounds between a real VerifierService and a real DrafterService in
// this process, each behind its own gRPC server, the rows on a real TCP data
// plane (PeerRowsOutbox / PeerRowsFetcher), no store (the sessions have no
// stored prefix). The drafter drafts with int4 weights, so some drafts are
// rejected and the refresh rows matter.
//  * The tokens of consecutive Verifier.Round calls are greedy full-KV
//    decoding of the prompt (DecodeFull, an independent path), and the rows
//    went worker to worker: the verifier's peer counters moved, its outbox
//    is empty after every round.
//  * Stale messages never move a session: a Commit of an earlier round, a
//    Draft or Commit of another epoch are ABORTED, and the next round still
//    decodes exactly.
//  * A drafter that is gone is reported in the Round's answer (its code and
//    message, no verify), not as the verifier's failure; a verifier without
//    a peer data plane refuses Round and Lease.
//  * Leases: rounds granted ahead on one stream decode exactly, answered in
//    grant order (each round's tokens first, before its commit); the first grant's budget bounds
//    the tokens (a grant with no room is answered skipped); a bad grant ends the lease naming its
//    field after the running round; a drafter's failure ends it after that
//    round's progress.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/decode/full_decode.h"
#include "common/kvstore/chunk_key.h"
#include "common/metrics/metrics.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/common/store_client.h"
#include "services/worker/drafter_service.h"
#include "services/worker/peer_rows.h"
#include "services/worker/verifier_service.h"
#include "services/worker/worker_common.h"
#include "tests/loopback_server.h"
#include "tests/services/cluster/cluster_test_text.h"
#include "tests/services/worker/worker_test_util.h"

namespace vc::worker {
namespace {

namespace pb = ::vericache::v1;

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, std::string* address) {
  test_support::LoopbackServer served = test_support::ServeOnLoopback(service);
  *address = served.address;
  return std::move(served.server);
}

std::unique_ptr<grpc::ClientContext> Within(int seconds) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

double CounterValue(metrics::Registry& registry, const std::string& name) {
  const std::string text = registry.Expose();
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

class PeerRoundTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::ifstream(clustertest::StoriesModelPath()).good())
      GTEST_SKIP() << "test model not found: " << clustertest::StoriesModelPath();
    auto model = Model::Load(clustertest::StoriesModelPath());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto verify_engine = testing::OneThreadEngine(*model_);
    ASSERT_TRUE(verify_engine.ok()) << verify_engine.status();
    verify_engine_ = std::move(*verify_engine);
    auto reference_engine = testing::OneThreadEngine(*model_);
    ASSERT_TRUE(reference_engine.ok()) << reference_engine.status();
    reference_engine_ = std::move(*reference_engine);
    // The model's own text: BOS, a token, its greedy continuation.
    prompt_ = {1, 345};
    const std::vector<int32_t> more = Reference(prompt_, 10);
    prompt_.insert(prompt_.end(), more.begin(), more.end());
    QuantizeOptions qo;
    qo.format = kernels::WeightFormat::kInt4;
    auto q = QuantizedWeights::Create(*model_, qo);
    ASSERT_TRUE(q.ok()) << q.status();
    quantized_ = std::move(*q);
    auto draft_engine = testing::OneThreadEngine(*model_, quantized_.get());
    ASSERT_TRUE(draft_engine.ok()) << draft_engine.status();
    draft_engine_ = std::move(*draft_engine);
    auto store = testing::NowhereStore();
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);

    PeerRowsOutboxOptions po;
    po.server.listen = "127.0.0.1:0";
    po.max_bytes = outbox_max_bytes_;
    auto box = PeerRowsOutbox::Create(po);
    ASSERT_TRUE(box.ok()) << box.status();
    outbox_ = std::move(*box);
    const kvstore::ModelId id = kvstore::ComputeModelId(*model_);
    VerifierOptions vo;
    vo.peer_rows = outbox_.get();
    vo.peer_timeout = std::chrono::seconds(30);
    verifier_ = std::make_unique<VerifierService>(verify_engine_.get(), id, store_.get(),
                                                  &verifier_registry_, vo);
    DrafterOptions dopt;
    dopt.continuation_tokens = 0;
    drafter_ = std::make_unique<DrafterService>(draft_engine_.get(), id, store_.get(),
                                                &drafter_registry_, dopt);
    verifier_server_ = Serve(verifier_.get(), &verifier_address_);
    drafter_server_ = Serve(drafter_.get(), &drafter_address_);
    ASSERT_NE(verifier_server_, nullptr);
    ASSERT_NE(drafter_server_, nullptr);
    verifier_stub_ = pb::Verifier::NewStub(
        grpc::CreateChannel(verifier_address_, grpc::InsecureChannelCredentials()));
    drafter_stub_ = pb::Drafter::NewStub(
        grpc::CreateChannel(drafter_address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    const auto soon = std::chrono::system_clock::now() + std::chrono::seconds(5);
    if (verifier_server_) verifier_server_->Shutdown(soon);
    if (drafter_server_) drafter_server_->Shutdown(soon);
    if (verifier_) verifier_->Shutdown();
    if (drafter_) drafter_->Shutdown();
  }

  // Opens `session` on both workers over `prompt`, the drafter with `epoch`.
  void OpenBoth(uint64_t session, const std::vector<int32_t>& prompt, uint64_t epoch) {
    pb::VerifierOpenRequest vreq;
    vreq.set_session_id(session);
    for (int32_t t : prompt) vreq.add_prompt(t);
    pb::VerifierOpenResponse vresp;
    grpc::Status s = verifier_stub_->Open(Within(30).get(), vreq, &vresp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    pb::DrafterOpenRequest dreq;
    dreq.set_session_id(session);
    for (int32_t t : prompt) dreq.add_prompt(t);
    dreq.set_lookahead(4);
    dreq.set_epoch(epoch);
    pb::DrafterOpenResponse dresp;
    s = drafter_stub_->Open(Within(30).get(), dreq, &dresp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // A round of `session` (`take` drafts) on the test's drafter, or `drafter`.
  pb::RoundRequest RoundOf(uint64_t session, uint64_t epoch, uint64_t round, int take,
                           const std::string& drafter = "") {
    pb::RoundRequest req;
    req.set_session_id(session);
    req.set_drafter(drafter.empty() ? drafter_address_ : drafter);
    req.set_epoch(epoch);
    req.set_round(round);
    req.set_take(take);
    req.set_lookahead(take);
    return req;
  }

  // A Round; `load` asks it to fetch the prefix too (RoundRequest.load).
  grpc::Status CallRound(uint64_t session, uint64_t epoch, uint64_t round, int take,
                         pb::RoundResponse* resp, const std::string& drafter = "",
                         bool load = false, int64_t refresh_delay_us = 0) {
    pb::RoundRequest req = RoundOf(session, epoch, round, take, drafter);
    req.set_load(load);
    req.set_refresh_delay_us(refresh_delay_us);
    return verifier_stub_->Round(Within(120).get(), req, resp);
  }

  // A lease grant of `round` (the first carries `budget`).
  pb::LeaseGrant Grant(uint64_t session, uint64_t epoch, uint64_t round, int take,
                       int64_t budget = 0, const std::string& drafter = "") {
    pb::LeaseGrant g;
    *g.mutable_round() = RoundOf(session, epoch, round, take, drafter);
    g.set_budget(budget);
    return g;
  }

  // The next progress of a lease that is not a verified-only one; a
  // verified-only progress must come just before its round's full one with
  // the same tokens (checked here). False when the stream has ended.
  static bool ReadProgress(grpc::ClientReaderWriter<pb::LeaseGrant, pb::LeaseProgress>& stream,
                           pb::LeaseProgress* p, int* verified_seen = nullptr) {
    if (!stream.Read(p)) return false;
    if (!p->verified_only()) return true;
    if (verified_seen != nullptr) ++*verified_seen;
    const pb::LeaseProgress verified = *p;
    EXPECT_TRUE(verified.result().has_verify());
    EXPECT_FALSE(verified.result().has_commit()) << "sent before the commit";
    if (!stream.Read(p)) {
      ADD_FAILURE() << "a verified progress without its round's full progress";
      return false;
    }
    EXPECT_FALSE(p->verified_only());
    EXPECT_EQ(p->round(), verified.round());
    EXPECT_EQ(std::vector<int32_t>(p->result().verify().tokens().begin(),
                                   p->result().verify().tokens().end()),
              std::vector<int32_t>(verified.result().verify().tokens().begin(),
                                   verified.result().verify().tokens().end()));
    return true;
  }

  // One more Round of `session` (after a lease): its tokens, added to
  // `out`, are still exactly full-KV decoding's.
  void ExpectARoundContinuesExactly(uint64_t session, uint64_t epoch, uint64_t round, int take,
                                    std::vector<int32_t>* out) {
    pb::RoundResponse more;
    ASSERT_TRUE(CallRound(session, epoch, round, take, &more).ok());
    ASSERT_EQ(more.drafter_error_code(), 0) << more.drafter_error();
    out->insert(out->end(), more.verify().tokens().begin(), more.verify().tokens().end());
    EXPECT_EQ(*out, Reference(prompt_, static_cast<int>(out->size())));
  }

  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int n) {
    DecodeOptions o;
    o.max_new_tokens = n;
    o.ignore_eos = true;
    auto r = DecodeFull(*reference_engine_, prompt, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<int32_t>{};
  }

  int64_t outbox_max_bytes_ = PeerRowsOutboxOptions{}.max_bytes;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> prompt_;
  std::unique_ptr<QuantizedWeights> quantized_;
  std::unique_ptr<Engine> verify_engine_, draft_engine_, reference_engine_;
  std::unique_ptr<daemon::StoreClient> store_;
  std::unique_ptr<PeerRowsOutbox> outbox_;
  metrics::Registry verifier_registry_, drafter_registry_;
  std::unique_ptr<VerifierService> verifier_;
  std::unique_ptr<DrafterService> drafter_;
  std::unique_ptr<grpc::Server> verifier_server_, drafter_server_;
  std::string verifier_address_, drafter_address_;
  std::unique_ptr<pb::Verifier::Stub> verifier_stub_;
  std::unique_ptr<pb::Drafter::Stub> drafter_stub_;
};

TEST_F(PeerRoundTest, RoundsDecodeExactlyWithRowsWorkerToWorker) {
  OpenBoth(7, prompt_, 41);
  std::vector<int32_t> out;
  int64_t refresh_bytes = 0;
  int accepted = 0, drafted = 0;
  for (uint64_t round = 1; round <= 12; ++round) {
    pb::RoundResponse resp;
    const grpc::Status s = CallRound(7, 41, round, 4, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.drafter_error_code(), 0) << resp.drafter_error();
    ASSERT_TRUE(resp.has_verify());
    EXPECT_FALSE(resp.verify().has_refresh()) << "the rows must not come back to the caller";
    EXPECT_EQ(resp.drafted(), 4);
    EXPECT_GT(resp.refresh_bytes(), 0);
    EXPECT_EQ(resp.refresh_rows(), round == 1
                                       ? static_cast<int>(prompt_.size()) + resp.verify().accepted()
                                       : 1 + resp.verify().accepted());
    EXPECT_EQ(outbox_->entries(), 0) << "rows outlived their commit";
    refresh_bytes += resp.refresh_bytes();
    accepted += resp.verify().accepted();
    drafted += resp.drafted();
    out.insert(out.end(), resp.verify().tokens().begin(), resp.verify().tokens().end());
  }
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
  // int4 drafts: some accepted, some not (the refresh path is exercised).
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  EXPECT_EQ(CounterValue(verifier_registry_, "vericache_peer_rounds_total"), 12);
  EXPECT_EQ(CounterValue(verifier_registry_, "vericache_peer_refresh_bytes_total"),
            static_cast<double>(refresh_bytes));
  EXPECT_GE(outbox_->SlowLinkStats().bytes_total, refresh_bytes);
  EXPECT_EQ(outbox_->bytes(), 0);
}

// An outbox that holds nothing (its byte bound is 1): the rows ride the
// peer Commit itself, and the rounds stay exact instead of failing.
class PeerRoundFullOutboxTest : public PeerRoundTest {
 protected:
  void SetUp() override {
    outbox_max_bytes_ = 1;
    PeerRoundTest::SetUp();
  }
};

TEST_F(PeerRoundFullOutboxTest, RowsRideTheCommitWhenTheOutboxIsFull) {
  OpenBoth(3, prompt_, 2);
  std::vector<int32_t> out;
  for (uint64_t round = 1; round <= 6; ++round) {
    pb::RoundResponse resp;
    const grpc::Status s = CallRound(3, 2, round, 4, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.drafter_error_code(), 0) << resp.drafter_error();
    EXPECT_GT(resp.refresh_bytes(), 0);
    out.insert(out.end(), resp.verify().tokens().begin(), resp.verify().tokens().end());
  }
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
  EXPECT_EQ(CounterValue(verifier_registry_, "vericache_peer_refresh_bytes_total"), 0)
      << "nothing went through the outbox";
  EXPECT_EQ(outbox_->SlowLinkStats().fetches, 0);
}

TEST_F(PeerRoundTest, StaleRoundsAndEpochsAreRefusedAndChangeNothing) {
  OpenBoth(9, prompt_, 5);
  std::vector<int32_t> out;
  for (uint64_t round = 1; round <= 3; ++round) {
    pb::RoundResponse resp;
    ASSERT_TRUE(CallRound(9, 5, round, 3, &resp).ok());
    ASSERT_EQ(resp.drafter_error_code(), 0) << resp.drafter_error();
    out.insert(out.end(), resp.verify().tokens().begin(), resp.verify().tokens().end());
  }
  // A late commit of round 2 (already committed), a commit of the right
  // round in another epoch, a draft of another epoch and a draft of a
  // committed round: all refused.
  {
    pb::CommitRequest req;
    req.set_session_id(9);
    req.set_epoch(5);
    req.set_round(2);
    req.add_tokens(42);
    pb::CommitResponse resp;
    const grpc::Status s = drafter_stub_->Commit(Within(30).get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
    EXPECT_NE(s.error_message().find("stale round 2"), std::string::npos) << s.error_message();
    req.set_epoch(6);
    req.set_round(3);
    const grpc::Status s2 = drafter_stub_->Commit(Within(30).get(), req, &resp);
    EXPECT_EQ(s2.error_code(), grpc::StatusCode::ABORTED) << s2.error_message();
    EXPECT_NE(s2.error_message().find("stale epoch 6"), std::string::npos) << s2.error_message();
    // A stale commit that names rows is refused before it fetches them
    // (nothing listens on port 1: a fetch would be UNAVAILABLE).
    req.set_epoch(5);
    req.set_round(2);
    req.mutable_refresh_from()->set_data_plane("127.0.0.1:1");
    req.mutable_refresh_from()->set_key(std::string(16, 'k'));
    req.mutable_refresh_from()->set_bytes(64);
    const grpc::Status s3 = drafter_stub_->Commit(Within(30).get(), req, &resp);
    EXPECT_EQ(s3.error_code(), grpc::StatusCode::ABORTED) << s3.error_message();
  }
  for (uint64_t epoch : {4, 6}) {
    pb::DraftRequest req;
    req.set_session_id(9);
    req.set_max_tokens(1);
    req.set_min_tokens(1);
    req.set_epoch(epoch);
    req.set_round(4);
    pb::DraftResponse resp;
    const grpc::Status s = drafter_stub_->Draft(Within(30).get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  }
  {
    pb::DraftRequest req;
    req.set_session_id(9);
    req.set_max_tokens(1);
    req.set_min_tokens(1);
    req.set_epoch(5);
    req.set_round(3);
    pb::DraftResponse resp;
    const grpc::Status s = drafter_stub_->Draft(Within(30).get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  }
  // A round of another epoch fails at its Draft, reported as the
  // drafter's, and verifies nothing.
  {
    pb::RoundResponse resp;
    ASSERT_TRUE(CallRound(9, 8, 4, 3, &resp).ok());
    EXPECT_EQ(resp.drafter_error_code(), static_cast<int>(grpc::StatusCode::ABORTED));
    EXPECT_FALSE(resp.has_verify());
  }
  // Nothing moved: the next rounds carry on exactly.
  for (uint64_t round = 4; round <= 8; ++round) {
    pb::RoundResponse resp;
    ASSERT_TRUE(CallRound(9, 5, round, 3, &resp).ok());
    ASSERT_EQ(resp.drafter_error_code(), 0) << resp.drafter_error();
    out.insert(out.end(), resp.verify().tokens().begin(), resp.verify().tokens().end());
  }
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
}

TEST_F(PeerRoundTest, ADrafterThatIsGoneIsReportedAsTheDrafters) {
  OpenBoth(11, prompt_, 1);
  pb::RoundResponse resp;
  // Port 1: nothing listens.
  const grpc::Status s = CallRound(11, 1, 1, 4, &resp, "127.0.0.1:1");
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.drafter_error_code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE))
      << resp.drafter_error();
  EXPECT_NE(resp.drafter_error().find("Draft"), std::string::npos) << resp.drafter_error();
  EXPECT_FALSE(resp.has_verify());
  // The verifier session is intact: a plain verify still decodes.
  pb::VerifyRequest vreq;
  vreq.set_session_id(11);
  pb::VerifyResponse vresp;
  const grpc::Status vs = verifier_stub_->Verify(Within(30).get(), vreq, &vresp);
  ASSERT_TRUE(vs.ok()) << vs.error_message();
  EXPECT_EQ(std::vector<int32_t>(vresp.tokens().begin(), vresp.tokens().end()),
            Reference(prompt_, 1));
}

// A Round that reloads the prefix itself (RoundRequest.load) decodes the
// same tokens, and its rows are offered no earlier than their booked slot on
// the slow link (refresh_delay_us).
TEST_F(PeerRoundTest, ARoundLoadsItsPrefixAndOffersItsRowsAtTheirSlot) {
  OpenBoth(15, prompt_, 3);
  std::vector<int32_t> out;
  for (uint64_t round = 1; round <= 3; ++round) {
    pb::RoundResponse resp;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status s =
        CallRound(15, 3, round, 3, &resp, "", /*load=*/round == 2, round == 3 ? 1000000 : 0);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.drafter_error_code(), 0) << resp.drafter_error();
    if (round == 3) {
      ASSERT_GT(resp.refresh_bytes(), 0);  // else there was nothing to offer late
      EXPECT_GE(wall, 0.99);
    }
    out.insert(out.end(), resp.verify().tokens().begin(), resp.verify().tokens().end());
  }
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
  EXPECT_EQ(outbox_->entries(), 0);
}

// A round whose drafter is gone answers at once, and a verifier shutting
// down with a round waiting for its refresh's slot answers it and stops.
TEST_F(PeerRoundTest, ARoundWaitingForItsRefreshSlotEndsPromptly) {
  OpenBoth(17, prompt_, 1);
  {
    pb::RoundResponse resp;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status s =
        CallRound(17, 1, 1, 4, &resp, "127.0.0.1:1", /*load=*/true, int64_t{60} * 1000000);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.drafter_error_code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  }
  OpenBoth(19, prompt_, 1);
  grpc::Status waiting;
  pb::RoundResponse waiting_resp;
  std::thread round([&] {
    waiting = CallRound(19, 1, 1, 2, &waiting_resp, "", /*load=*/true, int64_t{60} * 1000000);
  });
  // The round is verified and its rows wait for their slot, a minute away.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto start = std::chrono::steady_clock::now();
  verifier_->Shutdown();
  round.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  // Answered: UNAVAILABLE from the slot's wait (or the dropped verify), or
  // (on a machine so loaded that the drafts were not in yet) the cancelled
  // Draft as the drafter's.
  EXPECT_TRUE(waiting.error_code() == grpc::StatusCode::UNAVAILABLE ||
              waiting_resp.drafter_error_code() == static_cast<int>(grpc::StatusCode::CANCELLED))
      << waiting.error_message() << " / " << waiting_resp.drafter_error();
  EXPECT_EQ(outbox_->entries(), 0);
}

TEST_F(PeerRoundTest, BadRoundsAreRefusedWithTheirField) {
  OpenBoth(13, prompt_, 1);
  struct Case {
    uint64_t session, round;
    int take;
    grpc::StatusCode code;
    std::string needle;
  };
  for (const Case& c : {Case{13, 0, 4, grpc::StatusCode::INVALID_ARGUMENT, "round"},
                        Case{13, 1, 0, grpc::StatusCode::INVALID_ARGUMENT, "take"},
                        Case{13, 1, 1 << 20, grpc::StatusCode::INVALID_ARGUMENT, "take"},
                        Case{99, 1, 4, grpc::StatusCode::NOT_FOUND, "no session 99"}}) {
    pb::RoundResponse resp;
    const grpc::Status s = CallRound(c.session, 1, c.round, c.take, &resp);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_NE(s.error_message().find(c.needle), std::string::npos) << s.error_message();
  }
  pb::RoundResponse resp;
  const grpc::Status s = CallRound(13, 1, 1, 1, &resp, "", false, int64_t{601} * 1000 * 1000);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("refresh_delay_us"), std::string::npos) << s.error_message();
}

TEST_F(PeerRoundTest, AVerifierWithoutAPeerDataPlaneRefusesRoundAndLease) {
  VerifierOptions vo;  // no peer_rows
  metrics::Registry registry;
  VerifierService plain(verify_engine_.get(), kvstore::ComputeModelId(*model_), store_.get(),
                        &registry, vo);
  std::string address;
  auto server = Serve(&plain, &address);
  auto stub =
      pb::Verifier::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  pb::RoundRequest req;
  req.set_session_id(1);
  req.set_drafter(drafter_address_);
  req.set_round(1);
  req.set_take(1);
  pb::RoundResponse resp;
  const grpc::Status s = stub->Round(Within(30).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  auto ctx = Within(30);
  auto stream = stub->Lease(ctx.get());
  (void)stream->Write(Grant(1, 1, 1, 1, 10));
  pb::LeaseProgress p;
  EXPECT_FALSE(stream->Read(&p));
  const grpc::Status ls = stream->Finish();
  EXPECT_EQ(ls.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << ls.error_message();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  plain.Shutdown();
}

// Leases: the rounds of a session on one stream, granted ahead.
TEST_F(PeerRoundTest, LeasedRoundsDecodeExactlyWithTheNextGrantAhead) {
  OpenBoth(21, prompt_, 6);
  auto ctx = Within(120);
  auto stream = verifier_stub_->Lease(ctx.get());
  constexpr uint64_t kRounds = 10;
  // Two grants out at a time: the verifier starts each as soon as the one
  // before has committed.
  ASSERT_TRUE(stream->Write(Grant(21, 6, 1, 4, /*budget=*/500)));
  ASSERT_TRUE(stream->Write(Grant(21, 6, 2, 4)));
  uint64_t granted = 2;
  int verified_seen = 0;  // verified-only progress, ahead of each commit
  std::vector<int32_t> out;
  int accepted = 0, drafted = 0;
  for (uint64_t round = 1; round <= kRounds; ++round) {
    pb::LeaseProgress p;
    ASSERT_TRUE(ReadProgress(*stream, &p, &verified_seen)) << "round " << round;
    EXPECT_EQ(p.round(), round) << "progress in grant order";
    EXPECT_FALSE(p.skipped());
    const pb::RoundResponse& r = p.result();
    ASSERT_EQ(r.drafter_error_code(), 0) << r.drafter_error();
    ASSERT_TRUE(r.has_verify());
    EXPECT_FALSE(r.verify().has_refresh()) << "the rows must not come back to the caller";
    EXPECT_GT(r.refresh_bytes(), 0);
    accepted += r.verify().accepted();
    drafted += r.drafted();
    out.insert(out.end(), r.verify().tokens().begin(), r.verify().tokens().end());
    if (granted < kRounds) {
      ASSERT_TRUE(stream->Write(Grant(21, 6, ++granted, 4)));
    }
  }
  ASSERT_TRUE(stream->WritesDone());
  pb::LeaseProgress extra;
  EXPECT_FALSE(ReadProgress(*stream, &extra)) << "no progress beyond the grants";
  EXPECT_EQ(verified_seen, static_cast<int>(kRounds)) << "each round's tokens before its commit";
  const grpc::Status s = stream->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  EXPECT_EQ(CounterValue(verifier_registry_, "vericache_peer_rounds_total"), kRounds);
  EXPECT_EQ(outbox_->entries(), 0);
  // The session goes on after the lease: a Round continues it exactly.
  ExpectARoundContinuesExactly(21, 6, kRounds + 1, 4, &out);
}

// The first grant's budget bounds the lease's tokens: a round takes at most
// budget_left - 1 drafts, and a grant with no room left is answered skipped.
TEST_F(PeerRoundTest, ALeaseKeepsItsTokensWithinItsBudget) {
  OpenBoth(23, prompt_, 2);
  auto ctx = Within(120);
  auto stream = verifier_stub_->Lease(ctx.get());
  constexpr int64_t kBudget = 7;
  for (uint64_t round = 1; round <= 4; ++round) {
    ASSERT_TRUE(stream->Write(Grant(23, 2, round, 4, round == 1 ? kBudget : 0)));
  }
  std::vector<int32_t> out;
  int skipped = 0;
  pb::LeaseProgress p;
  // One answer per grant; the half-close comes after them (it ends the
  // lease after the running round: grants not started would not run).
  for (int answers = 0; answers < 4; ++answers) {
    ASSERT_TRUE(ReadProgress(*stream, &p)) << "answer " << answers;
    EXPECT_EQ(p.round(), static_cast<uint64_t>(answers + 1));
    if (p.skipped()) {
      ++skipped;
      continue;
    }
    EXPECT_EQ(skipped, 0) << "a skipped grant is the last to run";
    ASSERT_EQ(p.result().drafter_error_code(), 0) << p.result().drafter_error();
    EXPECT_LE(p.result().drafted(), kBudget - 1 - static_cast<int64_t>(out.size()));
    out.insert(out.end(), p.result().verify().tokens().begin(), p.result().verify().tokens().end());
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(ReadProgress(*stream, &p));
  const grpc::Status s = stream->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LE(static_cast<int64_t>(out.size()), kBudget);
  EXPECT_GE(static_cast<int64_t>(out.size()), kBudget - 1) << "the budget is used up";
  EXPECT_GE(skipped, 1);
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
}

TEST_F(PeerRoundTest, BadGrantsEndTheLeaseWithTheirField) {
  OpenBoth(25, prompt_, 4);
  {
    auto ctx = Within(60);
    auto stream = verifier_stub_->Lease(ctx.get());
    ASSERT_TRUE(stream->Write(Grant(25, 4, 1, 4, /*budget=*/0)));
    pb::LeaseProgress p;
    EXPECT_FALSE(ReadProgress(*stream, &p));
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("budget"), std::string::npos) << s.error_message();
  }
  // A good first grant, then a bad one: the first's round runs and
  // answers, then the lease ends naming the field. (Round ids go on across
  // the leases of the session: the drafter refuses a round it committed.)
  uint64_t round = 1;
  struct Case {
    std::function<pb::LeaseGrant(uint64_t next)> second;
    std::string needle;
  };
  for (const Case& c : {
           Case{[&](uint64_t next) { return Grant(25, 4, next + 1, 4); }, "after round"},
           Case{[&](uint64_t next) { return Grant(25, 9, next, 4); },
                "session, drafter and epoch must be the first grant's"},
           Case{[&](uint64_t next) { return Grant(25, 4, next, 0); }, "take"},
       }) {
    auto ctx = Within(60);
    auto stream = verifier_stub_->Lease(ctx.get());
    ASSERT_TRUE(stream->Write(Grant(25, 4, round, 2, 100)));
    ASSERT_TRUE(stream->Write(c.second(round + 1)));
    pb::LeaseProgress p;
    int progress = 0;
    while (ReadProgress(*stream, &p)) {
      ++progress;
      EXPECT_EQ(p.round(), round);
    }
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find(c.needle), std::string::npos) << s.error_message();
    EXPECT_EQ(progress, 1) << "the first grant's round still ran and answered";
    ++round;
  }
}

// With the next grant on the verifier when a round commits, the commit
// takes that grant's drafts along (CommitRequest.next): its round makes no
// Draft call, its drafts' steps count in the round before, and the tokens
// are still exactly full-KV decoding's.
TEST_F(PeerRoundTest, ACommitTakesTheNextGrantsDraftsAlong) {
  OpenBoth(29, prompt_, 3);
  auto ctx = Within(120);
  auto stream = verifier_stub_->Lease(ctx.get());
  constexpr uint64_t kRounds = 4;  // the verifier keeps at most 4 ahead
  for (uint64_t round = 1; round <= kRounds; ++round) {
    ASSERT_TRUE(stream->Write(Grant(29, 3, round, 3, round == 1 ? 500 : 0)));
  }
  std::vector<int32_t> out;
  int with_commit = 0;
  for (uint64_t round = 1; round <= kRounds; ++round) {
    pb::LeaseProgress p;
    ASSERT_TRUE(ReadProgress(*stream, &p)) << "round " << round;
    const pb::RoundResponse& r = p.result();
    ASSERT_EQ(r.drafter_error_code(), 0) << r.drafter_error();
    ASSERT_TRUE(r.has_verify());
    EXPECT_FALSE(r.commit().has_next()) << "the drafts stay on the verifier";
    if (round == 1) {
      EXPECT_FALSE(r.drafts_with_commit()) << "no commit came before it";
    }
    if (r.drafts_with_commit()) {
      ++with_commit;
      EXPECT_EQ(r.peer_draft_seconds(), 0) << "no Draft call";
      EXPECT_GT(r.drafted(), 0);
    }
    out.insert(out.end(), r.verify().tokens().begin(), r.verify().tokens().end());
  }
  ASSERT_TRUE(stream->WritesDone());
  pb::LeaseProgress extra;
  EXPECT_FALSE(ReadProgress(*stream, &extra));
  const grpc::Status s = stream->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
  // Every grant was written before round 1 could have committed.
  EXPECT_GE(with_commit, 1);
  EXPECT_EQ(CounterValue(verifier_registry_, "vericache_peer_drafts_with_commit_total"),
            with_commit);
  // The session goes on after the lease, exactly.
  ExpectARoundContinuesExactly(29, 3, kRounds + 1, 3, &out);
}

// A commit whose `next` is not the same session's and epoch's later round,
// or is out of bounds, is refused before anything is applied.
TEST_F(PeerRoundTest, ACommitWithABadNextIsRefusedAndChangesNothing) {
  OpenBoth(31, prompt_, 2);
  std::vector<int32_t> out;
  pb::RoundResponse first;
  ASSERT_TRUE(CallRound(31, 2, 1, 3, &first).ok());
  ASSERT_EQ(first.drafter_error_code(), 0) << first.drafter_error();
  out.insert(out.end(), first.verify().tokens().begin(), first.verify().tokens().end());
  // Round 2's drafts, then commits of round 2 with a bad `next`.
  pb::DraftRequest draft;
  draft.set_session_id(31);
  draft.set_max_tokens(3);
  draft.set_min_tokens(3);
  draft.set_epoch(2);
  draft.set_round(2);
  pb::DraftResponse drafts;
  ASSERT_TRUE(drafter_stub_->Draft(Within(30).get(), draft, &drafts).ok());
  struct Case {
    std::function<void(pb::DraftRequest*)> spoil;
    std::string needle;
  };
  for (const Case& c : {
           Case{[](pb::DraftRequest* n) { n->set_session_id(32); }, "same session"},
           Case{[](pb::DraftRequest* n) { n->set_epoch(3); }, "same session and epoch"},
           Case{[](pb::DraftRequest* n) { n->set_round(2); }, "later round"},
           Case{[](pb::DraftRequest* n) { n->set_max_tokens(0); }, "max_tokens"},
           Case{[](pb::DraftRequest* n) { n->set_min_tokens(5); }, "min_tokens"},
       }) {
    pb::CommitRequest req;
    req.set_session_id(31);
    req.set_epoch(2);
    req.set_round(2);
    req.add_tokens(drafts.drafts(0));  // never applied
    pb::DraftRequest* next = req.mutable_next();
    next->set_session_id(31);
    next->set_max_tokens(3);
    next->set_min_tokens(3);
    next->set_epoch(2);
    next->set_round(3);
    c.spoil(next);
    pb::CommitResponse resp;
    const grpc::Status st = drafter_stub_->Commit(Within(30).get(), req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(c.needle), std::string::npos) << st.error_message();
  }
  // Nothing was committed: the rounds go on exactly (round 2's drafts are
  // taken again by its Round).
  for (uint64_t round = 2; round <= 4; ++round) {
    pb::RoundResponse resp;
    ASSERT_TRUE(CallRound(31, 2, round, 3, &resp).ok());
    ASSERT_EQ(resp.drafter_error_code(), 0) << resp.drafter_error();
    out.insert(out.end(), resp.verify().tokens().begin(), resp.verify().tokens().end());
  }
  EXPECT_EQ(out, Reference(prompt_, static_cast<int>(out.size())));
}

TEST_F(PeerRoundTest, ALeaseWhoseDrafterIsGoneEndsAfterThatRound) {
  OpenBoth(27, prompt_, 1);
  auto ctx = Within(60);
  auto stream = verifier_stub_->Lease(ctx.get());
  ASSERT_TRUE(stream->Write(Grant(27, 1, 1, 4, 100, "127.0.0.1:1")));
  // The drafter's refusal may end the lease before this grant is written
  // (the write then fails): either way it is not run.
  (void)stream->Write(Grant(27, 1, 2, 4, 0, "127.0.0.1:1"));
  pb::LeaseProgress p;
  ASSERT_TRUE(ReadProgress(*stream, &p));
  EXPECT_EQ(p.round(), 1u);
  EXPECT_EQ(p.result().drafter_error_code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE))
      << p.result().drafter_error();
  EXPECT_FALSE(p.result().has_verify());
  EXPECT_FALSE(ReadProgress(*stream, &p)) << "the grant after the drafter's failure is not run";
  const grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// The outbox and fetcher alone: bounds, one-shot keys, sizes checked.
TEST(PeerRowsTest, OutboxServesItsRowsUntilRemovedAndKeepsItsBounds) {
  PeerRowsOutboxOptions po;
  po.server.listen = "127.0.0.1:0";
  po.max_entries = 2;
  po.max_bytes = 1000;
  auto box = PeerRowsOutbox::Create(po);
  ASSERT_TRUE(box.ok()) << box.status();
  std::string a(300, 'a'), b(600, 'b'), c("c"), d(701, 'd');
  auto key = (*box)->Put(&a);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->size(), 16u);
  auto key2 = (*box)->Put(&b);
  ASSERT_TRUE(key2.ok()) << key2.status();
  EXPECT_NE(*key, *key2);
  EXPECT_EQ((*box)->Put(&c).status().code(), absl::StatusCode::kResourceExhausted);  // entries
  EXPECT_EQ(c, "c") << "a refused put leaves the rows with the caller";
  (*box)->Remove(*key2);
  EXPECT_EQ((*box)->Put(&d).status().code(), absl::StatusCode::kResourceExhausted);  // bytes
  EXPECT_EQ(d.size(), 701u);

  PeerRowsFetcher fetcher(PeerRowsFetcherOptions{});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  pb::PeerRows ref;
  ref.set_data_plane((*box)->address());
  ref.set_key(*key);
  ref.set_bytes(300);
  auto rows = fetcher.Fetch(ref, deadline);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::string(300, 'a'));
  ref.set_bytes(299);
  EXPECT_EQ(fetcher.Fetch(ref, deadline).status().code(), absl::StatusCode::kDataLoss);
  ref.set_bytes(300);
  (*box)->Remove(*key);
  EXPECT_EQ(fetcher.Fetch(ref, deadline).status().code(), absl::StatusCode::kNotFound);
  ref.set_key("short");
  EXPECT_EQ(fetcher.Fetch(ref, deadline).status().code(), absl::StatusCode::kInvalidArgument);
  ref.set_key(*key);
  ref.set_bytes(int64_t{1} << 40);
  EXPECT_EQ(fetcher.Fetch(ref, deadline).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*box)->entries(), 0);
  EXPECT_EQ((*box)->bytes(), 0);
}

TEST(PeerRowsTest, AWildcardListenerNeedsAnAdvertisedAddress) {
  PeerRowsOutboxOptions po;
  po.server.listen = "0.0.0.0:0";
  auto box = PeerRowsOutbox::Create(po);
  ASSERT_FALSE(box.ok());
  EXPECT_EQ(box.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(box.status().message().find("--peer-data-advertise"), std::string::npos);
  po.advertise = "10.0.0.7:7411";
  auto ok = PeerRowsOutbox::Create(po);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->address(), "10.0.0.7:7411");
}

// The draft distributions a drafter sends a verifier (Verify, and Draft in a
// peer round): sparse on the wire, dense again on arrival; whatever a peer
// sends that is not a distribution over the vocabulary is refused with the
// draft it came in.
TEST(DraftDistributionWireTest, RoundTripsAndRefusesWhatIsNotADistribution) {
  const std::vector<double> q = {0.0, 0.25, 0.0, 0.0, 0.75, 0.0};
  google::protobuf::RepeatedPtrField<pb::DraftDistribution> wire;
  ToDraftDistribution(q, wire.Add());
  ToDraftDistribution({1.0, 0, 0, 0, 0, 0}, wire.Add());
  EXPECT_EQ(wire.Get(0).tokens_size(), 2);  // zeros are not sent
  auto dense = FromDraftDistributions(wire, 6);
  ASSERT_TRUE(dense.ok()) << dense.status();
  ASSERT_EQ(dense->size(), 2u);
  EXPECT_EQ((*dense)[0], q);
  EXPECT_EQ((*dense)[1], (std::vector<double>{1.0, 0, 0, 0, 0, 0}));

  auto refused = [&](const pb::DraftDistribution& bad) {
    google::protobuf::RepeatedPtrField<pb::DraftDistribution> w = wire;
    *w.Add() = bad;
    auto r = FromDraftDistributions(w, 6);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  pb::DraftDistribution outside;
  outside.add_tokens(6);
  outside.add_probs(1.0);
  EXPECT_NE(refused(outside).find("draft 2:"), std::string::npos);
  pb::DraftDistribution repeated;
  repeated.add_tokens(3);
  repeated.add_probs(0.5);
  repeated.add_tokens(3);
  repeated.add_probs(0.5);
  refused(repeated);
  pb::DraftDistribution negative;
  negative.add_tokens(-1);
  negative.add_probs(1.0);
  refused(negative);
  pb::DraftDistribution uneven;
  uneven.add_tokens(1);
  EXPECT_NE(refused(uneven).find("probabilities"), std::string::npos);
}

}  // namespace
}  // namespace vc::worker
