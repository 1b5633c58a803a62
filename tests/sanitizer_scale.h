// Problem sizes for the numerics tests under a sanitizer.
//
// The numerics tests run twice per commit: at full size in the optimised gcc
// build, where their numbers are the point, and again in the clang
// ASan+UBSan build, where memory errors are. There every run costs 3-10x,
// and the full sizes made four tests a third of the sanitizer stage's CPU.
// Under a sanitizer they run the same code paths over fewer cases
// (deploy/scripts/test.sh, docs/testing.md).
#pragma once

#include <initializer_list>
#include <vector>

namespace vc::test_support {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(undefined_behavior_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

// `full` in an unsanitised build, `sanitized` (a subset of it) under a
// sanitizer.
template <typename T>
std::vector<T> FullOrUnderSanitizer(std::initializer_list<T> full,
                                    std::initializer_list<T> sanitized) {
  return kUnderSanitizer ? std::vector<T>(sanitized) : std::vector<T>(full);
}

}  // namespace vc::test_support
