// A sluice service for one measurement: a dispatcher and worker processes
// (the sluice-worker binary) on 127.0.0.1, ports chosen at run time. The
// dispatcher lives in sluice-perf unless asked otherwise, because it does
// almost nothing during most measurements and uses no UCX; workers are
// processes so that the measuring client's CPU time is its own. Suites that
// measure the dispatcher (dispatcher, files) run it as a sluice-dispatcher
// process: its CPU, disk writes and metrics are then its own.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "perf/child_process.h"
#include "sluice/control/dispatch_server.h"

namespace sluice::perf {

// A sluice-dispatcher process: fault-tolerant (journal under work_dir),
// serving its Prometheus metrics.
struct DispatcherProcess {
  std::unique_ptr<ChildProcess> child;
  int port = 0;
  int metrics_port = 0;
  std::string work_dir;
  std::string address() const;  // "127.0.0.1:PORT"
};
// Starts `binary` with `extra_args` added to the flags above and `extra_env`
// to its environment; its log and journal are under `scratch_dir`, named
// after `name`.
absl::StatusOr<DispatcherProcess> StartDispatcherProcess(
    const std::string& binary, const std::string& scratch_dir, const std::string& name,
    const std::vector<std::string>& extra_args = {},
    const std::vector<std::pair<std::string, std::string>>& extra_env = {});
// GET http://127.0.0.1:port/metrics, parsed as "name value" lines (empty
// when it cannot be read).
std::map<std::string, double> ReadMetrics(int port);
double Metric(const std::map<std::string, double>& m, const std::string& name, double fallback);

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
  // Non-empty: the dispatcher is this sluice-dispatcher binary in its own
  // process (StartDispatcherProcess), with these flags added.
  std::string dispatcher_binary;
  std::vector<std::string> dispatcher_args;
};

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  // Kills the workers, then stops the dispatcher.
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // DistributeOptions::service.
  std::string target() const;
  // The dispatcher's process; null when it runs in this process.
  const DispatcherProcess* dispatcher_process() const {
    return dispatcher_process_.has_value() ? &*dispatcher_process_ : nullptr;
  }
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
  std::unique_ptr<DispatchServer> dispatcher_;  // or:
  std::optional<DispatcherProcess> dispatcher_process_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

}  // namespace sluice::perf
