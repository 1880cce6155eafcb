// Helpers of the service tests that need files: a scratch directory, and a
// throwaway PKI for TLS tests made with the openssl CLI (Debian package
// openssl).
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sluice/rpc/security.h"

namespace sluice_test {

// A scratch directory under ::testing::TempDir(), removed with everything
// in it when this goes out of scope.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir();
    if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
    tmpl += "sluice_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A throwaway PKI: a CA, a server certificate for 127.0.0.1/localhost and a
// client certificate it signed, and a client certificate from another CA.
struct Pki {
  std::string dir;
  sluice::TlsConfig server, client, rogue_client;
};

inline absl::Status MakePki(const std::string& dir, Pki* pki) {
  // One subshell, so that `set -e` and the log redirection cover every step.
  const std::string script = absl::StrCat(
      "(set -e; cd '", dir, "'; ",
      "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out $1; }; ",
      "ca() { key $1.key; openssl req -x509 -new -key $1.key -out $1.pem -days 2 "
      "-subj /CN=$1; }; ",
      "cert() { key $1.key; openssl req -new -key $1.key -out $1.csr -subj /CN=$1; "
      "printf \"$3\" > $1.ext; openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key "
      "-CAcreateserial -out $1.pem -days 2 -extfile $1.ext; }; ",
      "ca ca; ca rogue_ca; ",
      "cert server ca 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n'; ",
      "cert client ca 'basicConstraints=CA:FALSE\\n'; ",
      "cert rogue_client rogue_ca 'basicConstraints=CA:FALSE\\n'; ",
      ") > '", dir, "/openssl.log' 2>&1");
  int rc = std::system(script.c_str());
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("openssl failed (rc ", rc, "); see ", dir,
                                            "/openssl.log (is the openssl package installed?)"));
  }
  auto f = [&](const std::string& name) { return absl::StrCat(dir, "/", name); };
  pki->dir = dir;
  pki->server = {f("server.pem"), f("server.key"), f("ca.pem")};
  pki->client = {f("client.pem"), f("client.key"), f("ca.pem")};
  pki->rogue_client = {f("rogue_client.pem"), f("rogue_client.key"), f("ca.pem")};
  return absl::OkStatus();
}

}  // namespace sluice_test
