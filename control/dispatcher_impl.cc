#include "sluice/control/dispatcher_impl.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/rpc/protocol.h"

namespace sluice::internal {

namespace {

// A caller-chosen dataset id: 1-128 bytes of [A-Za-z0-9._-].
absl::Status ValidateDatasetId(const std::string& id) {
  constexpr size_t kMaxDatasetIdBytes = 128;
  const bool ok_chars = std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (id.size() > kMaxDatasetIdBytes || !ok_chars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterDataset: dataset id '", absl::CHexEscape(id.substr(0, kMaxDatasetIdBytes)),
        "' must be 1-", kMaxDatasetIdBytes, " characters of [A-Za-z0-9._-]"));
  }
  return absl::OkStatus();
}

// When `key` was last heard from (the Unix epoch: never).
template <typename Map, typename Key>
absl::Time LastHeard(const Map& m, const Key& key) {
  auto found = m.find(key);
  return found == m.end() ? absl::Time() : found->second;
}

}  // namespace

DispatcherImpl::DispatcherImpl(DispatcherConfig config, Clock clock, WorkerProbe probe)
    : config_(std::move(config)),
      clock_(std::move(clock)),
      probe_(std::move(probe)),
      journal_([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return SnapshotLocked(); },
               [this] { poll_cv_.Signal(); }),
      state_(config_.worker_addresses) {}

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
      QueueReplyLocked(std::move(done), std::move(s));
      return;
    }
  }
  done(std::move(s));
}

void DispatcherImpl::QueueReplyLocked(PollDone done, absl::Status s) {
  replies_.push_back({journal_.applied(), std::move(done), std::move(s)});
  EnsurePollThreadLocked();
  poll_cv_.Signal();
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
  while (!(shutdown_ && polls_.empty() && replies_.empty())) {
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
        replies_.push_back({journal_.applied(), std::move(parked.done), std::move(s)});
      }
    }
    // Group commit for the replies: write what they wait for (unless a
    // writer runs: its end wakes this thread).
    if (!replies_.empty() && journal_.NeedsWriter(replies_.back().target)) {
      journal_.Write(mu_);  // releases mu_ while it writes
      progress = true;
    }
    // The replies whose state is durable (every one, failing, once the
    // journal failed) go out, in order, without the lock.
    const bool failed = journal_.is_open() && !journal_.error().ok();
    std::vector<PendingReply> send;
    while (!replies_.empty() &&
           (failed || journal_.Durable(replies_.front().target))) {
      send.push_back(std::move(replies_.front()));
      replies_.pop_front();
    }
    if (!send.empty()) {
      const absl::Status error = failed ? journal_.error() : absl::OkStatus();
      mu_.Unlock();
      for (PendingReply& r : send) r.done(error.ok() ? std::move(r.status) : error);
      mu_.Lock();
      continue;
    }
    if (progress) continue;
    poll_cv_.WaitWithDeadline(&mu_, polls_.NextDeadline());
  }
}

DispatcherImpl::~DispatcherImpl() {
  Shutdown();
  if (poll_thread_.joinable()) poll_thread_.join();
}

