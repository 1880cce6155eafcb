// CoordinatedRounds: the join rounds of coordinated reads (num_consumers >
// 0; the glossary's "round", control/dispatcher_impl.h). Every consumer's
// r-th element comes from one task, so a task created after its iteration
// started cannot join at once: it stays pending (DispatcherState's
// Iteration::pending_tasks) until every consumer has promised not to read
// past a target round (ClientHeartbeat's block_round) from a round at or
// below it; then the pending tasks start at that round (StartTasksUpdate).
//
// Transient, not journaled: the consumers' rounds, the target and who
// confirmed it are rebuilt from the consumers' next heartbeats after a
// restart (a restored iteration with pending tasks targets kRoundLead until
// a consumer reports a round past it). Internal to control/; not
// thread-safe (the dispatcher's mutex guards it); no clock.
#pragma once

#include <cstdint>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "control/journal.pb.h"
#include "sluice/control/dispatcher_state.h"

namespace sluice::internal {

class CoordinatedRounds {
 public:
  // Joining tasks start this many rounds after the furthest consumer, so
  // consumers rarely reach the block.
  static constexpr int64_t kRoundLead = 16;

  // `iteration`'s first tasks exist: tasks created from now on join it
  // pending (a replayed iteration has started). Its consumers start at
  // `first_round` (a resumed iteration's; no join targets below it).
  void Start(int64_t iteration, int64_t first_round) {
    rounds_[iteration].started = true;
    rounds_[iteration].first_round = first_round;
  }
  bool Started(int64_t iteration) const;
  // A pending task was created while none was: the target is kRoundLead
  // past the furthest round a consumer reported, and nobody confirmed it.
  void ChooseTarget(int64_t iteration);
  // The round the pending tasks join at (-1: none chosen yet).
  int64_t Target(int64_t iteration) const;

  enum class Outcome : uint8_t {
    kNone,         // nothing to do
    kTargetMoved,  // a new target: consumers must learn it (a visible change)
    kAllReady,     // every consumer confirmed: start the pending tasks at Target
  };
  // Consumer `consumer` of `iteration` reads round `current_round` and
  // honours block_round `blocked_round`. `pending`: the iteration has
  // pending tasks; `num_consumers`: the job's. A consumer already past the
  // target moves it on (kRoundLead past its round, to be confirmed again).
  Outcome Report(int64_t iteration, int64_t consumer, int64_t current_round,
                 int64_t blocked_round, bool pending, int64_t num_consumers);
  // The pending tasks started (StartTasksUpdate): confirmations start over.
  void Joined(int64_t iteration);
  // The consumer's client went away: its confirmation no longer counts.
  void Left(int64_t iteration, int64_t consumer);
  // The iteration no longer exists.
  void Forget(int64_t iteration) { rounds_.erase(iteration); }
  // After `u` was applied, with the Changes it made: ChooseTarget for an
  // iteration's first pending task, Joined once they start, Left for a
  // consumer's client removed, Forget for a dropped iteration.
  void Follow(const proto::JournalUpdate& u, const DispatcherState::Changes& c);

  // A checkpoint a coordinated-reads iteration of a job with
  // `num_consumers` consumers may resume from (InvalidArgument naming what
  // does not fit otherwise).
  static absl::Status CheckResume(const proto::ServiceCheckpoint& resume, int64_t num_consumers);

 private:
  struct Rounds {
    bool started = false;
    int64_t first_round = 0;
    std::map<int64_t, int64_t> consumer_rounds;  // consumer_index -> current_round
    int64_t target = -1;
    std::set<int64_t> ready;  // consumers honouring block_round == target
  };
  std::map<int64_t, Rounds> rounds_;
};

}  // namespace sluice::internal
