// WorkerCore: the transport-agnostic part of a worker's data path. It holds
// the worker's tasks and answers element requests from them; every
// ElementServer of the worker (dataplane/element_server.h: gRPC, UCX, ...)
// calls the same Serve. WorkerServer adds and removes tasks as its
// heartbeats tell it.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataplane/element_server.h"
#include "sluice/worker/task_runner.h"

namespace sluice::internal {

class WorkerCore {
 public:
  // `on_finished` runs once per task (on a serving thread) when the task
  // completed or failed, to tell the dispatcher at once; it may block
  // briefly (an RPC) and must not call back into the core's task table.
  explicit WorkerCore(std::function<void(const TaskRunner&)> on_finished);

  // Requests wait at most this long on the worker, whatever they ask.
  static constexpr absl::Duration kMaxWait = absl::Seconds(10);

  // Answers one element request (the ElementSource of every server). A
  // task the worker does not hold yet is waited for until the request's
  // wait runs out: a client learns of a task (from the dispatcher) as soon
  // as this worker does, sometimes sooner, and answering "not ready" at once
  // would hold it back while others, whose requests came a moment later,
  // read the task's first elements.
  absl::StatusOr<ServedBatch> Serve(const ElementRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  ElementSource source() {
    return [this](const ElementRequest& r) { return Serve(r); };
  }

  bool HasTask(int64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  void AddTask(std::shared_ptr<TaskRunner> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the task and returns it (destroy it outside any lock: that joins
  // its producer); null when the worker does not hold it.
  std::shared_ptr<TaskRunner> RemoveTask(int64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<TaskRunner>> Tasks() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t num_tasks() const ABSL_LOCKS_EXCLUDED(mu_);

  // Stops every task and ends every wait; later requests are answered
  // Cancelled. Returns the tasks, to be destroyed by the caller.
  std::map<int64_t, std::shared_ptr<TaskRunner>> Stop() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t elements_served() const { return elements_served_.load(); }
  int64_t bytes_served() const { return bytes_served_.load(); }
  // TaskRunner::Counters::unacknowledged_elements of every task the worker
  // held, removed ones included.
  int64_t elements_unacknowledged() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::shared_ptr<TaskRunner> AwaitTask(int64_t id, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void ReportFinished(const TaskRunner& task) ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<void(const TaskRunner&)> on_finished_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<TaskRunner>> tasks_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> reported_ ABSL_GUARDED_BY(mu_);  // on_finished_ ran
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int64_t removed_unacknowledged_ ABSL_GUARDED_BY(mu_) = 0;  // of tasks no longer held
  std::atomic<int64_t> elements_served_{0}, bytes_served_{0};
};

}  // namespace sluice::internal
