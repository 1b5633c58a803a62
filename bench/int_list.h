// Comma-separated integer lists for the benchmarks' flags (--tokens,
// --batches, --pass-tokens): one parser, so every bench refuses a bad item
// the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace vc::bench {

// Every item of `text` as an integer in [lo, hi], in the order given;
// otherwise InvalidArgument "FLAG: 'ITEM' is not an integer in [LO, HI]"
// (an empty list or an empty item included).
inline absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag,
                                                         absl::string_view text, int64_t lo,
                                                         int64_t hi) {
  std::vector<int64_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", item, "' is not an integer in [", lo, ", ", hi, "]"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace vc::bench
