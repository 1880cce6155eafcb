// Workers that restart, join late, and a dispatcher restarted mid-epoch,
// with real processes (multiprocess_util.h), over each data path: gRPC, and
// UCX on TCP and on shared memory (UCX_TLS is set for the test process and
// its children; ctest runs every test in its own process). Each asserts
// what tf.data service promises (its fault_tolerance_test and
// data_service_ops_test):
//  - a worker restarted at the same address, or at a new one, gets a task
//    again, and its parallel_epochs data starts over;
//  - a worker that joins after the others handed out all their elements,
//    but before the client read them, gets a task, and its elements arrive;
//  - a fault-tolerant dispatcher killed (SIGKILL) or stopped (SIGTERM, as a
//    rolling update does) mid-distributed_epoch and restarted leaves a
//    client that reads every element once and then ends;
//  - (sluice's own) a worker frozen past the dispatcher's timeout, which
//    then comes back or dies, costs no element and no hang.
// Labelled `fault`. Timeouts are hang guards only.
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sluice/client/distribute.h"
#include "sluice/core/tensor.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "tests/service/multiprocess_util.h"
#include "tests/test_util.h"

namespace sluice::mp_test {
namespace {

class MembershipTest : public MultiProcessTest, public ::testing::WithParamInterface<Transport> {
 protected:
  void SetUp() override {
    MultiProcessTest::SetUp();
    if (!GetParam().ucx_tls.empty()) setenv("UCX_TLS", GetParam().ucx_tls.c_str(), 1);
  }

  std::vector<std::string> WorkerArgs(const std::string& name, int port) {
    return {"--dispatcher", absl::StrCat("127.0.0.1:", dispatcher_port_), "--port",
            std::to_string(port), "--port_file", scratch_.File(name + ".port"),
            "--heartbeat_interval_ms", "200", "--task_buffer_elements", "4",
            "--data_transfer_protocol", GetParam().protocol};
  }

  // Starts a worker named `name` on `port` (0: any) and waits until it serves.
  absl::StatusOr<int> StartWorker(const std::string& name, int port) {
    std::filesystem::remove(scratch_.File(name + ".port"));
    ChildProcess* w = Spawn(name, SLUICE_WORKER_BIN, WorkerArgs(name, port));
    if (w == nullptr) return absl::InternalError(absl::StrCat("cannot start ", name));
    workers_.push_back(w);
    return WaitForPort(w, scratch_.File(name + ".port"), absl::Now() + kStartDeadline);
  }

  // Starts a worker named `name` on any port into `live`; with `wait`,
  // returns once it serves.
  absl::Status SpawnWorker(const std::string& name, bool wait, std::vector<ChildProcess*>* live) {
    std::filesystem::remove(scratch_.File(name + ".port"));
    ChildProcess* w = Spawn(name, SLUICE_WORKER_BIN, WorkerArgs(name, 0));
    if (w == nullptr) return absl::InternalError(absl::StrCat("cannot start ", name));
    live->push_back(w);
    if (!wait) return absl::OkStatus();
    return WaitForPort(w, scratch_.File(name + ".port"), absl::Now() + kStartDeadline).status();
  }
  // SIGKILLs the worker of `live` that `rng` picks, and forgets it.
  static void KillOne(std::vector<ChildProcess*>* live, uint32_t* rng) {
    *rng = *rng * 1103515245u + 12345u;
    const size_t victim = (*rng >> 16) % live->size();
    (*live)[victim]->KillAndReap();
    live->erase(live->begin() + static_cast<std::ptrdiff_t>(victim));
  }

  DistributeOptions Options(const std::string& mode) {
    DistributeOptions opt;
    opt.service = ServiceTarget();
    opt.processing_mode = mode;
    opt.data_transfer_protocol = GetParam().protocol;
    return opt;
  }

