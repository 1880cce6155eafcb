// The service's semantics, end to end, with an in-process dispatcher and
// workers on loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "sluice/client/distribute.h"
#include "sluice/core/status.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/dataplane/cuda_runtime.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/transport_registry.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/image.h"
#include "sluice/dataset/tfrecord.h"
#include "sluice/dataset/thread_pool.h"
#include "sluice/dataset/udf.h"
#include "sluice/dataset/webdataset.h"
#include "sluice/rpc/protocol.h"
#include "sluice/worker/task_runner.h"
#include "sluice/worker/worker_server.h"
#include "tests/dataset/dataset_test_util.h"
#include "tests/dataset/image_test_util.h"
#include "tests/obs/http_client.h"

namespace sluice {
namespace {

using ::sluice_test::Collect;
using ::sluice_test::CollectScalars;
using ::sluice_test::WithHangGuard;
using ::testing::ElementsAreArray;
using ::testing::UnorderedElementsAreArray;
using expr::x;

// Reads `it` to the end (under a hang guard), appending int64 scalars;
// an error fails the test.
void DrainRest(Iterator& it, std::vector<int64_t>* got) {
  WithHangGuard([&] {
    while (true) {
      auto e = it.Next();
      if (!e.ok()) {
        ADD_FAILURE() << e.status();
        break;
      }
      if (!e->has_value()) break;
      got->push_back((**e)[0].at<int64_t>(0));
    }
    return 0;
  });
}

// Reads `n` elements of `it` (each must arrive), appending int64 scalars.
void TakeScalars(Iterator& it, int n, std::vector<int64_t>* got) {
  for (int i = 0; i < n; ++i) {
    auto e = it.Next();
    ASSERT_OK(e);
    ASSERT_TRUE(e->has_value());
    got->push_back((**e)[0].at<int64_t>(0));
  }
}

// 0, 1, ..., n-1.
std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::map<int64_t, int> Counts(const std::vector<int64_t>& v) {
  std::map<int64_t, int> m;
  for (int64_t x : v) ++m[x];
  return m;
}

// The whole suite runs once per data transfer protocol (and ctest runs it
// under UCX_TLS=tcp and under shared memory).
// The cpus the calling thread may run on (a UDF runs on the worker's task
// producer thread, so this shows that thread's pinning).
absl::StatusOr<Element> ThreadCpuCount(const Element&) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return absl::InternalError("sched_getaffinity");
  return Element{Tensor::Scalar<int64_t>(CPU_COUNT(&set)),
                 Tensor::Scalar<int64_t>(CPU_ISSET(0, &set) ? 1 : 0)};
}
SLUICE_REGISTER_UDF(test_thread_cpus, ThreadCpuCount, {.num_inputs = 1});

// (x, the cpu its thread is pinned to): slow (5 ms) on cpu 1, so a worker
// pinned there is slower than one pinned to cpu 0.
absl::StatusOr<Element> SlowOnCpuOne(const Element& in) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return absl::InternalError("sched_getaffinity");
  int64_t cpu = CPU_COUNT(&set) == 1 && CPU_ISSET(1, &set) ? 1 : 0;
  if (cpu == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return Element{in[0], Tensor::Scalar<int64_t>(cpu)};
}
SLUICE_REGISTER_UDF(test_slow_on_cpu1, SlowOnCpuOne, {.num_inputs = 1});

class ServiceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void StartDispatcher(DispatcherConfig dc = {}) {
    // A timeout lowered to lose workers fast must not lose live ones in a
    // loaded sanitizer run.
    if (dc.worker_timeout_ms < DispatcherConfig{}.worker_timeout_ms) {
      dc.worker_timeout_ms *= sluice_test::kSanitizerSlowdown;
    }
    auto d = DispatchServer::Start(dc);
    ASSERT_OK(d);
    dispatcher_ = *std::move(d);
  }
  // host_id: the host the workers report (empty: this host's id).
  void StartWorkers(int n, const std::string& host_id = "") {
    for (int i = 0; i < n; ++i) {
      WorkerConfig wc;
      wc.dispatcher_address = dispatcher_->address();
      wc.host_id = host_id;
      wc.heartbeat_interval_ms = 200;
      wc.data_transfer_protocol = GetParam();
      wc.cpu_list = worker_cpu_list_;
      wc.worker_threads = worker_threads_;
      if (worker_metrics_) wc.metrics_port = 0;
      auto w = WorkerServer::Start(wc);
      ASSERT_OK(w);
      workers_.push_back(*std::move(w));
    }
  }
  std::string worker_cpu_list_;  // applied by StartWorkers
  int64_t worker_threads_ = 0;   // applied by StartWorkers
  bool worker_metrics_ = false;  // StartWorkers: serve each worker's /metrics

  // The sum over the workers of their unlabelled metric `name`.
  double SumOfWorkerMetric(const std::string& name) {
    double sum = 0;
    for (const auto& w : workers_) {
      auto r = sluice_test::HttpGet(w->metrics_port(), "/metrics");
      EXPECT_TRUE(r.ok() && r->code == 200) << (r.ok() ? r->head : r.status().ToString());
      if (!r.ok()) continue;
      const double v = sluice_test::SampleValue(r->body, name);
      EXPECT_GE(v, 0) << name << " missing from " << r->body;
      sum += v;
    }
    return sum;
  }

  void StartService(int workers, DispatcherConfig dc = {}) {
    StartDispatcher(dc);
    StartWorkers(workers);
  }
  DistributeOptions Options(std::string job_name = "") const {
    DistributeOptions o;
    o.service = dispatcher_->target();
    o.job_name = std::move(job_name);
    o.data_transfer_protocol = GetParam();
    o.fallback_to_grpc = false;  // a UCX run must really use UCX
    return o;
  }
  void TearDown() override {
    for (auto& w : workers_) w->Stop();
    if (dispatcher_) dispatcher_->Stop();
  }
  // Starts the service with one worker and reads each of `readers` (given
  // distributed_epoch options) to the end, then adds two workers and reads
  // them again: out[r] holds reader r's elements from one worker, then from
  // three (empty, with a failure, when a read fails).
  std::vector<std::vector<std::vector<Element>>> ReadFromOneThenThreeWorkers(
      const std::vector<std::function<Dataset(const DistributeOptions&)>>& readers) {
    StartService(1);
    DistributeOptions o = Options();
    o.processing_mode = "distributed_epoch";
    std::vector<std::vector<std::vector<Element>>> out(readers.size());
    for (int workers : {1, 3}) {
      if (workers == 3) StartWorkers(2);
      for (size_t r = 0; r < readers.size(); ++r) {
        auto got = WithHangGuard([&] { return Collect(readers[r](o)); });
        if (!got.ok()) {
          ADD_FAILURE() << "reader " << r << " from " << workers << " worker(s): " << got.status();
        }
        out[r].push_back(got.ok() ? *std::move(got) : std::vector<Element>());
      }
    }
    return out;
  }

  std::unique_ptr<DispatchServer> dispatcher_;
  std::vector<std::unique_ptr<WorkerServer>> workers_;
};

TEST_P(ServiceTest, SeedExampleRunsBeforeDistributeOnWorkersAndAfterLocally) {
  StartService(2);
  Dataset ds = Dataset::Range(5).Map(x * x).Apply(Distribute(Options())).Map(x + 1);
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] { return CollectScalars<int64_t>(ds); }));
  EXPECT_THAT(v, UnorderedElementsAreArray({1, 1, 2, 2, 5, 5, 10, 10, 17, 17}));
}

TEST_P(ServiceTest, ParallelEpochsEveryWorkerProducesTheWholeDataset) {
  StartService(3);
  ASSERT_OK_AND_ASSIGN(
      auto v, WithHangGuard([&] {
        return CollectScalars<int64_t>(Dataset::Range(3).Apply(Distribute(Options())));
      }));
  EXPECT_THAT(v, UnorderedElementsAreArray({0, 0, 0, 1, 1, 1, 2, 2, 2}));
}

TEST_P(ServiceTest, EachMakeIteratorIsANewIteration) {
  StartService(1);
  Dataset ds = Dataset::Range(4).Apply(Distribute(Options("epochs")));
  for (int epoch = 0; epoch < 3; ++epoch) {
    ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] { return CollectScalars<int64_t>(ds); }));
    EXPECT_THAT(v, UnorderedElementsAreArray({0, 1, 2, 3})) << "epoch " << epoch;
  }
  // Repeat after Distribute re-creates the service iterator every epoch.
  ASSERT_OK_AND_ASSIGN(auto r, WithHangGuard([&] {
                         return CollectScalars<int64_t>(
                             Dataset::Range(2).Apply(Distribute(Options())).Repeat(3));
                       }));
  EXPECT_THAT(r, UnorderedElementsAreArray({0, 0, 0, 1, 1, 1}));
}

TEST_P(ServiceTest, SharedJobNameSplitsEachIterationBetweenConsumers) {
  StartService(2);
  constexpr int kConsumers = 3, kIterations = 3, kN = 300;
  std::vector<int64_t> got[kConsumers][kIterations];
  absl::Status status[kConsumers];
  std::vector<std::thread> threads;
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      // Each consumer builds its own dataset, as separate trainers would.
      Dataset ds = Dataset::Range(kN).Apply(Distribute(Options("shared")));
      for (int i = 0; i < kIterations; ++i) {
        auto v = CollectScalars<int64_t>(ds);
        if (!v.ok()) {
          status[c] = v.status();
          return;
        }
        got[c][i] = *std::move(v);
      }
    });
  }
  WithHangGuard([&] {
    for (auto& t : threads) t.join();
    return 0;
  });
  std::vector<int64_t> expected;
  for (int k = 0; k < 2; ++k) {
    for (int64_t i = 0; i < kN; ++i) expected.push_back(i);
  }
  for (int i = 0; i < kIterations; ++i) {
    std::vector<int64_t> all;
    for (int c = 0; c < kConsumers; ++c) {
      ASSERT_OK(status[c]);
      all.insert(all.end(), got[c][i].begin(), got[c][i].end());
    }
    // The union over consumers is exactly one job iteration's output
    // (parallel_epochs on 2 workers: every value twice).
    EXPECT_THAT(all, UnorderedElementsAreArray(expected)) << "iteration " << i;
  }
}

// Two consumers share a distributed_epoch job and one closes its iterator
// early, holding elements it never returned (buffered, in flight): it
// tells the workers it leaves, so what they handed it counts as delivered
// at once, and the other consumer's epoch ends without waiting for the
// workers' ack timeout (it used to take 10 s more).
TEST_P(ServiceTest, AConsumerLeavingASharedJobEarlyDoesNotHoldTheOthersBack) {
  worker_metrics_ = true;
  StartService(2);
  constexpr int64_t kN = 20000;
  DistributeOptions o = Options("leave");
  o.processing_mode = "distributed_epoch";
  Dataset a = Dataset::Range(kN).Apply(Distribute(o));
  Dataset b = Dataset::Range(kN).Apply(Distribute(o));
  std::vector<int64_t> got_b;
  absl::Status status_b;
  std::thread early([&] {
    auto it = b.MakeIterator();
    if (!it.ok()) {
      status_b = it.status();
      return;
    }
    while (got_b.size() < 100) {
      auto e = (*it)->Next();
      if (!e.ok() || !e->has_value()) {
        status_b = e.ok() ? absl::OutOfRangeError("ended early") : e.status();
        return;
      }
      got_b.push_back((**e)[0].at<int64_t>(0));
    }
  });  // the iterator closes with elements still buffered
  auto got_a = WithHangGuard([&] { return CollectScalars<int64_t>(a); });
  early.join();
  ASSERT_OK(status_b);
  ASSERT_OK(got_a.status());
  std::set<int64_t> seen(got_a->begin(), got_a->end());
  for (int64_t v : got_b) EXPECT_TRUE(seen.insert(v).second) << v << " delivered twice";
  EXPECT_EQ(seen.size(), got_a->size() + got_b.size());
  // Without the goodbye, the epoch ends only once the workers count what
  // they handed the leaving consumer delivered at their ack timeout (10 s).
  EXPECT_EQ(SumOfWorkerMetric("sluice_worker_elements_unacknowledged_total"), 0)
      << "the epoch waited for the ack timeout of what the leaving consumer was handed";
}

