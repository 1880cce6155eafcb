// A sluice service for one measurement: an in-process dispatcher and
// worker processes (the sluice-worker binary) on 127.0.0.1, ports chosen
// at run time. The dispatcher lives in sluice-perf because it does almost
// nothing during a measurement and uses no UCX; workers are processes so
// that the measuring client's CPU time is its own.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "perf/child_process.h"
#include "sluice/control/dispatch_server.h"

namespace sluice::perf {

struct ClusterOptions {
  int num_workers = 1;
  std::string worker_binary;
  std::string plugin;
  std::string protocol = "ucx";  // the workers' --data_transfer_protocol
  int64_t task_buffer_elements = 16;
  int64_t worker_threads = 0;  // --worker_threads when > 0
  // Added to the workers' environment (UCX_TLS, log level).
  std::vector<std::pair<std::string, std::string>> env;
  std::string scratch_dir;  // worker logs and port files
  std::string name;         // prefixes the log file names
};

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  // Kills the workers, then stops the dispatcher.
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // DistributeOptions::service.
  std::string target() const { return dispatcher_->target(); }
  // Fails if a worker has exited (it should serve until killed).
  absl::Status CheckWorkersAlive();
  // The worker processes' ids (-1 for one already reaped), to read their
  // CPU time and peak RSS from /proc.
  std::vector<int> worker_pids() const {
    std::vector<int> pids;
    for (const auto& w : workers_) pids.push_back(w->pid());
    return pids;
  }

 private:
  Cluster() = default;
  std::unique_ptr<DispatchServer> dispatcher_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

}  // namespace sluice::perf