absl::Status DispatcherImpl::ValidateRegistration(const proto::WorkerHeartbeatRequest& req) {
  SLUICE_RETURN_IF_ERROR(ValidateDialableAddress(req.worker_address(), "worker_address"));
  const std::string& protocol = req.transfer_protocol();
  // The dispatcher relays the name to clients, which know the protocols
  // (dataplane/transport_registry.h); it only checks that it is a name.
  const bool name_like =
      protocol.size() <= 32 && std::all_of(protocol.begin(), protocol.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.';
      });
  if (!name_like) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", req.worker_address(), ": transfer_protocol '",
        absl::CHexEscape(protocol.substr(0, 64)),
        "' is not a protocol name (at most 32 letters, digits, '_', '-' or '.')"));
  }
  if (!req.transfer_address().empty()) {
    SLUICE_RETURN_IF_ERROR(ValidateDialableAddress(
        req.transfer_address(), absl::StrCat("worker ", req.worker_address(), ": transfer_address")));
  }
  return absl::OkStatus();
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
  const absl::Time now = clock_();
  switch (u.kind_case()) {
    case proto::JournalUpdate::kRegisterWorker:
      liveness_.workers.try_emplace(u.register_worker().address(), now);
      break;
    case proto::JournalUpdate::kRemoveWorker:
      liveness_.workers.erase(u.remove_worker().address());
      to_delete_.erase(u.remove_worker().address());
      break;
    case proto::JournalUpdate::kCreateClient:
      liveness_.clients[u.create_client().client_id()] = now;
      break;
    case proto::JournalUpdate::kRemoveClient:
      liveness_.clients.erase(u.remove_client().client_id());
      break;
    case proto::JournalUpdate::kStartTasks:
      rounds_.Joined(u.start_tasks().iteration_id());
      break;
    default:
      break;
  }
  for (const DispatcherState::Changes::Visible& v : c.visible) BumpVersionLocked(v.iteration, v.tasks);
  for (int64_t id : c.splits) {
    versions_.BumpSplits(id);
    WakeLocked(SplitsKey(id));
  }
  for (const auto& [addr, task] : c.collected_tasks) to_delete_[addr].push_back(task);
  for (const std::string& addr : c.workers) WakeLocked(WorkerKey(addr));
  for (int64_t id : c.idle) liveness_.idle_since[id] = now;
  for (const auto& [id, consumer] : c.left_consumers) rounds_.Left(id, consumer);
  for (int64_t id : c.joining) rounds_.ChooseTarget(id);
  for (int64_t id : c.dropped) {
    WakeLocked(VersionKey(id));
    WakeLocked(SplitsKey(id));
    versions_.Forget(id);
    rounds_.Forget(id);
    liveness_.idle_since.erase(id);
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

void DispatcherImpl::SetCompactionMinRecords(int64_t min_records) {
  absl::MutexLock l(&mu_);
  journal_.SetCompactionMinRecords(min_records);
}

void DispatcherImpl::SetJournalFaultHookForTesting(
    std::function<void(JournalWriter::Stage)> hook) {
  absl::MutexLock l(&mu_);
  journal_.SetFaultHookForTesting(mu_, std::move(hook));
}

absl::Status DispatcherImpl::CompactJournal() {
  absl::MutexLock l(&mu_);
  return journal_.Compact(mu_);
}

std::vector<std::string> DispatcherImpl::SnapshotLocked() {
  std::vector<std::string> out;
  for (const proto::JournalRecord& rec : state_.Snapshot()) out.push_back(rec.SerializeAsString());
  return out;
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
  for (size_t i = 0; i < records.size(); ++i) {
    proto::JournalRecord rec;
    absl::Status s;
    if (!rec.ParseFromString(records[i])) {
      s = absl::InvalidArgumentError("it does not parse");
    }
    for (int k = 0; s.ok() && k < rec.updates_size(); ++k) s = ApplyLocked(rec.updates(k));
    if (!s.ok()) {
      replaying_ = false;
      return absl::DataLossError(
          absl::StrCat("dispatcher journal ", config_.work_dir, "/", std::string(kJournalFileName),
                       ": record ", i + 1, " of ", records.size(), " cannot be applied (",
                       s.message(), "); it was written by an incompatible dispatcher or is "
                       "damaged"));
    }
  }
  replaying_ = false;
  // What was not journaled starts afresh: timeouts count from now, and
  // versions move on so that every client's long poll returns at once.
  const absl::Time now = clock_();
  const int64_t version_jump = absl::ToUnixMicros(now);
  for (const auto& [id, it] : state_.iterations()) {
    rounds_.Start(id);
    if (it.clients.empty()) liveness_.idle_since[id] = now;
    versions_.Restart(id, version_jump);
  }
  for (const auto& [addr, w] : state_.workers()) liveness_.workers[addr] = now;
  for (const auto& [id, c] : state_.clients()) liveness_.clients[id] = now;
  replayed_records_ = static_cast<int64_t>(records.size());
  SLUICE_RETURN_IF_ERROR(journal_.Open(config_.work_dir, policy, replayed_records_));
  int64_t open_tasks = 0;
  for (const auto& [id, t] : state_.tasks()) open_tasks += !t.completed && !t.lost;
  spdlog::info("dispatcher: journal {} replayed ({} records): {} dataset(s), {} job(s), {} "
               "iteration(s), {} running task(s), {} worker(s), {} client(s)",
               journal_.path(), records.size(), state_.datasets().size(), state_.jobs().size(),
               state_.iterations().size(), open_tasks, state_.workers().size(),
               state_.clients().size());
  return absl::OkStatus();
}

std::string DispatcherImpl::DurableStateString() {
  absl::MutexLock l(&mu_);
  return state_.DebugString();
}

// ---- workers ------------------------------------------------------------------

int64_t DispatcherImpl::NewIdLocked() {
  next_id_ = std::max(next_id_, state_.next_id());
  return next_id_++;
}

void DispatcherImpl::AddCreateTaskLocked(proto::JournalRecord& rec, int64_t iteration_id,
                                         bool pending, const std::string& address) {
  proto::CreateTaskUpdate* u = rec.add_updates()->mutable_create_task();
  u->set_task_id(NewIdLocked());
  u->set_iteration_id(iteration_id);
  u->set_worker_address(address);
  u->set_pending(pending);
}

bool DispatcherImpl::NeedsTaskLocked(const Iteration& it, int64_t worker_index) {
  if (!StaticShardingOf(state_.jobs().at(it.job_id).mode)) return true;
  for (int64_t id : it.tasks) {
    const Task& t = state_.tasks().at(id);
    if (t.shard == worker_index && !t.lost) return false;
  }
  return true;
}

bool DispatcherImpl::ReadsHostLocked(const Iteration& it, const std::string& host) {
  if (state_.jobs().at(it.job_id).target_workers != proto::TARGET_WORKERS_LOCAL) return true;
  for (int64_t id : it.clients) {
    auto c = state_.clients().find(id);
    if (c != state_.clients().end() && c->second.host_id == host) return true;
  }
  return false;
}

bool DispatcherImpl::AcceptsTasksLocked(const Iteration& it) {
  if (it.collected) return false;
  if (!it.finished) return true;
  for (int64_t id : it.clients) {
    auto c = state_.clients().find(id);
    if (c != state_.clients().end() && !c->second.at_end) return true;
  }
  return false;
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
  const std::string& addr = req.worker_address();
  const std::string transfer_address =
      req.transfer_address().empty() ? addr : req.transfer_address();
  const std::string protocol = req.transfer_protocol().empty() ? "grpc" : req.transfer_protocol();
  // New, or known but back with other addresses (it restarted): check it.
  // (A known worker's heartbeat without addresses leaves them as they are.)
  auto moved = [&req, transfer_address, protocol](const Worker& w) {
    return (!req.transfer_address().empty() && w.transfer_address != transfer_address) ||
           (!req.transfer_protocol().empty() && w.protocol != protocol) ||
           (!req.host_id().empty() && w.host_id != req.host_id());
  };
  bool check;
  {
    absl::MutexLock l(&mu_);
    auto w = state_.workers().find(addr);
    check = w == state_.workers().end() || moved(w->second);
  }
  if (check) {
    // A worker gets tasks only once its addresses answered: one that
    // registered at an address where nothing listens would hold every
    // pipeline it is given until it timed out.
    SLUICE_RETURN_IF_ERROR(ValidateRegistration(req));
    if (probe_) {
      absl::Status reachable = probe_(req);
      if (!reachable.ok()) {
        spdlog::warn("dispatcher: refused to register worker {}: {}", addr,
                     std::string(reachable.message()));
        return absl::FailedPreconditionError(absl::StrCat(
            "the dispatcher cannot reach worker ", addr, ": ", reachable.message(),
            "; it registers only once its addresses answer (check --worker_address, "
            "--data_transfer_address and firewalls)"));
      }
    }
  }
  return PollFn([this, &req, resp, moved, transfer_address, protocol,
                 first = true](PollStep* step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) mutable {
    const std::string& addr = req.worker_address();
    if (first) {
      first = false;
      absl::Status s = WorkerHeartbeatBeginLocked(req, transfer_address, protocol, moved);
      if (!s.ok()) return s;
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
      for (const proto::TaskDef& def : wit->second.undelivered) {
        d->add_task_ids(def.task_id());
        *resp->add_new_tasks() = def;
      }
      SLUICE_RETURN_IF_ERROR(RecordLocked(delivered));
    }
    auto doomed = to_delete_.find(addr);
    if (doomed != to_delete_.end()) {
      for (int64_t id : doomed->second) resp->add_tasks_to_delete(id);
      to_delete_.erase(doomed);
    }
    liveness_.workers[addr] = clock_();
    resp->set_worker_timeout_ms(config_.worker_timeout_ms);
    return absl::OkStatus();
  });
}

absl::Status DispatcherImpl::WorkerHeartbeatBeginLocked(
    const proto::WorkerHeartbeatRequest& req, const std::string& transfer_address,
    const std::string& protocol, const std::function<bool(const Worker&)>& moved) {
  const std::string& addr = req.worker_address();
  auto wit = state_.workers().find(addr);
  const bool known = wit != state_.workers().end();
  if (!known || moved(wit->second)) {
    int64_t index = known ? wit->second.index : state_.next_worker_index();
    if (!known && state_.shard_claims().size() > 0) {
      SLUICE_ASSIGN_OR_RETURN(index, state_.shard_claims().Find(addr, [this](const std::string& a)
                                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                           return state_.workers().count(a) > 0;
                                         }));
    }
    proto::JournalRecord rec;
    proto::RegisterWorkerUpdate* r = rec.add_updates()->mutable_register_worker();
    r->set_address(addr);
    r->set_transfer_address(transfer_address);
    r->set_transfer_protocol(protocol);
    r->set_index(index);
    r->set_host_id(req.host_id().empty() && known ? wit->second.host_id : req.host_id());
    if (!known) {
      // A worker that joins mid-job gets a task for every running iteration
      // that reads its host.
      for (const auto& [id, it] : state_.iterations()) {
        if (AcceptsTasksLocked(it) && ReadsHostLocked(it, req.host_id()) &&
            NeedsTaskLocked(it, index)) {
          const bool joins = state_.jobs().at(it.job_id).num_consumers > 0 && rounds_.Started(id);
          AddCreateTaskLocked(rec, id, joins, addr);
        }
      }
    }
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    wit = state_.workers().find(addr);
    if (known) {
      spdlog::info("dispatcher: worker {} is back with transfer {} over {}", addr,
                   transfer_address, protocol);
    } else {
      spdlog::info("dispatcher: worker {} on host {} registered as worker {} (transfer {} over {})",
                   addr, wit->second.host_id, wit->second.index, wit->second.transfer_address,
                   wit->second.protocol);
    }
  }
  const Worker& w = wit->second;
  liveness_.workers[addr] = clock_();
  // Tasks whose output was read, and reconciliation: tasks this worker
  // should hold but does not (it restarted) are lost; tasks it holds that
  // we no longer know are deleted.
  proto::JournalRecord finished;
  std::set<int64_t> held(req.current_tasks().begin(), req.current_tasks().end());
  std::set<int64_t> done_tasks(req.finished_tasks().begin(), req.finished_tasks().end());
  std::set<int64_t> lost_in;  // iterations that lost a task of this worker
  for (int64_t id : w.tasks) {
    const Task& t = state_.tasks().at(id);
    if (t.completed || t.lost) continue;
    const bool done = done_tasks.count(id) > 0;
    const bool gone = !done && t.delivered && !held.count(id);
    if (!done && !gone) continue;
    proto::FinishTaskUpdate* f = finished.add_updates()->mutable_finish_task();
    f->set_task_id(id);
    f->set_lost(gone);
    if (gone) {
      spdlog::warn("dispatcher: worker {} no longer holds task {}; marking it lost", addr, id);
      lost_in.insert(t.iteration_id);
    }
  }
  SLUICE_RETURN_IF_ERROR(RecordLocked(finished));
  // The restarted worker gets a task again (its data starts over; under
  // static sharding it reads its shard again).
  proto::JournalRecord again;
  for (int64_t iteration_id : lost_in) {
    const Iteration& it = state_.iterations().at(iteration_id);
    if (AcceptsTasksLocked(it) && ReadsHostLocked(it, w.host_id) && NeedsTaskLocked(it, w.index)) {
      AddCreateTaskLocked(again, iteration_id, state_.jobs().at(it.job_id).num_consumers > 0,
                          addr);
    }
  }
  SLUICE_RETURN_IF_ERROR(RecordLocked(again));
  for (int64_t id : held) {
    if (!w.tasks.count(id)) to_delete_[addr].push_back(id);
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::WorkerUpdate(const proto::WorkerUpdateRequest& req,
                                          proto::WorkerUpdateResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    absl::MutexLock l(&mu_);
    if (!state_.workers().count(req.worker_address())) {
      return absl::NotFoundError(absl::StrCat(
          "WorkerUpdate: worker '", absl::CHexEscape(req.worker_address().substr(0, 256)),
          "' is not registered"));
    }
    for (const auto& u : req.updates()) {
      auto t = state_.tasks().find(u.task_id());
      if (t == state_.tasks().end()) {
        return absl::NotFoundError(absl::StrCat("WorkerUpdate: task ", u.task_id(),
                                                " does not exist (collected, or never created)"));
      }
      if (t->second.worker != req.worker_address()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "WorkerUpdate: task ", u.task_id(), " belongs to worker ", t->second.worker,
            ", not ", req.worker_address()));
      }
    }
    proto::JournalRecord rec;
    std::set<int64_t> failed;  // iterations given an error in this record
    for (const auto& u : req.updates()) {
      const Task& t = state_.tasks().at(u.task_id());
      if (u.has_error() && u.error().code() != 0) {
        auto it = state_.iterations().find(t.iteration_id);
        if (it != state_.iterations().end() && it->second.error.ok() &&
            failed.insert(it->first).second) {
          proto::IterationErrorUpdate* e = rec.add_updates()->mutable_iteration_error();
          e->set_iteration_id(it->first);
          *e->mutable_error() = u.error();
          spdlog::warn("dispatcher: iteration {} failed on worker {}: {}", it->first,
                       req.worker_address(), u.error().message());
        }
      }
      if ((u.completed() || u.has_error()) && !t.completed && !t.lost) {
        rec.add_updates()->mutable_finish_task()->set_task_id(t.id);
      }
    }
    return RecordLocked(rec);
  }());
}

