// sluice-worker: runs a sluice worker until SIGINT/SIGTERM.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "sluice/core/logging.h"
#include "sluice/worker/worker_server.h"
#include "tools/security_flags.h"
#include "tools/signal_wait.h"

int main(int argc, char** argv) {
  sluice::WorkerConfig c;
  std::string port_file;
  CLI::App app{"sluice-worker: runs pipeline tasks and serves their elements"};
  app.add_option("--dispatcher", c.dispatcher_address, "dispatcher address, host:port")
      ->required();
  app.add_option("--port", c.port, "TCP port to serve on; 0 picks a free one")
      ->capture_default_str();
  app.add_option("--bind_address", c.bind_address, "address to bind")->capture_default_str();
  app.add_option("--worker_address", c.worker_address,
                 "address advertised to clients (default: bind_address:port)");
  app.add_option("--data_transfer_protocol", c.data_transfer_protocol,
                 "ucx (zero-copy; falls back to grpc if UCX cannot start) or grpc")
      ->capture_default_str();
  app.add_option("--data_transfer_address", c.data_transfer_address,
                 "UCX listener host:port (default: bind_address, a free port)");
  app.add_option("--heartbeat_interval_ms", c.heartbeat_interval_ms, "heartbeat period")
      ->capture_default_str();
  app.add_option("--dispatcher_timeout_ms", c.dispatcher_timeout_ms,
                 "fail at start if the dispatcher is unreachable this long")
      ->capture_default_str();
  app.add_option("--plugin", c.plugins, "UDF plugin library to load (repeatable)");
  app.add_option("--task_buffer_elements", c.task_buffer_elements,
                 "elements buffered per task ahead of clients")
      ->capture_default_str();
  app.add_option("--numa_node", c.numa_node,
                 "placement of task threads and UCX buffers: auto, none or a node number")
      ->capture_default_str();
  app.add_option("--cpu_list", c.cpu_list, "pin task threads to these cpus, e.g. 0-3,8");
  app.add_option("--worker_threads", c.worker_threads,
                 "threads for parallel pipeline work (num_parallel_calls, kAutotune); 0: one per "
                 "cpu of the worker's placement")
      ->capture_default_str();
  app.add_option("--metrics_port", c.metrics_port,
                 "serve Prometheus metrics at http://BIND_ADDRESS:PORT/metrics; 0 picks a free "
                 "port, -1 (default) is off")
      ->capture_default_str();
  app.add_option("--host_id", c.host_id,
                 "the host clients with target_workers LOCAL match (default: $SLUICE_HOST_ID, "
                 "else the hostname; on Kubernetes, the node name)");
  app.add_option("--port_file", port_file, "write the chosen port to this file once serving");
  std::string log_format;
  app.add_option("--log_format", log_format,
                 "text, or json: one JSON object per line (default: $SLUICE_LOG_FORMAT, else text)")
      ->check(CLI::IsMember({"text", "json"}));
  std::string token_file;
  sluice::tools::AddSecurityFlags(app, &c.tls, &token_file, &c.max_request_bytes);
  CLI11_PARSE(app, argc, argv);
  sluice::InitLoggingFromEnv("sluice-worker", "info");
  if (!log_format.empty()) (void)sluice::SetLogFormat(log_format, "sluice-worker");  // checked above
  if (!sluice::tools::LoadAuthToken(token_file, &c.auth_token)) return 2;

  return sluice::tools::ServeUntilSignal("sluice-worker", port_file,
                                         [&] { return sluice::WorkerServer::Start(c); },
                                         [](const auto& s) { return s.address(); });
}
