#include "sluice/core/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <list>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace sluice::internal {

// --- text format ------------------------------------------------------------

bool MetricsWriter::ValidName(absl::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
              (allow_colon && c == ':') ||
              (i > 0 && absl::ascii_isdigit(static_cast<unsigned char>(c)));
    if (!ok) return false;
  }
  return true;
}

namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integers (counters, most gauges) print exactly up to 2^53.
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  return absl::StrCat(v);
}

// HELP text: escape \ and newline. Label values: also ".
void AppendEscaped(std::string* out, absl::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (quote && c == '"') {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

void MetricsWriter::Family(absl::string_view name, MetricType type, absl::string_view help) {
  family_ = ValidName(name) ? std::string(name) : "invalid_metric_name";
  absl::StrAppend(&out_, "# HELP ", family_, " ");
  AppendEscaped(&out_, help, false);
  absl::StrAppend(&out_, "\n# TYPE ", family_, " ",
                  type == MetricType::kCounter ? "counter" : "gauge", "\n");
}

void MetricsWriter::Sample(double value, const Labels& labels) {
  out_.append(family_);
  if (!labels.empty()) {
    out_.push_back('{');
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!first) out_.push_back(',');
      first = false;
      out_.append(ValidName(k, false) ? k : "invalid_label");
      out_.append("=\"");
      AppendEscaped(&out_, v, true);
      out_.push_back('"');
    }
    out_.push_back('}');
  }
  absl::StrAppend(&out_, " ", FormatValue(value), "\n");
}

void MetricsWriter::Counter(absl::string_view name, absl::string_view help, double value) {
  Family(name, MetricType::kCounter, help);
  Sample(value);
}

void MetricsWriter::Gauge(absl::string_view name, absl::string_view help, double value) {
  Family(name, MetricType::kGauge, help);
  Sample(value);
}

// --- HTTP server ------------------------------------------------------------

namespace {

struct Connection {
  int fd = -1;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool responding = false;  // the response is in `out`
  absl::Time deadline;
};

std::string Response(int code, absl::string_view reason, absl::string_view content_type,
                     const std::string& body, bool head) {
  std::string r = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                               "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n");
  if (code == 405) r.append("Allow: GET, HEAD\r\n");
  r.append("\r\n");
  if (!head) r.append(body);
  return r;
}

std::string PlainResponse(int code, absl::string_view reason, bool head = false) {
  return Response(code, reason, "text/plain; charset=utf-8", absl::StrCat(reason, "\n"), head);
}

}  // namespace

struct MetricsHttpServer::Impl {
  Render render;
  Options options;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // a pipe: Stop() writes, the loop wakes
  int port = 0;
  std::thread thread;
  bool stopped = false;

  ~Impl() {
    for (int fd : {listen_fd, wake[0], wake[1]}) {
      if (fd >= 0) close(fd);
    }
  }

