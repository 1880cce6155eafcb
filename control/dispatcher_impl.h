// DispatcherImpl: the dispatcher's state machine, independent of gRPC.
//
// Glossary
//   dataset    a registered DatasetDef, deduplicated by fingerprint.
//   job        a dataset + processing mode (+ optional job_name shared by
//              consumers). Anonymous jobs (no name) serve one consumer.
//   iteration  one pass over a job's dataset: consumers' k-th iterator of a
//              job reads the job's k-th iteration (repetition k).
//   task       an iteration's share on one worker (parallel_epochs: the
//              whole dataset on every worker; distributed_epoch: the splits
//              it pulls).
//   iteration client  one consumer's membership in an iteration.
//   round      (coordinated reads, num_consumers > 0) every consumer's r-th
//              element comes from one task: round r is read from the
//              (r mod n)-th, by id, of the n tasks that started at or before
//              r. A task joining mid-job starts at a future round all
//              consumers agreed to (see ClientHeartbeat's block_round).
//   split      (distributed_epoch) a part of the pipeline's only source: a
//              sub-range of a Range (range_split_elements positions), one
//              element of a FromTensors, one file of a ListFiles. Each
//              iteration has a split provider; each worker-side repetition
//              of the source (an enclosing Repeat) is an epoch with its own
//              splits. A split is open from creation until its holder
//              reports it completed.
//
// Protocol
//   Workers call WorkerHeartbeat in a loop (long poll: the reply waits up to
//   wait_ms for a change). The first heartbeat registers the worker, which
//   then gets a task for every running iteration; later ones carry tasks it
//   holds and tasks whose output was fully read, and receive new tasks and
//   tasks to delete. WorkerUpdate reports completion or failure at once.
//   Clients RegisterDataset, GetOrCreateJob, GetOrCreateIteration, then
//   ClientHeartbeat (long poll on the iteration's version) to learn tasks,
//   lost tasks, failure and the end of the iteration; ReleaseIterationClient
//   when done. Tick() expires workers and clients and collects iterations.
//   An iteration is finished when no task runs and one completed (every
//   shard, under static sharding); one whose tasks were all lost waits for
//   a worker. Workers that register (or come back at their address without
//   their tasks: restarted) get a task of every iteration that still takes
//   workers: unfinished, or finished but not yet read to the end by every
//   client (ClientHeartbeat.at_end at the version the client saw finished,
//   journaled as ClientAtEnd; only then does the client end).
//   Coordinated reads: clients report their next round and the block_round
//   they honour in ClientHeartbeat. A task created after its iteration
//   started is pending: every reply carries block_round = the iteration's
//   target round; a consumer reporting a round past it moves the target
//   (and every consumer must confirm again); once all num_consumers
//   consumers report honouring it, the pending tasks start at that round
//   and appear in the task list with starting_round set.
//   distributed_epoch: a task's source calls GetSplit(task, epoch) for its
//   next split, reporting the splits it completed. A split's holder is
//   recorded; when a task is lost (its worker timed out or no longer holds
//   it) its open splits go back to the front of their epoch's queue and are
//   handed to other tasks. GetSplit answers end_of_splits for an epoch only
//   once every split of it completed (not_ready while others still hold
//   some), so a task stays alive to take over reassigned splits. Splits held
//   by a task that completes normally (e.g. a Take ended its pipeline) are
//   dropped as completed.
//
// Shape
//   DispatcherImpl handles the RPCs, runs the long polls and holds the one
//   mutex; it decides what changes and records it. The parts, all used
//   under that mutex:
//   - DispatcherState (dispatcher_state.h): the durable state -- datasets,
//     jobs, iterations, tasks, workers, clients and their indexes, with
//     each distributed_epoch iteration's SplitProvider (split_provider.h)
//     and static sharding's ShardClaims (shard_claims.h). Changed only by
//     Apply(JournalUpdate), one method per update kind; no mutex, no clock,
//     no policy. Its Snapshot() is the one encoding of the state.
//   - Policy, deciding from the state and emitting updates: TaskPolicy
//     (which tasks to create, target_workers, how worker reports end
//     tasks), SplitProvider's planning half (which split a task gets,
//     what a GetSplit report completes or requeues), CoordinatedRounds
//     (when pending tasks join coordinated reads), Liveness's Tick
//     decisions (which workers and clients expired, which iterations to
//     collect), and request_checks.h (what a request must satisfy).
//   - Beside the state, transient (not journaled, rebuilt after a
//     restart): Liveness (heartbeat times, idle iterations),
//     IterationVersions (what client and GetSplit polls compare),
//     CoordinatedRounds (consumers' rounds and the join target), LongPolls
//     (waiting polls), and the tasks to delete on each worker.
//   - JournalCommitter (journal_committer.h): the group commit and
//     compaction of the journal.
//   A change is a proto::JournalRecord, a batch of updates. RecordLocked
//   applies each update with ApplyLocked -- the same code a replay runs:
//   DispatcherState::Apply, then what is kept beside the state follows the
//   Changes the update reports (versions bumped and polls woken, liveness,
//   rounds, tasks to delete) -- and queues the record for the journal.
//
// Journal (fault_tolerant_mode): every state change is a batch of
// proto::JournalUpdate records (control/journal.proto), applied under the
// mutex and queued. Writing is a group commit, as LevelDB's: an RPC, after
// releasing the mutex, waits until every change applied so far is durable;
// the first waiter that finds records queued and no write running writes
// the whole queue with one write and one fdatasync, without the mutex,
// while the others wait for it (parked long polls hold no thread: the poll
// thread writes for them and sends their replies once durable). So no
// reply reveals a change that a crash can lose, and concurrent changes
// share one fsync. Compaction (the journal rewritten as a snapshot once it
// has grown) is done by the writer the same way: the snapshot's records
// are built under the mutex, serialized and written without it. Analysing
// a new job's pipeline (building it, static sharding, its split source)
// and listing a new distributed_epoch iteration's files also run without
// it, the job or iteration being created after unless another consumer
// created it meanwhile. A failed write is sticky: the state
// in memory is then ahead of the journal, so every later request fails
// (Unavailable) until the dispatcher is restarted and replays its journal.
// What is not journaled is transient and rebuilt after a restart: heartbeat
// times (restored workers and clients get a fresh timeout), long polls and
// iteration versions (they move past every version a client knew), tasks
// to delete on workers (workers report unknown tasks), coordinated-read
// targets (consumers report their rounds again). A restored worker's
// undelivered tasks are sent again; a delivered one it no longer holds is
// lost, as without a restart.
//
// Thread safety: every method may be called from any thread; one mutex
// guards all state, the parts above included (JournalCommitter releases it
// around its writes, as LevelDB's VersionSet::LogAndApply). Long polls wait
// on a condition variable of their own key (a worker, an iteration), woken
// only by changes to it. Time comes from the injected clock so tests can
// drive timeouts.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "control/journal.pb.h"
#include "rpc/service.pb.h"
#include "sluice/control/coordinated_rounds.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/control/dispatcher_state.h"
#include "sluice/control/iteration_versions.h"
#include "sluice/control/journal.h"
#include "sluice/control/journal_committer.h"
#include "sluice/control/liveness.h"
#include "sluice/control/long_polls.h"
#include "sluice/control/task_policy.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/rpc/protocol.h"

