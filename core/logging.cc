#include "sluice/core/logging.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sluice {

absl::Status SetLogLevel(const std::string& level) {
  auto l = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; accept "off" only when asked.
  if (l == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log level '", level, "'; expected trace, debug, info, warn, error, critical or off"));
  }
  spdlog::set_level(l);
  return absl::OkStatus();
}

void InitLoggingFromEnv() {
  const char* v = std::getenv("SLUICE_LOG_LEVEL");
  if (v == nullptr || *v == '\0') return;
  absl::Status s = SetLogLevel(v);
  if (!s.ok()) std::fprintf(stderr, "sluice: SLUICE_LOG_LEVEL: %s\n", std::string(s.message()).c_str());
}

}  // namespace sluice
