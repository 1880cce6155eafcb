#include "sluice/control/dispatcher_impl.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "sluice/control/request_checks.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/rpc/protocol.h"

namespace sluice::internal {

DispatcherImpl::DispatcherImpl(DispatcherConfig config, Clock clock, WorkerProbe probe)
    : config_(std::move(config)),
      clock_(std::move(clock)),
      probe_(std::move(probe)),
      journal_([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return SnapshotLocked(); },
               [this] { poll_cv_.Signal(); }),
      state_(config_.worker_addresses),
      task_policy_(state_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return NewIdLocked(); }) {}

absl::Duration DispatcherImpl::MaxWorkerWait() const {
  return absl::Milliseconds(config_.worker_timeout_ms) / kLongPollTimeoutFraction;
}

absl::Duration DispatcherImpl::MaxClientWait() const {
  return absl::Milliseconds(config_.client_timeout_ms) / kLongPollTimeoutFraction;
}

void DispatcherImpl::WakeLocked(const PollKey& key) {
  if (polls_.Wake(key)) poll_cv_.Signal();
}

void DispatcherImpl::BumpVersionLocked(int64_t iteration, const std::vector<int64_t>& tasks) {
  versions_.Bump(iteration, tasks);
  WakeLocked(VersionKey(iteration));
}

absl::Status DispatcherImpl::RunPoll(absl::StatusOr<PollFn> poll, const IsCancelled& cancelled) {
  SLUICE_RETURN_IF_ERROR(poll.status());
  absl::MutexLock l(&mu_);
  PollStep step;
  while (true) {
    const bool timed_out = step.wait && !step.ready();
    step = PollStep();
    step.timed_out = timed_out;
    absl::Status s = (*poll)(&step);
    if (!s.ok() || !step.wait) return s;
    if (!polls_.Await(mu_, step.key, step.ready, step.deadline - absl::Now(), cancelled,
                      kCancelCheckInterval)) {
      // The caller went away: no reply reaches it, and nothing is credited.
      return absl::CancelledError("the caller went away");
    }
  }
}

int64_t DispatcherImpl::NewPollId() {
  absl::MutexLock l(&mu_);
  return polls_.NewId();
}

void DispatcherImpl::StartPoll(int64_t id, absl::StatusOr<PollFn> poll, PollDone done) {
  absl::Status s = poll.status();
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) {
      // The poll thread may be gone: nothing would send a queued reply.
      s = absl::UnavailableError("the dispatcher is shutting down");
      poll = s;
    }
    PollStep step;
    if (s.ok()) s = (*poll)(&step);
    if (s.ok() && step.wait && !shutdown_) {
      ParkLocked(id, {*std::move(poll), std::move(step), std::move(done)});
      return;
    }
    // Answered now. Unless what it saw is already durable, the poll thread
    // sends the reply once it is: a callback thread never waits for a disk.
    if (!shutdown_ && journal_.Behind()) {
      journal_.QueueReply(std::move(done), std::move(s));
      EnsurePollThreadLocked();
      poll_cv_.Signal();
      return;
    }
  }
  done(std::move(s));
}

void DispatcherImpl::EnsurePollThreadLocked() {
  if (!poll_thread_.joinable()) poll_thread_ = std::thread([this] { PollThread(); });
}

void DispatcherImpl::StartWorkerHeartbeat(int64_t id, const proto::WorkerHeartbeatRequest& req,
                                          proto::WorkerHeartbeatResponse* resp, PollDone done) {
  StartPoll(id, WorkerHeartbeatPoll(req, resp), std::move(done));
}
void DispatcherImpl::StartClientHeartbeat(int64_t id, const proto::ClientHeartbeatRequest& req,
                                          proto::ClientHeartbeatResponse* resp, PollDone done) {
  StartPoll(id, ClientHeartbeatPoll(req, resp), std::move(done));
}
void DispatcherImpl::StartGetSplit(int64_t id, const proto::GetSplitRequest& req,
                                   proto::GetSplitResponse* resp, PollDone done) {
  StartPoll(id, GetSplitPoll(req, resp), std::move(done));
}

void DispatcherImpl::ParkLocked(int64_t id, Parked parked) {
  polls_.Park(id, std::move(parked));
  EnsurePollThreadLocked();
  poll_cv_.Signal();  // the poll thread may sleep past this deadline
}

void DispatcherImpl::CancelPoll(int64_t id) {
  std::optional<Parked> parked;
  {
    absl::MutexLock l(&mu_);
    parked = polls_.Unpark(id);
  }
  if (parked) parked->done(absl::CancelledError("the caller went away"));
}

