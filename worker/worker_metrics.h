// The worker's Prometheus metrics (GET /metrics on --metrics_port).
// Internal; the names are listed in docs/observability.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/dataplane/element_transport.h"
#include "sluice/worker/task_runner.h"

namespace sluice::internal {

// What one scrape reports; WorkerServer fills it.
struct WorkerMetricsSnapshot {
  std::string address, transfer_protocol;
  int64_t elements_served = 0, bytes_served = 0;  // every task, since start
  int64_t elements_unacknowledged = 0;             // every task, since start
  struct ServeErrors {
    std::string transport;  // the element server's protocol
    int64_t errors = 0;
  };
  std::vector<ServeErrors> serve_errors;  // one per element server
  int64_t grpc_bytes_copied = 0;  // frames copied into GetElement replies
  int64_t tasks_received = 0;
  double heartbeat_age_seconds = 0;  // since the last successful heartbeat
  int64_t heartbeat_failures = 0;
  struct Task {
    int64_t task_id = 0, iteration_id = 0;
    TaskRunner::Counters counters;
  };
  std::vector<Task> tasks;  // held now
  TransportStats transport;  // process-wide data-plane counters
};

std::string RenderWorkerMetrics(const WorkerMetricsSnapshot& s);

}  // namespace sluice::internal
