// Status propagation macros. Debian's Abseil (20220623) ships no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so VeriCache defines them once here.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define VC_STATUS_CONCAT_INNER_(a, b) a##b
#define VC_STATUS_CONCAT_(a, b) VC_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function if it is not OK.
#define VC_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::absl::Status vc_status_ = (expr);              \
    if (!vc_status_.ok()) return vc_status_;         \
  } while (false)

// `VC_ASSIGN_OR_RETURN(auto x, Foo());` declares x from a StatusOr or returns
// its error.
#define VC_ASSIGN_OR_RETURN(lhs, expr) \
  VC_ASSIGN_OR_RETURN_IMPL_(VC_STATUS_CONCAT_(vc_statusor_, __LINE__), lhs, expr)

#define VC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

// The same two inside a coroutine (common/base/task.h), which co_returns.
#define VC_CO_RETURN_IF_ERROR(expr)             \
  do {                                          \
    ::absl::Status vc_status_ = (expr);         \
    if (!vc_status_.ok()) co_return vc_status_; \
  } while (false)

#define VC_CO_ASSIGN_OR_RETURN(lhs, expr) \
  VC_CO_ASSIGN_OR_RETURN_IMPL_(VC_STATUS_CONCAT_(vc_statusor_, __LINE__), lhs, expr)

#define VC_CO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) co_return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

// Aborts with a message when an internal invariant is broken. Never used for
// input validation: bad input gets a Status.
#define VC_CHECK(cond, msg)                                                   \
  do {                                                                        \
    if (!(cond)) ::vc::internal::CheckFailed(__FILE__, __LINE__, #cond, msg); \
  } while (false)

namespace vc::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const char* msg);
}  // namespace vc::internal