// The seed's shared-job example: two consumer threads join each of three
// iterations, then drain them. Each first takes one element and waits for
// the other to hold one too: a consumer cannot prefetch a whole iteration
// (at most max_outstanding_requests replies of its fair share), so the
// other always gets elements, whatever the threads' scheduling. A consumer
// that has read everything ends as soon as the dispatcher confirms the
// end; it used to wait for its heartbeat's long poll to run out (up to
// 1 s), while the other, already in the next iteration, took all of it.
TEST_P(ServiceTest, SharedJobConsumersStartingTogetherBothGetElementsEveryIteration) {
  StartService(2);
  constexpr int kIterations = 3;
  std::vector<int64_t> got[2][kIterations];
  std::barrier joined(2), holding(2);
  const absl::Time start = absl::Now();
  WithHangGuard([&] {
    std::vector<std::thread> consumers;
    for (int c = 0; c < 2; ++c) {
      consumers.emplace_back([&, c] {
        Dataset ds = Dataset::Range(10).Apply(Distribute(Options("together")));
        for (int i = 0; i < kIterations; ++i) {
          auto it = ds.MakeIterator();
          if (!it.ok()) ADD_FAILURE() << it.status();
          joined.arrive_and_wait();
          // Reads one element (before the barrier) or the rest (after it).
          auto read = [&](bool one) {
            while (it.ok()) {
              auto e = (*it)->Next();
              if (!e.ok()) ADD_FAILURE() << e.status();
              if (!e.ok() || !e->has_value()) return;
              got[c][i].push_back((**e)[0].at<int64_t>(0));
              if (one) return;
            }
          };
          read(true);
          holding.arrive_and_wait();
          read(false);
        }
      });
    }
    for (auto& t : consumers) t.join();
    return 0;
  });
  // Before the fix above: 2-3 s here (the ends waited on long polls); after: tens of ms.
  std::printf("three shared iterations of two consumers took %.0f ms\n",
              absl::ToDoubleMilliseconds(absl::Now() - start));
  std::vector<int64_t> twice = Iota(10);
  twice.insert(twice.end(), twice.begin(), twice.end());
  for (int i = 0; i < kIterations; ++i) {
    std::vector<int64_t> all = got[0][i];
    all.insert(all.end(), got[1][i].begin(), got[1][i].end());
    EXPECT_THAT(all, UnorderedElementsAreArray(twice)) << "iteration " << i;
    for (int c = 0; c < 2; ++c) {
      EXPECT_FALSE(got[c][i].empty()) << "consumer " << c << " got nothing of iteration " << i;
    }
  }
}

// Two consumers of a shared job, read in turn from one thread (next() on
// each alternately): each gets a fair part of the iteration, in its
// worker's order, and together they get every element exactly once (one
// worker, parallel_epochs). A reply that took everything ready would leave
// the second consumer (almost) nothing.
TEST_P(ServiceTest, SharedJobConsumersReadingInTurnEachGetAFairShare) {
  StartService(1);
  constexpr int64_t kN = 400;
  // Each consumer builds its own dataset, as separate trainers would; the
  // k-th iterators of the two read the job's k-th iteration.
  Dataset a = Dataset::Range(kN).Apply(Distribute(Options("turns")));
  Dataset b = Dataset::Range(kN).Apply(Distribute(Options("turns")));
  for (int iteration = 0; iteration < 2; ++iteration) {
    SCOPED_TRACE(iteration);
    ASSERT_OK_AND_ASSIGN(auto ia, a.MakeIterator());
    ASSERT_OK_AND_ASSIGN(auto ib, b.MakeIterator());
    Iterator* its[2] = {ia.get(), ib.get()};
    std::vector<int64_t> got[2];
    WithHangGuard([&] {
      bool done[2] = {false, false};
      while (!done[0] || !done[1]) {
        for (int c = 0; c < 2; ++c) {
          if (done[c]) continue;
          auto e = its[c]->Next();
          if (!e.ok()) ADD_FAILURE() << e.status();
          if (!e.ok() || !e->has_value()) {
            done[c] = true;
            continue;
          }
          got[c].push_back((**e)[0].at<int64_t>(0));
        }
      }
      return 0;
    });
    std::vector<int64_t> all = got[0];
    all.insert(all.end(), got[1].begin(), got[1].end());
    EXPECT_THAT(all, UnorderedElementsAreArray(Iota(kN)));
    for (int c = 0; c < 2; ++c) {
      EXPECT_GE(got[c].size(), static_cast<size_t>(kN / 4))
          << "consumer " << c << " got " << got[c].size() << " of " << kN;
      EXPECT_TRUE(std::is_sorted(got[c].begin(), got[c].end()))
          << "consumer " << c << " got its part of the task out of order";
    }
  }
}

TEST_P(ServiceTest, ReadToTheEndJobNameYieldsEndOfInputToANewcomer) {
  StartService(1);
  ASSERT_OK_AND_ASSIGN(
      auto first, WithHangGuard([&] {
        return CollectScalars<int64_t>(Dataset::Range(5).Apply(Distribute(Options("done"))));
      }));
  EXPECT_EQ(first.size(), 5u);
  ASSERT_OK_AND_ASSIGN(
      auto late, WithHangGuard([&] {
        return CollectScalars<int64_t>(Dataset::Range(5).Apply(Distribute(Options("done"))));
      }));
  EXPECT_TRUE(late.empty());
}

// tf.data's Repeat over a data-service dataset goes on to the next
// iteration (repetition) of the job when one yields nothing: a consumer
// joining a shared job whose iterations 0 and 1 are finished reads nothing
// there and the whole of iterations 2, 3 and 4.
TEST_P(ServiceTest, RepeatGoesOnPastSharedJobIterationsAlreadyFinished) {
  StartService(1);
  ASSERT_OK_AND_ASSIGN(auto first, WithHangGuard([&] {
                         return CollectScalars<int64_t>(
                             Dataset::Range(10).Apply(Distribute(Options("late"))).Repeat(2));
                       }));
  EXPECT_EQ(first.size(), 20u);
  std::vector<int64_t> expected;
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < 10; ++i) expected.push_back(i);
  }
  // Repetitions 0 and 1 are empty, 2..4 whole: 30 elements.
  ASSERT_OK_AND_ASSIGN(auto late, WithHangGuard([&] {
                         return CollectScalars<int64_t>(
                             Dataset::Range(10).Apply(Distribute(Options("late"))).Repeat(5));
                       }));
  EXPECT_THAT(late, UnorderedElementsAreArray(expected));
  // Forever: iterations 0..4 are finished now; 5..7 give the 30.
  ASSERT_OK_AND_ASSIGN(
      auto forever, WithHangGuard([&] {
        return CollectScalars<int64_t>(
            Dataset::Range(10).Apply(Distribute(Options("late"))).Repeat().Take(30));
      }));
  EXPECT_THAT(forever, UnorderedElementsAreArray(expected));
}

TEST_P(ServiceTest, SameJobNameWithDifferentDatasetIsInvalidArgument) {
  StartService(1);
  ASSERT_OK_AND_ASSIGN(auto it,
                       Dataset::Range(5).Apply(Distribute(Options("train"))).MakeIterator());
  EXPECT_STATUS(Dataset::Range(6).Apply(Distribute(Options("train"))).MakeIterator(),
                absl::StatusCode::kInvalidArgument, "job 'train' exists for dataset");
}

TEST_P(ServiceTest, WithoutJobNameEachIteratorIsAPrivateJob) {
  StartService(1);
  Dataset a = Dataset::Range(50).Apply(Distribute(Options()));
  Dataset b = Dataset::Range(50).Apply(Distribute(Options()));
  auto [va, vb] = WithHangGuard([&] {
    return std::make_pair(CollectScalars<int64_t>(a), CollectScalars<int64_t>(b));
  });
  ASSERT_OK(va);
  ASSERT_OK(vb);
  EXPECT_EQ(va->size(), 50u);
  EXPECT_EQ(vb->size(), 50u);
}

TEST_P(ServiceTest, WorkerJoiningMidJobGetsATaskForTheRunningIteration) {
  StartService(1);
  constexpr int64_t kN = 10000;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(Options())).MakeIterator());
  std::vector<int64_t> got;
  ASSERT_NO_FATAL_FAILURE(TakeScalars(*it, 100, &got));
  StartWorkers(1);
  DrainRest(*it, &got);
  auto counts = Counts(got);
  ASSERT_EQ(counts.size(), static_cast<size_t>(kN));
  for (const auto& [v, n] : counts) ASSERT_EQ(n, 2) << "value " << v;
}

// Parallel work before Distribute runs on the worker's pool, sized by
// worker_threads; one worker's elements still arrive in its order.
TEST_P(ServiceTest, ParallelMapOnAWorkerKeepsItsOrder) {
  StartDispatcher();
  worker_threads_ = 3;
  StartWorkers(1);
  EXPECT_EQ(ThreadPoolSize(), 3);
  std::vector<int64_t> squares;
  for (int64_t i = 0; i < 300; ++i) squares.push_back(i * i);
  ASSERT_OK_AND_ASSIGN(
      auto v, WithHangGuard([&] {
        return CollectScalars<int64_t>(
            Dataset::Range(300).Map(x * x, kAutotune).Apply(Distribute(Options())));
      }));
  EXPECT_THAT(v, ElementsAreArray(squares));
  WorkerConfig bad;
  bad.dispatcher_address = dispatcher_->address();
  bad.worker_threads = -1;
  EXPECT_STATUS(WorkerServer::Start(bad), absl::StatusCode::kInvalidArgument,
                "worker_threads -1 is not in 0..4096");
  ConfigureThreadPool(AvailableCpus());
}

// tf.data's target_workers (its local_workers_test): "LOCAL" reads only
// the workers on the consumer's host; "AUTO" and "ANY" read every worker.
TEST_P(ServiceTest, TargetWorkersLocalReadsOnlyTheWorkersOnThisHost) {
  StartDispatcher();
  StartWorkers(1);                  // on this host
  StartWorkers(2, "another-host");  // elsewhere, as far as the dispatcher knows
  DistributeOptions local = Options();
  local.target_workers = "LOCAL";
  std::vector<int64_t> range10(10);
  std::iota(range10.begin(), range10.end(), 0);
  ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] {
    return CollectScalars<int64_t>(Dataset::Range(10).Apply(Distribute(local)));
  }));
  EXPECT_THAT(v, ElementsAreArray(range10));  // one worker's, in its order
  EXPECT_EQ(workers_[1]->num_tasks() + workers_[2]->num_tasks(), 0);
  for (const char* any : {"AUTO", "any"}) {
    DistributeOptions o = Options();
    o.target_workers = any;
    ASSERT_OK_AND_ASSIGN(auto all, WithHangGuard([&] {
      return CollectScalars<int64_t>(Dataset::Range(10).Apply(Distribute(o)));
    }));
    EXPECT_EQ(all.size(), 30u) << any;
  }
  // distributed_epoch: every element once, all from this host's worker
  // (no remote task takes a split that no consumer would read).
  local.processing_mode = "distributed_epoch";
  ASSERT_OK_AND_ASSIGN(auto once, WithHangGuard([&] {
    return CollectScalars<int64_t>(Dataset::Range(100).Apply(Distribute(local)));
  }));
  std::sort(once.begin(), once.end());
  std::vector<int64_t> range100(100);
  std::iota(range100.begin(), range100.end(), 0);
  EXPECT_THAT(once, ElementsAreArray(range100));
  // A job's consumers all use the same target_workers.
  local.processing_mode = "parallel_epochs";
  local.job_name = "local-job";
  ASSERT_OK_AND_ASSIGN(auto first, Dataset::Range(10).Apply(Distribute(local)).MakeIterator());
  DistributeOptions other = local;
  other.target_workers = "ANY";
  EXPECT_STATUS(Dataset::Range(10).Apply(Distribute(other)).MakeIterator(),
                absl::StatusCode::kInvalidArgument,
                "job 'local-job' exists with target_workers=LOCAL; requested ANY");
  other.target_workers = "nearby";
  EXPECT_STATUS(Dataset::Range(10).Apply(Distribute(other)).MakeIterator(),
                absl::StatusCode::kInvalidArgument, "unknown target_workers 'nearby'");
}