  int NumWorkers() {
    auto w = GetWorkers(absl::StrCat("127.0.0.1:", dispatcher_port_));
    return w.ok() ? w->workers_size() : -1;
  }
};

// tf.data's testRestartWorker: one worker, read half of range(100), restart
// the worker (same port, or a new one); the client reads what the first
// worker had sent, then the whole range again from the restarted one, and
// then ends.
TEST_P(MembershipTest, RestartedWorkerGetsATaskAndStartsOver) {
  for (const bool same_port : {true, false}) {
    SCOPED_TRACE(same_port ? "same port" : "new port");
    children_.clear();
    workers_.clear();
    constexpr int64_t kN = 100;
    ASSERT_OK(StartCluster(0, {"--worker_timeout_ms", "2000"}, {}));
    const int port = UnusedLoopbackPort();
    ASSERT_OK(StartWorker("worker", port).status());
    Watchdog watchdog(absl::Seconds(120), "RestartedWorkerGetsATaskAndStartsOver",
                      [this] { KillAllChildren(); });
    DistributeOptions opt = Options("parallel_epochs");
    opt.max_outstanding_requests = 1;
    ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(opt)).MakeIterator());
    std::vector<int64_t> before;
    for (int64_t i = 0; i < kN / 2; ++i) {
      ASSERT_OK_AND_ASSIGN(auto e, it->Next());
      ASSERT_TRUE(e.has_value());
      before.push_back((*e)[0].at<int64_t>(0));
    }
    workers_[0]->KillAndReap();
    if (!same_port) {
      // The old worker is declared lost first; the iteration then waits
      // for a worker rather than ending short.
      ASSERT_OK(WaitUntil([&] { return NumWorkers() == 0; }, absl::Seconds(30),
                          "the killed worker being declared lost"));
    }
    ASSERT_OK(StartWorker("worker-restarted", same_port ? port : 0).status());
    std::vector<int64_t> after;
    ASSERT_OK(Drain(*it, &after));
    watchdog.Disarm();
    // The restarted worker's full copy arrived after whatever the first
    // one had already sent (at most a few buffered elements).
    std::map<int64_t, int> counts;
    for (int64_t v : after) ++counts[v];
    for (int64_t v = 0; v < kN; ++v) EXPECT_GE(counts[v], 1) << "value " << v << " never came";
    EXPECT_LE(after.size(), static_cast<size_t>(kN + kN / 2)) << "more than one new copy";
  }
}

// tf.data's testAddWorkerMidJob: with one worker, read half of
// range(2 * cores + 100); by then the worker has handed out every element
// (the client buffers them), but the client has not read them. A worker
// added now gets a task: every element arrives twice.
TEST_P(MembershipTest, WorkerJoiningBeforeTheClientReadToTheEndGetsATask) {
  constexpr int64_t kN = 104;
  ASSERT_OK(StartCluster(1, {}, {"--heartbeat_interval_ms", "200",
                                 "--data_transfer_protocol", GetParam().protocol}));
  Watchdog watchdog(absl::Seconds(120), "WorkerJoiningBeforeTheClientReadToTheEndGetsATask",
                    [this] { KillAllChildren(); });
  ASSERT_OK_AND_ASSIGN(
      auto it, Dataset::Range(kN).Apply(Distribute(Options("parallel_epochs"))).MakeIterator());
  std::vector<int64_t> values;
  for (int64_t i = 0; i < kN / 2; ++i) {
    ASSERT_OK_AND_ASSIGN(auto e, it->Next());
    ASSERT_TRUE(e.has_value());
    values.push_back((*e)[0].at<int64_t>(0));
  }
  // Let the first worker hand out everything it has.
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_OK(StartWorker("late", 0).status());
  ASSERT_OK(WaitUntil([&] { return NumWorkers() == 2; }, absl::Seconds(30),
                      "the late worker registering"));
  ASSERT_OK(Drain(*it, &values));
  watchdog.Disarm();
  std::map<int64_t, int> counts;
  for (int64_t v : values) ++counts[v];
  EXPECT_EQ(values.size(), static_cast<size_t>(2 * kN));
  for (int64_t v = 0; v < kN; ++v) EXPECT_EQ(counts[v], 2) << "value " << v;
}

