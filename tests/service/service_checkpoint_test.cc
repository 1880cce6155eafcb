// Service checkpoints (docs/checkpointing.md) with real processes
// (multiprocess_util.h), over gRPC and UCX on TCP and on shared memory: a
// distributed_epoch consumer saves its iterator at step k, the whole
// service goes away, and a new one -- another dispatcher, another number of
// workers -- resumes from the checkpoint: over the two runs every element
// arrives exactly once. Labelled `fault`. Timeouts are hang guards only.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sluice/client/distribute.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "tests/service/multiprocess_util.h"
#include "tests/test_util.h"

namespace sluice::mp_test {
namespace {

constexpr int64_t kN = 3000;

class CheckpointTest : public MultiProcessTest, public ::testing::WithParamInterface<Transport> {
 protected:
  void SetUp() override {
    MultiProcessTest::SetUp();
    if (!GetParam().ucx_tls.empty()) setenv("UCX_TLS", GetParam().ucx_tls.c_str(), 1);
  }

  // A new service: `workers` workers and a dispatcher (fault tolerant, with
  // its journal in `journal` when set), none of the previous one's
  // processes left.
  absl::Status NewService(int workers, const std::string& journal = "") {
    KillAllChildren();
    children_.clear();
    workers_.clear();
    worker_ports_.clear();
    std::vector<std::string> dargs = {"--range_split_elements", "50", "--worker_timeout_ms",
                                      "1500"};
    if (!journal.empty()) {
      dispatcher_port_ = UnusedLoopbackPort();
      dargs.insert(dargs.end(), {"--fault_tolerant_mode", "--work_dir", journal});
    } else {
      dispatcher_port_ = 0;
    }
    return StartCluster(workers, dargs,
                        {"--heartbeat_interval_ms", "200", "--task_buffer_elements", "4",
                         "--data_transfer_protocol", GetParam().protocol});
  }

  // x * 3 on the workers, + 1 after Distribute (a local op resumed too).
  Dataset Pipeline(const std::string& job_name = "") {
    DistributeOptions opt;
    opt.service = ServiceTarget();
    opt.processing_mode = "distributed_epoch";
    opt.data_transfer_protocol = GetParam().protocol;
    opt.job_name = job_name;
    return Dataset::Range(kN).Map(expr::x * 3).Apply(Distribute(opt)).Map(expr::x + 1);
  }

  void CheckResumesExactlyOnce(const std::function<Dataset()>& workers_part);

  // Reads `k` elements of `it` into `out`.
  static absl::Status Read(Iterator& it, int64_t k, std::vector<int64_t>* out) {
    for (int64_t i = 0; i < k; ++i) {
      auto e = it.Next();
      if (!e.ok()) return e.status();
      if (!e->has_value()) return absl::OutOfRangeError(absl::StrCat("ended after ", i));
      out->push_back((**e)[0].at<int64_t>(0));
    }
    return absl::OkStatus();
  }