TEST_P(ServiceTest, TargetWorkersLocalWithoutAWorkerOnThisHostIsInvalidArgument) {
  StartDispatcher();
  StartWorkers(1, "another-host");
  DistributeOptions local = Options();
  local.target_workers = "LOCAL";
  EXPECT_STATUS(Dataset::Range(10).Apply(Distribute(local)).MakeIterator(),
                absl::StatusCode::kInvalidArgument,
                "but no worker is registered from it (workers' hosts: [another-host])");
}

TEST_P(ServiceTest, MaxOutstandingRequestsBoundsWhatTheClientHolds) {
  StartService(1);
  DistributeOptions o = Options();
  o.max_outstanding_requests = 2;
  int64_t before = GetDataServiceStats().elements_received;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(1000).Apply(Distribute(o)).MakeIterator());
  for (int i = 0; i < 5; ++i) ASSERT_OK(it->Next());
  // Give the fetchers every chance to overrun; the bound must still hold.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int64_t received = GetDataServiceStats().elements_received - before;
  EXPECT_GE(received, 5);
  // Two replies requested or buffered at once; a reply (UCX or gRPC)
  // batches up to kMaxElementsPerReply (256) small elements that were ready
  // together.
  static_assert(kMaxElementsPerReply == 256);
  EXPECT_LE(received, 5 + 2 * kMaxElementsPerReply);
}

// max_elements_per_reply = 1: one element per reply, as tf.data service
// does, so the client holds at most max_outstanding_requests elements.
TEST_P(ServiceTest, OneElementPerReplyWhenAskedBoundsWhatTheClientHoldsToTheRequests) {
  StartService(1);
  DistributeOptions o = Options();
  o.max_outstanding_requests = 2;
  o.max_elements_per_reply = 1;
  int64_t before = GetDataServiceStats().elements_received;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(1000).Apply(Distribute(o)).MakeIterator());
  for (int i = 0; i < 5; ++i) ASSERT_OK(it->Next());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t received = GetDataServiceStats().elements_received - before;
  EXPECT_GE(received, 5);
  EXPECT_LE(received, 5 + 2);
  std::vector<int64_t> rest;
  DrainRest(*it, &rest);
  EXPECT_EQ(rest.size(), 995u);
}

TEST_P(ServiceTest, SmallElementsArriveExactlyOnceAndAreBatchedOverUcx) {
  StartService(1);
  TransportStats before = GetTransportStats();
  ASSERT_OK_AND_ASSIGN(
      auto v, WithHangGuard([&] {
        return CollectScalars<int64_t>(Dataset::Range(5000).Apply(Distribute(Options())));
      }));
  // Concurrent replies may complete in any order; each element comes once.
  std::sort(v.begin(), v.end());
  ASSERT_EQ(v.size(), 5000u);
  for (int64_t i = 0; i < 5000; ++i) ASSERT_EQ(v[i], i);
  TransportStats after = GetTransportStats();
  if (GetParam() == "ucx") {
    EXPECT_GT(after.worker_batched_replies, before.worker_batched_replies);
    // Replies of at most 4 KiB come by copy only where a rendezvous would
    // copy them too (tcp: EagerReplies::kAuto); over shared memory never.
    if (!UcxRendezvousCopies(after.ucx_lanes)) {
      EXPECT_EQ(after.client_payload_bytes_copied, before.client_payload_bytes_copied);
    }
  }
}

// Reads `it` to the end (under a hang guard) and returns its int64 scalars
// (component 0) in the order Next() gave them.
std::vector<int64_t> DrainScalars(Iterator& it) {
  std::vector<int64_t> got;
  DrainRest(it, &got);
  return got;
}

// tf.data delivers a task's elements in the order its worker produced them
// (its tests read exactly [0..9] from range(10) on one worker), although
// several requests are in flight and their replies may complete in any
// order. Each read is repeated so that a race shows.
TEST_P(ServiceTest, OneWorkersElementsArriveInTheOrderItProducedThem) {
  StartService(1);
  for (int pass = 0; pass < 5; ++pass) {
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(10).Apply(Distribute(Options())).MakeIterator());
    ASSERT_EQ(DrainScalars(*it), Iota(10)) << "pass " << pass;
  }
  DistributeOptions o = Options();
  o.max_outstanding_requests = 8;
  for (int pass = 0; pass < 3; ++pass) {
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(200).Apply(Distribute(o)).MakeIterator());
    ASSERT_EQ(DrainScalars(*it), Iota(200)) << "pass " << pass;
  }
  // 300 KiB elements travel one per reply on every path, so eight replies
  // are in flight all the time.
  Element big = {Tensor::FromVector(std::vector<uint8_t>(300 << 10, 7))};
  Dataset bigs = Dataset::Zip({Dataset::Range(60), Dataset::FromTensors({big}).Repeat()});
  for (int pass = 0; pass < 3; ++pass) {
    ASSERT_OK_AND_ASSIGN(auto it, bigs.Apply(Distribute(o)).MakeIterator());
    ASSERT_EQ(DrainScalars(*it), Iota(60)) << "pass " << pass;
  }
  // distributed_epoch on one worker: its splits come in order, so does
  // its output.
  o.processing_mode = "distributed_epoch";
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(200).Apply(Distribute(o)).MakeIterator());
  ASSERT_EQ(DrainScalars(*it), Iota(200));
}

// With one request allowed, consuming the buffered element must start the
// next request at once (a fetcher that only woke on a poll timeout made
// elements wait ~50 ms whenever it lost the race to the consumer).
// Compared with two requests in the same run, not against a clock.
TEST_P(ServiceTest, OneOutstandingRequestDoesNotStallBetweenElements) {
  StartService(1);
  // 64 KiB elements travel one per reply (no batching hides the stall).
  Element big = {Tensor::FromVector(std::vector<uint8_t>(64 << 10, 1))};
  auto time_60 = [&](int64_t outstanding) -> absl::StatusOr<absl::Duration> {
    DistributeOptions o = Options();
    o.max_outstanding_requests = outstanding;
    SLUICE_ASSIGN_OR_RETURN(
        auto it, Dataset::FromTensors({big}).Repeat(61).Apply(Distribute(o)).MakeIterator());
    SLUICE_RETURN_IF_ERROR(it->Next().status());  // the iteration has started
    absl::Time start = absl::Now();
    for (int i = 0; i < 60; ++i) SLUICE_RETURN_IF_ERROR(it->Next().status());
    return absl::Now() - start;
  };
  ASSERT_OK_AND_ASSIGN(absl::Duration two, time_60(2));
  ASSERT_OK_AND_ASSIGN(absl::Duration one, time_60(1));
  EXPECT_LT(one, 4 * two + absl::Milliseconds(50)) << "one: " << one << " two: " << two;
}

TEST_P(ServiceTest, ElementsOfAnyDtypeAndShapeArriveBitExact) {
  StartService(1);
  std::vector<uint8_t> big(64 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  Element tuple = {Tensor::FromVector<float>({1.5f, -2.25f, 3e30f}),
                   Tensor::Strings({"a", "", "ünïcode", std::string(1000, 'z')}),
                   *Tensor::FromVector<int16_t>({1, -2, 3, -4, 5, -6}, TensorShape({2, 3})),
                   Tensor::Scalar<bool>(true),
                   Tensor::Scalar<Float16>(Float16(0.5f)),
                   Tensor::Scalar<uint64_t>(~uint64_t{0})};
  Element huge = {Tensor::FromVector<uint8_t>(big)};
  TransportStats before = GetTransportStats();
  for (const Element& e : {tuple, huge}) {
    ASSERT_OK_AND_ASSIGN(auto out, WithHangGuard([&] {
                           return Collect(Dataset::FromTensors({e}).Apply(Distribute(Options())));
                         }));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(ElementsEqual(out[0], e));
  }
  TransportStats after = GetTransportStats();
  if (GetParam() == "ucx") {
    EXPECT_EQ(after.ucx_elements_received - before.ucx_elements_received, 2);
    if (!UcxRendezvousCopies(after.ucx_lanes)) {
      EXPECT_EQ(after.client_payload_bytes_copied, before.client_payload_bytes_copied);
    }
    // The worker built the tuple's frame in its registered send pool and
    // sent the 64 MiB tensor from its own memory, without encoding it.
    EXPECT_EQ(after.worker_frames_in_registered_memory -
                  before.worker_frames_in_registered_memory, 1);
    EXPECT_EQ(after.worker_zero_copy_payloads - before.worker_zero_copy_payloads, 1);
    // Pools are bound to the NUMA node the topology policy chose, and the
    // pages were verified to be there.
    EXPECT_GT(after.pool_arenas_verified_on_node, 0);
    EXPECT_EQ(after.pool_arenas_misplaced, 0);
  } else {
    EXPECT_EQ(after.ucx_elements_received, before.ucx_elements_received);
    EXPECT_EQ(after.worker_frames_in_registered_memory, before.worker_frames_in_registered_memory);
  }
}

// Over UCX, a consumer waiting in Next() drives the worker itself (one
// wake-up per reply; docs/dataplane.md "Progress"), and every element
// arrives once.
TEST_P(ServiceTest, AConsumerWaitingOverUcxDrivesTheWorkerItself) {
  StartService(1);
  const TransportStats before = GetTransportStats();
  DistributeOptions o = Options();
  o.max_outstanding_requests = 1;  // a reply to wait for before each element
  ASSERT_OK_AND_ASSIGN(auto out, WithHangGuard([&] {
                         return Collect(Dataset::Range(300).Apply(Distribute(o)));
                       }));
  ASSERT_EQ(out.size(), 300u);
  for (int64_t i = 0; i < 300; ++i) EXPECT_EQ(out[i][0].at<int64_t>(0), i);
  const TransportStats after = GetTransportStats();
  if (GetParam() == "ucx") {
    EXPECT_GT(after.ucx_consumer_driven_passes, before.ucx_consumer_driven_passes);
  } else {
    EXPECT_EQ(after.ucx_consumer_driven_passes, before.ucx_consumer_driven_passes);
  }
}

TEST_P(ServiceTest, RuntimeErrorOnTheWorkerReachesTheClient) {
  StartService(1);
  EXPECT_STATUS(WithHangGuard([&] {
                  return Collect(Dataset::Range(10).Map(x / (x - 3)).Apply(Distribute(Options())));
                }),
                absl::StatusCode::kInvalidArgument, "division by zero");
}

TEST_P(ServiceTest, UnreachableServiceIsUnavailableWithinTheTimeout) {
  // A port nobody listens on: start and stop a dispatcher to find one, and
  // keep it bound (not listening) so that no server -- the worker started
  // below picks a free port too -- can take it meanwhile.
  StartDispatcher();
  std::string target = dispatcher_->target();
  const int port = dispatcher_->port();
  dispatcher_->Stop();
  const int holder = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{holder};
  DistributeOptions o;
  o.service = target;
  o.dispatcher_timeout_ms = 500;
  EXPECT_STATUS(
      WithHangGuard([&] { return Dataset::Range(3).Apply(Distribute(o)).MakeIterator(); }),
      absl::StatusCode::kUnavailable, "cannot reach the sluice dispatcher");
  WorkerConfig wc;
  wc.dispatcher_address = dispatcher_->address();
  wc.dispatcher_timeout_ms = 500;
  EXPECT_STATUS(WithHangGuard([&] { return WorkerServer::Start(wc); }),
                absl::StatusCode::kUnavailable, "cannot reach the dispatcher");
}

TEST_P(ServiceTest, BadOptionsAreInvalidArgument) {
  StartService(1);
  DistributeOptions o = Options();
  o.processing_mode = "sideways";
  EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).status(), absl::StatusCode::kInvalidArgument,
                "unknown processing_mode 'sideways'");
  o = Options();
  o.service = "grpc://no-port-here";
  EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).status(), absl::StatusCode::kInvalidArgument,
                "malformed service address");
  o = Options();
  o.max_outstanding_requests = 0;
  EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).status(), absl::StatusCode::kInvalidArgument,
                "max_outstanding_requests must be > 0");
  o = Options();
  o.data_transfer_protocol = "carrier-pigeon";
  EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).status(), absl::StatusCode::kInvalidArgument,
                "unknown data_transfer_protocol");
  for (int64_t bad : {int64_t{0}, kMaxElementsPerReply + 1}) {
    o = Options();
    o.max_elements_per_reply = bad;
    EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).status(),
                  absl::StatusCode::kInvalidArgument, "max_elements_per_reply must be in [1, 256]");
  }
  o = Options();
  o.cuda_pinned = "sometimes";
  EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).status(), absl::StatusCode::kInvalidArgument,
                "cuda_pinned must be auto, on or off");
  o = Options();
  o.cuda_pinned = "on";
  if (GetParam() == "grpc") {
    EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).status(),
                  absl::StatusCode::kInvalidArgument,
                  "cuda_pinned=on needs a data plane with receive arenas");
  } else if (!internal::UsableCudaRuntime().ok()) {
    // No GPU here: "on" cannot be honoured; "auto" goes on unpinned.
    EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).MakeIterator(),
                  absl::StatusCode::kFailedPrecondition, "Distribute: cuda_pinned=on: ");
    o.cuda_pinned = "auto";
    ASSERT_OK_AND_ASSIGN(auto v, CollectScalars<int64_t>(Dataset::Range(3).Apply(Distribute(o))));
    EXPECT_THAT(v, UnorderedElementsAreArray({0, 1, 2}));
    EXPECT_EQ(GetTransportStats().receive_pool_cuda_pinned_bytes, 0);
  }
  EXPECT_STATUS(
      Dataset::Range(3).Apply(Distribute(Options())).Apply(Distribute(Options())).status(),
      absl::StatusCode::kInvalidArgument, "already contains a Distribute");
  WorkerConfig wc;
  wc.dispatcher_address = "not an address";
  EXPECT_STATUS(WorkerServer::Start(wc), absl::StatusCode::kInvalidArgument,
                "malformed service address");
  wc.dispatcher_address = dispatcher_->address();
  wc.numa_node = "99";
  EXPECT_STATUS(WorkerServer::Start(wc), absl::StatusCode::kInvalidArgument,
                "NUMA node 99 does not exist");
  wc.numa_node = "auto";
  wc.cpu_list = "5-2";
  EXPECT_STATUS(WorkerServer::Start(wc), absl::StatusCode::kInvalidArgument, "bad cpu list");
  if (GetParam() == "ucx") {
    o = Options();
    o.numa_node = "99";
    EXPECT_STATUS(Dataset::Range(3).Apply(Distribute(o)).MakeIterator(),
                  absl::StatusCode::kInvalidArgument, "NUMA node 99 does not exist");
  }
}

