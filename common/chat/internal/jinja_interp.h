// Private to common/chat: renders a parsed template over a set of variables.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/internal/jinja_ast.h"
#include "common/chat/internal/jinja_value.h"

namespace vc::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // the rendered text
  // Bytes of strings built along the way (concatenations, filters): bounds
  // the work a template can do, e.g. a loop growing a string.
  size_t max_work_bytes = size_t{256} << 20;
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together
  int max_call_depth = 64;                  // nested macro calls
};

// Renders `body` with `globals` (name -> value) and the built-ins (range,
// namespace, raise_exception, dict). raise_exception(msg) gives
// InvalidArgument(msg); exceeding a limit gives ResourceExhausted; type
// errors give InvalidArgument naming the template line.
absl::StatusOr<std::string> Render(const Body& body,
                                   const std::vector<std::pair<std::string, Value>>& globals,
                                   const RenderLimits& limits);

}  // namespace vc::jinja