void DispatcherImpl::PollThread() {
  absl::MutexLock l(&mu_);
  while (!(shutdown_ && polls_.empty() && !journal_.replies_pending())) {
    bool progress = false;
    // Woken polls, and polls whose wait ran out (all of them at shutdown):
    // their next step, and their reply queued when they answer.
    for (const auto& [id, timed_out] : polls_.Due(absl::Now(), shutdown_)) {
      const Parked* p = polls_.Find(id);
      if (p == nullptr) continue;  // answered or cancelled already
      const bool ready = p->step.ready();
      if (!timed_out && !ready) continue;  // a wake-up that did not concern it
      progress = true;
      Parked parked = *polls_.Unpark(id);
      PollStep step;
      step.timed_out = !ready;
      absl::Status s = parked.poll(&step);
      if (s.ok() && step.wait && !shutdown_) {
        ParkLocked(id, {std::move(parked.poll), std::move(step), std::move(parked.done)});
      } else {
        journal_.QueueReply(std::move(parked.done), std::move(s));
      }
    }
    // Group commit for the replies: their writes, then the replies whose
    // state is durable, sent without the lock (a write's end wakes this
    // thread).
    if (journal_.SendReplies(mu_) || progress) continue;
    poll_cv_.WaitWithDeadline(&mu_, polls_.NextDeadline());
  }
}

DispatcherImpl::~DispatcherImpl() {
  Shutdown();
  if (poll_thread_.joinable()) poll_thread_.join();
}

void DispatcherImpl::Shutdown() {
  absl::MutexLock l(&mu_);
  shutdown_ = true;
  polls_.WakeAllThreads();
  poll_cv_.Signal();  // answers every parked poll
}

// ---- state changes and the journal ---------------------------------------------

absl::Status DispatcherImpl::RecordLocked(const proto::JournalRecord& rec) {
  if (rec.updates_size() == 0) return absl::OkStatus();
  std::string bytes;
  if (journal_.is_open()) {
    SLUICE_ASSIGN_OR_RETURN(bytes, journal_.Encode(rec));
  }
  for (const proto::JournalUpdate& u : rec.updates()) {
    absl::Status s = ApplyLocked(u);
    if (!s.ok()) {
      // Inconsistent with the state: a bug (and a replay would stop at this
      // record, so it is not journaled).
      spdlog::error("dispatcher: cannot apply a state change: {}", std::string(s.message()));
      return absl::InternalError(absl::StrCat("dispatcher state change failed: ", s.message()));
    }
  }
  if (journal_.is_open()) journal_.Queue(std::move(bytes));
  return absl::OkStatus();
}

