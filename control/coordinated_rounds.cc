#include "sluice/control/coordinated_rounds.h"

#include <algorithm>

namespace sluice::internal {

bool CoordinatedRounds::Started(int64_t iteration) const {
  auto r = rounds_.find(iteration);
  return r != rounds_.end() && r->second.started;
}

void CoordinatedRounds::ChooseTarget(int64_t iteration) {
  Rounds& r = rounds_[iteration];
  int64_t furthest = 0;
  for (const auto& [consumer, round] : r.consumer_rounds) furthest = std::max(furthest, round);
  r.target = furthest + kRoundLead;
  r.ready.clear();
}

int64_t CoordinatedRounds::Target(int64_t iteration) const {
  auto r = rounds_.find(iteration);
  return r == rounds_.end() ? -1 : r->second.target;
}

CoordinatedRounds::Outcome CoordinatedRounds::Report(int64_t iteration, int64_t consumer,
                                                     int64_t current_round,
                                                     int64_t blocked_round, bool pending,
                                                     int64_t num_consumers) {
  Rounds& r = rounds_[iteration];
  r.consumer_rounds[consumer] = std::max<int64_t>(0, current_round);
  if (!pending) return Outcome::kNone;
  if (current_round > r.target) {
    // This consumer already read past the target: pick a later one, which
    // every consumer must agree to again.
    r.target = current_round + kRoundLead;
    r.ready.clear();
    return Outcome::kTargetMoved;
  }
  if (blocked_round != r.target) return Outcome::kNone;  // it learns the target in this reply
  r.ready.insert(consumer);
  return static_cast<int64_t>(r.ready.size()) < num_consumers ? Outcome::kNone
                                                              : Outcome::kAllReady;
}

void CoordinatedRounds::Joined(int64_t iteration) {
  auto r = rounds_.find(iteration);
  if (r != rounds_.end()) r->second.ready.clear();
}

void CoordinatedRounds::Follow(const proto::JournalUpdate& u,
                               const DispatcherState::Changes& c) {
  if (u.has_start_tasks()) Joined(u.start_tasks().iteration_id());
  for (const auto& [id, consumer] : c.left_consumers) Left(id, consumer);
  for (int64_t id : c.joining) ChooseTarget(id);
  for (int64_t id : c.dropped) Forget(id);
}

void CoordinatedRounds::Left(int64_t iteration, int64_t consumer) {
  auto r = rounds_.find(iteration);
  if (r != rounds_.end()) r->second.ready.erase(consumer);
}

}  // namespace sluice::internal
