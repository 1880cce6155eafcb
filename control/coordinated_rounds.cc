#include "sluice/control/coordinated_rounds.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice::internal {

bool CoordinatedRounds::Started(int64_t iteration) const {
  auto r = rounds_.find(iteration);
  return r != rounds_.end() && r->second.started;
}

void CoordinatedRounds::ChooseTarget(int64_t iteration) {
  Rounds& r = rounds_[iteration];
  int64_t furthest = r.first_round;
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

absl::Status CoordinatedRounds::CheckResume(const proto::ServiceCheckpoint& resume,
                                            int64_t num_consumers) {
  if (resume.version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the service checkpoint has version ", resume.version(), "; this dispatcher reads 1"));
  }
  if (resume.num_consumers() <= 0 || resume.positions() != 0 || resume.splits_size() > 0) {
    return absl::InvalidArgumentError(
        "the service checkpoint holds a distributed_epoch position, not a coordinated-reads "
        "round: restore into the pipeline that saved it");
  }
  if (resume.num_consumers() != num_consumers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the service checkpoint was saved by a job of ", resume.num_consumers(),
        " coordinated consumers; this job has ", num_consumers,
        ": every consumer's round pairs with the others', so resume with the same count"));
  }
  if (resume.round() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the service checkpoint's round is ", resume.round()));
  }
  return absl::OkStatus();
}

void CoordinatedRounds::Left(int64_t iteration, int64_t consumer) {
  auto r = rounds_.find(iteration);
  if (r != rounds_.end()) r->second.ready.erase(consumer);
}

}  // namespace sluice::internal
