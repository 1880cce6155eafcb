// The protocol registry, with the built-in grpc and ucx protocols
// registered on first use (no static initializers to be dropped by the
// linker from a static library).
#include "sluice/dataplane/transport_registry.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "sluice/dataplane/ucx_server.h"

namespace sluice::internal {
namespace {

struct Registry {
  absl::Mutex mu;
  // Entries are never removed, so pointers to them stay valid.
  std::map<std::string, std::unique_ptr<TransportProtocol>, std::less<>> protocols
      ABSL_GUARDED_BY(mu);
};

std::vector<std::string> NamesLocked(Registry& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu) {
  std::vector<std::string> names;
  for (const auto& [n, p] : r.protocols) names.push_back(n);
  return names;
}

void AddLocked(Registry& r, TransportProtocol p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu) {
  std::string name = p.name;
  r.protocols.emplace(std::move(name), std::make_unique<TransportProtocol>(std::move(p)));
}

Registry& TheRegistry() {
  static Registry* r = [] {
    auto* r = new Registry();
    absl::MutexLock l(&r->mu);
    TransportProtocol grpc;
    grpc.name = kGrpcProtocol;
    grpc.connect = [](const std::string& address, const ElementTransportOptions& o) {
      return MakeGrpcElementTransport(address, o.security, o.max_element_bytes);
    };
    grpc.serve = &StartGrpcElementServer;
    // gRPC copies every byte through protobuf and the kernel's TCP stack;
    // lz4 costs less cpu per byte than that and gives it back on
    // compressible elements (incompressible ones are sent as they are).
    grpc.auto_compression = FrameCodec::kLz4;
    AddLocked(*r, std::move(grpc));
    TransportProtocol ucx;
    ucx.name = "ucx";
    ucx.connect = [](const std::string& address, const ElementTransportOptions& o) {
      return MakeUcxElementTransport(address, o.security.auth_token, o.max_element_bytes,
                                     o.eager_replies);
    };
    ucx.serve = [](ElementServerOptions options) -> absl::StatusOr<std::unique_ptr<ElementServer>> {
      return UcxElementServer::Start(std::move(options));
    };
    ucx.places_client_buffers = true;
    ucx.pin_client_buffers_for_cuda = &PinUcxReceivePoolForCuda;
    ucx.drive_client = &DriveUcxClient;
    AddLocked(*r, std::move(ucx));
    return r;
  }();
  return *r;
}

}  // namespace

absl::Status RegisterTransportProtocol(TransportProtocol protocol) {
  if (protocol.name.empty() || !protocol.connect || !protocol.serve) {
    return absl::InvalidArgumentError(
        "a transfer protocol needs a name, a connect and a serve function");
  }
  Registry& r = TheRegistry();
  absl::MutexLock l(&r.mu);
  if (r.protocols.count(protocol.name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer protocol '", protocol.name, "' is already registered"));
  }
  AddLocked(r, std::move(protocol));
  return absl::OkStatus();
}

absl::StatusOr<const TransportProtocol*> FindTransportProtocol(absl::string_view name,
                                                              absl::string_view who) {
  Registry& r = TheRegistry();
  absl::MutexLock l(&r.mu);
  auto it = r.protocols.find(name);
  if (it != r.protocols.end()) return it->second.get();
  return absl::InvalidArgumentError(absl::StrCat(who, ": unknown data_transfer_protocol '", name,
                                                 "'; expected one of ",
                                                 absl::StrJoin(NamesLocked(r), ", ")));
}

std::vector<std::string> TransportProtocolNames() {
  Registry& r = TheRegistry();
  absl::MutexLock l(&r.mu);
  return NamesLocked(r);
}

}  // namespace sluice::internal