absl::Status DispatcherImpl::ApplyLocked(const proto::JournalUpdate& u) {
  DispatcherState::Changes c;
  SLUICE_RETURN_IF_ERROR(state_.Apply(u, &c));
  liveness_.Follow(u, c, clock_());
  rounds_.Follow(u, c);
  if (u.has_remove_worker()) to_delete_.erase(u.remove_worker().address());
  for (const DispatcherState::Changes::Visible& v : c.visible) BumpVersionLocked(v.iteration, v.tasks);
  for (int64_t id : c.splits) {
    versions_.BumpSplits(id);
    WakeLocked(SplitsKey(id));
  }
  for (const auto& [addr, task] : c.collected_tasks) to_delete_[addr].push_back(task);
  for (const std::string& addr : c.workers) WakeLocked(WorkerKey(addr));
  for (int64_t id : c.dropped) {
    WakeLocked(VersionKey(id));
    WakeLocked(SplitsKey(id));
    versions_.Forget(id);
  }
  if (!replaying_) {
    for (const DispatcherState::Changes::Requeued& r : c.requeued) {
      spdlog::warn("dispatcher: task {} was lost holding {} unfinished split(s) of iteration {}; "
                   "they go to the remaining workers",
                   r.task, r.splits, r.iteration);
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::AwaitDurable(absl::Status reply) {
  absl::MutexLock l(&mu_);
  return journal_.AwaitDurable(mu_, std::move(reply));
}

void DispatcherImpl::SetJournalFaultHookForTesting(
    std::function<void(JournalWriter::Stage)> hook) {
  absl::MutexLock l(&mu_);
  journal_.SetFaultHookForTesting(mu_, std::move(hook));
}

JournalCommitter::BuildRecordsFn DispatcherImpl::SnapshotLocked() {
  auto captured = std::make_shared<DispatcherState::Captured>(state_.Capture());
  return [captured] { return DispatcherState::Build(std::move(*captured)); };
}

absl::Status DispatcherImpl::OpenJournal(FsyncPolicy policy) {
  if (config_.work_dir.empty()) {
    return absl::InvalidArgumentError("fault_tolerant_mode needs a work_dir for the journal");
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> records, ReadJournal(config_.work_dir));
  absl::MutexLock l(&mu_);
  if (journal_.is_open() || state_.next_id() != 1 || !state_.workers().empty()) {
    return absl::FailedPreconditionError("OpenJournal: the dispatcher is already in use");
  }
  replaying_ = true;
  const absl::Status replayed = JournalCommitter::Replay(
      config_.work_dir, records,
      [this](const proto::JournalUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return ApplyLocked(u);
      });
  replaying_ = false;
  SLUICE_RETURN_IF_ERROR(replayed);
  // What was not journaled starts afresh: timeouts count from now, and
  // versions move on so that every client's long poll returns at once.
  const absl::Time now = clock_();
  const int64_t version_jump = absl::ToUnixMicros(now);
  for (const auto& [id, it] : state_.iterations()) {
    rounds_.Start(id, it.first_round);
    versions_.Restart(id, version_jump);
  }
  liveness_.Restart(state_, now);
  replayed_records_ = static_cast<int64_t>(records.size());
  SLUICE_RETURN_IF_ERROR(journal_.Open(config_.work_dir, policy, replayed_records_));
  const DispatcherState::Sizes n = state_.sizes();
  spdlog::info("dispatcher: journal {} replayed ({} records): {} dataset(s), {} job(s), {} "
               "iteration(s), {} running task(s), {} worker(s), {} client(s)",
               journal_.path(), records.size(), n.datasets, n.current_jobs,
               state_.iterations().size(), n.open_tasks, n.workers, n.iteration_clients);
  return absl::OkStatus();
}

// ---- workers ------------------------------------------------------------------

int64_t DispatcherImpl::NewIdLocked() {
  next_id_ = std::max(next_id_, state_.next_id());
  return next_id_++;
}

absl::Status DispatcherImpl::WorkerHeartbeat(const proto::WorkerHeartbeatRequest& req,
                                             proto::WorkerHeartbeatResponse* resp,
                                             const IsCancelled& cancelled) {
  return AwaitDurable(RunPoll(WorkerHeartbeatPoll(req, resp), cancelled));
}

absl::StatusOr<DispatcherImpl::PollFn> DispatcherImpl::WorkerHeartbeatPoll(
    const proto::WorkerHeartbeatRequest& req, proto::WorkerHeartbeatResponse* resp) {
  if (req.worker_address().empty()) {
    return absl::InvalidArgumentError("WorkerHeartbeat: worker_address is empty");
  }
  bool check;  // new, or back with other addresses (it restarted)
  {
    absl::MutexLock l(&mu_);
    auto registration = ResolveRegistration(state_, req);
    check = !registration.ok() || registration->has_value();
  }
  // A worker gets tasks only once its addresses answered.
  if (check) SLUICE_RETURN_IF_ERROR(CheckRegistration(req, probe_));
  return PollFn([this, &req, resp, first = true](PollStep* step)
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable {
    const std::string& addr = req.worker_address();
    if (first) {
      first = false;
      SLUICE_RETURN_IF_ERROR(WorkerHeartbeatBeginLocked(req));
      // The condition looks the worker up again: Tick() may remove it while
      // the poll waits (its entry must not be referenced across the wait).
      auto has_news = [addr, this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        auto it = state_.workers().find(addr);
        return shutdown_ || it == state_.workers().end() || !it->second.undelivered.empty() ||
               to_delete_.count(addr) > 0;
      };
      const absl::Duration wait = std::min(absl::Milliseconds(req.wait_ms()), MaxWorkerWait());
      if (wait > absl::ZeroDuration() && !has_news()) {
        *step = {true, WorkerKey(addr), has_news, absl::Now() + wait};
        return absl::OkStatus();
      }
    }
    // The worker may have been removed while we waited (Tick after timeout).
    auto wit = state_.workers().find(addr);
    if (wit == state_.workers().end()) return absl::OkStatus();
    if (!wit->second.undelivered.empty()) {
      proto::JournalRecord delivered;
      proto::TasksDeliveredUpdate* d = delivered.add_updates()->mutable_tasks_delivered();
      d->set_worker_address(addr);
      for (int64_t id : wit->second.undelivered) {
        d->add_task_ids(id);
        SLUICE_RETURN_IF_ERROR(state_.TaskDefOf(id, resp->add_new_tasks()));
      }
      SLUICE_RETURN_IF_ERROR(RecordLocked(delivered));
    }
    auto doomed = to_delete_.find(addr);
    if (doomed != to_delete_.end()) {
      for (int64_t id : doomed->second) resp->add_tasks_to_delete(id);
      to_delete_.erase(doomed);
    }
    liveness_.HeardWorker(addr, clock_());
    resp->set_worker_timeout_ms(config_.worker_timeout_ms);
    resp->set_workers_on_host(state_.WorkersOnHost(req.host_id()));
    return absl::OkStatus();
  });
}

absl::Status DispatcherImpl::WorkerHeartbeatBeginLocked(const proto::WorkerHeartbeatRequest& req) {
  const std::string& addr = req.worker_address();
  SLUICE_ASSIGN_OR_RETURN(std::optional<proto::RegisterWorkerUpdate> registration,
                          ResolveRegistration(state_, req));
  if (registration) {
    const bool known = state_.workers().count(addr) > 0;
    proto::JournalRecord rec;
    *rec.add_updates()->mutable_register_worker() = *registration;
    // A worker that joins mid-job gets a task for every running iteration
    // that reads its host.
    auto started = [this](int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return rounds_.Started(id);
    };
    if (!known) task_policy_.ForNewWorker(addr, req.host_id(), registration->index(), started, &rec);
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    if (known) {
      spdlog::info("dispatcher: worker {} is back with transfer {} over {}", addr,
                   registration->transfer_address(), registration->transfer_protocol());
    } else {
      spdlog::info("dispatcher: worker {} on host {} registered as worker {} (transfer {} over {})",
                   addr, registration->host_id(), registration->index(),
                   registration->transfer_address(), registration->transfer_protocol());
    }
  }
  const Worker& w = state_.workers().at(addr);
  liveness_.HeardWorker(addr, clock_());
  // Tasks whose output was read, and reconciliation: tasks this worker
  // should hold but does not (it restarted) are lost and created again;
  // tasks it holds that we no longer know are deleted.
  proto::JournalRecord finished;
  const std::set<int64_t> lost_in = task_policy_.Reconcile(w, req, &finished);
  SLUICE_RETURN_IF_ERROR(RecordLocked(finished));
  proto::JournalRecord again;
  task_policy_.Again(w, lost_in, &again);
  SLUICE_RETURN_IF_ERROR(RecordLocked(again));
  for (int64_t id : TaskPolicy::Unknown(w, req)) to_delete_[addr].push_back(id);
  return absl::OkStatus();
}

absl::Status DispatcherImpl::WorkerUpdate(const proto::WorkerUpdateRequest& req,
                                          proto::WorkerUpdateResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    absl::MutexLock l(&mu_);
    SLUICE_RETURN_IF_ERROR(CheckWorkerUpdate(state_, req));
    proto::JournalRecord rec;
    task_policy_.Report(req, &rec);
    return RecordLocked(rec);
  }());
}

// ---- datasets and jobs --------------------------------------------------------------

absl::Status DispatcherImpl::RegisterDataset(const proto::RegisterDatasetRequest& req,
                                             proto::RegisterDatasetResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    SLUICE_RETURN_IF_ERROR(CheckRegisterDataset(req));
    const uint64_t fp = DefFingerprint(req.dataset());
    absl::MutexLock l(&mu_);
    bool known = false;
    SLUICE_ASSIGN_OR_RETURN(const std::string id, ResolveDatasetId(state_, req, fp, &known));
    if (!known) {
      proto::JournalRecord rec;
      proto::RegisterDatasetUpdate* r = rec.add_updates()->mutable_register_dataset();
      r->set_dataset_id(id);
      *r->mutable_dataset() = req.dataset();
      r->set_fingerprint(fp);
      SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    }
    resp->set_dataset_id(id);
    return absl::OkStatus();
  }());
}

