// WorkerServer: the gRPC server (WorkerService, and ElementService through
// the gRPC element server), the element servers, the heartbeat loop, and the
// WorkerCore holding the task runners.
//
// Threads: each element server's own (gRPC's handler threads; UCX serving
// threads) call WorkerCore::Serve; one heartbeat thread (started by Start,
// joined by Stop) talks to the dispatcher; each task has a producer thread
// owned by its TaskRunner.
#include "sluice/worker/worker_server.h"

#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "rpc/service.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"
#include "sluice/rpc/protocol.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/core/metrics.h"
#include "sluice/rpc/security_internal.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_server.h"
#include "sluice/dataplane/transport_registry.h"
#include "sluice/dataset/thread_pool.h"
#include "sluice/dataset/udf.h"
#include "sluice/topology/topology.h"
#include "sluice/worker/pool_sizing.h"
#include "sluice/worker/task_runner.h"
#include "sluice/worker/worker_core.h"
#include "sluice/worker/worker_metrics.h"
#include "spdlog/spdlog.h"

namespace sluice {

using internal::TaskRunner;

struct WorkerServer::Impl final : public proto::WorkerService::Service {
  WorkerConfig config;
  std::string address;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  // The gRPC element server (every client's fallback) and, when the worker
  // serves another protocol, that protocol's server: `primary` points at
  // the one advertised to the dispatcher.
  std::unique_ptr<internal::ElementServer> grpc_elements, other_elements;
  internal::ElementServer* primary = nullptr;
  std::string transfer_protocol;  // primary's registry name, as advertised
  std::string transfer_address;
  DataPlanePlacement placement;       // UCX send pool + progress thread
  std::function<void()> bind_thread;  // pins task producer threads
  internal::PoolCpus pool_cpus;       // what the parallel-work pool may use
  bool in_process_counted = false;    // AddInProcessWorker was called

  ~Impl() { Uncount(); }
  void Uncount() {
    if (!in_process_counted) return;
    in_process_counted = false;
    internal::RemoveInProcessWorker(config.host_id);
  }
  std::unique_ptr<proto::DispatcherService::Stub> dispatcher;
  internal::WorkerCore core{[this](const TaskRunner& t) { ReportFinished(t); }};
  std::thread heartbeat;
  absl::Notification stopping;
  bool stopped = false;

  absl::Mutex mu;
  grpc::ClientContext* heartbeat_ctx ABSL_GUARDED_BY(mu) = nullptr;
  absl::Time last_heartbeat_ok ABSL_GUARDED_BY(mu) = absl::Now();
  int64_t dispatcher_timeout_seen ABSL_GUARDED_BY(mu) = 0;  // for the warning above
  int64_t workers_on_host_seen ABSL_GUARDED_BY(mu) = 0;     // see ResizePool
  int pool_threads ABSL_GUARDED_BY(mu) = 0;

  // Metrics (see worker_metrics.h).
  std::atomic<int64_t> tasks_received{0}, heartbeat_failures{0};
  // Last member: destroyed (and its thread joined) first, as it reads the others.
  std::unique_ptr<internal::MetricsHttpServer> metrics;

  std::string RenderMetrics() ABSL_LOCKS_EXCLUDED(mu) {
    internal::WorkerMetricsSnapshot m;
    m.address = address;
    m.transfer_protocol = transfer_protocol;
    m.elements_served = core.elements_served();
    m.bytes_served = core.bytes_served();
    m.elements_unacknowledged = core.elements_unacknowledged();
    for (const internal::ElementServer* s : {grpc_elements.get(), other_elements.get()}) {
      if (s == nullptr) continue;
      const internal::ElementServerStats st = s->stats();
      const std::string name =
          s == grpc_elements.get() ? std::string(internal::kGrpcProtocol) : transfer_protocol;
      m.serve_errors.push_back({name, st.serve_errors});
      if (s == grpc_elements.get()) m.grpc_bytes_copied = st.bytes_copied;
    }
    m.tasks_received = tasks_received.load();
    m.heartbeat_failures = heartbeat_failures.load();
    m.transport = GetTransportStats();
    {
      absl::MutexLock l(&mu);
      m.heartbeat_age_seconds = absl::ToDoubleSeconds(absl::Now() - last_heartbeat_ok);
    }
    for (const auto& t : core.Tasks()) {
      m.tasks.push_back({t->def().task_id(), t->def().iteration_id(), t->counters()});
    }
    return internal::RenderWorkerMetrics(m);
  }

