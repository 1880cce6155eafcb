// gRPC edges shared by the dispatcher, workers and clients: status
// conversion, address parsing, channel setup. Internal.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/service.pb.h"
#include "grpcpp/grpcpp.h"
#include "sluice/rpc/security.h"

namespace sluice::internal {

// Largest message on the wire (an encoded element plus framing).
inline constexpr int kMaxGrpcMessageBytes = 2047 * 1024 * 1024;

grpc::Status ToGrpcStatus(const absl::Status& s);

// A status carried inside a message (per-task and per-iteration errors).
proto::StatusProto ToProto(const absl::Status& s);
absl::Status FromProto(const proto::StatusProto& p);
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view what);

// Accepts "grpc://host:port" or "host:port" (host may be a name, an IPv4
// address or a bracketed IPv6 address; port 1..65535) and returns
// "host:port". Anything else is InvalidArgument naming the input.
absl::StatusOr<std::string> ParseServiceAddress(const std::string& address);

// True for a host that names no peer: "", 0.0.0.0, ::, [::].
bool IsWildcardHost(absl::string_view host);

// A "host:port" another process can dial (ParseServiceAddress's syntax,
// without a scheme, and not a wildcard host). InvalidArgument naming
// `what` (the field) otherwise.
absl::Status ValidateDialableAddress(const std::string& address, absl::string_view what);

// Opens a TCP connection to "host:port" within `timeout` and closes it at
// once: something listens there. Unavailable naming the address and the
// reason otherwise.
absl::Status ProbeTcp(const std::string& host_port, absl::Duration timeout);

// Routes libprotobuf's and gRPC's own log lines through spdlog, so that
// they follow --log_format (a JSON log stays one JSON object per line).
// Process-wide and idempotent; the servers and the client call it.
void RouteLibraryLogs();

// After a server failed to listen on bind_address:port: FailedPrecondition
// saying that another process serves the port when that is why (every
// sluice server turns SO_REUSEPORT off, so two cannot share a port), else
// Unavailable. `who` names the server.
absl::Status ListenError(absl::string_view who, const std::string& bind_address, int port);

// A channel with sluice's message-size limits and keepalive settings.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& host_port);

// As MakeChannel, over TLS when security.tls is enabled, and sending
// security.auth_token (if any) with every call. InvalidArgument when a TLS
// file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeSecureChannel(
    const std::string& host_port, const ClientSecurity& security,
    int max_receive_bytes = kMaxGrpcMessageBytes);

// Applies sluice's settings to a server being built: requests larger than
// `max_receive_bytes` are refused by gRPC with ResourceExhausted, and
// SO_REUSEPORT is off, so that a second server on a port another process
// serves fails to start instead of splitting its connections.
void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            int max_receive_bytes = kMaxGrpcMessageBytes);

// Server credentials: insecure when `tls` is not enabled; else TLS with
// cert_file/key_file, and mutual TLS (client certificates required and
// verified) when ca_file is set. `who` names the server in errors.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& tls, absl::string_view who);

// The token travels as "authorization: Bearer <token>" call metadata.
inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr char kAuthScheme[] = "Bearer ";

// The per-RPC check of a service that requires `expected` (empty: no
// auth). Every RPC handler of an authenticated service calls it first; a
// service that must stay open (grpc.health.v1) simply does not.
// Unauthenticated, naming `who`, when the call lacks the token.
grpc::Status CheckAuthToken(const grpc::ServerContextBase& ctx, const std::string& expected,
                            absl::string_view who);

// Keeps the channels of calls made on gRPC's callback API alive until the
// last such call is destroyed. A call's ClientContext holds a reference to
// its channel, and the last reference to a channel must not be dropped on
// a gRPC callback thread: gRPC 1.51 then shuts down and joins that
// thread's own completion queue from within it, the join fails, and the
// queue is freed under its other threads (a crash: a double free under
// ASan, SIGSEGV in grpc_completion_queue_next otherwise). So whoever owns
// the channels gives each call a token from Hold(), destroyed after the
// call's context (declare it before the context), and calls WaitForAll()
// before dropping the channels; the destructor does too.
class CallbackCallGuard {
 public:
  CallbackCallGuard() = default;
  ~CallbackCallGuard() { WaitForAll(); }
  CallbackCallGuard(const CallbackCallGuard&) = delete;
  CallbackCallGuard& operator=(const CallbackCallGuard&) = delete;

  // A token for one call, from any thread. A call made while another's
  // token is held (from its callback: a chain of calls) is waited for too,
  // also when WaitForAll is already waiting.
  std::shared_ptr<void> Hold() {
    {
      absl::MutexLock l(&state_->mu);
      ++state_->calls;
    }
    // The deleter shares the state: it may still be unlocking when the
    // waiter, seeing no calls, destroys the guard.
    return std::shared_ptr<void>(nullptr, [state = state_](void*) {
      absl::MutexLock l(&state->mu);
      --state->calls;
    });
  }

  // Returns once no token is held.
  void WaitForAll() {
    absl::MutexLock l(&state_->mu);
    state_->mu.Await(absl::Condition(
        +[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->calls == 0; }, state_.get()));
  }

 private:
  struct State {
    absl::Mutex mu;
    int64_t calls ABSL_GUARDED_BY(mu) = 0;
  };
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Deadline helper for client contexts.
inline void SetTimeout(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

}  // namespace sluice::internal