// tf.data's fault_tolerance_test with a distributed_epoch range(100): the
// fault-tolerant dispatcher is killed and restarted mid-epoch; every
// element arrives once and Next() then returns the end.
TEST_P(MembershipTest, DispatcherRestartMidDistributedEpochEnds) {
  constexpr int64_t kN = 100;
  dispatcher_port_ = UnusedLoopbackPort();
  ASSERT_OK(StartCluster(1, {"--fault_tolerant_mode", "--work_dir", scratch_.File("journal")},
                         {"--heartbeat_interval_ms", "200", "--data_transfer_protocol",
                          GetParam().protocol}));
  Watchdog watchdog(absl::Seconds(120), "DispatcherRestartMidDistributedEpochEnds",
                    [this] { KillAllChildren(); });
  struct Case {
    int64_t outstanding;
    bool graceful;  // SIGTERM (a rolling update) rather than SIGKILL
  };
  for (const Case c : {Case{8, false}, Case{1, false}, Case{8, true}, Case{1, true}}) {
    const int64_t outstanding = c.outstanding;
    SCOPED_TRACE(absl::StrCat("max_outstanding_requests ", outstanding,
                              c.graceful ? ", SIGTERM" : ", SIGKILL"));
    DistributeOptions opt = Options("distributed_epoch");
    opt.max_outstanding_requests = outstanding;
    // The default dispatcher_timeout_ms (10 s): the UCX variants used to
    // stall about 5 s per reconnect after a graceful restart (their
    // connect waited for gRPC's 5 s backup poller; rpc/grpc_util.cc),
    // and under ASan two such stalls exceeded it.
    std::vector<int64_t> values;
    absl::Status restarted = absl::UnknownError("never restarted");
    {
      ASSERT_OK_AND_ASSIGN(auto it, Dataset::Range(kN).Apply(Distribute(opt)).MakeIterator());
      ASSERT_OK(Drain(*it, &values, [&](int64_t received) {
        if (received == kN / 2) restarted = KillAndRestartDispatcher(c.graceful);
      }));
    }
    ASSERT_OK(restarted);
    std::sort(values.begin(), values.end());
    std::vector<int64_t> expected(kN);
    for (int64_t i = 0; i < kN; ++i) expected[i] = i;
    EXPECT_EQ(values, expected);
  }
  watchdog.Disarm();
}

