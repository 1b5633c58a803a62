// The CUDA backend's weight cache bookkeeping (kernels/cuda/internal/
// weight_cache.h), with a host vector standing in for the device copy: a
// cached copy is only ever served when it equals the caller's bytes, and the
// cache stays within its budget.
#include "kernels/cuda/internal/weight_cache.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace vc::kernels::cuda {
namespace {

using Copy = std::vector<unsigned char>;

// An upload that copies the bytes and counts its calls.
struct FakeUpload {
  int calls = 0;
  bool fail = false;
  auto fn() {
    return [this](const void* host, size_t bytes, Copy& payload) {
      ++calls;
      if (fail) return false;
      payload.assign(static_cast<const unsigned char*>(host),
                     static_cast<const unsigned char*>(host) + bytes);
      return true;
    };
  }
};

bool Holds(const Copy* payload, const std::vector<float>& v) {
  return payload != nullptr && payload->size() == v.size() * sizeof(float) &&
         std::memcmp(payload->data(), v.data(), payload->size()) == 0;
}

size_t Bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }

TEST(WeightCacheTest, HitUploadsOnce) {
  WeightCache<Copy> cache(1024);
  FakeUpload up;
  bool ok = false;
  const std::vector<float> w = {1, 2, 3, 4};
  EXPECT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  EXPECT_TRUE(ok);
  EXPECT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  EXPECT_EQ(up.calls, 1);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.bytes_used(), Bytes(w));
}

TEST(WeightCacheTest, ChangedBytesAtTheSameAddressAreUploadedAgain) {
  WeightCache<Copy> cache(1024);
  FakeUpload up;
  bool ok = false;
  std::vector<float> w = {1, 2, 3, 4};
  ASSERT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  w[2] = -7.0f;
  EXPECT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  EXPECT_EQ(up.calls, 2);
  EXPECT_EQ(cache.refreshes(), 1);
  EXPECT_EQ(cache.entries(), 1u);
  // A -0.0 vs +0.0 change is a change too (bytes, not values, are compared).
  w[0] = 0.0f;
  ASSERT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  w[0] = -0.0f;
  EXPECT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  EXPECT_EQ(up.calls, 4);
}

TEST(WeightCacheTest, SameAddressOtherSizeIsAnotherEntry) {
  WeightCache<Copy> cache(1024);
  FakeUpload up;
  bool ok = false;
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  const std::vector<float> head(w.begin(), w.begin() + 3);
  EXPECT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  EXPECT_TRUE(Holds(cache.Get(w.data(), Bytes(head), up.fn(), &ok), head));
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_EQ(cache.bytes_used(), Bytes(w) + Bytes(head));
}

TEST(WeightCacheTest, EvictsLeastRecentlyUsedWithinBudget) {
  const std::vector<float> a(16, 1.0f), b(16, 2.0f), c(16, 3.0f);  // 64 bytes each
  WeightCache<Copy> cache(128);
  FakeUpload up;
  bool ok = false;
  cache.Get(a.data(), Bytes(a), up.fn(), &ok);
  cache.Get(b.data(), Bytes(b), up.fn(), &ok);
  cache.Get(a.data(), Bytes(a), up.fn(), &ok);  // a is now the most recent
  EXPECT_EQ(up.calls, 2);
  EXPECT_TRUE(Holds(cache.Get(c.data(), Bytes(c), up.fn(), &ok), c));  // evicts b
  EXPECT_EQ(up.calls, 3);
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_LE(cache.bytes_used(), cache.budget_bytes());
  cache.Get(a.data(), Bytes(a), up.fn(), &ok);
  EXPECT_EQ(up.calls, 3);  // a stayed
  EXPECT_TRUE(Holds(cache.Get(b.data(), Bytes(b), up.fn(), &ok), b));
  EXPECT_EQ(up.calls, 4);  // b had gone
}

TEST(WeightCacheTest, TooLargeOrEmptyIsNotCached) {
  WeightCache<Copy> cache(32);
  FakeUpload up;
  bool ok = false;
  const std::vector<float> big(9, 1.0f);  // 36 bytes > 32
  EXPECT_EQ(cache.Get(big.data(), Bytes(big), up.fn(), &ok), nullptr);
  EXPECT_TRUE(ok);
  EXPECT_EQ(cache.Get(big.data(), 0, up.fn(), &ok), nullptr);
  EXPECT_TRUE(ok);
  EXPECT_EQ(up.calls, 0);
  EXPECT_EQ(cache.entries(), 0u);
}

TEST(WeightCacheTest, FailedUploadDropsTheEntry) {
  WeightCache<Copy> cache(1024);
  FakeUpload up;
  bool ok = true;
  std::vector<float> w = {1, 2, 3};
  up.fail = true;
  EXPECT_EQ(cache.Get(w.data(), Bytes(w), up.fn(), &ok), nullptr);
  EXPECT_FALSE(ok);
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(cache.bytes_used(), 0u);
  up.fail = false;
  ASSERT_TRUE(Holds(cache.Get(w.data(), Bytes(w), up.fn(), &ok), w));
  w[1] = 9.0f;  // a failed refresh drops the entry too
  up.fail = true;
  EXPECT_EQ(cache.Get(w.data(), Bytes(w), up.fn(), &ok), nullptr);
  EXPECT_FALSE(ok);
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(cache.bytes_used(), 0u);
}

TEST(WeightCacheTest, ClearFreesEverything) {
  WeightCache<Copy> cache(1024);
  FakeUpload up;
  bool ok = false;
  const std::vector<float> a(4, 1.0f), b(4, 2.0f);
  cache.Get(a.data(), Bytes(a), up.fn(), &ok);
  cache.Get(b.data(), Bytes(b), up.fn(), &ok);
  cache.Clear();
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(cache.bytes_used(), 0u);
  EXPECT_TRUE(Holds(cache.Get(a.data(), Bytes(a), up.fn(), &ok), a));
  EXPECT_EQ(up.calls, 3);
}

}  // namespace
}  // namespace vc::kernels::cuda
