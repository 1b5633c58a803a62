#include "common/base/mapped_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace vc {
namespace {

TEST(MappedFileTest, MapsContents) {
  const auto path = std::filesystem::temp_directory_path() / "vc_mapped_file_test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello";
  }
  auto f = MappedFile::Open(path.string());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), 5), "hello");
  MappedFile moved = std::move(*f);
  EXPECT_EQ(moved.size(), 5u);
  std::filesystem::remove(path);
}

TEST(MappedFileTest, MissingFileIsNotFoundWithPath) {
  auto f = MappedFile::Open("/nonexistent/vc/file.bin");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(f.status().message()).find("/nonexistent/vc/file.bin"), std::string::npos);
}

TEST(MappedFileTest, DirectoryIsRejected) {
  auto f = MappedFile::Open(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vc