// Churn, as a user meets it: distributed_epoch over three worker processes,
// epochs in a loop. While elements flow, a worker is SIGKILLed every
// kKillEvery and a new one started on a new port; at the third kill the
// fault-tolerant dispatcher is SIGKILLed too and restarted on its port
// from its journal. Every epoch yields each element exactly once, and the
// epochs go on after the kills stop (no hang: the watchdog fails the test);
// every other epoch's pipeline reads ahead on the workers (a parallel Map
// and a Prefetch).
TEST_P(MembershipTest, WorkerKillsAndADispatcherRestartOverLoopingEpochsLoseNothing) {
  constexpr int64_t kN = 4000;
  constexpr int kWorkerKills = 6;
  constexpr absl::Duration kKillEvery = absl::Milliseconds(700);
  dispatcher_port_ = UnusedLoopbackPort();
  ASSERT_GT(dispatcher_port_, 0);
  ASSERT_OK(StartCluster(0,
                         {"--fault_tolerant_mode", "--work_dir", scratch_.File("journal"),
                          "--worker_timeout_ms", "1500", "--range_split_elements", "50"},
                         {}));
  std::vector<ChildProcess*> live;
  int started = 0;
  auto spawn_worker = [&](bool wait) {
    return SpawnWorker(absl::StrCat("churn", started++), wait, &live);
  };
  for (int i = 0; i < 3; ++i) ASSERT_OK(spawn_worker(true));
  Watchdog watchdog(absl::Seconds(240), "WorkerKillsAndADispatcherRestartOverLoopingEpochs",
                    [this] { KillAllChildren(); });
  DistributeOptions opt = Options("distributed_epoch");
  opt.dispatcher_timeout_ms = 30000;
  auto ds = Dataset::Range(kN).Map(expr::x * 3).Apply(Distribute(opt));
  ASSERT_OK(ds.status());
  // Every other epoch through a parallel Map and a Prefetch on the
  // workers, which read ahead across split ends (SplitSource::ReadAhead):
  // the same guarantee.
  auto prefetched =
      Dataset::Range(kN).Map(expr::x * 3, kAutotune).Prefetch(8).Apply(Distribute(opt));
  ASSERT_OK(prefetched.status());
  std::vector<int64_t> expected(kN);
  for (int64_t i = 0; i < kN; ++i) expected[i] = 3 * i;
  int kills = 0;
  bool dispatcher_restarted = false;
  absl::Status chaos = absl::OkStatus();
  absl::Time next_kill = absl::Now() + kKillEvery;
  uint32_t rng = 12345;
  // One kill (and start) when due; runs between elements on this thread.
  auto maybe_kill = [&](int64_t) {
    if (kills >= kWorkerKills || !chaos.ok() || absl::Now() < next_kill) return;
    KillOne(&live, &rng);
    ++kills;
    chaos = spawn_worker(false);
    if (chaos.ok() && kills == 3) {
      chaos = KillAndRestartDispatcher();
      dispatcher_restarted = true;
    }
    next_kill = absl::Now() + kKillEvery;
  };
  int epochs = 0;
  int clean_epochs = 0;  // after the last kill
  while (clean_epochs < 2) {
    ASSERT_LT(epochs, 200) << "the kills never happened";
    SCOPED_TRACE(absl::StrCat("epoch ", epochs, " after ", kills, " kill(s)"));
    const bool churned = kills < kWorkerKills;
    std::vector<int64_t> values;
    {
      ASSERT_OK_AND_ASSIGN(auto it, (epochs % 2 == 0 ? ds : prefetched).MakeIterator());
      ASSERT_OK(Drain(*it, &values, maybe_kill));
    }
    ASSERT_OK(chaos);
    std::sort(values.begin(), values.end());
    ASSERT_EQ(values, expected) << "epoch " << epochs << ": not every element exactly once";
    ++epochs;
    if (!churned) ++clean_epochs;
  }
  watchdog.Disarm();
  EXPECT_EQ(kills, kWorkerKills);
  EXPECT_TRUE(dispatcher_restarted);
  // sluice's own UCX settings fit every UCX_TLS: UCX never complains on a
  // worker's stdout about a setting no loaded transport reads (it did for
  // the shared-memory ones under UCX_TLS=tcp).
  for (ChildProcess* w : live) {
    EXPECT_THAT(w->log(), ::testing::Not(::testing::HasSubstr("unused env variable"))) << w->log();
  }
}