TEST_P(ServiceTest, RegisterDatasetAndFromDatasetId) {
  StartService(2);
  Dataset ds = Dataset::Range(4).Map(x * 3);
  ASSERT_OK_AND_ASSIGN(std::string id, RegisterDataset(dispatcher_->target(), ds));
  ASSERT_OK_AND_ASSIGN(std::string again, RegisterDataset(dispatcher_->target(), ds));
  EXPECT_EQ(id, again);
  Dataset remote = FromDatasetId("parallel_epochs", dispatcher_->target(), id, Options());
  ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] { return CollectScalars<int64_t>(remote.Map(x + 1)); }));
  EXPECT_THAT(v, UnorderedElementsAreArray({1, 1, 4, 4, 7, 7, 10, 10}));
  EXPECT_STATUS(Collect(FromDatasetId("parallel_epochs", dispatcher_->target(),
                                                "ds-nonexistent", Options())),
                absl::StatusCode::kNotFound, "is not registered");
  // An id the caller chose (tf.data's register_dataset(dataset_id=...)).
  DistributeOptions o = Options();
  o.service = dispatcher_->target();
  ASSERT_OK_AND_ASSIGN(std::string named, RegisterDataset(ds, o, "times-three"));
  EXPECT_EQ(named, "times-three");
  ASSERT_OK_AND_ASSIGN(auto w, WithHangGuard([&] {
    return CollectScalars<int64_t>(
        FromDatasetId("parallel_epochs", dispatcher_->target(), "times-three", Options()));
  }));
  EXPECT_THAT(w, UnorderedElementsAreArray({0, 0, 3, 3, 6, 6, 9, 9}));
  EXPECT_STATUS(RegisterDataset(Dataset::Range(5), o, "times-three").status(),
                absl::StatusCode::kAlreadyExists, "different definition");
}

TEST_P(ServiceTest, DestroyingTheIteratorReleasesItsIterationClient) {
  StartService(1);
  int64_t released = GetDataServiceStats().iterations_released;
  {
    ASSERT_OK_AND_ASSIGN(auto it,
                         Dataset::Range(1000000).Apply(Distribute(Options())).MakeIterator());
    ASSERT_OK(it->Next());
  }  // destroyed mid-stream
  EXPECT_EQ(GetDataServiceStats().iterations_released, released + 1);
}

TEST_P(ServiceTest, LostWorkerDoesNotHangTheClientAndIsCounted) {
  DispatcherConfig dc;
  dc.worker_timeout_ms = 500;
  StartService(2, dc);
  constexpr int64_t kN = 30000;
  int64_t lost_before = GetDataServiceStats().lost_tasks;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(Options())).MakeIterator());
  std::vector<int64_t> got;
  for (int i = 0; i < 50; ++i) {
    auto e = it->Next();
    ASSERT_OK(e);
    got.push_back((**e)[0].at<int64_t>(0));
  }
  workers_[1]->Stop();  // dies mid-stream: no more heartbeats or elements
  DrainRest(*it, &got);
  auto counts = Counts(got);
  // The surviving worker delivered the whole dataset.
  ASSERT_EQ(counts.size(), static_cast<size_t>(kN));
  EXPECT_EQ(GetDataServiceStats().lost_tasks, lost_before + 1);
}

// tf.data's testRestartWorker(use_same_port=True), in process: a worker is
// stopped mid-iteration and a new one started on the same port; the client
// reads what the first one sent, then the whole dataset again from the new
// one (parallel_epochs), and only then ends.
TEST_P(ServiceTest, WorkerRestartedGracefullyOnTheSamePortServesTheRest) {
  DispatcherConfig dc;
  dc.worker_timeout_ms = 2000;
  StartService(1, dc);
  constexpr int64_t kN = 5000;  // more than a worker hands out ahead
  DistributeOptions opt = Options();
  opt.max_outstanding_requests = 1;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(opt)).MakeIterator());
  std::vector<int64_t> before;
  TakeScalars(*it, kN / 10, &before);
  const int port = workers_[0]->port();
  workers_[0]->Stop();
  WorkerConfig wc;
  wc.dispatcher_address = dispatcher_->address();
  wc.heartbeat_interval_ms = 200;
  wc.data_transfer_protocol = GetParam();
  wc.port = port;
  auto restarted = WorkerServer::Start(wc);
  ASSERT_OK(restarted);
  workers_[0] = *std::move(restarted);
  std::vector<int64_t> after;
  DrainRest(*it, &after);
  auto counts = Counts(after);
  for (int64_t v = 0; v < kN; ++v) EXPECT_GE(counts[v], 1) << "value " << v << " never came";
  EXPECT_LE(after.size(), static_cast<size_t>(kN + kN / 2)) << "more than one new copy";
}

TEST_P(ServiceTest, WorkerTaskThreadsArePinnedAsConfigured) {
  worker_cpu_list_ = "0";
  StartService(1);
  ASSERT_OK_AND_ASSIGN(auto out, WithHangGuard([&] {
                         return Collect(Dataset::Range(1).Map(Udf("test_thread_cpus"))
                                            .Apply(Distribute(Options())));
                       }));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0][0].at<int64_t>(0), 1);  // one cpu ...
  EXPECT_EQ(out[0][1].at<int64_t>(0), 1);  // ... cpu 0
}

TEST_P(ServiceTest, StopReturnsWhileClientsAreMidStream) {
  StartService(2);
  ASSERT_OK_AND_ASSIGN(auto it,
                       Dataset::Range(10000000).Apply(Distribute(Options())).MakeIterator());
  ASSERT_OK(it->Next());
  auto start = std::chrono::steady_clock::now();
  WithHangGuard([&] {
    for (auto& w : workers_) w->Stop();
    dispatcher_->Stop();
    return 0;
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("Stop() of 2 workers and the dispatcher took %.3f s\n", secs);
  it.reset();  // the client gives up on the stopped service without hanging
}

// ---- distributed_epoch ----------------------------------------------------------------

DispatcherConfig SmallSplits(int64_t elements) {
  DispatcherConfig dc;
  dc.range_split_elements = elements;
  return dc;
}

TEST_P(ServiceTest, DistributedEpochDeliversEachElementExactlyOnce) {
  StartService(2, SmallSplits(8));
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] {
                         return CollectScalars<int64_t>(Dataset::Range(100).Apply(Distribute(o)));
                       }));
  EXPECT_THAT(v, UnorderedElementsAreArray(Iota(100)));
  // Split-tracked elements may travel in batches: a split completes only
  // once the client acknowledged its elements.
  ASSERT_OK_AND_ASSIGN(auto many, WithHangGuard([&] {
                         return CollectScalars<int64_t>(Dataset::Range(2000).Apply(Distribute(o)));
                       }));
  EXPECT_THAT(many, UnorderedElementsAreArray(Iota(2000)));
  // Map/Filter before Distribute run on the workers, over their splits.
  ASSERT_OK_AND_ASSIGN(
      auto odd, WithHangGuard([&] {
        return CollectScalars<int64_t>(
            Dataset::Range(50).Filter(x % 2 == 1).Map(x * 10).Apply(Distribute(o)));
      }));
  std::vector<int64_t> want_odd;
  for (int i = 1; i < 50; i += 2) want_odd.push_back(i * 10);
  EXPECT_THAT(odd, UnorderedElementsAreArray(want_odd));
}

// (x, 300 KiB of zeros): an element that travels alone in a reply on
// every path.
absl::StatusOr<Element> PadTo300KiB(const Element& in) {
  return Element{in[0], Tensor::FromVector(std::vector<uint8_t>(300 << 10))};
}
SLUICE_REGISTER_UDF(test_pad_300k, PadTo300KiB, {.num_inputs = 1});

// distributed_epoch with one request allowed runs at the workers' pace, not
// at a poll interval's (a worker done with its splits waits for the
// epoch's end, which needs the other worker's elements acknowledged; a
// request parked on it held up the only request slot). Compared with
// eight requests in the same run (a generous ratio), not against a clock.
// Large elements too, which UCX cannot batch.
TEST_P(ServiceTest, DistributedEpochOneOutstandingRequestKeepsUpWithTheWorkers) {
  StartService(2);
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  const std::pair<std::string, Dataset> cases[] = {
      {"Range(100)", Dataset::Range(100)},
      {"Range(100) of 300 KiB elements", Dataset::Range(100).Map(Udf("test_pad_300k"))}};
  for (const auto& c : cases) {
    const Dataset& ds = c.second;  // a reference, not a structured binding: lambdas capture it
    SCOPED_TRACE(c.first);
    auto time_epoch = [&](int64_t outstanding) -> absl::StatusOr<absl::Duration> {
      o.max_outstanding_requests = outstanding;
      absl::Time start = absl::Now();
      SLUICE_ASSIGN_OR_RETURN(auto v, WithHangGuard([&] {
                                return CollectScalars<int64_t>(ds.Apply(Distribute(o)));
                              }));
      absl::Duration took = absl::Now() - start;
      EXPECT_THAT(v, UnorderedElementsAreArray(Iota(100)));
      return took;
    };
    ASSERT_OK_AND_ASSIGN(absl::Duration eight, time_epoch(8));
    ASSERT_OK_AND_ASSIGN(absl::Duration one, time_epoch(1));
    std::printf("distributed_epoch %s over 2 workers (%s): max_outstanding_requests=8 %s, "
                "=1 %s\n",
                c.first.c_str(), GetParam().c_str(), absl::FormatDuration(eight).c_str(),
                absl::FormatDuration(one).c_str());
    // Before the fix one request took 14-19 s for this; the slack admits an
    // occasional end-of-epoch wait (kElementWait, 500 ms) or two on a
    // loaded machine.
    EXPECT_LT(one, 10 * eight + absl::Seconds(3)) << "one: " << one << " eight: " << eight;
  }
}

TEST_P(ServiceTest, DistributedEpochWithRepeatOnTheWorkersGivesEveryEpoch) {
  StartService(3, SmallSplits(4));
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  ASSERT_OK_AND_ASSIGN(
      auto v, WithHangGuard([&] {
        return CollectScalars<int64_t>(Dataset::Range(10).Repeat(3).Apply(Distribute(o)));
      }));
  auto counts = Counts(v);
  ASSERT_EQ(counts.size(), 10u);
  for (auto [value, n] : counts) EXPECT_EQ(n, 3) << "value " << value;
}

