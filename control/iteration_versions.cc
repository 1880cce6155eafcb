#include "sluice/control/iteration_versions.h"

#include <algorithm>

namespace sluice::internal {

void IterationVersions::Bump(int64_t iteration, const std::vector<int64_t>& tasks) {
  Versions& v = of_[iteration];
  ++v.version;
  for (int64_t task : tasks) v.task_changes.emplace_back(v.version, task);
}

std::optional<std::vector<int64_t>> IterationVersions::ChangedSince(int64_t iteration,
                                                                     int64_t known) const {
  const Versions& v = Find(iteration);
  if (known < v.delta_base || known > v.version) return std::nullopt;
  std::vector<int64_t> changed;
  auto first = std::upper_bound(
      v.task_changes.begin(), v.task_changes.end(), known,
      [](int64_t version, const std::pair<int64_t, int64_t>& c) { return version < c.first; });
  changed.reserve(v.task_changes.end() - first);
  for (auto c = first; c != v.task_changes.end(); ++c) changed.push_back(c->second);
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  return changed;
}

void IterationVersions::Restart(int64_t iteration, int64_t jump) {
  Versions& v = of_[iteration];
  v.version += jump;
  v.delta_base = v.version;
}

const IterationVersions::Versions& IterationVersions::Find(int64_t iteration) const {
  static const Versions kNone;
  auto v = of_.find(iteration);
  return v == of_.end() ? kNone : v->second;
}

}  // namespace sluice::internal
