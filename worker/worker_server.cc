// WorkerServer: the WorkerService gRPC endpoint, the heartbeat loop and the
// task runners.
//
// Threads: gRPC's handler threads serve GetElement; one heartbeat thread
// (started by Start, joined by Stop) talks to the dispatcher; each task has
// a producer thread owned by its TaskRunner.
#include "sluice/worker/worker_server.h"

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "control/service.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"
#include "sluice/control/dispatcher_impl.h"
#include "sluice/control/grpc_util.h"
#include "sluice/core/metrics.h"
#include "sluice/control/security_internal.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataset/thread_pool.h"
#include "sluice/dataset/udf.h"
#include "sluice/dataplane/ucx_server.h"
#include "sluice/topology/topology.h"
#include "sluice/worker/task_runner.h"
#include "sluice/worker/worker_metrics.h"
#include "spdlog/spdlog.h"

namespace sluice {

using internal::TaskRunner;

struct WorkerServer::Impl final : public proto::WorkerService::Service {
  WorkerConfig config;
  std::string address;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<internal::UcxElementServer> ucx;  // null on the grpc data path
  std::string transfer_address, transfer_protocol;
  DataPlanePlacement placement;       // UCX send pool + progress thread
  std::function<void()> bind_thread;  // pins task producer threads
  std::unique_ptr<proto::DispatcherService::Stub> dispatcher;
  std::thread heartbeat;
  absl::Notification stopping;
  bool stopped = false;

  absl::Mutex mu;
  std::map<int64_t, std::shared_ptr<TaskRunner>> tasks ABSL_GUARDED_BY(mu);
  std::set<int64_t> reported ABSL_GUARDED_BY(mu);  // completion sent to the dispatcher
  grpc::ClientContext* heartbeat_ctx ABSL_GUARDED_BY(mu) = nullptr;
  absl::Time last_heartbeat_ok ABSL_GUARDED_BY(mu) = absl::Now();
  int64_t dispatcher_timeout_seen ABSL_GUARDED_BY(mu) = 0;  // for the warning above

  // Metrics (see worker_metrics.h).
  std::atomic<int64_t> elements_served{0}, bytes_served{0}, grpc_serve_errors{0},
      ucx_serve_errors{0}, grpc_bytes_copied{0}, tasks_received{0}, heartbeat_failures{0};
  // Last member: destroyed (and its thread joined) first, as it reads the others.
  std::unique_ptr<internal::MetricsHttpServer> metrics;

  std::string RenderMetrics() ABSL_LOCKS_EXCLUDED(mu) {
    internal::WorkerMetricsSnapshot m;
    m.address = address;
    m.transfer_protocol = transfer_protocol;
    m.elements_served = elements_served.load();
    m.bytes_served = bytes_served.load();
    m.grpc_serve_errors = grpc_serve_errors.load();
    m.ucx_serve_errors = ucx_serve_errors.load();
    m.grpc_bytes_copied = grpc_bytes_copied.load();
    m.tasks_received = tasks_received.load();
    m.heartbeat_failures = heartbeat_failures.load();
    m.transport = GetTransportStats();
    {
      absl::MutexLock l(&mu);
      m.heartbeat_age_seconds = absl::ToDoubleSeconds(absl::Now() - last_heartbeat_ok);
      for (const auto& [id, t] : tasks) {
        m.tasks.push_back({id, t->def().iteration_id(), t->counters()});
      }
    }
    return internal::RenderWorkerMetrics(m);
  }

  // The task, waiting until `deadline` for a heartbeat to deliver it: a
  // client learns of a task (from the dispatcher) as soon as this worker
  // does, sometimes sooner. Answering "not ready" at once would hold that
  // client back while others, whose requests came a moment later, read the
  // task's first elements (in a shared job: all of a small iteration).
  std::shared_ptr<TaskRunner> AwaitTask(int64_t id, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    auto known = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return tasks.count(id) > 0; };
    // In slices, to notice Stop() (which notifies without the mutex).
    while (!known() && !stopping.HasBeenNotified()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      mu.AwaitWithTimeout(absl::Condition(&known), std::min(left, absl::Milliseconds(20)));
    }
    auto it = tasks.find(id);
    return it == tasks.end() ? nullptr : it->second;
  }

