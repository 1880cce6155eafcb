// Security settings shared by the dispatcher, workers and clients: TLS for
// every gRPC connection and a shared-secret token that authenticates peers
// on both planes. docs/security.md has the threat model.
//
//   sluice::TlsConfig tls{"server.pem", "server.key", "ca.pem"};  // mutual TLS
//   auto token = sluice::ReadAuthTokenFile("/etc/sluice/token");
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace sluice {

// PEM files. All empty: plain-text gRPC. A server (dispatcher, worker)
// needs cert_file and key_file; with ca_file set it also requires every
// client to present a certificate signed by that CA (mutual TLS). A client
// (worker -> dispatcher, trainer -> dispatcher and workers) verifies the
// server against ca_file (empty: the system roots) and presents
// cert_file/key_file when set. The server's certificate must name the
// address clients dial (subjectAltName, e.g. IP:10.0.0.5 or DNS:host).
struct TlsConfig {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// What a client presents to the service's gRPC servers and UCX listeners.
// An empty auth_token sends none.
struct ClientSecurity {
  TlsConfig tls;
  std::string auth_token;
};

// Reads a shared-secret token from `path`: trailing newlines (\n, \r\n) are
// stripped; an unreadable or empty file, or a token that is not printable
// ASCII without spaces (it travels as gRPC metadata), is an error naming
// the file.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

// Default bounds on one gRPC request the dispatcher accepts
// (DispatcherConfig::max_request_bytes), on a dataset definition it
// registers (max_dataset_def_bytes: FromTensors pipelines carry their
// tensors, so this is generous), and on one request a worker accepts
// (WorkerConfig::max_request_bytes; its requests are small).
inline constexpr int64_t kDefaultMaxRequestBytes = int64_t{256} << 20;
inline constexpr int64_t kDefaultMaxDatasetDefBytes = int64_t{192} << 20;
inline constexpr int64_t kDefaultWorkerMaxRequestBytes = int64_t{4} << 20;

// Default bound on one element reply a client accepts, on either data path
// (DistributeOptions::max_element_bytes; the gRPC message limit). A UCX
// reply claiming more is refused with ResourceExhausted before anything is
// allocated for it.
inline constexpr int64_t kDefaultMaxElementBytes = int64_t{2047} << 20;

// Tokens longer than this are refused (they travel in every UCX request).
inline constexpr size_t kMaxAuthTokenBytes = 512;

}  // namespace sluice
