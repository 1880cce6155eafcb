// Token and TLS helpers behind rpc/security.h. Internal.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sluice/rpc/security.h"

namespace sluice::internal {

// True when a == b. Takes time that depends on the lengths only, never on
// where the bytes first differ (so a peer cannot guess a token byte by byte).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// OK for an empty token (no auth) or a printable-ASCII token without
// spaces of at most kMaxAuthTokenBytes; else InvalidArgument naming `what`.
absl::Status ValidateAuthToken(absl::string_view token, absl::string_view what);

// `explicit_token`, else $SLUICE_AUTH_TOKEN (empty when unset): the token a
// client presents.
std::string ClientAuthToken(const std::string& explicit_token);

// Reads a PEM file named by TlsConfig field `field` (for error messages,
// e.g. "cert_file"); an unreadable, empty or non-PEM file is
// InvalidArgument naming the field and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view field);

// The message of an Unauthenticated refusal by `who` ("dispatcher",
// "worker 10.0.0.5:4000"); `presented` says whether a token was sent.
std::string AuthRefusal(absl::string_view who, bool presented);

}  // namespace sluice::internal
