#include "sluice/worker/pool_sizing.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace sluice::internal {
namespace {

struct InProcess {
  absl::Mutex mu;
  std::map<std::string, int64_t> by_host ABSL_GUARDED_BY(mu);
};
InProcess& Registry() {
  static InProcess* r = new InProcess;  // never destroyed: workers may outlive statics
  return *r;
}

}  // namespace

PoolSize SizeWorkerPool(int64_t worker_threads, const PoolCpus& cpus, int64_t workers_on_host,
                        int64_t in_process, const std::string& host_id) {
  if (worker_threads > 0) {
    return {static_cast<int>(worker_threads), "as --worker_threads says"};
  }
  const int64_t pools = std::max<int64_t>(1, workers_on_host - std::max<int64_t>(1, in_process) + 1);
  if (cpus.explicit_cpus || workers_on_host <= 0 || pools == 1) {
    return {std::max(1, cpus.cpus), absl::StrCat("one per cpu of ", cpus.from)};
  }
  const int threads = std::max(1, static_cast<int>(cpus.cpus / pools));
  return {threads, absl::StrCat(cpus.cpus, " cpu(s) of ", cpus.from, " shared by ", pools,
                                " worker processes on host ", host_id)};
}

void AddInProcessWorker(const std::string& host_id) {
  absl::MutexLock l(&Registry().mu);
  ++Registry().by_host[host_id];
}

void RemoveInProcessWorker(const std::string& host_id) {
  absl::MutexLock l(&Registry().mu);
  auto it = Registry().by_host.find(host_id);
  if (it != Registry().by_host.end() && --it->second <= 0) Registry().by_host.erase(it);
}

int64_t InProcessWorkers(const std::string& host_id) {
  absl::MutexLock l(&Registry().mu);
  auto it = Registry().by_host.find(host_id);
  return it == Registry().by_host.end() ? 0 : it->second;
}

}  // namespace sluice::internal
