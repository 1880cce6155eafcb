#include "sluice/control/grpc_util.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& host_port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  // Reconnect quickly after a peer restarts instead of backing off for up
  // to two minutes (gRPC's default).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  return grpc::CreateCustomChannel(host_port, grpc::InsecureChannelCredentials(), args);
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  builder->SetMaxSendMessageSize(kMaxGrpcMessageBytes);
}

}  // namespace sluice::internal
