// Logging controls. sluice logs through spdlog's default logger.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace sluice {

// "trace", "debug", "info", "warn", "error", "critical" or "off". A
// library linked into a program (a trainer, the Python module) logs at
// "warn" unless told otherwise; the sluice binaries log at "info".
absl::Status SetLogLevel(const std::string& level);

// "text" (default: spdlog's "[time] [level] message") or "json": each line
// is one JSON object
//   {"time":"2024-05-01T12:00:00.123456Z","level":"info","component":"sluice-worker",
//    "pid":123,"thread":456,"message":"worker: serving on 127.0.0.1:5051 ..."}
// (time in UTC, RFC 3339; the message escaped, invalid UTF-8 replaced by
// U+FFFD). `component` names the process (the binaries pass their name).
absl::Status SetLogFormat(const std::string& format, const std::string& component = "sluice");

// Sets `default_level` (when not empty), then applies $SLUICE_LOG_LEVEL and
// $SLUICE_LOG_FORMAT when set (an invalid value is reported on stderr and
// ignored). The binaries (default_level "info") and examples call this at
// start; `component` is passed to SetLogFormat.
void InitLoggingFromEnv(const std::string& component = "sluice",
                        const std::string& default_level = "");

}  // namespace sluice
