// The nccl backend registers, refuses two ranks on one GPU and too few GPUs
// with clear errors, and (only where GPUs exist) gathers device buffers.
#include <algorithm>
#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "common/collective/collective.h"
#include "common/collective/nccl/nccl_collective.h"
#include "gtest/gtest.h"

namespace vc::collective {
namespace {

TEST(NcclCollectiveTest, RegistersAndExplainsWhatItNeeds) {
  RegisterNcclBackend();
  const auto names = RegisteredBackends();
  EXPECT_NE(std::find(names.begin(), names.end(), "nccl"), names.end());
  CollectiveOptions o;
  o.backend = "nccl";
  o.size = 2;
  o.devices = {0, 0};
  auto same = CreateGroup(o);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find("one GPU per rank"), std::string::npos) << same.status();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  o.devices.clear();
  o.size = count + 1;
  auto too_many = CreateGroup(o);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("GPUs"), std::string::npos) << too_many.status();
  if (count == 0) GTEST_SKIP() << "no GPU: the nccl backend is compile- and error-tested only";
  o.size = count;
  auto group = CreateGroup(o);
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < count; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      float *send = nullptr, *recv = nullptr;
      ASSERT_EQ(cudaMalloc(&send, sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&recv, sizeof(float) * count), cudaSuccess);
      const float v = static_cast<float>(r + 1);
      ASSERT_EQ(cudaMemcpy(send, &v, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_TRUE((*group)[r]->AllGather(send, 1, recv).ok());
      std::vector<float> host(count);
      ASSERT_EQ(cudaMemcpy(host.data(), recv, sizeof(float) * count, cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (int q = 0; q < count; ++q) EXPECT_EQ(host[q], static_cast<float>(q + 1));
      (void)cudaFree(send);
      (void)cudaFree(recv);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace vc::collective
