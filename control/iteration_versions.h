// IterationVersions: what the dispatcher's ClientHeartbeat and GetSplit
// long polls compare, per iteration: a version bumped at every change its
// clients can see, a split version bumped at every change to its splits,
// and which tasks changed at each version, so that a client that knows a
// version gets only the tasks changed since (with thousands of workers,
// every consumer receiving the whole list at every change was most of the
// dispatcher's work).
//
// Transient, not journaled: a replay bumps versions as the live dispatcher
// did, then Restart moves each past any version a client knew from an
// earlier dispatcher, so every client's poll returns at once with the whole
// list. Internal to control/; not thread-safe (the dispatcher's mutex
// guards it).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace sluice::internal {

class IterationVersions {
 public:
  // A change `iteration`'s clients can see, in which `tasks` changed.
  void Bump(int64_t iteration, const std::vector<int64_t>& tasks = {});
  void BumpSplits(int64_t iteration) { ++of_[iteration].split_version; }
  int64_t version(int64_t iteration) const { return Find(iteration).version; }
  int64_t split_version(int64_t iteration) const { return Find(iteration).split_version; }
  // The tasks changed at versions after `known` (sorted, each once), or
  // nullopt when `known` is not one of this dispatcher's versions of the
  // iteration: the client needs the whole list.
  std::optional<std::vector<int64_t>> ChangedSince(int64_t iteration, int64_t known) const;
  // After a replay: versions move on by `jump`, and the versions before
  // are no longer this dispatcher's.
  void Restart(int64_t iteration, int64_t jump);
  void Forget(int64_t iteration) { of_.erase(iteration); }

 private:
  struct Versions {
    int64_t version = 0;
    int64_t split_version = 0;
    // ChangedSince answers a known version at or above this.
    int64_t delta_base = 0;
    // (version, task id) of every change to a task's TaskInfo, in version
    // order (versions only grow).
    std::vector<std::pair<int64_t, int64_t>> task_changes;
  };
  const Versions& Find(int64_t iteration) const;
  std::map<int64_t, Versions> of_;
};

}  // namespace sluice::internal