  // Tells the dispatcher at once that a task completed or failed (the next
  // heartbeat repeats it if this call is lost).
  void ReportFinished(const TaskRunner& task) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock l(&mu);
      if (!reported.insert(task.def().task_id()).second) return;
    }
    proto::WorkerUpdateRequest req;
    req.set_worker_address(address);
    auto* u = req.add_updates();
    u->set_task_id(task.def().task_id());
    u->set_completed(true);
    absl::Status err = task.error();
    if (!err.ok()) *u->mutable_error() = internal::ToProto(err);
    grpc::ClientContext ctx;
    internal::SetTimeout(&ctx, absl::Seconds(2));
    proto::WorkerUpdateResponse resp;
    grpc::Status s = dispatcher->WorkerUpdate(&ctx, req, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The dispatcher already collected the task (or restarted without
      // a journal): nothing to report.
      spdlog::debug("worker {}: WorkerUpdate: {}", address, s.error_message());
    } else if (!s.ok()) {
      spdlog::warn("worker {}: WorkerUpdate failed ({}); the next heartbeat will retry", address,
                   s.error_message());
    }
  }

  // Answers one element request (both data paths use this).
  absl::StatusOr<internal::ServedBatch> Serve(const ElementRequest& req) {
    const absl::Time deadline =
        absl::Now() + std::clamp(req.wait, absl::ZeroDuration(), absl::Seconds(10));
    std::shared_ptr<TaskRunner> task = AwaitTask(req.task_id, deadline);
    if (task == nullptr) {  // not (yet) delivered: the client asks again
      internal::ServedBatch out;
      out.not_ready = true;
      return out;
    }
    const absl::Duration wait = std::max(absl::ZeroDuration(), deadline - absl::Now());
    task->Ack(req.acks);
    auto batch = task->def().num_consumers() > 0
                     ? task->GetRound(wait, req.consumer_index, req.round)
                     : task->GetBatch(req, wait);
    if (!batch.ok()) {
      if (!absl::IsCancelled(batch.status())) ReportFinished(*task);
      return batch.status();
    }
    if (batch->end_of_sequence) ReportFinished(*task);
    elements_served += static_cast<int64_t>(batch->frames.size());
    for (const auto& f : batch->frames) bytes_served += static_cast<int64_t>(f.frame_size());
    return batch;
  }

  std::string WhoAmI() const { return absl::StrCat("worker ", address); }

  // The gRPC data path: one element per call (the tf.data baseline).
  grpc::Status GetElement(grpc::ServerContext* ctx, const proto::GetElementRequest* req,
                          proto::GetElementResponse* resp) override {
    grpc::Status auth = internal::CheckAuthToken(*ctx, config.auth_token, WhoAmI());
    if (!auth.ok()) return auth;
    ElementRequest r;
    r.task_id = req->task_id();
    r.consumer_index = req->consumer_index();
    r.round = req->round();
    r.wait = absl::Milliseconds(req->wait_ms());
    r.client_id = req->client_id();
    r.max_outstanding = std::max<int64_t>(1, req->max_outstanding());
    r.shared_job = req->shared_job();
    const int acks = std::min<int>({req->ack_split_ids_size(), req->ack_counts_size(),
                                    static_cast<int>(kMaxAcksPerRequest)});
    for (int i = 0; i < acks; ++i) r.acks.push_back({req->ack_split_ids(i), req->ack_counts(i)});
    auto served = Serve(r);
    if (!served.ok()) {
      if (!absl::IsCancelled(served.status())) grpc_serve_errors++;
      return internal::ToGrpcStatus(served.status());
    }
    resp->set_end_of_sequence(served->end_of_sequence);
    resp->set_not_ready(served->not_ready);
    if (!served->frames.empty()) {
      const internal::FrameBuffer& f = served->frames[0];
      std::string* out = resp->mutable_frame();
      out->resize(f.frame_size());
      internal::WriteFrame(f, reinterpret_cast<uint8_t*>(out->data()));
      grpc_bytes_copied += static_cast<int64_t>(f.frame_size());
      resp->set_split_id(f.position.split_id);
      resp->set_split_index(f.position.index);
      resp->set_seq(served->seq);
    } else {
      resp->set_split_id(-1);
      resp->set_split_index(-1);
      resp->set_seq(-1);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetWorkerTasks(grpc::ServerContext* ctx, const proto::GetWorkerTasksRequest*,
                              proto::GetWorkerTasksResponse* resp) override {
    grpc::Status auth = internal::CheckAuthToken(*ctx, config.auth_token, WhoAmI());
    if (!auth.ok()) return auth;
    absl::MutexLock l(&mu);
    for (const auto& [id, t] : tasks) *resp->add_tasks() = t->def();
    return grpc::Status::OK;
  }

  // One heartbeat; `wait` is the long-poll time the dispatcher may hold it.
  absl::Status Heartbeat(absl::Duration wait, absl::Duration deadline, bool wait_for_ready)
      ABSL_LOCKS_EXCLUDED(mu) {
    proto::WorkerHeartbeatRequest req;
    req.set_worker_address(address);
    req.set_transfer_address(transfer_address);
    req.set_transfer_protocol(transfer_protocol);
    req.set_host_id(config.host_id);
    req.set_wait_ms(absl::ToInt64Milliseconds(wait));
    grpc::ClientContext ctx;
    internal::SetTimeout(&ctx, deadline);
    ctx.set_wait_for_ready(wait_for_ready);
    {
      absl::MutexLock l(&mu);
      for (const auto& [id, t] : tasks) {
        req.add_current_tasks(id);
        if (t->finished()) req.add_finished_tasks(id);
      }
      if (stopping.HasBeenNotified()) return absl::CancelledError("worker stopping");
      heartbeat_ctx = &ctx;
    }
    proto::WorkerHeartbeatResponse resp;
    grpc::Status s = dispatcher->WorkerHeartbeat(&ctx, req, &resp);
    std::vector<std::shared_ptr<TaskRunner>> doomed;  // destroyed outside the lock
    {
      absl::MutexLock l(&mu);
      heartbeat_ctx = nullptr;
      if (!s.ok()) {
        return internal::FromGrpcStatus(
            s, absl::StrCat("heartbeat to dispatcher ", config.dispatcher_address));
      }
      last_heartbeat_ok = absl::Now();
      const int64_t timeout_ms = resp.worker_timeout_ms();
      if (timeout_ms > 0 && timeout_ms != dispatcher_timeout_seen) {
        dispatcher_timeout_seen = timeout_ms;
        const int64_t max_wait_ms = timeout_ms / internal::kLongPollTimeoutFraction;
        if (config.heartbeat_interval_ms > max_wait_ms) {
          spdlog::warn("worker {}: heartbeat_interval_ms={} is longer than the dispatcher allows "
                       "(worker_timeout_ms={} holds a heartbeat at most {} ms); heartbeats run "
                       "every {} ms",
                       address, config.heartbeat_interval_ms, timeout_ms, max_wait_ms,
                       max_wait_ms);
        }
      }
      for (const auto& def : resp.new_tasks()) {
        if (tasks.count(def.task_id())) continue;
        std::unique_ptr<internal::SplitClient> splits;
        if (def.processing_mode() == proto::DISTRIBUTED_EPOCH) {
          splits = std::make_unique<internal::SplitClient>(dispatcher.get(), address,
                                                           def.task_id(), def.split_tracked());
        }
        tasks_received++;
        tasks.emplace(def.task_id(),
                      std::make_shared<TaskRunner>(def, config.task_buffer_elements,
                                                   ucx ? ucx->frame_allocator()
                                                       : internal::HeapFrameAllocator(),
                                                   bind_thread, std::move(splits)));
      }
      for (int64_t id : resp.tasks_to_delete()) {
        auto it = tasks.find(id);
        if (it == tasks.end()) continue;
        it->second->Stop();
        doomed.push_back(std::move(it->second));
        tasks.erase(it);
        reported.erase(id);
      }
    }
    return absl::OkStatus();
  }

  void HeartbeatLoop() {
    const absl::Duration interval = absl::Milliseconds(config.heartbeat_interval_ms);
    int failures = 0;
    while (!stopping.HasBeenNotified()) {
      absl::Status s = Heartbeat(interval, interval + absl::Seconds(10), false);
      if (s.ok()) {
        if (failures > 0) spdlog::info("worker {}: dispatcher reachable again", address);
        failures = 0;
        continue;
      }
      if (stopping.HasBeenNotified()) break;
      heartbeat_failures++;
      if (failures++ % 20 == 0) {
        spdlog::warn("worker {}: {}; retrying", address, std::string(s.message()));
      }
      stopping.WaitForNotificationWithTimeout(std::min(interval, absl::Milliseconds(250)));
    }
  }
};

WorkerServer::WorkerServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerServer::~WorkerServer() { Stop(); }

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const WorkerConfig& config) {
  auto dispatcher = internal::ParseServiceAddress(config.dispatcher_address);
  if (!dispatcher.ok()) return dispatcher.status();
  if (config.data_transfer_protocol != "grpc" && config.data_transfer_protocol != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat("unknown data_transfer_protocol '",
                                                   config.data_transfer_protocol,
                                                   "'; expected grpc or ucx"));
  }
  if (config.port < 0 || config.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", config.port, " is not in 0..65535"));
  }
  if (config.metrics_port < -1 || config.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_port ", config.metrics_port, " is not in 0..65535 (or -1: no metrics endpoint)"));
  }
  if (config.heartbeat_interval_ms <= 0 || config.dispatcher_timeout_ms <= 0 ||
      config.task_buffer_elements <= 0) {
    return absl::InvalidArgumentError(
        "heartbeat_interval_ms, dispatcher_timeout_ms and task_buffer_elements must be > 0");
  }
  if (config.worker_threads < 0 || config.worker_threads > kMaxWorkerThreads) {
    return absl::InvalidArgumentError(absl::StrCat("worker_threads ", config.worker_threads,
                                                   " is not in 0..", kMaxWorkerThreads,
                                                   " (0: one per cpu of the placement)"));
  }
  SLUICE_RETURN_IF_ERROR(internal::ValidateAuthToken(config.auth_token, "worker"));
  if (config.max_request_bytes <= 0 || config.max_request_bytes > internal::kMaxGrpcMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("worker max_request_bytes must be in 1..",
                                                   internal::kMaxGrpcMessageBytes));
  }
  // Clients and the dispatcher dial the advertised addresses: a wildcard
  // bind needs an explicit worker_address.
  if (!config.worker_address.empty()) {
    SLUICE_RETURN_IF_ERROR(internal::ValidateDialableAddress(config.worker_address, "worker_address"));
  } else if (internal::IsWildcardHost(config.bind_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker: bind_address '", config.bind_address, "' serves every interface, so it names no "
        "address clients can dial; set worker_address (--worker_address HOST:PORT) to the "
        "address clients and the dispatcher reach this worker at"));
  }
  internal::RouteLibraryLogs();
  SLUICE_ASSIGN_OR_RETURN(auto server_creds, internal::MakeServerCredentials(config.tls, "worker"));
  ClientSecurity to_dispatcher{config.tls, config.auth_token};
  SLUICE_ASSIGN_OR_RETURN(auto dispatcher_channel,
                          internal::MakeSecureChannel(*dispatcher, to_dispatcher));
  for (const std::string& p : config.plugins) {
    absl::Status s = LoadPlugin(p);
    if (!s.ok() && !absl::IsAlreadyExists(s)) return s;
    if (!s.ok()) spdlog::warn("worker: {}", std::string(s.message()));
  }
  PlacementConfig pc;
  pc.numa_node = config.numa_node;
  pc.cpu_list = config.cpu_list;
  auto hooks = MakeBindingHooks(pc);
  if (!hooks.ok() && absl::IsInvalidArgument(hooks.status())) {
    return absl::InvalidArgumentError(absl::StrCat("worker placement: ", hooks.status().message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (impl->config.host_id.empty()) impl->config.host_id = internal::LocalHostId();
  if (hooks.ok()) {
    impl->bind_thread = hooks->bind_thread;
    impl->placement.allocate = hooks->allocate;
    impl->placement.verify = hooks->verify;
    impl->placement.on_progress_thread_start = hooks->bind_thread;
    impl->placement.description = hooks->description;
    spdlog::info("worker: placement {}", hooks->description);
  } else {
    spdlog::warn("worker: no topology ({}); threads and buffers stay unbound",
                 std::string(hooks.status().message()));
  }
  // The process-wide pool of parallel pipeline work (Map/Interleave/Batch
  // num_parallel_calls): one thread per cpu the worker is placed on, bound
  // as its task threads are, unless --worker_threads says otherwise.
  {
    int threads = static_cast<int>(config.worker_threads);
    if (threads <= 0) {
      threads = hooks.ok() && !hooks->placement.cpus.empty()
                    ? static_cast<int>(hooks->placement.cpus.size())
                    : AvailableCpus();
    }
    ConfigureThreadPool(threads, impl->bind_thread);
    spdlog::info("worker: {} pool thread(s) for parallel pipeline work", threads);
  }
  grpc::EnableDefaultHealthCheckService(true);  // grpc.health.v1.Health, SERVING once built
  grpc::ServerBuilder builder;
  internal::ConfigureServerBuilder(&builder, static_cast<int>(config.max_request_bytes));
  std::string listen = absl::StrCat(config.bind_address, ":", config.port);
  builder.AddListeningPort(listen, server_creds, &impl->port);
  builder.RegisterService(impl.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return internal::ListenError("worker", config.bind_address, config.port);
  }
  // Health says SERVING only once the worker registered (end of Start).
  impl->server->GetHealthCheckService()->SetServingStatus(false);
  impl->address = config.worker_address.empty()
                      ? absl::StrCat(config.bind_address, ":", impl->port)
                      : config.worker_address;
  impl->transfer_protocol = "grpc";
  impl->transfer_address = impl->address;
  if (config.data_transfer_protocol == "ucx") {
    std::string listen_ucx = config.data_transfer_address.empty()
                                 ? absl::StrCat(config.bind_address, ":0")
                                 : config.data_transfer_address;
    Impl* self = impl.get();
    auto ucx = internal::UcxElementServer::Start(
        listen_ucx,
        [self](const ElementRequest& r) {
          auto served = self->Serve(r);
          if (!served.ok() && !absl::IsCancelled(served.status())) self->ucx_serve_errors++;
          return served;
        },
        16,
        impl->placement, config.auth_token);
    if (ucx.ok()) {
      impl->ucx = *std::move(ucx);
      impl->transfer_protocol = "ucx";
      impl->transfer_address = impl->ucx->address();
      // A listener on a wildcard address publishes the worker's own host.
      const size_t colon = impl->transfer_address.rfind(':');
      if (internal::IsWildcardHost(impl->transfer_address.substr(0, colon))) {
        const std::string& a = impl->address;
        impl->transfer_address =
            absl::StrCat(a.substr(0, a.rfind(':')), impl->transfer_address.substr(colon));
      }
    } else {
      // Clients then read over gRPC; say why once.
      spdlog::warn("worker: UCX data plane unavailable ({}); serving elements over gRPC",
                   std::string(ucx.status().message()));
    }
  }
  if (config.metrics_port >= 0) {
    Impl* self = impl.get();
    auto metrics = internal::MetricsHttpServer::Start(config.bind_address, config.metrics_port,
                                                      [self] { return self->RenderMetrics(); });
    if (!metrics.ok()) {
      impl->server->Shutdown();
      if (impl->ucx) impl->ucx->Stop();
      return metrics.status();
    }
    impl->metrics = *std::move(metrics);
  }
  impl->dispatcher = proto::DispatcherService::NewStub(dispatcher_channel);
  // Register now, so that an unreachable dispatcher fails Start clearly.
  absl::Status s = impl->Heartbeat(absl::ZeroDuration(),
                                   absl::Milliseconds(config.dispatcher_timeout_ms), true);
  if (!s.ok()) {
    impl->server->Shutdown();
    if (impl->ucx) impl->ucx->Stop();
    if (impl->metrics) impl->metrics->Stop();
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
      return absl::UnavailableError(absl::StrCat("worker cannot reach the dispatcher at ",
                                                 *dispatcher, " within ",
                                                 config.dispatcher_timeout_ms, " ms"));
    }
    return s;
  }
  Impl* raw = impl.get();
  impl->heartbeat = std::thread([raw] { raw->HeartbeatLoop(); });
  impl->server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("worker: serving on {} (elements over {} at {}; dispatcher {}; {}{})",
               impl->address, impl->transfer_protocol, impl->transfer_address, *dispatcher,
               !config.tls.enabled()         ? "plain-text gRPC"
               : config.tls.ca_file.empty() ? "TLS"
                                            : "mutual TLS",
               config.auth_token.empty() ? ", no auth token" : ", auth token required");
  if (impl->metrics) {
    spdlog::info("worker: metrics at http://{}:{}/metrics", config.bind_address,
                 impl->metrics->port());
  }
  return std::unique_ptr<WorkerServer>(new WorkerServer(std::move(impl)));
}

std::string WorkerServer::address() const { return impl_->address; }
std::string WorkerServer::transfer_address() const { return impl_->transfer_address; }
int WorkerServer::port() const { return impl_->port; }
int WorkerServer::metrics_port() const { return impl_->metrics ? impl_->metrics->port() : -1; }

int64_t WorkerServer::num_tasks() const {
  absl::MutexLock l(&impl_->mu);
  return static_cast<int64_t>(impl_->tasks.size());
}

void WorkerServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  impl_->stopping.Notify();
  if (impl_->metrics) impl_->metrics->Stop();
  if (auto* health = impl_->server->GetHealthCheckService()) health->SetServingStatus(false);
  {
    absl::MutexLock l(&impl_->mu);
    for (auto& [id, t] : impl_->tasks) t->Stop();  // wakes GetElement waits
    if (impl_->heartbeat_ctx != nullptr) impl_->heartbeat_ctx->TryCancel();
  }
  impl_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
  impl_->server->Wait();
  if (impl_->ucx) impl_->ucx->Stop();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
  std::map<int64_t, std::shared_ptr<TaskRunner>> tasks;
  {
    absl::MutexLock l(&impl_->mu);
    tasks.swap(impl_->tasks);
  }
  tasks.clear();  // joins the producers
}

}  // namespace sluice