TEST_P(ServiceTest, DistributedEpochUntrackedPipelineAndFileSplits) {
  StartService(2, SmallSplits(4));
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  // Batch mixes splits: elements are untracked, still each produced once.
  ASSERT_OK_AND_ASSIGN(auto batches, WithHangGuard([&] {
                         return Collect(Dataset::Range(20).Batch(4).Apply(Distribute(o)));
                       }));
  std::vector<int64_t> got;
  for (const Element& b : batches) {
    for (int64_t i = 0; i < b[0].num_elements(); ++i) got.push_back(b[0].at<int64_t>(i));
  }
  EXPECT_THAT(got, UnorderedElementsAreArray(Iota(20)));
  // ReadRecords over files: one file per split.
  sluice_test::TempDir dir;
  std::vector<std::string> files;
  std::vector<std::string> records;
  for (int f = 0; f < 5; ++f) {
    std::string path = dir.File(std::to_string(f));
    std::vector<std::string> recs;
    for (int r = 0; r < 3; ++r) recs.push_back("f" + std::to_string(f) + "r" + std::to_string(r));
    ASSERT_OK(WriteTFRecordFile(path, recs));
    records.insert(records.end(), recs.begin(), recs.end());
    files.push_back(path);
  }
  ASSERT_OK_AND_ASSIGN(auto out, WithHangGuard([&] {
                         return Collect(Dataset::ReadRecords(files).Apply(Distribute(o)));
                       }));
  std::vector<std::string> got_records;
  for (const Element& e : out) got_records.push_back(std::string(e[0].str(0)));
  EXPECT_THAT(got_records, UnorderedElementsAreArray(records));
}

// Random augmentation draws from the pipeline's seed and each image's
// position in the file list: the same images come out locally, from one
// worker and from three, in distributed_epoch.
TEST_P(ServiceTest, SeededAugmentationIsTheSameWhateverTheNumberOfWorkers) {
  sluice_test::TempDir dir;
  for (const char* c : {"a", "b", "c"}) std::filesystem::create_directory(dir.File(c));
  for (int i = 0; i < 12; ++i) {
    const std::string jpeg = sluice_test::TjEncode(sluice_test::SyntheticRgb(30, 40, i), 30, 40);
    sluice_test::WriteBytes(dir.File(std::string(1, "abc"[i % 3]) + "/" + std::to_string(i) + ".jpg"),
                            jpeg);
  }
  Dataset pipeline =
      image::ImageFolder(dir.path())
          .WithSeed(21)
          .Map({x[0], x[1],
                image::RandomHorizontalFlip(
                    image::RandomResizedCrop(image::Decode(io::ReadFile(x[0])), 12, 16))},
               kAutotune);
  ASSERT_OK(pipeline.status());
  auto by_path = [](const std::vector<Element>& elements) {
    std::map<std::string, std::string> out;
    for (const Element& e : elements) {
      out[std::string(e[0].str(0))] =
          std::to_string(e[1].at<int64_t>(0)) + ":" +
          std::string(reinterpret_cast<const char*>(e[2].data()), e[2].byte_size());
    }
    return out;
  };
  ASSERT_OK_AND_ASSIGN(auto local, sluice_test::Collect(pipeline));
  ASSERT_EQ(local.size(), 12u);
  const auto want = by_path(local);
  const auto read = ReadFromOneThenThreeWorkers(
      {[&](const DistributeOptions& o) { return pipeline.Apply(Distribute(o)); }});
  for (const auto& got : read[0]) {
    EXPECT_EQ(got.size(), 12u);
    EXPECT_EQ(by_path(got), want);
  }
}

// WebDataset shards split as files do in distributed_epoch: every sample
// once, and a seeded random op after the reader draws by (shard, sample),
// so one worker and three give what the local pipeline gives.
TEST_P(ServiceTest, WebDatasetShardsSplitAndAugmentTheSameWhateverTheNumberOfWorkers) {
  sluice_test::TempDir dir;
  for (int s = 0; s < 6; ++s) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int i = 0; i < 3; ++i) {
      const std::string key = absl::StrCat("s", s, "/", i);
      members.emplace_back(key + ".jpg", sluice_test::TjEncode(
                                             sluice_test::SyntheticRgb(20, 24, s * 3 + i), 20, 24));
      members.emplace_back(key + ".cls", std::to_string(s));
    }
    ASSERT_OK(WriteWebDatasetShard(dir.File(absl::StrCat("shard-", s, ".tar")), members));
  }
  Dataset pipeline = Dataset::WebDataset(dir.File("shard-*.tar"), {"__key__", "jpg", "cls"})
                         .WithSeed(5)
                         .Map({x[0], x[2], image::RandomResizedCrop(image::Decode(x[1]), 8, 8)});
  ASSERT_OK(pipeline.status());
  auto by_key = [](const std::vector<Element>& elements) {
    std::map<std::string, std::string> out;
    for (const Element& e : elements) {
      EXPECT_EQ(out.count(std::string(e[0].str(0))), 0u) << "twice: " << e[0].str(0);
      out[std::string(e[0].str(0))] =
          std::string(e[1].str(0)) + ":" +
          std::string(reinterpret_cast<const char*>(e[2].data()), e[2].byte_size());
    }
    return out;
  };
  ASSERT_OK_AND_ASSIGN(auto local, sluice_test::Collect(pipeline));
  ASSERT_EQ(local.size(), 18u);
  const auto want = by_key(local);
  const auto read = ReadFromOneThenThreeWorkers(
      {[&](const DistributeOptions& o) { return pipeline.Apply(Distribute(o)); }});
  for (const auto& got : read[0]) {
    EXPECT_EQ(got.size(), 18u);
    EXPECT_EQ(by_key(got), want);
  }
}

// Element keys survive the ops that derive them (Unbatch, Interleave with a
// reader inside) and cross the wire: a seeded random op placed after each,
// on the workers or after Distribute on the client, draws the same for one
// worker and for three as locally.
TEST_P(ServiceTest, SeededAugmentationAfterUnbatchInterleaveAndDistributeIgnoresWorkerCount) {
  sluice_test::TempDir dir;
  std::vector<std::string> jpegs, shards;
  for (int i = 0; i < 12; ++i) {
    jpegs.push_back(sluice_test::TjEncode(sluice_test::SyntheticRgb(20, 24, 100 + i), 20, 24));
  }
  for (int s = 0; s < 3; ++s) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int i = 0; i < 4; ++i) members.emplace_back(absl::StrCat(s, "_", i, ".jpg"), jpegs[s * 4 + i]);
    shards.push_back(dir.File(absl::StrCat("shard-", s, ".tar")));
    ASSERT_OK(WriteWebDatasetShard(shards.back(), members));
  }
  auto crop = [](const expr::Expr& e) { return image::RandomResizedCrop(image::Decode(e), 6, 6); };
  std::vector<Element> vectors;  // four elements of three JPEGs each
  for (int v = 0; v < 4; ++v) {
    vectors.push_back({Tensor::Strings({jpegs[v * 3], jpegs[v * 3 + 1], jpegs[v * 3 + 2]})});
  }
  std::vector<Element> names;
  for (const std::string& f : shards) names.push_back({Tensor::String(f)});
  const Dataset unbatched = Dataset::FromTensors(vectors).Unbatch().WithSeed(7).Map(crop(x));
  const Dataset interleaved =
      Dataset::FromTensors(names)
          .Interleave([](const Dataset& f) { return Dataset::WebDataset(f, {"jpg"}); }, 2)
          .WithSeed(7)
          .Map(crop(x));
  const Dataset samples = Dataset::WebDataset(dir.File("shard-*.tar"), {"jpg"}).WithSeed(7);
  // Each element's bytes, sorted: the same draws whatever the order.
  auto outputs = [](const std::vector<Element>& elements) {
    std::vector<std::string> out;
    for (const Element& e : elements) {
      out.emplace_back(reinterpret_cast<const char*>(e[0].data()), e[0].byte_size());
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  std::vector<std::vector<Element>> local(3);
  ASSERT_OK_AND_ASSIGN(local[0], sluice_test::Collect(unbatched));
  ASSERT_OK_AND_ASSIGN(local[1], sluice_test::Collect(interleaved));
  ASSERT_OK_AND_ASSIGN(local[2], sluice_test::Collect(samples.Map(crop(x))));
  const auto read = ReadFromOneThenThreeWorkers({
      [&](const DistributeOptions& o) { return unbatched.Apply(Distribute(o)); },
      [&](const DistributeOptions& o) { return interleaved.Apply(Distribute(o)); },
      // The random op runs on the client, after Distribute.
      [&](const DistributeOptions& o) { return samples.Apply(Distribute(o)).Map(crop(x)); },
  });
  for (size_t r = 0; r < read.size(); ++r) {
    ASSERT_EQ(local[r].size(), 12u);
    for (size_t w = 0; w < read[r].size(); ++w) {
      EXPECT_EQ(outputs(read[r][w]), outputs(local[r])) << "pipeline " << r << ", from "
                                                        << (w == 0 ? 1 : 3) << " worker(s)";
    }
  }
}

// Wire compression: every codec delivers the same elements, compressible
// ones in fewer bytes than without; a bad name is InvalidArgument.
TEST_P(ServiceTest, CompressionDeliversTheSameElementsInFewerBytes) {
  StartService(1);  // parallel_epochs: one worker, one pass
  // Batches of int64 counters and of repetitive text compress.
  const Dataset ds = Dataset::Zip({Dataset::Range(40000).Batch(2000),
                                   Dataset::FromTensors({{Tensor::String(std::string(20000, 'a'))}})
                                       .Repeat(20)});
  ASSERT_OK(ds.status());
  ASSERT_OK_AND_ASSIGN(auto want, sluice_test::Collect(ds));
  std::map<std::string, int64_t> bytes;
  for (const char* codec : {"none", "lz4", "zstd", "AUTO"}) {
    SCOPED_TRACE(codec);
    DistributeOptions o = Options();
    o.compression = codec;
    const int64_t before = GetDataServiceStats().bytes_received;
    ASSERT_OK_AND_ASSIGN(auto got, WithHangGuard([&] { return Collect(ds.Apply(Distribute(o))); }));
    bytes[codec] = GetDataServiceStats().bytes_received - before;
    ASSERT_EQ(got.size(), want.size());
    auto text = [](const std::vector<Element>& v) {
      std::vector<std::string> out;
      for (const Element& e : v) out.push_back(ElementDebugString(e));
      std::sort(out.begin(), out.end());
      return out;
    };
    EXPECT_EQ(text(got), text(want));
  }
  EXPECT_LT(bytes["lz4"], bytes["none"] * 3 / 4);
  EXPECT_LT(bytes["zstd"], bytes["none"] / 4);
  // AUTO: none over ucx, lz4 over grpc.
  // (UCX batches replies as elements are ready, so its byte counts vary a
  // little from run to run.)
  if (GetParam() == "grpc") {
    EXPECT_LT(bytes["AUTO"], bytes["none"] * 3 / 4);
  } else {
    EXPECT_GT(bytes["AUTO"], bytes["none"] * 9 / 10);
  }
  DistributeOptions bad = Options();
  bad.compression = "snappy";
  EXPECT_STATUS(ds.Apply(Distribute(bad)).status(), absl::StatusCode::kInvalidArgument,
                "compression must be AUTO, none, lz4 or zstd; got 'snappy'");
}

TEST_P(ServiceTest, DistributedEpochWorkerAddedMidEpochTakesSplits) {
  StartService(1, SmallSplits(5));
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  constexpr int64_t kN = 400;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(o)).MakeIterator());
  std::vector<int64_t> got;
  ASSERT_NO_FATAL_FAILURE(TakeScalars(*it, 20, &got));
  StartWorkers(1);
  DrainRest(*it, &got);
  auto counts = Counts(got);
  ASSERT_EQ(counts.size(), static_cast<size_t>(kN));
  for (auto [value, n] : counts) ASSERT_EQ(n, 1) << "value " << value;
}

