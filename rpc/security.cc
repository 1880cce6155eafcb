#include "sluice/rpc/security.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "sluice/rpc/security_internal.h"

namespace sluice {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " '", path, "': ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " '", path, "'"));
  }
  return ss.str();
}

}  // namespace

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("auth token file: empty path");
  auto text = ReadWholeFile(path, "auth token file");
  if (!text.ok()) return text.status();
  std::string token = *std::move(text);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth token file '", path, "' is empty; put the shared secret in it"));
  }
  absl::Status s = internal::ValidateAuthToken(token, absl::StrCat("auth token file '", path, "'"));
  if (!s.ok()) return s;
  return token;
}

namespace internal {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk the longer input in full so the time depends on the lengths only.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::Status ValidateAuthToken(absl::string_view token, absl::string_view what) {
  if (token.size() > kMaxAuthTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the auth token has ", token.size(),
                                                   " bytes; at most ", kMaxAuthTokenBytes,
                                                   " are allowed"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the auth token must be printable ASCII without spaces (it travels as gRPC "
                "metadata)"));
    }
  }
  return absl::OkStatus();
}

std::string ClientAuthToken(const std::string& explicit_token) {
  if (!explicit_token.empty()) return explicit_token;
  const char* env = std::getenv("SLUICE_AUTH_TOKEN");
  return env == nullptr ? std::string() : std::string(env);
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view field) {
  auto text = ReadWholeFile(path, absl::StrCat("TLS ", field));
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS ", field, " '", path, "' is not a PEM file (no -----BEGIN line)"));
  }
  return text;
}

std::string AuthRefusal(absl::string_view who, bool presented) {
  return absl::StrCat(who, " refused the request: ",
                      presented ? "wrong auth token" : "no auth token",
                      "; give this peer the service's shared secret (auth_token, "
                      "--auth_token_file, or $SLUICE_AUTH_TOKEN for clients)");
}

}  // namespace internal
}  // namespace sluice