  // Tells the dispatcher at once that a task completed or failed (the next
  // heartbeat repeats it if this call is lost). WorkerCore calls it once
  // per task.
  void ReportFinished(const TaskRunner& task) {
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

  std::string WhoAmI() const { return absl::StrCat("worker ", address); }

  grpc::Status GetWorkerTasks(grpc::ServerContext* ctx, const proto::GetWorkerTasksRequest*,
                              proto::GetWorkerTasksResponse* resp) override {
    grpc::Status auth = internal::CheckAuthToken(*ctx, config.auth_token, WhoAmI());
    if (!auth.ok()) return auth;
    for (const auto& t : core.Tasks()) *resp->add_tasks() = t->def();
    return grpc::Status::OK;
  }

  // Sizes the pool of parallel pipeline work for `workers_on_host` workers
  // on this host (0: not known yet) and says so when it changes.
  void ResizePool(int64_t workers_on_host) ABSL_LOCKS_EXCLUDED(mu) {
    internal::PoolSize size;
    {
      absl::MutexLock l(&mu);
      if (pool_threads > 0 && workers_on_host == workers_on_host_seen) return;
      workers_on_host_seen = workers_on_host;
      size = internal::SizeWorkerPool(config.worker_threads, pool_cpus, workers_on_host,
                                       internal::InProcessWorkers(config.host_id), config.host_id);
      if (size.threads == pool_threads) return;
      pool_threads = size.threads;
    }
    ConfigureThreadPool(size.threads, bind_thread);
    spdlog::info("worker: {} pool thread(s) for parallel pipeline work ({})", size.threads,
                 size.why);
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
    for (const auto& t : core.Tasks()) {
      req.add_current_tasks(t->def().task_id());
      if (t->finished()) req.add_finished_tasks(t->def().task_id());
    }
    {
      absl::MutexLock l(&mu);
      if (stopping.HasBeenNotified()) return absl::CancelledError("worker stopping");
      heartbeat_ctx = &ctx;
    }
    proto::WorkerHeartbeatResponse resp;
    grpc::Status s = dispatcher->WorkerHeartbeat(&ctx, req, &resp);
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
    }
    ResizePool(resp.workers_on_host());
    for (const auto& def : resp.new_tasks()) {
      if (core.HasTask(def.task_id())) continue;
      std::unique_ptr<internal::SplitClient> splits;
      if (def.processing_mode() == proto::DISTRIBUTED_EPOCH) {
        splits = std::make_unique<internal::SplitClient>(dispatcher.get(), address,
                                                         def.task_id(), def.split_tracked());
      }
      tasks_received++;
      core.AddTask(std::make_shared<TaskRunner>(def, config.task_buffer_elements,
                                                primary->frame_allocator(), bind_thread,
                                                std::move(splits)));
    }
    for (int64_t id : resp.tasks_to_delete()) {
      // Destroyed here, outside every lock (joins the producer).
      std::shared_ptr<TaskRunner> doomed = core.RemoveTask(id);
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
  SLUICE_ASSIGN_OR_RETURN(const internal::TransportProtocol* protocol,
                          internal::FindTransportProtocol(config.data_transfer_protocol, "worker"));
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
  // num_parallel_calls): one thread per cpu the worker is placed on (at
  // most the cgroup quota), bound as its task threads are, divided among
  // the workers on its host once the dispatcher has counted them, unless
  // --worker_threads says otherwise (ResizePool).
  {
    internal::PoolCpus& pc = impl->pool_cpus;
    pc.explicit_cpus = !config.cpu_list.empty();
    if (hooks.ok() && !hooks->placement.cpus.empty()) {
      pc.cpus = static_cast<int>(hooks->placement.cpus.size());
      pc.from = absl::StrCat("its placement (", hooks->description, ")");
    } else {
      pc.cpus = AvailableCpus();
      pc.from = "the process's cpus";
    }
    if (const std::optional<double> quota = CgroupCpuQuota()) {
      const int allowed = std::max(1, static_cast<int>(std::ceil(*quota - 1e-9)));
      if (allowed < pc.cpus) {
        pc.cpus = allowed;
        pc.from = absl::StrCat("the cgroup cpu quota (", *quota, " cpus)");
      }
    }
    internal::AddInProcessWorker(impl->config.host_id);
    impl->in_process_counted = true;
    impl->ResizePool(0);
  }
  grpc::EnableDefaultHealthCheckService(true);  // grpc.health.v1.Health, SERVING once built
  grpc::ServerBuilder builder;
  internal::ConfigureServerBuilder(&builder, static_cast<int>(config.max_request_bytes));
  std::string listen = absl::StrCat(config.bind_address, ":", config.port);
  builder.AddListeningPort(listen, server_creds, &impl->port);
  builder.RegisterService(impl.get());
  // The gRPC element server, hosted here: every client's fallback.
  auto element_options = [&] {
    internal::ElementServerOptions o;
    o.source = impl->core.source();
    o.auth_token = config.auth_token;
    o.placement = impl->placement;
    o.name = [self = impl.get()] { return self->WhoAmI(); };
    return o;
  };
  {
    internal::ElementServerOptions o = element_options();
    o.add_grpc_service = [&builder](grpc::Service* service) { builder.RegisterService(service); };
    SLUICE_ASSIGN_OR_RETURN(const internal::TransportProtocol* grpc,
                            internal::FindTransportProtocol(internal::kGrpcProtocol, "worker"));
    SLUICE_ASSIGN_OR_RETURN(impl->grpc_elements, grpc->serve(std::move(o)));
    impl->primary = impl->grpc_elements.get();
    impl->transfer_protocol = internal::kGrpcProtocol;
  }
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    impl->server.reset();
    WorkerServer failed(std::move(impl));  // Stop() releases what was created
    return internal::ListenError("worker", config.bind_address, config.port);
  }
  // Health says SERVING only once the worker registered (end of Start).
  impl->server->GetHealthCheckService()->SetServingStatus(false);
  impl->address = config.worker_address.empty()
                      ? absl::StrCat(config.bind_address, ":", impl->port)
                      : config.worker_address;
  impl->transfer_address = impl->address;
  if (protocol->name != internal::kGrpcProtocol) {
    internal::ElementServerOptions o = element_options();
    o.listen_address = config.data_transfer_address.empty()
                           ? absl::StrCat(config.bind_address, ":0")
                           : config.data_transfer_address;
    o.tls = config.tls;
    auto other = protocol->serve(std::move(o));
    if (other.ok()) {
      impl->other_elements = *std::move(other);
      impl->primary = impl->other_elements.get();
      impl->transfer_protocol = protocol->name;
      impl->transfer_address = impl->primary->address();
      // A listener on a wildcard address publishes the worker's own host.
      const size_t colon = impl->transfer_address.rfind(':');
      if (internal::IsWildcardHost(impl->transfer_address.substr(0, colon))) {
        const std::string& a = impl->address;
        impl->transfer_address =
            absl::StrCat(a.substr(0, a.rfind(':')), impl->transfer_address.substr(colon));
      }
    } else {
      // Clients then read over gRPC; say why once.
      spdlog::warn("worker: {} data plane unavailable ({}); serving elements over gRPC",
                   protocol->name, std::string(other.status().message()));
    }
  }
  if (config.metrics_port >= 0) {
    Impl* self = impl.get();
    auto metrics = internal::MetricsHttpServer::Start(config.bind_address, config.metrics_port,
                                                      [self] { return self->RenderMetrics(); });
    if (!metrics.ok()) {
      WorkerServer failed(std::move(impl));
      return metrics.status();
    }
    impl->metrics = *std::move(metrics);
  }
  impl->dispatcher = proto::DispatcherService::NewStub(dispatcher_channel);
  // Register now, so that an unreachable dispatcher fails Start clearly.
  absl::Status s = impl->Heartbeat(absl::ZeroDuration(),
                                   absl::Milliseconds(config.dispatcher_timeout_ms), true);
  if (!s.ok()) {
    WorkerServer failed(std::move(impl));
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

int64_t WorkerServer::num_tasks() const { return impl_->core.num_tasks(); }

void WorkerServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  impl_->Uncount();
  impl_->stopping.Notify();
  if (impl_->metrics) impl_->metrics->Stop();
  // Stopping the tasks wakes the requests waiting in them.
  std::map<int64_t, std::shared_ptr<TaskRunner>> tasks = impl_->core.Stop();
  {
    absl::MutexLock l(&impl_->mu);
    if (impl_->heartbeat_ctx != nullptr) impl_->heartbeat_ctx->TryCancel();
  }
  if (impl_->server != nullptr) {
    if (auto* health = impl_->server->GetHealthCheckService()) health->SetServingStatus(false);
    impl_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
    impl_->server->Wait();
  }
  if (impl_->other_elements) impl_->other_elements->Stop();
  if (impl_->grpc_elements) impl_->grpc_elements->Stop();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
  tasks.clear();  // joins the producers
}

}  // namespace sluice
