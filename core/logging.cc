#include "sluice/core/logging.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// Appends `s` as the body of a JSON string: ", \ and control characters
// escaped, invalid UTF-8 bytes replaced by U+FFFD.
void AppendJsonString(std::string_view s, spdlog::memory_buf_t& out) {
  auto put = [&out](std::string_view v) { out.append(v.data(), v.data() + v.size()); };
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      put("\\\"");
    } else if (c == '\\') {
      put("\\\\");
    } else if (c == '\n') {
      put("\\n");
    } else if (c == '\r') {
      put("\\r");
    } else if (c == '\t') {
      put("\\t");
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      put(buf);
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      // A well-formed UTF-8 sequence passes through unchanged.
      size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
      bool ok = len > 0 && i + len <= s.size();
      for (size_t k = 1; ok && k < len; ++k) {
        ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      }
      if (ok && len == 3) {  // no overlongs, no surrogates
        unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
        ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
      }
      if (ok && len == 4) {  // no overlongs, nothing above U+10FFFF
        unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
        ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
      }
      if (ok) {
        put(s.substr(i, len));
        i += len;
        continue;
      }
      put("\xef\xbf\xbd");
    }
    ++i;
  }
}

class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string component) : component_(std::move(component)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    auto put = [&dest](std::string_view v) { dest.append(v.data(), v.data() + v.size()); };
    using std::chrono::duration_cast;
    auto since_epoch = msg.time.time_since_epoch();
    auto secs = duration_cast<std::chrono::seconds>(since_epoch);
    auto micros = duration_cast<std::chrono::microseconds>(since_epoch - secs).count();
    std::time_t t = static_cast<std::time_t>(secs.count());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char time_buf[48];
    std::snprintf(time_buf, sizeof(time_buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ",
                  tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long>(micros));
    put("{\"time\":\"");
    put(time_buf);
    put("\",\"level\":\"");
    auto level = spdlog::level::to_string_view(msg.level);
    put(std::string_view(level.data(), level.size()));
    put("\",\"component\":\"");
    AppendJsonString(component_, dest);
    put(absl::StrCat("\",\"pid\":", pid_, ",\"thread\":", msg.thread_id, ",\"message\":\""));
    AppendJsonString(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    put("\"}\n");
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(component_);
  }

 private:
  const std::string component_;
  const long pid_ = static_cast<long>(getpid());
};

}  // namespace

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

absl::Status SetLogFormat(const std::string& format, const std::string& component) {
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonFormatter>(component));
  } else if (format == "text") {
    spdlog::set_formatter(std::make_unique<spdlog::pattern_formatter>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log format '", format, "'; expected text or json"));
  }
  return absl::OkStatus();
}

namespace {
// A library embedded in a program is quiet unless asked: warnings and
// errors only (set when the library loads; the binaries raise it).
[[maybe_unused]] const bool kQuietByDefault = [] {
  spdlog::set_level(spdlog::level::warn);
  return true;
}();
}  // namespace

void InitLoggingFromEnv(const std::string& component, const std::string& default_level) {
  if (!default_level.empty()) {
    absl::Status s = SetLogLevel(default_level);
    if (!s.ok()) std::fprintf(stderr, "sluice: %s\n", std::string(s.message()).c_str());
  }
  if (const char* v = std::getenv("SLUICE_LOG_LEVEL"); v != nullptr && *v != '\0') {
    absl::Status s = SetLogLevel(v);
    if (!s.ok()) std::fprintf(stderr, "sluice: SLUICE_LOG_LEVEL: %s\n", std::string(s.message()).c_str());
  }
  if (const char* v = std::getenv("SLUICE_LOG_FORMAT"); v != nullptr && *v != '\0') {
    absl::Status s = SetLogFormat(v, component);
    if (!s.ok()) std::fprintf(stderr, "sluice: SLUICE_LOG_FORMAT: %s\n", std::string(s.message()).c_str());
  }
}

}  // namespace sluice
