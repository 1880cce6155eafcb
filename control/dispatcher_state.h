// DispatcherState: the dispatcher's durable state, changed only by Apply.
// Internal to control/.
//
// The state is what the journal (control/journal.proto) records: datasets,
// jobs, iterations, tasks, workers, iteration clients, the splits of
// distributed_epoch iterations (SplitProvider), static sharding's claims
// (ShardClaims) and the id counters. Every change is a proto::JournalUpdate
// applied by Apply, one method per update kind; the live dispatcher and a
// replay of its journal run the same Apply, so they reach the same state.
// Snapshot() writes the state back as updates that rebuild it from nothing
// (journal compaction), and DebugString() is the text of that snapshot:
// one encoding of the state, so two states are equal when their strings
// are.
//
// No mutex, no clock, no policy: DispatcherImpl decides what changes
// (which tasks to create, when to collect, which split to hand out), holds
// its mutex around every call here, and keeps beside the state what is not
// durable: heartbeat times, iteration versions and long polls, coordinated
// reads' rounds, tasks to delete on workers. Apply tells it, in Changes,
// what an update changed that concerns those.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/journal.pb.h"
#include "rpc/service.pb.h"
#include "sluice/control/shard_claims.h"
#include "sluice/control/split_provider.h"

namespace sluice::internal {

class DispatcherState {
 public:
  struct Dataset {
    std::string id;
    proto::DatasetDef def;
    uint64_t fingerprint = 0;
  };
  struct Job {
    int64_t id = 0;
    std::string dataset_id;
    proto::ProcessingMode mode = proto::PROCESSING_MODE_UNSPECIFIED;
    std::string name;
    int64_t num_consumers = 0;
    proto::TargetWorkers target_workers = proto::TARGET_WORKERS_AUTO;
    std::map<int64_t, int64_t> iteration_by_repetition;
    // distributed_epoch: the split source and whether elements are tagged.
    proto::DatasetNode split_source;
    bool split_tracked = false;
  };
  struct Iteration {
    int64_t id = 0;
    int64_t job_id = 0;
    int64_t repetition = 0;
    // Task ids are B-trees (here and in Worker): ordered like std::set,
    // with far fewer allocations and cache misses to walk (a heartbeat
    // walks its worker's tasks; a task list, its iteration's).
    absl::btree_set<int64_t> tasks;
    std::set<int64_t> clients;
    bool finished = false;
    bool collected = false;
    absl::Status error;
    std::unique_ptr<SplitProvider> splits;  // distributed_epoch only; dropped when collected
    // Coordinated reads: consumer_index -> its live client, and the tasks
    // created after the iteration started that wait for their join round
    // (CoordinatedRounds), in creation order.
    std::map<int64_t, int64_t> consumer_clients;
    std::vector<int64_t> pending_tasks;
    int64_t first_round = 0;  // coordinated reads: the round it resumed at
  };
  struct Task {
    int64_t id = 0;
    int64_t iteration_id = 0;
    std::string worker;
    std::string host_id;  // its worker's host
    bool completed = false;
    bool lost = false;
    bool delivered = false;      // the worker received it in a heartbeat reply
    int64_t shard = -1;          // static sharding: the shard it reads
    int64_t starting_round = 0;  // coordinated reads
    bool pending = false;        // coordinated reads: not yet joined
  };
  struct Worker {
    std::string address, transfer_address, protocol;
    std::string host_id;
    int64_t index = 0;
    absl::btree_set<int64_t> tasks;
    // Its tasks not yet delivered (CreateTask minus TasksDelivered and
    // collected ones), in creation order: sent in its next heartbeat reply,
    // each as TaskDefOf. Ids, not TaskDefs: a TaskDef carries its dataset's
    // whole definition, and restoring a snapshot creates every task before
    // marking the delivered ones (400,000 at 2,000 workers x 200 jobs).
    std::vector<int64_t> undelivered;
  };
  struct Client {
    int64_t id = 0;
    int64_t iteration_id = 0;
    int64_t consumer_index = -1;  // coordinated reads
    std::string host_id;
    bool at_end = false;  // read the iteration to its end
  };
  // What the applied updates did, counted since construction (a replay's
  // updates too).
  struct Counts {
    int64_t jobs = 0, iterations = 0, collected_iterations = 0, lost_workers = 0;
    int64_t splits_created = 0, splits_completed = 0, splits_reassigned = 0;
  };

