// Status helpers shared by every sluice module.
//
// Fallible functions return absl::Status / absl::StatusOr<T>; no exceptions
// cross module boundaries. These macros propagate errors:
//
//   SLUICE_RETURN_IF_ERROR(DoThing());
//   SLUICE_ASSIGN_OR_RETURN(auto value, MakeValue());
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SLUICE_STATUS_CONCAT_INNER_(a, b) a##b
#define SLUICE_STATUS_CONCAT_(a, b) SLUICE_STATUS_CONCAT_INNER_(a, b)

#define SLUICE_RETURN_IF_ERROR(expr)                \
  do {                                              \
    ::absl::Status sluice_status_ = (expr);         \
    if (!sluice_status_.ok()) return sluice_status_; \
  } while (0)

#define SLUICE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(*tmp)

#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_STATUS_CONCAT_(sluice_statusor_, __LINE__), lhs, expr)
