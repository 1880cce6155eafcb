// The data transfer protocols, by name: how a client connects to a worker
// (ElementTransport) and how a worker serves (ElementServer). Workers and
// clients choose a protocol by the name in WorkerConfig /
// DistributeOptions::data_transfer_protocol, and nothing else in sluice
// compares protocol names. Built in: "grpc" (the baseline; every worker
// serves it, so it is every client's fallback) and "ucx".
//
// Like tf.data service's DataTransferServer/DataTransferClient registry and
// Arrow Flight's TransportRegistry.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/rpc/security.h"
#include "sluice/dataplane/element_server.h"
#include "sluice/dataplane/element_transport.h"

namespace sluice::internal {

// The protocol every worker serves and every client can fall back to.
inline constexpr char kGrpcProtocol[] = "grpc";

struct ElementTransportOptions {
  ClientSecurity security;
  int64_t max_element_bytes = kDefaultMaxElementBytes;
  // Small replies may come by copy when that saves round trips (UCX:
  // MakeUcxElementTransport's `eager`; gRPC always copies).
  EagerReplies eager_replies = EagerReplies::kAuto;
};

struct TransportProtocol {
  std::string name;
  // A transport to the worker that published `address` for this protocol.
  std::function<absl::StatusOr<std::unique_ptr<ElementTransport>>(
      const std::string& address, const ElementTransportOptions& options)>
      connect;
  // A server answering from options.source.
  std::function<absl::StatusOr<std::unique_ptr<ElementServer>>(ElementServerOptions options)>
      serve;
  // The client side registers receive memory and runs a progress thread,
  // which SetClientDataPlanePlacement places (element_transport.h).
  bool places_client_buffers = false;
  // Page-locks those receive buffers for CUDA (null: the protocol has
  // none; DistributeOptions::cuda_pinned).
  std::function<absl::Status()> pin_client_buffers_for_cuda;
  // What DistributeOptions::compression "AUTO" picks over this protocol.
  FrameCodec auto_compression = FrameCodec::kNone;
  // Lets a consumer waiting for replies run the client side's progress on
  // its own thread, so that a reply wakes the thread that wants it rather
  // than the protocol's thread, which then wakes the consumer: one pass,
  // sleeping up to `max_wait` or until `wake_fd` (an eventfd; -1: none) is
  // written; or, while another thread progresses, a wait as long for
  // `wake_fd` or for that thread to let go. True when it did either (look
  // at the state again, and drive again); false when it could do neither
  // (no wake_fd, nothing to drive): wait as usual, the callbacks run
  // elsewhere. Null: the protocol has no such thing.
  std::function<bool(absl::Duration max_wait, int wake_fd)> drive_client;
};

// Adds a protocol; AlreadyExists if its name is taken, InvalidArgument if
// it lacks a name or a factory.
absl::Status RegisterTransportProtocol(TransportProtocol protocol);

// The protocol named `name`, or InvalidArgument naming `who` and the
// registered protocols.
absl::StatusOr<const TransportProtocol*> FindTransportProtocol(absl::string_view name,
                                                              absl::string_view who);

// The registered names, sorted.
std::vector<std::string> TransportProtocolNames();

// The UCX protocol's drive_client (ucx_transport.cc): false before the
// process's UCX client exists.
bool DriveUcxClient(absl::Duration max_wait, int wake_fd);

// The gRPC server of the built-in "grpc" protocol (grpc_server.cc).
absl::StatusOr<std::unique_ptr<ElementServer>> StartGrpcElementServer(
    ElementServerOptions options);

}  // namespace sluice::internal
