#include "services/coordinator/worker_compat.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace vc::coordinator {
namespace {

::vericache::v1::WorkerInfoResponse Info(const std::string& model_id, uint32_t numerics,
                                         const std::vector<int32_t>& eos) {
  ::vericache::v1::WorkerInfoResponse info;
  info.set_model_id(model_id);
  info.set_numerics_version(numerics);
  for (int32_t id : eos) info.add_eos_ids(id);
  info.set_vocab_size(512);
  info.set_context_length(512);
  info.set_kv_bytes_per_token(1280);
  return info;
}

TEST(WorkerCompatTest, TheSameModelNumericsAndStopIdsMatch) {
  const WorkerModel first = WorkerModelOf(Info("m1", 258, {2}));
  EXPECT_TRUE(CheckSameModel(first, WorkerModelOf(Info("m1", 258, {2})), "w:1").ok());
}

TEST(WorkerCompatTest, AnotherNumericsVersionOfTheSameWeightsIsRefusedByName) {
  const WorkerModel first = WorkerModelOf(Info("m1", 2, {2}));
  const absl::Status s = CheckSameModel(first, WorkerModelOf(Info("m1", 258, {2})), "w:1");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("w:1 runs numerics version 258, the first worker 2"),
            std::string::npos)
      << s;
}

TEST(WorkerCompatTest, AnotherModelIsRefusedBeforeItsNumericsAreCompared) {
  const WorkerModel first = WorkerModelOf(Info(std::string("\x01\x02", 2), 2, {2}));
  const absl::Status s =
      CheckSameModel(first, WorkerModelOf(Info(std::string("\x01\x03", 2), 258, {2})), "w:2");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("runs another model (id 0103, expected 0102)"), std::string::npos)
      << s;
}

TEST(WorkerCompatTest, OtherStopIdsAreRefused) {
  const WorkerModel first = WorkerModelOf(Info("m1", 2, {2, 7}));
  const absl::Status s = CheckSameModel(first, WorkerModelOf(Info("m1", 2, {2})), "w:3");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("{2}, the first worker at {2,7}"), std::string::npos) << s;
}

TEST(WorkerCompatTest, AWorkerThatPredatesTheStopListReportsItsSingleEosId) {
  ::vericache::v1::WorkerInfoResponse old = Info("m1", 2, {});
  old.set_eos_id(5);
  EXPECT_EQ(WorkerModelOf(old).eos_ids, std::vector<int32_t>{5});
  EXPECT_TRUE(CheckSameModel(WorkerModelOf(Info("m1", 2, {5})), WorkerModelOf(old), "w:4").ok());
}

TEST(WorkerCompatTest, AnotherDraftModelOrNoneIsRefused) {
  ::vericache::v1::WorkerInfoResponse a = Info("m1", 2, {2});
  a.set_draft_model_id(std::string("\xab\xcd", 2));
  ::vericache::v1::WorkerInfoResponse b = a;
  b.set_draft_model_id(std::string("\xab\xce", 2));
  const WorkerModel first = WorkerModelOf(a);
  EXPECT_TRUE(CheckSameModel(first, WorkerModelOf(a), "w:5").ok());
  const absl::Status other = CheckSameModel(first, WorkerModelOf(b), "w:5");
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("w:5 has draft model abce, the first worker abcd"),
            std::string::npos)
      << other;
  // A drafter of the target beside a draft-model pool, and the reverse.
  const absl::Status none = CheckSameModel(first, WorkerModelOf(Info("m1", 2, {2})), "w:6");
  EXPECT_NE(none.message().find("has draft model none (drafts with the target)"), std::string::npos)
      << none;
  EXPECT_FALSE(CheckSameModel(WorkerModelOf(Info("m1", 2, {2})), first, "w:7").ok());
}

// The shape comes from a peer and is computed with (a prefix's tokens times
// its KV bytes per token): out of bounds it is refused, even from the first
// worker, whose answer is checked against itself; another worker with the
// same model id must report the same shape.
TEST(WorkerCompatTest, AShapeOutOfBoundsOrUnlikeTheFirstWorkersIsRefused) {
  const WorkerModel first = WorkerModelOf(Info("m1", 2, {2}));
  for (auto bad : {+[](::vericache::v1::WorkerInfoResponse& i) { i.set_vocab_size(0); },
                   +[](::vericache::v1::WorkerInfoResponse& i) { i.set_context_length(-1); },
                   +[](::vericache::v1::WorkerInfoResponse& i) { i.set_kv_bytes_per_token(0); },
                   +[](::vericache::v1::WorkerInfoResponse& i) {
                     i.set_kv_bytes_per_token(kMaxWorkerKvBytesPerToken + 1);
                   }}) {
    ::vericache::v1::WorkerInfoResponse info = Info("m1", 2, {2});
    bad(info);
    const WorkerModel worker = WorkerModelOf(info);
    const absl::Status s = CheckSameModel(worker, worker, "w:8");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("worker w:8 reports a vocabulary of"), std::string::npos) << s;
  }
  ::vericache::v1::WorkerInfoResponse big = Info("m1", 2, {2});
  big.set_kv_bytes_per_token(kMaxWorkerKvBytesPerToken);
  big.set_context_length(INT32_MAX);
  const WorkerModel largest = WorkerModelOf(big);
  EXPECT_TRUE(CheckSameModel(largest, largest, "w:9").ok()) << "the bounds are inclusive";
  int64_t bytes = 0;
  EXPECT_FALSE(
      __builtin_mul_overflow(int64_t{largest.context_length}, largest.kv_bytes_per_token, &bytes));

  ::vericache::v1::WorkerInfoResponse other = Info("m1", 2, {2});
  other.set_kv_bytes_per_token(2560);
  const absl::Status s = CheckSameModel(first, WorkerModelOf(other), "w:10");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("w:10 reports the same model with a vocabulary of 512, a context of "
                             "512 and 2560 bytes of KV per token, the first worker 512, 512 and "
                             "1280"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace vc::coordinator
