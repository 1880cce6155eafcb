// The gRPC data path: one GetElement RPC per element; the response's frame
// bytes are decoded in place (the Tensors view the received buffer).
#include <atomic>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "control/service.grpc.pb.h"
#include "sluice/control/grpc_util.h"
#include "sluice/core/frame.h"
#include "sluice/dataplane/element_transport.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

class GrpcElementTransport final : public ElementTransport {
 public:
  GrpcElementTransport(std::string address, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), stub_(proto::WorkerService::NewStub(std::move(channel))) {}

  absl::StatusOr<ElementResult> GetElement(const ElementRequest& request) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    grpc::ClientContext ctx;
    // The worker answers within `wait`; allow for transfer time on top.
    internal::SetTimeout(&ctx, request.wait + absl::Seconds(30));
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return absl::CancelledError("transport cancelled");
      active_.insert(&ctx);
    }
    proto::GetElementRequest req;
    req.set_task_id(request.task_id);
    req.set_consumer_index(request.consumer_index);
    req.set_round(request.round);
    req.set_wait_ms(absl::ToInt64Milliseconds(request.wait));
    req.set_client_id(request.client_id);
    req.set_max_outstanding(request.max_outstanding);
    req.set_shared_job(request.shared_job);
    for (const SplitAck& a : request.acks) {
      req.add_ack_split_ids(a.split_id);
      req.add_ack_counts(a.count);
    }
    proto::GetElementResponse resp;
    grpc::Status s = stub_->GetElement(&ctx, req, &resp);
    {
      absl::MutexLock l(&mu_);
      active_.erase(&ctx);
      if (cancelled_) return absl::CancelledError("transport cancelled");
    }
    if (!s.ok()) {
      return internal::FromGrpcStatus(s, absl::StrCat("GetElement from worker ", address_));
    }
    ElementResult out;
    out.end_of_sequence = resp.end_of_sequence();
    out.not_ready = resp.not_ready();
    if (out.end_of_sequence || out.not_ready) return out;
    auto frame = std::make_shared<std::string>(std::move(*resp.mutable_frame()));
    out.bytes = frame->size();
    const auto* data = reinterpret_cast<const uint8_t*>(frame->data());
    auto decoded = DecodeFrame(data, frame->size(), frame);
    if (!decoded.ok()) {
      return absl::DataLossError(absl::StrCat("worker ", address_, " sent a bad element: ",
                                              decoded.status().message()));
    }
    out.elements.push_back(std::move(decoded->element));
    out.positions.push_back({resp.split_id(), resp.split_index()});
    out.seq = resp.seq();
    return out;
  }

  void Cancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* c : active_) c->TryCancel();
  }

  std::string protocol() const override { return "grpc"; }

 private:
  const std::string address_;
  std::unique_ptr<proto::WorkerService::Stub> stub_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> active_ ABSL_GUARDED_BY(mu_);
};

// See MakeFallbackTransport.
class FallbackTransport final : public ElementTransport {
 public:
  FallbackTransport(std::unique_ptr<ElementTransport> primary,
                    std::unique_ptr<ElementTransport> fallback, std::string peer, bool allow)
      : primary_(std::move(primary)), fallback_(std::move(fallback)), peer_(std::move(peer)),
        allow_(allow) {}

  absl::StatusOr<ElementResult> GetElement(const ElementRequest& request) override {
    if (switched_.load()) return fallback_->GetElement(request);
    auto r = primary_->GetElement(request);
    if (r.ok()) {
      worked_ = true;
      return r;
    }
    bool transport_failure =
        absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status());
    if (worked_.load() || !transport_failure) return r;
    if (!allow_) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach worker ", peer_, " over ", primary_->protocol(),
          " and fallback to ", fallback_->protocol(), " is disabled: ", r.status().message()));
    }
    if (!switched_.exchange(true)) {
      spdlog::warn("sluice client: {} to worker {} failed ({}); falling back to {}",
                   primary_->protocol(), peer_, std::string(r.status().message()),
                   fallback_->protocol());
    }
    return fallback_->GetElement(request);
  }
  void Cancel() override {
    primary_->Cancel();
    fallback_->Cancel();
  }
  std::string protocol() const override {
    return switched_.load() ? fallback_->protocol() : primary_->protocol();
  }

 private:
  std::unique_ptr<ElementTransport> primary_, fallback_;
  const std::string peer_;
  const bool allow_;
  std::atomic<bool> switched_{false}, worked_{false};
};

}  // namespace

std::unique_ptr<ElementTransport> MakeFallbackTransport(std::unique_ptr<ElementTransport> primary,
                                                       std::unique_ptr<ElementTransport> fallback,
                                                       std::string peer, bool allow_fallback) {
  return std::unique_ptr<ElementTransport>(new FallbackTransport(
      std::move(primary), std::move(fallback), std::move(peer), allow_fallback));
}

namespace internal {
absl::StatusOr<std::unique_ptr<ElementTransport>> MakeUcxElementTransport(
    const std::string& address, const std::string& auth_token, int64_t max_element_bytes);
}  // namespace internal

absl::StatusOr<std::unique_ptr<ElementTransport>> MakeUcxElementTransport(
    const std::string& address, const std::string& auth_token, int64_t max_element_bytes) {
  return internal::MakeUcxElementTransport(address, auth_token, max_element_bytes);
}

absl::StatusOr<std::unique_ptr<ElementTransport>> MakeGrpcElementTransport(
    const std::string& address, const ClientSecurity& security, int64_t max_element_bytes) {
  auto parsed = internal::ParseServiceAddress(address);
  if (!parsed.ok()) return parsed.status();
  if (max_element_bytes <= 0) return absl::InvalidArgumentError("max_element_bytes must be > 0");
  // The response carries one frame plus a few fields.
  const int max_receive = static_cast<int>(
      std::min<int64_t>(max_element_bytes + 4096, internal::kMaxGrpcMessageBytes));
  auto channel = internal::MakeSecureChannel(*parsed, security, max_receive);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<ElementTransport>(
      new GrpcElementTransport(*parsed, *std::move(channel)));
}

}  // namespace sluice
