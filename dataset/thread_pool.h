// The process-wide pool that runs a pipeline's parallel work: the calls of
// Map(fn, num_parallel_calls), Interleave's per-slot reads and Batch's
// copies (docs/datasets.md, "Parallelism").
//
// One bounded set of threads serves every iterator of the process, so N
// parallel ops never start N x cores threads. By default it has one thread
// per cpu this process may run on (sched_getaffinity at first use); a
// worker sizes it to the cpus it is pinned to, or to --worker_threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace sluice {

// Sets the pool's thread count (>= 1) and, optionally, a function every
// pool thread runs before its next work, the threads already running
// included (a worker pins the pool's threads with it; empty keeps the
// current one). Threads are added at once; surplus ones leave when they
// finish their current work. Safe to call at any time.
void ConfigureThreadPool(int threads, std::function<void()> thread_init = {});
// The pool's thread count (starting it when it was not yet).
int ThreadPoolSize();
// The cpus this process may use: its affinity mask, lowered to a cgroup
// cpu quota (rounded up) when one is set; at least 1.
int AvailableCpus();
// The cpus a cgroup cpu quota allows this process, as a fraction (1.5:
// 150 ms of cpu time per 100 ms), the tightest of its cgroup and every
// parent (cgroup v2 cpu.max; v1 cpu.cfs_quota_us / cpu.cfs_period_us, as a
// container sees them); nullopt when none is set. `root` is prefixed to
// the paths read (/proc/self/cgroup, /sys/fs/cgroup/...), for tests.
std::optional<double> CgroupCpuQuota(const std::string& root = "");

}  // namespace sluice

namespace sluice::internal {

// One unit of parallel work, queued on the pool. A thread that needs its
// result calls Wait(), which runs the work itself when no pool thread has
// taken it yet, so a pipeline never waits on a queue behind other work and
// nested parallel ops cannot deadlock the pool.
class PoolTask {
 public:
  explicit PoolTask(std::function<void()> fn);
  PoolTask(const PoolTask&) = delete;
  PoolTask& operator=(const PoolTask&) = delete;
  // Runs the work on this thread unless another took it; true if it ran here.
  bool TryRun();
  // Returns once the work ran (on this thread if nobody had taken it).
  void Wait();
  bool done() const;

 private:
  struct State;
  std::shared_ptr<State> st_;
};

// Queues `task` on the process-wide pool.
void Schedule(std::shared_ptr<PoolTask> task);

// num_parallel_calls as an op asks for it: kAutotune (or any value below 1)
// becomes the pool's size, and nothing exceeds kMaxParallelCalls.
inline constexpr int64_t kMaxParallelCalls = 1024;
int64_t ResolveParallelism(int64_t num_parallel_calls);

}  // namespace sluice::internal
