// The worker side of the gRPC data path: ElementService.GetElement, one
// element per call (the tf.data baseline), answered from the worker's
// ElementSource on gRPC's synchronous handler threads. Hosted by the
// worker's gRPC server (ElementServerOptions::add_grpc_service), or on a
// gRPC server of its own.
#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "rpc/service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_server.h"
#include "sluice/dataplane/transport_registry.h"

namespace sluice::internal {
namespace {

class GrpcElementServer final : public ElementServer, public proto::ElementService::Service {
 public:
  explicit GrpcElementServer(ElementServerOptions options) : options_(std::move(options)) {}
  ~GrpcElementServer() override { Stop(); }

  static absl::StatusOr<std::unique_ptr<ElementServer>> Start(ElementServerOptions options) {
    if (!options.source) return absl::InvalidArgumentError("GrpcElementServer: no element source");
    auto server = std::make_unique<GrpcElementServer>(std::move(options));
    if (server->options_.add_grpc_service) {
      server->options_.add_grpc_service(server.get());
      return server;
    }
    // A server of its own.
    const std::string& listen = server->options_.listen_address;
    SLUICE_ASSIGN_OR_RETURN(auto creds,
                            MakeServerCredentials(server->options_.tls, "element server"));
    grpc::ServerBuilder builder;
    ConfigureServerBuilder(&builder);
    int port = 0;
    builder.AddListeningPort(listen, creds, &port);
    builder.RegisterService(server.get());
    server->own_ = builder.BuildAndStart();
    const size_t colon = listen.rfind(':');
    if (server->own_ == nullptr || port == 0 || colon == std::string::npos) {
      int wanted = 0;
      if (colon != std::string::npos && !absl::SimpleAtoi(listen.substr(colon + 1), &wanted)) {
        wanted = 0;  // the port was not a number: said as 0, "any port"
      }
      return ListenError("gRPC element server", listen.substr(0, colon), wanted);
    }
    server->address_ = absl::StrCat(listen.substr(0, colon), ":", port);
    return server;
  }

  std::string protocol() const override { return kGrpcProtocol; }
  std::string address() const override { return address_; }
  ElementServerStats stats() const override { return {serve_errors_.load(), bytes_copied_.load()}; }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    if (own_ != nullptr) {
      own_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
      own_->Wait();
    }
  }

  grpc::Status GetElement(grpc::ServerContext* ctx, const proto::GetElementRequest* req,
                          proto::GetElementResponse* resp) override {
    auto who = [this] { return options_.name ? options_.name() : std::string("worker"); };
    if (!options_.auth_token.empty()) {
      grpc::Status auth = CheckAuthToken(*ctx, options_.auth_token, who());
      if (!auth.ok()) return auth;
    }
    if (stopped_.load()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, who() + " is stopping");
    }
    ElementRequest r;
    r.task_id = req->task_id();
    r.consumer_index = req->consumer_index();
    r.round = req->round();
    r.wait = absl::Milliseconds(req->wait_ms());
    r.client_id = req->client_id();
    r.max_outstanding = std::max<int64_t>(1, req->max_outstanding());
    r.shared_job = req->shared_job();
    r.delivered_seq = req->delivered_seq();
    r.resend = req->resend();
    r.leaving = req->leaving();
    r.max_elements = std::clamp<int64_t>(req->max_elements(), 1, kMaxGrpcBatchElements);
    r.max_bytes = std::clamp<int64_t>(req->max_bytes(), 0, kMaxGrpcBatchBytes);
    if (req->compression() == static_cast<int>(FrameCodec::kLz4)) r.compression = FrameCodec::kLz4;
    if (req->compression() == static_cast<int>(FrameCodec::kZstd)) {
      r.compression = FrameCodec::kZstd;
    }
    const int acks = std::min<int>({req->ack_split_ids_size(), req->ack_counts_size(),
                                    static_cast<int>(kMaxAcksPerRequest)});
    for (int i = 0; i < acks; ++i) r.acks.push_back({req->ack_split_ids(i), req->ack_counts(i)});
    auto served = options_.source(r);
    if (!served.ok()) {
      if (!absl::IsCancelled(served.status())) serve_errors_++;
      return ToGrpcStatus(served.status());
    }
    resp->set_end_of_sequence(served->end_of_sequence);
    resp->set_not_ready(served->not_ready);
    resp->set_split_id(-1);
    resp->set_split_index(-1);
    resp->set_seq(served->end_of_sequence ? served->seq : -1);
    resp->set_resent(served->resent);
    // The first element in the response's own fields (as before
    // batching), the others in `more`.
    for (size_t i = 0; i < served->frames.size(); ++i) {
      const FrameBuffer& f = served->frames[i];
      if (i == 0) {
        Put(f, resp->mutable_frame());
        resp->set_split_id(f.position.split_id);
        resp->set_split_index(f.position.index);
        resp->set_split_epoch(f.position.epoch);
        resp->set_split_begin(f.position.begin);
        resp->set_split_end(f.position.end);
        resp->set_has_key(f.position.key.has_value());
        resp->set_key(f.position.key.value_or(0));
        resp->set_seq(served->seq);
      } else {
        proto::BatchedElement* e = resp->add_more();
        Put(f, e->mutable_frame());
        e->set_split_id(f.position.split_id);
        e->set_split_index(f.position.index);
        e->set_split_epoch(f.position.epoch);
        e->set_split_begin(f.position.begin);
        e->set_split_end(f.position.end);
        e->set_has_key(f.position.key.has_value());
        e->set_key(f.position.key.value_or(0));
      }
    }
    return grpc::Status::OK;
  }

 private:
  // The frame `f` into the message's bytes (gRPC copies into its message).
  void Put(const FrameBuffer& f, std::string* out) {
    out->resize(f.frame_size());
    WriteFrame(f, reinterpret_cast<uint8_t*>(out->data()));
    bytes_copied_ += static_cast<int64_t>(f.frame_size());
  }

  ElementServerOptions options_;
  std::unique_ptr<grpc::Server> own_;  // null when hosted
  std::string address_;                // empty when hosted
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> serve_errors_{0}, bytes_copied_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<ElementServer>> StartGrpcElementServer(
    ElementServerOptions options) {
  return GrpcElementServer::Start(std::move(options));
}

}  // namespace sluice::internal
