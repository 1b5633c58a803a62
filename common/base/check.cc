#include <cstdio>
#include <cstdlib>

#include "common/base/status_macros.h"

namespace vc::internal {

void CheckFailed(const char* file, int line, const char* cond, const char* msg) {
  std::fprintf(stderr, "%s:%d: internal invariant broken: %s (%s)\n", file, line, cond, msg);
  std::abort();
}

}  // namespace vc::internal
