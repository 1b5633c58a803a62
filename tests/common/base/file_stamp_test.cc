#include "common/base/file_stamp.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace vc {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid())))
      .string();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

TEST(FileStampTest, MissingFileHasNoStamp) {
  EXPECT_FALSE(StampFile(TempPath("vc-file-stamp-missing")).has_value());
}

TEST(FileStampTest, SameFileSameStampAndARenamedReplacementDiffers) {
  const std::string path = TempPath("vc-file-stamp");
  const std::string next = path + ".next";
  Write(path, "first");
  const auto a = StampFile(path);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(StampFile(path), a);
  EXPECT_EQ(a->size, 5);
  // A rotation by rename (same size, possibly the same mtime) is a new inode.
  Write(next, "other");
  std::filesystem::rename(next, path);
  const auto b = StampFile(path);
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(b, a);
  // A rewrite in place that changes the size differs too.
  Write(path, "a longer text");
  EXPECT_NE(StampFile(path), b);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace vc