  // Every element of the pipeline exactly once over `values`.
  static void ExpectExactlyOnce(std::vector<int64_t> values) {
    std::vector<int64_t> expected(kN);
    for (int64_t i = 0; i < kN; ++i) expected[i] = 3 * i + 1;
    ExpectExactlyOnce(std::move(values), expected);
  }
  // Each of `expected` (sorted) exactly once over `values`.
  static void ExpectExactlyOnce(std::vector<int64_t> values, const std::vector<int64_t>& expected) {
    std::sort(values.begin(), values.end());
    if (values == expected) return;
    std::map<int64_t, int> counts;
    for (int64_t v : values) ++counts[v];
    int missing = 0, repeated = 0;
    for (int64_t v : expected) {
      missing += counts[v] == 0;
      repeated += counts[v] > 1;
    }
    ADD_FAILURE() << values.size() << " elements for " << expected.size() << ": " << missing
                  << " missing, "
                  << repeated << " repeated";
  }
};

// A consumer saves at step k (none, one, a few splits in, most of the
// epoch), the service is torn down (SIGKILL), and a fresh dispatcher with
// two workers instead of three resumes it.
TEST_P(CheckpointTest, AConsumerResumesOnAFreshServiceWithFewerWorkersExactlyOnce) {
  Watchdog watchdog(absl::Seconds(240), "AConsumerResumesOnAFreshService",
                    [this] { KillAllChildren(); });
  for (const int64_t k : {int64_t{0}, int64_t{1}, int64_t{437}, int64_t{2500}}) {
    SCOPED_TRACE(absl::StrCat("saved after ", k, " elements"));
    ASSERT_OK(NewService(3));
    std::vector<int64_t> values;
    std::string checkpoint;
    {
      ASSERT_OK_AND_ASSIGN(auto it, Pipeline().MakeIterator());
      ASSERT_OK(Read(*it, k, &values));
      ASSERT_OK_AND_ASSIGN(checkpoint, it->Save());
      // The trainer reads on past its checkpoint, then dies.
      std::vector<int64_t> lost;
      ASSERT_OK(Read(*it, std::min<int64_t>(100, kN - k), &lost));
    }
    ASSERT_OK(NewService(2));
    ASSERT_OK_AND_ASSIGN(auto resumed, Pipeline().MakeIterator(checkpoint));
    ASSERT_OK(Drain(*resumed, &values));
    ExpectExactlyOnce(values);
  }
  watchdog.Disarm();
}

// A Prefetch or a parallel Map on the workers reads ahead of what it
// returns, across split ends; each element keeps the split it came from,
// so the pipeline stays resumable: with Filters below and above them (a
// split's elements dropped before and after the read-ahead), saved
// mid-epoch and resumed on a fresh service with fewer workers, every
// element arrives exactly once. The second pipeline is tf.data's idiom,
// map(num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE), with a Prefetch
// below it too.
TEST_P(CheckpointTest, ReadAheadOpsOnTheWorkersResumeExactlyOnce) {
  Watchdog watchdog(absl::Seconds(240), "ReadAheadOpsOnTheWorkersResume",
                    [this] { KillAllChildren(); });
  for (const bool parallel_map : {false, true}) {
    SCOPED_TRACE(parallel_map ? "a parallel Map and Prefetches" : "a Prefetch");
    CheckResumesExactlyOnce([parallel_map] {
      if (parallel_map) {
        return Dataset::Range(kN)
            .Filter(expr::x % 7 != 3)
            .Prefetch(4)
            .Map(expr::x * 3, kAutotune)
            .Filter(expr::x % 5 != 0)
            .Prefetch(kAutotune);
      }
      return Dataset::Range(kN).Filter(expr::x % 7 != 3).Prefetch(16).Map(expr::x * 3).Filter(
          expr::x % 5 != 0);
    });
  }
  watchdog.Disarm();
}

// `workers_part` before Distribute, saved after 0 and 700 elements and
// resumed on a fresh service with fewer workers: exactly once.
void CheckpointTest::CheckResumesExactlyOnce(const std::function<Dataset()>& workers_part) {
  std::vector<int64_t> expected;  // the same pipeline, run here
  ASSERT_OK_AND_ASSIGN(auto local, workers_part().Map(expr::x + 1).MakeIterator());
  ASSERT_OK(Drain(*local, &expected));
  std::sort(expected.begin(), expected.end());
  DistributeOptions opt;
  opt.processing_mode = "distributed_epoch";
  opt.data_transfer_protocol = GetParam().protocol;
  for (const int64_t k : {int64_t{0}, int64_t{700}}) {
    SCOPED_TRACE(absl::StrCat("saved after ", k, " elements"));
    ASSERT_OK(NewService(3));
    opt.service = ServiceTarget();
    std::vector<int64_t> values;
    std::string checkpoint;
    {
      ASSERT_OK_AND_ASSIGN(auto it,
                           workers_part().Apply(Distribute(opt)).Map(expr::x + 1).MakeIterator());
      ASSERT_OK(Read(*it, k, &values));
      ASSERT_OK_AND_ASSIGN(checkpoint, it->Save());
      std::vector<int64_t> lost;
      ASSERT_OK(Read(*it, 100, &lost));
    }
    ASSERT_OK(NewService(2));
    opt.service = ServiceTarget();
    ASSERT_OK_AND_ASSIGN(
        auto resumed,
        workers_part().Apply(Distribute(opt)).Map(expr::x + 1).MakeIterator(checkpoint));
    ASSERT_OK(Drain(*resumed, &values));
    ExpectExactlyOnce(values, expected);
  }
}

// A job preempted twice: the resumed iteration saves again (once at once,
// as a trainer's state_dict() at the resume step, and once after reading
// more), and the second checkpoint resumes on a third service.
TEST_P(CheckpointTest, AResumedIterationCheckpointsAndResumesAgain) {
  Watchdog watchdog(absl::Seconds(240), "AResumedIterationCheckpointsAndResumesAgain",
                    [this] { KillAllChildren(); });
  for (const int64_t more : {int64_t{0}, int64_t{700}}) {
    SCOPED_TRACE(absl::StrCat(more, " more after the first resume"));
    ASSERT_OK(NewService(3));
    std::vector<int64_t> values;
    std::string first;
    {
      ASSERT_OK_AND_ASSIGN(auto it, Pipeline().MakeIterator());
      ASSERT_OK(Read(*it, 900, &values));
      ASSERT_OK_AND_ASSIGN(first, it->Save());
    }
    ASSERT_OK(NewService(2));
    std::string second;
    {
      ASSERT_OK_AND_ASSIGN(auto it, Pipeline().MakeIterator(first));
      ASSERT_OK(Read(*it, more, &values));
      ASSERT_OK_AND_ASSIGN(second, it->Save());
      std::vector<int64_t> lost;
      ASSERT_OK(Read(*it, 50, &lost));
    }
    ASSERT_OK(NewService(1));
    ASSERT_OK_AND_ASSIGN(auto third, Pipeline().MakeIterator(second));
    ASSERT_OK(Drain(*third, &values));
    ExpectExactlyOnce(values);
  }
  watchdog.Disarm();
}

// The harder path: a worker is SIGKILLed before the checkpoint (its splits
// were handed out again), and the fault-tolerant dispatcher is SIGKILLed and
// restarted from its journal between the save and the restore, which
// resumes in a new job on that same dispatcher.
TEST_P(CheckpointTest, ResumesAfterAWorkerKillAndADispatcherRestart) {
  Watchdog watchdog(absl::Seconds(240), "ResumesAfterAWorkerKillAndADispatcherRestart",
                    [this] { KillAllChildren(); });
  ASSERT_OK(NewService(3, scratch_.File("journal")));
  std::vector<int64_t> values;
  std::string checkpoint;
  {
    ASSERT_OK_AND_ASSIGN(auto it, Pipeline().MakeIterator());
    ASSERT_OK(Read(*it, 600, &values));
    workers_[0]->KillAndReap();
    ASSERT_OK(Read(*it, 900, &values));
    ASSERT_OK_AND_ASSIGN(checkpoint, it->Save());
  }
  ASSERT_OK(KillAndRestartDispatcher());
  ASSERT_OK_AND_ASSIGN(auto resumed, Pipeline().MakeIterator(checkpoint));
  ASSERT_OK(Drain(*resumed, &values));
  ExpectExactlyOnce(values);
  watchdog.Disarm();
}

// Two consumers share a job; each saves at the same step; the merged
// checkpoint resumes the job on a fresh service for two consumers again,
// and for one.
TEST_P(CheckpointTest, TwoConsumersCheckpointsMergeAndResumeWithAnyConsumerCount) {
  Watchdog watchdog(absl::Seconds(240), "TwoConsumersCheckpointsMerge",
                    [this] { KillAllChildren(); });
  for (const int resumers : {2, 1}) {
    SCOPED_TRACE(absl::StrCat(resumers, " consumer(s) resume"));
    ASSERT_OK(NewService(3));
    std::vector<int64_t> values;
    std::vector<std::string> saved;
    {
      ASSERT_OK_AND_ASSIGN(auto a, Pipeline("train").MakeIterator());
      ASSERT_OK_AND_ASSIGN(auto b, Pipeline("train").MakeIterator());
      for (int step = 0; step < 40; ++step) {
        ASSERT_OK(Read(*a, 16, &values));
        ASSERT_OK(Read(*b, 16, &values));
      }
      ASSERT_OK_AND_ASSIGN(std::string sa, a->Save());
      ASSERT_OK_AND_ASSIGN(std::string sb, b->Save());
      saved = {sa, sb};
    }
    ASSERT_OK_AND_ASSIGN(std::string merged, MergeCheckpoints(saved));
    ASSERT_OK(NewService(2));
    std::vector<std::unique_ptr<Iterator>> its;
    for (int i = 0; i < resumers; ++i) {
      ASSERT_OK_AND_ASSIGN(auto it, Pipeline("train").MakeIterator(merged));
      its.push_back(std::move(it));
    }
    // Read together, as a trainer's ranks do (a consumer that stops
    // reading holds its buffered elements unacknowledged).
    std::vector<std::vector<int64_t>> read(its.size());
    std::vector<absl::Status> drained(its.size());
    std::vector<std::thread> readers;
    for (size_t i = 0; i < its.size(); ++i) {
      readers.emplace_back([&, i] { drained[i] = Drain(*its[i], &read[i]); });
    }
    for (auto& t : readers) t.join();
    for (size_t i = 0; i < its.size(); ++i) {
      ASSERT_OK(drained[i]);
      values.insert(values.end(), read[i].begin(), read[i].end());
    }
    ExpectExactlyOnce(values);
  }
  watchdog.Disarm();
}

// What cannot be saved says why; what cannot be restored is
// InvalidArgument, never a crash.
TEST_P(CheckpointTest, UnsavablePositionsAndBadCheckpointsAreClearErrors) {
  ASSERT_OK(NewService(1));
  DistributeOptions opt;
  opt.service = ServiceTarget();
  opt.data_transfer_protocol = GetParam().protocol;
  opt.processing_mode = "parallel_epochs";
  {
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(10).Apply(Distribute(opt)).MakeIterator());
    std::vector<int64_t> v;
    ASSERT_OK(Read(*it, 1, &v));
    auto s = it->Save();
    EXPECT_TRUE(absl::IsUnimplemented(s.status())) << s.status();
    EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("distributed_epoch"));
  }
  opt.processing_mode = "distributed_epoch";
  {
    // Batch before Distribute: elements are not tied to splits.
    ASSERT_OK_AND_ASSIGN(
        auto it, Dataset::Range(10).Batch(2).Apply(Distribute(opt)).MakeIterator());
    ASSERT_OK(it->Next().status());
    auto s = it->Save();
    EXPECT_TRUE(absl::IsUnimplemented(s.status())) << s.status();
    EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("Batch"));
  }
  // Ops that count across splits, or reorder across them, refuse before
  // any element was read.
  for (const auto& [name, ds] :
       std::vector<std::pair<std::string, Dataset>>{
           {"Take", Dataset::Range(10).Take(5)},
           {"Shard", Dataset::Range(10).Shard(2, 0)},
           {"Map", Dataset::Range(10).Map(expr::x * 2, 4, /*deterministic=*/false)},
           {"Batch", Dataset::Range(10).Prefetch(2).Batch(2).Prefetch(2)}}) {
    ASSERT_OK_AND_ASSIGN(auto it, ds.Apply(Distribute(opt)).MakeIterator());
    auto s = it->Save();
    EXPECT_TRUE(absl::IsUnimplemented(s.status())) << name << ": " << s.status();
    EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr(name));
  }
  // The same for a consumer of a registered dataset (from_dataset_id),
  // which learns the pipeline from the dispatcher.
  {
    ASSERT_OK_AND_ASSIGN(std::string id, RegisterDataset(Dataset::Range(10).Take(5), opt));
    ASSERT_OK_AND_ASSIGN(
        auto it, FromDatasetId("distributed_epoch", opt.service, id, opt).MakeIterator());
    auto s = it->Save();
    EXPECT_TRUE(absl::IsUnimplemented(s.status())) << s.status();
    EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("Take"));
  }
  ASSERT_OK_AND_ASSIGN(auto it, Pipeline().MakeIterator());
  std::vector<int64_t> v;
  ASSERT_OK(Read(*it, 5, &v));
  ASSERT_OK_AND_ASSIGN(std::string checkpoint, it->Save());
  it.reset();
  EXPECT_TRUE(absl::IsInvalidArgument(
      Pipeline().MakeIterator(checkpoint.substr(0, checkpoint.size() / 2)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MergeCheckpoints({checkpoint, "garbage"}).status()));
  // Another pipeline's checkpoint.
  EXPECT_TRUE(absl::IsInvalidArgument(
      Dataset::Range(kN).Apply(Distribute(opt)).MakeIterator(checkpoint).status()));
}

INSTANTIATE_TEST_SUITE_P(Transports, CheckpointTest, AllTransports(), TransportName);

}  // namespace
}  // namespace sluice::mp_test