TEST_P(ServiceTest, DistributedEpochRepeatForeverKeepsArrivingWhenFourOfFiveWorkersStop) {
  DispatcherConfig dc;
  dc.worker_timeout_ms = 500;
  StartService(5, dc);
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(1).Repeat().Apply(Distribute(o)).MakeIterator());
  // What ended the stream early ("" when n elements arrived).
  auto take = [&](int n) {
    return WithHangGuard([&]() -> std::string {
      for (int i = 0; i < n; ++i) {
        auto e = it->Next();
        if (!e.ok()) return e.status().ToString();
        if (!e->has_value()) return absl::StrCat("end of input after ", i, " elements");
        if ((**e)[0].at<int64_t>(0) != 0) return "an element other than 0";
      }
      return "";
    });
  };
  ASSERT_EQ(take(10), "");
  for (int i = 1; i < 5; ++i) workers_[i]->Stop();
  ASSERT_EQ(take(30), "") << "elements stopped arriving after 4 of 5 workers stopped";
}

TEST_P(ServiceTest, DistributedEpochImbalancedWorkersShareByTheirSpeed) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two cpus to pin to";
  StartDispatcher(SmallSplits(4));
  worker_cpu_list_ = "0";
  StartWorkers(1);  // fast
  worker_cpu_list_ = "1";
  StartWorkers(1);  // slow: 5 ms per element
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  ASSERT_OK_AND_ASSIGN(
      auto out, WithHangGuard([&] {
        return Collect(Dataset::Range(400).Map(Udf("test_slow_on_cpu1")).Apply(Distribute(o)));
      }));
  std::vector<int64_t> values;
  int64_t by_fast = 0, by_slow = 0;
  for (const Element& e : out) {
    values.push_back(e[0].at<int64_t>(0));
    (e[1].at<int64_t>(0) == 1 ? by_slow : by_fast)++;
  }
  EXPECT_THAT(values, UnorderedElementsAreArray(Iota(400)));
  // Splits go to whoever asks: the fast worker does most of the epoch and
  // the slow one does not hold it back. (Unloaded, fast does ~5x as much;
  // under sanitizers on a shared 2-cpu machine the fast worker's cpu is
  // contended too, so only "most" is asserted.)
  EXPECT_GT(by_slow, 0);
  EXPECT_GT(by_fast, 3 * by_slow / 2) << "fast " << by_fast << ", slow " << by_slow;
}

TEST_P(ServiceTest, DistributedEpochLostWorkersSplitsAreReassignedAndDeduplicated) {
  DispatcherConfig dc = SmallSplits(10);
  dc.worker_timeout_ms = 500;
  StartService(2, dc);
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  constexpr int64_t kN = 2000;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(o)).MakeIterator());
  std::vector<int64_t> got;
  ASSERT_NO_FATAL_FAILURE(TakeScalars(*it, 30, &got));
  workers_[1]->Stop();  // its open splits must be produced by worker 0
  DrainRest(*it, &got);
  auto counts = Counts(got);
  ASSERT_EQ(counts.size(), static_cast<size_t>(kN)) << "elements missing";
  for (auto [value, n] : counts) ASSERT_EQ(n, 1) << "value " << value;
}

// ---- static sharding ----------------------------------------------------------

// worker_addresses of `n` entries where only entry `free` can be taken by
// this test's workers (the others name ports no worker here listens on).
DispatcherConfig OnlyShardFree(int n, int free) {
  DispatcherConfig dc;
  for (int i = 0; i < n; ++i) {
    dc.worker_addresses.push_back(i == free ? "127.0.0.1:%port%"
                                            : "127.0.0.1:" + std::to_string(i + 1));
  }
  return dc;
}

// ListFiles splits are runs of files (file_split_files): a worker that
// stops mid-epoch leaves its runs to the others, and every file still
// arrives once (a requeued run is deduplicated file by file).
TEST_P(ServiceTest, DistributedEpochFileRunsSurviveALostWorkerExactlyOnce) {
  sluice_test::TempDir dir;
  constexpr int kFiles = 200;
  std::vector<std::string> names;
  for (int i = 0; i < kFiles; ++i) {
    names.push_back(dir.File(absl::StrCat("f", 1000 + i)));
    std::ofstream(names.back()) << i;
  }
  DispatcherConfig dc;
  dc.file_split_files = 8;
  dc.worker_timeout_ms = 500;
  StartService(2, dc);
  DistributeOptions o = Options();
  o.processing_mode = "distributed_epoch";
  ASSERT_OK_AND_ASSIGN(auto it,
                       Dataset::ListFiles(dir.path() + "/f*").Apply(Distribute(o)).MakeIterator());
  std::vector<std::string> got;
  auto take = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto e = it->Next();
      ASSERT_OK(e.status());
      if (!e->has_value()) return;
      got.emplace_back((**e)[0].str(0));
    }
  };
  ASSERT_NO_FATAL_FAILURE(WithHangGuard([&] { take(30); }));
  workers_[1]->Stop();
  ASSERT_NO_FATAL_FAILURE(WithHangGuard([&] { take(kFiles * 2); }));
  EXPECT_THAT(got, UnorderedElementsAreArray(names));
}

// A service iterator cannot save its position yet (the issue on service
// checkpoints): Save() says so, naming Distribute, and reading goes on.
TEST_P(ServiceTest, SavingADistributeIteratorIsUnimplementedNamingIt) {
  StartService(1);
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(5).Apply(Distribute(Options())).Map(x + 1)
                                    .MakeIterator());
  ASSERT_OK(it->Next().status());
  EXPECT_STATUS(it->Save(), absl::StatusCode::kUnimplemented, "Distribute cannot save");
  std::vector<int64_t> rest;
  ASSERT_NO_FATAL_FAILURE(DrainRest(*it, &rest));
  EXPECT_EQ(rest.size(), 4u);
}

TEST_P(ServiceTest, DataShardingWorkerAtShardOneReadsEveryFifthElement) {
  StartService(1, OnlyShardFree(5, 1));
  DistributeOptions o = Options();
  o.processing_mode = "data";
  std::vector<int64_t> want;
  for (int64_t i = 1; i < 100; i += 5) want.push_back(i);
  // The other shards have no worker, so the iteration does not end: read
  // this shard's 20 elements.
  ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] {
                         return CollectScalars<int64_t>(
                             Dataset::Range(100).Apply(Distribute(o)).Take(20));
                       }));
  EXPECT_THAT(v, UnorderedElementsAreArray(want));
  // hint: the pipeline says where to shard.
  o.processing_mode = "hint";
  ASSERT_OK_AND_ASSIGN(auto h, WithHangGuard([&] {
                         return CollectScalars<int64_t>(Dataset::Range(100)
                                                            .Shard(kShardHint, kShardHint)
                                                            .Map(x * 10)
                                                            .Apply(Distribute(o))
                                                            .Take(20));
                       }));
  for (int64_t& w : want) w *= 10;
  EXPECT_THAT(h, UnorderedElementsAreArray(want));
}

TEST_P(ServiceTest, DataShardingOverFiveWorkersDeliversEachElementOnceInEachWorkersOrder) {
  DispatcherConfig dc;
  dc.worker_addresses.assign(5, "127.0.0.1:%port%");
  StartService(5, dc);
  DistributeOptions o = Options();
  o.processing_mode = "data";
  o.max_outstanding_requests = 8;
  constexpr int64_t kN = 500;
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(o)).MakeIterator());
    std::vector<int64_t> v = DrainScalars(*it);
    ASSERT_THAT(v, UnorderedElementsAreArray(Iota(kN)));
    // Worker i reads the values v with v % 5 == i; across workers the
    // elements interleave, but each worker's come in order.
    std::vector<int64_t> per_worker[5];
    for (int64_t x : v) per_worker[x % 5].push_back(x);
    for (int w = 0; w < 5; ++w) {
      EXPECT_TRUE(std::is_sorted(per_worker[w].begin(), per_worker[w].end()))
          << "pass " << pass << ": shard " << w << " out of order";
    }
  }
  // A worker matching no entry cannot register.
  WorkerConfig wc;
  wc.dispatcher_address = dispatcher_->address();
  wc.data_transfer_protocol = GetParam();
  EXPECT_STATUS(WorkerServer::Start(wc), absl::StatusCode::kFailedPrecondition,
                "not in the dispatcher's worker_addresses");
}

// Static sharding keeps each worker's order: TF's worker 1 of 5 gives
// exactly [1, 6, 11, 16] from range(20).
TEST_P(ServiceTest, DataShardingDeliversAWorkersShardInItsOrder) {
  StartService(1, OnlyShardFree(5, 1));
  DistributeOptions o = Options();
  o.processing_mode = "data";
  o.max_outstanding_requests = 8;
  for (int pass = 0; pass < 5; ++pass) {
    // The other shards have no worker: read this one's four elements.
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(20).Apply(Distribute(o)).Take(4).MakeIterator());
    ASSERT_EQ(DrainScalars(*it), std::vector<int64_t>({1, 6, 11, 16})) << "pass " << pass;
  }
}

TEST_P(ServiceTest, FileShardingReadsOnlyTheWorkersFiles) {
  StartService(1, OnlyShardFree(5, 3));
  sluice_test::TempDir dir;
  std::vector<std::string> all, mine;
  for (int f = 0; f < 10; ++f) {
    std::vector<std::string> recs = {"f" + std::to_string(f) + "r0", "f" + std::to_string(f) + "r1"};
    ASSERT_OK(WriteTFRecordFile(dir.File("part-0" + std::to_string(f)), recs));
    if (f % 5 == 3) mine.insert(mine.end(), recs.begin(), recs.end());
  }
  DistributeOptions o = Options();
  o.processing_mode = "file";
  Dataset files = Dataset::ReadRecords(Dataset::ListFiles(dir.File("part-*")));
  ASSERT_OK_AND_ASSIGN(auto out, WithHangGuard([&] {
                         return Collect(files.Apply(Distribute(o)).Take(4));
                       }));
  std::vector<std::string> got;
  for (const Element& e : out) got.push_back(std::string(e[0].str(0)));
  EXPECT_THAT(got, UnorderedElementsAreArray(mine));
  // Fewer files than workers: a clear error, not a hang or a short epoch.
  Dataset three = Dataset::ReadRecords(Dataset::ListFiles(dir.File("part-0[012]")));
  EXPECT_STATUS(WithHangGuard([&] { return Collect(three.Apply(Distribute(o))); }),
                absl::StatusCode::kInvalidArgument, "3 file(s) for 5 workers");
  // Static sharding needs worker_addresses.
  TearDown();
  workers_.clear();
  StartService(1);
  o = Options();
  o.processing_mode = "data";
  EXPECT_STATUS(WithHangGuard([&] { return Collect(Dataset::Range(3).Apply(Distribute(o))); }),
                absl::StatusCode::kFailedPrecondition, "worker_addresses");
}

