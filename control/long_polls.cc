#include "sluice/control/long_polls.h"

#include <algorithm>

namespace sluice::internal {

bool LongPolls::Await(absl::Mutex& mu, const Key& key, const std::function<bool()>& ready,
                      absl::Duration timeout, const IsCancelled& cancelled,
                      absl::Duration cancel_check) {
  std::shared_ptr<absl::CondVar>& slot = waiting_[key];
  if (slot == nullptr) slot = std::make_shared<absl::CondVar>();
  const std::shared_ptr<absl::CondVar> cv = slot;
  const absl::Time deadline = absl::Now() + timeout;
  bool result = true;
  while (true) {
    if (cancelled && cancelled()) {
      result = false;
      break;
    }
    if (ready()) break;
    absl::Duration slice = deadline - absl::Now();
    if (slice <= absl::ZeroDuration()) break;
    if (cancelled) slice = std::min(slice, cancel_check);
    cv->WaitWithTimeout(&mu, slice);
  }
  if (cv.use_count() == 2) waiting_.erase(key);  // the map's and ours: nobody else waits
  return result;
}

bool LongPolls::Wake(const Key& key) {
  auto it = waiting_.find(key);
  if (it != waiting_.end()) it->second->SignalAll();
  auto parked = parked_by_key_.find(key);
  if (parked == parked_by_key_.end()) return false;
  woken_.insert(woken_.end(), parked->second.begin(), parked->second.end());
  return true;
}

void LongPolls::WakeAllThreads() {
  for (auto& [key, cv] : waiting_) cv->SignalAll();
}

void LongPolls::Park(int64_t id, Parked parked) {
  parked_by_key_[parked.step.key].insert(id);
  deadlines_.emplace(parked.step.deadline, id);
  parked_.emplace(id, std::move(parked));
}

std::optional<LongPolls::Parked> LongPolls::Unpark(int64_t id) {
  auto p = parked_.find(id);
  if (p == parked_.end()) return std::nullopt;
  Parked parked = std::move(p->second);
  parked_.erase(p);
  auto k = parked_by_key_.find(parked.step.key);
  if (k != parked_by_key_.end()) {
    k->second.erase(id);
    if (k->second.empty()) parked_by_key_.erase(k);
  }
  deadlines_.erase({parked.step.deadline, id});
  return parked;
}

const LongPolls::Parked* LongPolls::Find(int64_t id) const {
  auto p = parked_.find(id);
  return p == parked_.end() ? nullptr : &p->second;
}

std::vector<std::pair<int64_t, bool>> LongPolls::Due(absl::Time now, bool all) {
  std::vector<std::pair<int64_t, bool>> due;
  for (int64_t id : woken_) due.emplace_back(id, false);
  woken_.clear();
  for (const auto& [deadline, id] : deadlines_) {
    if (!all && deadline > now) break;
    due.emplace_back(id, true);
  }
  return due;
}

}  // namespace sluice::internal