absl::Status DispatcherImpl::GetDatasetDef(const proto::GetDatasetDefRequest& req,
                                           proto::GetDatasetDefResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    absl::MutexLock l(&mu_);
    SLUICE_ASSIGN_OR_RETURN(const DispatcherState::Dataset* dataset,
                            FindDataset(state_, req.dataset_id()));
    *resp->mutable_dataset() = dataset->def;
    return absl::OkStatus();
  }());
}

absl::Status DispatcherImpl::GetOrCreateJob(const proto::GetOrCreateJobRequest& req,
                                            proto::GetOrCreateJobResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    const int64_t num_shards = static_cast<int64_t>(config_.worker_addresses.size());
    SLUICE_RETURN_IF_ERROR(CheckJobRequest(req, num_shards));
    // An existing job of that name answers (under the lock).
    auto existing = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<absl::Status> {
      auto named = FindNamedJob(state_, req);
      if (!named.ok()) return named.status();
      if (!named->has_value()) return std::nullopt;
      resp->set_job_id(**named);
      return absl::OkStatus();
    };
    proto::DatasetDef def;
    {
      absl::MutexLock l(&mu_);
      SLUICE_ASSIGN_OR_RETURN(const DispatcherState::Dataset* dataset,
                              FindDataset(state_, req.dataset_id()));
      if (auto done = existing()) return *done;
      def = dataset->def;  // registered datasets never change
    }
    // The pipeline is analysed without the lock (heartbeats go on).
    proto::JournalRecord rec;
    proto::CreateJobUpdate* job = rec.add_updates()->mutable_create_job();
    SLUICE_ASSIGN_OR_RETURN(*job, ResolveJob(def, req, num_shards));
    absl::MutexLock l(&mu_);
    if (auto done = existing()) return *done;  // another consumer created it meanwhile
    job->set_job_id(NewIdLocked());
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    resp->set_job_id(job->job_id());
    return absl::OkStatus();
  }());
}

