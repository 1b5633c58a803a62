#include <cstdio>

#include "services/vericache/commands.h"

namespace vc::cli {

int BadInput(const std::string& command, const std::string& msg) {
  std::fprintf(stderr, "vericache %s: %s\n", command.c_str(), msg.c_str());
  return kExitBadInput;
}

int Fail(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "vericache %s: %s\n", command.c_str(), std::string(status.message()).c_str());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

}  // namespace vc::cli
