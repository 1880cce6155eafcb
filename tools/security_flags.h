// The security flags shared by sluice-dispatcher and sluice-worker
// (docs/security.md): --tls_cert, --tls_key, --tls_ca, --auth_token_file,
// --max_request_bytes.
#pragma once

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "sluice/rpc/security.h"

namespace sluice::tools {

inline void AddSecurityFlags(CLI::App& app, TlsConfig* tls, std::string* token_file,
                             int64_t* max_request_bytes) {
  app.add_option("--tls_cert", tls->cert_file,
                 "PEM certificate: serve gRPC over TLS (with --tls_key); also the client "
                 "certificate this process presents");
  app.add_option("--tls_key", tls->key_file, "PEM private key of --tls_cert");
  app.add_option("--tls_ca", tls->ca_file,
                 "PEM CA: verify peers' certificates; a server with it requires client "
                 "certificates (mutual TLS)");
  app.add_option("--auth_token_file", *token_file,
                 "file holding the service's shared secret (trailing newline stripped); every "
                 "peer must present it");
  app.add_option("--max_request_bytes", *max_request_bytes,
                 "largest gRPC request this server accepts")
      ->capture_default_str();
}

// Reads --auth_token_file into `token` (nothing when `path` is empty);
// prints the error and returns false on failure.
inline bool LoadAuthToken(const std::string& path, std::string* token) {
  if (path.empty()) return true;
  auto t = ReadAuthTokenFile(path);
  if (!t.ok()) {
    std::fprintf(stderr, "error: --auth_token_file: %s\n", std::string(t.status().message()).c_str());
    return false;
  }
  *token = *std::move(t);
  return true;
}

}  // namespace sluice::tools