absl::Status DispatcherImpl::GetOrCreateIteration(const proto::GetOrCreateIterationRequest& req,
                                                  proto::GetOrCreateIterationResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    // A new distributed_epoch iteration splits the job's source, which may
    // list files (a glob over a large corpus): without the lock; it is
    // created after unless another consumer created it meanwhile.
    proto::DatasetNode to_split;
    {
      absl::MutexLock l(&mu_);
      SLUICE_RETURN_IF_ERROR(CheckIterationRequest(state_, req));
      const Job& job = state_.jobs().at(req.job_id());
      if (job.mode != proto::DISTRIBUTED_EPOCH || job.iteration_by_repetition.count(req.repetition())) {
        return GetOrCreateIterationLocked(req, nullptr, resp);
      }
      to_split = job.split_source;
    }
    proto::CreateIterationUpdate splits;
    SLUICE_RETURN_IF_ERROR(SplitProvider::Describe(to_split, config_.range_split_elements,
                                                   config_.file_split_files, &splits));
    if (req.has_resume()) {
      SLUICE_RETURN_IF_ERROR(SplitProvider::CheckResume(req.resume(), splits.positions()));
      *splits.mutable_resume() = req.resume();
    }
    absl::MutexLock l(&mu_);
    SLUICE_RETURN_IF_ERROR(CheckIterationRequest(state_, req));
    return GetOrCreateIterationLocked(req, &splits, resp);
  }());
}

absl::Status DispatcherImpl::GetOrCreateIterationLocked(
    const proto::GetOrCreateIterationRequest& req, proto::CreateIterationUpdate* splits,
    proto::GetOrCreateIterationResponse* resp) {
  const Job& job = state_.jobs().at(req.job_id());
  const bool local = job.target_workers == proto::TARGET_WORKERS_LOCAL;
  proto::JournalRecord rec;
  int64_t iteration_id;
  bool created = false;
  auto existing = job.iteration_by_repetition.find(req.repetition());
  if (existing != job.iteration_by_repetition.end()) {
    iteration_id = existing->second;
    const Iteration& it = state_.iterations().at(iteration_id);
    SLUICE_RETURN_IF_ERROR(CheckJoin(job, it, req, config_.job_gc_timeout_ms));
    // LOCAL: the first consumer on this host brings tasks on its workers.
    task_policy_.ForNewHost(it, req.host_id(), &rec);
  } else {
    proto::CreateIterationUpdate* ci = rec.add_updates()->mutable_create_iteration();
    if (job.mode == proto::DISTRIBUTED_EPOCH) {
      if (splits == nullptr) return absl::InternalError("a distributed_epoch iteration unsplit");
      ci->Swap(splits);  // the file list is not copied under the lock
    } else if (req.has_resume()) {
      *ci->mutable_resume() = req.resume();  // coordinated reads: the round
    }
    iteration_id = NewIdLocked();
    ci->set_iteration_id(iteration_id);
    ci->set_job_id(job.id);
    ci->set_repetition(req.repetition());
    task_policy_.ForNewIteration(iteration_id, local, req.host_id(), &rec);
    created = true;
  }
  proto::CreateClientUpdate* c = rec.add_updates()->mutable_create_client();
  c->set_client_id(NewIdLocked());
  c->set_iteration_id(iteration_id);
  c->set_consumer_index(job.num_consumers > 0 ? req.consumer_index() : -1);
  c->set_host_id(req.host_id());
  SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
  // Tasks created from now on join a running iteration.
  const Iteration& it = state_.iterations().at(iteration_id);
  if (created) rounds_.Start(iteration_id, it.first_round);
  resp->set_iteration_id(iteration_id);
  resp->set_iteration_client_id(c->client_id());
  if (it.splits != nullptr) resp->set_split_positions(it.splits->positions());
  resp->set_first_round(it.first_round);
  return absl::OkStatus();
}

