// Debian's real Prometheus server scrapes an in-process dispatcher and
// worker: the targets come up (so Prometheus accepts our exposition) and a
// pipeline's element count reaches the stored series.
//
// Prometheus runs as a child process (perf/child_process.h: SIGKILLed and
// reaped when the test ends, PR_SET_PDEATHSIG if this process dies) with
// its config and TSDB in a scratch directory. Skipped, saying so, only when
// no prometheus binary exists ($SLUICE_PROMETHEUS_BIN, else
// /usr/bin/prometheus; scripts/install-deps.sh installs it). Deadlines
// here are hang guards only.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "perf/child_process.h"
#include "sluice/client/distribute.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/dataset/dataset.h"
#include "sluice/worker/worker_server.h"
#include "tests/obs/http_client.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

constexpr absl::Duration kHangGuard = absl::Seconds(120);

std::string PrometheusBinary() {
  const char* env = std::getenv("SLUICE_PROMETHEUS_BIN");
  std::string path = env != nullptr && *env != '\0' ? env : "/usr/bin/prometheus";
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

// The first sample's value of an instant-vector query answer
// ({"status":"success","data":{"resultType":"vector","result":[{"metric":
// {...},"value":[<time>,"<value>"]}]}}), or nullopt when there is none yet.
std::optional<double> FirstValue(const std::string& json) {
  size_t v = json.find("\"value\":[");
  if (v == std::string::npos) return std::nullopt;
  size_t comma = json.find(",\"", v);
  if (comma == std::string::npos) return std::nullopt;
  size_t end = json.find('"', comma + 2);
  if (end == std::string::npos) return std::nullopt;
  double d = 0;
  if (!absl::SimpleAtod(json.substr(comma + 2, end - comma - 2), &d)) return std::nullopt;
  return d;
}

TEST(PrometheusTest, ScrapesTheDispatcherAndTheWorker) {
  const std::string prometheus = PrometheusBinary();
  if (prometheus.empty()) {
    GTEST_SKIP() << "no prometheus binary (install Debian's `prometheus` package: "
                    "scripts/install-deps.sh, or set SLUICE_PROMETHEUS_BIN)";
  }
  DispatcherConfig dc;
  dc.metrics_port = 0;
  ASSERT_OK_AND_ASSIGN(auto dispatcher, DispatchServer::Start(dc));
  WorkerConfig wc;
  wc.dispatcher_address = dispatcher->address();
  wc.data_transfer_protocol = "grpc";
  wc.metrics_port = 0;
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerServer::Start(wc));

  // A small pipeline, so the counters move.
  constexpr int kElements = 30;
  DistributeOptions o;
  o.service = dispatcher->target();
  o.data_transfer_protocol = "grpc";
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kElements).Apply(Distribute(o)).MakeIterator());
  int n = 0;
  while (true) {
    ASSERT_OK_AND_ASSIGN(auto e, it->Next());
    if (!e.has_value()) break;
    ++n;
  }
  ASSERT_EQ(n, kElements);

  ASSERT_OK_AND_ASSIGN(auto dir, perf::ScratchDir::Create("sluice_prometheus"));
  const std::string config = dir.File("prometheus.yml");
  {
    std::ofstream f(config);
    f << "global:\n"
         "  scrape_interval: 1s\n"
         "  scrape_timeout: 1s\n"
         "scrape_configs:\n"
         "  - job_name: sluice-dispatcher\n"
         "    static_configs:\n"
         "      - targets: ['127.0.0.1:" << dispatcher->metrics_port() << "']\n"
         "  - job_name: sluice-worker\n"
         "    static_configs:\n"
         "      - targets: ['127.0.0.1:" << worker->metrics_port() << "']\n";
    ASSERT_TRUE(f.good()) << config;
  }
  // The web port is picked free just before the start; if another process
  // takes it meanwhile, Prometheus exits and we try another.
  std::unique_ptr<perf::ChildProcess> child;
  int web_port = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    ASSERT_OK_AND_ASSIGN(web_port, perf::PickFreeLoopbackPort());
    child = std::make_unique<perf::ChildProcess>(
        "prometheus", dir.File(absl::StrCat("prometheus", attempt, ".log")));
    ASSERT_OK(child->Start(prometheus, {
        absl::StrCat("--config.file=", config),
        absl::StrCat("--storage.tsdb.path=", dir.File("tsdb")),
        absl::StrCat("--web.listen-address=127.0.0.1:", web_port),
        "--log.level=warn",
    }));
    // Ready once its HTTP API answers (or it exited).
    absl::Time deadline = absl::Now() + kHangGuard;
    bool ready = false;
    while (absl::Now() < deadline && !child->TryReap().has_value()) {
      auto r = sluice_test::HttpGet(web_port, "/-/ready");
      if (r.ok() && r->code == 200) {
        ready = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (ready) break;
    child->KillAndReap();
    web_port = 0;
  }
  ASSERT_NE(web_port, 0) << "prometheus did not start: " << child->LogTail();

  auto query = [&](const std::string& q) -> std::optional<double> {
    auto r = sluice_test::HttpGet(web_port, absl::StrCat("/api/v1/query?query=", q));
    if (!r.ok() || r->code != 200) return std::nullopt;
    return FirstValue(r->body);
  };
  // Both targets up (Prometheus parsed both expositions), then the stored
  // element count.
  absl::Time deadline = absl::Now() + kHangGuard;
  std::optional<double> up, elements, workers;
  while (absl::Now() < deadline) {
    up = query("sum(up)");
    elements = query("sluice_worker_elements_total");
    workers = query("sluice_dispatcher_workers");
    if (up == 2 && elements == kElements && workers == 1) break;
    ASSERT_FALSE(child->TryReap().has_value()) << "prometheus exited: " << child->LogTail();
    absl::SleepFor(absl::Milliseconds(250));
  }
  auto targets = sluice_test::HttpGet(web_port, "/api/v1/targets");
  const std::string why = targets.ok() ? targets->body : std::string(targets.status().message());
  EXPECT_EQ(up.value_or(-1), 2) << why;
  EXPECT_EQ(elements.value_or(-1), kElements) << why;
  EXPECT_EQ(workers.value_or(-1), 1) << why;
  // Labelled series arrive too.
  EXPECT_EQ(query("sluice_worker_serve_errors_total%7Btransport%3D%22grpc%22%7D").value_or(-1), 0);
  child->KillAndReap();
}

}  // namespace
}  // namespace sluice
