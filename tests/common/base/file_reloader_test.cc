#include "common/base/file_reloader.h"

#include <unistd.h>

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

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Rotation the way certificates are rotated: write aside, rename over.
void Rotate(const std::string& path, const std::string& text) {
  std::ofstream(path + ".next", std::ios::binary | std::ios::trunc) << text;
  std::filesystem::rename(path + ".next", path);
}

// Builds the file's text, refusing text that starts with "bad".
absl::StatusOr<std::string> Build(const std::string& path, int* builds) {
  ++*builds;
  std::string text = Read(path);
  if (text.rfind("bad", 0) == 0) return absl::InvalidArgumentError("bad contents");
  return text;
}

TEST(FileReloaderTest, RebuildsOnlyWhenAFileChanges) {
  const std::string path = TempPath("vc-file-reloader");
  Rotate(path, "one");
  int builds = 0;
  auto reloader =
      FileReloader<std::string>::Create({{"--cert", path}}, [&] { return Build(path, &builds); });
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  EXPECT_EQ((*reloader)->Get(), "one");
  EXPECT_EQ((*reloader)->Get(), "one");
  EXPECT_EQ(builds, 1);
  EXPECT_EQ((*reloader)->reloads(), 0);

  Rotate(path, "two");
  EXPECT_EQ((*reloader)->Get(), "two");
  EXPECT_EQ(builds, 2);
  EXPECT_EQ((*reloader)->reloads(), 1);
  std::filesystem::remove(path);
}

TEST(FileReloaderTest, AFailedRebuildKeepsTheLastGoodValueAndIsNotRetriedUntilTheNextChange) {
  const std::string path = TempPath("vc-file-reloader-bad");
  Rotate(path, "good");
  int builds = 0;
  auto reloader =
      FileReloader<std::string>::Create({{"--cert", path}}, [&] { return Build(path, &builds); });
  ASSERT_TRUE(reloader.ok()) << reloader.status();

  Rotate(path, "bad rotation");
  EXPECT_EQ((*reloader)->Get(), "good");
  EXPECT_EQ((*reloader)->Get(), "good");
  EXPECT_EQ(builds, 2);  // the broken version was tried once
  EXPECT_EQ((*reloader)->reloads(), 0);

  // A file that disappears mid-rotation changes nothing either.
  std::filesystem::remove(path);
  EXPECT_EQ((*reloader)->Get(), "good");
  EXPECT_EQ(builds, 2);

  Rotate(path, "fixed");
  EXPECT_EQ((*reloader)->Get(), "fixed");
  EXPECT_EQ((*reloader)->reloads(), 1);
  std::filesystem::remove(path);
}

TEST(FileReloaderTest, CreateNamesAMissingFileAndPassesABuildErrorOn) {
  const std::string present = TempPath("vc-file-reloader-present");
  const std::string missing = TempPath("vc-file-reloader-missing");
  Rotate(present, "x");
  int builds = 0;
  auto no_file = FileReloader<std::string>::Create({{"--cert", present}, {"--key", missing}},
                                                   [&] { return Build(present, &builds); });
  ASSERT_FALSE(no_file.ok());
  EXPECT_EQ(no_file.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(no_file.status().message().find("--key " + missing), std::string::npos)
      << no_file.status();
  EXPECT_EQ(builds, 0);

  Rotate(present, "bad");
  auto bad = FileReloader<std::string>::Create({{"--cert", present}},
                                               [&] { return Build(present, &builds); });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(present);
}

}  // namespace
}  // namespace vc