namespace sluice::internal {

class DispatcherImpl {
 public:
  using Clock = std::function<absl::Time()>;
  // Whether the caller of a long poll went away (its call was cancelled or
  // its connection broke); checked every kCancelCheckInterval while the poll
  // waits. Empty: never.
  using IsCancelled = std::function<bool()>;
  // Checks, before a new worker registers, that its addresses answer:
  // OK, or an error saying what does not. Called without the mutex held.
  // Empty: every worker is accepted unchecked (unit tests).
  using WorkerProbe = std::function<absl::Status(const proto::WorkerHeartbeatRequest&)>;
  explicit DispatcherImpl(DispatcherConfig config, Clock clock = absl::Now,
                          WorkerProbe probe = {});
  ~DispatcherImpl();  // Shutdown(), then joins the thread that answers parked polls

  // Liveness. A worker (client) is alive for worker_timeout_ms
  // (client_timeout_ms) from the arrival of its last heartbeat, and again
  // from the moment a long poll returns to a caller still connected. The
  // server holds a long poll at most a third of that timeout, whatever the
  // request asks, so a connected caller's liveness never lapses while it
  // waits; a poll whose caller went away ends early and credits nothing.
  static constexpr absl::Duration kCancelCheckInterval = absl::Milliseconds(100);
  // The longest long poll granted to a worker / client.
  absl::Duration MaxWorkerWait() const;
  absl::Duration MaxClientWait() const;

