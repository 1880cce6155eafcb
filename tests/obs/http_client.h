// A blocking HTTP/1.x client for tests: one request per connection, read
// to EOF. Reads and writes time out after 30 s (a hang guard only).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice_test {

// Sends `raw` to 127.0.0.1:port (then half-closes when `half_close`) and
// returns everything the server wrote until it closed.
inline absl::StatusOr<std::string> RawHttp(int port, const std::string& raw,
                                           bool half_close = false) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::string e = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port, ": ", e));
  }
  size_t off = 0;
  while (off < raw.size()) {
    ssize_t n = send(fd, raw.data() + off, raw.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer (431) and close before reading it all
    off += static_cast<size_t>(n);
  }
  if (half_close) shutdown(fd, SHUT_WR);
  std::string out;
  char buf[8192];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      bool timed_out = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      close(fd);
      if (timed_out) return absl::DeadlineExceededError("no reply within 30 s");
      return out;  // EOF, or a reset after the reply
    }
  }
}

struct HttpReply {
  int code = 0;
  std::string head, body;
};

inline absl::StatusOr<HttpReply> ParseHttpReply(const std::string& raw) {
  size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.compare(0, 9, "HTTP/1.1 ") != 0 || raw.size() < 12) {
    return absl::DataLossError(absl::StrCat("not an HTTP reply: '", raw.substr(0, 80), "'"));
  }
  HttpReply r;
  if (!absl::SimpleAtoi(raw.substr(9, 3), &r.code)) return absl::DataLossError("bad status");
  r.head = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

// GET `target` (path and query) from 127.0.0.1:port.
inline absl::StatusOr<HttpReply> HttpGet(int port, const std::string& target) {
  auto raw = RawHttp(port, absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: 127.0.0.1:", port,
                                        "\r\nConnection: close\r\n\r\n"));
  if (!raw.ok()) return raw.status();
  return ParseHttpReply(*raw);
}

// The value of the unlabelled sample `name` in a Prometheus exposition,
// or -1 when it has none.
inline double SampleValue(const std::string& text, const std::string& name) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.compare(0, name.size() + 1, name + " ") == 0) {
      double v = -1;
      if (absl::SimpleAtod(line.substr(name.size() + 1), &v)) return v;
    }
  }
  return -1;
}

}  // namespace sluice_test
