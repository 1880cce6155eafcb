// The Prometheus text writer, the metrics HTTP server, and the dispatcher's
// and worker's /metrics endpoints in process.
#include "sluice/core/metrics.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "sluice/client/distribute.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/control/dispatcher_metrics.h"
#include "sluice/dataset/dataset.h"
#include "sluice/worker/worker_server.h"
#include "tests/obs/http_client.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using internal::MetricsHttpServer;
using internal::MetricsWriter;
using internal::MetricType;
using sluice_test::HttpGet;
using sluice_test::SampleValue;
using sluice_test::ParseHttpReply;
using sluice_test::RawHttp;
using ::testing::HasSubstr;

TEST(MetricsWriterTest, WritesHelpTypeAndSamplesInTextFormat004) {
  MetricsWriter w;
  w.Counter("sluice_things_total", "Things.\nSecond line \\ here.", 42);
  w.Family("sluice_depth", MetricType::kGauge, "Depth.");
  w.Sample(1.5, {{"task", "7"}, {"path", "a\"b\\c\nd"}});
  w.Sample(std::numeric_limits<double>::infinity());
  w.Sample(std::nan(""), {{"k", ""}});
  EXPECT_EQ(w.text(),
            "# HELP sluice_things_total Things.\\nSecond line \\\\ here.\n"
            "# TYPE sluice_things_total counter\n"
            "sluice_things_total 42\n"
            "# HELP sluice_depth Depth.\n"
            "# TYPE sluice_depth gauge\n"
            "sluice_depth{task=\"7\",path=\"a\\\"b\\\\c\\nd\"} 1.5\n"
            "sluice_depth +Inf\n"
            "sluice_depth{k=\"\"} NaN\n");
}

TEST(MetricsWriterTest, ValidatesNames) {
  EXPECT_TRUE(MetricsWriter::ValidName("sluice_a:b_1"));
  EXPECT_FALSE(MetricsWriter::ValidName("1abc"));
  EXPECT_FALSE(MetricsWriter::ValidName("a-b"));
  EXPECT_FALSE(MetricsWriter::ValidName(""));
  EXPECT_FALSE(MetricsWriter::ValidName("a:b", /*allow_colon=*/false));
  MetricsWriter w;
  w.Gauge("bad-name", "x", 1);
  EXPECT_THAT(w.text(), HasSubstr("invalid_metric_name 1\n"));
}

TEST(MetricsWriterTest, LargeIntegersAreExactAndFractionsKeepTheirDigits) {
  MetricsWriter w;
  w.Family("m", MetricType::kGauge, "m");
  w.Sample(1099511627776.0);
  w.Sample(0.25);
  w.Sample(-3);
  EXPECT_THAT(w.text(), HasSubstr("m 1099511627776\nm 0.25\nm -3\n"));
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void Start(MetricsHttpServer::Options options = {}) {
    auto s = MetricsHttpServer::Start(
        "127.0.0.1", 0,
        [this] {
          ++renders_;
          MetricsWriter w;
          w.Counter("test_scrapes_total", "Scrapes.", renders_.load());
          return w.text();
        },
        options);
    ASSERT_OK(s);
    server_ = *std::move(s);
    ASSERT_GT(server_->port(), 0);
  }
  std::atomic<int64_t> renders_{0};
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, ServesMetricsWithTheExpositionContentType) {
  Start();
  ASSERT_OK_AND_ASSIGN(auto r, HttpGet(server_->port(), "/metrics"));
  EXPECT_EQ(r.code, 200);
  EXPECT_THAT(r.head, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(r.head, HasSubstr(absl::StrCat("Content-Length: ", r.body.size())));
  EXPECT_THAT(r.body, HasSubstr("# TYPE test_scrapes_total counter\ntest_scrapes_total 1\n"));
  // A query string is ignored; HEAD has the head only.
  ASSERT_OK_AND_ASSIGN(r, HttpGet(server_->port(), "/metrics?x=1"));
  EXPECT_EQ(r.code, 200);
  ASSERT_OK_AND_ASSIGN(auto raw, RawHttp(server_->port(), "HEAD /metrics HTTP/1.0\r\n\r\n"));
  ASSERT_OK_AND_ASSIGN(r, ParseHttpReply(raw));
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, "");
}

TEST_F(MetricsHttpServerTest, OtherPathsAre404AndOtherMethods405) {
  Start();
  for (const char* path : {"/", "/metric", "/metrics/x", "/favicon.ico"}) {
    ASSERT_OK_AND_ASSIGN(auto r, HttpGet(server_->port(), path));
    EXPECT_EQ(r.code, 404) << path;
  }
  ASSERT_OK_AND_ASSIGN(auto raw, RawHttp(server_->port(), "POST /metrics HTTP/1.1\r\n\r\n"));
  ASSERT_OK_AND_ASSIGN(auto r, ParseHttpReply(raw));
  EXPECT_EQ(r.code, 405);
  EXPECT_THAT(r.head, HasSubstr("Allow: GET, HEAD"));
  EXPECT_EQ(renders_.load(), 0);
}

