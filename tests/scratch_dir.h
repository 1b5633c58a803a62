// A test's scratch directory: made fresh under gtest's TempDir() and removed
// with everything in it when its owner goes away.
//
// ctest runs every test case in its own process, so a directory named after
// the pid and left behind piles up (thousands of directories of daemon logs,
// certificates and private keys in /tmp on a development machine). The
// directory stays only where a test of this process has failed, for its
// logs; the failing test's messages name it.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace vc::test_support {

class ScratchDir {
 public:
  // The directory is <TempDir()>/<prefix>XXXXXX, made mode 0700.
  explicit ScratchDir(std::string_view prefix) {
    std::string tmpl = ::testing::TempDir();
    if (!tmpl.empty() && tmpl.back() != '/') tmpl += '/';
    tmpl.append(prefix);
    tmpl += "XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) {
      path_ = tmpl;
    } else {
      ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    }
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    if (::testing::UnitTest::GetInstance()->Failed()) {
      std::fprintf(stderr, "kept %s (a test failed)\n", path_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // Empty when the directory could not be made (the test has failed then).
  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string operator/(std::string_view name) const {
    // (Not path_ + "/" + ...: GCC 12 at -O3 reports a false -Wrestrict there.)
    std::string path = path_;
    path += '/';
    path.append(name);
    return path;
  }
  // Makes directory `name` (and its parents) inside; returns its path.
  std::string Subdir(std::string_view name) const {
    const std::string path = *this / name;
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) ADD_FAILURE() << "cannot make " << path << ": " << ec.message();
    return path;
  }

 private:
  std::string path_;
};

}  // namespace vc::test_support
