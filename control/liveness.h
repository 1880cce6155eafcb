// Liveness: when the dispatcher last heard from each worker and iteration
// client, and since when each iteration has had no client: what Tick
// compares with worker_timeout_ms, client_timeout_ms and job_gc_timeout_ms.
//
// Transient, not journaled: after a restart every restored worker and
// client counts as heard from at the restart (a fresh timeout) and every
// restored iteration without clients as idle since then (Restart). It
// follows the state (Follow): a new worker or client is heard from when it
// registers, a removed one is forgotten. Internal to control/; not
// thread-safe (the dispatcher's mutex guards it); the caller passes the
// time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "control/journal.pb.h"
#include "sluice/control/dispatcher_state.h"

namespace sluice::internal {

class Liveness {
 public:
  // After `u` was applied, with the Changes it made, at `now`.
  void Follow(const proto::JournalUpdate& u, const DispatcherState::Changes& c, absl::Time now);
  // After a replay: every worker and client of `state` heard from `now`,
  // every iteration without clients idle since `now`.
  void Restart(const DispatcherState& state, absl::Time now);
  void HeardWorker(const std::string& address, absl::Time now) { workers_[address] = now; }
  void HeardClient(int64_t id, absl::Time now) { clients_[id] = now; }

  // Tick's decisions. RemoveWorker for each worker of `state` silent for
  // longer than worker_timeout_ms (and in `lost` a line to log once it is
  // removed), RemoveClient for each client silent for longer than
  // client_timeout_ms, to `rec`.
  void Expire(const DispatcherState& state, absl::Time now, int64_t worker_timeout_ms,
              int64_t client_timeout_ms, proto::JournalRecord* rec,
              std::vector<std::string>* lost) const;
  // CollectIteration for each iteration without clients that finished, is
  // anonymous (no name to come back by), or has been idle for longer than
  // job_gc_timeout_ms, to `rec`.
  void Collect(const DispatcherState& state, absl::Time now, int64_t job_gc_timeout_ms,
               proto::JournalRecord* rec) const;

  // How long each has been silent (since the Unix epoch when never heard).
  absl::Duration WorkerSilence(const std::string& address, absl::Time now) const;
  absl::Duration ClientSilence(int64_t id, absl::Time now) const;
  absl::Duration Idle(int64_t iteration, absl::Time now) const;
  // The longest silence of a worker (of a client), 0 when none.
  absl::Duration MaxWorkerSilence(absl::Time now) const;
  absl::Duration MaxClientSilence(absl::Time now) const;

 private:
  std::map<std::string, absl::Time> workers_;  // last heartbeat
  std::map<int64_t, absl::Time> clients_;      // last heartbeat
  std::map<int64_t, absl::Time> idle_since_;   // iterations without clients
};

}  // namespace sluice::internal
