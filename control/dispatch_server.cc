// DispatchServer: the gRPC adapter over DispatcherImpl plus its maintenance
// thread.
#include "sluice/control/dispatch_server.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "sluice/control/dispatcher_impl.h"
#include "sluice/control/dispatcher_metrics.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/core/metrics.h"
#include "sluice/rpc/security_internal.h"
#include "sluice/core/status.h"
#include "sluice/core/tsan.h"
#include "rpc/service.grpc.pb.h"
#include "google/protobuf/arena.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/message_allocator.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

using internal::ToGrpcStatus;

// Forwards each RPC to DispatcherImpl and converts the status. Every RPC
// first checks the auth token (when the config sets one). The long polls
// (WorkerHeartbeat, ClientHeartbeat, GetSplit) use gRPC's callback API:
// a poll waits parked in the dispatcher, not on a thread of its own, so a
// fleet of thousands of workers and consumers, each with a poll held, costs
// no thread per poll (sluice-perf dispatcher).
using DispatcherServiceBase = proto::DispatcherService::WithCallbackMethod_WorkerHeartbeat<
    proto::DispatcherService::WithCallbackMethod_ClientHeartbeat<
        proto::DispatcherService::WithCallbackMethod_GetSplit<proto::DispatcherService::Service>>>;

// One long poll: answered once (Finish) by the dispatcher's `done`; a
// cancelled call (the caller went away) unparks it.
class PollReactor final : public grpc::ServerUnaryReactor {
 public:
  // gRPC calls OnCancel and OnDone on threads of its own, handing the
  // reactor over through gRPC core (internal::HappensBefore).
  explicit PollReactor(internal::DispatcherImpl* impl) : impl_(impl), id_(impl->NewPollId()) {
    internal::HappensBefore(this);
  }
  int64_t id() const { return id_; }
  internal::DispatcherImpl::PollDone Done() {
    return [this](absl::Status s) { Finish(ToGrpcStatus(s)); };
  }
  void OnCancel() override {
    internal::HappensAfter(this);
    impl_->CancelPoll(id_);
  }
  void OnDone() override {
    internal::HappensAfter(this);
    delete this;
  }

 private:
  internal::DispatcherImpl* const impl_;
  const int64_t id_;
};

// A long poll's request and reply live on a protobuf arena, freed at once
// when the call is done: a fleet's warm-up sends millions of TaskInfos
// (2,000 consumers each learning 2,000 tasks), and on the heap each was an
// allocation and a free per message and per string.
template <typename Request, typename Response>
class ArenaAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override { return new Holder; }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    google::protobuf::Arena arena_;
  };
};

class DispatcherService final : public DispatcherServiceBase {
 public:
  DispatcherService(internal::DispatcherImpl* impl, const DispatcherConfig& config)
      : impl_(impl), auth_token_(config.auth_token),
        max_dataset_def_bytes_(config.max_dataset_def_bytes) {
    SetMessageAllocatorFor_WorkerHeartbeat(&worker_heartbeat_messages_);
    SetMessageAllocatorFor_ClientHeartbeat(&client_heartbeat_messages_);
    SetMessageAllocatorFor_GetSplit(&get_split_messages_);
  }

#define SLUICE_FORWARD_RPC_(Name)                                                       \
  grpc::Status Name(grpc::ServerContext* ctx, const proto::Name##Request* req,         \
                    proto::Name##Response* resp) override {                            \
    grpc::Status auth = internal::CheckAuthToken(*ctx, auth_token_, "dispatcher");     \
    if (!auth.ok()) return auth;                                                        \
    return ToGrpcStatus(impl_->Name(*req, resp));                                       \
  }
  SLUICE_FORWARD_RPC_(WorkerUpdate)
  SLUICE_FORWARD_RPC_(GetDatasetDef)
  SLUICE_FORWARD_RPC_(GetOrCreateJob)
  SLUICE_FORWARD_RPC_(GetOrCreateIteration)
  SLUICE_FORWARD_RPC_(ReleaseIterationClient)
  SLUICE_FORWARD_RPC_(GetWorkers)
  SLUICE_FORWARD_RPC_(GetDataServiceMetadata)
  SLUICE_FORWARD_RPC_(GetDataServiceConfig)
#undef SLUICE_FORWARD_RPC_

#define SLUICE_FORWARD_LONG_POLL_(Name)                                                  \
  grpc::ServerUnaryReactor* Name(grpc::CallbackServerContext* ctx,                       \
                                 const proto::Name##Request* req,                        \
                                 proto::Name##Response* resp) override {                 \
    auto* reactor = new PollReactor(impl_);                                              \
    grpc::Status auth = internal::CheckAuthToken(*ctx, auth_token_, "dispatcher");      \
    if (!auth.ok()) {                                                                    \
      reactor->Finish(auth);                                                             \
    } else {                                                                             \
      impl_->Start##Name(reactor->id(), *req, resp, reactor->Done());                    \
    }                                                                                    \
    return reactor;                                                                      \
  }
  SLUICE_FORWARD_LONG_POLL_(WorkerHeartbeat)
  SLUICE_FORWARD_LONG_POLL_(ClientHeartbeat)
  SLUICE_FORWARD_LONG_POLL_(GetSplit)
#undef SLUICE_FORWARD_LONG_POLL_