  // Fault-tolerant mode: replays config.work_dir's journal (recovering a
  // torn tail) into this fresh dispatcher, then journals every later change
  // there. Call once, before serving. DataLoss names the record that cannot
  // be applied; FailedPrecondition when another dispatcher holds the journal.
  absl::Status OpenJournal(FsyncPolicy policy = FsyncPolicy::kEveryRecord)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The journaled state as text, for tests comparing a dispatcher with its
  // replay.
  std::string DurableStateString() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return state_.DebugString();
  }
  // Compaction: the journal is rewritten as a snapshot of the state once it
  // holds `min_records` records, and four times the records and the bytes
  // of the last snapshot (so it stays within a few times the state's size).
  // CompactJournal() does it now.
  static constexpr int64_t kCompactionMinRecords = JournalCommitter::kCompactionMinRecords;
  void SetCompactionMinRecords(int64_t min_records) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    journal_.SetCompactionMinRecords(min_records);
  }
  absl::Status CompactJournal() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return journal_.Compact(mu_);
  }
  // Waits until no journal write and no background compaction runs (so a
  // compaction started by the changes so far has ended).
  void AwaitJournalIdle() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    journal_.AwaitIdle(mu_);
  }
  // Tests: see JournalWriter::SetFaultHookForTesting. Call after OpenJournal.
  void SetJournalFaultHookForTesting(std::function<void(JournalWriter::Stage)> hook)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Registers an unknown worker (after `probe_` accepts its addresses:
  // InvalidArgument for a malformed address or an unknown protocol,
  // FailedPrecondition when an address does not answer). Tasks it names
  // that are not its own (unknown, collected, or another worker's: ids
  // are reused after a restart without a journal) are deleted on it and
  // change nothing else.
  absl::Status WorkerHeartbeat(const proto::WorkerHeartbeatRequest& req,
                               proto::WorkerHeartbeatResponse* resp,
                               const IsCancelled& cancelled = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // NotFound for an unknown worker or task, FailedPrecondition for a task
  // of another worker; nothing changes unless every update is valid.
  absl::Status WorkerUpdate(const proto::WorkerUpdateRequest& req,
                            proto::WorkerUpdateResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RegisterDataset(const proto::RegisterDatasetRequest& req,
                               proto::RegisterDatasetResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetDatasetDef(const proto::GetDatasetDefRequest& req,
                             proto::GetDatasetDefResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetOrCreateJob(const proto::GetOrCreateJobRequest& req,
                              proto::GetOrCreateJobResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetOrCreateIteration(const proto::GetOrCreateIterationRequest& req,
                                    proto::GetOrCreateIterationResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Long poll: waits up to req.wait_ms (at most MaxClientWait()) while the
  // iteration's version equals req.known_version.
  absl::Status ClientHeartbeat(const proto::ClientHeartbeatRequest& req,
                               proto::ClientHeartbeatResponse* resp,
                               const IsCancelled& cancelled = {}) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleaseIterationClient(const proto::ReleaseIterationClientRequest& req,
                                      proto::ReleaseIterationClientResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetWorkers(const proto::GetWorkersRequest& req, proto::GetWorkersResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetDataServiceMetadata(const proto::GetDataServiceMetadataRequest& req,
                                      proto::GetDataServiceMetadataResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetDataServiceConfig(const proto::GetDataServiceConfigRequest& req,
                                    proto::GetDataServiceConfigResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // distributed_epoch. Long poll: when nothing can be handed out yet, waits
  // up to req.wait_ms for a split to become available or the epoch to end.
  absl::Status GetSplit(const proto::GetSplitRequest& req, proto::GetSplitResponse* resp,
                        const IsCancelled& cancelled = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Expires workers and clients, collects idle iterations.
  // Long polls without a thread each (the gRPC callback server). Start*
  // answers at once or parks the poll; `done` runs exactly once, holding no
  // lock, with `resp` filled: at once, when what the poll waits for
  // changes, when its wait runs out, at Shutdown, or with Cancelled after
  // CancelPoll(id). `req` and `resp` must live until then. `id` comes from
  // NewPollId() (before Start*, so that a cancellation can name it).
  using PollDone = LongPolls::Done;
  int64_t NewPollId() ABSL_LOCKS_EXCLUDED(mu_);
  void StartWorkerHeartbeat(int64_t id, const proto::WorkerHeartbeatRequest& req,
                            proto::WorkerHeartbeatResponse* resp, PollDone done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void StartClientHeartbeat(int64_t id, const proto::ClientHeartbeatRequest& req,
                            proto::ClientHeartbeatResponse* resp, PollDone done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void StartGetSplit(int64_t id, const proto::GetSplitRequest& req, proto::GetSplitResponse* resp,
                     PollDone done) ABSL_LOCKS_EXCLUDED(mu_);
  void CancelPoll(int64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  void Tick() ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes long polls and makes later ones return at once.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Counters for tests and metrics: what the applied updates did
  // (DispatcherState::Counts: jobs, iterations, lost_workers,
  // collected_iterations, splits_created/completed/reassigned), and:
  struct Stats : DispatcherState::Counts, DispatcherState::Sizes {
    int64_t journal_records = 0;   // appended since start
    int64_t replayed_records = 0;  // read back from the journal at start
    int64_t journal_compactions = 0;
    int64_t journal_syncs = 0;     // fdatasync calls (one per group commit)
    // The longest time since a worker's (not inside a long poll) or a
    // client's last heartbeat. (Counts' jobs and iterations count
    // creations; Sizes are what the state holds now.)
    int64_t max_worker_heartbeat_age_ms = 0, max_client_heartbeat_age_ms = 0;
  };
  Stats GetStats() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Job = DispatcherState::Job;
  using Iteration = DispatcherState::Iteration;
  using Task = DispatcherState::Task;
  using Worker = DispatcherState::Worker;

  // Long polls (control/long_polls.h).
  using PollKey = LongPolls::Key;
  using PollStep = LongPolls::Step;
  using PollFn = LongPolls::Fn;
  using Parked = LongPolls::Parked;
  static PollKey WorkerKey(const std::string& address) { return LongPolls::Worker(address); }
  static PollKey VersionKey(int64_t iteration) { return LongPolls::Version(iteration); }
  static PollKey SplitsKey(int64_t iteration) { return LongPolls::Splits(iteration); }
  // Wakes the polls waiting on `key` (threads, and parked polls through the
  // poll thread). A change that can end a poll's wait must wake its key.
  void WakeLocked(const PollKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change `iteration`'s clients can see (in which `tasks` changed):
  // bumps its version (IterationVersions) and wakes its polls.
  void BumpVersionLocked(int64_t iteration, const std::vector<int64_t>& tasks = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a poll's steps on this thread, waiting between them (the
  // synchronous RPCs, tests).
  absl::Status RunPoll(absl::StatusOr<PollFn> poll, const IsCancelled& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);
  void StartPoll(int64_t id, absl::StatusOr<PollFn> poll, PollDone done) ABSL_LOCKS_EXCLUDED(mu_);
  void ParkLocked(int64_t id, Parked parked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollThread() ABSL_LOCKS_EXCLUDED(mu_);
  void EnsurePollThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The long polls' steps. WorkerHeartbeatPoll checks a new worker's
  // addresses first, without the lock.
  absl::StatusOr<PollFn> WorkerHeartbeatPoll(const proto::WorkerHeartbeatRequest& req,
                                             proto::WorkerHeartbeatResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WorkerHeartbeatBeginLocked(const proto::WorkerHeartbeatRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PollFn ClientHeartbeatPoll(const proto::ClientHeartbeatRequest& req,
                             proto::ClientHeartbeatResponse* resp);
  void FillClientHeartbeatLocked(const Iteration& it, const std::string& host,
                                 int64_t known_version, proto::ClientHeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PollFn GetSplitPoll(const proto::GetSplitRequest& req, proto::GetSplitResponse* resp);

  // Coordinated reads: records a consumer's round (CoordinatedRounds) and
  // starts the pending tasks of `it` once every consumer agreed.
  void CoordinateLocked(const Iteration& it, int64_t consumer_index, int64_t current_round,
                        int64_t blocked_round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Applies `rec` and (when a journal is open) queues it for the journal.
  // Unavailable, changing nothing, once the journal has failed.
  absl::Status RecordLocked(const proto::JournalRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetOrCreateIteration once the request is checked: joins the
  // repetition's iteration or creates it, taking its split description
  // from `splits` (distributed_epoch; described without the lock).
  absl::Status GetOrCreateIterationLocked(const proto::GetOrCreateIterationRequest& req,
                                          proto::CreateIterationUpdate* splits,
                                          proto::GetOrCreateIterationResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one update to state_ (live or replayed), then brings what is
  // kept beside it up to date from the update and its Changes: versions
  // and polls, liveness, tasks to delete, coordinated rounds.
  absl::Status ApplyLocked(const proto::JournalUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every RPC ends here, after releasing mu_: `reply` once every change
  // applied so far is durable (JournalCommitter::AwaitDurable).
  absl::Status AwaitDurable(absl::Status reply) ABSL_LOCKS_EXCLUDED(mu_);
  // The journal's snapshot: the state captured under mu_, and what builds
  // its records from the capture without it.
  JournalCommitter::BuildRecordsFn SnapshotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A fresh id (ids handed out but not yet applied included).
  int64_t NewIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DispatcherConfig config_;
  const Clock clock_;
  const WorkerProbe probe_;
  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  LongPolls polls_ ABSL_GUARDED_BY(mu_);
  absl::CondVar poll_cv_;
  std::thread poll_thread_;
  // The group commit (the journal in fault_tolerant_mode; open once
  // OpenJournal ran). It calls back into the dispatcher holding mu_:
  // SnapshotLocked to compact, and to wake the poll thread after a write.
  // Its compaction thread takes mu_ and signals poll_cv_, so it is declared
  // after them (and destroyed, joining that thread, before them).
  JournalCommitter journal_ ABSL_GUARDED_BY(mu_);
  bool replaying_ ABSL_GUARDED_BY(mu_) = false;  // quiets logs of replayed changes
  // The durable state: changed only by ApplyLocked.
  DispatcherState state_ ABSL_GUARDED_BY(mu_);
  // Ids handed out; at least state_.next_id() (NewIdLocked).
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Which tasks to create (on state_).
  const TaskPolicy task_policy_ ABSL_GUARDED_BY(mu_);
  // Beside the state, transient (not journaled, rebuilt after a restart):
  // liveness (heartbeat times, idle iterations), the versions long polls
  // compare, coordinated reads' rounds, and the tasks to delete on each
  // worker, sent with its next heartbeat reply.
  Liveness liveness_ ABSL_GUARDED_BY(mu_);
  IterationVersions versions_ ABSL_GUARDED_BY(mu_);
  CoordinatedRounds rounds_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<int64_t>> to_delete_ ABSL_GUARDED_BY(mu_);
  int64_t replayed_records_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::internal
