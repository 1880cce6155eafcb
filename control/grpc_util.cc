#include "sluice/control/grpc_util.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/client_interceptor.h"
#include "sluice/control/security_internal.h"

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

namespace {

grpc::ChannelArguments ChannelArgs(int max_receive_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_receive_bytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  // Reconnect quickly after a peer restarts instead of backing off for up
  // to two minutes (gRPC's default).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
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

grpc::Status CheckAuthToken(const grpc::ServerContext& ctx, const std::string& expected,
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
