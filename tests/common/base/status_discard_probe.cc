// Must not compile: tests/common/base/CMakeLists.txt builds it in a ctest and
// expects the compiler to refuse the discarded absl::Status below.
#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace {

absl::Status Fails() { return absl::InternalError("dropped"); }

TEST(StatusDiscardProbe, DropsAStatus) {
  Fails();  // the error the test expects
}

}  // namespace