absl::Status DispatcherImpl::ReleaseIterationClient(
    const proto::ReleaseIterationClientRequest& req, proto::ReleaseIterationClientResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    absl::MutexLock l(&mu_);
    if (!state_.clients().count(req.iteration_client_id())) {
      return absl::NotFoundError(absl::StrCat("iteration client ", req.iteration_client_id(),
                                              " is unknown (released or timed out)"));
    }
    proto::JournalRecord rec;
    rec.add_updates()->mutable_remove_client()->set_client_id(req.iteration_client_id());
    return RecordLocked(rec);
  }());
}

// ---- clients --------------------------------------------------------------------

absl::Status DispatcherImpl::ClientHeartbeat(const proto::ClientHeartbeatRequest& req,
                                             proto::ClientHeartbeatResponse* resp,
                                             const IsCancelled& cancelled) {
  return AwaitDurable(RunPoll(ClientHeartbeatPoll(req, resp), cancelled));
}

DispatcherImpl::PollFn DispatcherImpl::ClientHeartbeatPoll(const proto::ClientHeartbeatRequest& req,
                                                           proto::ClientHeartbeatResponse* resp) {
  return [this, &req, resp, iteration_id = int64_t{-1}](PollStep* step)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable -> absl::Status {
    const int64_t known_version = req.known_version();
    auto cit = state_.clients().find(req.iteration_client_id());
    const bool known = cit != state_.clients().end();
    if (iteration_id < 0) {  // the first step
      if (!known) {
        return absl::NotFoundError(absl::StrCat("iteration client ", req.iteration_client_id(),
                                                " is unknown (released or timed out)"));
      }
      liveness_.HeardClient(cit->first, clock_());
      iteration_id = cit->second.iteration_id;
      proto::JournalRecord reported;
      SLUICE_RETURN_IF_ERROR(SplitProvider::ClientReport(
          iteration_id, cit->first, req, state_.SplitsAwaitingReport(cit->first), &reported));
      SLUICE_RETURN_IF_ERROR(RecordLocked(reported));
      if (cit->second.consumer_index >= 0) {
        auto iit = state_.iterations().find(iteration_id);
        if (iit != state_.iterations().end()) {
          CoordinateLocked(iit->second, cit->second.consumer_index, req.current_round(),
                           req.blocked_round());
        }
      }
      auto changed = [this, known_version, id = iteration_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shutdown_ || !state_.iterations().count(id) || versions_.version(id) != known_version;
      };
      const absl::Duration wait = std::min(absl::Milliseconds(req.wait_ms()), MaxClientWait());
      if (wait > absl::ZeroDuration() && !changed()) {
        *step = {true, VersionKey(iteration_id), changed, absl::Now() + wait};
        return absl::OkStatus();
      }
    }
    if (known) liveness_.HeardClient(cit->first, clock_());
    auto iit = state_.iterations().find(iteration_id);
    if (iit == state_.iterations().end()) {
      return absl::NotFoundError(absl::StrCat("iteration ", iteration_id, " no longer exists"));
    }
    const Iteration& it = iit->second;
    // The client ends iff it sees the same finished state we record it on.
    if (req.at_end() && known && !cit->second.at_end && it.finished &&
        known_version == versions_.version(it.id)) {
      proto::JournalRecord rec;
      rec.add_updates()->mutable_client_at_end()->set_client_id(cit->first);
      SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    }
    FillClientHeartbeatLocked(it, known ? cit->second.host_id : std::string(), known_version,
                              resp);
    if (known) {
      for (int64_t id : state_.SplitsAwaitingReport(cit->first)) resp->add_report_splits(id);
    }
    return absl::OkStatus();
  };
}

