// How a worker sizes the process-wide pool of parallel pipeline work
// (Map/Interleave/Batch num_parallel_calls; dataset/thread_pool.h).
//
// Workers that share a host divide its cpus: each asks the dispatcher how
// many workers are registered with its host id (WorkerHeartbeatResponse::
// workers_on_host) and resizes its pool as that changes. Workers in one
// process share one pool, so they count once.
#pragma once

#include <cstdint>
#include <string>

namespace sluice::internal {

// What a worker's pool may use.
struct PoolCpus {
  int cpus = 1;  // its placement's cpus, else the process's (affinity, cgroup quota)
  // The operator chose the cpus (--cpu_list): workers given disjoint lists
  // do not share them, so they are not divided.
  bool explicit_cpus = false;
  std::string from;  // where `cpus` came from, for the log line
};

struct PoolSize {
  int threads = 1;
  std::string why;  // the log line's reason
};

// --worker_threads when set (> 0); else `cpus` divided among the pools on
// the host: `workers_on_host` registered there (0: not known yet, nothing
// divided) less the `in_process` ones sharing this process's pool, plus
// this pool. At least one thread.
PoolSize SizeWorkerPool(int64_t worker_threads, const PoolCpus& cpus, int64_t workers_on_host,
                        int64_t in_process, const std::string& host_id);

// The workers of this process per host id (their pool is one).
void AddInProcessWorker(const std::string& host_id);
void RemoveInProcessWorker(const std::string& host_id);
int64_t InProcessWorkers(const std::string& host_id);

}  // namespace sluice::internal