// Two consumers share a distributed_epoch job (job_name) while workers are
// SIGKILLed mid-split (200-element splits, so a killed worker's split has
// usually sent elements to both consumers). Each consumer drops only its
// own duplicates, so the split's new worker must not send either consumer
// what the other already received: every epoch, the two consumers
// together get each element exactly once.
TEST_P(MembershipTest, TwoConsumersOfASharedJobGetEachElementOnceUnderWorkerKills) {
  constexpr int64_t kN = 3000;
  constexpr int kWorkerKills = 5;
  constexpr absl::Duration kKillEvery = absl::Milliseconds(600);
  ASSERT_OK(StartCluster(0, {"--worker_timeout_ms", "1500", "--range_split_elements", "200"}, {}));
  std::vector<ChildProcess*> live;
  int started = 0;
  auto spawn_worker = [&](bool wait) {
    return SpawnWorker(absl::StrCat("shared", started++), wait, &live);
  };
  for (int i = 0; i < 3; ++i) ASSERT_OK(spawn_worker(true));
  Watchdog watchdog(absl::Seconds(240), "TwoConsumersOfASharedJob", [this] { KillAllChildren(); });
  DistributeOptions opt = Options("distributed_epoch");
  opt.job_name = "shared";
  opt.dispatcher_timeout_ms = 30000;
  // One Dataset per consumer, as two trainers would build: the k-th
  // iterator of each reads the job's k-th iteration.
  auto a = Dataset::Range(kN).Map(expr::x * 3).Apply(Distribute(opt));
  auto b = Dataset::Range(kN).Map(expr::x * 3).Apply(Distribute(opt));
  ASSERT_OK(a.status());
  ASSERT_OK(b.status());
  std::vector<int64_t> expected(kN);
  for (int64_t i = 0; i < kN; ++i) expected[i] = 3 * i;
  absl::Mutex mu;  // guards the kills (consumer a's thread makes them)
  int kills = 0;
  absl::Status chaos = absl::OkStatus();
  absl::Time next_kill = absl::Now() + kKillEvery;
  uint32_t rng = 4242;
  auto maybe_kill = [&](int64_t) {
    absl::MutexLock l(&mu);
    if (kills >= kWorkerKills || !chaos.ok() || absl::Now() < next_kill) return;
    KillOne(&live, &rng);
    ++kills;
    chaos = spawn_worker(false);
    next_kill = absl::Now() + kKillEvery;
  };
  int epochs = 0, clean_epochs = 0;
  while (clean_epochs < 2) {
    ASSERT_LT(epochs, 200) << "the kills never happened";
    bool churned;
    {
      absl::MutexLock l(&mu);
      churned = kills < kWorkerKills;
    }
    std::vector<int64_t> got_a, got_b;
    absl::Status status_b;
    std::thread consumer_b([&] {
      auto it = b.MakeIterator();
      status_b = it.ok() ? Drain(**it, &got_b) : it.status();
    });
    {
      ASSERT_OK_AND_ASSIGN(auto it, a.MakeIterator());
      EXPECT_OK(Drain(*it, &got_a, maybe_kill));
    }
    consumer_b.join();
    ASSERT_OK(status_b);
    ASSERT_OK(chaos);
    std::vector<int64_t> values = got_a;
    values.insert(values.end(), got_b.begin(), got_b.end());
    std::sort(values.begin(), values.end());
    ASSERT_EQ(values, expected) << "epoch " << epochs << " after " << kills
                                << " kill(s): not every element exactly once (consumers got "
                                << got_a.size() << " and " << got_b.size() << ")";
    ++epochs;
    if (!churned) ++clean_epochs;
  }
  watchdog.Disarm();
  EXPECT_EQ(kills, kWorkerKills);
}

