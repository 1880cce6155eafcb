#include "sluice/rpc/grpc_util.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/client_interceptor.h"
#include "google/protobuf/stubs/logging.h"
#include "grpc/support/log.h"
#include "sluice/rpc/security_internal.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

proto::StatusProto ToProto(const absl::Status& s) {
  proto::StatusProto p;
  p.set_code(static_cast<int>(s.code()));
  p.set_message(std::string(s.message()));
  return p;
}

absl::Status FromProto(const proto::StatusProto& p) {
  return absl::Status(static_cast<absl::StatusCode>(p.code()), p.message());
}

absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());
  // Transport failures say which call and peer failed; service errors pass
  // through unchanged so the caller sees the server's own message.
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(code, absl::StrCat(what, ": ", s.error_message()));
  }
  return absl::Status(code, s.error_message());
}

absl::StatusOr<std::string> ParseServiceAddress(const std::string& address) {
  std::string rest = address;
  constexpr absl::string_view kScheme = "grpc://";
  if (absl::string_view(rest).substr(0, kScheme.size()) == kScheme) rest = rest.substr(kScheme.size());
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed service address '", address, "': ", why,
                     "; expected grpc://HOST:PORT or HOST:PORT"));
  };
  if (rest.empty()) return bad("empty");
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no HOST:PORT");
  std::string host = rest.substr(0, colon);
  std::string port = rest.substr(colon + 1);
  if (host.front() == '[') {
    if (host.back() != ']' || host.size() < 3) return bad("unbalanced [IPv6] brackets");
  } else {
    for (char c : host) {
      bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
      if (!ok) return bad(absl::StrCat("invalid character '", std::string(1, c), "' in host"));
    }
  }
  int p = 0;
  if (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) return bad("port must be 1..65535");
  return absl::StrCat(host, ":", p);
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

absl::Status ValidateDialableAddress(const std::string& address, absl::string_view what) {
  if (absl::StartsWith(address, "grpc://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", address, "' must be HOST:PORT, without a scheme"));
  }
  auto parsed = ParseServiceAddress(address);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", parsed.status().message()));
  }
  if (IsWildcardHost(address.substr(0, address.rfind(':')))) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", address, "' names a wildcard host, which no peer can dial; give the host "
        "name or IP address peers reach this process at"));
  }
  return absl::OkStatus();
}

namespace {

// Splits "host:port" / "[v6]:port" (already validated) for getaddrinfo.
std::pair<std::string, std::string> SplitHostPort(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  std::string host = host_port.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return {host, colon == std::string::npos ? "" : host_port.substr(colon + 1)};
}

}  // namespace

absl::Status ProbeTcp(const std::string& host_port, absl::Duration timeout) {
  const auto [host, port] = SplitHostPort(host_port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host_port, ": ", gai_strerror(gai)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::string error = "no address";
  bool connected = false;
  for (addrinfo* a = res; a != nullptr && !connected; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          a->ai_protocol);
    if (fd < 0) {
      error = strerror(errno);
      continue;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
      rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 60000)));
      if (rc == 0) {
        error = "no answer within " + absl::FormatDuration(timeout);
        rc = -1;
      } else if (rc > 0) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        if (err != 0) error = strerror(err);
      } else {
        error = strerror(errno);
      }
    } else if (rc != 0) {
      error = strerror(errno);
    }
    connected = rc == 0;
    close(fd);
  }
  freeaddrinfo(res);
  if (connected) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("nothing answers at ", host_port, " (", error, ")"));
}

namespace {

void ProtobufLogToSpdlog(google::protobuf::LogLevel level, const char* file, int line,
                         const std::string& message) {
  const char* base = std::strrchr(file, '/');
  base = base == nullptr ? file : base + 1;
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      spdlog::info("libprotobuf {}:{}: {}", base, line, message);
      break;
    case google::protobuf::LOGLEVEL_WARNING:
      spdlog::warn("libprotobuf {}:{}: {}", base, line, message);
      break;
    default:
      spdlog::error("libprotobuf {}:{}: {}", base, line, message);
  }
}

void GrpcLogToSpdlog(gpr_log_func_args* args) {
  const char* base = std::strrchr(args->file, '/');
  base = base == nullptr ? args->file : base + 1;
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      spdlog::debug("grpc {}:{}: {}", base, args->line, args->message);
      break;
    case GPR_LOG_SEVERITY_INFO:
      spdlog::info("grpc {}:{}: {}", base, args->line, args->message);
      break;
    default:
      spdlog::error("grpc {}:{}: {}", base, args->line, args->message);
  }
}

}  // namespace

void RouteLibraryLogs() {
  static std::once_flag once;
  std::call_once(once, [] {
    google::protobuf::SetLogHandler(&ProtobufLogToSpdlog);
    gpr_set_log_function(&GrpcLogToSpdlog);
  });
}

absl::Status ListenError(absl::string_view who, const std::string& bind_address, int port) {
  const std::string listen = absl::StrCat(bind_address, ":", port);
  if (port > 0) {
    // Bind it ourselves (no SO_REUSEPORT) to learn why gRPC could not.
    const auto [host, port_s] = SplitHostPort(listen);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    bool in_use = false;
    if (getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res) == 0) {
      for (addrinfo* a = res; a != nullptr && !in_use; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        in_use = bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE;
        close(fd);
      }
      freeaddrinfo(res);
    }
    if (in_use) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " cannot listen on ", listen, ": port ", port,
          " is in use, another process serves it (an earlier ", who,
          " still running?). Stop it first, or choose another port"));
    }
  }
  return absl::UnavailableError(absl::StrCat(who, " cannot listen on ", listen,
                                             " (not a local address?)"));
}

