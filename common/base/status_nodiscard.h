// Makes absl::Status and absl::StatusOr<T> [[nodiscard]] types in every
// translation unit of the build (force-included by the top CMakeLists.txt
// before any other header, or as the first header of a shared precompiled
// header: cmake/precompiled_headers.cmake).
//
// Why: Debian's Abseil (20220623) leaves the class-level ABSL_MUST_USE_RESULT
// commented out, so a call whose Status is dropped compiles silently and an
// error vanishes. A class may be redeclared with [[nodiscard]] before its
// definition, which marks every function returning it; with
// -Werror=unused-result (also set there) a discarded Status is a compile
// error in every build type. To drop one on purpose, say so:
// `status.IgnoreError();` or a `(void)` cast with a comment saying why.
#pragma once

#include "absl/base/config.h"

namespace absl {
ABSL_NAMESPACE_BEGIN
class [[nodiscard]] Status;
template <typename T>
class [[nodiscard]] StatusOr;
ABSL_NAMESPACE_END
}  // namespace absl
