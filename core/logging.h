// Logging controls. sluice logs through spdlog's default logger.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace sluice {

// "trace", "debug", "info" (default), "warn", "error", "critical" or "off".
absl::Status SetLogLevel(const std::string& level);

// Applies $SLUICE_LOG_LEVEL when set (an invalid value is reported on
// stderr and ignored). The binaries and examples call this at start.
void InitLoggingFromEnv();

}  // namespace sluice
