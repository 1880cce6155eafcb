// The gRPC data path: one GetElement RPC per element, on gRPC's callback
// API (no thread waits on a call); the response's frame bytes are decoded in
// place (the Tensors view the received buffer).
#include <atomic>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rpc/service.grpc.pb.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/core/frame.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/transport_registry.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// One GetElement call in flight: its context and messages live until the
// callback ran.
struct GrpcCall {
  explicit GrpcCall(std::shared_ptr<void> hold) : hold(std::move(hold)) {}
  // Destroyed last (declared first), after the context and its channel
  // reference: see internal::CallbackCallGuard.
  std::shared_ptr<void> hold;
  grpc::ClientContext ctx;
  proto::GetElementRequest req;
  proto::GetElementResponse resp;
  ElementCallback done;
};

class GrpcElementTransport final : public ElementTransport {
 public:
  GrpcElementTransport(std::string address, std::shared_ptr<grpc::Channel> channel,
                       int64_t max_element_bytes)
      : state_(std::make_shared<State>()),
        stub_(proto::ElementService::NewStub(std::move(channel))) {
    state_->address = std::move(address);
    state_->max_element_bytes = static_cast<uint64_t>(max_element_bytes);
  }

  // Cancels what is in flight and waits until every call's callback ran
  // and the call is destroyed (internal::CallbackCallGuard), so that the
  // stub's channel outlives every call's context.
  ~GrpcElementTransport() override {
    Cancel();
    calls_.WaitForAll();
  }

  // gRPC's callback API: the reply completes on one of gRPC's threads.
  void GetElementAsync(const ElementRequest& request, ElementCallback done) override {
    auto call = std::make_shared<GrpcCall>(calls_.Hold());
    // The worker answers within `wait`; allow for transfer time on top.
    internal::SetTimeout(&call->ctx, request.wait + request.transfer_allowance);
    proto::GetElementRequest& req = call->req;
    req.set_task_id(request.task_id);
    req.set_consumer_index(request.consumer_index);
    req.set_round(request.round);
    req.set_wait_ms(absl::ToInt64Milliseconds(request.wait));
    req.set_client_id(request.client_id);
    req.set_max_outstanding(request.max_outstanding);
    req.set_shared_job(request.shared_job);
    req.set_delivered_seq(request.delivered_seq);
    req.set_resend(request.resend);
    req.set_leaving(request.leaving);
    req.set_max_elements(std::clamp<int64_t>(request.max_elements, 1, kMaxGrpcBatchElements));
    req.set_max_bytes(std::clamp<int64_t>(request.max_bytes, 0, kMaxGrpcBatchBytes));
    req.set_compression(static_cast<int>(request.compression));
    for (const SplitAck& a : request.acks) {
      req.add_ack_split_ids(a.split_id);
      req.add_ack_counts(a.count);
    }
    call->done = std::move(done);
    bool cancelled;
    {
      absl::MutexLock l(&state_->mu);
      cancelled = state_->cancelled;
      if (!cancelled) state_->active.insert(call.get());
    }
    if (cancelled) return call->done(absl::CancelledError("transport cancelled"));
    stub_->async()->GetElement(&call->ctx, &call->req, &call->resp,
                               [state = state_, call](grpc::Status s) { Finish(*state, *call, s); });
  }

  void Cancel() override {
    absl::MutexLock l(&state_->mu);
    state_->cancelled = true;
    for (GrpcCall* c : state_->active) c->ctx.TryCancel();
  }

  std::string protocol() const override { return internal::kGrpcProtocol; }

 private:
  // Shared with the callbacks, so that it outlives the last of them.
  struct State {
    std::string address;
    uint64_t max_element_bytes = UINT64_MAX;  // also once decompressed
    absl::Mutex mu;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    std::set<GrpcCall*> active ABSL_GUARDED_BY(mu);
  };