TEST_F(MetricsHttpServerTest, JunkOversizedAndTruncatedRequestsGetErrorsAndTheServerLivesOn) {
  MetricsHttpServer::Options o;
  o.max_request_bytes = 1024;
  Start(o);
  std::string binary;
  for (int i = 0; i < 300; ++i) binary.push_back(static_cast<char>(i * 37));
  const std::vector<std::pair<std::string, int>> cases = {
      {"garbage\r\n\r\n", 400},
      {"GET\r\n\r\n", 400},
      {"GET /metrics\r\n\r\n", 400},
      {"GET /metrics FTP/1.0\r\n\r\n", 400},
      {binary + "\r\n\r\n", 400},
      {"GET /metrics HTTP/1.1\r\nX: " + std::string(4096, 'a') + "\r\n\r\n", 431},
      {std::string(100000, 'z'), 431},
  };
  for (const auto& [req, code] : cases) {
    ASSERT_OK_AND_ASSIGN(auto raw, RawHttp(server_->port(), req));
    ASSERT_OK_AND_ASSIGN(auto r, ParseHttpReply(raw));
    EXPECT_EQ(r.code, code) << req.substr(0, 40);
  }
  // An incomplete head followed by EOF, and a connection that says nothing.
  ASSERT_OK_AND_ASSIGN(auto raw, RawHttp(server_->port(), "GET /metr", /*half_close=*/true));
  ASSERT_OK_AND_ASSIGN(auto r, ParseHttpReply(raw));
  EXPECT_EQ(r.code, 400);
  ASSERT_OK_AND_ASSIGN(raw, RawHttp(server_->port(), "", /*half_close=*/true));
  EXPECT_EQ(raw, "");
  ASSERT_OK_AND_ASSIGN(r, HttpGet(server_->port(), "/metrics"));
  EXPECT_EQ(r.code, 200);
}

TEST_F(MetricsHttpServerTest, AnIdleConnectionIsClosedAfterTheTimeoutAndDoesNotBlockOthers) {
  MetricsHttpServer::Options o;
  o.io_timeout = absl::Milliseconds(300);
  Start(o);
  // The idle client holds its connection open; a scrape meanwhile succeeds.
  std::atomic<bool> idle_closed{false};
  std::thread idle([&] {
    auto raw = RawHttp(server_->port(), "GET /metrics HTTP/1.1\r\n");  // never finishes its head
    idle_closed = raw.ok() && raw->empty();
  });
  ASSERT_OK_AND_ASSIGN(auto r, HttpGet(server_->port(), "/metrics"));
  EXPECT_EQ(r.code, 200);
  idle.join();
  EXPECT_TRUE(idle_closed.load());
}

TEST_F(MetricsHttpServerTest, ConcurrentScrapesAllSucceed) {
  MetricsHttpServer::Options o;
  o.max_connections = 4;  // more clients than connections: the rest wait in the backlog
  Start(o);
  constexpr int kThreads = 8, kScrapes = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kScrapes; ++i) {
        auto r = HttpGet(server_->port(), "/metrics");
        if (r.ok() && r->code == 200 && absl::StrContains(r->body, "test_scrapes_total ")) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kScrapes);
  EXPECT_EQ(renders_.load(), kThreads * kScrapes);
}

TEST_F(MetricsHttpServerTest, StopClosesTheListenerAndIsIdempotent) {
  Start();
  const int port = server_->port();
  server_->Stop();
  server_->Stop();
  EXPECT_FALSE(HttpGet(port, "/metrics").ok());
}

TEST(MetricsHttpServerStartTest, BadPortsAndAddressesFailClearly) {
  auto render = [] { return std::string(); };
  EXPECT_STATUS(MetricsHttpServer::Start("127.0.0.1", 70000, render),
                absl::StatusCode::kInvalidArgument, "70000");
  EXPECT_STATUS(MetricsHttpServer::Start("no.such.host.invalid", 0, render),
                absl::StatusCode::kInvalidArgument, "no.such.host.invalid");
  ASSERT_OK_AND_ASSIGN(auto a, MetricsHttpServer::Start("127.0.0.1", 0, render));
  EXPECT_STATUS(MetricsHttpServer::Start("127.0.0.1", a->port(), render),
                absl::StatusCode::kUnavailable, "cannot listen");
}

