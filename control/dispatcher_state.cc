#include "sluice/control/dispatcher_state.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/control/journal.h"
#include "sluice/core/status.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/rpc/protocol.h"

namespace sluice::internal {

namespace {

template <typename Map, typename Key>
absl::Status MustExist(const Map& m, const Key& key, absl::string_view what) {
  if (m.count(key)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(what, " ", key, " does not exist"));
}

}  // namespace

DispatcherState::DispatcherState(std::vector<std::string> worker_addresses)
    : shard_claims_(std::move(worker_addresses)) {}

absl::Status DispatcherState::Apply(const proto::JournalUpdate& u, Changes* changes) {
  Changes& c = *changes;
  switch (u.kind_case()) {
    case proto::JournalUpdate::kRegisterDataset: return RegisterDataset(u.register_dataset());
    case proto::JournalUpdate::kCreateJob: return CreateJob(u.create_job());
    case proto::JournalUpdate::kCreateIteration: return CreateIteration(u.create_iteration());
    case proto::JournalUpdate::kRegisterWorker: return RegisterWorker(u.register_worker());
    case proto::JournalUpdate::kCreateTask: return CreateTask(u.create_task(), c);
    case proto::JournalUpdate::kTasksDelivered: return TasksDelivered(u.tasks_delivered());
    case proto::JournalUpdate::kFinishTask: return FinishTask(u.finish_task(), c);
    case proto::JournalUpdate::kIterationError: return IterationError(u.iteration_error(), c);
    case proto::JournalUpdate::kCreateClient: return CreateClient(u.create_client());
    case proto::JournalUpdate::kRemoveClient: return RemoveClient(u.remove_client(), c);
    case proto::JournalUpdate::kClientAtEnd: return ClientAtEnd(u.client_at_end());
    case proto::JournalUpdate::kCollectIteration:
      return CollectIteration(u.collect_iteration(), c);
    case proto::JournalUpdate::kDropJob: return DropJob(u.drop_job(), c);
    case proto::JournalUpdate::kRemoveWorker: return RemoveWorker(u.remove_worker(), c);
    case proto::JournalUpdate::kAssignSplit: return AssignSplit(u.assign_split());
    case proto::JournalUpdate::kCompleteSplits: return CompleteSplits(u.complete_splits(), c);
    case proto::JournalUpdate::kStartTasks: return StartTasks(u.start_tasks(), c);
    case proto::JournalUpdate::kRequeueSplits: return RequeueSplits(u.requeue_splits(), c);
    case proto::JournalUpdate::kSplitsReported: return SplitsReported(u.splits_reported(), c);
    case proto::JournalUpdate::kCounters: return Counters(u.counters());
    case proto::JournalUpdate::kShardClaim: return ShardClaim(u.shard_claim());
    case proto::JournalUpdate::kSplitProviderState:
      return SplitProviderState(u.split_provider_state(), c);
    case proto::JournalUpdate::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("journal update of an unknown kind (a newer dispatcher's?)");
}

// ---- one method per update kind ------------------------------------------------

absl::Status DispatcherState::RegisterDataset(const proto::RegisterDatasetUpdate& u) {
  datasets_.try_emplace(u.dataset_id(), Dataset{u.dataset_id(), u.dataset(), u.fingerprint()});
  return absl::OkStatus();
}

absl::Status DispatcherState::CreateJob(const proto::CreateJobUpdate& u) {
  SLUICE_RETURN_IF_ERROR(MustExist(datasets_, u.dataset_id(), "dataset"));
  Job job;
  job.id = u.job_id();
  job.dataset_id = u.dataset_id();
  job.mode = u.processing_mode();
  job.name = u.job_name();
  job.num_consumers = u.num_consumers();
  job.target_workers = u.target_workers();
  job.split_source = u.split_source();
  job.split_tracked = u.split_tracked();
  if (!jobs_.emplace(job.id, job).second) {
    return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " exists"));
  }
  if (!job.name.empty()) job_by_name_[job.name] = job.id;
  next_id_ = std::max(next_id_, job.id + 1);
  ++counts_.jobs;
  return absl::OkStatus();
}