  static void Finish(State& state, GrpcCall& call, const grpc::Status& s)
      ABSL_LOCKS_EXCLUDED(state.mu) {
    bool cancelled;
    {
      absl::MutexLock l(&state.mu);
      cancelled = state.cancelled;
    }
    ElementCallback done = std::move(call.done);
    if (cancelled) {
      done(absl::CancelledError("transport cancelled"));
    } else if (!s.ok()) {
      done(internal::FromGrpcStatus(s, absl::StrCat("GetElement from worker ", state.address)));
    } else {
      done(Decode(state.address, state.max_element_bytes, call.resp));
    }
    absl::MutexLock l(&state.mu);
    state.active.erase(&call);
  }

  static absl::StatusOr<ElementResult> Decode(const std::string& address,
                                              uint64_t max_element_bytes,
                                              proto::GetElementResponse& resp) {
    ElementResult out;
    out.end_of_sequence = resp.end_of_sequence();
    out.not_ready = resp.not_ready();
    if (out.end_of_sequence) out.seq = resp.seq();
    if (out.end_of_sequence || out.not_ready) return out;
    out.resent = resp.resent();
    if (resp.more_size() >= kMaxGrpcBatchElements) {
      return absl::DataLossError(absl::StrCat("worker ", address, " sent a batch of ",
                                              resp.more_size() + 1, " elements; at most ",
                                              kMaxGrpcBatchElements, " were asked for"));
    }
    // The elements view the response's bytes (moved out once, kept alive
    // by the tensors).
    auto owned = std::make_shared<proto::GetElementResponse>(std::move(resp));
    auto add = [&](const std::string& frame, const auto& m) -> absl::Status {
      out.bytes += frame.size();
      auto decoded = DecodeFrame(reinterpret_cast<const uint8_t*>(frame.data()), frame.size(),
                                 owned, max_element_bytes);
      if (absl::IsResourceExhausted(decoded.status())) return decoded.status();
      if (!decoded.ok()) {
        return absl::DataLossError(absl::StrCat("worker ", address, " sent a bad element: ",
                                                decoded.status().message()));
      }
      out.elements.push_back(std::move(decoded->element));
      SplitPosition pos;
      pos.split_id = m.split_id();
      pos.index = m.split_index();
      if (m.has_key()) pos.key = m.key();
      pos.epoch = m.split_epoch();
      pos.begin = m.split_begin();
      pos.end = m.split_end();
      out.positions.push_back(pos);
      return absl::OkStatus();
    };
    // The first element in the response's own fields, the others in `more`
    // (the same field names).
    SLUICE_RETURN_IF_ERROR(add(owned->frame(), *owned));
    for (const proto::BatchedElement& e : owned->more()) {
      SLUICE_RETURN_IF_ERROR(add(e.frame(), e));
    }
    out.seq = owned->seq();
    return out;
  }

  std::shared_ptr<State> state_;
  std::unique_ptr<proto::ElementService::Stub> stub_;
  internal::CallbackCallGuard calls_;  // after stub_: waited for before the channel goes
};

}  // namespace

absl::StatusOr<std::unique_ptr<ElementTransport>> MakeGrpcElementTransport(
    const std::string& address, const ClientSecurity& security, int64_t max_element_bytes) {
  auto parsed = internal::ParseServiceAddress(address);
  if (!parsed.ok()) return parsed.status();
  if (max_element_bytes <= 0) return absl::InvalidArgumentError("max_element_bytes must be > 0");
  // The response carries one frame, a batch of at most kMaxGrpcBatchBytes
  // of frames after it, and a few fields per element.
  const int max_receive = static_cast<int>(std::min<int64_t>(
      max_element_bytes + kMaxGrpcBatchBytes + 64 * kMaxGrpcBatchElements + 4096,
      internal::kMaxGrpcMessageBytes));
  auto channel = internal::MakeSecureChannel(*parsed, security, max_receive);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<ElementTransport>(
      new GrpcElementTransport(*parsed, *std::move(channel), max_element_bytes));
}

}  // namespace sluice
