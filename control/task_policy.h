// TaskPolicy: which tasks the dispatcher creates, and how a worker's
// reports end them. It decides from the (const) DispatcherState and adds
// the updates to a record; DispatcherImpl records it, holding its mutex
// around every call. Internal to control/; no clock.
//
// Who reads what: an iteration gets a task on every worker, except that
//  - a worker that joins (or restarts) gets tasks only of the iterations
//    that still take workers (AcceptsTasks);
//  - under target_workers=LOCAL an iteration reads only the workers on its
//    clients' hosts (ReadsHost);
//  - under static sharding a shard is read by one task at a time, and no
//    more once it was read to its end (NeedsTask);
//  - under coordinated reads a task created after its iteration started
//    joins pending, at a round the consumers agree to (CoordinatedRounds).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "control/journal.pb.h"
#include "rpc/service.pb.h"
#include "sluice/control/dispatcher_state.h"

namespace sluice::internal {

class TaskPolicy {
 public:
  using Iteration = DispatcherState::Iteration;
  using Worker = DispatcherState::Worker;
  // `new_id` hands out the ids of the tasks it creates.
  TaskPolicy(const DispatcherState& state, std::function<int64_t()> new_id)
      : state_(state), new_id_(std::move(new_id)) {}

  // Whether a worker that joins (or restarts) now gets a task of `it`: not
  // once it was collected, nor once it finished and every client read it
  // to the end (tf.data: late joiners get tasks until then).
  bool AcceptsTasks(const Iteration& it) const;
  // Whether `it` reads workers on `host`: always, except under
  // TARGET_WORKERS_LOCAL, where it reads the hosts of its clients only.
  bool ReadsHost(const Iteration& it, const std::string& host) const;
  // Whether the worker with `worker_index` should get a task of `it`:
  // always, except under static sharding once another task completed or is
  // reading that worker's shard.
  bool NeedsTask(const Iteration& it, int64_t worker_index) const;

  // Each adds CreateTask updates to `rec`. A new iteration: a task on every
  // worker (`local`: on the workers of `host`).
  void ForNewIteration(int64_t iteration, bool local, const std::string& host,
                       proto::JournalRecord* rec) const;
  // A LOCAL iteration's first consumer on `host`: tasks on its workers.
  void ForNewHost(const Iteration& it, const std::string& host, proto::JournalRecord* rec) const;
  // A worker registering at `address` on `host` as worker `index`: a task
  // of every iteration that takes it, pending where `started` (coordinated
  // reads: the iteration's first tasks exist).
  void ForNewWorker(const std::string& address, const std::string& host, int64_t index,
                    const std::function<bool(int64_t)>& started, proto::JournalRecord* rec) const;

  // A worker's heartbeat: its tasks whose output was read (finished_tasks)
  // complete, and the delivered tasks it no longer holds (it restarted) are
  // lost; FinishTask updates to `rec`. Returns the iterations that lost a
  // task. Once they are applied, Again gives the worker a task again of
  // each of them that takes it (its data starts over; under static
  // sharding it reads its shard again).
  std::set<int64_t> Reconcile(const Worker& w, const proto::WorkerHeartbeatRequest& req,
                              proto::JournalRecord* rec) const;
  void Again(const Worker& w, const std::set<int64_t>& lost_in, proto::JournalRecord* rec) const;
  // The tasks a heartbeat says the worker holds that are not its own here
  // (unknown, collected, or another worker's): to delete on it.
  static std::vector<int64_t> Unknown(const Worker& w, const proto::WorkerHeartbeatRequest& req);
  // What a client of `it` on `host` reads, of the tasks `ids` (nullptr: of
  // all its tasks): a TaskInfo in `resp` for each one still in the
  // iteration that has joined it (not pending), under target_workers=LOCAL
  // only those on `host`'s workers.
  void ListTasks(const Iteration& it, const std::vector<int64_t>* ids, const std::string& host,
                 proto::ClientHeartbeatResponse* resp) const;
  // WorkerUpdate (checked: CheckWorkerUpdate): an error fails its task's
  // iteration (the first error wins), and a completion or an error ends
  // the task.
  void Report(const proto::WorkerUpdateRequest& req, proto::JournalRecord* rec) const;

 private:
  void Add(int64_t iteration, bool pending, const std::string& address,
           proto::JournalRecord* rec) const;

  const DispatcherState& state_;
  const std::function<int64_t()> new_id_;
};

}  // namespace sluice::internal
