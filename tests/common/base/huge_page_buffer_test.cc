#include "common/base/huge_page_buffer.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "gtest/gtest.h"

namespace vc {
namespace {

TEST(HugePageBufferTest, ZeroedWritableAndOnAHugePageBoundary) {
  for (size_t bytes :
       {size_t{1}, size_t{4096}, (size_t{2} << 20) - 1, size_t{2} << 20, (size_t{5} << 20) + 123}) {
    auto b = HugePageBuffer::Allocate(bytes);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_NE(b->data(), nullptr);
    EXPECT_EQ(b->size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (size_t{2} << 20), 0u) << bytes;
    auto* p = static_cast<unsigned char*>(b->data());
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i += 509) nonzero += p[i] != 0 ? 1 : 0;
    nonzero += p[bytes - 1] != 0 ? 1 : 0;
    EXPECT_EQ(nonzero, 0u) << bytes;
    std::memset(p, 0xAB, bytes);  // every byte asked for is writable
    EXPECT_EQ(p[bytes - 1], 0xAB);
  }
}

TEST(HugePageBufferTest, EmptyForZeroBytes) {
  auto b = HugePageBuffer::Allocate(0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_EQ(b->size(), 0u);
}

TEST(HugePageBufferTest, AnImpossibleSizeIsResourceExhausted) {
  auto b = HugePageBuffer::Allocate(SIZE_MAX - 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("bytes"), absl::string_view::npos);
}

// A freed buffer's mapping is kept for the next one of about its size, which
// must still start zeroed.
TEST(HugePageBufferTest, AKeptMappingIsReusedAndZeroedAgain) {
  const size_t bytes = (size_t{3} << 20) + 5;
  void* first = nullptr;
  {
    auto a = HugePageBuffer::Allocate(bytes);
    ASSERT_TRUE(a.ok());
    first = a->data();
    std::memset(a->data(), 0x5A, bytes);
  }
  auto b = HugePageBuffer::Allocate(bytes - 1000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);
  const auto* p = static_cast<const unsigned char*>(b->data());
  size_t nonzero = 0;
  for (size_t i = 0; i < b->size(); ++i) nonzero += p[i] != 0 ? 1 : 0;
  EXPECT_EQ(nonzero, 0u);
  // Much smaller buffers do not take it (at most twice the size asked for).
  auto c = HugePageBuffer::Allocate(size_t{1} << 20);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->data(), first);
}

TEST(HugePageBufferTest, MovingHandsOverTheMapping) {
  auto a = HugePageBuffer::Allocate(size_t{3} << 20);
  ASSERT_TRUE(a.ok());
  void* p = a->data();
  static_cast<char*>(p)[100] = 7;
  HugePageBuffer b = std::move(a).value();
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(static_cast<char*>(b.data())[100], 7);
  HugePageBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.size(), 0u);       // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace vc
