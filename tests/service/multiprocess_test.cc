// Integration tests with real processes (see multiprocess_util.h): a
// pipeline across processes, workers without a plugin, the binaries'
// command lines. The fault tests are in fault_test.cc.
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "sluice/client/distribute.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/thread_pool.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/udf.h"
#include "tests/service/multiprocess_util.h"
#include "tests/service/security_test_util.h"
#include "tests/test_util.h"

namespace sluice::mp_test {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using sluice::expr::x;

TEST_F(MultiProcessTest, DistributedPipelineAcrossProcesses) {
  ASSERT_OK(StartCluster(2, {}, {}));
  Watchdog watchdog(absl::Seconds(120), "DistributedPipelineAcrossProcesses",
                    [this] { KillAllChildren(); });

  DistributeOptions opt;
  opt.service = ServiceTarget();
  auto ds = Dataset::Range(5).Map(x * x).Apply(Distribute(opt)).Map(x + 1);
  ASSERT_OK(ds.status());
  std::vector<int64_t> values;
  {
    ASSERT_OK_AND_ASSIGN(auto it, ds.MakeIterator());
    ASSERT_OK(Drain(*it, &values));
  }
  watchdog.Disarm();
  ASSERT_FALSE(watchdog.fired());
  std::sort(values.begin(), values.end());
  // parallel_epochs: each of the two workers produces the whole dataset.
  EXPECT_THAT(values, ElementsAreArray({1, 1, 2, 2, 5, 5, 10, 10, 17, 17}));

  // Both binaries stop cleanly on SIGTERM.
  for (ChildProcess* w : workers_) {
    w->Signal(SIGTERM);
    auto st = w->WaitForExit(kExitDeadline);
    ASSERT_TRUE(st.has_value()) << w->name() << " did not exit after SIGTERM";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
        << w->name() << " " << DescribeWaitStatus(*st);
  }
  dispatcher_->Signal(SIGTERM);
  auto st = dispatcher_->WaitForExit(kExitDeadline);
  ASSERT_TRUE(st.has_value()) << "the dispatcher did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << DescribeWaitStatus(*st);
}

TEST_F(MultiProcessTest, DatasetThatFailsToValidateOnTheWorkerIsInvalidArgument) {
  ASSERT_OK(LoadPlugin(SLUICE_TEST_PLUGIN));
  {
    ASSERT_OK(StartCluster(1, {}, {}));
    Watchdog watchdog(absl::Seconds(120), "validate-without-plugin", [this] { KillAllChildren(); });
    DistributeOptions opt;
    opt.service = ServiceTarget();
    auto ds = Dataset::Range(4).Map(Udf("plugin_double")).Apply(Distribute(opt));
    ASSERT_OK(ds.status());  // valid here: this process has the UDF
    ASSERT_OK_AND_ASSIGN(auto it, ds.MakeIterator());
    std::vector<int64_t> values;
    absl::Status s = Drain(*it, &values);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("does not validate on the worker"));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("plugin_double"));
    watchdog.Disarm();
  }
  // A fresh cluster whose workers load the plugin (stale port files go).
  KillAllChildren();
  workers_.clear();
  worker_ports_.clear();
  for (const char* f : {"dispatcher.port", "worker0.port", "worker1.port"}) {
    std::filesystem::remove(scratch_.File(f));
  }
  ASSERT_OK(StartCluster(2, {}, {"--plugin", SLUICE_TEST_PLUGIN}));
  Watchdog watchdog(absl::Seconds(120), "validate-with-plugin", [this] { KillAllChildren(); });
  DistributeOptions opt;
  opt.service = ServiceTarget();
  auto ds = Dataset::Range(4).Map(Udf("plugin_double")).Apply(Distribute(opt));
  std::vector<int64_t> values;
  {
    ASSERT_OK_AND_ASSIGN(auto it, ds.MakeIterator());
    ASSERT_OK(Drain(*it, &values));
  }
  watchdog.Disarm();
  std::sort(values.begin(), values.end());
  EXPECT_THAT(values, ElementsAreArray({0, 0, 2, 2, 4, 4, 6, 6}));
}

