// How a worker sizes its pool of parallel pipeline work, and the cgroup cpu
// quota it respects (dataset/thread_pool.h).
#include "sluice/worker/pool_sizing.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sluice/dataset/thread_pool.h"
#include "tests/dataset/dataset_test_util.h"

namespace sluice::internal {
namespace {

using ::testing::HasSubstr;

TEST(PoolSizingTest, WorkersOnOneHostDivideItsCpusAndWorkersOfOneProcessCountOnce) {
  const PoolCpus eight{8, false, "its placement (NUMA node 0)"};
  // Not known yet, or alone: one thread per cpu.
  EXPECT_EQ(SizeWorkerPool(0, eight, 0, 1, "h").threads, 8);
  EXPECT_EQ(SizeWorkerPool(0, eight, 1, 1, "h").threads, 8);
  // Two and three worker processes on the host.
  PoolSize two = SizeWorkerPool(0, eight, 2, 1, "h");
  EXPECT_EQ(two.threads, 4);
  EXPECT_THAT(two.why, HasSubstr("8 cpu(s) of its placement (NUMA node 0) shared by 2 worker "
                                 "processes on host h"));
  EXPECT_EQ(SizeWorkerPool(0, eight, 3, 1, "h").threads, 2);
  // Two workers in this process and one elsewhere: two pools.
  EXPECT_EQ(SizeWorkerPool(0, eight, 3, 2, "h").threads, 4);
  // Never below one thread.
  EXPECT_EQ(SizeWorkerPool(0, eight, 20, 1, "h").threads, 1);
  // --worker_threads and an explicit --cpu_list are the operator's choice.
  EXPECT_EQ(SizeWorkerPool(3, eight, 4, 1, "h").threads, 3);
  EXPECT_EQ(SizeWorkerPool(0, {8, true, "cpus 0-7"}, 4, 1, "h").threads, 8);
}

TEST(PoolSizingTest, InProcessWorkersAreCountedPerHost) {
  AddInProcessWorker("a");
  AddInProcessWorker("a");
  AddInProcessWorker("b");
  EXPECT_EQ(InProcessWorkers("a"), 2);
  EXPECT_EQ(InProcessWorkers("b"), 1);
  RemoveInProcessWorker("a");
  RemoveInProcessWorker("b");
  EXPECT_EQ(InProcessWorkers("a"), 1);
  EXPECT_EQ(InProcessWorkers("b"), 0);
  RemoveInProcessWorker("a");
}

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

// cgroup v2 (the tightest of the cgroup and its parents), v1 as a container
// sees it (its cgroup at the mount's root), and no quota.
TEST(PoolSizingTest, CgroupCpuQuotaReadsV2AndV1) {
  sluice_test::TempDir v2;
  Write(v2.File("proc/self/cgroup"), "0::/pods/job/worker\n");
  Write(v2.File("sys/fs/cgroup/pods/cpu.max"), "300000 100000\n");
  Write(v2.File("sys/fs/cgroup/pods/job/cpu.max"), "150000 100000\n");
  Write(v2.File("sys/fs/cgroup/pods/job/worker/cpu.max"), "max 100000\n");
  EXPECT_EQ(CgroupCpuQuota(v2.path()), std::optional<double>(1.5));

  sluice_test::TempDir v1;
  Write(v1.File("proc/self/cgroup"), "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n");
  Write(v1.File("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"), "250000\n");
  Write(v1.File("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"), "100000\n");
  EXPECT_EQ(CgroupCpuQuota(v1.path()), std::optional<double>(2.5));

  sluice_test::TempDir none;
  Write(none.File("proc/self/cgroup"), "1:cpu:/\n0::/\n");
  Write(none.File("sys/fs/cgroup/cpu/cpu.cfs_quota_us"), "-1\n");
  Write(none.File("sys/fs/cgroup/cpu/cpu.cfs_period_us"), "100000\n");
  Write(none.File("sys/fs/cgroup/unified/cpu.max"), "max 100000\n");
  EXPECT_EQ(CgroupCpuQuota(none.path()), std::nullopt);
  EXPECT_EQ(CgroupCpuQuota(none.File("missing")), std::nullopt);
  EXPECT_GE(AvailableCpus(), 1);
}

}  // namespace
}  // namespace sluice::internal
