// A grpc.health.v1.Health/Check client for tests, through grpc's generic
// stub: no generated code for the health protos is needed.
//
// Wire format (proto3, grpc.health.v1):
//   HealthCheckRequest  { string service = 1; }   field 1, wire type 2 (tag 0x0a)
//   HealthCheckResponse { ServingStatus status = 1; }  field 1, varint (tag 0x08)
//   ServingStatus: 0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace sluice_test {

enum HealthStatus : int { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// Calls Check(service) on `host_port`; returns the response's status field.
// A gRPC error (for example NOT_FOUND for an unknown service name on grpc's
// default service) is returned as a Status.
inline absl::StatusOr<int> HealthCheck(const std::string& host_port,
                                       const std::string& service = "") {
  auto channel = grpc::CreateChannel(host_port, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  std::string request;
  if (!service.empty()) {
    if (service.size() > 127) return absl::InvalidArgumentError("service name too long");
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("Health/Check: ", status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  if (!resp.Dump(&slices).ok()) return absl::InternalError("cannot read the response");
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // An absent field is the default, UNKNOWN. Only field 1 is expected.
  int value = kUnknown;
  size_t i = 0;
  while (i < bytes.size()) {
    uint8_t tag = static_cast<uint8_t>(bytes[i++]);
    if (tag != 0x08) return absl::DataLossError(absl::StrCat("unexpected tag ", int{tag}));
    uint64_t v = 0;
    int shift = 0;
    while (i < bytes.size() && shift < 64) {
      uint8_t b = static_cast<uint8_t>(bytes[i++]);
      v |= uint64_t{b & 0x7fu} << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    value = static_cast<int>(v);
  }
  return value;
}

}  // namespace sluice_test