void DispatcherImpl::FillClientHeartbeatLocked(const Iteration& it, const std::string& host,
                                               int64_t known_version,
                                               proto::ClientHeartbeatResponse* resp) {
  // A client that knows a version of this dispatcher's gets only the tasks
  // added or changed since (none when the poll ran out).
  const std::optional<std::vector<int64_t>> changed = versions_.ChangedSince(it.id, known_version);
  resp->set_tasks_delta(changed.has_value());
  task_policy_.ListTasks(it, changed ? &*changed : nullptr, host, resp);
  resp->set_iteration_finished(it.finished || (it.collected && it.tasks.empty()));
  if (it.splits != nullptr) {
    resp->set_completed_split_watermark(it.splits->LowestOpen().value_or(state_.next_id()));
  }
  resp->set_block_round(it.pending_tasks.empty() ? -1 : rounds_.Target(it.id));
  if (!it.error.ok()) *resp->mutable_error() = ToProto(it.error);
  resp->set_version(versions_.version(it.id));
}

void DispatcherImpl::CoordinateLocked(const Iteration& it, int64_t consumer_index,
                                      int64_t current_round, int64_t blocked_round) {
  const int64_t num_consumers = state_.jobs().at(it.job_id).num_consumers;
  switch (rounds_.Report(it.id, consumer_index, current_round, blocked_round,
                         !it.pending_tasks.empty(), num_consumers)) {
    case CoordinatedRounds::Outcome::kNone:
      return;
    case CoordinatedRounds::Outcome::kTargetMoved:
      BumpVersionLocked(it.id);
      return;
    case CoordinatedRounds::Outcome::kAllReady:
      break;
  }
  proto::JournalRecord rec;
  proto::StartTasksUpdate* start = rec.add_updates()->mutable_start_tasks();
  start->set_iteration_id(it.id);
  for (int64_t id : it.pending_tasks) start->add_task_ids(id);
  start->set_starting_round(rounds_.Target(it.id));
  if (!RecordLocked(rec).ok()) return;  // logged; the next heartbeat tries again
  spdlog::info("dispatcher: iteration {}: {} task(s) join the coordinated reads at round {}",
               it.id, start->task_ids_size(), start->starting_round());
}

// ---- maintenance -----------------------------------------------------------------

void DispatcherImpl::Tick() {
  [this] {
    absl::MutexLock l(&mu_);
    const absl::Time now = clock_();
    proto::JournalRecord expired;
    std::vector<std::string> lost;  // what to log once the workers are removed
    liveness_.Expire(state_, now, config_.worker_timeout_ms, config_.client_timeout_ms, &expired,
                     &lost);
    if (!RecordLocked(expired).ok()) return;  // logged; the next tick tries again
    for (const std::string& line : lost) spdlog::warn("{}", line);
    proto::JournalRecord collect;
    liveness_.Collect(state_, now, config_.job_gc_timeout_ms, &collect);
    if (!RecordLocked(collect).ok()) return;
    // An anonymous job has no name to come back by: once every iteration of
    // it is collected, forget it entirely.
    proto::JournalRecord drop;
    for (const auto& [job_id, job] : state_.jobs()) {
      if (!job.name.empty() || job.iteration_by_repetition.empty()) continue;
      bool all_collected = true;
      for (const auto& [rep, id] : job.iteration_by_repetition) {
        all_collected = all_collected && state_.iterations().at(id).collected;
      }
      if (all_collected) drop.add_updates()->mutable_drop_job()->set_job_id(job_id);
    }
    RecordLocked(drop).IgnoreError();  // logged; the next tick tries again
  }();
  // Nobody waits for what Tick changed (lost workers, collected
  // iterations); write it now rather than with the next request.
  AwaitDurable(absl::OkStatus()).IgnoreError();
}

// ---- distributed_epoch: splits ------------------------------------------------------

absl::Status DispatcherImpl::GetSplit(const proto::GetSplitRequest& req,
                                      proto::GetSplitResponse* resp,
                                      const IsCancelled& cancelled) {
  return AwaitDurable(RunPoll(GetSplitPoll(req, resp), cancelled));
}

