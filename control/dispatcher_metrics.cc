#include "sluice/control/dispatcher_metrics.h"

#include "sluice/core/metrics.h"

namespace sluice::internal {

std::string RenderDispatcherMetrics(const DispatcherImpl::Stats& s) {
  MetricsWriter w;
  w.Gauge("sluice_dispatcher_workers", "Workers registered and not lost.", s.workers);
  w.Gauge("sluice_dispatcher_datasets", "Datasets registered (deduplicated by fingerprint).",
          s.datasets);
  w.Gauge("sluice_dispatcher_jobs", "Jobs held (anonymous jobs are dropped once collected).",
          s.current_jobs);
  w.Gauge("sluice_dispatcher_iterations", "Iterations neither finished nor collected.",
          s.active_iterations);
  w.Gauge("sluice_dispatcher_tasks", "Tasks held (not yet collected).", s.live_tasks);
  w.Gauge("sluice_dispatcher_clients", "Iteration clients (consumers reading an iteration).",
          s.iteration_clients);
  w.Counter("sluice_dispatcher_jobs_created_total", "Jobs created.", s.jobs);
  w.Counter("sluice_dispatcher_iterations_created_total", "Iterations created.", s.iterations);
  w.Counter("sluice_dispatcher_iterations_collected_total",
            "Iterations garbage-collected (finished, released or idle too long).",
            s.collected_iterations);
  w.Counter("sluice_dispatcher_lost_workers_total",
            "Workers dropped after worker_timeout_ms without a heartbeat.", s.lost_workers);
  w.Counter("sluice_dispatcher_splits_created_total", "distributed_epoch splits created.",
            s.splits_created);
  w.Counter("sluice_dispatcher_splits_completed_total",
            "distributed_epoch splits their holder reported completed.", s.splits_completed);
  w.Counter("sluice_dispatcher_splits_reassigned_total",
            "distributed_epoch splits handed to another task after their holder was lost.",
            s.splits_reassigned);
  w.Counter("sluice_dispatcher_journal_records_total",
            "State changes appended to the journal (fault_tolerant_mode) since start.",
            s.journal_records);
  w.Counter("sluice_dispatcher_journal_syncs_total",
            "fdatasync calls on the journal: one per group of changes written together.",
            s.journal_syncs);
  w.Counter("sluice_dispatcher_journal_replayed_records_total",
            "Journal records replayed at start.", s.replayed_records);
  w.Counter("sluice_dispatcher_journal_compactions_total",
            "Times the journal was rewritten as a snapshot.", s.journal_compactions);
  w.Gauge("sluice_dispatcher_worker_heartbeat_age_max_seconds",
          "Longest time since a worker's last heartbeat (workers inside a long poll count 0).",
          s.max_worker_heartbeat_age_ms / 1000.0);
  w.Gauge("sluice_dispatcher_client_heartbeat_age_max_seconds",
          "Longest time since an iteration client's last heartbeat.",
          s.max_client_heartbeat_age_ms / 1000.0);
  return w.text();
}

}  // namespace sluice::internal