TEST_P(ServiceTest, StaticShardOfALostWorkerIsReadAgainByTheWorkerTakingItsPlace) {
  DispatcherConfig dc;
  dc.worker_addresses.assign(2, "127.0.0.1:%port%");
  dc.worker_timeout_ms = 500;
  dc.job_gc_check_interval_ms = 100;
  StartService(2, dc);
  DistributeOptions o = Options();
  o.processing_mode = "data";
  constexpr int64_t kN = 2000;
  ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(o)).MakeIterator());
  std::vector<int64_t> got;
  ASSERT_NO_FATAL_FAILURE(TakeScalars(*it, 30, &got));
  workers_[1]->Stop();
  // Its entry is free once the dispatcher gave it up.
  WithHangGuard([&] {
    while (true) {
      WorkerConfig wc;
      wc.dispatcher_address = dispatcher_->address();
      wc.heartbeat_interval_ms = 200;
      wc.data_transfer_protocol = GetParam();
      auto w = WorkerServer::Start(wc);
      if (w.ok()) {
        workers_.push_back(*std::move(w));
        return 0;
      }
      EXPECT_TRUE(absl::IsFailedPrecondition(w.status())) << w.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  DrainRest(*it, &got);
  auto counts = Counts(got);
  ASSERT_EQ(counts.size(), static_cast<size_t>(kN)) << "elements missing";
  for (auto [value, n] : counts) {
    if (value % 2 == 0) {
      ASSERT_EQ(n, 1) << "shard 0 value " << value;
    }
  }
}

// ---- coordinated reads ------------------------------------------------------------

// With data sharding over `workers` entries, worker i produces the values
// v of Range(workers * 1000).Repeat() with v % workers == i: a value names
// its worker.
DispatcherConfig ShardPerWorker(int workers) {
  DispatcherConfig dc;
  dc.worker_addresses.assign(workers, "127.0.0.1:%port%");
  return dc;
}

// How consumers of ReadCoordinated read: the job (default
// "sync<consumers>"), the checkpoint each consumer resumes from (none when
// empty), and where each saves its iterator after its rounds (when set).
struct CoordinatedRead {
  std::string job;
  std::vector<std::string> resume;
  std::vector<std::string>* saved = nullptr;
};

// Each of `consumers` threads reads `rounds` elements as consumer i of the
// job; returns what each read, in order.
std::vector<std::vector<int64_t>> ReadCoordinated(const DistributeOptions& base, int consumers,
                                                  int rounds, int64_t values,
                                                  const std::function<void(int)>& after_round = {},
                                                  const CoordinatedRead& how = {}) {
  std::vector<std::vector<int64_t>> got(consumers);
  if (how.saved != nullptr) how.saved->assign(consumers, "");
  std::vector<std::thread> threads;
  for (int c = 0; c < consumers; ++c) {
    threads.emplace_back([&, c] {
      DistributeOptions o = base;
      o.job_name = how.job.empty() ? "sync" + std::to_string(consumers) : how.job;
      o.num_consumers = consumers;
      o.consumer_index = c;
      const Dataset ds = Dataset::Range(values).Repeat().Apply(Distribute(o));
      auto it = static_cast<size_t>(c) < how.resume.size() && !how.resume[c].empty()
                    ? ds.MakeIterator(how.resume[c])
                    : ds.MakeIterator();
      ASSERT_OK(it);
      for (int r = 0; r < rounds; ++r) {
        auto e = (*it)->Next();
        ASSERT_OK(e);
        ASSERT_TRUE(e->has_value());
        got[c].push_back((**e)[0].at<int64_t>(0));
        if (c == 0 && after_round) after_round(r);
      }
      if (how.saved != nullptr) {
        auto saved = (*it)->Save();
        ASSERT_OK(saved);
        (*how.saved)[c] = *saved;
      }
    });
  }
  WithHangGuard([&] {
    for (auto& t : threads) t.join();
    return 0;
  });
  return got;
}

// Every round's elements come from one worker (the same value mod
// `workers`) and are distinct; returns the worker of each round.
std::vector<int64_t> CheckRounds(const std::vector<std::vector<int64_t>>& got, int workers) {
  std::vector<int64_t> worker_of_round;
  for (size_t r = 0; r < got[0].size(); ++r) {
    std::set<int64_t> values;
    for (const auto& consumer : got) {
      EXPECT_EQ(consumer[r] % workers, got[0][r] % workers) << "round " << r;
      values.insert(consumer[r]);
    }
    EXPECT_EQ(values.size(), got.size()) << "round " << r << " repeats an element";
    worker_of_round.push_back(got[0][r] % workers);
  }
  return worker_of_round;
}

TEST_P(ServiceTest, CoordinatedReadsServeEachRoundFromOneWorker) {
  StartService(3, ShardPerWorker(3));
  DistributeOptions o = Options();
  o.processing_mode = "data";
  for (int consumers : {2, 5}) {
    SCOPED_TRACE(consumers);
    auto got = ReadCoordinated(o, consumers, 30, 3000);
    ASSERT_FALSE(HasFatalFailure());
    std::vector<int64_t> workers = CheckRounds(got, 3);
    // Round robin: consecutive rounds come from the three workers in turn.
    for (size_t r = 3; r < workers.size(); ++r) EXPECT_EQ(workers[r], workers[r - 3]);
    EXPECT_EQ(std::set<int64_t>(workers.begin(), workers.end()).size(), 3u);
  }
}

TEST_P(ServiceTest, CoordinatedReadsWorkerJoiningMidJobJoinsAtAnAgreedRound) {
  StartService(2, ShardPerWorker(3));
  DistributeOptions o = Options();
  o.processing_mode = "data";
  // Consumer 0 slows down after the new worker starts (1 ms a round), so
  // the join (a heartbeat, then a round both consumers agree to) happens
  // well within the rounds read, also on a loaded machine.
  auto got = ReadCoordinated(o, 2, 1500, 3000, [&](int r) {
    if (r == 10) StartWorkers(1);  // takes the third entry
    if (r >= 10) absl::SleepFor(absl::Milliseconds(1));
  });
  ASSERT_FALSE(HasFatalFailure());
  std::vector<int64_t> workers = CheckRounds(got, 3);
  auto first_from_new = std::find(workers.begin(), workers.end(), 2);
  ASSERT_NE(first_from_new, workers.end()) << "the new worker never served a round";
  // From its first round on, the three workers take turns.
  for (auto r = first_from_new + 3; r < workers.end(); ++r) EXPECT_EQ(*r, *(r - 3));
}

TEST_P(ServiceTest, CoordinatedReadsGoOnWhenAWorkerIsLost) {
  DispatcherConfig dc = ShardPerWorker(3);
  dc.worker_timeout_ms = 500;
  dc.job_gc_check_interval_ms = 100;
  StartService(3, dc);
  DistributeOptions o = Options();
  o.processing_mode = "data";
  const int64_t skipped_before = GetDataServiceStats().rounds_skipped;
  auto got = ReadCoordinated(o, 2, 150, 3000, [&](int r) {
    if (r == 20) workers_[2]->Stop();
  });
  ASSERT_FALSE(HasFatalFailure()) << "reading stalled after a worker was lost";
  // Its rounds are skipped by both consumers; the other two go on in turn.
  EXPECT_GT(GetDataServiceStats().rounds_skipped, skipped_before);
  for (const auto& consumer : got) {
    EXPECT_NE(consumer.back() % 3, 2);
    EXPECT_NE(consumer[consumer.size() - 2] % 3, 2);
  }
}

// A coordinated job's checkpoint is its round: consumers that saved at the
// same step resume together at that round (its worker is the one an
// uninterrupted job would have read it from) and save again; checkpoints
// of different rounds do not merge, and a consumer cannot join a job resumed at another round.
TEST_P(ServiceTest, CoordinatedReadsResumeEveryConsumerAtTheSavedRound) {
  StartService(3, ShardPerWorker(3));
  DistributeOptions o = Options();
  o.processing_mode = "data";
  std::vector<std::string> saved;
  auto first = ReadCoordinated(o, 2, 10, 3000, {}, {"first", {}, &saved});
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<int64_t> workers = CheckRounds(first, 3);
  ASSERT_OK_AND_ASSIGN(std::string merged, MergeCheckpoints(saved));
  // Consumer 0 restores the merged checkpoint, consumer 1 its own one.
  auto resumed = ReadCoordinated(o, 2, 9, 3000, {}, {"second", {merged, saved[1]}, &saved});
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<int64_t> resumed_workers = CheckRounds(resumed, 3);
  for (size_t r = 0; r < resumed_workers.size(); ++r) {
    EXPECT_EQ(resumed_workers[r], workers[(10 + r) % 3]) << "resumed round " << 10 + r;
  }
  // Consumers saved at different steps (the resumed ones saved at 19).
  std::vector<std::string> uneven;
  ReadCoordinated(o, 2, 4, 3000, {}, {"third", {}, &uneven});
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_STATUS(MergeCheckpoints({uneven[0], saved[1]}).status(),
                absl::StatusCode::kInvalidArgument, "rounds 4 and 19");
  o.job_name = "fourth";
  o.num_consumers = 2;
  o.consumer_index = 0;
  const Dataset ds = Dataset::Range(3000).Repeat().Apply(Distribute(o));
  ASSERT_OK_AND_ASSIGN(auto at4, ds.MakeIterator(uneven[0]));
  o.consumer_index = 1;
  EXPECT_STATUS(Dataset::Range(3000).Repeat().Apply(Distribute(o)).MakeIterator(saved[1]).status(),
                absl::StatusCode::kFailedPrecondition, "round 19");
  // A job of another consumer count is another pipeline.
  o.job_name = "fifth";
  o.num_consumers = 3;
  EXPECT_STATUS(Dataset::Range(3000).Repeat().Apply(Distribute(o)).MakeIterator(saved[1]).status(),
                absl::StatusCode::kInvalidArgument, "another pipeline");
}

TEST_P(ServiceTest, CoordinatedReadsNeedAJobNameAndAnInfiniteDataset) {
  StartService(1);
  DistributeOptions o = Options("sync");
  o.num_consumers = 2;
  o.consumer_index = 0;
  EXPECT_STATUS(WithHangGuard([&] { return Collect(Dataset::Range(10).Apply(Distribute(o))); }),
                absl::StatusCode::kInvalidArgument, "need an infinite dataset");
  o.job_name = "";
  EXPECT_STATUS(Dataset::Range(10).Repeat().Apply(Distribute(o)).status(),
                absl::StatusCode::kInvalidArgument, "need a job_name");
  o.job_name = "sync";
  o.consumer_index = 2;
  EXPECT_STATUS(Dataset::Range(10).Repeat().Apply(Distribute(o)).status(),
                absl::StatusCode::kInvalidArgument, "consumer_index in [0, num_consumers)");
  o.consumer_index.reset();
  EXPECT_STATUS(Dataset::Range(10).Repeat().Apply(Distribute(o)).status(),
                absl::StatusCode::kInvalidArgument, "both consumer_index and num_consumers");
}

// In-process workers of the dispatcher at `dispatcher_address`, one per
// entry of `protocols`, each serving elements over that protocol.
absl::StatusOr<std::vector<std::unique_ptr<WorkerServer>>> StartWorkersServing(
    const std::string& dispatcher_address, const std::vector<std::string>& protocols) {
  std::vector<std::unique_ptr<WorkerServer>> workers;
  for (const std::string& protocol : protocols) {
    WorkerConfig wc;
    wc.dispatcher_address = dispatcher_address;
    wc.heartbeat_interval_ms = 200;
    wc.data_transfer_protocol = protocol;
    SLUICE_ASSIGN_OR_RETURN(auto w, WorkerServer::Start(wc));
    workers.push_back(std::move(w));
  }
  return workers;
}

// A transfer protocol registered by another module plugs into the worker
// and the client by its name alone: here gRPC on a port of its own
// ("grpc-own-port"). A client of that protocol reads its workers through
// it; a client of another protocol reads the same worker over the gRPC
// fallback, and a worker of another protocol the same way.
TEST(TransferProtocolTest, ARegisteredProtocolServesWithoutChangesToTheWorkerOrTheClient) {
  static std::atomic<int> connects{0};
  const internal::TransportProtocol* grpc =
      *internal::FindTransportProtocol(internal::kGrpcProtocol, "test");
  internal::TransportProtocol own = *grpc;
  own.name = "grpc-own-port";
  own.connect = [grpc](const std::string& address, const internal::ElementTransportOptions& o) {
    connects++;
    return grpc->connect(address, o);
  };
  own.serve = [grpc](internal::ElementServerOptions o) {
    o.add_grpc_service = nullptr;  // its own server on o.listen_address
    return grpc->serve(std::move(o));
  };
  absl::Status registered = internal::RegisterTransportProtocol(own);
  ASSERT_TRUE(registered.ok() || absl::IsAlreadyExists(registered)) << registered;

  ASSERT_OK_AND_ASSIGN(auto dispatcher, DispatchServer::Start({}));
  ASSERT_OK_AND_ASSIGN(auto workers,
                       StartWorkersServing(dispatcher->address(), {"grpc-own-port", "ucx"}));
  EXPECT_NE(workers[0]->transfer_address(), workers[0]->address()) << "not on its own port";
  for (const std::string protocol : {"grpc-own-port", "ucx"}) {
    SCOPED_TRACE(protocol);
    const int before = connects.load();
    DistributeOptions o;
    o.service = dispatcher->target();
    o.data_transfer_protocol = protocol;
    ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] {
                           return CollectScalars<int64_t>(Dataset::Range(20).Apply(Distribute(o)));
                         }));
    std::vector<int64_t> want;
    for (int64_t i = 0; i < 20; ++i) want.insert(want.end(), {i, i});
    EXPECT_THAT(v, UnorderedElementsAreArray(want));
    // Its own protocol to the worker that serves it, nowhere else.
    EXPECT_EQ(connects.load() - before, protocol == "grpc-own-port" ? 1 : 0);
  }
  for (auto& w : workers) w->Stop();
  dispatcher->Stop();
}

