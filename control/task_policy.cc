#include "sluice/control/task_policy.h"

#include <algorithm>
#include <vector>

#include "spdlog/spdlog.h"
#include "sluice/rpc/protocol.h"

namespace sluice::internal {

bool TaskPolicy::AcceptsTasks(const Iteration& it) const {
  if (it.collected) return false;
  if (!it.finished) return true;
  for (int64_t id : it.clients) {
    auto c = state_.clients().find(id);
    if (c != state_.clients().end() && !c->second.at_end) return true;
  }
  return false;
}

bool TaskPolicy::ReadsHost(const Iteration& it, const std::string& host) const {
  if (state_.jobs().at(it.job_id).target_workers != proto::TARGET_WORKERS_LOCAL) return true;
  for (int64_t id : it.clients) {
    auto c = state_.clients().find(id);
    if (c != state_.clients().end() && c->second.host_id == host) return true;
  }
  return false;
}

bool TaskPolicy::NeedsTask(const Iteration& it, int64_t worker_index) const {
  if (!StaticShardingOf(state_.jobs().at(it.job_id).mode)) return true;
  for (int64_t id : it.tasks) {
    const DispatcherState::Task& t = state_.tasks().at(id);
    if (t.shard == worker_index && !t.lost) return false;
  }
  return true;
}

void TaskPolicy::Add(int64_t iteration, bool pending, const std::string& address,
                     proto::JournalRecord* rec) const {
  proto::CreateTaskUpdate* u = rec->add_updates()->mutable_create_task();
  u->set_task_id(new_id_());
  u->set_iteration_id(iteration);
  u->set_worker_address(address);
  u->set_pending(pending);
}

void TaskPolicy::ForNewIteration(int64_t iteration, bool local, const std::string& host,
                                 proto::JournalRecord* rec) const {
  for (const auto& [addr, w] : state_.workers()) {
    if (!local || w.host_id == host) Add(iteration, false, addr, rec);
  }
}

void TaskPolicy::ForNewHost(const Iteration& it, const std::string& host,
                            proto::JournalRecord* rec) const {
  if (!AcceptsTasks(it) || ReadsHost(it, host)) return;
  for (const auto& [addr, w] : state_.workers()) {
    if (w.host_id == host && NeedsTask(it, w.index)) Add(it.id, false, addr, rec);
  }
}

void TaskPolicy::ForNewWorker(const std::string& address, const std::string& host, int64_t index,
                              const std::function<bool(int64_t)>& started,
                              proto::JournalRecord* rec) const {
  for (const auto& [id, it] : state_.iterations()) {
    if (AcceptsTasks(it) && ReadsHost(it, host) && NeedsTask(it, index)) {
      Add(id, state_.jobs().at(it.job_id).num_consumers > 0 && started(id), address, rec);
    }
  }
}

namespace {

// A heartbeat's task ids, sorted (a worker holds a few hundred at most: a
// sorted vector walks beside the worker's std::set without a node per id).
std::vector<int64_t> SortedIds(const google::protobuf::RepeatedField<int64_t>& ids) {
  std::vector<int64_t> v(ids.begin(), ids.end());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

std::set<int64_t> TaskPolicy::Reconcile(const Worker& w, const proto::WorkerHeartbeatRequest& req,
                                        proto::JournalRecord* rec) const {
  const std::vector<int64_t> held = SortedIds(req.current_tasks());
  const std::vector<int64_t> done_tasks = SortedIds(req.finished_tasks());
  std::set<int64_t> lost_in;
  auto h = held.begin();  // walks beside w.tasks (both ascending)
  for (int64_t id : w.tasks) {
    while (h != held.end() && *h < id) ++h;
    const bool is_held = h != held.end() && *h == id;
    const bool done = std::binary_search(done_tasks.begin(), done_tasks.end(), id);
    // Held and not finished: nothing to do, and no lookup (the common case
    // of every heartbeat).
    if (is_held && !done) continue;
    const DispatcherState::Task& t = state_.tasks().at(id);
    if (t.completed || t.lost) continue;
    const bool gone = !done && t.delivered && !is_held;
    if (!done && !gone) continue;
    proto::FinishTaskUpdate* f = rec->add_updates()->mutable_finish_task();
    f->set_task_id(id);
    f->set_lost(gone);
    if (gone) {
      spdlog::warn("dispatcher: worker {} no longer holds task {}; marking it lost", w.address, id);
      lost_in.insert(t.iteration_id);
    }
  }
  return lost_in;
}

void TaskPolicy::Again(const Worker& w, const std::set<int64_t>& lost_in,
                       proto::JournalRecord* rec) const {
  for (int64_t id : lost_in) {
    const Iteration& it = state_.iterations().at(id);
    if (AcceptsTasks(it) && ReadsHost(it, w.host_id) && NeedsTask(it, w.index)) {
      Add(id, state_.jobs().at(it.job_id).num_consumers > 0, w.address, rec);
    }
  }
}

std::vector<int64_t> TaskPolicy::Unknown(const Worker& w,
                                         const proto::WorkerHeartbeatRequest& req) {
  const std::vector<int64_t> held = SortedIds(req.current_tasks());
  std::vector<int64_t> unknown;
  auto mine = w.tasks.begin();  // walks beside `held` (both ascending)
  for (auto id = held.begin(); id != held.end(); ++id) {
    if (id != held.begin() && *id == *(id - 1)) continue;  // listed twice
    while (mine != w.tasks.end() && *mine < *id) ++mine;
    if (mine == w.tasks.end() || *mine != *id) unknown.push_back(*id);
  }
  return unknown;
}

void TaskPolicy::ListTasks(const Iteration& it, const std::vector<int64_t>* ids,
                           const std::string& host, proto::ClientHeartbeatResponse* resp) const {
  auto job = state_.jobs().find(it.job_id);
  const bool local =
      job != state_.jobs().end() && job->second.target_workers == proto::TARGET_WORKERS_LOCAL;
  auto list = [&](int64_t id) {
    auto found = state_.tasks().find(id);
    if (found == state_.tasks().end()) return;
    const DispatcherState::Task& t = found->second;
    if (t.pending) return;
    if (local && t.host_id != host) return;  // another consumer host's workers
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
  };
  if (ids == nullptr) {
    for (int64_t id : it.tasks) list(id);
    return;
  }
  for (int64_t id : *ids) {
    if (it.tasks.count(id)) list(id);
  }
}

void TaskPolicy::Report(const proto::WorkerUpdateRequest& req, proto::JournalRecord* rec) const {
  std::set<int64_t> failed;  // iterations given an error in this record
  for (const auto& u : req.updates()) {
    const DispatcherState::Task& t = state_.tasks().at(u.task_id());
    if (u.has_error() && u.error().code() != 0) {
      auto it = state_.iterations().find(t.iteration_id);
      if (it != state_.iterations().end() && it->second.error.ok() &&
          failed.insert(it->first).second) {
        proto::IterationErrorUpdate* e = rec->add_updates()->mutable_iteration_error();
        e->set_iteration_id(it->first);
        *e->mutable_error() = u.error();
        spdlog::warn("dispatcher: iteration {} failed on worker {}: {}", it->first,
                     req.worker_address(), u.error().message());
      }
    }
    if ((u.completed() || u.has_error()) && !t.completed && !t.lost) {
      rec->add_updates()->mutable_finish_task()->set_task_id(t.id);
    }
  }
}

}  // namespace sluice::internal