  // The response to one complete request head.
  std::string Handle(absl::string_view head) {
    size_t eol = head.find_first_of("\r\n");
    absl::string_view line = head.substr(0, eol);
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || parts[0].empty() || parts[1].empty() ||
        !absl::StartsWith(parts[2], "HTTP/1.")) {
      return PlainResponse(400, "Bad Request");
    }
    bool is_head = parts[0] == "HEAD";
    if (parts[0] != "GET" && !is_head) return PlainResponse(405, "Method Not Allowed");
    absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    if (path != "/metrics") return PlainResponse(404, "Not Found", is_head);
    return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render(), is_head);
  }

  // Reads what is available; false when the connection should close now.
  bool OnReadable(Connection& c) {
    char buf[4096];
    while (true) {
      ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (c.in.size() > options.max_request_bytes) break;
        continue;
      }
      if (n == 0) return !c.in.empty() && Parse(c, /*eof=*/true);
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Parse(c, false);
      return false;
    }
    c.out = PlainResponse(431, "Request Header Fields Too Large");
    c.responding = true;
    return true;
  }

  // Answers once the request head is complete. With eof and no complete
  // head the request is malformed.
  bool Parse(Connection& c, bool eof) {
    size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) end = c.in.find("\n\n");
    if (end == std::string::npos) {
      if (c.in.size() > options.max_request_bytes) {
        c.out = PlainResponse(431, "Request Header Fields Too Large");
      } else if (eof) {
        c.out = PlainResponse(400, "Bad Request");
      } else {
        return true;  // wait for more
      }
    } else {
      c.out = Handle(absl::string_view(c.in).substr(0, end));
    }
    c.responding = true;
    return true;
  }

  // Writes what the socket takes; false once done or failed.
  bool OnWritable(Connection& c) {
    while (c.sent < c.out.size()) {
      ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return true;
      } else {
        return false;
      }
    }
    shutdown(c.fd, SHUT_WR);
    return false;
  }

  void Loop() {
    std::list<Connection> conns;
    auto close_conn = [&](std::list<Connection>::iterator it) {
      close(it->fd);
      return conns.erase(it);
    };
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      const bool accepting = conns.size() < options.max_connections;
      fds.push_back({listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0});
      absl::Time now = absl::Now();
      absl::Time next = now + absl::Seconds(1);
      for (const Connection& c : conns) {
        fds.push_back({c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
        next = std::min(next, c.deadline);
      }
      int timeout_ms = static_cast<int>(
          std::clamp<int64_t>(absl::ToInt64Milliseconds(next - now) + 1, 0, 1000));
      int n = poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        spdlog::error("metrics: poll failed: {}", strerror(errno));
        break;
      }
      if (fds[0].revents != 0) break;  // Stop()
      now = absl::Now();
      size_t i = 2;
      for (auto it = conns.begin(); it != conns.end(); ++i) {
        short ev = n > 0 ? fds[i].revents : 0;
        bool keep = true;
        if (ev & (POLLERR | POLLNVAL)) {
          keep = false;
        } else if (!it->responding && (ev & (POLLIN | POLLHUP))) {
          keep = OnReadable(*it);
        }
        if (keep && it->responding) keep = OnWritable(*it);
        if (keep && now > it->deadline) keep = false;
        it = keep ? std::next(it) : close_conn(it);
      }
      if (n > 0 && (fds[1].revents & POLLIN)) {
        while (conns.size() < options.max_connections) {
          int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;  // EAGAIN, or an aborted connection
          Connection c;
          c.fd = fd;
          c.deadline = now + options.io_timeout;
          conns.push_back(std::move(c));
        }
      }
    }
    while (!conns.empty()) close_conn(conns.begin());
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& bind_address, int port, Render render, Options options) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is not in 0..65535"));
  }
  if (options.max_connections == 0 || options.max_request_bytes == 0) {
    return absl::InvalidArgumentError("metrics server: max_connections and max_request_bytes must be > 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  impl->options = options;
  std::string host = bind_address;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int gai = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat("metrics server: cannot resolve bind address '",
                                                   bind_address, "': ", gai_strerror(gai)));
  }
  std::string error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      impl->listen_fd = fd;
      break;
    }
    error = strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  if (impl->listen_fd < 0) {
    return absl::UnavailableError(absl::StrCat("metrics server cannot listen on ", bind_address,
                                               ":", port, ": ", error));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return absl::InternalError(absl::StrCat("metrics server: getsockname: ", strerror(errno)));
  }
  impl->port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (pipe2(impl->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("metrics server: pipe: ", strerror(errno)));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

int MetricsHttpServer::port() const { return impl_->port; }

void MetricsHttpServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  char b = 1;
  while (write(impl_->wake[1], &b, 1) < 0 && errno == EINTR) {
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  // Refuse new connections at once (an open listener would still queue them).
  close(impl_->listen_fd);
  impl_->listen_fd = -1;
}

}  // namespace sluice::internal
