// The dispatcher: owns the service's metadata (datasets, jobs, iterations,
// tasks, workers, clients) and serves the control plane over gRPC.
//
//   sluice::DispatcherConfig dc;           // port 0 = pick a free port
//   auto dispatcher = sluice::DispatchServer::Start(dc);
//   (*dispatcher)->target();               // "grpc://127.0.0.1:PORT"
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/rpc/security.h"

namespace sluice {

struct DispatcherConfig {
  // TCP port for the gRPC service; 0 picks a free one.
  int port = 0;
  // Address the server binds; 127.0.0.1 keeps it on loopback, "0.0.0.0"
  // serves every interface.
  std::string bind_address = "127.0.0.1";
  // Fault-tolerant mode: the dispatcher journals every state change to
  // `<work_dir>/journal` (fsync'd before the RPC that made it replies) and a
  // restarted dispatcher replays it; workers and clients reconnect on their
  // own and running jobs continue. Needs work_dir; one dispatcher per
  // work_dir at a time (the journal is locked).
  std::string work_dir;
  bool fault_tolerant_mode = false;
  // Static sharding (processing_mode file, data, file_or_data, hint): the
  // fixed list of N workers, "host:port" or "host:%port%" (any port of that
  // host). A registering worker takes the entry equal to its address, else
  // the first free %port% entry of its host; entry i reads shard i of N.
  // When set, a worker matching no free entry cannot register.
  std::vector<std::string> worker_addresses;
  // distributed_epoch: a Range source is split into sub-ranges of this many
  // elements (FromTensors: one element per split).
  int64_t range_split_elements = 32;
  // distributed_epoch: a ListFiles source is split into runs of this many
  // files; 0 (default): one split per 256 files listed, 1 to 256 files each
  // (SplitProvider::AutoFileRun).
  int64_t file_split_files = 0;
  // How often garbage collection is checked (timeouts are checked at least
  // every 250 ms, and ten times per timeout).
  int64_t job_gc_check_interval_ms = 1000;
  // An iteration no client has read for this long is collected and its
  // tasks deleted on the workers. Finished or anonymous iterations are
  // collected as soon as their last client leaves.
  int64_t job_gc_timeout_ms = 60000;
  // A worker without a heartbeat for this long is considered lost (its
  // tasks too): within worker_timeout_ms + 250 ms of its last heartbeat,
  // whatever its heartbeat interval, since the dispatcher holds a long-poll
  // heartbeat at most worker_timeout_ms / 3 (docs/service.md, "Liveness").
  int64_t worker_timeout_ms = 10000;
  // A client without a heartbeat for this long is released (same rules).
  int64_t client_timeout_ms = 30000;
  // Prometheus metrics at http://<bind_address>:<metrics_port>/metrics
  // (docs/observability.md): -1 off, 0 picks a free port.
  int metrics_port = -1;
  // TLS for the gRPC service (empty: plain text); with tls.ca_file set,
  // workers and clients must present certificates signed by it.
  TlsConfig tls;
  // Shared secret every RPC must carry (workers' heartbeats included);
  // empty: no authentication. See docs/security.md.
  std::string auth_token;
  // Largest request accepted (gRPC refuses larger ones with
  // ResourceExhausted), and largest dataset definition RegisterDataset
  // accepts (InvalidArgument); the second must not exceed the first.
  int64_t max_request_bytes = kDefaultMaxRequestBytes;
  int64_t max_dataset_def_bytes = kDefaultMaxDatasetDefBytes;
};

class DispatchServer {
 public:
  static absl::StatusOr<std::unique_ptr<DispatchServer>> Start(const DispatcherConfig& config);
  ~DispatchServer();  // calls Stop()
  DispatchServer(const DispatchServer&) = delete;
  DispatchServer& operator=(const DispatchServer&) = delete;

  // "grpc://HOST:PORT": pass as DistributeOptions::service.
  std::string target() const;
  // "HOST:PORT": pass as WorkerConfig::dispatcher_address.
  std::string address() const;
  int port() const;
  // The metrics endpoint's port; -1 when DispatcherConfig::metrics_port is -1.
  int metrics_port() const;
  // Stops serving and joins every thread. Idempotent; returns promptly.
  void Stop();

  struct Impl;

 private:
  explicit DispatchServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
