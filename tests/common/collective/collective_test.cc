// The cpu collective backend: ranks as threads exchange exactly what each
// operation promises, across many back-to-back calls (a rank that runs ahead
// must not read or overwrite a buffer of the previous call), and mismatched
// sizes or unknown backends are errors, not hangs.
#include "common/collective/collective.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace vc::collective {
namespace {

// Runs fn(rank, comm) on `size` threads.
template <typename Fn>
void RunGroup(int size, Fn fn) {
  CollectiveOptions o;
  o.size = size;
  auto group = CreateGroup(o);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { fn(r, *(*group)[r]); });
  }
  for (auto& t : threads) t.join();
}

float Value(int round, int rank, int j) { return static_cast<float>(round * 1000 + rank * 100 + j); }

TEST(CollectiveTest, AllGatherBroadcastAndAllReduceManyRounds) {
  for (int size : {1, 2, 3, 4, 8}) {
    SCOPED_TRACE(size);
    RunGroup(size, [size](int rank, Communicator& comm) {
      EXPECT_EQ(comm.rank(), rank);
      EXPECT_EQ(comm.size(), size);
      constexpr int kN = 5;
      for (int round = 0; round < 200; ++round) {
        std::vector<float> send(kN), recv(static_cast<size_t>(kN) * size, -1.0f);
        for (int j = 0; j < kN; ++j) send[j] = Value(round, rank, j);
        ASSERT_TRUE(comm.AllGather(send.data(), kN, recv.data()).ok());
        for (int r = 0; r < size; ++r) {
          for (int j = 0; j < kN; ++j) ASSERT_EQ(recv[r * kN + j], Value(round, r, j));
        }
        const int root = round % size;
        std::vector<float> buf(kN);
        for (int j = 0; j < kN; ++j) buf[j] = Value(round, rank, j);
        ASSERT_TRUE(comm.Broadcast(buf.data(), kN, root).ok());
        for (int j = 0; j < kN; ++j) ASSERT_EQ(buf[j], Value(round, root, j));
        for (int j = 0; j < kN; ++j) buf[j] = static_cast<float>(rank + 1) * (j + 1);
        ASSERT_TRUE(comm.AllReduceSum(buf.data(), kN).ok());
        for (int j = 0; j < kN; ++j) {
          ASSERT_EQ(buf[j], static_cast<float>(size * (size + 1) / 2) * (j + 1));
        }
        ASSERT_TRUE(comm.Barrier().ok());
      }
    });
  }
}

TEST(CollectiveTest, AllReduceAddsInRankOrder) {
  // 1 + 1e8 - 1e8 in rank order is 0 in float; other orders give 1.
  RunGroup(3, [](int rank, Communicator& comm) {
    float v = rank == 0 ? 1.0f : (rank == 1 ? 1e8f : -1e8f);
    ASSERT_TRUE(comm.AllReduceSum(&v, 1).ok());
    EXPECT_EQ(v, 0.0f);
  });
}

TEST(CollectiveTest, MismatchedSizesAreAnErrorOnEveryRank) {
  RunGroup(3, [](int rank, Communicator& comm) {
    std::vector<float> send(4, 1.0f), recv(12);
    const absl::Status s = comm.AllGather(send.data(), rank == 2 ? 3 : 4, recv.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    // The group is still usable afterwards.
    EXPECT_TRUE(comm.AllGather(send.data(), 4, recv.data()).ok());
  });
}

TEST(CollectiveTest, BadOptionsAreErrors) {
  CollectiveOptions o;
  o.size = 0;
  EXPECT_EQ(CreateGroup(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.size = 2;
  o.backend = "smoke-signals";
  const auto g = CreateGroup(o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("smoke-signals"), std::string::npos);
  EXPECT_NE(g.status().message().find("cpu"), std::string::npos);
  RunGroup(2, [](int, Communicator& comm) {
    float x = 0;
    EXPECT_EQ(comm.Broadcast(&x, 1, 5).code(), absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace vc::collective