// Two worker processes on one host divide its cpus between their pools of
// parallel work (the dispatcher counts the workers of each host id), and a
// survivor takes them all back once the other is lost.
TEST_F(MultiProcessTest, WorkersSharingAHostDivideItsCpus) {
  const int cpus = AvailableCpus();
  ASSERT_OK(StartCluster(2, {"--worker_timeout_ms", "1500"},
                         {"--host_id", "shared-test-host", "--numa_node", "none",
                          "--heartbeat_interval_ms", "200"}));
  Watchdog watchdog(absl::Seconds(120), "host-sharing", [this] { KillAllChildren(); });
  const std::string shared = absl::StrCat("worker: ", std::max(1, cpus / 2),
                                          " pool thread(s) for parallel pipeline work (", cpus,
                                          " cpu(s) of the process's cpus shared by 2 worker "
                                          "processes on host shared-test-host)");
  auto wait_for = [](ChildProcess* w, const std::string& line) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (w->log().find(line) == std::string::npos && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    return w->log().find(line) != std::string::npos;
  };
  for (ChildProcess* w : workers_) {
    EXPECT_TRUE(wait_for(w, shared)) << w->name() << " never said '" << shared << "'; log:\n"
                                     << w->log();
  }
  if (cpus < 2) GTEST_SKIP() << "one cpu: nothing to take back";
  workers_[1]->KillAndReap();
  const std::string alone = absl::StrCat("worker: ", cpus,
                                         " pool thread(s) for parallel pipeline work (one per cpu "
                                         "of the process's cpus)");
  // Once at start, and again after the dispatcher lost the other worker.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  auto count = [&] {
    const std::string log = workers_[0]->log();
    int n = 0;
    for (size_t at = log.find(alone); at != std::string::npos; at = log.find(alone, at + 1)) ++n;
    return n;
  };
  while (count() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(count(), 2) << workers_[0]->log();
  watchdog.Disarm();
}

TEST_F(MultiProcessTest, WorkerCommandLine) {
  // --help: exits 0 and documents --dispatcher.
  ChildProcess* help = Spawn("worker_help", SLUICE_WORKER_BIN, {"--help"});
  ASSERT_NE(help, nullptr);
  auto st = help->WaitForExit(kExitDeadline);
  ASSERT_TRUE(st.has_value()) << "sluice-worker --help did not exit";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << DescribeWaitStatus(*st);
  EXPECT_THAT(help->log(), HasSubstr("--dispatcher"));

  // An unreachable dispatcher: a clear error and a non-zero exit, not a hang.
  const int dead_port = UnusedLoopbackPort();
  ASSERT_GT(dead_port, 0);
  ChildProcess* dead = Spawn("worker_dead", SLUICE_WORKER_BIN,
                             {"--dispatcher", absl::StrCat("127.0.0.1:", dead_port), "--port", "0",
                              "--port_file", scratch_.File("dead.port"),
                              "--dispatcher_timeout_ms", "500"});
  ASSERT_NE(dead, nullptr);
  st = dead->WaitForExit(kExitDeadline);
  ASSERT_TRUE(st.has_value()) << "sluice-worker with a dead dispatcher did not exit";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) != 0) << DescribeWaitStatus(*st);
  EXPECT_THAT(dead->log(), HasSubstr("cannot reach the dispatcher"));
  EXPECT_FALSE(std::filesystem::exists(scratch_.File("dead.port")));

  // A missing required flag is a usage error.
  ChildProcess* usage = Spawn("worker_usage", SLUICE_WORKER_BIN, {"--port", "0"});
  ASSERT_NE(usage, nullptr);
  st = usage->WaitForExit(kExitDeadline);
  ASSERT_TRUE(st.has_value()) << "sluice-worker without --dispatcher did not exit";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) != 0) << DescribeWaitStatus(*st);
  EXPECT_THAT(usage->log(), HasSubstr("--dispatcher"));
}

