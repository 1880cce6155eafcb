// gRPC edges shared by the dispatcher, workers and clients: status
// conversion, address parsing, channel setup. Internal.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/service.pb.h"
#include "grpcpp/grpcpp.h"

namespace sluice::internal {

grpc::Status ToGrpcStatus(const absl::Status& s);

// A status carried inside a message (per-task and per-iteration errors).
proto::StatusProto ToProto(const absl::Status& s);
absl::Status FromProto(const proto::StatusProto& p);
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view what);

// Accepts "grpc://host:port" or "host:port" (host may be a name, an IPv4
// address or a bracketed IPv6 address; port 1..65535) and returns
// "host:port". Anything else is InvalidArgument naming the input.
absl::StatusOr<std::string> ParseServiceAddress(const std::string& address);

// A channel with sluice's message-size limits and keepalive settings.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& host_port);

// Applies sluice's limits to a server being built.
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

// Deadline helper for client contexts.
inline void SetTimeout(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

// Largest message on the wire (an encoded element plus framing).
inline constexpr int kMaxGrpcMessageBytes = 2047 * 1024 * 1024;

}  // namespace sluice::internal
