// Small helpers for propagating absl::Status values.
#ifndef SHARDPS_COMMON_STATUS_MACROS_H_
#define SHARDPS_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SHARDPS_CONCAT_INNER(a, b) a##b
#define SHARDPS_CONCAT(a, b) SHARDPS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not ok.
#define SHARDPS_RETURN_IF_ERROR(expr)          \
  do {                                         \
    absl::Status _status = (expr);             \
    if (!_status.ok()) return _status;         \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its status.
#define SHARDPS_ASSIGN_OR_RETURN(lhs, expr) \
  SHARDPS_ASSIGN_OR_RETURN_IMPL(SHARDPS_CONCAT(_statusor_, __LINE__), lhs, expr)
#define SHARDPS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#endif  // SHARDPS_COMMON_STATUS_MACROS_H_