  grpc::Status RegisterDataset(grpc::ServerContext* ctx, const proto::RegisterDatasetRequest* req,
                               proto::RegisterDatasetResponse* resp) override {
    grpc::Status auth = internal::CheckAuthToken(*ctx, auth_token_, "dispatcher");
    if (!auth.ok()) return auth;
    const size_t bytes = req->dataset().ByteSizeLong();
    if (bytes > static_cast<size_t>(max_dataset_def_bytes_)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("the dataset definition has ", bytes,
                                       " bytes; this dispatcher accepts at most ",
                                       max_dataset_def_bytes_,
                                       " (DispatcherConfig::max_dataset_def_bytes). Large "
                                       "constant tensors belong in files the pipeline reads"));
    }
    return ToGrpcStatus(impl_->RegisterDataset(*req, resp));
  }

 private:
  internal::DispatcherImpl* impl_;
  const std::string auth_token_;
  const int64_t max_dataset_def_bytes_;
  ArenaAllocator<proto::WorkerHeartbeatRequest, proto::WorkerHeartbeatResponse>
      worker_heartbeat_messages_;
  ArenaAllocator<proto::ClientHeartbeatRequest, proto::ClientHeartbeatResponse>
      client_heartbeat_messages_;
  ArenaAllocator<proto::GetSplitRequest, proto::GetSplitResponse> get_split_messages_;
};