// ---- datasets and jobs --------------------------------------------------------------

absl::Status DispatcherImpl::RegisterDataset(const proto::RegisterDatasetRequest& req,
                                             proto::RegisterDatasetResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    if (req.dataset().version() != 1 || !req.dataset().has_root() ||
        req.dataset().root().op_case() == proto::DatasetNode::OP_NOT_SET) {
      return absl::InvalidArgumentError(
          "RegisterDataset: the dataset definition is empty or of an unsupported version");
    }
    const bool named = !req.dataset_id().empty();
    if (named) SLUICE_RETURN_IF_ERROR(ValidateDatasetId(req.dataset_id()));
    const uint64_t fp = DefFingerprint(req.dataset());
    absl::MutexLock l(&mu_);
    // The caller's id, or "ds-" and the fingerprint: identical definitions
    // share it; a (vanishingly unlikely) collision between different
    // definitions gets a suffixed id.
    for (int suffix = 0;; ++suffix) {
      const std::string id = named ? req.dataset_id()
                                   : absl::StrCat("ds-", absl::Hex(fp, absl::kZeroPad16),
                                                  suffix ? absl::StrCat("-", suffix) : "");
      auto it = state_.datasets().find(id);
      if (it == state_.datasets().end()) {
        proto::JournalRecord rec;
        proto::RegisterDatasetUpdate* r = rec.add_updates()->mutable_register_dataset();
        r->set_dataset_id(id);
        *r->mutable_dataset() = req.dataset();
        r->set_fingerprint(fp);
        SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
        resp->set_dataset_id(id);
        return absl::OkStatus();
      }
      if (CanonicalBytes(it->second.def) == CanonicalBytes(req.dataset())) {
        resp->set_dataset_id(id);
        return absl::OkStatus();
      }
      if (named) {
        return absl::AlreadyExistsError(absl::StrCat(
            "RegisterDataset: dataset id '", id,
            "' is registered with a different definition; choose another id"));
      }
    }
  }());
}

