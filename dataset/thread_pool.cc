#include "sluice/dataset/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sluice {
namespace internal {

struct PoolTask::State {
  enum Phase { kQueued, kRunning, kDone };
  absl::Mutex mu;
  Phase phase ABSL_GUARDED_BY(mu) = kQueued;
  std::function<void()> fn;  // touched only by the thread that claimed it
};

PoolTask::PoolTask(std::function<void()> fn) : st_(std::make_shared<State>()) {
  st_->fn = std::move(fn);
}

bool PoolTask::TryRun() {
  {
    absl::MutexLock l(&st_->mu);
    if (st_->phase != State::kQueued) return false;
    st_->phase = State::kRunning;
  }
  std::function<void()> fn = std::move(st_->fn);
  fn();
  fn = nullptr;  // what the work captured goes before anyone is told it is done
  absl::MutexLock l(&st_->mu);
  st_->phase = State::kDone;
  return true;
}

void PoolTask::Wait() {
  if (TryRun()) return;
  absl::MutexLock l(&st_->mu);
  st_->mu.Await(absl::Condition(
      +[](State::Phase* p) { return *p == State::kDone; }, &st_->phase));
}

bool PoolTask::done() const {
  absl::MutexLock l(&st_->mu);
  return st_->phase == State::kDone;
}

namespace {

// Never destroyed: its threads may outlive static destruction at exit
// (they wait for work then, touching nothing else).
class ThreadPool {
 public:
  void Configure(int threads, std::function<void()> init) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    target_ = std::max(1, threads);
    if (init) {
      init_ = std::move(init);
      ++init_generation_;  // threads already running apply it too
    }
    StartThreadsLocked();
  }
  int Size() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return target_;
  }
  void Schedule(std::shared_ptr<PoolTask> task) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    queue_.push_back(std::move(task));
  }

  static ThreadPool& Get() {
    static ThreadPool* pool = [] {
      auto* p = new ThreadPool;
      p->Configure(AvailableCpus(), {});
      return p;
    }();
    return *pool;
  }

 private:
  void StartThreadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (live_ < target_) {
      ++live_;
      std::thread([this] { Run(); }).detach();
    }
  }
  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    int64_t generation = 0;  // of the init this thread applied (0: none)
    auto has_work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !queue_.empty() || live_ > target_ || generation != init_generation_;
    };
    while (true) {
      std::shared_ptr<PoolTask> task;
      std::function<void()> init;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(&has_work));
        if (live_ > target_) {  // the pool shrank: this thread leaves
          --live_;
          return;
        }
        if (generation != init_generation_) {
          generation = init_generation_;
          init = init_;
        } else {
          task = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      if (init) init();
      if (task) task->TryRun();  // a waiter may have run it already
    }
  }

  absl::Mutex mu_;
  std::deque<std::shared_ptr<PoolTask>> queue_ ABSL_GUARDED_BY(mu_);
  int target_ ABSL_GUARDED_BY(mu_) = 0;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> init_ ABSL_GUARDED_BY(mu_);
  int64_t init_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

void Schedule(std::shared_ptr<PoolTask> task) { ThreadPool::Get().Schedule(std::move(task)); }

int64_t ResolveParallelism(int64_t num_parallel_calls) {
  if (num_parallel_calls < 1) return ThreadPool::Get().Size();
  return std::min(num_parallel_calls, kMaxParallelCalls);
}

}  // namespace internal

void ConfigureThreadPool(int threads, std::function<void()> thread_init) {
  internal::ThreadPool::Get().Configure(threads, std::move(thread_init));
}

int ThreadPoolSize() { return internal::ThreadPool::Get().Size(); }

namespace {

// The first line of `path`, empty when it cannot be read.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A quota file's cpus: v2 "max 100000" or "150000 100000"; v1 quota and
// period in two files ("-1": none).
std::optional<double> V2Quota(const std::string& dir) {
  std::istringstream in(FirstLine(dir + "/cpu.max"));
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  const double q = std::atof(quota.c_str());
  if (q <= 0) return std::nullopt;
  return q / period;
}
std::optional<double> V1Quota(const std::string& dir) {
  const double quota = std::atof(FirstLine(dir + "/cpu.cfs_quota_us").c_str());
  const double period = std::atof(FirstLine(dir + "/cpu.cfs_period_us").c_str());
  if (quota <= 0 || period <= 0) return std::nullopt;
  return quota / period;
}

void Tighten(std::optional<double>* acc, std::optional<double> q) {
  if (q && (!*acc || *q < **acc)) *acc = q;
}

}  // namespace

std::optional<double> CgroupCpuQuota(const std::string& root) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::optional<double> tightest;
  std::string line;
  while (std::getline(in, line)) {
    // "hierarchy-id:controllers:path"; v2 is "0::path".
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    std::vector<std::string> mounts;
    if (controllers.empty()) {
      mounts = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {
      mounts = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"};
    } else {
      continue;
    }
    for (const std::string& m : mounts) {
      // The cgroup and its parents up to the mount (a container sees its
      // own cgroup at the mount's root).
      std::string p = path;
      while (true) {
        const std::string dir = root + m + (p == "/" ? "" : p);
        Tighten(&tightest, controllers.empty() ? V2Quota(dir) : V1Quota(dir));
        if (p.empty() || p == "/") break;
        const size_t slash = p.rfind('/');
        p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
      }
    }
  }
  return tightest;
}

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof(set), &set) != 0
                 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                 : std::max(1, CPU_COUNT(&set));
  if (const std::optional<double> quota = CgroupCpuQuota()) {
    cpus = std::min(cpus, std::max(1, static_cast<int>(std::ceil(*quota - 1e-9))));
  }
  return cpus;
}

}  // namespace sluice
