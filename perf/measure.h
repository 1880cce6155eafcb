// The measurements of sluice-perf that run inside one process: the
// data-service client (in a child process per configuration, see
// sluice_perf.cc) and the memcpy ceiling.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace sluice::perf {

// A flat record passed from a measuring child to the parent as "key=value"
// lines (values are numbers or words without newlines).
using Record = std::map<std::string, std::string>;
std::string FormatRecord(const Record& r);
Record ParseRecord(const std::string& text);
double RecordNumber(const Record& r, const std::string& key, double fallback = 0);

struct ClientOptions {
  std::string service;             // "grpc://127.0.0.1:PORT"
  std::string protocol = "ucx";    // DistributeOptions::data_transfer_protocol
  // "payload": FromTensors({S}).Repeat().Map(perf_payload) -> uint8[S] elements;
  // "burn": FromTensors({N}).Repeat().Map(perf_burn) -> N rounds of CPU work each.
  // "fresh": the payload workload followed by Map(x + 0): a new uint8[S]
  // tensor computed per element on the worker.
  // "ints", "text", "noise": S bytes of int64 counters, English text,
  // random bytes (perf_ints, perf_text, perf_noise; `compression`).
  std::string workload = "payload";
  std::string compression = "none";  // DistributeOptions::compression
  // DistributeOptions::max_elements_per_reply (0: its default, batching);
  // 1 for the transport suite's gRPC anchor (one element per call, as
  // tf.data service).
  int64_t max_elements_per_reply = 0;
  int64_t arg = 0;                 // S (bytes) or N (rounds)
  int64_t max_outstanding_requests = 8;
  int64_t warmup_elements = 10;
  // The timed pass stops at the first of these bounds.
  int64_t max_elements = 10000;
  int64_t max_bytes = int64_t{1} << 30;
  double max_seconds = 2.0;
  // The latency pass (max_outstanding_requests = 1, each Next() timed);
  // 0 elements skips it.
  int64_t latency_elements = 0;
  double latency_seconds = 0.5;
  std::string plugin;              // the perf UDF plugin, loaded here too
};

// Runs the passes against a running service and returns: elements, bytes,
// seconds, cpu_user_s, cpu_sys_s (getrusage of this whole process: the
// iterator, gRPC and UCX progress threads), client_payload_bytes_copied,
// ucx_elements_received, ucx_bytes_received, dedicated_buffer_allocations
// (TransportStats deltas over the timed pass), pool_high_water_mark, and
// lat_n, lat_p50_us, lat_p99_us, lat_mean_us when the latency pass ran.
// Only this process's UCX context is used, so run one per UCX_TLS setting.
absl::StatusOr<Record> RunClient(const ClientOptions& options);

// Single-thread memcpy of `size`-byte blocks streaming through buffers of
// at least `working_set` bytes (larger than the caches, so big blocks are
// not served from cache), for about `seconds`. Returns GB/s (1e9 bytes).
struct MemcpyResult {
  double gb_per_s = 0;
  double blocks_per_s = 0;
};
MemcpyResult MeasureMemcpy(int64_t size, int64_t working_set, double seconds);

// Rounds of perf_burn that take about `target_us` on this machine (one
// thread, measured here), and the measured microseconds per call.
struct BurnCalibration {
  int64_t rounds = 0;
  double us_per_element = 0;
};
absl::StatusOr<BurnCalibration> CalibrateBurn(const std::string& plugin, double target_us);

}  // namespace sluice::perf