absl::Status DispatcherImpl::GetDatasetDef(const proto::GetDatasetDefRequest& req,
                                           proto::GetDatasetDefResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    absl::MutexLock l(&mu_);
    auto it = state_.datasets().find(req.dataset_id());
    if (it == state_.datasets().end()) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", req.dataset_id(), "' is not registered"));
    }
    *resp->mutable_dataset() = it->second.def;
    return absl::OkStatus();
  }());
}

absl::Status DispatcherImpl::GetOrCreateJob(const proto::GetOrCreateJobRequest& req,
                                            proto::GetOrCreateJobResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    if (!proto::ProcessingMode_IsValid(req.processing_mode()) ||
        req.processing_mode() == proto::PROCESSING_MODE_UNSPECIFIED) {
      return absl::InvalidArgumentError("GetOrCreateJob: processing_mode is unspecified or unknown");
    }
    const std::optional<StaticSharding> sharding = StaticShardingOf(req.processing_mode());
    if (sharding && config_.worker_addresses.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "processing_mode=", ProcessingModeName(req.processing_mode()),
          " (static sharding) needs the dispatcher's worker_addresses: the fixed list of workers, "
          "worker i of N reading shard i (sluice-dispatcher --worker_addresses)"));
    }
    if (req.num_consumers() < 0) {
      return absl::InvalidArgumentError("GetOrCreateJob: num_consumers must be >= 0");
    }
    if (req.num_consumers() > 0 && req.job_name().empty()) {
      return absl::InvalidArgumentError(
          "coordinated reads (num_consumers) need a job_name shared by the consumers");
    }
    if (!proto::TargetWorkers_IsValid(req.target_workers())) {
      return absl::InvalidArgumentError("GetOrCreateJob: target_workers is unknown");
    }
    const bool local = req.target_workers() == proto::TARGET_WORKERS_LOCAL;
    if (local && req.num_consumers() > 0) {
      // As tf.data: each round is read from one worker, whichever host it is on.
      return absl::InvalidArgumentError(
          "coordinated reads (num_consumers) need non-local workers: every consumer reads every "
          "round's worker; target_workers=LOCAL does not combine with them");
    }
    if (local && sharding) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target_workers=LOCAL does not combine with static sharding (processing_mode=",
          ProcessingModeName(req.processing_mode()),
          "): an iteration ends only once every worker's shard was read, and a consumer reading "
          "only its host's workers would never see that; use parallel_epochs or "
          "distributed_epoch"));
    }
    if (req.num_consumers() > 0 && req.processing_mode() == proto::DISTRIBUTED_EPOCH) {
      return absl::InvalidArgumentError(
          "coordinated reads (num_consumers) do not combine with distributed_epoch: use "
          "parallel_epochs or a static sharding mode");
    }
    absl::MutexLock l(&mu_);
    if (!state_.datasets().count(req.dataset_id())) {
      return absl::NotFoundError(absl::StrCat("dataset '", req.dataset_id(), "' is not registered"));
    }
    if (!req.job_name().empty()) {
      auto named = state_.job_by_name().find(req.job_name());
      if (named != state_.job_by_name().end()) {
        const Job& job = state_.jobs().at(named->second);
        if (job.mode != req.processing_mode()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "job '", job.name, "' exists with processing_mode=", ProcessingModeName(job.mode),
              "; requested ", ProcessingModeName(req.processing_mode())));
        }
        if (job.dataset_id != req.dataset_id()) {
          return absl::InvalidArgumentError(absl::StrCat("job '", job.name, "' exists for dataset ",
                                                         job.dataset_id, "; requested ",
                                                         req.dataset_id()));
        }
        if (job.num_consumers != req.num_consumers()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "job '", job.name, "' exists with num_consumers=", job.num_consumers, "; requested ",
              req.num_consumers()));
        }
        if (job.target_workers != req.target_workers()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "job '", job.name, "' exists with target_workers=",
              TargetWorkersName(job.target_workers), "; requested ",
              TargetWorkersName(req.target_workers()), " (a job's consumers all use the same)"));
        }
        resp->set_job_id(job.id);
        return absl::OkStatus();
      }
    }
    const proto::DatasetDef& def = state_.datasets().at(req.dataset_id()).def;
    if (req.num_consumers() > 0) {
      auto ds = Dataset::FromDef(def);
      if (!ds.ok()) return ds.status();
      if (ds->Cardinality() != kInfiniteCardinality) {
        return absl::InvalidArgumentError(absl::StrCat(
            "coordinated reads (num_consumers) need an infinite dataset (end the pipeline before "
            "Distribute with Repeat()); this one has cardinality ",
            ds->Cardinality() == kUnknownCardinality ? std::string("unknown")
                                                     : std::to_string(ds->Cardinality())));
      }
    }
    if (sharding) {
      // Workers apply the same rewrite; checking it here turns a pipeline
      // that cannot be sharded into an error for the client at once.
      auto sharded = ApplyStaticSharding(def, *sharding,
                                         static_cast<int64_t>(config_.worker_addresses.size()), 0);
      if (!sharded.ok() && absl::IsInvalidArgument(sharded.status())) return sharded.status();
      if (!sharded.ok()) {
        spdlog::info("dispatcher: cannot check the sharding of dataset {} here ({}); workers will",
                     req.dataset_id(), std::string(sharded.status().message()));
      }
    } else if (ContainsShardHint(def.root())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the pipeline has Shard(kShardHint, kShardHint), which only processing_mode=hint fills "
          "in; requested processing_mode=", ProcessingModeName(req.processing_mode())));
    }
    proto::JournalRecord rec;
    proto::CreateJobUpdate* job = rec.add_updates()->mutable_create_job();
    if (req.processing_mode() == proto::DISTRIBUTED_EPOCH) {
      auto source = FindSplitSource(def.root());
      if (!source.ok()) return source.status();
      *job->mutable_split_source() = *source->source;
      job->set_split_tracked(source->tracked);
    }
    job->set_job_id(NewIdLocked());
    job->set_dataset_id(req.dataset_id());
    job->set_processing_mode(req.processing_mode());
    job->set_job_name(req.job_name());
    job->set_num_consumers(req.num_consumers());
    job->set_target_workers(req.target_workers());
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    resp->set_job_id(job->job_id());
    return absl::OkStatus();
  }());
}