namespace {

// gRPC completes a channel's connection attempt when some thread polls
// it. A client whose only gRPC call is a heartbeat that failed fast (the
// dispatcher was restarting) has no such thread: the connect to the new
// dispatcher then waited for gRPC's backup poller, which runs every 5 s by
// default -- the ~5 s stall of UCX clients (whose elements do not travel
// over gRPC) after a graceful dispatcher restart. Poll every 100 ms
// instead (a timer and a non-blocking epoll_wait; negligible). Set before
// gRPC initializes, which it does when the first channel or server is
// made; a value the user set is kept.
[[maybe_unused]] const bool kBackupPollSet = [] {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", /*overwrite=*/0);
  return true;
}();

constexpr int kMinConnectTimeoutMs = 5000;

grpc::ChannelArguments ChannelArgs(int max_receive_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_receive_bytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  // Reconnect quickly after a peer restarts instead of backing off for up
  // to two minutes (gRPC's default).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC also reads this as the minimum time one connection attempt may
  // take (TCP connect plus the TLS handshake) before it is abandoned. A
  // busy client process (a trainer, a UCX progress thread) can take longer
  // than the backoff to see its connect complete; with the 100 ms floor
  // every attempt was cut short and the channel never reconnected.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectTimeoutMs);
  return args;
}

// Adds the token to every call's initial metadata. (Call credentials would
// be the gRPC idiom, but gRPC drops them on insecure channels, and the
// token must work without TLS too.)
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::shared_ptr<const std::string> value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthMetadataKey, *value_);
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<const std::string> value_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token)
      : value_(std::make_shared<const std::string>(absl::StrCat(kAuthScheme, token))) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(value_);
  }

 private:
  std::shared_ptr<const std::string> value_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& host_port) {
  return grpc::CreateCustomChannel(host_port, grpc::InsecureChannelCredentials(),
                                   ChannelArgs(kMaxGrpcMessageBytes));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeSecureChannel(const std::string& host_port,
                                                                const ClientSecurity& security,
                                                                int max_receive_bytes) {
  absl::Status ts = ValidateAuthToken(security.auth_token, "client");
  if (!ts.ok()) return ts;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  const TlsConfig& tls = security.tls;
  if (tls.enabled()) {
    if (tls.cert_file.empty() != tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          "TLS client: set both cert_file and key_file (a client certificate for mutual TLS) "
          "or neither");
    }
    grpc::SslCredentialsOptions o;
    if (!tls.ca_file.empty()) {
      auto ca = ReadPemFile(tls.ca_file, "ca_file");
      if (!ca.ok()) return ca.status();
      o.pem_root_certs = *std::move(ca);
    }
    if (!tls.cert_file.empty()) {
      auto cert = ReadPemFile(tls.cert_file, "cert_file");
      if (!cert.ok()) return cert.status();
      auto key = ReadPemFile(tls.key_file, "key_file");
      if (!key.ok()) return key.status();
      o.pem_cert_chain = *std::move(cert);
      o.pem_private_key = *std::move(key);
    }
    creds = grpc::SslCredentials(o);
  }
  grpc::ChannelArguments args = ChannelArgs(max_receive_bytes);
  if (security.auth_token.empty()) return grpc::CreateCustomChannel(host_port, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> inter;
  inter.push_back(std::make_unique<TokenInterceptorFactory>(security.auth_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(host_port, creds, args,
                                                                 std::move(inter));
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder, int max_receive_bytes) {
  builder->SetMaxReceiveMessageSize(max_receive_bytes);
  builder->SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  // gRPC sets SO_REUSEPORT by default: a second server on the port would
  // start and take half of the new connections.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& tls, absl::string_view who) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " TLS: a server needs both cert_file and key_file (--tls_cert, --tls_key)"));
  }
  auto cert = ReadPemFile(tls.cert_file, "cert_file");
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(tls.key_file, "key_file");
  if (!key.ok()) return key.status();
  // With a CA, clients must present a certificate it signed (mutual TLS).
  grpc::SslServerCredentialsOptions o(
      tls.ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls.ca_file.empty()) {
    auto ca = ReadPemFile(tls.ca_file, "ca_file");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *std::move(ca);
  }
  o.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(o);
}

grpc::Status CheckAuthToken(const grpc::ServerContextBase& ctx, const std::string& expected,
                            absl::string_view who) {
  if (expected.empty()) return grpc::Status::OK;
  bool presented = false;
  bool match = false;
  auto range = ctx.client_metadata().equal_range(kAuthMetadataKey);
  for (auto it = range.first; it != range.second; ++it) {
    absl::string_view v(it->second.data(), it->second.size());
    if (!absl::StartsWith(v, kAuthScheme)) continue;
    presented = true;
    v.remove_prefix(sizeof(kAuthScheme) - 1);
    match |= ConstantTimeEquals(v, expected);
  }
  if (match) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, AuthRefusal(who, presented));
}

}  // namespace sluice::internal
