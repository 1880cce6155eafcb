#include "sluice/control/shard_claims.h"

#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice::internal {

ShardClaims::ShardClaims(std::vector<std::string> worker_addresses)
    : patterns_(std::move(worker_addresses)), holders_(patterns_.size()) {}

void ShardClaims::Claim(int64_t index, const std::string& address) {
  if (index >= 0 && index < size()) holders_[index] = address;
}

absl::StatusOr<int64_t> ShardClaims::Find(
    const std::string& address, const std::function<bool(const std::string&)>& live) const {
  for (size_t i = 0; i < holders_.size(); ++i) {
    if (holders_[i] == address) return static_cast<int64_t>(i);
  }
  std::optional<int64_t> index = MatchWorkerAddress(patterns_, address, [&](int64_t i) {
    return holders_[i].empty() || !live(holders_[i]);
  });
  if (!index) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", address, " is not in the dispatcher's worker_addresses [",
        absl::StrJoin(patterns_, ", "),
        "] (or every matching entry is held by a live worker); list it, or start the worker "
        "with a listed worker_address"));
  }
  return *index;
}

std::optional<int64_t> MatchWorkerAddress(
    const std::vector<std::string>& patterns, const std::string& address,
    const std::function<bool(int64_t)>& free) {
  std::optional<int64_t> wildcard;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& p = patterns[i];
    if (p == address) return static_cast<int64_t>(i);
    constexpr std::string_view kPort = ":%port%";
    if (!wildcard && p.size() > kPort.size() && p.ends_with(kPort) &&
        address.starts_with(p.substr(0, p.size() - kPort.size() + 1)) &&
        address.find(':', p.size() - kPort.size() + 1) == std::string::npos &&
        free(static_cast<int64_t>(i))) {
      wildcard = static_cast<int64_t>(i);
    }
  }
  return wildcard;
}

absl::Status ValidateWorkerAddresses(const std::vector<std::string>& patterns) {
  std::set<std::string> seen;
  for (const std::string& p : patterns) {
    size_t colon = p.rfind(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < p.size();
    if (ok && p.substr(colon + 1) != "%port%") {
      for (char c : p.substr(colon + 1)) ok = ok && c >= '0' && c <= '9';
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker_addresses: '", p, "' is not host:port or host:%port%"));
    }
    if (p.substr(colon + 1) != "%port%" && !seen.insert(p).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker_addresses: '", p, "' is listed twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::internal
