// StatusIs(code, {"substring", ...}): matches an absl::Status or StatusOr whose
// code is `code` and whose message contains every substring, so tests pin the
// specific thing an error must name (a field, a tensor, a shape).
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace vc::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code, std::vector<std::string> parts)
      : code_(code), parts_(std::move(parts)) {}

  template <typename T>
  bool MatchAndExplain(const T& value, ::testing::MatchResultListener* listener) const {
    const absl::Status& s = GetStatus(value);
    *listener << "status is " << s;
    if (s.code() != code_) return false;
    for (const std::string& p : parts_) {
      if (std::string(s.message()).find(p) == std::string::npos) {
        *listener << ", which lacks \"" << p << "\"";
        return false;
      }
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const {
    *os << "has code " << absl::StatusCodeToString(code_) << " and a message containing";
    for (const std::string& p : parts_) *os << " \"" << p << "\"";
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "not (";
    DescribeTo(os);
    *os << ")";
  }

 private:
  absl::StatusCode code_;
  std::vector<std::string> parts_;
};

inline ::testing::PolymorphicMatcher<StatusIsMatcher> StatusIs(
    absl::StatusCode code, std::vector<std::string> parts = {}) {
  return ::testing::MakePolymorphicMatcher(StatusIsMatcher(code, std::move(parts)));
}

}  // namespace vc::testing