  // What an update changed that concerns what the dispatcher keeps beside
  // the state. Apply appends to it.
  struct Changes {
    // A change the clients of `iteration` can see (its version moves on
    // by one), with the tasks whose TaskInfo changed in it; in order.
    struct Visible {
      int64_t iteration = 0;
      std::vector<int64_t> tasks;
    };
    std::vector<Visible> visible;
    std::set<int64_t> splits;      // iterations whose splits changed (GetSplit polls wait on it)
    std::set<std::string> workers;  // workers with news: a new task, a collected one, or removed
    std::vector<std::pair<std::string, int64_t>> collected_tasks;  // (worker, task): delete it there
    std::vector<int64_t> idle;      // iterations whose last client left
    std::vector<std::pair<int64_t, int64_t>> left_consumers;  // (iteration, consumer_index)
    std::vector<int64_t> joining;   // iterations that got a pending task while none was
    std::vector<int64_t> dropped;   // iterations erased with their job
    struct Requeued {
      int64_t task = 0, iteration = 0, splits = 0;
    };
    std::vector<Requeued> requeued;  // lost tasks whose open splits went back to the queue
  };

  // `worker_addresses`: static sharding's fixed list of workers (empty:
  // none); TaskDefs carry its size as num_shards.
  explicit DispatcherState(std::vector<std::string> worker_addresses = {});

  // Applies `u`. An error (NotFound, AlreadyExists, FailedPrecondition,
  // InvalidArgument for an unknown kind) says the update does not fit the
  // state: a bug live, a damaged or foreign journal on replay; the state
  // may then be partly changed.
  absl::Status Apply(const proto::JournalUpdate& u, Changes* changes);

  // The state as updates that rebuild it from nothing (by Apply, in order),
  // in records of at most 1000 updates.
  std::vector<proto::JournalRecord> Snapshot() const { return Build(Capture()); }
  // The snapshot in two steps, for a caller that holds a lock around the
  // state (journal compaction): Capture copies what the snapshot needs,
  // the tasks as plain rows in no order and the rest as its updates, and
  // Build makes the records from that copy alone, on any thread. With
  // 400,000 tasks, building the records under the lock stalled every
  // request for half a second per compaction.
  struct Captured {
    struct TaskRow {
      int64_t id = 0, iteration = 0, starting_round = 0;
      int32_t worker = 0;  // in worker_addresses
      bool pending = false, delivered = false, completed = false, lost = false;
    };
    std::vector<proto::JournalUpdate> head;    // before the tasks
    std::vector<TaskRow> tasks;
    std::vector<std::string> worker_addresses;
    std::vector<proto::JournalUpdate> middle;  // between creating and finishing tasks
    std::vector<proto::JournalUpdate> tail;    // after the tasks
  };
  Captured Capture() const;
  static std::vector<proto::JournalRecord> Build(Captured captured);
  // The snapshot as text, one update a line.
  std::string DebugString() const { return Text(Snapshot()); }
  // Records as text, one update a line.
  static std::string Text(const std::vector<proto::JournalRecord>& records);