TEST_F(MultiProcessTest, DispatcherCommandLine) {
  ChildProcess* help = Spawn("dispatcher_help", SLUICE_DISPATCHER_BIN, {"--help"});
  ASSERT_NE(help, nullptr);
  auto st = help->WaitForExit(kExitDeadline);
  ASSERT_TRUE(st.has_value()) << "sluice-dispatcher --help did not exit";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << DescribeWaitStatus(*st);
  EXPECT_THAT(help->log(), HasSubstr("--worker_timeout_ms"));
  EXPECT_THAT(help->log(), HasSubstr("--port_file"));
}

// The binaries' security flags: mutual TLS (--tls_cert/--tls_key/--tls_ca)
// and the token (--auth_token_file) on a real dispatcher and worker.
TEST_F(MultiProcessTest, MutualTlsAndTokenFromTheCommandLine) {
  sluice_test::Pki pki;
  ASSERT_OK(sluice_test::MakePki(scratch_.path(), &pki));
  {
    std::ofstream f(scratch_.File("token"));
    f << "mp-secret\n";
  }
  const std::vector<std::string> flags = {
      "--tls_cert", pki.server.cert_file, "--tls_key", pki.server.key_file,
      "--tls_ca",   pki.server.ca_file,   "--auth_token_file", scratch_.File("token")};
  ASSERT_OK(StartCluster(1, flags, flags));
  Watchdog watchdog(absl::Seconds(120), "MutualTlsAndTokenFromTheCommandLine",
                    [this] { KillAllChildren(); });
  DistributeOptions opt;
  opt.service = absl::StrCat("grpc://127.0.0.1:", dispatcher_port_);
  opt.tls = pki.client;
  opt.auth_token = "mp-secret";
  std::vector<int64_t> values;
  {
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(10).Apply(Distribute(opt)).MakeIterator());
    ASSERT_OK(Drain(*it, &values));
  }
  std::sort(values.begin(), values.end());
  EXPECT_THAT(values, ElementsAreArray({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  opt.auth_token = "not-it";
  EXPECT_EQ(Dataset::Range(10).Apply(Distribute(opt)).MakeIterator().status().code(),
            absl::StatusCode::kUnauthenticated);
  // A worker with another token cannot register: it exits with the reason.
  {
    std::ofstream f(scratch_.File("other_token"));
    f << "other\n";
  }
  std::vector<std::string> bad = {"--dispatcher", absl::StrCat("127.0.0.1:", dispatcher_port_),
                                  "--tls_cert", pki.server.cert_file, "--tls_key",
                                  pki.server.key_file, "--tls_ca", pki.server.ca_file,
                                  "--auth_token_file", scratch_.File("other_token")};
  ChildProcess* w = Spawn("bad_worker", SLUICE_WORKER_BIN, bad);
  ASSERT_NE(w, nullptr);
  auto st = w->WaitForExit(kExitDeadline);
  ASSERT_TRUE(st.has_value()) << "a worker with the wrong token kept running";
  EXPECT_FALSE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
  EXPECT_THAT(w->log(), HasSubstr("wrong auth token"));
  // An empty token file is refused at start.
  { std::ofstream f(scratch_.File("empty_token")); }
  ChildProcess* d = Spawn("empty_token_dispatcher", SLUICE_DISPATCHER_BIN,
                          {"--port", "0", "--auth_token_file", scratch_.File("empty_token")});
  ASSERT_NE(d, nullptr);
  st = d->WaitForExit(kExitDeadline);
  ASSERT_TRUE(st.has_value());
  EXPECT_FALSE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
  EXPECT_THAT(d->log(), HasSubstr("is empty"));
  watchdog.Disarm();
}

}  // namespace
}  // namespace sluice::mp_test