TEST(DispatcherMetricsTest, RendersEveryStat) {
  internal::DispatcherImpl::Stats s;
  s.workers = 2;
  s.lost_workers = 3;
  s.splits_reassigned = 4;
  s.max_worker_heartbeat_age_ms = 1500;
  std::string text = internal::RenderDispatcherMetrics(s);
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_dispatcher_workers gauge\nsluice_dispatcher_workers 2\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_dispatcher_lost_workers_total counter\n"
                              "sluice_dispatcher_lost_workers_total 3\n"));
  EXPECT_THAT(text, HasSubstr("sluice_dispatcher_splits_reassigned_total 4\n"));
  EXPECT_THAT(text, HasSubstr("sluice_dispatcher_worker_heartbeat_age_max_seconds 1.5\n"));
}

class ServiceMetricsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ServiceMetricsTest, EndpointsCountThePipeline) {
  DispatcherConfig dc;
  dc.metrics_port = 0;
  ASSERT_OK_AND_ASSIGN(auto dispatcher, DispatchServer::Start(dc));
  ASSERT_GT(dispatcher->metrics_port(), 0);
  WorkerConfig wc;
  wc.dispatcher_address = dispatcher->address();
  wc.data_transfer_protocol = GetParam();
  wc.metrics_port = 0;
  ASSERT_OK_AND_ASSIGN(auto worker, WorkerServer::Start(wc));
  ASSERT_GT(worker->metrics_port(), 0);

  DistributeOptions o;
  o.service = dispatcher->target();
  o.data_transfer_protocol = GetParam();
  o.fallback_to_grpc = false;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(25).Apply(Distribute(o)).MakeIterator());
  int n = 0;
  while (true) {
    ASSERT_OK_AND_ASSIGN(auto e, it->Next());
    if (!e.has_value()) break;
    ++n;
  }
  ASSERT_EQ(n, 25);

  ASSERT_OK_AND_ASSIGN(auto r, HttpGet(worker->metrics_port(), "/metrics"));
  ASSERT_EQ(r.code, 200);
  EXPECT_EQ(SampleValue(r.body, "sluice_worker_elements_total"), 25) << r.body;
  EXPECT_GT(SampleValue(r.body, "sluice_worker_bytes_total"), 0);
  EXPECT_EQ(SampleValue(r.body, "sluice_worker_tasks_received_total"), 1);
  // Every element was received and acknowledged (its nonzero case:
  // ServiceTest.AConsumerLeavingASharedJobEarlyDoesNotHoldTheOthersBack).
  EXPECT_EQ(SampleValue(r.body, "sluice_worker_elements_unacknowledged_total"), 0);
  EXPECT_THAT(r.body, HasSubstr(absl::StrCat("sluice_worker_info{address=\"", worker->address(),
                                             "\",transfer_protocol=\"", GetParam(), "\"} 1")));
  EXPECT_THAT(r.body, HasSubstr("sluice_worker_serve_errors_total{transport=\"grpc\"} 0\n"));
  if (GetParam() == "grpc") {
    EXPECT_GT(SampleValue(r.body, "sluice_worker_grpc_bytes_copied_total"), 0);
  }

  ASSERT_OK_AND_ASSIGN(r, HttpGet(dispatcher->metrics_port(), "/metrics"));
  ASSERT_EQ(r.code, 200);
  EXPECT_EQ(SampleValue(r.body, "sluice_dispatcher_workers"), 1) << r.body;
  EXPECT_EQ(SampleValue(r.body, "sluice_dispatcher_jobs_created_total"), 1);
  EXPECT_EQ(SampleValue(r.body, "sluice_dispatcher_iterations_created_total"), 1);
  EXPECT_EQ(SampleValue(r.body, "sluice_dispatcher_lost_workers_total"), 0);
}

INSTANTIATE_TEST_SUITE_P(Protocols, ServiceMetricsTest, ::testing::Values("grpc", "ucx"));

TEST(ServiceMetricsConfigTest, MetricsAreOffByDefaultAndBadPortsAreRejected) {
  DispatcherConfig dc;
  ASSERT_OK_AND_ASSIGN(auto dispatcher, DispatchServer::Start(dc));
  EXPECT_EQ(dispatcher->metrics_port(), -1);
  dc.metrics_port = 65536;
  EXPECT_STATUS(DispatchServer::Start(dc), absl::StatusCode::kInvalidArgument, "metrics_port");
  WorkerConfig wc;
  wc.dispatcher_address = dispatcher->address();
  wc.data_transfer_protocol = "grpc";
  wc.metrics_port = -2;
  EXPECT_STATUS(WorkerServer::Start(wc), absl::StatusCode::kInvalidArgument, "metrics_port");
}

}  // namespace
}  // namespace sluice
