#include "sluice/worker/worker_core.h"

#include <algorithm>

#include "sluice/core/status.h"

namespace sluice::internal {

WorkerCore::WorkerCore(std::function<void(const TaskRunner&)> on_finished)
    : on_finished_(std::move(on_finished)) {}

std::shared_ptr<TaskRunner> WorkerCore::AwaitTask(int64_t id, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto known = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || tasks_.count(id) > 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&known), deadline);
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second;
}

void WorkerCore::ReportFinished(const TaskRunner& task) {
  {
    absl::MutexLock l(&mu_);
    if (!reported_.insert(task.def().task_id()).second) return;
  }
  if (on_finished_) on_finished_(task);
}

absl::StatusOr<ServedBatch> WorkerCore::Serve(const ElementRequest& req) {
  const absl::Time deadline = absl::Now() + std::clamp(req.wait, absl::ZeroDuration(), kMaxWait);
  std::shared_ptr<TaskRunner> task = AwaitTask(req.task_id, deadline);
  if (task == nullptr) {
    {
      absl::MutexLock l(&mu_);
      if (stopped_) return absl::CancelledError("the worker is stopping");
    }
    ServedBatch out;  // not (yet) delivered: the client asks again
    out.not_ready = true;
    return out;
  }
  const absl::Duration wait = std::max(absl::ZeroDuration(), deadline - absl::Now());
  task->Ack(req.acks);
  auto batch = task->def().num_consumers() > 0
                   ? task->GetRound(wait, req.consumer_index, req.round, req.delivered_seq)
                   : task->GetBatch(req, wait);
  if (!batch.ok()) {
    // The task's own error ends it; a refused request (a round asked
    // twice, elements no longer kept for redelivery) does not.
    if (task->finished()) ReportFinished(*task);
    return batch.status();
  }
  // Other consumers may not hold their part yet: then a heartbeat
  // reports it, once finished.
  if (batch->end_of_sequence && task->finished()) ReportFinished(*task);
  // Compressed copies for this reply; the task keeps the frames as they
  // were for redelivery.
  for (FrameBuffer& f : batch->frames) {
    SLUICE_RETURN_IF_ERROR(CompressServedFrame(req.compression, &f));
  }
  elements_served_ += static_cast<int64_t>(batch->frames.size());
  for (const auto& f : batch->frames) bytes_served_ += static_cast<int64_t>(f.frame_size());
  return batch;
}

bool WorkerCore::HasTask(int64_t id) const {
  absl::MutexLock l(&mu_);
  return tasks_.count(id) > 0;
}

void WorkerCore::AddTask(std::shared_ptr<TaskRunner> task) {
  absl::MutexLock l(&mu_);
  const int64_t id = task->def().task_id();
  if (stopped_) {
    task->Stop();
    return;
  }
  tasks_.emplace(id, std::move(task));
}

std::shared_ptr<TaskRunner> WorkerCore::RemoveTask(int64_t id) {
  absl::MutexLock l(&mu_);
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return nullptr;
  std::shared_ptr<TaskRunner> task = std::move(it->second);
  tasks_.erase(it);
  reported_.erase(id);
  task->Stop();
  removed_unacknowledged_ += task->counters().unacknowledged_elements;
  return task;
}

int64_t WorkerCore::elements_unacknowledged() const {
  absl::MutexLock l(&mu_);
  int64_t n = removed_unacknowledged_;
  for (const auto& [id, t] : tasks_) n += t->counters().unacknowledged_elements;
  return n;
}

std::vector<std::shared_ptr<TaskRunner>> WorkerCore::Tasks() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<TaskRunner>> out;
  for (const auto& [id, t] : tasks_) out.push_back(t);
  return out;
}

int64_t WorkerCore::num_tasks() const {
  absl::MutexLock l(&mu_);
  return static_cast<int64_t>(tasks_.size());
}

std::map<int64_t, std::shared_ptr<TaskRunner>> WorkerCore::Stop() {
  absl::MutexLock l(&mu_);
  stopped_ = true;
  for (auto& [id, t] : tasks_) {
    t->Stop();  // wakes the requests waiting in them
    removed_unacknowledged_ += t->counters().unacknowledged_elements;
  }
  std::map<int64_t, std::shared_ptr<TaskRunner>> out;
  out.swap(tasks_);
  return out;
}

}  // namespace sluice::internal