// A worker that freezes (SIGSTOP: a paused VM or container, a swap storm,
// a debugger) rather than dies: its connections stay open and say nothing,
// and a reply may be half sent. The dispatcher declares it lost after
// worker_timeout_ms, its splits go elsewhere, and the client's requests to
// it end at their deadline; then it either comes back (SIGCONT) or is
// killed. Elements are 16 KiB (over UCX a rendezvous, not an eager reply),
// checked whole. Every epoch, looping, holds each element exactly once and
// none hangs.
TEST_P(MembershipTest, FrozenWorkersLoseNothingWhetherTheyComeBackOrDie) {
  constexpr int64_t kN = 3000;
  constexpr int64_t kWidth = 2048;  // int64s an element
  constexpr int kFreezes = 2;      // the first comes back, the second dies
  constexpr absl::Duration kFrozenFor = absl::Milliseconds(2500);
  ASSERT_OK(StartCluster(0, {"--worker_timeout_ms", "1500", "--range_split_elements", "50"}, {}));
  std::vector<ChildProcess*> live;
  int started = 0;
  auto spawn_worker = [&](bool wait) {
    return SpawnWorker(absl::StrCat("frozen", started++), wait, &live);
  };
  for (int i = 0; i < 3; ++i) ASSERT_OK(spawn_worker(true));
  Watchdog watchdog(absl::Seconds(240), "FrozenWorkers", [this] { KillAllChildren(); });
  DistributeOptions opt = Options("distributed_epoch");
  opt.dispatcher_timeout_ms = 30000;
  auto ds = Dataset::Range(kN)
                .Map(expr::x * 3 + expr::Expr::Constant(
                                       Tensor::FromVector(std::vector<int64_t>(kWidth, 0))))
                .Apply(Distribute(opt));
  ASSERT_OK(ds.status());
  std::vector<int64_t> expected(kN);
  for (int64_t i = 0; i < kN; ++i) expected[i] = 3 * i;
  int freezes = 0, thawed = 0;
  ChildProcess* frozen = nullptr;
  absl::Time frozen_at, next_freeze = absl::Now() + absl::Milliseconds(300);
  absl::Status chaos = absl::OkStatus();
  uint32_t rng = 777;
  // Between elements, on this thread: a freeze when due; a thaw or a kill
  // once the frozen worker is past the dispatcher's timeout.
  auto maybe_freeze = [&] {
    if (!chaos.ok()) return;
    if (frozen != nullptr) {
      if (absl::Now() - frozen_at < kFrozenFor) return;
      if (freezes == 1) {
        frozen->Signal(SIGCONT);
        ++thawed;
      } else {
        frozen->KillAndReap();
        live.erase(std::find(live.begin(), live.end(), frozen));
        chaos = spawn_worker(false);
      }
      frozen = nullptr;
      next_freeze = absl::Now() + absl::Milliseconds(700);
      return;
    }
    if (freezes >= kFreezes || absl::Now() < next_freeze) return;
    rng = rng * 1103515245u + 12345u;
    frozen = live[(rng >> 16) % live.size()];
    frozen->Signal(SIGSTOP);
    frozen_at = absl::Now();
    ++freezes;
  };
  int epochs = 0, clean_epochs = 0;
  absl::Duration slowest;
  while (clean_epochs < 2) {
    ASSERT_LT(epochs, 1000) << "the freezes never happened";
    SCOPED_TRACE(absl::StrCat("epoch ", epochs, " after ", freezes, " freeze(s)"));
    const bool churned = freezes < kFreezes || frozen != nullptr;
    std::vector<int64_t> values;
    const absl::Time epoch_start = absl::Now();
    {
      ASSERT_OK_AND_ASSIGN(auto it, ds.MakeIterator());
      while (true) {
        ASSERT_OK_AND_ASSIGN(auto e, it->Next());
        if (!e.has_value()) break;
        const Tensor& t = (*e)[0];
        ASSERT_EQ(t.num_elements(), kWidth);
        ASSERT_EQ(t.at<int64_t>(0), t.at<int64_t>(kWidth - 1)) << "an element arrived torn";
        values.push_back(t.at<int64_t>(0));
        maybe_freeze();
      }
    }
    ASSERT_OK(chaos);
    std::sort(values.begin(), values.end());
    ASSERT_EQ(values, expected) << "not every element exactly once";
    slowest = std::max(slowest, absl::Now() - epoch_start);
    ++epochs;
    if (!churned) ++clean_epochs;
  }
  watchdog.Disarm();
  EXPECT_EQ(freezes, kFreezes);
  EXPECT_EQ(thawed, 1);
  std::printf("%d epochs exactly once over %d freezes; the slowest took %.2f s\n", epochs,
              freezes, absl::ToDoubleSeconds(slowest));
}

INSTANTIATE_TEST_SUITE_P(Transports, MembershipTest, AllTransports(), TransportName);

}  // namespace
}  // namespace sluice::mp_test