absl::Status DispatcherImpl::GetOrCreateIteration(const proto::GetOrCreateIterationRequest& req,
                                                  proto::GetOrCreateIterationResponse* resp) {
  return AwaitDurable([&]() -> absl::Status {
    if (req.repetition() < 0) {
      return absl::InvalidArgumentError("GetOrCreateIteration: repetition must be >= 0");
    }
    absl::MutexLock l(&mu_);
    auto jit = state_.jobs().find(req.job_id());
    if (jit == state_.jobs().end()) {
      return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " does not exist"));
    }
    const Job& job = jit->second;
    if (job.num_consumers > 0 &&
        (req.consumer_index() < 0 || req.consumer_index() >= job.num_consumers)) {
      return absl::InvalidArgumentError(absl::StrCat("GetOrCreateIteration: consumer_index ",
                                                     req.consumer_index(), " is not in [0, ",
                                                     job.num_consumers, ") for job '", job.name,
                                                     "'"));
    }
    const bool local = job.target_workers == proto::TARGET_WORKERS_LOCAL;
    if (local) {
      // As tf.data, a consumer reading only local workers needs one.
      std::set<std::string> hosts;
      for (const auto& [addr, w] : state_.workers()) hosts.insert(w.host_id);
      if (req.host_id().empty() || !hosts.count(req.host_id())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "target_workers=LOCAL reads only the workers on this consumer's host '",
            absl::CHexEscape(req.host_id().substr(0, 256)),
            "', but no worker is registered from it (workers' hosts: [",
            absl::StrJoin(hosts, ", "),
            "]); start a worker on this host, or set SLUICE_HOST_ID to name the same host in "
            "both processes"));
      }
    }
    proto::JournalRecord rec;
    int64_t iteration_id;
    bool created = false;
    auto existing = job.iteration_by_repetition.find(req.repetition());
    if (existing != job.iteration_by_repetition.end()) {
      iteration_id = existing->second;
      const Iteration& it = state_.iterations().at(iteration_id);
      if (it.collected && !it.finished) {
        return absl::FailedPreconditionError(absl::StrCat(
            "iteration ", req.repetition(), " of job '", job.name,
            "' was garbage-collected after no client read it for ", config_.job_gc_timeout_ms,
            " ms"));
      }
      if (job.num_consumers > 0 && it.consumer_clients.count(req.consumer_index())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "consumer_index ", req.consumer_index(), " of job '", job.name,
            "' is already reading iteration ", req.repetition(),
            "; every consumer needs its own index"));
      }
      // LOCAL: the first consumer on this host brings tasks on its workers.
      if (local && AcceptsTasksLocked(it) && !ReadsHostLocked(it, req.host_id())) {
        for (const auto& [addr, w] : state_.workers()) {
          if (w.host_id == req.host_id() && NeedsTaskLocked(it, w.index)) {
            AddCreateTaskLocked(rec, iteration_id, false, addr);
          }
        }
      }
    } else {
      proto::CreateIterationUpdate* ci = rec.add_updates()->mutable_create_iteration();
      if (job.mode == proto::DISTRIBUTED_EPOCH) {
        SLUICE_RETURN_IF_ERROR(
            SplitProvider::Describe(job.split_source, config_.range_split_elements, ci));
      }
      iteration_id = NewIdLocked();
      ci->set_iteration_id(iteration_id);
      ci->set_job_id(job.id);
      ci->set_repetition(req.repetition());
      for (const auto& [addr, w] : state_.workers()) {
        if (!local || w.host_id == req.host_id()) AddCreateTaskLocked(rec, iteration_id, false, addr);
      }
      created = true;
    }
    proto::CreateClientUpdate* c = rec.add_updates()->mutable_create_client();
    c->set_client_id(NewIdLocked());
    c->set_iteration_id(iteration_id);
    c->set_consumer_index(job.num_consumers > 0 ? req.consumer_index() : -1);
    c->set_host_id(req.host_id());
    SLUICE_RETURN_IF_ERROR(RecordLocked(rec));
    // Tasks created from now on join a running iteration.
    if (created) rounds_.Start(iteration_id);
    resp->set_iteration_id(iteration_id);
    resp->set_iteration_client_id(c->client_id());
    return absl::OkStatus();
  }());
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
      liveness_.clients[cit->first] = clock_();
      iteration_id = cit->second.iteration_id;
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
    if (known) liveness_.clients[cit->first] = clock_();
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
  auto job = state_.jobs().find(it.job_id);
  const bool local =
      job != state_.jobs().end() && job->second.target_workers == proto::TARGET_WORKERS_LOCAL;
  for (int64_t id : changed ? *changed : std::vector<int64_t>(it.tasks.begin(), it.tasks.end())) {
    auto found = state_.tasks().find(id);
    if (found == state_.tasks().end() || !it.tasks.count(id)) continue;
    const Task& t = found->second;
    if (t.pending) continue;
    if (local && t.host_id != host) continue;  // another consumer host's workers
    proto::TaskInfo* info = resp->add_tasks();
    info->set_task_id(id);
    info->set_starting_round(t.starting_round);
    info->set_worker_address(t.worker);
    auto w = state_.workers().find(t.worker);
    if (w != state_.workers().end()) {
      info->set_transfer_address(w->second.transfer_address);
      info->set_transfer_protocol(w->second.protocol);
    }
    info->set_lost(t.lost);
  }
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
    for (const auto& [addr, w] : state_.workers()) {
      const absl::Duration silent = now - LastHeard(liveness_.workers, addr);
      if (silent <= absl::Milliseconds(config_.worker_timeout_ms)) continue;
      expired.add_updates()->mutable_remove_worker()->set_address(addr);
      int64_t unfinished = 0;
      for (int64_t id : w.tasks) {
        auto t = state_.tasks().find(id);
        unfinished += t != state_.tasks().end() && !t->second.completed && !t->second.lost;
      }
      lost.push_back(absl::StrCat(
          "dispatcher: worker ", addr, " lost: no heartbeat for ",
          absl::ToInt64Milliseconds(silent), " ms (worker_timeout_ms=", config_.worker_timeout_ms,
          "); ", unfinished, " unfinished task(s) lost"));
    }
    for (const auto& [id, c] : state_.clients()) {
      if (now - LastHeard(liveness_.clients, id) > absl::Milliseconds(config_.client_timeout_ms)) {
        spdlog::warn("dispatcher: iteration client {} timed out after {} ms; releasing it", id,
                     config_.client_timeout_ms);
        expired.add_updates()->mutable_remove_client()->set_client_id(id);
      }
    }
    if (!RecordLocked(expired).ok()) return;  // logged; the next tick tries again
    for (const std::string& line : lost) spdlog::warn("{}", line);
    proto::JournalRecord collect;
    for (const auto& [id, it] : state_.iterations()) {
      if (it.collected || !it.clients.empty()) continue;
      const bool anonymous = state_.jobs().at(it.job_id).name.empty();
      if (it.finished || anonymous ||
          now - LastHeard(liveness_.idle_since, id) >
              absl::Milliseconds(config_.job_gc_timeout_ms)) {
        collect.add_updates()->mutable_collect_iteration()->set_iteration_id(id);
      }
    }
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
    auto t = state_.tasks().find(req.task_id());
    if (t == state_.tasks().end()) {
      return absl::NotFoundError(
          absl::StrCat("GetSplit: task ", req.task_id(), " does not exist (collected)"));
    }
    const Task& task = t->second;
    if (task.worker != req.worker_address()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GetSplit: task ", task.id, " belongs to worker ", task.worker, ", not ",
          req.worker_address()));
    }
    const Iteration& it = state_.iterations().at(task.iteration_id);
    if (it.splits == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GetSplit: iteration ", it.id, " is not distributed_epoch (or was collected)"));
    }
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
      auto it = state_.datasets().find(req.dataset_id());
      if (it == state_.datasets().end()) {
        return absl::NotFoundError(
            absl::StrCat("dataset '", req.dataset_id(), "' is not registered"));
      }
      def = it->second.def;
      resp->set_fingerprint(it->second.fingerprint);
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
  const DispatcherState::Counts& counts = state_.counts();
  s.jobs = counts.jobs;
  s.iterations = counts.iterations;
  s.lost_workers = counts.lost_workers;
  s.collected_iterations = counts.collected_iterations;
  s.splits_created = counts.splits_created;
  s.splits_completed = counts.splits_completed;
  s.splits_reassigned = counts.splits_reassigned;
  s.workers = static_cast<int64_t>(state_.workers().size());
  s.iteration_clients = static_cast<int64_t>(state_.clients().size());
  s.live_tasks = static_cast<int64_t>(state_.tasks().size());
  s.datasets = static_cast<int64_t>(state_.datasets().size());
  s.current_jobs = static_cast<int64_t>(state_.jobs().size());
  for (const auto& [id, it] : state_.iterations()) s.active_iterations += !it.finished && !it.collected;
  const absl::Time now = clock_();
  for (const auto& [addr, w] : state_.workers()) {
    s.max_worker_heartbeat_age_ms = std::max(
        s.max_worker_heartbeat_age_ms,
        absl::ToInt64Milliseconds(now - LastHeard(liveness_.workers, addr)));
  }
  for (const auto& [id, c] : state_.clients()) {
    s.max_client_heartbeat_age_ms = std::max(
        s.max_client_heartbeat_age_ms,
        absl::ToInt64Milliseconds(now - LastHeard(liveness_.clients, id)));
  }
  return s;
}

}  // namespace sluice::internal
