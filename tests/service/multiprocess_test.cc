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
#include "sluice/dataset/expr.h"
#include "sluice/dataset/udf.h"
#include "tests/service/multiprocess_util.h"
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
  auto ds = Dataset::Range(5).Map(x * x).Distribute(opt).Map(x + 1);
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
    auto ds = Dataset::Range(4).Map(Udf("plugin_double")).Distribute(opt);
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
  auto ds = Dataset::Range(4).Map(Udf("plugin_double")).Distribute(opt);
  std::vector<int64_t> values;
  {
    ASSERT_OK_AND_ASSIGN(auto it, ds.MakeIterator());
    ASSERT_OK(Drain(*it, &values));
  }
  watchdog.Disarm();
  std::sort(values.begin(), values.end());
  EXPECT_THAT(values, ElementsAreArray({0, 0, 2, 2, 4, 4, 6, 6}));
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

}  // namespace
}  // namespace sluice::mp_test