  const std::map<std::string, Dataset>& datasets() const { return datasets_; }
  const std::map<int64_t, Job>& jobs() const { return jobs_; }
  const std::map<std::string, int64_t>& job_by_name() const { return job_by_name_; }
  const std::map<int64_t, Iteration>& iterations() const { return iterations_; }
  // Unordered (a lookup per task of every heartbeat and task list, among
  // hundreds of thousands of tasks); Snapshot lists them by id. Entries
  // stay where they are until erased.
  using TaskMap = absl::node_hash_map<int64_t, Task>;
  const TaskMap& tasks() const { return tasks_; }
  const std::map<std::string, Worker>& workers() const { return workers_; }
  // What a worker is sent to run task `id` (NotFound for an unknown task).
  absl::Status TaskDefOf(int64_t id, proto::TaskDef* def) const;
  // How many registered workers run on `host_id` (0 for an empty one):
  // workers sharing a host divide its cpus (WorkerHeartbeatResponse).
  int64_t WorkersOnHost(const std::string& host_id) const;
  const std::map<int64_t, Client>& clients() const { return clients_; }
  // distributed_epoch: the splits of `client`'s iteration that wait for
  // its report (SplitProvider::AwaitingReport); none for an unknown client.
  std::vector<int64_t> SplitsAwaitingReport(int64_t client) const;
  const ShardClaims& shard_claims() const { return shard_claims_; }
  // Ids are never reused: every id an applied update named is below this.
  int64_t next_id() const { return next_id_; }
  // Without static sharding: the index the next new worker gets.
  int64_t next_worker_index() const { return next_worker_index_; }
  const Counts& counts() const { return counts_; }
  // How much the state holds now.
  struct Sizes {
    int64_t workers = 0, iteration_clients = 0, live_tasks = 0, open_tasks = 0;
    int64_t datasets = 0, current_jobs = 0, active_iterations = 0;
  };
  Sizes sizes() const;

 private:
  absl::Status RegisterDataset(const proto::RegisterDatasetUpdate& u);
  absl::Status CreateJob(const proto::CreateJobUpdate& u);
  absl::Status CreateIteration(const proto::CreateIterationUpdate& u);
  absl::Status RegisterWorker(const proto::RegisterWorkerUpdate& u);
  absl::Status CreateTask(const proto::CreateTaskUpdate& u, Changes& c);
  absl::Status TasksDelivered(const proto::TasksDeliveredUpdate& u);
  absl::Status FinishTask(const proto::FinishTaskUpdate& u, Changes& c);
  absl::Status IterationError(const proto::IterationErrorUpdate& u, Changes& c);
  absl::Status CreateClient(const proto::CreateClientUpdate& u);
  absl::Status RemoveClient(const proto::RemoveClientUpdate& u, Changes& c);
  absl::Status ClientAtEnd(const proto::ClientAtEndUpdate& u);
  absl::Status CollectIteration(const proto::CollectIterationUpdate& u, Changes& c);
  absl::Status DropJob(const proto::DropJobUpdate& u, Changes& c);
  absl::Status RemoveWorker(const proto::RemoveWorkerUpdate& u, Changes& c);
  absl::Status AssignSplit(const proto::AssignSplitUpdate& u);
  absl::Status CompleteSplits(const proto::CompleteSplitsUpdate& u, Changes& c);
  absl::Status StartTasks(const proto::StartTasksUpdate& u, Changes& c);
  absl::Status RequeueSplits(const proto::RequeueSplitsUpdate& u, Changes& c);
  absl::Status SplitsReported(const proto::SplitsReportedUpdate& u, Changes& c);
  absl::Status Counters(const proto::CountersUpdate& u);
  absl::Status ShardClaim(const proto::ShardClaimUpdate& u);
  absl::Status SplitProviderState(const proto::SplitProviderStateUpdate& u, Changes& c);

  // The iteration of task `task_id`, or NotFound.
  absl::StatusOr<Iteration*> IterationOfTask(int64_t task_id);
  // Ends `t` (completed, or lost) unless it ended before.
  void Finish(Task& t, bool lost, Changes& c);
  // Marks `it` finished once no task runs and one completed (every shard,
  // under static sharding).
  void UpdateFinished(Iteration& it, Changes& c);

  void CountOnHost(const std::string& host_id, int64_t delta);
  ShardClaims shard_claims_;
  std::map<std::string, Dataset> datasets_;
  std::map<int64_t, Job> jobs_;
  std::map<std::string, int64_t> job_by_name_;
  std::map<int64_t, Iteration> iterations_;
  TaskMap tasks_;
  std::map<std::string, Worker> workers_;
  std::map<std::string, int64_t> workers_per_host_;  // see WorkersOnHost
  std::map<int64_t, Client> clients_;
  int64_t next_id_ = 1;
  int64_t next_worker_index_ = 0;
  Counts counts_;
};

}  // namespace sluice::internal
