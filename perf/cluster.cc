#include "perf/cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sluice/core/status.h"

namespace sluice::perf {

constexpr absl::Duration kWorkerStartTimeout = absl::Seconds(30);
constexpr absl::Duration kDispatcherStartTimeout = absl::Seconds(30);

std::string DispatcherProcess::address() const { return absl::StrCat("127.0.0.1:", port); }

absl::StatusOr<DispatcherProcess> StartDispatcherProcess(const std::string& binary,
                                                         const std::string& scratch_dir,
                                                         const std::string& name,
                                                         const std::vector<std::string>& extra_args,
                                                         const std::vector<std::pair<std::string, std::string>>& extra_env) {
  DispatcherProcess d;
  d.work_dir = absl::StrCat(scratch_dir, "/", name, "-journal");
  const std::string port_file = absl::StrCat(scratch_dir, "/", name, ".port");
  d.child = std::make_unique<ChildProcess>(name, absl::StrCat(scratch_dir, "/", name, ".log"));
  std::vector<std::string> args = {"--port", "0", "--port_file", port_file,
                                   "--fault_tolerant_mode", "--work_dir", d.work_dir,
                                   "--metrics_port", "0"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<std::pair<std::string, std::string>> env = {{"SLUICE_LOG_LEVEL", "info"}};
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  SLUICE_RETURN_IF_ERROR(d.child->Start(binary, args, env));
  SLUICE_ASSIGN_OR_RETURN(d.port, WaitForPortFile(*d.child, port_file, kDispatcherStartTimeout));
  // The metrics endpoint's port, from the line the dispatcher logs when it
  // starts serving ("metrics at http://HOST:PORT/metrics").
  const std::string log = d.child->LogTail(1 << 16);
  const size_t at = log.find("/metrics");
  const size_t colon = at == std::string::npos ? std::string::npos : log.rfind(':', at);
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(log.substr(colon + 1, at - colon - 1), &d.metrics_port)) {
    d.metrics_port = 0;
  }
  if (d.metrics_port == 0) {
    return absl::InternalError(
        absl::StrCat("the dispatcher did not log its metrics port: ", d.child->LogTail()));
  }
  return d;
}

std::map<std::string, double> ReadMetrics(int port) {
  std::map<std::string, double> out;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return out;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string text;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    double v = 0;
    if (f.size() == 2 && absl::SimpleAtod(f[1], &v)) out[std::string(f[0])] = v;
  }
  return out;
}

double Metric(const std::map<std::string, double>& m, const std::string& name, double fallback) {
  auto it = m.find(name);
  return it == m.end() ? fallback : it->second;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& o) {
  std::unique_ptr<Cluster> c(new Cluster());
  std::string dispatcher_address;
  if (o.dispatcher_binary.empty()) {
    DispatcherConfig dc;  // port 0: a free port on 127.0.0.1
    SLUICE_ASSIGN_OR_RETURN(c->dispatcher_, DispatchServer::Start(dc));
    dispatcher_address = c->dispatcher_->address();
  } else {
    SLUICE_ASSIGN_OR_RETURN(c->dispatcher_process_,
                            StartDispatcherProcess(o.dispatcher_binary, o.scratch_dir,
                                                   o.name + "-dispatcher", o.dispatcher_args));
    dispatcher_address = c->dispatcher_process_->address();
  }
  std::vector<std::string> port_files;
  for (int i = 0; i < o.num_workers; ++i) {
    const std::string name = absl::StrCat(o.name, "-worker", i);
    port_files.push_back(absl::StrCat(o.scratch_dir, "/", name, ".port"));
    auto w = std::make_unique<ChildProcess>(name, absl::StrCat(o.scratch_dir, "/", name, ".log"));
    std::vector<std::string> args = {"--dispatcher", dispatcher_address,
                                     "--port", "0",
                                     "--port_file", port_files.back(),
                                     "--data_transfer_protocol", o.protocol,
                                     "--task_buffer_elements",
                                     absl::StrCat(o.task_buffer_elements)};
    if (!o.plugin.empty()) args.insert(args.end(), {"--plugin", o.plugin});
    if (o.worker_threads > 0) {
      args.insert(args.end(), {"--worker_threads", absl::StrCat(o.worker_threads)});
    }
    SLUICE_RETURN_IF_ERROR(w->Start(o.worker_binary, args, o.env));
    c->workers_.push_back(std::move(w));
  }
  // A worker writes its port file once it has registered with the dispatcher.
  for (int i = 0; i < o.num_workers; ++i) {
    SLUICE_RETURN_IF_ERROR(
        WaitForPortFile(*c->workers_[i], port_files[i], kWorkerStartTimeout).status());
  }
  return c;
}

std::string Cluster::target() const {
  return dispatcher_ != nullptr ? dispatcher_->target()
                                : absl::StrCat("grpc://", dispatcher_process_->address());
}

Cluster::~Cluster() {
  for (auto& w : workers_) w->KillAndReap();
  if (dispatcher_ != nullptr) dispatcher_->Stop();
  if (dispatcher_process_.has_value()) dispatcher_process_->child->KillAndReap();
}

absl::Status Cluster::CheckWorkersAlive() {
  for (auto& w : workers_) {
    if (auto st = w->TryReap()) {
      return absl::InternalError(absl::StrCat(w->name(), " ", DescribeWaitStatus(*st),
                                              "; log:\n", w->LogTail()));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::perf
