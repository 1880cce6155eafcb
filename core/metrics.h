// Prometheus metrics: a writer for the text exposition format 0.0.4 and a
// small HTTP/1.1 server that serves it at GET /metrics. Internal (not
// installed); the dispatcher and the worker use it for --metrics_port.
//
// Text format (https://prometheus.io/docs/instrumenting/exposition_formats/):
//   # HELP sluice_worker_elements_total Elements served to clients.
//   # TYPE sluice_worker_elements_total counter
//   sluice_worker_elements_total 42
//   sluice_worker_task_elements_total{task="7"} 42
// One HELP/TYPE pair per family, its samples right after it; label values
// escape \ " and newline; HELP text escapes \ and newline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::internal {

enum class MetricType : uint8_t { kCounter, kGauge };

class MetricsWriter {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Starts the family `name` ([a-zA-Z_:][a-zA-Z0-9_:]*, each name once per
  // exposition); the samples added next belong to it.
  void Family(absl::string_view name, MetricType type, absl::string_view help);
  // A sample of the current family. Label names follow the metric name rule
  // without ':'. Non-finite values are written as +Inf, -Inf and NaN.
  void Sample(double value, const Labels& labels = {});
  // A family with one unlabelled sample.
  void Counter(absl::string_view name, absl::string_view help, double value);
  void Gauge(absl::string_view name, absl::string_view help, double value);

  const std::string& text() const { return out_; }

  // True when `name` is a valid metric name (labels: allow_colon = false).
  static bool ValidName(absl::string_view name, bool allow_colon = true);

 private:
  std::string out_;
  std::string family_;
};

// Serves `render()` at GET /metrics (HEAD too) with Content-Type
// "text/plain; version=0.0.4"; other paths are 404, other methods 405,
// malformed requests 400, requests larger than max_request_bytes 431.
// One response per connection (Connection: close).
//
// Threads: one serving thread (started by Start, joined by Stop) multiplexes
// every connection with poll(); render() runs on it, one call per scrape.
// A connection idle or unfinished for io_timeout is closed; at most
// max_connections are open at once (later ones wait in the listen backlog).
class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;
  struct Options {
    size_t max_request_bytes = 8192;
    absl::Duration io_timeout = absl::Seconds(10);
    size_t max_connections = 64;
  };

  // Listens on bind_address:port (a numeric IPv4/IPv6 address or a name;
  // port 0 picks a free one).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& bind_address,
                                                                  int port, Render render,
                                                                  Options options);
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& bind_address,
                                                                  int port, Render render) {
    return Start(bind_address, port, std::move(render), Options());
  }
  ~MetricsHttpServer();  // calls Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const;
  // Closes the listener and every connection and joins the thread. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::internal
