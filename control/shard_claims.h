// ShardClaims: static sharding's worker list (the dispatcher's
// worker_addresses) and which worker holds each entry. Worker i of the N
// entries reads shard i of N. An entry is "host:port", or "host:%port%" for
// any port of that host. A claim outlives its worker, so a worker coming
// back at the same address reads the same shard; an entry whose holder is
// gone may be taken by another worker of a matching address. The claims
// are durable (RegisterWorkerUpdate.index, ShardClaimUpdate): part of
// DispatcherState. Internal to control/; not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::internal {

class ShardClaims {
 public:
  explicit ShardClaims(std::vector<std::string> worker_addresses);

  // The number of shards: worker_addresses entries (0: no static sharding).
  int64_t size() const { return static_cast<int64_t>(patterns_.size()); }
  const std::vector<std::string>& patterns() const { return patterns_; }
  // The address holding each entry ("": never claimed).
  const std::vector<std::string>& holders() const { return holders_; }

  // Entry `index` is held by `address` from now on (out of range: ignored).
  void Claim(int64_t index, const std::string& address);
  // The entry a worker registering at `address` takes: the one it claimed
  // before, else the one MatchWorkerAddress picks among the entries no
  // worker `live` holds. FailedPrecondition, naming the list, when none.
  absl::StatusOr<int64_t> Find(const std::string& address,
                               const std::function<bool(const std::string&)>& live) const;

 private:
  std::vector<std::string> patterns_;
  std::vector<std::string> holders_;  // INVARIANT: holders_.size() == patterns_.size()
};

// The entry of `patterns` (worker_addresses) a worker at `address`
// ("host:port") takes. An entry equal to the address wins; else the first
// "host:%port%" entry of the same host for which free(index) holds. nullopt
// when none matches.
std::optional<int64_t> MatchWorkerAddress(
    const std::vector<std::string>& patterns, const std::string& address,
    const std::function<bool(int64_t)>& free);
// InvalidArgument unless every entry is host:port or host:%port% and no
// host:port is listed twice.
absl::Status ValidateWorkerAddresses(const std::vector<std::string>& patterns);

}  // namespace sluice::internal
