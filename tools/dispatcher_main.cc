// sluice-dispatcher: runs the service's dispatcher until SIGINT/SIGTERM.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "sluice/core/logging.h"
#include "sluice/control/dispatch_server.h"
#include "tools/security_flags.h"
#include "tools/signal_wait.h"

int main(int argc, char** argv) {
  sluice::DispatcherConfig c;
  std::string port_file;
  CLI::App app{"sluice-dispatcher: the sluice service's control plane (gRPC)"};
  app.add_option("--port", c.port, "TCP port to serve on; 0 picks a free one")
      ->capture_default_str();
  app.add_option("--bind_address", c.bind_address, "address to bind (0.0.0.0: all interfaces)")
      ->capture_default_str();
  app.add_option("--work_dir", c.work_dir,
                 "directory of the journal (with --fault_tolerant_mode); one dispatcher at a time");
  app.add_flag("--fault_tolerant_mode", c.fault_tolerant_mode,
               "journal every state change to --work_dir and replay it on restart");
  app.add_option("--worker_addresses", c.worker_addresses,
                 "static sharding (processing_mode file/data/file_or_data/hint): the N workers, "
                 "host:port or host:%port%; entry i reads shard i")
      ->delimiter(',');
  app.add_option("--job_gc_check_interval_ms", c.job_gc_check_interval_ms,
                 "how often timeouts and garbage collection run")
      ->capture_default_str();
  app.add_option("--job_gc_timeout_ms", c.job_gc_timeout_ms,
                 "collect an iteration no client has read for this long")
      ->capture_default_str();
  app.add_option("--worker_timeout_ms", c.worker_timeout_ms,
                 "a worker silent for this long is lost")
      ->capture_default_str();
  app.add_option("--client_timeout_ms", c.client_timeout_ms,
                 "a client silent for this long is released")
      ->capture_default_str();
  app.add_option("--range_split_elements", c.range_split_elements,
                 "distributed_epoch: elements per split of a Range source")
      ->capture_default_str();
  app.add_option("--file_split_files", c.file_split_files,
                 "distributed_epoch: files per split of a ListFiles source (0: one split per "
                 "256 files, 1 to 256 files each)")
      ->capture_default_str();
  app.add_option("--metrics_port", c.metrics_port,
                 "serve Prometheus metrics at http://BIND_ADDRESS:PORT/metrics; 0 picks a free "
                 "port, -1 (default) is off")
      ->capture_default_str();
  app.add_option("--port_file", port_file, "write the chosen port to this file once serving");
  std::string log_format;
  app.add_option("--log_format", log_format,
                 "text, or json: one JSON object per line (default: $SLUICE_LOG_FORMAT, else text)")
      ->check(CLI::IsMember({"text", "json"}));
  std::string token_file;
  sluice::tools::AddSecurityFlags(app, &c.tls, &token_file, &c.max_request_bytes);
  app.add_option("--max_dataset_def_bytes", c.max_dataset_def_bytes,
                 "largest dataset definition RegisterDataset accepts")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  sluice::InitLoggingFromEnv("sluice-dispatcher", "info");
  if (!log_format.empty()) (void)sluice::SetLogFormat(log_format, "sluice-dispatcher");  // checked above
  if (!sluice::tools::LoadAuthToken(token_file, &c.auth_token)) return 2;

  return sluice::tools::ServeUntilSignal("sluice-dispatcher", port_file,
                                         [&] { return sluice::DispatchServer::Start(c); },
                                         [](const auto& s) { return s.target(); });
}