DispatcherImpl::PollFn DispatcherImpl::GetSplitPoll(const proto::GetSplitRequest& req,
                                                    proto::GetSplitResponse* resp) {
  const absl::Time deadline = clock_() + absl::Milliseconds(std::max<int64_t>(0, req.wait_ms()));
  // Each step completes what the request reports and plans a split; when
  // none is ready yet it waits for a change to the iteration's splits.
  return [this, &req, resp, deadline](PollStep* step)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(const Task* found, CheckGetSplit(state_, req));
    const Task& task = *found;
    const Iteration& it = state_.iterations().at(task.iteration_id);
    proto::JournalRecord rec;
    it.splits->Report(task.id, task.lost, req, &rec);
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    if (req.report_only()) return absl::OkStatus();
    if (task.lost) {
      // Its splits went to other workers; handing it more would strand them.
      return absl::FailedPreconditionError(absl::StrCat(
          "GetSplit: task ", task.id, " on worker ", task.worker,
          " was declared lost (no heartbeat for ", config_.worker_timeout_ms,
          " ms); its splits were reassigned"));
    }
    resp->Clear();
    proto::JournalRecord assign;
    proto::AssignSplitUpdate* a = assign.add_updates()->mutable_assign_split();
    if (it.splits->Next(task.id, req.epoch(), resp, a)) {
      if (a->created()) a->mutable_split()->set_split_id(NewIdLocked());
      SLUICE_RETURN_IF_ERROR(RecordLocked(assign));
      *resp->mutable_split() = a->split();
      it.splits->NameFiles(resp->mutable_split());
      return absl::OkStatus();
    }
    if (!resp->not_ready() || shutdown_ || step->timed_out || clock_() >= deadline) {
      return absl::OkStatus();
    }
    // Wait for a change to the splits (a completion, a reassignment).
    const int64_t iteration_id = it.id, seen = versions_.split_version(it.id);
    auto changed = [this, iteration_id, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || !state_.iterations().count(iteration_id) ||
             versions_.split_version(iteration_id) != seen;
    };
    *step = {true, SplitsKey(iteration_id), changed, absl::Now() + (deadline - clock_())};
    return absl::OkStatus();
  };
}

// ---- introspection ------------------------------------------------------------------

absl::Status DispatcherImpl::GetWorkers(const proto::GetWorkersRequest& req,
                                        proto::GetWorkersResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    absl::MutexLock l(&mu_);
    for (const auto& [addr, w] : state_.workers()) {
      auto* info = resp->add_workers();
      info->set_address(addr);
      info->set_transfer_address(w.transfer_address);
      info->set_transfer_protocol(w.protocol);
      info->set_num_tasks(static_cast<int64_t>(w.tasks.size()));
      info->set_host_id(w.host_id);
    }
    return absl::OkStatus();
  }());
}

absl::Status DispatcherImpl::GetDataServiceMetadata(
    const proto::GetDataServiceMetadataRequest& req, proto::GetDataServiceMetadataResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    proto::DatasetDef def;
    {
      absl::MutexLock l(&mu_);
      SLUICE_ASSIGN_OR_RETURN(const DispatcherState::Dataset* dataset,
                              FindDataset(state_, req.dataset_id()));
      def = dataset->def;
      resp->set_fingerprint(dataset->fingerprint);
    }
    // The dispatcher loads no plugins, so a definition with UDFs may not
    // analyze here; its cardinality is then unknown.
    auto ds = Dataset::FromDef(def);
    resp->set_cardinality(ds.ok() ? ds->Cardinality() : kUnknownCardinality);
    resp->set_element_spec(ds.ok() ? ds->element_spec().ToString() : "(unknown)");
    return absl::OkStatus();
  }());
}

absl::Status DispatcherImpl::GetDataServiceConfig(const proto::GetDataServiceConfigRequest& req,
                                                  proto::GetDataServiceConfigResponse* resp) {
  resp->set_fault_tolerant_mode(config_.fault_tolerant_mode);
  resp->set_worker_timeout_ms(config_.worker_timeout_ms);
  resp->set_client_timeout_ms(config_.client_timeout_ms);
  resp->set_job_gc_timeout_ms(config_.job_gc_timeout_ms);
  return AwaitDurable(absl::OkStatus());
}

DispatcherImpl::Stats DispatcherImpl::GetStats() {
  absl::MutexLock l(&mu_);
  Stats s;
  s.journal_records = journal_.counters().records;
  s.journal_compactions = journal_.counters().compactions;
  s.journal_syncs = journal_.counters().syncs;
  s.replayed_records = replayed_records_;
  static_cast<DispatcherState::Counts&>(s) = state_.counts();
  static_cast<DispatcherState::Sizes&>(s) = state_.sizes();
  const absl::Time now = clock_();
  s.max_worker_heartbeat_age_ms = absl::ToInt64Milliseconds(liveness_.MaxWorkerSilence(now));
  s.max_client_heartbeat_age_ms = absl::ToInt64Milliseconds(liveness_.MaxClientSilence(now));
  return s;
}

}  // namespace sluice::internal