// Before a worker registers, its gRPC address and its data address (where
// its transfer protocol listens, if elsewhere; every protocol sluice has
// sets up connections over TCP) must accept a TCP connection within half
// the worker timeout (at most 2 s).
absl::Status ProbeWorker(const proto::WorkerHeartbeatRequest& req, int64_t worker_timeout_ms) {
  const absl::Duration timeout =
      std::min(absl::Seconds(2), absl::Milliseconds(worker_timeout_ms) / 2);
  SLUICE_RETURN_IF_ERROR(internal::ProbeTcp(req.worker_address(), timeout));
  if (!req.transfer_address().empty() && req.transfer_address() != req.worker_address()) {
    absl::Status s = internal::ProbeTcp(req.transfer_address(), timeout);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("its data address (", req.transfer_protocol(),
                                                 "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct DispatchServer::Impl {
  DispatcherConfig config;
  std::unique_ptr<internal::DispatcherImpl> dispatcher;
  std::unique_ptr<DispatcherService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::unique_ptr<internal::MetricsHttpServer> metrics;  // null when metrics_port is -1
  absl::Notification stop;
  std::thread maintenance;
  bool stopped = false;
};

DispatchServer::DispatchServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DispatchServer::~DispatchServer() { Stop(); }

absl::StatusOr<std::unique_ptr<DispatchServer>> DispatchServer::Start(
    const DispatcherConfig& config) {
  if (config.fault_tolerant_mode && config.work_dir.empty()) {
    return absl::InvalidArgumentError(
        "fault_tolerant_mode needs a work_dir: the directory of the dispatcher's journal");
  }
  if (config.port < 0 || config.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", config.port, " is not in 0..65535"));
  }
  if (config.metrics_port < -1 || config.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_port ", config.metrics_port, " is not in 0..65535 (or -1: no metrics endpoint)"));
  }
  for (int64_t v : {config.job_gc_check_interval_ms, config.job_gc_timeout_ms,
                    config.worker_timeout_ms, config.client_timeout_ms,
                    config.range_split_elements}) {
    if (v <= 0) {
      return absl::InvalidArgumentError(
          "job_gc_check_interval_ms, job_gc_timeout_ms, worker_timeout_ms, "
          "client_timeout_ms and range_split_elements must be > 0");
    }
  }
  if (config.file_split_files < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "file_split_files must be >= 0 (0: automatic); got ", config.file_split_files));
  }
  SLUICE_RETURN_IF_ERROR(internal::ValidateWorkerAddresses(config.worker_addresses));
  SLUICE_RETURN_IF_ERROR(internal::ValidateAuthToken(config.auth_token, "dispatcher"));
  if (config.max_request_bytes <= 0 || config.max_request_bytes > internal::kMaxGrpcMessageBytes ||
      config.max_dataset_def_bytes <= 0 ||
      config.max_dataset_def_bytes > config.max_request_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need 0 < max_dataset_def_bytes <= max_request_bytes <= ", internal::kMaxGrpcMessageBytes,
        "; got max_dataset_def_bytes=", config.max_dataset_def_bytes,
        ", max_request_bytes=", config.max_request_bytes));
  }
  SLUICE_ASSIGN_OR_RETURN(auto creds, internal::MakeServerCredentials(config.tls, "dispatcher"));
  internal::RouteLibraryLogs();
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  const int64_t worker_timeout_ms = config.worker_timeout_ms;
  impl->dispatcher = std::make_unique<internal::DispatcherImpl>(
      config, absl::Now, [worker_timeout_ms](const proto::WorkerHeartbeatRequest& req) {
        return ProbeWorker(req, worker_timeout_ms);
      });
  if (config.fault_tolerant_mode) {
    SLUICE_RETURN_IF_ERROR(impl->dispatcher->OpenJournal());
  } else if (!config.work_dir.empty()) {
    spdlog::warn("dispatcher: work_dir {} is not used without fault_tolerant_mode",
                 config.work_dir);
  }
  impl->service = std::make_unique<DispatcherService>(impl->dispatcher.get(), config);
  grpc::EnableDefaultHealthCheckService(true);  // grpc.health.v1.Health, SERVING once built
  grpc::ServerBuilder builder;
  internal::ConfigureServerBuilder(&builder, static_cast<int>(config.max_request_bytes));
  std::string listen = absl::StrCat(config.bind_address, ":", config.port);
  builder.AddListeningPort(listen, creds, &impl->port);
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return internal::ListenError("dispatcher", config.bind_address, config.port);
  }
  if (config.metrics_port >= 0) {
    internal::DispatcherImpl* d = impl->dispatcher.get();
    auto metrics = internal::MetricsHttpServer::Start(
        config.bind_address, config.metrics_port,
        [d] { return internal::RenderDispatcherMetrics(d->GetStats()); });
    if (!metrics.ok()) {
      impl->server->Shutdown();
      return metrics.status();
    }
    impl->metrics = *std::move(metrics);
    spdlog::info("dispatcher: metrics at http://{}:{}/metrics", config.bind_address,
                 impl->metrics->port());
  }
  // Timeouts are checked ten times per timeout period and at least every
  // 250 ms, so a silent worker is declared lost within worker_timeout_ms +
  // 250 ms of its last heartbeat.
  int64_t tick_ms = std::min({config.job_gc_check_interval_ms, config.worker_timeout_ms / 10,
                              config.client_timeout_ms / 10, int64_t{250}});
  tick_ms = std::max<int64_t>(tick_ms, 5);
  Impl* raw = impl.get();
  impl->maintenance = std::thread([raw, tick_ms] {
    while (!raw->stop.WaitForNotificationWithTimeout(absl::Milliseconds(tick_ms))) {
      raw->dispatcher->Tick();
    }
  });
  spdlog::info("dispatcher: serving on {}:{} ({}{})", config.bind_address, impl->port,
               !config.tls.enabled()         ? "plain-text gRPC"
               : config.tls.ca_file.empty() ? "TLS"
                                            : "mutual TLS",
               config.auth_token.empty() ? ", no auth token" : ", auth token required");
  return std::unique_ptr<DispatchServer>(new DispatchServer(std::move(impl)));
}

std::string DispatchServer::address() const {
  return absl::StrCat(impl_->config.bind_address == "0.0.0.0" ? "127.0.0.1"
                                                               : impl_->config.bind_address,
                      ":", impl_->port);
}
std::string DispatchServer::target() const { return absl::StrCat("grpc://", address()); }
int DispatchServer::port() const { return impl_->port; }
int DispatchServer::metrics_port() const {
  return impl_->metrics ? impl_->metrics->port() : -1;
}

void DispatchServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  if (auto* health = impl_->server->GetHealthCheckService()) health->SetServingStatus(false);
  impl_->dispatcher->Shutdown();  // releases long polls
  impl_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
  impl_->server->Wait();
  impl_->stop.Notify();
  if (impl_->maintenance.joinable()) impl_->maintenance.join();
  if (impl_->metrics) impl_->metrics->Stop();
}

}  // namespace sluice