// Every fourth reply is lost in transit after the worker handed its
// elements out (the request fails with DeadlineExceeded, as when a
// connection drops a reply): what the UCX client met after a peer died.
class LossyTransport final : public ElementTransport {
 public:
  LossyTransport(std::unique_ptr<ElementTransport> inner, std::atomic<int64_t>* replies,
                 std::atomic<int64_t>* lost)
      : inner_(std::move(inner)), replies_(replies), lost_(lost) {}
  void GetElementAsync(const ElementRequest& request, ElementCallback done) override {
    inner_->GetElementAsync(request, [this, done = std::move(done)](
                                         absl::StatusOr<ElementResult> r) {
      if (r.ok() && ++*replies_ % 4 == 0) {
        ++*lost_;
        return done(absl::DeadlineExceededError("the reply was lost (test)"));
      }
      done(std::move(r));
    });
  }
  void Cancel() override { inner_->Cancel(); }
  std::string protocol() const override { return inner_->protocol(); }

 private:
  std::unique_ptr<ElementTransport> inner_;
  std::atomic<int64_t>* replies_;
  std::atomic<int64_t>* lost_;
};

std::atomic<int64_t> g_lossy_replies{0}, g_lost_replies{0};

// "<base>-lossy": `base` with every 4th reply lost (LossyTransport),
// registered once.
std::string LossyProtocol(const std::string& base) {
  const internal::TransportProtocol* inner = *internal::FindTransportProtocol(base, "test");
  internal::TransportProtocol lossy = *inner;
  lossy.name = base + "-lossy";
  lossy.connect = [inner](const std::string& address, const internal::ElementTransportOptions& o)
      -> absl::StatusOr<std::unique_ptr<ElementTransport>> {
    auto t = inner->connect(address, o);
    if (!t.ok()) return t.status();
    return std::unique_ptr<ElementTransport>(
        new LossyTransport(*std::move(t), &g_lossy_replies, &g_lost_replies));
  };
  lossy.serve = [inner](internal::ElementServerOptions o) {
    o.add_grpc_service = nullptr;  // its own server (gRPC), on o.listen_address
    return inner->serve(std::move(o));
  };
  absl::Status registered = internal::RegisterTransportProtocol(lossy);
  EXPECT_TRUE(registered.ok() || absl::IsAlreadyExists(registered)) << registered;
  return lossy.name;
}

// Range(300) read through Distribute over `protocol` from two in-process
// workers serving it, in parallel_epochs and distributed_epoch: every
// element exactly once per worker (parallel_epochs) or once, without a hang.
void ExpectRangeExactlyOnceOver(const std::string& protocol) {
  ASSERT_OK_AND_ASSIGN(auto dispatcher, DispatchServer::Start({}));
  ASSERT_OK_AND_ASSIGN(auto workers,
                       StartWorkersServing(dispatcher->address(), {protocol, protocol}));
  constexpr int64_t kElements = 300;
  for (const std::string mode : {"parallel_epochs", "distributed_epoch"}) {
    SCOPED_TRACE(mode);
    DistributeOptions o;
    o.service = dispatcher->target();
    o.data_transfer_protocol = protocol;
    o.fallback_to_grpc = false;
    o.processing_mode = mode;
    o.max_outstanding_requests = 4;
    ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] {
                           return CollectScalars<int64_t>(
                               Dataset::Range(kElements).Apply(Distribute(o)));
                         }));
    const int copies = mode == "parallel_epochs" ? 2 : 1;
    std::vector<int64_t> want;
    for (int64_t i = 0; i < kElements; ++i) want.insert(want.end(), copies, i);
    EXPECT_THAT(v, UnorderedElementsAreArray(want));
  }
  for (auto& w : workers) w->Stop();
  dispatcher->Stop();
}

// Replies lost in transit cost neither an element nor a duplicate: the
// worker keeps what it handed out until the consumer holds it and hands it
// out again when asked (worker/task_runner.h, "Redelivery"), in every
// processing mode, over both protocols.
TEST(LostReplyTest, ElementsOfRepliesLostInTransitArriveExactlyOnce) {
  for (const std::string base : {"grpc", "ucx"}) {
    SCOPED_TRACE(base);
    const std::string lossy = LossyProtocol(base);
    const int64_t lost_before = g_lost_replies.load();
    ExpectRangeExactlyOnceOver(lossy);
    EXPECT_GE(g_lost_replies.load() - lost_before, 4)
        << "the test lost too few replies to mean anything";
  }
}

// A primary data path that reaches the worker but whose replies never come
// back (UCX silent after a peer's death, seen in the churn test): the
// client falls back to gRPC, and the elements the worker handed out in the
// lost replies are asked for again, not left a gap (which hung the
// iteration: the reissued requests got later elements, and nobody asked
// for the lost ones).
TEST(LostReplyTest, FallingBackAfterRepliesThatNeverCameLosesNothing) {
  const internal::TransportProtocol* grpc = *internal::FindTransportProtocol("grpc", "test");
  internal::TransportProtocol silent = *grpc;
  silent.name = "grpc-silent-primary";
  silent.connect = [grpc](const std::string& address, const internal::ElementTransportOptions& o)
      -> absl::StatusOr<std::unique_ptr<ElementTransport>> {
    auto primary = grpc->connect(address, o);
    if (!primary.ok()) return primary.status();
    auto fallback = grpc->connect(address, o);
    if (!fallback.ok()) return fallback.status();
    // Every reply of the primary is lost (LossyTransport loses every 4th;
    // this one every one).
    class Silent final : public ElementTransport {
     public:
      explicit Silent(std::unique_ptr<ElementTransport> inner) : inner_(std::move(inner)) {}
      void GetElementAsync(const ElementRequest& request, ElementCallback done) override {
        inner_->GetElementAsync(request, [done = std::move(done)](absl::StatusOr<ElementResult>) {
          done(absl::DeadlineExceededError("no reply (test)"));
        });
      }
      void Cancel() override { inner_->Cancel(); }
      std::string protocol() const override { return "ucx"; }

     private:
      std::unique_ptr<ElementTransport> inner_;
    };
    return MakeFallbackTransport(std::make_unique<Silent>(*std::move(primary)),
                                 *std::move(fallback), address, /*allow_fallback=*/true);
  };
  silent.serve = [grpc](internal::ElementServerOptions o) {
    o.add_grpc_service = nullptr;  // its own server, on o.listen_address
    return grpc->serve(std::move(o));
  };
  absl::Status registered = internal::RegisterTransportProtocol(silent);
  ASSERT_TRUE(registered.ok() || absl::IsAlreadyExists(registered)) << registered;
  ExpectRangeExactlyOnceOver(silent.name);
}

// Coordinated reads: a round whose reply was lost is asked again and gets
// the same element, so every round still gives each consumer its own
// element, in order, none skipped or repeated (it used to end the
// iteration: "asked for round R twice").
TEST(LostReplyTest, CoordinatedRoundsWhoseRepliesWereLostArriveExactlyOnce) {
  for (const std::string base : {"grpc", "ucx"}) {
    SCOPED_TRACE(base);
    const std::string lossy = LossyProtocol(base);
    ASSERT_OK_AND_ASSIGN(auto dispatcher, DispatchServer::Start({}));
    WorkerConfig wc;
    wc.dispatcher_address = dispatcher->address();
    wc.heartbeat_interval_ms = 200;
    wc.data_transfer_protocol = lossy;
    ASSERT_OK_AND_ASSIGN(auto worker, WorkerServer::Start(wc));
    const int64_t lost_before = g_lost_replies.load();
    constexpr int kRounds = 200;
    std::vector<std::vector<int64_t>> got(2);
    std::vector<absl::Status> errors(2);
    std::vector<std::thread> consumers;
    for (int c = 0; c < 2; ++c) {
      consumers.emplace_back([&, c] {
        DistributeOptions o;
        o.service = dispatcher->target();
        o.data_transfer_protocol = lossy;
        o.fallback_to_grpc = false;
        o.max_outstanding_requests = 4;
        o.job_name = "rounds-" + base;
        o.num_consumers = 2;
        o.consumer_index = c;
        errors[c] = [&]() -> absl::Status {
          SLUICE_ASSIGN_OR_RETURN(
              auto it, Dataset::Range(1000).Repeat().Apply(Distribute(o)).MakeIterator());
          for (int r = 0; r < kRounds; ++r) {
            SLUICE_ASSIGN_OR_RETURN(std::optional<Element> e, it->Next());
            if (!e.has_value()) return absl::InternalError("end of input");
            got[c].push_back((*e)[0].at<int64_t>(0));
          }
          return absl::OkStatus();
        }();
      });
    }
    WithHangGuard([&] {
      for (auto& t : consumers) t.join();
      return 0;
    });
    ASSERT_OK(errors[0]);
    ASSERT_OK(errors[1]);
    // One worker: each round takes its next two elements, 2k and 2k + 1,
    // one per consumer (rounds may open out of order); no round twice, and
    // none beyond the rounds a consumer may have open skipped.
    std::set<int64_t> pairs;
    for (int r = 0; r < kRounds; ++r) {
      const int64_t k = std::min(got[0][r], got[1][r]) / 2;
      EXPECT_THAT((std::vector<int64_t>{got[0][r], got[1][r]}),
                  ::testing::UnorderedElementsAre(2 * k, 2 * k + 1))
          << "round " << r;
      EXPECT_TRUE(pairs.insert(k).second) << "round " << r << " repeats elements " << 2 * k;
    }
    EXPECT_LT(*pairs.rbegin(),
              kRounds + 2 * static_cast<int64_t>(internal::TaskRunner::kMaxOpenRounds));
    EXPECT_GE(g_lost_replies.load() - lost_before, 10)
        << "the test lost too few replies to mean anything";
    worker->Stop();
    dispatcher->Stop();
  }
}

// Protobuf parses at most 100 nested messages, and gRPC's parser and the
// journal's keep that limit: a pipeline as deep as the check lets through
// is served, journaled and replayed; one op more is refused at Distribute
// with a message (the service answered it with an empty INTERNAL error).
TEST_P(ServiceTest, APipelineAsDeepAsTheWireCarriesIsServedAndADeeperOneIsRefusedClearly) {
  sluice_test::TempDir dir;
  DispatcherConfig dc;
  dc.fault_tolerant_mode = true;
  dc.work_dir = dir.path();
  StartService(1, dc);
  auto chain = [](int maps) {
    Dataset d = Dataset::Range(3);
    for (int i = 0; i < maps; ++i) d = d.Map(x + 1);
    return d;
  };
  int deepest = 0;
  while (internal::CheckWireDepth(chain(deepest + 1).def(), "test").ok()) ++deepest;
  EXPECT_GE(deepest, 40);
  ASSERT_OK_AND_ASSIGN(auto v, WithHangGuard([&] {
                         return CollectScalars<int64_t>(
                             chain(deepest).Apply(Distribute(Options())));
                       }));
  EXPECT_THAT(v, ::testing::UnorderedElementsAre(deepest, deepest + 1, deepest + 2));
  // The journal holds it: a dispatcher started on it knows the definition.
  ASSERT_OK_AND_ASSIGN(const std::string id, RegisterDataset(chain(deepest), Options()));
  for (auto& w : workers_) w->Stop();
  workers_.clear();
  dispatcher_.reset();  // closes the journal
  dc.metrics_port = 0;
  StartDispatcher(dc);  // replays it
  auto metrics = sluice_test::HttpGet(dispatcher_->metrics_port(), "/metrics");
  ASSERT_OK(metrics);
  EXPECT_EQ(sluice_test::SampleValue(metrics->body, "sluice_dispatcher_datasets"), 1);
  ASSERT_OK_AND_ASSIGN(const std::string again, RegisterDataset(chain(deepest), Options()));
  EXPECT_EQ(again, id);

  Dataset deeper = chain(deepest + 1).Apply(Distribute(Options()));
  EXPECT_EQ(deeper.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(deeper.status().message(),
              ::testing::HasSubstr("nests deeper than the service carries"));
  EXPECT_EQ(RegisterDataset(chain(deepest + 1), Options()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Transports, ServiceTest, ::testing::Values("grpc", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sluice
