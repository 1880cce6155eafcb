// The worker: registers with the dispatcher, receives tasks, runs the part
// of each pipeline before Distribute, buffers produced elements and serves
// them to clients.
//
//   sluice::WorkerConfig wc;
//   wc.dispatcher_address = dispatcher->address();   // "host:port" or "grpc://host:port"
//   auto worker = sluice::WorkerServer::Start(wc);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/rpc/security.h"

namespace sluice {

inline constexpr int64_t kMaxWorkerThreads = 4096;

struct WorkerConfig {
  std::string dispatcher_address;
  // Address the worker advertises to the dispatcher and clients; empty:
  // "<bind_address>:<port>". Must be reachable by clients.
  std::string worker_address;
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0 picks a free port
  // "ucx" (zero-copy into client buffers; falls back to gRPC with a
  // warning when UCX cannot start) or "grpc".
  std::string data_transfer_protocol = "ucx";
  // UCX listener "host:port"; empty: "<bind_address>:0" (a free port).
  std::string data_transfer_address;
  // Heartbeat period; heartbeats long-poll, so new tasks arrive at once.
  int64_t heartbeat_interval_ms = 1000;
  // Start() fails with Unavailable if the dispatcher cannot be reached
  // within this long.
  int64_t dispatcher_timeout_ms = 10000;
  // UDF plugin libraries to load before serving.
  std::vector<std::string> plugins;
  // Threads of the process-wide pool that runs parallel pipeline work
  // (num_parallel_calls, kAutotune); 0: one per cpu the worker is placed on
  // (its cpu_list or NUMA node), else per cpu the process may use.
  int64_t worker_threads = 0;  // at most kMaxWorkerThreads
  // Elements buffered per task ahead of the clients (bounds memory; small
  // elements may run further ahead, up to 1 MiB of frames, for batching).
  int64_t task_buffer_elements = 16;
  // Placement of task threads, the UCX send pool and its progress thread:
  // "auto" (the NUMA node nearest the NIC UCX uses), "none", or a node
  // number; cpu_list overrides the cpus ("0-3,8"). Logged once at start.
  std::string numa_node = "auto";
  std::string cpu_list;
  // Prometheus metrics at http://<bind_address>:<metrics_port>/metrics
  // (docs/observability.md): -1 off, 0 picks a free port.
  int metrics_port = -1;
  // TLS for the worker's gRPC server (cert_file/key_file; ca_file: require
  // client certificates) and for its channel to the dispatcher (ca_file
  // verifies the dispatcher; cert_file/key_file are its client
  // certificate). Empty: plain text. UCX traffic is not encrypted.
  TlsConfig tls;
  // Shared secret: sent to the dispatcher, and required from clients on
  // both data paths (gRPC metadata, UCX request header). Empty: none.
  std::string auth_token;
  // The host this worker reports to the dispatcher, which lets clients
  // with target_workers "LOCAL" on the same host read it. Empty:
  // $SLUICE_HOST_ID, else gethostname().
  std::string host_id;
  // Largest gRPC request the worker's server accepts.
  int64_t max_request_bytes = kDefaultWorkerMaxRequestBytes;
};

class WorkerServer {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerConfig& config);
  ~WorkerServer();  // calls Stop()
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // The advertised "host:port".
  std::string address() const;
  // Where clients read elements: the UCX listener's "host:port", or
  // address() when elements are served over gRPC.
  std::string transfer_address() const;
  int port() const;
  // The metrics endpoint's port; -1 when WorkerConfig::metrics_port is -1.
  int metrics_port() const;
  // Number of tasks currently held.
  int64_t num_tasks() const;
  // Stops serving, stops every task and joins all threads. Idempotent;
  // returns promptly.
  void Stop();

  struct Impl;

 private:
  explicit WorkerServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