absl::Status DispatcherState::CreateIteration(const proto::CreateIterationUpdate& u) {
  SLUICE_RETURN_IF_ERROR(MustExist(jobs_, u.job_id(), "job"));
  Iteration it;
  it.id = u.iteration_id();
  it.job_id = u.job_id();
  it.repetition = u.repetition();
  it.finished = u.finished();
  if (u.has_resume()) it.first_round = u.resume().round();
  if (u.has_splits()) {
    SLUICE_ASSIGN_OR_RETURN(it.splits, SplitProvider::Create(u));
  }
  if (!iterations_.emplace(it.id, std::move(it)).second) {
    return absl::AlreadyExistsError(absl::StrCat("iteration ", u.iteration_id(), " exists"));
  }
  jobs_.at(u.job_id()).iteration_by_repetition[u.repetition()] = u.iteration_id();
  next_id_ = std::max(next_id_, u.iteration_id() + 1);
  ++counts_.iterations;
  return absl::OkStatus();
}

absl::Status DispatcherState::RegisterWorker(const proto::RegisterWorkerUpdate& u) {
  auto known = workers_.find(u.address());
  if (known != workers_.end()) {
    // Registered again (it restarted): new addresses, same index.
    known->second.transfer_address = u.transfer_address();
    known->second.protocol = u.transfer_protocol();
    CountOnHost(known->second.host_id, -1);
    known->second.host_id = u.host_id();
    CountOnHost(known->second.host_id, +1);
    return absl::OkStatus();
  }
  Worker w;
  w.address = u.address();
  w.transfer_address = u.transfer_address();
  w.protocol = u.transfer_protocol();
  w.index = u.index();
  w.host_id = u.host_id();
  CountOnHost(w.host_id, +1);
  workers_.emplace(w.address, std::move(w));
  if (shard_claims_.size() == 0) {
    next_worker_index_ = std::max(next_worker_index_, u.index() + 1);
  } else {
    shard_claims_.Claim(u.index(), u.address());
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::CreateTask(const proto::CreateTaskUpdate& u, Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  SLUICE_RETURN_IF_ERROR(MustExist(workers_, u.worker_address(), "worker"));
  if (tasks_.count(u.task_id())) {
    return absl::AlreadyExistsError(absl::StrCat("task ", u.task_id(), " exists"));
  }
  Iteration& it = iterations_.at(u.iteration_id());
  Worker& w = workers_.at(u.worker_address());
  const Job& job = jobs_.at(it.job_id);
  Task t;
  t.id = u.task_id();
  t.iteration_id = it.id;
  t.worker = w.address;
  t.host_id = w.host_id;
  if (StaticShardingOf(job.mode)) t.shard = w.index;
  if (u.pending()) {
    // Joins at a round every consumer agrees to (CoordinatedRounds).
    t.pending = true;
    if (it.pending_tasks.empty()) c.joining.push_back(it.id);
    it.pending_tasks.push_back(t.id);
  }
  w.undelivered.push_back(t.id);
  c.workers.insert(w.address);
  w.tasks.insert(t.id);
  it.tasks.insert(t.id);
  it.finished = false;  // a late joiner's task runs
  c.visible.push_back({it.id, {t.id}});
  next_id_ = std::max(next_id_, t.id + 1);
  tasks_.emplace(t.id, std::move(t));
  return absl::OkStatus();
}

absl::Status DispatcherState::TasksDelivered(const proto::TasksDeliveredUpdate& u) {
  SLUICE_RETURN_IF_ERROR(MustExist(workers_, u.worker_address(), "worker"));
  std::set<int64_t> ids(u.task_ids().begin(), u.task_ids().end());
  for (int64_t id : ids) {
    auto t = tasks_.find(id);
    if (t != tasks_.end()) t->second.delivered = true;
  }
  auto& undelivered = workers_.at(u.worker_address()).undelivered;
  undelivered.erase(std::remove_if(undelivered.begin(), undelivered.end(),
                                   [&ids](int64_t id) { return ids.count(id) > 0; }),
                    undelivered.end());
  return absl::OkStatus();
}

absl::Status DispatcherState::TaskDefOf(int64_t id, proto::TaskDef* def) const {
  auto t = tasks_.find(id);
  if (t == tasks_.end()) return absl::NotFoundError(absl::StrCat("task ", id, " not found"));
  const Task& task = t->second;
  const Iteration& it = iterations_.at(task.iteration_id);
  const Job& job = jobs_.at(it.job_id);
  def->set_task_id(id);
  def->set_iteration_id(it.id);
  def->set_dataset_id(job.dataset_id);
  *def->mutable_dataset() = datasets_.at(job.dataset_id).def;
  def->set_processing_mode(job.mode);
  // The index its worker registered with (its shard under static sharding;
  // a gone worker's task, never sent, keeps its shard).
  auto w = workers_.find(task.worker);
  def->set_worker_index(w != workers_.end() ? w->second.index : std::max<int64_t>(task.shard, 0));
  def->set_split_tracked(job.split_tracked);
  if (StaticShardingOf(job.mode)) def->set_num_shards(shard_claims_.size());
  def->set_num_consumers(job.num_consumers);
  return absl::OkStatus();
}

absl::Status DispatcherState::FinishTask(const proto::FinishTaskUpdate& u, Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(tasks_, u.task_id(), "task"));
  Finish(tasks_.at(u.task_id()), u.lost(), c);
  return absl::OkStatus();
}

absl::Status DispatcherState::IterationError(const proto::IterationErrorUpdate& u, Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  Iteration& it = iterations_.at(u.iteration_id());
  if (it.error.ok()) {
    it.error = FromProto(u.error());
    c.visible.push_back({it.id, {}});
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::CreateClient(const proto::CreateClientUpdate& u) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  Client cl;
  cl.id = u.client_id();
  cl.iteration_id = u.iteration_id();
  cl.consumer_index = u.consumer_index();
  cl.host_id = u.host_id();
  if (!clients_.emplace(cl.id, cl).second) {
    return absl::AlreadyExistsError(absl::StrCat("iteration client ", cl.id, " exists"));
  }
  Iteration& it = iterations_.at(cl.iteration_id);
  if (cl.consumer_index >= 0) it.consumer_clients[cl.consumer_index] = cl.id;
  it.clients.insert(cl.id);
  next_id_ = std::max(next_id_, cl.id + 1);
  return absl::OkStatus();
}

absl::Status DispatcherState::RemoveClient(const proto::RemoveClientUpdate& u, Changes& c) {
  auto cit = clients_.find(u.client_id());
  if (cit == clients_.end()) return absl::OkStatus();
  auto iit = iterations_.find(cit->second.iteration_id);
  clients_.erase(cit);
  if (iit == iterations_.end()) return absl::OkStatus();
  Iteration& it = iit->second;
  it.clients.erase(u.client_id());
  if (it.splits != nullptr && it.splits->ClientGone(u.client_id())) c.splits.insert(it.id);
  for (auto cc = it.consumer_clients.begin(); cc != it.consumer_clients.end(); ++cc) {
    if (cc->second == u.client_id()) {
      c.left_consumers.emplace_back(it.id, cc->first);
      it.consumer_clients.erase(cc);
      break;
    }
  }
  if (it.clients.empty()) c.idle.push_back(it.id);
  return absl::OkStatus();
}

absl::Status DispatcherState::ClientAtEnd(const proto::ClientAtEndUpdate& u) {
  auto cl = clients_.find(u.client_id());
  if (cl != clients_.end()) cl->second.at_end = true;
  return absl::OkStatus();
}

absl::Status DispatcherState::CollectIteration(const proto::CollectIterationUpdate& u,
                                               Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  Iteration& it = iterations_.at(u.iteration_id());
  for (int64_t id : it.tasks) {
    auto t = tasks_.find(id);
    if (t == tasks_.end()) continue;
    auto w = workers_.find(t->second.worker);
    if (w != workers_.end()) {
      w->second.tasks.erase(id);
      std::erase(w->second.undelivered, id);  // never sent now
      c.collected_tasks.emplace_back(w->first, id);
      c.workers.insert(w->first);
    }
    tasks_.erase(t);
  }
  it.tasks.clear();
  it.splits.reset();
  c.splits.insert(it.id);
  it.collected = true;
  c.visible.push_back({it.id, {}});
  ++counts_.collected_iterations;
  return absl::OkStatus();
}

absl::Status DispatcherState::DropJob(const proto::DropJobUpdate& u, Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(jobs_, u.job_id(), "job"));
  const Job& job = jobs_.at(u.job_id());
  for (const auto& [rep, iteration_id] : job.iteration_by_repetition) {
    c.dropped.push_back(iteration_id);
    iterations_.erase(iteration_id);
  }
  if (!job.name.empty()) job_by_name_.erase(job.name);
  jobs_.erase(u.job_id());
  return absl::OkStatus();
}

void DispatcherState::CountOnHost(const std::string& host_id, int64_t delta) {
  if (host_id.empty()) return;
  auto it = workers_per_host_.try_emplace(host_id, 0).first;
  it->second += delta;
  if (it->second <= 0) workers_per_host_.erase(it);
}

int64_t DispatcherState::WorkersOnHost(const std::string& host_id) const {
  auto it = workers_per_host_.find(host_id);
  return it == workers_per_host_.end() ? 0 : it->second;
}

absl::Status DispatcherState::RemoveWorker(const proto::RemoveWorkerUpdate& u, Changes& c) {
  auto wit = workers_.find(u.address());
  if (wit == workers_.end()) return absl::OkStatus();
  for (int64_t id : wit->second.tasks) {
    auto t = tasks_.find(id);
    if (t != tasks_.end()) Finish(t->second, /*lost=*/true, c);
  }
  c.workers.insert(wit->first);
  CountOnHost(wit->second.host_id, -1);
  workers_.erase(wit);
  ++counts_.lost_workers;
  return absl::OkStatus();
}

absl::Status DispatcherState::AssignSplit(const proto::AssignSplitUpdate& u) {
  SLUICE_ASSIGN_OR_RETURN(Iteration * found, IterationOfTask(u.task_id()));
  Iteration& it = *found;
  if (it.splits == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("iteration ", it.id, " has no splits to assign"));
  }
  SLUICE_RETURN_IF_ERROR(it.splits->Assign(u));
  if (u.created()) {
    ++counts_.splits_created;
    next_id_ = std::max(next_id_, u.split().split_id() + 1);
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::CompleteSplits(const proto::CompleteSplitsUpdate& u, Changes& c) {
  SLUICE_ASSIGN_OR_RETURN(Iteration * found, IterationOfTask(u.task_id()));
  Iteration& it = *found;
  if (it.splits == nullptr) return absl::OkStatus();
  for (int64_t id : u.split_ids()) {
    if (!it.splits->Complete(u.task_id(), id)) continue;
    ++counts_.splits_completed;
    c.splits.insert(it.id);
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::StartTasks(const proto::StartTasksUpdate& u, Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  Iteration& it = iterations_.at(u.iteration_id());
  Changes::Visible started{it.id, {}};
  for (int64_t id : u.task_ids()) {
    auto t = tasks_.find(id);
    if (t != tasks_.end()) {
      t->second.pending = false;
      t->second.starting_round = u.starting_round();
      started.tasks.push_back(id);
    }
    it.pending_tasks.erase(std::remove(it.pending_tasks.begin(), it.pending_tasks.end(), id),
                           it.pending_tasks.end());
  }
  c.visible.push_back(std::move(started));
  return absl::OkStatus();
}

absl::Status DispatcherState::RequeueSplits(const proto::RequeueSplitsUpdate& u, Changes& c) {
  SLUICE_ASSIGN_OR_RETURN(Iteration * found, IterationOfTask(u.task_id()));
  Iteration& it = *found;
  if (it.splits == nullptr) return absl::OkStatus();
  counts_.splits_reassigned += it.splits->Requeue(
      u.task_id(), std::set<int64_t>(u.split_ids().begin(), u.split_ids().end()));
  c.splits.insert(it.id);
  return absl::OkStatus();
}

std::vector<int64_t> DispatcherState::SplitsAwaitingReport(int64_t client) const {
  auto cl = clients_.find(client);
  if (cl == clients_.end()) return {};
  auto it = iterations_.find(cl->second.iteration_id);
  if (it == iterations_.end() || it->second.splits == nullptr) return {};
  return it->second.splits->AwaitingReport(client);
}

absl::Status DispatcherState::SplitsReported(const proto::SplitsReportedUpdate& u, Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  Iteration& it = iterations_.at(u.iteration_id());
  if (it.splits == nullptr) return absl::OkStatus();
  for (const proto::SplitProgress& p : u.splits()) {
    if (!IndexSet::Valid(p.delivered_prefix(), p.delivered_beyond())) {
      return absl::InvalidArgumentError(
          absl::StrCat("split ", p.split_id(), ": the delivered indices are out of bounds"));
    }
    if (it.splits->Reported(u.client_id(), p.split_id(),
                            IndexSet(p.delivered_prefix(), p.delivered_beyond()))) {
      c.splits.insert(it.id);
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::Counters(const proto::CountersUpdate& u) {
  next_id_ = std::max(next_id_, u.next_id());
  next_worker_index_ = std::max(next_worker_index_, u.next_worker_index());
  return absl::OkStatus();
}

absl::Status DispatcherState::ShardClaim(const proto::ShardClaimUpdate& u) {
  shard_claims_.Claim(u.index(), u.address());
  return absl::OkStatus();
}

absl::Status DispatcherState::SplitProviderState(const proto::SplitProviderStateUpdate& u,
                                                 Changes& c) {
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, u.iteration_id(), "iteration"));
  Iteration& it = iterations_.at(u.iteration_id());
  if (it.splits == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("iteration ", it.id, " has no split provider"));
  }
  for (const auto& os : u.open()) {
    if (os.holder_task() != 0) SLUICE_RETURN_IF_ERROR(MustExist(tasks_, os.holder_task(), "task"));
    next_id_ = std::max(next_id_, os.split().split_id() + 1);
  }
  it.splits->Restore(u);
  c.splits.insert(it.id);
  return absl::OkStatus();
}

// ---- helpers --------------------------------------------------------------------

absl::StatusOr<DispatcherState::Iteration*> DispatcherState::IterationOfTask(int64_t task_id) {
  SLUICE_RETURN_IF_ERROR(MustExist(tasks_, task_id, "task"));
  const int64_t id = tasks_.at(task_id).iteration_id;
  SLUICE_RETURN_IF_ERROR(MustExist(iterations_, id, "iteration"));
  return &iterations_.at(id);
}

void DispatcherState::Finish(Task& t, bool lost, Changes& c) {
  if (t.completed || t.lost) return;
  if (lost) {
    t.lost = true;
  } else {
    t.completed = true;
  }
  auto it = iterations_.find(t.iteration_id);
  if (it == iterations_.end()) return;
  if (it->second.splits != nullptr) {
    // A lost task's open splits go to other tasks (once the iteration's
    // clients said which of their elements they hold, when elements are
    // tied to splits); a task that ended its pipeline on its own (e.g.
    // Take) chose not to read the rest of its.
    int64_t completed = 0;
    auto job = jobs_.find(it->second.job_id);
    const bool tracked = job != jobs_.end() && job->second.split_tracked;
    const int64_t requeued = it->second.splits->Release(
        t.id, lost, &completed, tracked ? it->second.clients : std::set<int64_t>());
    counts_.splits_completed += completed;
    counts_.splits_reassigned += requeued;
    if (requeued > 0) c.requeued.push_back({t.id, it->first, requeued});
    if (requeued > 0 || completed > 0) c.splits.insert(it->first);
  }
  c.visible.push_back({it->first, {t.id}});
  UpdateFinished(it->second, c);
}

void DispatcherState::UpdateFinished(Iteration& it, Changes& c) {
  if (it.finished || it.tasks.empty()) return;
  std::set<int64_t> completed_shards;
  for (int64_t id : it.tasks) {
    const Task& t = tasks_.at(id);
    if (!t.completed && !t.lost) return;
    if (t.completed) completed_shards.insert(t.shard);
  }
  // Every task was lost before producing all its data: the iteration
  // waits for a worker to join (or come back) and take it on, as tf.data
  // does, rather than ending short.
  if (completed_shards.empty()) return;
  // Static sharding: an iteration ends only once every shard was read to
  // its end (a lost worker's shard waits for a worker to take it again).
  if (StaticShardingOf(jobs_.at(it.job_id).mode) &&
      static_cast<int64_t>(completed_shards.size()) < shard_claims_.size()) {
    return;
  }
  it.finished = true;
  c.visible.push_back({it.id, {}});
}

// ---- snapshot -------------------------------------------------------------------

DispatcherState::Sizes DispatcherState::sizes() const {
  Sizes s;
  s.workers = static_cast<int64_t>(workers_.size());
  s.iteration_clients = static_cast<int64_t>(clients_.size());
  s.live_tasks = static_cast<int64_t>(tasks_.size());
  for (const auto& [id, t] : tasks_) s.open_tasks += !t.completed && !t.lost;
  s.datasets = static_cast<int64_t>(datasets_.size());
  s.current_jobs = static_cast<int64_t>(jobs_.size());
  for (const auto& [id, it] : iterations_) s.active_iterations += !it.finished && !it.collected;
  return s;
}

DispatcherState::Captured DispatcherState::Capture() const {
  Captured c;
  auto head = [&c]() { return &c.head.emplace_back(); };
  auto tail = [&c]() { return &c.tail.emplace_back(); };
  for (const auto& [id, d] : datasets_) {
    auto* u = head()->mutable_register_dataset();
    u->set_dataset_id(id);
    *u->mutable_dataset() = d.def;
    u->set_fingerprint(d.fingerprint);
  }
  for (const auto& [id, j] : jobs_) {
    auto* u = head()->mutable_create_job();
    u->set_job_id(id);
    u->set_dataset_id(j.dataset_id);
    u->set_processing_mode(j.mode);
    u->set_job_name(j.name);
    u->set_num_consumers(j.num_consumers);
    u->set_target_workers(j.target_workers);
    *u->mutable_split_source() = j.split_source;
    u->set_split_tracked(j.split_tracked);
  }
  // The tasks, one pass in no order (a node each, among hundreds of
  // thousands): their workers by index, registered ones first. A worker
  // some tasks name but gone since gets a stand-in, registered here and
  // removed again at the end, with the shard and host of its first task.
  absl::flat_hash_map<absl::string_view, int32_t> index;
  index.reserve(workers_.size());
  for (const auto& [addr, w] : workers_) {
    index.emplace(addr, static_cast<int32_t>(c.worker_addresses.size()));
    c.worker_addresses.push_back(addr);
  }
  const size_t registered = c.worker_addresses.size();
  absl::flat_hash_map<int32_t, const Task*> first_of_gone;
  c.tasks.reserve(tasks_.size());
  for (const auto& [id, t] : tasks_) {
    auto [slot, added] = index.try_emplace(t.worker, static_cast<int32_t>(c.worker_addresses.size()));
    if (added) c.worker_addresses.push_back(t.worker);
    if (static_cast<size_t>(slot->second) >= registered) {
      const Task*& first = first_of_gone[slot->second];
      if (first == nullptr || id < first->id) first = &t;
    }
    c.tasks.push_back({id, t.iteration_id, t.starting_round, slot->second, t.pending, t.delivered,
                       t.completed, t.lost});
  }
  std::map<std::string, const Task*> gone;  // by address, so the snapshot is ordered
  for (const auto& [i, t] : first_of_gone) gone.emplace(t->worker, t);
  for (const auto& [addr, w] : workers_) {
    auto* u = head()->mutable_register_worker();
    u->set_address(addr);
    u->set_transfer_address(w.transfer_address);
    u->set_transfer_protocol(w.protocol);
    u->set_index(w.index);
    u->set_host_id(w.host_id);
  }
  for (const auto& [addr, t] : gone) {
    auto* u = head()->mutable_register_worker();
    u->set_address(addr);
    u->set_index(std::max<int64_t>(0, t->shard));
    u->set_host_id(t->host_id);
  }
  for (const auto& [id, it] : iterations_) {
    auto* u = head()->mutable_create_iteration();
    u->set_iteration_id(id);
    u->set_job_id(it.job_id);
    u->set_repetition(it.repetition);
    u->set_finished(it.finished);
    if (it.splits != nullptr) it.splits->DescribeTo(u);
    if (it.first_round != 0) u->mutable_resume()->set_round(it.first_round);
    if (!it.error.ok()) {
      auto* e = head()->mutable_iteration_error();
      e->set_iteration_id(id);
      *e->mutable_error() = ToProto(it.error);
    }
  }
  for (const auto& [id, it] : iterations_) {
    if (it.splits == nullptr) continue;
    auto* u = c.middle.emplace_back().mutable_split_provider_state();
    u->set_iteration_id(id);
    it.splits->Save(u);
  }
  for (const auto& [id, it] : iterations_) {
    if (it.collected) tail()->mutable_collect_iteration()->set_iteration_id(id);
  }
  for (const auto& [id, cl] : clients_) {
    auto* u = tail()->mutable_create_client();
    u->set_client_id(id);
    u->set_iteration_id(cl.iteration_id);
    u->set_consumer_index(cl.consumer_index);
    u->set_host_id(cl.host_id);
    if (cl.at_end) tail()->mutable_client_at_end()->set_client_id(id);
  }
  for (const auto& [addr, t] : gone) tail()->mutable_remove_worker()->set_address(addr);
  const std::vector<std::string>& holders = shard_claims_.holders();
  for (size_t i = 0; i < holders.size(); ++i) {
    if (holders[i].empty()) continue;
    auto* u = tail()->mutable_shard_claim();
    u->set_index(static_cast<int64_t>(i));
    u->set_address(holders[i]);
  }
  auto* counters = tail()->mutable_counters();
  counters->set_next_id(next_id_);
  counters->set_next_worker_index(next_worker_index_);
  return c;
}

std::vector<proto::JournalRecord> DispatcherState::Build(Captured c) {
  std::vector<proto::JournalRecord> out(1);
  size_t bytes = 0;  // of the updates in the last record before its last (being filled)
  auto add = [&]() -> proto::JournalUpdate* {
    // Records of at most 1000 updates keep each far below kMaxRecordBytes
    // unless dataset definitions are huge (one per update). The size is
    // summed update by update: the whole record's, asked at every update,
    // made a snapshot of 100,000 tasks take a third of a second.
    proto::JournalRecord* rec = &out.back();
    if (rec->updates_size() > 0) bytes += rec->updates(rec->updates_size() - 1).ByteSizeLong();
    if (rec->updates_size() >= 1000 || bytes > kMaxRecordBytes / 4) {
      rec = &out.emplace_back();
      bytes = 0;
    }
    return rec->add_updates();
  };
  for (proto::JournalUpdate& u : c.head) *add() = std::move(u);
  // Every task exists before any finishes (an iteration is finished once
  // all of its tasks are); tasks by id, so equal states write equal
  // snapshots.
  std::sort(c.tasks.begin(), c.tasks.end(),
            [](const Captured::TaskRow& a, const Captured::TaskRow& b) { return a.id < b.id; });
  std::map<absl::string_view, std::vector<int64_t>> delivered;
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> started;  // (it, round) -> tasks
  for (const Captured::TaskRow& t : c.tasks) {
    const std::string& worker = c.worker_addresses[t.worker];
    auto* u = add()->mutable_create_task();
    u->set_task_id(t.id);
    u->set_iteration_id(t.iteration);
    u->set_worker_address(worker);
    u->set_pending(t.pending);
    if (t.delivered) delivered[worker].push_back(t.id);
    if (!t.pending && t.starting_round != 0) started[{t.iteration, t.starting_round}].push_back(t.id);
  }
  for (const auto& [addr, ids] : delivered) {
    auto* u = add()->mutable_tasks_delivered();
    u->set_worker_address(std::string(addr));
    for (int64_t id : ids) u->add_task_ids(id);
  }
  for (const auto& [key, ids] : started) {
    auto* u = add()->mutable_start_tasks();
    u->set_iteration_id(key.first);
    u->set_starting_round(key.second);
    for (int64_t id : ids) u->add_task_ids(id);
  }
  for (proto::JournalUpdate& u : c.middle) *add() = std::move(u);
  for (const Captured::TaskRow& t : c.tasks) {
    if (!t.completed && !t.lost) continue;
    auto* u = add()->mutable_finish_task();
    u->set_task_id(t.id);
    u->set_lost(t.lost);
  }
  for (proto::JournalUpdate& u : c.tail) *add() = std::move(u);
  return out;
}

std::string DispatcherState::Text(const std::vector<proto::JournalRecord>& records) {
  std::string out;
  for (const proto::JournalRecord& rec : records) {
    for (const proto::JournalUpdate& u : rec.updates()) {
      absl::StrAppend(&out, u.ShortDebugString(), "\n");
    }
  }
  return out;
}

}  // namespace sluice::internal
