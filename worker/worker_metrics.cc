#include "sluice/worker/worker_metrics.h"

#include "absl/strings/str_cat.h"
#include "sluice/core/metrics.h"

namespace sluice::internal {

std::string RenderWorkerMetrics(const WorkerMetricsSnapshot& s) {
  MetricsWriter w;
  w.Family("sluice_worker_info", MetricType::kGauge,
           "Always 1; the labels name the worker and its data transfer protocol.");
  w.Sample(1, {{"address", s.address}, {"transfer_protocol", s.transfer_protocol}});
  w.Gauge("sluice_worker_tasks", "Tasks held.", static_cast<double>(s.tasks.size()));
  w.Counter("sluice_worker_tasks_received_total", "Tasks received from the dispatcher.",
            s.tasks_received);
  w.Counter("sluice_worker_elements_total", "Elements served to clients (every task).",
            s.elements_served);
  w.Counter("sluice_worker_bytes_total", "Element frame bytes served to clients (every task).",
            s.bytes_served);
  w.Counter("sluice_worker_elements_unacknowledged_total",
            "distributed_epoch elements handed to a client that never acknowledged them, "
            "counted delivered after the ack timeout (10 s; the client died or left without "
            "saying goodbye). They may be lost.",
            s.elements_unacknowledged);
  w.Family("sluice_worker_serve_errors_total", MetricType::kCounter,
           "Element requests answered with an error, by data path (a stopped task excluded).");
  for (const auto& e : s.serve_errors) w.Sample(e.errors, {{"transport", e.transport}});
  w.Counter("sluice_worker_ucx_send_errors_total",
            "UCX replies that failed to send (the client went away, or the transport failed).",
            s.transport.worker_ucx_send_errors);
  w.Counter("sluice_worker_grpc_bytes_copied_total",
            "Frame bytes copied into gRPC GetElement replies (the gRPC path always copies).",
            s.grpc_bytes_copied);
  w.Counter("sluice_worker_frames_registered_total",
            "Frames encoded straight into UCX-registered memory (no packing copy to send).",
            s.transport.worker_frames_in_registered_memory);
  w.Counter("sluice_worker_zero_copy_payloads_total",
            "Elements whose payload was sent over UCX from the tensor's own memory.",
            s.transport.worker_zero_copy_payloads);
  w.Counter("sluice_worker_batched_replies_total",
            "UCX replies that carried more than one element.", s.transport.worker_batched_replies);
  w.Gauge("sluice_worker_dispatcher_heartbeat_age_seconds",
          "Time since the last successful heartbeat to the dispatcher (a heartbeat long-polls "
          "for up to heartbeat_interval_ms).",
          s.heartbeat_age_seconds);
  w.Counter("sluice_worker_heartbeat_failures_total", "Heartbeats to the dispatcher that failed.",
            s.heartbeat_failures);

  int64_t buffered = 0, buffered_bytes = 0;
  for (const auto& t : s.tasks) {
    buffered += t.counters.buffered_elements;
    buffered_bytes += t.counters.buffered_bytes;
  }
  w.Gauge("sluice_worker_buffered_elements", "Elements buffered ahead of clients (every task).",
          buffered);
  w.Gauge("sluice_worker_buffered_bytes", "Frame bytes buffered ahead of clients (every task).",
          buffered_bytes);
  auto per_task = [&](absl::string_view name, MetricType type, absl::string_view help,
                      int64_t TaskRunner::Counters::*field) {
    w.Family(name, type, help);
    for (const auto& t : s.tasks) {
      w.Sample(static_cast<double>(t.counters.*field),
               {{"task", absl::StrCat(t.task_id)}, {"iteration", absl::StrCat(t.iteration_id)}});
    }
  };
  per_task("sluice_worker_task_buffered_elements", MetricType::kGauge,
           "Elements in the task's buffer (its queue depth).",
           &TaskRunner::Counters::buffered_elements);
  per_task("sluice_worker_task_buffered_bytes", MetricType::kGauge,
           "Frame bytes in the task's buffer.", &TaskRunner::Counters::buffered_bytes);
  per_task("sluice_worker_task_produced_elements_total", MetricType::kCounter,
           "Elements the task's pipeline produced into its buffer.",
           &TaskRunner::Counters::produced_elements);
  per_task("sluice_worker_task_elements_total", MetricType::kCounter,
           "Elements the task handed to clients.", &TaskRunner::Counters::served_elements);
  per_task("sluice_worker_task_bytes_total", MetricType::kCounter,
           "Frame bytes the task handed to clients.", &TaskRunner::Counters::served_bytes);
  return w.text();
}

}  // namespace sluice::internal
