// Unit tests of sluice::internal::DispatcherImpl, the dispatcher's
// transport-agnostic state machine. Every method is called directly with
// proto requests; time comes from a fake clock the tests advance, and every
// long poll is disabled (wait_ms = 0) except in LongPollsReturnEarlyOnChange.
#include "sluice/control/dispatcher_impl.h"
#include "sluice/rpc/grpc_util.h"

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <google/protobuf/util/message_differencer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rpc/service.pb.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/expr.h"
#include "tests/dataset/dataset_test_util.h"
#include "tests/test_util.h"

namespace sluice::internal {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using sluice::expr::x;

constexpr char kW1[] = "127.0.0.1:7001";
constexpr char kW2[] = "127.0.0.1:7002";
constexpr char kW3[] = "127.0.0.1:7003";

DispatcherConfig TestConfig() {
  DispatcherConfig c;
  c.worker_timeout_ms = 10000;
  c.client_timeout_ms = 30000;
  c.job_gc_timeout_ms = 60000;
  return c;
}

class DispatcherImplTest : public ::testing::Test {
 protected:
  DispatcherImplTest() { Reset(TestConfig()); }

  // Replaces the dispatcher with a fresh one using `config`.
  void Reset(const DispatcherConfig& config) {
    d_ = std::make_unique<DispatcherImpl>(config, [this] {
      return absl::FromUnixMillis(now_ms_.load());
    });
  }

  void Advance(absl::Duration d) { now_ms_ += absl::ToInt64Milliseconds(d); }

  // ---- request helpers (no long polls) ----

  absl::StatusOr<std::string> Register(const proto::DatasetDef& def,
                                       const std::string& dataset_id = "") {
    proto::RegisterDatasetRequest req;
    *req.mutable_dataset() = def;
    req.set_dataset_id(dataset_id);
    proto::RegisterDatasetResponse resp;
    absl::Status s = d_->RegisterDataset(req, &resp);
    if (!s.ok()) return s;
    return resp.dataset_id();
  }
  absl::StatusOr<std::string> RegisterRange(int64_t n) { return Register(Dataset::Range(n).def()); }

  absl::StatusOr<int64_t> Job(const std::string& dataset_id, const std::string& name = "",
                              proto::ProcessingMode mode = proto::PARALLEL_EPOCHS) {
    proto::GetOrCreateJobRequest req;
    req.set_dataset_id(dataset_id);
    req.set_processing_mode(mode);
    req.set_job_name(name);
    proto::GetOrCreateJobResponse resp;
    absl::Status s = d_->GetOrCreateJob(req, &resp);
    if (!s.ok()) return s;
    return resp.job_id();
  }

  absl::StatusOr<proto::GetOrCreateIterationResponse> Iteration(int64_t job_id,
                                                                int64_t repetition = 0) {
    proto::GetOrCreateIterationRequest req;
    req.set_job_id(job_id);
    req.set_repetition(repetition);
    proto::GetOrCreateIterationResponse resp;
    absl::Status s = d_->GetOrCreateIteration(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<proto::WorkerHeartbeatResponse> WorkerHb(
      const std::string& address, const std::vector<int64_t>& current = {},
      const std::vector<int64_t>& finished = {}, const std::string& transfer_address = "",
      const std::string& protocol = "") {
    proto::WorkerHeartbeatRequest req;
    req.set_worker_address(address);
    req.set_transfer_address(transfer_address);
    req.set_transfer_protocol(protocol);
    for (int64_t id : current) req.add_current_tasks(id);
    for (int64_t id : finished) req.add_finished_tasks(id);
    req.set_wait_ms(0);
    proto::WorkerHeartbeatResponse resp;
    absl::Status s = d_->WorkerHeartbeat(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  // target_workers: a worker registering from `host`, a job reading
  // `target`, and a consumer's iteration from `host`.
  absl::Status WorkerOn(const std::string& address, const std::string& host) {
    proto::WorkerHeartbeatRequest req;
    req.set_worker_address(address);
    req.set_host_id(host);
    proto::WorkerHeartbeatResponse resp;
    return d_->WorkerHeartbeat(req, &resp);
  }
  absl::StatusOr<int64_t> TargetJob(const std::string& dataset_id, const std::string& name,
                                    proto::TargetWorkers target, int64_t num_consumers = 0) {
    proto::GetOrCreateJobRequest req;
    req.set_dataset_id(dataset_id);
    req.set_processing_mode(proto::PARALLEL_EPOCHS);
    req.set_job_name(name);
    req.set_target_workers(target);
    req.set_num_consumers(num_consumers);
    proto::GetOrCreateJobResponse resp;
    SLUICE_RETURN_IF_ERROR(d_->GetOrCreateJob(req, &resp));
    return resp.job_id();
  }
  absl::StatusOr<proto::GetOrCreateIterationResponse> IterationOn(int64_t job_id,
                                                                  const std::string& host) {
    proto::GetOrCreateIterationRequest req;
    req.set_job_id(job_id);
    req.set_host_id(host);
    proto::GetOrCreateIterationResponse resp;
    SLUICE_RETURN_IF_ERROR(d_->GetOrCreateIteration(req, &resp));
    return resp;
  }
  // The workers whose tasks a client heartbeat lists.
  std::set<std::string> ListedWorkers(int64_t client_id) {
    std::set<std::string> out;
    auto hb = ClientHb(client_id);
    EXPECT_OK(hb.status());
    if (hb.ok()) {
      for (const auto& t : hb->tasks()) out.insert(t.worker_address());
    }
    return out;
  }

  // With `at_end_version`: the client read to the end at that version.
  absl::StatusOr<proto::ClientHeartbeatResponse> ClientHb(
      int64_t client_id, std::optional<int64_t> at_end_version = std::nullopt) {
    proto::ClientHeartbeatRequest req;
    req.set_iteration_client_id(client_id);
    req.set_reports_splits(true);
    req.set_known_version(at_end_version.value_or(-1));
    req.set_at_end(at_end_version.has_value());
    req.set_wait_ms(0);
    proto::ClientHeartbeatResponse resp;
    absl::Status s = d_->ClientHeartbeat(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  absl::Status Complete(const std::string& worker, int64_t task_id) {
    proto::WorkerUpdateRequest req;
    req.set_worker_address(worker);
    auto* u = req.add_updates();
    u->set_task_id(task_id);
    u->set_completed(true);
    proto::WorkerUpdateResponse resp;
    return d_->WorkerUpdate(req, &resp);
  }

  absl::Status Fail(const std::string& worker, int64_t task_id, const absl::Status& error) {
    proto::WorkerUpdateRequest req;
    req.set_worker_address(worker);
    auto* u = req.add_updates();
    u->set_task_id(task_id);
    u->set_completed(true);
    *u->mutable_error() = ToProto(error);
    proto::WorkerUpdateResponse resp;
    return d_->WorkerUpdate(req, &resp);
  }

  absl::Status Release(int64_t client_id) {
    proto::ReleaseIterationClientRequest req;
    req.set_iteration_client_id(client_id);
    proto::ReleaseIterationClientResponse resp;
    return d_->ReleaseIterationClient(req, &resp);
  }

  proto::GetWorkersResponse Workers() {
    proto::GetWorkersRequest req;
    proto::GetWorkersResponse resp;
    EXPECT_OK(d_->GetWorkers(req, &resp));
    return resp;
  }

  absl::StatusOr<proto::GetSplitResponse> Split(const std::string& worker, int64_t task,
                                                 int64_t epoch = 0,
                                                 const std::vector<int64_t>& completed = {}) {
    proto::GetSplitRequest req;
    req.set_worker_address(worker);
    req.set_task_id(task);
    req.set_epoch(epoch);
    for (int64_t id : completed) req.add_completed_splits(id);
    req.set_wait_ms(0);
    proto::GetSplitResponse resp;
    absl::Status s = d_->GetSplit(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  static std::vector<int64_t> TaskIds(const proto::WorkerHeartbeatResponse& r) {
    std::vector<int64_t> ids;
    for (const auto& t : r.new_tasks()) ids.push_back(t.task_id());
    return ids;
  }
  // As a set: a collected task the worker still reports may be listed twice
  // (once from collection, once from reconciliation), which is harmless.
  static std::set<int64_t> Deleted(const proto::WorkerHeartbeatResponse& r) {
    return {r.tasks_to_delete().begin(), r.tasks_to_delete().end()};
  }
  static const proto::TaskInfo* FindTask(const proto::ClientHeartbeatResponse& r, int64_t id) {
    for (const auto& t : r.tasks()) {
      if (t.task_id() == id) return &t;
    }
    return nullptr;
  }

  std::atomic<int64_t> now_ms_{1'700'000'000'000};
  std::unique_ptr<DispatcherImpl> d_;
};

// ---- processing modes ----------------------------------------------------------

TEST(ProcessingModeTest, ParsesKnownNames) {
  ASSERT_OK_AND_ASSIGN(auto pe, ParseProcessingMode("parallel_epochs"));
  EXPECT_EQ(pe, proto::PARALLEL_EPOCHS);
  ASSERT_OK_AND_ASSIGN(auto de, ParseProcessingMode("distributed_epoch"));
  EXPECT_EQ(de, proto::DISTRIBUTED_EPOCH);
  EXPECT_EQ(ProcessingModeName(proto::PARALLEL_EPOCHS), "parallel_epochs");
  EXPECT_EQ(ProcessingModeName(proto::DISTRIBUTED_EPOCH), "distributed_epoch");
  EXPECT_EQ(ProcessingModeName(proto::PROCESSING_MODE_UNSPECIFIED), "unspecified");
  // Static sharding policies, and tf.data's names of the epoch modes.
  const std::pair<const char*, proto::ProcessingMode> names[] = {
      {"file", proto::FILE_SHARDING},
      {"data", proto::DATA_SHARDING},
      {"file_or_data", proto::FILE_OR_DATA_SHARDING},
      {"hint", proto::HINT_SHARDING}};
  for (const auto& [name, mode] : names) {
    ASSERT_OK_AND_ASSIGN(auto m, ParseProcessingMode(name));
    EXPECT_EQ(m, mode);
    EXPECT_EQ(ProcessingModeName(mode), name);
    EXPECT_TRUE(StaticShardingOf(mode).has_value());
  }
  EXPECT_EQ(*ParseProcessingMode("off"), proto::PARALLEL_EPOCHS);
  EXPECT_EQ(*ParseProcessingMode("dynamic"), proto::DISTRIBUTED_EPOCH);
  EXPECT_FALSE(StaticShardingOf(proto::PARALLEL_EPOCHS).has_value());
  EXPECT_FALSE(StaticShardingOf(proto::DISTRIBUTED_EPOCH).has_value());
}

TEST(ProcessingModeTest, RejectsUnknownNames) {
  EXPECT_STATUS(ParseProcessingMode("bogus"), absl::StatusCode::kInvalidArgument,
                "unknown processing_mode 'bogus'");
  EXPECT_STATUS(ParseProcessingMode("bogus"), absl::StatusCode::kInvalidArgument,
                "expected parallel_epochs (off), distributed_epoch (dynamic), file, data");
  EXPECT_STATUS(ParseProcessingMode(""), absl::StatusCode::kInvalidArgument,
                "unknown processing_mode ''");
  // Names are exact: no case folding, no enum spellings.
  EXPECT_STATUS(ParseProcessingMode("PARALLEL_EPOCHS"), absl::StatusCode::kInvalidArgument,
                "unknown processing_mode");
  EXPECT_STATUS(ParseProcessingMode("Parallel_Epochs"), absl::StatusCode::kInvalidArgument,
                "unknown processing_mode");
}

TEST(TargetWorkersTest, ParsesTfDataNamesInAnyCase) {
  const std::pair<const char*, proto::TargetWorkers> known[] = {
      {"", proto::TARGET_WORKERS_AUTO},
      {"AUTO", proto::TARGET_WORKERS_AUTO},
      {"any", proto::TARGET_WORKERS_ANY},
      {"Local", proto::TARGET_WORKERS_LOCAL}};
  for (const auto& [name, target] : known) {
    ASSERT_OK_AND_ASSIGN(proto::TargetWorkers parsed, ParseTargetWorkers(name));
    EXPECT_EQ(parsed, target) << name;
  }
  EXPECT_STATUS(ParseTargetWorkers("remote"), absl::StatusCode::kInvalidArgument,
                "unknown target_workers 'remote'; expected AUTO, ANY or LOCAL");
  EXPECT_EQ(TargetWorkersName(proto::TARGET_WORKERS_LOCAL), "LOCAL");
}

TEST(TargetWorkersTest, HostIdIsSluiceHostIdElseTheHostname) {
  const char* saved = std::getenv("SLUICE_HOST_ID");
  const std::string old = saved != nullptr ? saved : "";
  ASSERT_EQ(setenv("SLUICE_HOST_ID", "node-17", 1), 0);
  EXPECT_EQ(LocalHostId(), "node-17");
  ASSERT_EQ(unsetenv("SLUICE_HOST_ID"), 0);
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  EXPECT_EQ(LocalHostId(), name);
  if (saved != nullptr) setenv("SLUICE_HOST_ID", old.c_str(), 1);
}

TEST(StatusProtoTest, RoundTrips) {
  absl::Status s = absl::DataLossError("bad record");
  proto::StatusProto p = ToProto(s);
  EXPECT_EQ(p.code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_EQ(p.message(), "bad record");
  EXPECT_EQ(FromProto(p), s);
  EXPECT_TRUE(FromProto(ToProto(absl::OkStatus())).ok());
}

// The owner of callback-API channels waits for every call's token before
// it drops them (the calls' contexts hold the channel).
TEST(CallbackCallGuardTest, WaitsUntilEveryTokenHandedOutIsGone) {
  CallbackCallGuard guard;
  std::shared_ptr<void> a = guard.Hold(), b = guard.Hold();
  ASSERT_GT(a.use_count(), 0);  // a token owns a share (its pointer is null)
  absl::Notification returned;
  std::thread waiter([&] {
    guard.WaitForAll();
    returned.Notify();
  });
  a.reset();
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  b.reset();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  waiter.join();
  guard.WaitForAll();  // again: returns at once
}

// A call made from another call's callback (a chain) while WaitForAll
// already waits is waited for too.
TEST(CallbackCallGuardTest, ACallMadeWhileAnotherIsHeldIsWaitedForToo) {
  CallbackCallGuard guard;
  std::shared_ptr<void> first = guard.Hold();
  absl::Notification returned;
  std::thread waiter([&] {
    guard.WaitForAll();
    returned.Notify();
  });
  // Gives the waiter time to be waiting already (either way, what follows
  // must hold).
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  std::shared_ptr<void> next = guard.Hold();
  first.reset();
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  next.reset();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  waiter.join();
}

// ---- datasets ------------------------------------------------------------------

TEST_F(DispatcherImplTest, RegisterDatasetDeduplicatesIdenticalDefinitions) {
  ASSERT_OK_AND_ASSIGN(std::string a, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(std::string b, RegisterRange(5));
  EXPECT_EQ(a, b);
  EXPECT_THAT(a, ::testing::StartsWith("ds-"));
  ASSERT_OK_AND_ASSIGN(std::string c, RegisterRange(6));
  ASSERT_OK_AND_ASSIGN(std::string e, Register(Dataset::Range(5).Map(x * x).def()));
  ASSERT_OK_AND_ASSIGN(std::string e2, Register(Dataset::Range(5).Map(x * x).def()));
  EXPECT_NE(a, c);
  EXPECT_NE(a, e);
  EXPECT_NE(c, e);
  EXPECT_EQ(e, e2);
}

// A definition gRPC's parser still takes (100 nested messages) but a
// journal record could not carry: refused, or the dispatcher would not
// start again on its journal.
TEST_F(DispatcherImplTest, RegisterDatasetRefusesADefinitionTooDeepForItsJournal) {
  auto chain = [](int maps) {
    Dataset d = Dataset::Range(3);
    for (int i = 0; i < maps; ++i) d = d.Map(x + 1);
    return d;
  };
  int deepest = 0;
  while (CheckWireDepth(chain(deepest + 1).def(), "test").ok()) ++deepest;
  ASSERT_OK(Register(chain(deepest).def()));
  EXPECT_STATUS(Register(chain(deepest + 1).def()), absl::StatusCode::kInvalidArgument,
                "RegisterDataset: the pipeline nests deeper than the service carries");
}

// tf.data's register_dataset(dataset_id=...): the caller names it.
TEST_F(DispatcherImplTest, RegisterDatasetUnderAnExplicitId) {
  ASSERT_OK_AND_ASSIGN(std::string id, Register(Dataset::Range(5).def(), "train.v1_a-b"));
  EXPECT_EQ(id, "train.v1_a-b");
  // The same definition again: the same id. Auto-named, it gets its own.
  ASSERT_OK_AND_ASSIGN(std::string again, Register(Dataset::Range(5).def(), "train.v1_a-b"));
  EXPECT_EQ(again, "train.v1_a-b");
  ASSERT_OK_AND_ASSIGN(std::string automatic, RegisterRange(5));
  EXPECT_THAT(automatic, ::testing::StartsWith("ds-"));
  // A different definition under a taken id.
  EXPECT_STATUS(Register(Dataset::Range(6).def(), "train.v1_a-b"),
                absl::StatusCode::kAlreadyExists,
                "dataset id 'train.v1_a-b' is registered with a different definition");
  // Ids it refuses.
  for (const std::string& bad : {std::string("a b"), std::string("a/b"), std::string(129, 'a'),
                                std::string("caf\xc3\xa9")}) {
    EXPECT_STATUS(Register(Dataset::Range(5).def(), bad), absl::StatusCode::kInvalidArgument,
                  "must be 1-128 characters of [A-Za-z0-9._-]");
  }
  ASSERT_OK(Register(Dataset::Range(5).def(), std::string(128, 'a')).status());
  // Jobs and definitions are found by it.
  proto::GetDatasetDefRequest req;
  req.set_dataset_id("train.v1_a-b");
  proto::GetDatasetDefResponse resp;
  ASSERT_OK(d_->GetDatasetDef(req, &resp));
  EXPECT_TRUE(MessageDifferencer::Equals(resp.dataset(), Dataset::Range(5).def()));
  ASSERT_OK(Job("train.v1_a-b").status());
}

TEST_F(DispatcherImplTest, GetDatasetDefReturnsTheRegisteredDefinition) {
  proto::DatasetDef def = Dataset::Range(5).Map(x + 1).def();
  ASSERT_OK_AND_ASSIGN(std::string id, Register(def));
  proto::GetDatasetDefRequest req;
  req.set_dataset_id(id);
  proto::GetDatasetDefResponse resp;
  ASSERT_OK(d_->GetDatasetDef(req, &resp));
  EXPECT_TRUE(MessageDifferencer::Equals(resp.dataset(), def));
}

TEST_F(DispatcherImplTest, GetDatasetDefOfUnknownIdIsNotFound) {
  proto::GetDatasetDefRequest req;
  req.set_dataset_id("ds-nope");
  proto::GetDatasetDefResponse resp;
  EXPECT_STATUS(d_->GetDatasetDef(req, &resp), absl::StatusCode::kNotFound,
                "dataset 'ds-nope' is not registered");
}

TEST_F(DispatcherImplTest, RegisterDatasetRejectsEmptyOrUnsupportedDefinitions) {
  // Entirely empty.
  EXPECT_STATUS(Register(proto::DatasetDef()), absl::StatusCode::kInvalidArgument,
                "empty or of an unsupported version");
  // A real definition with an unsupported version.
  proto::DatasetDef v2 = Dataset::Range(5).def();
  v2.set_version(2);
  EXPECT_STATUS(Register(v2), absl::StatusCode::kInvalidArgument,
                "empty or of an unsupported version");
  proto::DatasetDef v0 = Dataset::Range(5).def();
  v0.set_version(0);
  EXPECT_STATUS(Register(v0), absl::StatusCode::kInvalidArgument,
                "empty or of an unsupported version");
  // Version 1 without a root, and with a root whose op is unset.
  proto::DatasetDef no_root;
  no_root.set_version(1);
  EXPECT_STATUS(Register(no_root), absl::StatusCode::kInvalidArgument,
                "empty or of an unsupported version");
  proto::DatasetDef empty_root;
  empty_root.set_version(1);
  empty_root.mutable_root();
  EXPECT_STATUS(Register(empty_root), absl::StatusCode::kInvalidArgument,
                "empty or of an unsupported version");
}

// ---- jobs ------------------------------------------------------------------------

TEST_F(DispatcherImplTest, GetOrCreateJobValidatesItsRequest) {
  EXPECT_STATUS(Job("ds-unknown"), absl::StatusCode::kNotFound,
                "dataset 'ds-unknown' is not registered");
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  EXPECT_STATUS(Job(ds, "", proto::PROCESSING_MODE_UNSPECIFIED),
                absl::StatusCode::kInvalidArgument, "processing_mode is unspecified");
  ASSERT_OK_AND_ASSIGN(std::string zip,
                       Register(Dataset::Zip({Dataset::Range(3), Dataset::Range(4)}).def()));
  EXPECT_STATUS(Job(zip, "", proto::DISTRIBUTED_EPOCH), absl::StatusCode::kInvalidArgument,
                "exactly one Range, FromTensors or ListFiles source");
  EXPECT_EQ(d_->GetStats().jobs, 0);
}

TEST_F(DispatcherImplTest, NamedJobIsSharedAndAnonymousJobsAreNot) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t a, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(int64_t b, Job(ds, "train"));
  EXPECT_EQ(a, b);
  ASSERT_OK_AND_ASSIGN(int64_t other, Job(ds, "eval"));
  EXPECT_NE(other, a);
  ASSERT_OK_AND_ASSIGN(int64_t anon1, Job(ds));
  ASSERT_OK_AND_ASSIGN(int64_t anon2, Job(ds));
  EXPECT_NE(anon1, anon2);
  EXPECT_NE(anon1, a);
  EXPECT_NE(anon2, a);
  EXPECT_EQ(d_->GetStats().jobs, 4);
}

TEST_F(DispatcherImplTest, NamedJobWithDifferentParametersIsRejected) {
  ASSERT_OK_AND_ASSIGN(std::string ds5, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(std::string ds6, RegisterRange(6));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds5, "train"));

  // A different dataset: the message names the job and both datasets.
  auto s = Job(ds6, "train");
  EXPECT_STATUS(s, absl::StatusCode::kInvalidArgument, "job 'train' exists for dataset " + ds5);
  EXPECT_STATUS(s, absl::StatusCode::kInvalidArgument, "requested " + ds6);

  // A different processing mode: the existing job's parameters win and the
  // message names the difference.
  EXPECT_STATUS(Job(ds5, "train", proto::DISTRIBUTED_EPOCH), absl::StatusCode::kInvalidArgument,
                "job 'train' exists with processing_mode=parallel_epochs; requested "
                "distributed_epoch");
  EXPECT_STATUS(Job(ds5, "train", proto::PROCESSING_MODE_UNSPECIFIED),
                absl::StatusCode::kInvalidArgument, "unspecified");

  // The job is unchanged by the failed attempts.
  ASSERT_OK_AND_ASSIGN(int64_t again, Job(ds5, "train"));
  EXPECT_EQ(again, job);
  EXPECT_EQ(d_->GetStats().jobs, 1);
}

// ---- iterations ---------------------------------------------------------------------

TEST_F(DispatcherImplTest, GetOrCreateIterationSharesARepetition) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(auto a, Iteration(job, 0));
  ASSERT_OK_AND_ASSIGN(auto b, Iteration(job, 0));
  EXPECT_EQ(a.iteration_id(), b.iteration_id());
  EXPECT_NE(a.iteration_client_id(), b.iteration_client_id());
  ASSERT_OK_AND_ASSIGN(auto c, Iteration(job, 1));
  EXPECT_NE(c.iteration_id(), a.iteration_id());
  EXPECT_NE(c.iteration_client_id(), a.iteration_client_id());
  EXPECT_NE(c.iteration_client_id(), b.iteration_client_id());
  auto stats = d_->GetStats();
  EXPECT_EQ(stats.iterations, 2);
  EXPECT_EQ(stats.iteration_clients, 3);
}

TEST_F(DispatcherImplTest, GetOrCreateIterationValidatesItsRequest) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  EXPECT_STATUS(Iteration(job, -1), absl::StatusCode::kInvalidArgument,
                "repetition must be >= 0");
  EXPECT_STATUS(Iteration(job + 1000, 0), absl::StatusCode::kNotFound,
                absl::StrCat("job ", job + 1000, " does not exist"));
  EXPECT_EQ(d_->GetStats().iterations, 0);
}

// GetOrCreateJob and GetOrCreateIteration analyse the pipeline and list a
// distributed_epoch source's files without the dispatcher's lock: consumers
// asking at once for the same job and repetition still get one job and one
// iteration, each a client of its own, whichever finished its analysis
// first.
TEST_F(DispatcherImplTest, ConcurrentConsumersOfOneNamedJobGetOneJobAndOneIteration) {
  sluice_test::TempDir dir;
  for (int i = 0; i < 50; ++i) std::ofstream(dir.File(absl::StrCat("f", i, ".txt"))) << i;
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(Dataset::ListFiles(dir.path() + "/*.txt").def()));
  constexpr int kConsumers = 8, kRounds = 10;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> seen(kConsumers);  // job, iteration
  std::set<int64_t> clients;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        auto job = Job(ds, absl::StrCat("train", r), proto::DISTRIBUTED_EPOCH);
        ASSERT_OK(job.status());
        auto it = Iteration(*job, 0);
        ASSERT_OK(it.status());
        seen[c].emplace_back(*job, it->iteration_id());
        absl::MutexLock l(&mu);
        EXPECT_TRUE(clients.insert(it->iteration_client_id()).second);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int c = 1; c < kConsumers; ++c) EXPECT_EQ(seen[c], seen[0]) << "consumer " << c;
  auto stats = d_->GetStats();
  EXPECT_EQ(stats.jobs, kRounds);
  EXPECT_EQ(stats.iterations, kRounds);
  EXPECT_EQ(stats.iteration_clients, kConsumers * kRounds);
}

// ---- workers and tasks ---------------------------------------------------------------

TEST_F(DispatcherImplTest, WorkerHeartbeatRegistersTheWorker) {
  EXPECT_STATUS(WorkerHb(""), absl::StatusCode::kInvalidArgument, "worker_address is empty");
  EXPECT_EQ(d_->GetStats().workers, 0);

  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  EXPECT_THAT(TaskIds(r1), IsEmpty());
  EXPECT_THAT(Deleted(r1), IsEmpty());
  ASSERT_OK(WorkerHb(kW2, {}, {}, "127.0.0.1:9002", "ucx").status());
  // Heartbeating again does not register twice.
  ASSERT_OK(WorkerHb(kW1).status());

  auto workers = Workers();
  ASSERT_EQ(workers.workers_size(), 2);
  const auto& w1 = workers.workers(0).address() == kW1 ? workers.workers(0) : workers.workers(1);
  const auto& w2 = workers.workers(0).address() == kW1 ? workers.workers(1) : workers.workers(0);
  EXPECT_EQ(w1.address(), kW1);
  EXPECT_EQ(w1.transfer_address(), kW1);  // defaults to the worker address
  EXPECT_EQ(w1.transfer_protocol(), "grpc");
  EXPECT_EQ(w1.num_tasks(), 0);
  EXPECT_EQ(w2.address(), kW2);
  EXPECT_EQ(w2.transfer_address(), "127.0.0.1:9002");
  EXPECT_EQ(w2.transfer_protocol(), "ucx");
  EXPECT_EQ(d_->GetStats().workers, 2);
}

TEST_F(DispatcherImplTest, NewIterationGetsATaskOnEveryWorkerDeliveredOnce) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  proto::DatasetDef def = Dataset::Range(5).def();
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(def));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  EXPECT_EQ(d_->GetStats().live_tasks, 2);

  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  ASSERT_EQ(r1.new_tasks_size(), 1);
  const proto::TaskDef& t1 = r1.new_tasks(0);
  EXPECT_EQ(t1.iteration_id(), it.iteration_id());
  EXPECT_EQ(t1.dataset_id(), ds);
  EXPECT_TRUE(MessageDifferencer::Equals(t1.dataset(), def));
  EXPECT_EQ(t1.processing_mode(), proto::PARALLEL_EPOCHS);
  EXPECT_EQ(t1.worker_index(), 0);

  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW2));
  ASSERT_EQ(r2.new_tasks_size(), 1);
  const proto::TaskDef& t2 = r2.new_tasks(0);
  EXPECT_EQ(t2.iteration_id(), it.iteration_id());
  EXPECT_EQ(t2.worker_index(), 1);
  EXPECT_NE(t1.task_id(), t2.task_id());

  // Delivered exactly once: later heartbeats (holding the task) get nothing new.
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(auto again1, WorkerHb(kW1, {t1.task_id()}));
    EXPECT_THAT(TaskIds(again1), IsEmpty());
    EXPECT_THAT(Deleted(again1), IsEmpty());
    ASSERT_OK_AND_ASSIGN(auto again2, WorkerHb(kW2, {t2.task_id()}));
    EXPECT_THAT(TaskIds(again2), IsEmpty());
  }
  const auto all = Workers();
  for (const auto& w : all.workers()) EXPECT_EQ(w.num_tasks(), 1) << w.address();

  // The client sees both tasks with their workers' addresses.
  ASSERT_OK_AND_ASSIGN(auto hb, ClientHb(it.iteration_client_id()));
  ASSERT_EQ(hb.tasks_size(), 2);
  const proto::TaskInfo* i1 = FindTask(hb, t1.task_id());
  const proto::TaskInfo* i2 = FindTask(hb, t2.task_id());
  ASSERT_NE(i1, nullptr);
  ASSERT_NE(i2, nullptr);
  EXPECT_EQ(i1->worker_address(), kW1);
  EXPECT_EQ(i1->transfer_address(), kW1);
  EXPECT_EQ(i1->transfer_protocol(), "grpc");
  EXPECT_FALSE(i1->lost());
  EXPECT_EQ(i2->worker_address(), kW2);
  EXPECT_FALSE(hb.iteration_finished());
  EXPECT_FALSE(hb.has_error());
}

TEST_F(DispatcherImplTest, ClientHeartbeatReportsTransferAddresses) {
  ASSERT_OK(WorkerHb(kW1, {}, {}, "10.0.0.1:5000", "ucx").status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto hb, ClientHb(it.iteration_client_id()));
  ASSERT_EQ(hb.tasks_size(), 1);
  EXPECT_EQ(hb.tasks(0).worker_address(), kW1);
  EXPECT_EQ(hb.tasks(0).transfer_address(), "10.0.0.1:5000");
  EXPECT_EQ(hb.tasks(0).transfer_protocol(), "ucx");
}

TEST_F(DispatcherImplTest, WorkerJoiningMidJobGetsTasksForRunningIterationsOnly) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(auto finished_it, Iteration(job, 0));
  ASSERT_OK_AND_ASSIGN(auto running_it, Iteration(job, 1));
  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  ASSERT_EQ(r1.new_tasks_size(), 2);
  int64_t finished_task = 0;
  for (const auto& t : r1.new_tasks()) {
    if (t.iteration_id() == finished_it.iteration_id()) finished_task = t.task_id();
  }
  ASSERT_NE(finished_task, 0);
  ASSERT_OK(Complete(kW1, finished_task));
  ASSERT_OK_AND_ASSIGN(auto fhb, ClientHb(finished_it.iteration_client_id()));
  ASSERT_TRUE(fhb.iteration_finished());

  ASSERT_OK_AND_ASSIGN(auto before, ClientHb(running_it.iteration_client_id()));
  ASSERT_EQ(before.tasks_size(), 1);

  // Until its client read it to the end, a finished iteration still takes
  // late joiners (tf.data); the client says so at the version it saw.
  ASSERT_OK_AND_ASSIGN(auto ended, ClientHb(finished_it.iteration_client_id(), fhb.version()));
  EXPECT_EQ(ended.version(), fhb.version());
  EXPECT_TRUE(ended.iteration_finished());

  // A worker that registers now gets a task for the running iteration only.
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW2));
  ASSERT_EQ(r2.new_tasks_size(), 1);
  EXPECT_EQ(r2.new_tasks(0).iteration_id(), running_it.iteration_id());
  EXPECT_EQ(r2.new_tasks(0).worker_index(), 1);

  ASSERT_OK_AND_ASSIGN(auto after, ClientHb(running_it.iteration_client_id()));
  ASSERT_EQ(after.tasks_size(), 2);
  const proto::TaskInfo* joined = FindTask(after, r2.new_tasks(0).task_id());
  ASSERT_NE(joined, nullptr);
  EXPECT_EQ(joined->worker_address(), kW2);
  EXPECT_GT(after.version(), before.version());

  // The finished iteration did not grow a task.
  ASSERT_OK_AND_ASSIGN(auto fhb2, ClientHb(finished_it.iteration_client_id()));
  EXPECT_EQ(fhb2.tasks_size(), 1);
  EXPECT_TRUE(fhb2.iteration_finished());
}

// tf.data's target_workers="LOCAL": a consumer reads only the workers on
// its host, and the job's tasks run only on its consumers' hosts.
TEST_F(DispatcherImplTest, LocalTargetWorkersReadOnlyTheConsumersHost) {
  ASSERT_OK(WorkerOn(kW1, "host-a"));
  ASSERT_OK(WorkerOn(kW2, "host-b"));
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, TargetJob(ds, "shared", proto::TARGET_WORKERS_LOCAL));
  ASSERT_OK_AND_ASSIGN(auto on_a, IterationOn(job, "host-a"));
  EXPECT_EQ(d_->GetStats().live_tasks, 1);
  EXPECT_EQ(ListedWorkers(on_a.iteration_client_id()), std::set<std::string>{kW1});
  ASSERT_OK_AND_ASSIGN(auto hb2, WorkerHb(kW2));
  EXPECT_THAT(TaskIds(hb2), IsEmpty());

  // The job's first consumer on host b brings a task on b's worker; each
  // consumer still lists only its own host's.
  ASSERT_OK_AND_ASSIGN(auto on_b, IterationOn(job, "host-b"));
  EXPECT_EQ(on_b.iteration_id(), on_a.iteration_id());
  EXPECT_EQ(d_->GetStats().live_tasks, 2);
  EXPECT_EQ(ListedWorkers(on_b.iteration_client_id()), std::set<std::string>{kW2});
  EXPECT_EQ(ListedWorkers(on_a.iteration_client_id()), std::set<std::string>{kW1});
  ASSERT_OK_AND_ASSIGN(hb2, WorkerHb(kW2));
  EXPECT_EQ(hb2.new_tasks_size(), 1);

  // Late joiners: a worker on a consumer's host gets a task, one elsewhere
  // does not.
  ASSERT_OK(WorkerOn(kW3, "host-a"));
  ASSERT_OK(WorkerOn("127.0.0.1:7004", "host-c"));
  EXPECT_EQ(ListedWorkers(on_a.iteration_client_id()), (std::set<std::string>{kW1, kW3}));
  EXPECT_EQ(d_->GetStats().live_tasks, 3);
  const proto::GetWorkersResponse workers = Workers();
  for (const auto& w : workers.workers()) {
    EXPECT_EQ(w.num_tasks(), w.address() == "127.0.0.1:7004" ? 0 : 1) << w.address();
    EXPECT_EQ(w.host_id(), w.address() == kW2 ? "host-b"
                           : w.address() == "127.0.0.1:7004" ? "host-c" : "host-a");
  }

  // A consumer on a host without a worker is told so, naming the hosts.
  auto nowhere = IterationOn(job, "host-z");
  EXPECT_STATUS(nowhere, absl::StatusCode::kInvalidArgument,
                "target_workers=LOCAL reads only the workers on this consumer's host 'host-z', "
                "but no worker is registered from it (workers' hosts: [host-a, host-b, host-c])");

  // AUTO and ANY read every worker, wherever the consumer is.
  for (proto::TargetWorkers any : {proto::TARGET_WORKERS_AUTO, proto::TARGET_WORKERS_ANY}) {
    ASSERT_OK_AND_ASSIGN(int64_t all, TargetJob(ds, "", any));
    ASSERT_OK_AND_ASSIGN(auto it, IterationOn(all, "host-z"));
    EXPECT_EQ(ListedWorkers(it.iteration_client_id()).size(), 4u);
  }
}

TEST_F(DispatcherImplTest, LocalTargetWorkersIsAJobParameter) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK(TargetJob(ds, "j", proto::TARGET_WORKERS_LOCAL).status());
  // A job's consumers all use the same value (tf.data's check).
  EXPECT_STATUS(TargetJob(ds, "j", proto::TARGET_WORKERS_AUTO),
                absl::StatusCode::kInvalidArgument,
                "job 'j' exists with target_workers=LOCAL; requested AUTO");
  EXPECT_STATUS(TargetJob(ds, "k", static_cast<proto::TargetWorkers>(7)),
                absl::StatusCode::kInvalidArgument, "target_workers is unknown");
  ASSERT_OK_AND_ASSIGN(std::string forever, Register(Dataset::Range(5).Repeat().def()));
  EXPECT_STATUS(TargetJob(forever, "c", proto::TARGET_WORKERS_LOCAL, 2),
                absl::StatusCode::kInvalidArgument, "coordinated reads (num_consumers) need non-local");
  ASSERT_OK(TargetJob(forever, "c", proto::TARGET_WORKERS_ANY, 2).status());
}

TEST_F(DispatcherImplTest, IterationCreatedBeforeAnyWorkerWaitsForOne) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto hb0, ClientHb(it.iteration_client_id()));
  EXPECT_EQ(hb0.tasks_size(), 0);
  EXPECT_FALSE(hb0.iteration_finished());  // no tasks is not "all tasks done"
  d_->Tick();
  ASSERT_OK_AND_ASSIGN(auto r, WorkerHb(kW1));
  ASSERT_EQ(r.new_tasks_size(), 1);
  EXPECT_EQ(r.new_tasks(0).iteration_id(), it.iteration_id());
  ASSERT_OK_AND_ASSIGN(auto hb1, ClientHb(it.iteration_client_id()));
  EXPECT_EQ(hb1.tasks_size(), 1);
  EXPECT_GT(hb1.version(), hb0.version());
}

TEST_F(DispatcherImplTest, IterationFinishesWhenEveryTaskCompleted) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW2));
  ASSERT_EQ(r1.new_tasks_size(), 1);
  ASSERT_EQ(r2.new_tasks_size(), 1);
  const int64_t t1 = r1.new_tasks(0).task_id();
  const int64_t t2 = r2.new_tasks(0).task_id();

  ASSERT_OK_AND_ASSIGN(auto hb0, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb0.iteration_finished());

  // A worker cannot finish another worker's task through its heartbeat
  // or an update: refused, and nothing changes.
  ASSERT_OK(WorkerHb(kW2, {t2}, {t1}).status());
  EXPECT_STATUS(Complete(kW2, t1), absl::StatusCode::kFailedPrecondition, "belongs to worker");
  EXPECT_STATUS(Complete(kW3, t1), absl::StatusCode::kNotFound, "is not registered");
  ASSERT_OK_AND_ASSIGN(auto hb_ignored, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb_ignored.iteration_finished());
  EXPECT_EQ(hb_ignored.version(), hb0.version());

  // Completion through WorkerUpdate.
  ASSERT_OK(Complete(kW1, t1));
  ASSERT_OK_AND_ASSIGN(auto hb1, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb1.iteration_finished());
  EXPECT_GT(hb1.version(), hb0.version());
  // Repeating a completion changes nothing.
  ASSERT_OK(Complete(kW1, t1));
  ASSERT_OK(WorkerHb(kW1, {t1}, {t1}).status());
  ASSERT_OK_AND_ASSIGN(auto hb1b, ClientHb(it.iteration_client_id()));
  EXPECT_EQ(hb1b.version(), hb1.version());
  EXPECT_FALSE(hb1b.iteration_finished());

  // Completion through finished_tasks in a heartbeat.
  ASSERT_OK(WorkerHb(kW2, {t2}, {t2}).status());
  ASSERT_OK_AND_ASSIGN(auto hb2, ClientHb(it.iteration_client_id()));
  EXPECT_TRUE(hb2.iteration_finished());
  EXPECT_GT(hb2.version(), hb1.version());
  EXPECT_FALSE(hb2.has_error());
  for (const auto& t : hb2.tasks()) EXPECT_FALSE(t.lost());
  // Unknown task ids in updates are refused; in heartbeats they are tasks
  // to delete on the worker.
  EXPECT_STATUS(Complete(kW1, 987654), absl::StatusCode::kNotFound, "does not exist");
  ASSERT_OK_AND_ASSIGN(auto stale, WorkerHb(kW1, {t1, 987654}));
  EXPECT_THAT(stale.tasks_to_delete(), ::testing::ElementsAre(987654));
}

TEST_F(DispatcherImplTest, WorkerErrorFailsTheIteration) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW2));
  ASSERT_EQ(r1.new_tasks_size(), 1);
  const int64_t t1 = r1.new_tasks(0).task_id();
  ASSERT_EQ(r2.new_tasks_size(), 1);
  const int64_t t2 = r2.new_tasks(0).task_id();
  ASSERT_OK_AND_ASSIGN(auto hb0, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb0.has_error());

  ASSERT_OK(Fail(kW1, t1, absl::InvalidArgumentError("the dataset does not validate")));
  ASSERT_OK_AND_ASSIGN(auto hb1, ClientHb(it.iteration_client_id()));
  ASSERT_TRUE(hb1.has_error());
  EXPECT_EQ(hb1.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(hb1.error().message(), HasSubstr("the dataset does not validate"));
  EXPECT_GT(hb1.version(), hb0.version());
  EXPECT_FALSE(hb1.iteration_finished());

  // The first error sticks.
  ASSERT_OK(Fail(kW2, t2, absl::InternalError("second")));
  ASSERT_OK_AND_ASSIGN(auto hb2, ClientHb(it.iteration_client_id()));
  EXPECT_EQ(hb2.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(hb2.iteration_finished());
}

TEST_F(DispatcherImplTest, TimedOutWorkerLosesItsTasks) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW2));
  ASSERT_EQ(r1.new_tasks_size(), 1);
  const int64_t t1 = r1.new_tasks(0).task_id();
  ASSERT_EQ(r2.new_tasks_size(), 1);
  const int64_t t2 = r2.new_tasks(0).task_id();
  ASSERT_OK(Complete(kW2, t2));

  // Within the timeout nothing happens; kW2 keeps heartbeating, kW1 goes silent.
  Advance(absl::Milliseconds(6000));
  ASSERT_OK(WorkerHb(kW2, {t2}).status());
  ASSERT_OK(ClientHb(it.iteration_client_id()).status());
  d_->Tick();
  EXPECT_EQ(d_->GetStats().workers, 2);
  ASSERT_OK_AND_ASSIGN(auto hb0, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb0.iteration_finished());

  Advance(absl::Milliseconds(6000));  // kW1: 12 s silent; kW2: 6 s
  d_->Tick();
  auto stats = d_->GetStats();
  EXPECT_EQ(stats.workers, 1);
  EXPECT_EQ(stats.lost_workers, 1);
  auto workers = Workers();
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).address(), kW2);

  ASSERT_OK_AND_ASSIGN(auto hb1, ClientHb(it.iteration_client_id()));
  const proto::TaskInfo* lost = FindTask(hb1, t1);
  const proto::TaskInfo* done = FindTask(hb1, t2);
  ASSERT_NE(lost, nullptr);
  ASSERT_NE(done, nullptr);
  EXPECT_TRUE(lost->lost());
  EXPECT_EQ(lost->worker_address(), kW1);
  EXPECT_FALSE(done->lost());
  EXPECT_TRUE(hb1.iteration_finished());  // completed + lost = every task accounted for
  EXPECT_FALSE(hb1.has_error());
  EXPECT_GT(hb1.version(), hb0.version());
}

TEST_F(DispatcherImplTest, TimedOutWorkerThatComesBackRegistersAfresh) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(auto first, Iteration(job, 0));
  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  ASSERT_EQ(r1.new_tasks_size(), 1);
  const int64_t t1 = r1.new_tasks(0).task_id();
  Advance(absl::Milliseconds(10001));
  ASSERT_OK(ClientHb(first.iteration_client_id()).status());
  d_->Tick();
  EXPECT_EQ(d_->GetStats().workers, 0);
  ASSERT_OK_AND_ASSIGN(auto hb, ClientHb(first.iteration_client_id()));
  // Its only task was lost before finishing: the iteration waits for a
  // worker instead of ending short (tf.data).
  EXPECT_FALSE(hb.iteration_finished());

  // A new iteration starts; the worker then heartbeats again still holding
  // its old task: it is told to delete it and gets a task of each
  // iteration (the first starts over).
  ASSERT_OK_AND_ASSIGN(auto second, Iteration(job, 1));
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW1, {t1}));
  EXPECT_THAT(Deleted(r2), UnorderedElementsAre(t1));
  std::set<int64_t> iterations;
  for (const auto& t : r2.new_tasks()) iterations.insert(t.iteration_id());
  EXPECT_THAT(iterations, UnorderedElementsAre(first.iteration_id(), second.iteration_id()));
  EXPECT_EQ(d_->GetStats().workers, 1);
}

TEST_F(DispatcherImplTest, RestartedWorkerThatDropsADeliveredTaskLosesIt) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));

  // A task not yet delivered is not lost by a heartbeat that lacks it (the
  // same heartbeat delivers it).
  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1, {}));
  ASSERT_EQ(r1.new_tasks_size(), 1);
  const int64_t t1 = r1.new_tasks(0).task_id();
  ASSERT_OK_AND_ASSIGN(auto hb0, ClientHb(it.iteration_client_id()));
  ASSERT_EQ(hb0.tasks_size(), 1);
  EXPECT_FALSE(hb0.tasks(0).lost());

  ASSERT_OK(WorkerHb(kW1, {t1}).status());
  ASSERT_OK_AND_ASSIGN(auto hb1, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb1.tasks(0).lost());
  EXPECT_EQ(hb1.version(), hb0.version());

  // The worker restarts on the same address (with a new data address) and
  // no longer reports the task: it is lost, and the restarted worker gets
  // a new task of the iteration, whose data starts over (tf.data).
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW1, {}, {}, "127.0.0.1:9100", "ucx"));
  ASSERT_EQ(r2.new_tasks_size(), 1);
  EXPECT_EQ(r2.new_tasks(0).iteration_id(), it.iteration_id());
  ASSERT_OK_AND_ASSIGN(auto hb2, ClientHb(it.iteration_client_id()));
  ASSERT_EQ(hb2.tasks_size(), 2);
  for (const auto& t : hb2.tasks()) {
    EXPECT_EQ(t.lost(), t.task_id() == t1);
    EXPECT_EQ(t.transfer_address(), "127.0.0.1:9100");
    EXPECT_EQ(t.transfer_protocol(), "ucx");
  }
  EXPECT_FALSE(hb2.iteration_finished());
  EXPECT_GT(hb2.version(), hb1.version());
  EXPECT_EQ(d_->GetStats().workers, 1);  // still the same, registered worker
}

TEST_F(DispatcherImplTest, UnknownTasksReportedByAWorkerAreDeleted) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(auto r, WorkerHb(kW1, {424242, 434343}));
  EXPECT_THAT(Deleted(r), UnorderedElementsAre(424242, 434343));
  EXPECT_THAT(TaskIds(r), IsEmpty());
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW1, {}));
  EXPECT_THAT(Deleted(r2), IsEmpty());

  // Also for a worker's very first heartbeat (a worker that outlived a
  // dispatcher restart).
  ASSERT_OK_AND_ASSIGN(auto r3, WorkerHb(kW2, {777}));
  EXPECT_THAT(Deleted(r3), UnorderedElementsAre(777));

  // A known task held by another worker is deleted there too.
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK(Iteration(job).status());
  ASSERT_OK_AND_ASSIGN(auto r4, WorkerHb(kW1));
  ASSERT_EQ(r4.new_tasks_size(), 1);
  const int64_t t1 = r4.new_tasks(0).task_id();
  ASSERT_OK_AND_ASSIGN(auto r5, WorkerHb(kW2, {t1}));
  EXPECT_THAT(Deleted(r5), ::testing::Contains(t1));
}

// ---- clients -----------------------------------------------------------------------

TEST_F(DispatcherImplTest, ClientTimeoutReleasesTheClient) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(auto quiet, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto chatty, Iteration(job));
  EXPECT_EQ(d_->GetStats().iteration_clients, 2);

  Advance(absl::Milliseconds(20000));
  ASSERT_OK(ClientHb(chatty.iteration_client_id()).status());
  d_->Tick();
  EXPECT_EQ(d_->GetStats().iteration_clients, 2);

  Advance(absl::Milliseconds(20000));  // quiet: 40 s silent; chatty: 20 s
  d_->Tick();
  EXPECT_EQ(d_->GetStats().iteration_clients, 1);
  EXPECT_STATUS(ClientHb(quiet.iteration_client_id()), absl::StatusCode::kNotFound,
                "released or timed out");
  EXPECT_STATUS(Release(quiet.iteration_client_id()), absl::StatusCode::kNotFound,
                "released or timed out");
  ASSERT_OK(ClientHb(chatty.iteration_client_id()).status());
}

TEST_F(DispatcherImplTest, ReleaseIterationClient) {
  EXPECT_STATUS(Release(12345), absl::StatusCode::kNotFound, "iteration client 12345 is unknown");
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK(Release(it.iteration_client_id()));
  EXPECT_EQ(d_->GetStats().iteration_clients, 0);
  EXPECT_STATUS(Release(it.iteration_client_id()), absl::StatusCode::kNotFound, "unknown");
  EXPECT_STATUS(ClientHb(it.iteration_client_id()), absl::StatusCode::kNotFound,
                "released or timed out");
}

// ---- garbage collection ----------------------------------------------------------------

TEST_F(DispatcherImplTest, AnonymousIterationIsCollectedWhenItsLastClientLeaves) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto a, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto b, Iteration(job));  // a second client of the same iteration
  ASSERT_EQ(a.iteration_id(), b.iteration_id());
  ASSERT_OK_AND_ASSIGN(auto r, WorkerHb(kW1));
  ASSERT_EQ(r.new_tasks_size(), 1);
  const int64_t t = r.new_tasks(0).task_id();
  EXPECT_EQ(d_->GetStats().live_tasks, 1);

  ASSERT_OK(Release(a.iteration_client_id()));
  d_->Tick();
  EXPECT_EQ(d_->GetStats().live_tasks, 1);  // b still reads it
  EXPECT_EQ(d_->GetStats().collected_iterations, 0);
  ASSERT_OK_AND_ASSIGN(auto still, WorkerHb(kW1, {t}));
  EXPECT_THAT(Deleted(still), IsEmpty());

  ASSERT_OK(Release(b.iteration_client_id()));
  d_->Tick();  // no time passes: anonymous iterations go at once
  auto stats = d_->GetStats();
  EXPECT_EQ(stats.live_tasks, 0);
  EXPECT_EQ(stats.collected_iterations, 1);
  EXPECT_EQ(Workers().workers(0).num_tasks(), 0);

  // The worker is told to delete the task, once.
  ASSERT_OK_AND_ASSIGN(auto del, WorkerHb(kW1, {t}));
  EXPECT_THAT(Deleted(del), UnorderedElementsAre(t));
  ASSERT_OK_AND_ASSIGN(auto after, WorkerHb(kW1, {}));
  EXPECT_THAT(Deleted(after), IsEmpty());
  EXPECT_THAT(TaskIds(after), IsEmpty());

  // The anonymous job is forgotten.
  EXPECT_STATUS(Iteration(job), absl::StatusCode::kNotFound, "does not exist");
}

// GetOrCreateIteration accepts several repetitions of one anonymous job
// (direct RPC users can do this; the client library uses one per iterator):
// collecting one of them must leave the others, and the job, intact.
TEST_F(DispatcherImplTest, AnonymousJobWithTwoRepetitionsCollectsEachOnItsOwn) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto rep0, Iteration(job, 0));
  ASSERT_OK_AND_ASSIGN(auto rep1, Iteration(job, 1));
  ASSERT_NE(rep0.iteration_id(), rep1.iteration_id());
  ASSERT_OK_AND_ASSIGN(auto r, WorkerHb(kW1));
  ASSERT_EQ(r.new_tasks_size(), 2);
  std::vector<int64_t> held = TaskIds(r);
  int64_t t1 = 0;
  for (const auto& t : r.new_tasks()) {
    if (t.iteration_id() == rep1.iteration_id()) t1 = t.task_id();
  }

  ASSERT_OK(Release(rep0.iteration_client_id()));
  d_->Tick();
  // Repetition 1 still has its client: it must stay readable.
  auto hb = ClientHb(rep1.iteration_client_id());
  EXPECT_TRUE(hb.ok()) << hb.status();
  if (hb.ok()) {
    ASSERT_EQ(hb->tasks_size(), 1);
    EXPECT_EQ(hb->tasks(0).task_id(), t1);
    EXPECT_FALSE(hb->iteration_finished());
  }
  EXPECT_EQ(d_->GetStats().live_tasks, 1);

  // Once its client leaves too, everything is collected and deleted.
  ASSERT_OK(Release(rep1.iteration_client_id()));
  d_->Tick();
  EXPECT_EQ(d_->GetStats().live_tasks, 0);
  ASSERT_OK_AND_ASSIGN(auto del, WorkerHb(kW1, held));
  EXPECT_EQ(Deleted(del), std::set<int64_t>(held.begin(), held.end()));
  EXPECT_EQ(Workers().workers(0).num_tasks(), 0);
}

TEST_F(DispatcherImplTest, NamedUnfinishedIterationIsCollectedAfterTheGcTimeout) {
  DispatcherConfig c = TestConfig();
  c.job_gc_timeout_ms = 5000;
  c.worker_timeout_ms = 60000;
  c.client_timeout_ms = 60000;
  Reset(c);
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(auto first, Iteration(job, 0));
  ASSERT_OK_AND_ASSIGN(auto r, WorkerHb(kW1));
  ASSERT_EQ(r.new_tasks_size(), 1);
  const int64_t t = r.new_tasks(0).task_id();

  ASSERT_OK(Release(first.iteration_client_id()));
  d_->Tick();
  EXPECT_EQ(d_->GetStats().live_tasks, 1);  // a named iteration waits for newcomers

  // A newcomer within the timeout rejoins the same iteration; when it leaves
  // the idle clock restarts.
  Advance(absl::Milliseconds(4000));
  d_->Tick();
  ASSERT_OK_AND_ASSIGN(auto second, Iteration(job, 0));
  EXPECT_EQ(second.iteration_id(), first.iteration_id());
  ASSERT_OK(Release(second.iteration_client_id()));
  Advance(absl::Milliseconds(4000));  // 8 s since the first left, 4 s idle
  d_->Tick();
  EXPECT_EQ(d_->GetStats().live_tasks, 1);
  EXPECT_EQ(d_->GetStats().collected_iterations, 0);

  Advance(absl::Milliseconds(1001 + 100));  // > 5 s idle
  d_->Tick();
  auto stats = d_->GetStats();
  EXPECT_EQ(stats.live_tasks, 0);
  EXPECT_EQ(stats.collected_iterations, 1);
  ASSERT_OK_AND_ASSIGN(auto del, WorkerHb(kW1, {t}));
  EXPECT_THAT(Deleted(del), UnorderedElementsAre(t));

  // A newcomer to the collected, unfinished iteration is refused clearly...
  EXPECT_STATUS(Iteration(job, 0), absl::StatusCode::kFailedPrecondition, "garbage-collected");
  EXPECT_STATUS(Iteration(job, 0), absl::StatusCode::kFailedPrecondition, "'train'");
  // ...while the next repetition starts normally.
  ASSERT_OK_AND_ASSIGN(auto next, Iteration(job, 1));
  EXPECT_NE(next.iteration_id(), first.iteration_id());
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW1));
  ASSERT_EQ(r2.new_tasks_size(), 1);
  EXPECT_EQ(r2.new_tasks(0).iteration_id(), next.iteration_id());
}

TEST_F(DispatcherImplTest, NewcomerToAFinishedNamedIterationSeesItFinished) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK_AND_ASSIGN(auto first, Iteration(job, 0));
  ASSERT_OK_AND_ASSIGN(auto r, WorkerHb(kW1));
  ASSERT_EQ(r.new_tasks_size(), 1);
  const int64_t t = r.new_tasks(0).task_id();
  ASSERT_OK(Complete(kW1, t));

  // While the first client is still there.
  ASSERT_OK_AND_ASSIGN(auto early, Iteration(job, 0));
  EXPECT_EQ(early.iteration_id(), first.iteration_id());
  ASSERT_OK_AND_ASSIGN(auto ehb, ClientHb(early.iteration_client_id()));
  EXPECT_TRUE(ehb.iteration_finished());
  ASSERT_OK(Release(early.iteration_client_id()));
  ASSERT_OK(Release(first.iteration_client_id()));

  // A finished iteration is collected as soon as its last client leaves...
  d_->Tick();
  EXPECT_EQ(d_->GetStats().live_tasks, 0);
  EXPECT_EQ(d_->GetStats().collected_iterations, 1);
  ASSERT_OK_AND_ASSIGN(auto del, WorkerHb(kW1, {t}));
  EXPECT_THAT(Deleted(del), UnorderedElementsAre(t));

  // ...and a newcomer learns at once that it is over.
  ASSERT_OK_AND_ASSIGN(auto late, Iteration(job, 0));
  EXPECT_EQ(late.iteration_id(), first.iteration_id());
  ASSERT_OK_AND_ASSIGN(auto lhb, ClientHb(late.iteration_client_id()));
  EXPECT_TRUE(lhb.iteration_finished());
  EXPECT_EQ(lhb.tasks_size(), 0);
  EXPECT_FALSE(lhb.has_error());
  ASSERT_OK(Release(late.iteration_client_id()));
  d_->Tick();  // collecting again is harmless
  EXPECT_EQ(d_->GetStats().collected_iterations, 1);
}

// ---- versions and long polls ---------------------------------------------------------

TEST_F(DispatcherImplTest, VersionIncreasesOnEveryVisibleChange) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  const int64_t c = it.iteration_client_id();
  std::vector<int64_t> versions;
  auto record = [&]() {
    auto hb = ClientHb(c);
    ASSERT_TRUE(hb.ok()) << hb.status();
    versions.push_back(hb->version());
  };
  record();
  // Registering mid-iteration creates a task (and the same reply delivers it).
  ASSERT_OK_AND_ASSIGN(auto r1, WorkerHb(kW1));
  ASSERT_EQ(r1.new_tasks_size(), 1);
  record();
  ASSERT_OK_AND_ASSIGN(auto r2, WorkerHb(kW2));
  ASSERT_EQ(r2.new_tasks_size(), 1);
  record();
  ASSERT_EQ(r1.new_tasks_size(), 1);
  const int64_t t1 = r1.new_tasks(0).task_id();
  const int64_t t2 = r2.new_tasks(0).task_id();
  ASSERT_OK(WorkerHb(kW1, {t1}).status());
  ASSERT_OK(WorkerHb(kW2, {t2}).status());
  record();  // plain heartbeats change nothing clients can see
  ASSERT_OK(Fail(kW1, t1, absl::InternalError("boom")));
  record();
  ASSERT_OK(Complete(kW2, t2));
  record();
  ASSERT_EQ(versions.size(), 6u);
  EXPECT_LT(versions[0], versions[1]);
  EXPECT_LT(versions[1], versions[2]);
  EXPECT_EQ(versions[2], versions[3]);
  EXPECT_LT(versions[3], versions[4]);
  EXPECT_LT(versions[4], versions[5]);
}

TEST_F(DispatcherImplTest, LongPollsReturnEarlyOnChange) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));

  // A worker's long poll returns when a new iteration gives it a task.
  {
    proto::WorkerHeartbeatResponse resp;
    absl::Status status;
    absl::Notification returned;
    std::thread poller([&] {
      proto::WorkerHeartbeatRequest req;
      req.set_worker_address(kW1);
      req.set_wait_ms(600000);
      status = d_->WorkerHeartbeat(req, &resp);
      returned.Notify();
    });
    ASSERT_OK(Iteration(job).status());
    const bool ok = returned.WaitForNotificationWithTimeout(absl::Seconds(120));
    if (!ok) d_->Shutdown();  // unblock the poller so the test can report
    poller.join();
    ASSERT_TRUE(ok) << "the worker's long poll did not return after a change";
    ASSERT_OK(status);
    EXPECT_EQ(resp.new_tasks_size(), 1);
  }

  // A client's long poll returns when the iteration changes.
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));  // same anonymous job: same iteration
  ASSERT_OK_AND_ASSIGN(auto hb0, ClientHb(it.iteration_client_id()));
  ASSERT_EQ(hb0.tasks_size(), 1);
  {
    proto::ClientHeartbeatResponse resp;
    absl::Status status;
    absl::Notification returned;
    std::thread poller([&] {
      proto::ClientHeartbeatRequest req;
      req.set_iteration_client_id(it.iteration_client_id());
      req.set_known_version(hb0.version());
      req.set_wait_ms(600000);
      status = d_->ClientHeartbeat(req, &resp);
      returned.Notify();
    });
    ASSERT_OK(Complete(kW1, hb0.tasks(0).task_id()));
    const bool ok = returned.WaitForNotificationWithTimeout(absl::Seconds(120));
    if (!ok) d_->Shutdown();
    poller.join();
    ASSERT_TRUE(ok) << "the client's long poll did not return after a change";
    ASSERT_OK(status);
    EXPECT_GT(resp.version(), hb0.version());
    EXPECT_TRUE(resp.iteration_finished());
  }

  // After Shutdown, long polls return at once.
  d_->Shutdown();
  ASSERT_OK_AND_ASSIGN(auto hb1, ClientHb(it.iteration_client_id()));
  proto::ClientHeartbeatRequest req;
  req.set_iteration_client_id(it.iteration_client_id());
  req.set_known_version(hb1.version());
  req.set_wait_ms(600000);
  proto::ClientHeartbeatResponse resp;
  ASSERT_OK(d_->ClientHeartbeat(req, &resp));
  proto::WorkerHeartbeatRequest wreq;
  wreq.set_worker_address(kW1);
  wreq.set_wait_ms(600000);
  proto::WorkerHeartbeatResponse wresp;
  ASSERT_OK(d_->WorkerHeartbeat(wreq, &wresp));
}

// Liveness (dispatcher_impl.h): a worker is alive for worker_timeout_ms
// from its request's arrival, and again from the return of a long poll to a
// caller still there. Deterministic: the fake clock tells the test when the
// poll holds the mutex, so Tick() runs only once the poll is waiting.
TEST(DispatcherImplLongPollTest, WorkerIsAliveFromItsPollsArrivalAndReturn) {
  std::atomic<int64_t> now_ms{1'700'000'000'000};
  absl::Notification poll_started;
  static thread_local bool is_poller = false;
  DispatcherConfig config = TestConfig();
  config.worker_timeout_ms = 1000;
  DispatcherImpl d(config, [&] {
    const absl::Time t = absl::FromUnixMillis(now_ms.load());  // read before notifying
    if (is_poller && !poll_started.HasBeenNotified()) poll_started.Notify();
    return t;
  });
  proto::WorkerHeartbeatRequest reg;
  reg.set_worker_address(kW1);
  proto::WorkerHeartbeatResponse reg_resp;
  ASSERT_OK(d.WorkerHeartbeat(reg, &reg_resp));
  EXPECT_EQ(reg_resp.worker_timeout_ms(), 1000);

  absl::Status status;
  proto::WorkerHeartbeatResponse resp;
  std::thread poller([&] {
    is_poller = true;
    proto::WorkerHeartbeatRequest req;
    req.set_worker_address(kW1);
    req.set_wait_ms(200);
    status = d.WorkerHeartbeat(req, &resp);
  });
  const bool started = poll_started.WaitForNotificationWithTimeout(absl::Seconds(60));
  if (started) {
    now_ms += 900;
    d.Tick();  // within the timeout of the poll's arrival
    EXPECT_EQ(d.GetStats().workers, 1);
  }
  poller.join();
  ASSERT_TRUE(started);
  ASSERT_OK(status);
  // The poll returned at +900 to a caller still there: alive until +1900.
  now_ms += 900;
  d.Tick();
  EXPECT_EQ(d.GetStats().workers, 1);
  now_ms += 200;
  d.Tick();
  EXPECT_EQ(d.GetStats().workers, 0);
  EXPECT_EQ(d.GetStats().lost_workers, 1);
}

// The server holds a long poll at most a third of the caller's timeout,
// whatever wait_ms asks; the test fails by hanging (guarded) otherwise.
TEST(DispatcherImplLongPollTest, LongPollsAreBoundedByTheTimeout) {
  DispatcherConfig config = TestConfig();
  config.worker_timeout_ms = 300;
  config.client_timeout_ms = 300;
  DispatcherImpl d(config);
  EXPECT_EQ(d.MaxWorkerWait(), absl::Milliseconds(100));
  EXPECT_EQ(d.MaxClientWait(), absl::Milliseconds(100));
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address(kW1);
  proto::WorkerHeartbeatResponse resp;
  ASSERT_OK(d.WorkerHeartbeat(req, &resp));
  proto::RegisterDatasetRequest r;
  *r.mutable_dataset() = Dataset::Range(3).def();
  proto::RegisterDatasetResponse rr;
  ASSERT_OK(d.RegisterDataset(r, &rr));
  proto::GetOrCreateJobRequest j;
  j.set_dataset_id(rr.dataset_id());
  j.set_processing_mode(proto::PARALLEL_EPOCHS);
  proto::GetOrCreateJobResponse jr;
  ASSERT_OK(d.GetOrCreateJob(j, &jr));
  proto::GetOrCreateIterationRequest ir;
  ir.set_job_id(jr.job_id());
  proto::GetOrCreateIterationResponse it;
  ASSERT_OK(d.GetOrCreateIteration(ir, &it));
  ASSERT_OK(d.WorkerHeartbeat(req, &resp));  // takes its task: nothing new after this

  absl::Notification returned;
  std::thread poller([&] {
    proto::WorkerHeartbeatRequest w = req;
    w.set_wait_ms(3'600'000);
    proto::WorkerHeartbeatResponse wr;
    EXPECT_OK(d.WorkerHeartbeat(w, &wr));
    proto::ClientHeartbeatRequest c;
    c.set_iteration_client_id(it.iteration_client_id());
    c.set_known_version(-1);
    proto::ClientHeartbeatResponse cr;
    ASSERT_OK(d.ClientHeartbeat(c, &cr));
    c.set_known_version(cr.version());
    c.set_wait_ms(3'600'000);
    EXPECT_OK(d.ClientHeartbeat(c, &cr));
    returned.Notify();
  });
  const bool ok = returned.WaitForNotificationWithTimeout(absl::Seconds(60));
  if (!ok) d.Shutdown();
  poller.join();
  EXPECT_TRUE(ok) << "an hour-long poll was held past a third of the timeout";
}

// A poll whose caller went away returns Cancelled at once and credits no
// liveness: the worker expires worker_timeout_ms after the poll arrived.
TEST(DispatcherImplLongPollTest, CancelledPollEndsTheCredit) {
  std::atomic<int64_t> now_ms{1'700'000'000'000};
  DispatcherConfig config = TestConfig();
  config.worker_timeout_ms = 30000;  // a long cap: only cancellation ends the poll early
  DispatcherImpl d(config, [&] { return absl::FromUnixMillis(now_ms.load()); });
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address(kW1);
  proto::WorkerHeartbeatResponse resp;
  ASSERT_OK(d.WorkerHeartbeat(req, &resp));
  std::atomic<bool> gone{false};
  absl::Notification waiting;  // the poll asks whether its caller is there only once waiting
  absl::Status status;
  std::thread poller([&] {
    proto::WorkerHeartbeatRequest w = req;
    w.set_wait_ms(3'600'000);
    proto::WorkerHeartbeatResponse wr;
    status = d.WorkerHeartbeat(w, &wr, [&] {
      if (!waiting.HasBeenNotified()) waiting.Notify();
      return gone.load();
    });
  });
  ASSERT_TRUE(waiting.WaitForNotificationWithTimeout(absl::Seconds(60)));
  now_ms += 29000;
  gone = true;  // the caller's connection broke
  poller.join();  // returns within kCancelCheckInterval (a hang here fails the test by timeout)
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  now_ms += 1001;  // 30 001 ms after the poll arrived
  d.Tick();
  EXPECT_EQ(d.GetStats().workers, 0);
}

// Registration: dialable addresses and a known protocol, and a probe that
// must succeed before the worker exists.
TEST(DispatcherImplRegistrationTest, BadRegistrationsAreRefused) {
  std::vector<std::string> probed;
  DispatcherImpl d(TestConfig(), absl::Now, [&](const proto::WorkerHeartbeatRequest& r) {
    probed.push_back(r.worker_address());
    return r.worker_address() == kW2 ? absl::UnavailableError("nothing answers")
                                     : absl::OkStatus();
  });
  auto hb = [&](const std::string& address, const std::string& protocol,
                const std::string& transfer = "") {
    proto::WorkerHeartbeatRequest req;
    req.set_worker_address(address);
    req.set_transfer_protocol(protocol);
    req.set_transfer_address(transfer);
    proto::WorkerHeartbeatResponse resp;
    return d.WorkerHeartbeat(req, &resp);
  };
  EXPECT_STATUS(hb(kW1, "../../../etc/passwd"), absl::StatusCode::kInvalidArgument,
                "not a protocol name");
  EXPECT_STATUS(hb(kW1, "ucx tcp"), absl::StatusCode::kInvalidArgument, "not a protocol name");
  EXPECT_STATUS(hb(kW1, std::string(33, 'x')), absl::StatusCode::kInvalidArgument,
                "not a protocol name");
  EXPECT_STATUS(hb("0.0.0.0:5000", "grpc"), absl::StatusCode::kInvalidArgument, "wildcard");
  EXPECT_STATUS(hb("nohostport", "grpc"), absl::StatusCode::kInvalidArgument, "worker_address");
  EXPECT_STATUS(hb(kW1, "ucx", "[::]:9"), absl::StatusCode::kInvalidArgument, "wildcard");
  EXPECT_TRUE(probed.empty()) << "invalid requests must not be probed";
  EXPECT_STATUS(hb(kW2, "grpc"), absl::StatusCode::kFailedPrecondition, "nothing answers");
  EXPECT_EQ(d.GetStats().workers, 0);
  ASSERT_OK(hb(kW1, "ucx", kW3));
  ASSERT_OK(hb(kW1, "ucx", kW3));  // known: not probed again
  EXPECT_EQ(probed, (std::vector<std::string>{kW2, kW1}));
  EXPECT_EQ(d.GetStats().workers, 1);
}

// ---- introspection ------------------------------------------------------------------

// ---- distributed_epoch -------------------------------------------------------------

// Starts `workers`, a distributed_epoch job over `def` and its first
// iteration; returns each worker's task id.
class DistributedEpochTest : public DispatcherImplTest {
 protected:
  std::vector<int64_t> Start(const proto::DatasetDef& def, const std::vector<std::string>& workers) {
    for (const auto& w : workers) EXPECT_OK(WorkerHb(w).status());
    auto ds = Register(def);
    EXPECT_OK(ds.status());
    auto job = Job(*ds, "", proto::DISTRIBUTED_EPOCH);
    EXPECT_OK(job.status());
    auto it = Iteration(*job);
    EXPECT_OK(it.status());
    client_ = it->iteration_client_id();
    std::vector<int64_t> tasks;
    for (const auto& w : workers) {
      auto hb = WorkerHb(w);
      EXPECT_OK(hb.status());
      EXPECT_EQ(hb->new_tasks_size(), 1);
      EXPECT_EQ(hb->new_tasks(0).processing_mode(), proto::DISTRIBUTED_EPOCH);
      tasks.push_back(hb->new_tasks(0).task_id());
    }
    return tasks;
  }
  int64_t client_ = 0;
};

TEST_F(DistributedEpochTest, RangeIsSplitIntoContiguousSubRangesHandedOutOnce) {
  DispatcherConfig c = TestConfig();
  c.range_split_elements = 4;
  Reset(c);
  auto t = Start(Dataset::Range(10).Map(x * 2).def(), {kW1, kW2});
  ASSERT_OK_AND_ASSIGN(auto a, Split(kW1, t[0]));
  ASSERT_OK_AND_ASSIGN(auto b, Split(kW2, t[1]));
  ASSERT_OK_AND_ASSIGN(auto c3, Split(kW1, t[0]));
  ASSERT_TRUE(a.has_split() && b.has_split() && c3.has_split());
  EXPECT_EQ(a.split().begin(), 0);
  EXPECT_EQ(a.split().end(), 4);
  EXPECT_EQ(b.split().begin(), 4);
  EXPECT_EQ(b.split().end(), 8);
  EXPECT_EQ(c3.split().begin(), 8);
  EXPECT_EQ(c3.split().end(), 10);
  EXPECT_TRUE(a.epoch_had_splits());
  // Nothing left, but splits are still open: not the end yet.
  ASSERT_OK_AND_ASSIGN(auto wait, Split(kW2, t[1], 0, {b.split().split_id()}));
  EXPECT_TRUE(wait.not_ready());
  EXPECT_FALSE(wait.end_of_splits());
  ASSERT_OK_AND_ASSIGN(auto end, Split(kW1, t[0], 0, {a.split().split_id(), c3.split().split_id()}));
  EXPECT_TRUE(end.end_of_splits());
  ASSERT_OK_AND_ASSIGN(auto end2, Split(kW2, t[1]));
  EXPECT_TRUE(end2.end_of_splits());
  // Each epoch (a Repeat on the worker) has its own splits.
  ASSERT_OK_AND_ASSIGN(auto e1, Split(kW2, t[1], 1));
  ASSERT_TRUE(e1.has_split());
  EXPECT_EQ(e1.split().epoch(), 1);
  EXPECT_EQ(e1.split().begin(), 0);
  auto stats = d_->GetStats();
  EXPECT_EQ(stats.splits_created, 4);
  EXPECT_EQ(stats.splits_completed, 3);
  ASSERT_OK_AND_ASSIGN(auto hb, ClientHb(client_));
  EXPECT_EQ(hb.completed_split_watermark(), e1.split().split_id());
}

TEST_F(DistributedEpochTest, FromTensorsAndListFilesGiveOneElementOrFilePerSplit) {
  auto t = Start(Dataset::ReadRecords({"/tmp/a", "/tmp/b"}).def(), {kW1});
  ASSERT_OK_AND_ASSIGN(auto a, Split(kW1, t[0]));
  ASSERT_OK_AND_ASSIGN(auto b, Split(kW1, t[0]));
  EXPECT_EQ(a.split().begin(), 0);
  EXPECT_EQ(a.split().end(), 1);
  EXPECT_EQ(b.split().begin(), 1);
  EXPECT_EQ(b.split().end(), 2);

  std::string dir = ::testing::TempDir() + "/sluice_split_files";
  std::filesystem::create_directories(dir);
  for (const char* f : {"f0", "f1", "f2"}) std::ofstream(dir + "/" + f) << "x";
  Reset(TestConfig());
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(Dataset::ListFiles(dir + "/f*").def()));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "", proto::DISTRIBUTED_EPOCH));
  ASSERT_OK(Iteration(job).status());
  int64_t task = 0;
  ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(kW2));
  for (const auto& def : hb.new_tasks()) task = def.task_id();
  std::vector<std::string> files;
  std::vector<int64_t> done;  // each request reports the previous split completed
  while (files.size() < 5) {
    ASSERT_OK_AND_ASSIGN(auto r, Split(kW2, task, 0, done));
    if (!r.has_split()) {
      EXPECT_TRUE(r.end_of_splits());
      break;
    }
    files.push_back(r.split().file());
    // The split names the file's position too (its elements' keys).
    EXPECT_EQ(r.split().begin(), static_cast<int64_t>(files.size()) - 1);
    EXPECT_EQ(r.split().end(), r.split().begin() + 1);
    done = {r.split().split_id()};
  }
  EXPECT_EQ(files, (std::vector<std::string>{dir + "/f0", dir + "/f1", dir + "/f2"}));
  ASSERT_OK_AND_ASSIGN(std::string none, Register(Dataset::ListFiles(dir + "/nothing*").def()));
  ASSERT_OK_AND_ASSIGN(int64_t job2, Job(none, "", proto::DISTRIBUTED_EPOCH));
  EXPECT_STATUS(Iteration(job2), absl::StatusCode::kNotFound, "no files match");
  std::filesystem::remove_all(dir);
}

TEST_F(DistributedEpochTest, LostWorkersOpenSplitsGoToTheOthers) {
  DispatcherConfig c = TestConfig();
  c.range_split_elements = 10;
  Reset(c);
  auto t = Start(Dataset::Range(30).def(), {kW1, kW2});
  ASSERT_OK_AND_ASSIGN(auto a, Split(kW1, t[0]));  // [0, 10)
  ASSERT_OK_AND_ASSIGN(auto b, Split(kW1, t[0]));  // [10, 20), prefetched
  ASSERT_OK_AND_ASSIGN(auto c3, Split(kW2, t[1]));  // [20, 30)
  ASSERT_OK(Split(kW2, t[1], 0, {c3.split().split_id()}).status());
  // kW1 goes silent and is declared lost.
  Advance(absl::Milliseconds(6000));
  ASSERT_OK(WorkerHb(kW2, {t[1]}).status());
  Advance(absl::Milliseconds(6000));
  d_->Tick();
  EXPECT_EQ(d_->GetStats().splits_reassigned, 2);
  // They wait until the iteration's client said what it received of them
  // (kW1 may have sent it elements of both).
  ASSERT_OK_AND_ASSIGN(auto asked, ClientHb(client_));
  EXPECT_THAT(asked.report_splits(), ElementsAre(a.split().split_id(), b.split().split_id()));
  ASSERT_OK_AND_ASSIGN(auto waiting, Split(kW2, t[1]));
  EXPECT_TRUE(waiting.not_ready());
  proto::ClientHeartbeatRequest report;  // elements 0..3 of a, none of b
  report.set_iteration_client_id(client_);
  report.set_known_version(-1);
  report.set_reports_splits(true);
  proto::SplitProgress* got = report.add_reported_splits();
  got->set_split_id(a.split().split_id());
  got->set_delivered_prefix(4);
  report.add_reported_splits()->set_split_id(b.split().split_id());
  proto::ClientHeartbeatResponse answered;
  ASSERT_OK(d_->ClientHeartbeat(report, &answered));
  EXPECT_THAT(answered.report_splits(), IsEmpty());
  ASSERT_OK_AND_ASSIGN(auto r1, Split(kW2, t[1]));
  ASSERT_OK_AND_ASSIGN(auto r2, Split(kW2, t[1]));
  EXPECT_EQ(r1.split().split_id(), a.split().split_id());  // in order
  EXPECT_EQ(r2.split().split_id(), b.split().split_id());
  EXPECT_EQ(r1.split().begin(), 0);
  EXPECT_EQ(r1.split().skip_prefix(), 4);  // kW2 does not send those again
  EXPECT_EQ(r2.split().skip_prefix(), 0);
  // A lost task gets nothing more (its late reports are ignored).
  EXPECT_STATUS(Split(kW1, t[0]), absl::StatusCode::kFailedPrecondition, "declared lost");
  ASSERT_OK_AND_ASSIGN(auto end,
                       Split(kW2, t[1], 0, {r1.split().split_id(), r2.split().split_id()}));
  EXPECT_TRUE(end.end_of_splits());
  ASSERT_OK_AND_ASSIGN(auto hb, ClientHb(client_));
  EXPECT_FALSE(hb.iteration_finished());
  ASSERT_OK(Complete(kW2, t[1]));
  ASSERT_OK_AND_ASSIGN(auto hb2, ClientHb(client_));
  EXPECT_TRUE(hb2.iteration_finished());
}

TEST_F(DistributedEpochTest, GetSplitChecksTheTaskAndItsWorker) {
  auto t = Start(Dataset::Range(3).def(), {kW1});
  EXPECT_STATUS(Split(kW1, 999), absl::StatusCode::kNotFound, "task 999 does not exist");
  EXPECT_STATUS(Split(kW2, t[0]), absl::StatusCode::kFailedPrecondition, "belongs to worker");
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(3));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK(Iteration(job).status());
  ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(kW1, {t[0]}));
  ASSERT_EQ(hb.new_tasks_size(), 1);
  EXPECT_STATUS(Split(kW1, hb.new_tasks(0).task_id()), absl::StatusCode::kFailedPrecondition,
                "not distributed_epoch");
}

TEST_F(DistributedEpochTest, TaskThatEndsOnItsOwnDropsItsSplits) {
  DispatcherConfig c = TestConfig();
  c.range_split_elements = 5;
  Reset(c);
  auto t = Start(Dataset::Range(10).Take(2).def(), {kW1, kW2});
  ASSERT_OK_AND_ASSIGN(auto a, Split(kW1, t[0]));
  ASSERT_OK(Complete(kW1, t[0]));  // Take ended its pipeline inside split a
  ASSERT_OK_AND_ASSIGN(auto b, Split(kW2, t[1]));
  EXPECT_EQ(b.split().begin(), 5);
  ASSERT_OK_AND_ASSIGN(auto end, Split(kW2, t[1], 0, {b.split().split_id()}));
  EXPECT_TRUE(end.end_of_splits());
}

TEST_F(DispatcherImplTest, GetWorkersCountsTasks) {
  EXPECT_EQ(Workers().workers_size(), 0);
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "train"));
  ASSERT_OK(Iteration(job, 0).status());
  ASSERT_OK(Iteration(job, 1).status());
  auto workers = Workers();
  ASSERT_EQ(workers.workers_size(), 2);
  std::set<std::string> addrs;
  for (const auto& w : workers.workers()) {
    addrs.insert(w.address());
    EXPECT_EQ(w.num_tasks(), 2) << w.address();
  }
  EXPECT_EQ(addrs, (std::set<std::string>{kW1, kW2}));
  ASSERT_OK(WorkerHb(kW3).status());
  EXPECT_EQ(Workers().workers_size(), 3);
  EXPECT_EQ(d_->GetStats().live_tasks, 6);
}

TEST_F(DispatcherImplTest, GetDataServiceMetadata) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  proto::GetDataServiceMetadataRequest req;
  req.set_dataset_id(ds);
  proto::GetDataServiceMetadataResponse resp;
  ASSERT_OK(d_->GetDataServiceMetadata(req, &resp));
  EXPECT_EQ(resp.cardinality(), 5);
  EXPECT_NE(resp.fingerprint(), 0u);
  EXPECT_FALSE(resp.element_spec().empty());
  EXPECT_NE(resp.element_spec(), "(unknown)");

  ASSERT_OK_AND_ASSIGN(std::string ds2, Register(Dataset::Range(10).Take(3).def()));
  proto::GetDataServiceMetadataRequest req2;
  req2.set_dataset_id(ds2);
  proto::GetDataServiceMetadataResponse resp2;
  ASSERT_OK(d_->GetDataServiceMetadata(req2, &resp2));
  EXPECT_EQ(resp2.cardinality(), 3);
  EXPECT_NE(resp2.fingerprint(), resp.fingerprint());

  proto::GetDataServiceMetadataRequest bad;
  bad.set_dataset_id("ds-missing");
  proto::GetDataServiceMetadataResponse bad_resp;
  EXPECT_STATUS(d_->GetDataServiceMetadata(bad, &bad_resp), absl::StatusCode::kNotFound,
                "dataset 'ds-missing' is not registered");
}

TEST_F(DispatcherImplTest, GetDataServiceConfigReflectsTheConfig) {
  DispatcherConfig c;
  c.worker_timeout_ms = 1234;
  c.client_timeout_ms = 5678;
  c.job_gc_timeout_ms = 91011;
  Reset(c);
  proto::GetDataServiceConfigRequest req;
  proto::GetDataServiceConfigResponse resp;
  ASSERT_OK(d_->GetDataServiceConfig(req, &resp));
  EXPECT_EQ(resp.worker_timeout_ms(), 1234);
  EXPECT_EQ(resp.client_timeout_ms(), 5678);
  EXPECT_EQ(resp.job_gc_timeout_ms(), 91011);
  EXPECT_FALSE(resp.fault_tolerant_mode());
}

// ---- static sharding ------------------------------------------------------------

TEST(WorkerAddressesTest, ValidatesAndMatches) {
  EXPECT_OK(ValidateWorkerAddresses({"h:1", "h:%port%", "h:%port%", "10.0.0.2:5000"}));
  EXPECT_STATUS(ValidateWorkerAddresses({"h"}), absl::StatusCode::kInvalidArgument,
                "'h' is not host:port or host:%port%");
  EXPECT_STATUS(ValidateWorkerAddresses({"h:x1"}), absl::StatusCode::kInvalidArgument, "'h:x1'");
  EXPECT_STATUS(ValidateWorkerAddresses({":1"}), absl::StatusCode::kInvalidArgument, "':1'");
  EXPECT_STATUS(ValidateWorkerAddresses({"h:1", "h:1"}), absl::StatusCode::kInvalidArgument,
                "listed twice");
  const std::vector<std::string> p = {"a:%port%", "b:7", "a:%port%", "b:%port%"};
  auto all = [](int64_t) { return true; };
  EXPECT_EQ(MatchWorkerAddress(p, "b:7", all), 1);             // exact wins
  EXPECT_EQ(MatchWorkerAddress(p, "b:8", all), 3);             // host:%port%
  EXPECT_EQ(MatchWorkerAddress(p, "a:9", all), 0);             // first free wildcard
  EXPECT_EQ(MatchWorkerAddress(p, "a:9", [](int64_t i) { return i != 0; }), 2);
  EXPECT_EQ(MatchWorkerAddress(p, "a:9", [](int64_t) { return false; }), std::nullopt);
  EXPECT_EQ(MatchWorkerAddress(p, "c:7", all), std::nullopt);  // other host
  EXPECT_EQ(MatchWorkerAddress(p, "aa:9", all), std::nullopt);  // not a prefix match
}

class StaticShardingDispatcherTest : public DispatcherImplTest {
 protected:
  StaticShardingDispatcherTest() {
    DispatcherConfig c = TestConfig();
    c.worker_timeout_ms = 1000;
    c.worker_addresses = {kW2, "127.0.0.1:%port%", "127.0.0.1:%port%"};
    Reset(c);
  }
};

TEST_F(StaticShardingDispatcherTest, WorkersTakeTheirListedIndexAndOthersAreRejected) {
  ASSERT_OK(WorkerHb(kW1).status());  // first free %port% entry: 1
  ASSERT_OK(WorkerHb(kW2).status());  // its own entry: 0
  ASSERT_OK(WorkerHb(kW3).status());  // 2
  EXPECT_STATUS(WorkerHb("127.0.0.1:7004"), absl::StatusCode::kFailedPrecondition,
                "not in the dispatcher's worker_addresses");
  EXPECT_STATUS(WorkerHb("10.0.0.1:7001"), absl::StatusCode::kFailedPrecondition,
                "not in the dispatcher's worker_addresses");
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(30));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "", proto::DATA_SHARDING));
  ASSERT_OK(Iteration(job).status());
  std::map<std::string, int64_t> index;
  for (const char* w : {kW1, kW2, kW3}) {
    ASSERT_OK_AND_ASSIGN(auto r, WorkerHb(w));
    ASSERT_EQ(r.new_tasks_size(), 1);
    EXPECT_EQ(r.new_tasks(0).num_shards(), 3);
    EXPECT_EQ(r.new_tasks(0).processing_mode(), proto::DATA_SHARDING);
    index[w] = r.new_tasks(0).worker_index();
  }
  EXPECT_EQ(index[kW1], 1);
  EXPECT_EQ(index[kW2], 0);
  EXPECT_EQ(index[kW3], 2);
  // Once kW3 timed out, a new worker of that host takes its free entry.
  Advance(absl::Milliseconds(600));
  ASSERT_OK(WorkerHb(kW1, {}).status());
  ASSERT_OK(WorkerHb(kW2, {}).status());
  Advance(absl::Milliseconds(600));
  d_->Tick();
  ASSERT_OK_AND_ASSIGN(auto r4, WorkerHb("127.0.0.1:7004"));
  ASSERT_EQ(r4.new_tasks_size(), 1);
  EXPECT_EQ(r4.new_tasks(0).worker_index(), 2);
}

TEST_F(StaticShardingDispatcherTest, IterationEndsOnlyOnceEveryShardCompleted) {
  ASSERT_OK(WorkerHb(kW2).status());  // shard 0
  ASSERT_OK(WorkerHb(kW1).status());  // shard 1
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(30));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "", proto::DATA_SHARDING));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto a, WorkerHb(kW2));
  ASSERT_OK_AND_ASSIGN(auto b, WorkerHb(kW1));
  ASSERT_OK(Complete(kW2, a.new_tasks(0).task_id()));
  ASSERT_OK(Complete(kW1, b.new_tasks(0).task_id()));
  // Shard 2 has no worker yet: the iteration goes on.
  ASSERT_OK_AND_ASSIGN(auto hb, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb.iteration_finished());
  ASSERT_OK_AND_ASSIGN(auto c, WorkerHb(kW3));
  ASSERT_EQ(c.new_tasks_size(), 1);
  EXPECT_EQ(c.new_tasks(0).worker_index(), 2);
  // A worker restarting at kW3 (no longer holding its task) reads shard 2
  // again in a new task.
  ASSERT_OK_AND_ASSIGN(auto again, WorkerHb(kW3, {}));
  ASSERT_EQ(again.new_tasks_size(), 1);
  EXPECT_NE(again.new_tasks(0).task_id(), c.new_tasks(0).task_id());
  EXPECT_EQ(again.new_tasks(0).worker_index(), 2);
  ASSERT_OK_AND_ASSIGN(hb, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(hb.iteration_finished());
  ASSERT_OK(Complete(kW3, again.new_tasks(0).task_id()));
  ASSERT_OK_AND_ASSIGN(hb, ClientHb(it.iteration_client_id()));
  EXPECT_TRUE(hb.iteration_finished());
  // Finished shards are not read again by a worker that comes later.
  EXPECT_EQ(d_->GetStats().live_tasks, 4);
}

TEST_F(StaticShardingDispatcherTest, JobsCheckThePipelineAndTheWorkerList) {
  ASSERT_OK_AND_ASSIGN(std::string range, RegisterRange(30));
  EXPECT_STATUS(Job(range, "", proto::FILE_SHARDING), absl::StatusCode::kInvalidArgument,
                "no file source");
  ASSERT_OK_AND_ASSIGN(std::string two_files, Register(Dataset::ReadRecords({"a", "b"}).def()));
  EXPECT_STATUS(Job(two_files, "", proto::FILE_SHARDING), absl::StatusCode::kInvalidArgument,
                "2 file(s) for 3 workers");
  ASSERT_OK_AND_ASSIGN(std::string no_hint, RegisterRange(5));
  EXPECT_STATUS(Job(no_hint, "", proto::HINT_SHARDING), absl::StatusCode::kInvalidArgument,
                "no Shard(kShardHint");
  ASSERT_OK_AND_ASSIGN(std::string hinted,
                       Register(Dataset::Range(9).Shard(kShardHint, kShardHint).def()));
  EXPECT_OK(Job(hinted, "", proto::HINT_SHARDING).status());
  EXPECT_STATUS(Job(hinted, "", proto::PARALLEL_EPOCHS), absl::StatusCode::kInvalidArgument,
                "only processing_mode=hint");
  // A pattern the dispatcher cannot list is left to the workers to check.
  ASSERT_OK_AND_ASSIGN(std::string elsewhere,
                       Register(Dataset::ReadRecords(Dataset::ListFiles("/nonexistent/*")).def()));
  EXPECT_OK(Job(elsewhere, "", proto::FILE_SHARDING).status());
  // Without worker_addresses there is nothing to shard over.
  Reset(TestConfig());
  ASSERT_OK_AND_ASSIGN(range, RegisterRange(30));
  EXPECT_STATUS(Job(range, "", proto::DATA_SHARDING), absl::StatusCode::kFailedPrecondition,
                "needs the dispatcher's worker_addresses");
}

// ---- coordinated reads ----------------------------------------------------------

class CoordinatedReadsTest : public DispatcherImplTest {
 protected:
  absl::StatusOr<int64_t> CoordinatedJob(const proto::DatasetDef& def, int64_t consumers,
                                         const std::string& name = "sync",
                                         proto::ProcessingMode mode = proto::PARALLEL_EPOCHS) {
    SLUICE_ASSIGN_OR_RETURN(std::string ds, Register(def));
    proto::GetOrCreateJobRequest req;
    req.set_dataset_id(ds);
    req.set_processing_mode(mode);
    req.set_job_name(name);
    req.set_num_consumers(consumers);
    proto::GetOrCreateJobResponse resp;
    SLUICE_RETURN_IF_ERROR(d_->GetOrCreateJob(req, &resp));
    return resp.job_id();
  }
  absl::StatusOr<int64_t> Consumer(int64_t job, int64_t index) {
    proto::GetOrCreateIterationRequest req;
    req.set_job_id(job);
    req.set_consumer_index(index);
    proto::GetOrCreateIterationResponse resp;
    SLUICE_RETURN_IF_ERROR(d_->GetOrCreateIteration(req, &resp));
    return resp.iteration_client_id();
  }
  absl::StatusOr<proto::ClientHeartbeatResponse> RoundHb(int64_t client, int64_t current_round,
                                                         int64_t blocked_round) {
    proto::ClientHeartbeatRequest req;
    req.set_iteration_client_id(client);
    req.set_known_version(-1);
    req.set_current_round(current_round);
    req.set_blocked_round(blocked_round);
    proto::ClientHeartbeatResponse resp;
    SLUICE_RETURN_IF_ERROR(d_->ClientHeartbeat(req, &resp));
    return resp;
  }
  Dataset Infinite() const { return Dataset::Range(10).Repeat(); }
};

TEST_F(CoordinatedReadsTest, JobsNeedANameAnInfiniteDatasetAndAnEpochMode) {
  EXPECT_STATUS(CoordinatedJob(Infinite().def(), 2, ""), absl::StatusCode::kInvalidArgument,
                "need a job_name");
  EXPECT_STATUS(CoordinatedJob(Dataset::Range(10).def(), 2), absl::StatusCode::kInvalidArgument,
                "need an infinite dataset");
  EXPECT_STATUS(CoordinatedJob(Dataset::Range(10).Filter(x > 2).def(), 2),
                absl::StatusCode::kInvalidArgument, "cardinality unknown");
  EXPECT_STATUS(CoordinatedJob(Infinite().def(), 2, "sync", proto::DISTRIBUTED_EPOCH),
                absl::StatusCode::kInvalidArgument, "do not combine with distributed_epoch");
  ASSERT_OK_AND_ASSIGN(int64_t job, CoordinatedJob(Infinite().def(), 2));
  EXPECT_STATUS(Consumer(job, 2), absl::StatusCode::kInvalidArgument,
                "consumer_index 2 is not in [0, 2)");
  EXPECT_STATUS(Consumer(job, -1), absl::StatusCode::kInvalidArgument, "consumer_index -1");
  ASSERT_OK(Consumer(job, 0).status());
  EXPECT_STATUS(Consumer(job, 0), absl::StatusCode::kFailedPrecondition,
                "consumer_index 0 of job 'sync' is already reading");
  ASSERT_OK(Consumer(job, 1).status());
  // Another job_name's num_consumers must match.
  EXPECT_STATUS(CoordinatedJob(Infinite().def(), 3), absl::StatusCode::kInvalidArgument,
                "num_consumers=2; requested 3");
}

TEST_F(CoordinatedReadsTest, AWorkerJoiningMidJobStartsAtARoundEveryConsumerHonours) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(int64_t job, CoordinatedJob(Infinite().def(), 2));
  ASSERT_OK_AND_ASSIGN(int64_t c0, Consumer(job, 0));
  ASSERT_OK_AND_ASSIGN(int64_t c1, Consumer(job, 1));
  ASSERT_OK_AND_ASSIGN(auto hb, RoundHb(c0, 3, -1));
  ASSERT_EQ(hb.tasks_size(), 1);
  EXPECT_EQ(hb.tasks(0).starting_round(), 0);
  EXPECT_EQ(hb.block_round(), -1);
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c1, 5, -1));
  ASSERT_OK_AND_ASSIGN(auto first, WorkerHb(kW1));
  ASSERT_EQ(first.new_tasks_size(), 1);
  EXPECT_EQ(first.new_tasks(0).num_consumers(), 2);

  // kW2 joins: its task stays hidden; consumers are told to block at the
  // furthest round (5) + the lead.
  ASSERT_OK(WorkerHb(kW2).status());
  const int64_t target = 5 + 16;
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c0, 4, -1));
  EXPECT_EQ(hb.tasks_size(), 1);
  EXPECT_EQ(hb.block_round(), target);
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c0, 6, target));  // c0 honours it
  EXPECT_EQ(hb.tasks_size(), 1);
  // c1 already requested past the target: a later one is chosen and c0's
  // consent no longer counts.
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c1, target + 3, -1));
  const int64_t later = target + 3 + 16;
  EXPECT_EQ(hb.block_round(), later);
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c1, target + 4, later));
  EXPECT_EQ(hb.tasks_size(), 1) << "c0 has not honoured the later round yet";
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c0, 8, target));
  EXPECT_EQ(hb.block_round(), later);
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c0, 9, later));
  // Both honour `later`: the task joins there.
  ASSERT_EQ(hb.tasks_size(), 2);
  EXPECT_EQ(hb.block_round(), -1);
  std::map<int64_t, int64_t> start;
  for (const auto& t : hb.tasks()) start[t.task_id()] = t.starting_round();
  EXPECT_EQ(start.begin()->second, 0);
  EXPECT_EQ(start.rbegin()->second, later);
  ASSERT_OK_AND_ASSIGN(hb, RoundHb(c1, target + 5, -1));
  ASSERT_EQ(hb.tasks_size(), 2);
  EXPECT_EQ(hb.block_round(), -1);
}

// ---- journal (fault_tolerant_mode) ------------------------------------------------

// A dispatcher journaling to a fresh work_dir; Restart() replaces it by one
// that replays the journal, and checks that the replay rebuilt the state.
class JournalTest : public DispatcherImplTest {
 protected:
  JournalTest() {
    dir_ = ::testing::TempDir() + "/sluice_journal_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    config_ = TestConfig();
    config_.work_dir = dir_;
    config_.fault_tolerant_mode = true;
    Open();
  }
  ~JournalTest() override {
    d_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Open() {
    Reset(config_);
    ASSERT_OK(d_->OpenJournal(FsyncPolicy::kNone));
  }
  // kill -9 and restart: the new dispatcher must have the same state.
  // Every other restart compacts the journal first, so the snapshot must
  // rebuild the same state as the updates it replaces.
  void Restart() {
    const bool compact = restarts_++ % 2 == 1;
    if (compact) ASSERT_OK(d_->CompactJournal());
    d_->AwaitJournalIdle();  // no background compaction lands after the stats below
    const std::string before = d_->DurableStateString();
    const DispatcherImpl::Stats stats = d_->GetStats();
    d_.reset();
    Open();
    EXPECT_EQ(d_->DurableStateString(), before) << (compact ? "after compaction" : "");
    if (!compact && stats.journal_compactions == 0) {
      EXPECT_EQ(d_->GetStats().replayed_records, stats.replayed_records + stats.journal_records);
    }
  }
  int restarts_ = 0;
  // A distributed_epoch fetch from a worker that tracks what it holds.
  absl::StatusOr<proto::GetSplitResponse> Fetch(const std::string& worker, int64_t task,
                                                 const std::vector<int64_t>& held,
                                                 const std::vector<int64_t>& completed = {},
                                                 int64_t epoch = 0) {
    proto::GetSplitRequest req;
    req.set_worker_address(worker);
    req.set_task_id(task);
    req.set_epoch(epoch);
    for (int64_t id : completed) req.add_completed_splits(id);
    for (int64_t id : held) req.add_held_splits(id);
    req.set_reports_held(true);
    proto::GetSplitResponse resp;
    SLUICE_RETURN_IF_ERROR(d_->GetSplit(req, &resp));
    return resp;
  }
  std::string dir_;
  DispatcherConfig config_;
};

// A journal written by the dispatcher before the control plane was split
// into DispatcherState, TaskPolicy and JournalCommitter
// (testdata/journal_61ab566/README.md) replays into what that dispatcher
// itself replayed it into, and survives a restart and a compaction in
// today's encoding.
TEST_F(JournalTest, AJournalWrittenByAnOlderDispatcherReplays) {
  d_.reset();
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  std::filesystem::copy_file(SLUICE_CONTROL_TESTDATA "/journal_61ab566/journal", dir_ + "/journal");
  Open();
  DispatcherImpl::Stats stats = d_->GetStats();
  // What 61ab566 logged replaying the same file: 147 records, 3 datasets,
  // 3 jobs, 3 iterations, 36 running tasks, 12 workers, 8 clients.
  EXPECT_EQ(stats.replayed_records, 147);
  EXPECT_EQ(stats.datasets, 3);
  EXPECT_EQ(stats.current_jobs, 3);
  EXPECT_EQ(stats.active_iterations, 3);
  EXPECT_EQ(stats.live_tasks, 36);
  EXPECT_EQ(stats.workers, 12);
  EXPECT_EQ(stats.iteration_clients, 8);
  EXPECT_GT(stats.splits_created, 0);
  const std::string state = d_->DurableStateString();
  Restart();
  Restart();  // compacts into today's snapshot first
  EXPECT_EQ(d_->DurableStateString(), state);
  // It goes on: a new consumer joins, a new job starts.
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "after-upgrade"));
  ASSERT_OK(Iteration(job, 0).status());
  EXPECT_EQ(d_->GetStats().current_jobs, 4);
}

TEST_F(JournalTest, AnExplicitDatasetIdSurvivesARestart) {
  ASSERT_OK(Register(Dataset::Range(5).def(), "eval").status());
  Restart();
  ASSERT_OK_AND_ASSIGN(std::string again, Register(Dataset::Range(5).def(), "eval"));
  EXPECT_EQ(again, "eval");
  EXPECT_STATUS(Register(Dataset::Range(6).def(), "eval"), absl::StatusCode::kAlreadyExists,
                "different definition");
  Restart();  // compacted: the snapshot keeps it too
  ASSERT_OK(Job("eval").status());
}

TEST_F(JournalTest, HostsAndLocalJobsSurviveARestart) {
  ASSERT_OK(WorkerOn(kW1, "host-a"));
  ASSERT_OK(WorkerOn(kW2, "host-b"));
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));
  ASSERT_OK_AND_ASSIGN(int64_t job, TargetJob(ds, "local", proto::TARGET_WORKERS_LOCAL));
  ASSERT_OK_AND_ASSIGN(auto on_a, IterationOn(job, "host-a"));
  Restart();
  EXPECT_EQ(ListedWorkers(on_a.iteration_client_id()), std::set<std::string>{kW1});
  EXPECT_STATUS(TargetJob(ds, "local", proto::TARGET_WORKERS_ANY),
                absl::StatusCode::kInvalidArgument, "exists with target_workers=LOCAL");
  Restart();  // compacted
  ASSERT_OK(WorkerOn(kW3, "host-a"));
  EXPECT_EQ(ListedWorkers(on_a.iteration_client_id()), (std::set<std::string>{kW1, kW3}));
}

TEST_F(JournalTest, ReplayRebuildsDatasetsJobsIterationsTasksAndClients) {
  Restart();  // an empty journal
  ASSERT_OK(WorkerHb(kW1, {}, {}, "127.0.0.1:9001", "ucx").status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(10));
  ASSERT_OK_AND_ASSIGN(int64_t named, Job(ds, "shared"));
  ASSERT_OK_AND_ASSIGN(int64_t anon, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it0, Iteration(named));
  ASSERT_OK_AND_ASSIGN(auto it_anon, Iteration(anon));
  Restart();
  // The named job is found again by name; the worker's tasks were not
  // delivered before the restart, so they are sent now.
  ASSERT_OK_AND_ASSIGN(int64_t again, Job(ds, "shared"));
  EXPECT_EQ(again, named);
  ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(kW1));
  ASSERT_EQ(hb.new_tasks_size(), 2);
  const int64_t task = hb.new_tasks(0).task_id();
  Restart();
  // Delivered tasks are not sent again.
  ASSERT_OK_AND_ASSIGN(hb, WorkerHb(kW1, {task, hb.new_tasks(1).task_id()}));
  EXPECT_EQ(hb.new_tasks_size(), 0);
  ASSERT_OK_AND_ASSIGN(auto chb, ClientHb(it0.iteration_client_id()));
  ASSERT_EQ(chb.tasks_size(), 1);
  EXPECT_EQ(chb.tasks(0).transfer_address(), "127.0.0.1:9001");
  EXPECT_EQ(chb.tasks(0).transfer_protocol(), "ucx");
  // A second worker, completion, an error, a release and collection.
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK(Fail(kW1, task, absl::InvalidArgumentError("bad element")));
  ASSERT_OK(Release(it_anon.iteration_client_id()));
  d_->Tick();  // collects the anonymous iteration and forgets its job
  Restart();
  ASSERT_OK_AND_ASSIGN(chb, ClientHb(it0.iteration_client_id()));
  EXPECT_EQ(chb.error().message(), "bad element");
  EXPECT_STATUS(Iteration(anon), absl::StatusCode::kNotFound, "does not exist");
  EXPECT_STATUS(ClientHb(it_anon.iteration_client_id()), absl::StatusCode::kNotFound,
                "unknown");
  // Ids keep growing across restarts.
  ASSERT_OK_AND_ASSIGN(int64_t later, Job(ds));
  EXPECT_GT(later, it_anon.iteration_client_id());
}

TEST_F(JournalTest, RestoredWorkersAndClientsThatDoNotComeBackTimeOut) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(10));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "j"));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(kW1));
  ASSERT_EQ(hb.new_tasks_size(), 1);
  Advance(absl::Milliseconds(config_.worker_timeout_ms - 1));
  Restart();
  // Timeouts count from the restart, not from the last heartbeat before it.
  Advance(absl::Milliseconds(config_.worker_timeout_ms - 1));
  d_->Tick();
  EXPECT_EQ(d_->GetStats().workers, 1);
  Advance(absl::Milliseconds(2));
  d_->Tick();
  EXPECT_EQ(d_->GetStats().workers, 0);
  Advance(absl::Milliseconds(config_.client_timeout_ms));
  d_->Tick();
  EXPECT_EQ(d_->GetStats().iteration_clients, 0);
  Restart();
  EXPECT_EQ(d_->GetStats().workers, 0);
  EXPECT_STATUS(ClientHb(it.iteration_client_id()), absl::StatusCode::kNotFound, "unknown");
}

// The distributed_epoch guarantee across restarts: however often the
// dispatcher restarts, every split of Range(100) is handed out once.
TEST_F(JournalTest, DistributedEpochSplitsSurviveRestartsExactlyOnce) {
  config_.range_split_elements = 7;
  Open();
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(Dataset::Range(100).def()));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "", proto::DISTRIBUTED_EPOCH));
  ASSERT_OK(Iteration(job).status());
  std::map<std::string, int64_t> task;
  for (const char* w : {kW1, kW2}) {
    ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(w));
    ASSERT_EQ(hb.new_tasks_size(), 1);
    task[w] = hb.new_tasks(0).task_id();
  }
  std::vector<int> covered(100, 0);
  std::map<std::string, std::vector<int64_t>> held;  // per worker: received, not completed
  int ended = 0;
  for (int step = 0; step < 200 && ended < 2; ++step) {
    const std::string w = step % 2 ? kW2 : kW1;
    // Complete what it holds every other turn, so splits stay open across
    // restarts too.
    std::vector<int64_t> done;
    if (step % 4 < 2) done.swap(held[w]);
    ASSERT_OK_AND_ASSIGN(auto r, Fetch(w, task[w], held[w], done));
    if (r.has_split()) {
      held[w].push_back(r.split().split_id());
      for (int64_t v = r.split().begin(); v < r.split().end(); ++v) ++covered[v];
    } else if (r.end_of_splits()) {
      ++ended;
    }
    if (step % 3 == 0) Restart();
  }
  EXPECT_EQ(ended, 2);
  for (int v = 0; v < 100; ++v) EXPECT_EQ(covered[v], 1) << "position " << v;
}

// ListFiles runs across restarts and compactions: the journal holds the
// listing once, packed, and splits as positions; every reply still names
// its files, a split handed out again after a lost reply included.
TEST_F(JournalTest, FileRunsAreNamedFromTheJournaledListingAfterRestarts) {
  config_.file_split_files = 2;
  Open();
  const std::string files = dir_ + "_files";
  std::filesystem::create_directories(files);
  for (int i = 0; i < 7; ++i) std::ofstream(files + "/f" + std::to_string(i)) << i;
  auto name = [&](int i) { return files + "/f" + std::to_string(i); };
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(Dataset::ListFiles(files + "/f*").def()));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "", proto::DISTRIBUTED_EPOCH));
  ASSERT_OK(Iteration(job).status());
  ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(kW1));
  const int64_t task = hb.new_tasks(0).task_id();
  ASSERT_OK_AND_ASSIGN(auto lost, Fetch(kW1, task, {}));  // never reaches the worker
  EXPECT_THAT(lost.split().files(), ::testing::ElementsAre(name(0), name(1)));
  Restart();  // replayed
  ASSERT_OK_AND_ASSIGN(auto a, Fetch(kW1, task, {}));
  EXPECT_EQ(a.split().split_id(), lost.split().split_id());
  EXPECT_THAT(a.split().files(), ::testing::ElementsAre(name(0), name(1)));
  Restart();  // compacted
  ASSERT_OK_AND_ASSIGN(auto b, Fetch(kW1, task, {a.split().split_id()}));
  EXPECT_THAT(b.split().files(), ::testing::ElementsAre(name(2), name(3)));
  std::filesystem::remove_all(files);  // the listing is the journal's, not the disk's
  Restart();
  ASSERT_OK_AND_ASSIGN(auto c, Fetch(kW1, task, {b.split().split_id()}, {a.split().split_id()}));
  EXPECT_THAT(c.split().files(), ::testing::ElementsAre(name(4), name(5)));
  ASSERT_OK_AND_ASSIGN(auto d, Fetch(kW1, task, {c.split().split_id()}, {b.split().split_id()}));
  EXPECT_EQ(d.split().file(), name(6));  // one file: `file`, as before runs
  EXPECT_EQ(d.split().files_size(), 0);
  ASSERT_OK_AND_ASSIGN(auto end,
                       Fetch(kW1, task, {}, {c.split().split_id(), d.split().split_id()}));
  EXPECT_TRUE(end.end_of_splits());
}

// A split handed out whose reply never arrived (the dispatcher died before
// sending it) is handed out again once the task's next fetch lacks it.
TEST_F(JournalTest, SplitWhoseReplyWasLostIsHandedOutAgain) {
  config_.range_split_elements = 10;
  Open();
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(Dataset::Range(20).def()));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "", proto::DISTRIBUTED_EPOCH));
  ASSERT_OK(Iteration(job).status());
  ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(kW1));
  const int64_t task = hb.new_tasks(0).task_id();
  ASSERT_OK_AND_ASSIGN(auto lost, Fetch(kW1, task, {}));  // never reaches the worker
  ASSERT_TRUE(lost.has_split());
  Restart();
  ASSERT_OK_AND_ASSIGN(auto again, Fetch(kW1, task, {}));
  ASSERT_TRUE(again.has_split());
  EXPECT_EQ(again.split().split_id(), lost.split().split_id());
  EXPECT_EQ(again.split().begin(), 0);
  ASSERT_OK_AND_ASSIGN(auto next, Fetch(kW1, task, {again.split().split_id()}));
  EXPECT_EQ(next.split().begin(), 10);
  // Completed splits and splits it holds are not handed out again.
  ASSERT_OK_AND_ASSIGN(auto end, Fetch(kW1, task, {next.split().split_id()},
                                       {again.split().split_id()}));
  EXPECT_TRUE(end.not_ready());
  ASSERT_OK_AND_ASSIGN(end, Fetch(kW1, task, {}, {next.split().split_id()}));
  EXPECT_TRUE(end.end_of_splits());
}

TEST_F(JournalTest, StaticShardClaimsAndCoordinatedStartsSurviveARestart) {
  config_.worker_addresses = {kW1, "127.0.0.1:%port%"};
  Open();
  ASSERT_OK(WorkerHb(kW2).status());  // takes entry 1 (the wildcard)
  Restart();
  EXPECT_STATUS(WorkerHb(kW3), absl::StatusCode::kFailedPrecondition, "worker_addresses");
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(Dataset::Range(10).Repeat().def()));
  proto::GetOrCreateJobRequest req;
  req.set_dataset_id(ds);
  req.set_processing_mode(proto::DATA_SHARDING);
  req.set_job_name("sync");
  req.set_num_consumers(1);
  proto::GetOrCreateJobResponse resp;
  ASSERT_OK(d_->GetOrCreateJob(req, &resp));
  proto::GetOrCreateIterationRequest ireq;
  ireq.set_job_id(resp.job_id());
  ireq.set_consumer_index(0);
  proto::GetOrCreateIterationResponse iresp;
  ASSERT_OK(d_->GetOrCreateIteration(ireq, &iresp));
  Restart();
  ASSERT_OK_AND_ASSIGN(auto hb1, WorkerHb(kW1));
  ASSERT_OK_AND_ASSIGN(auto hb2, WorkerHb(kW2));
  ASSERT_EQ(hb1.new_tasks_size(), 1);
  ASSERT_EQ(hb2.new_tasks_size(), 1);
  EXPECT_EQ(hb1.new_tasks(0).worker_index(), 0);
  EXPECT_EQ(hb2.new_tasks(0).worker_index(), 1);
  EXPECT_STATUS(d_->GetOrCreateIteration(ireq, &iresp), absl::StatusCode::kFailedPrecondition,
                "already reading");
}

TEST_F(JournalTest, BadJournalsAreClearErrors) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(10));
  ASSERT_OK(Job(ds, "j").status());
  // One dispatcher per work_dir.
  DispatcherImpl second(config_);
  EXPECT_STATUS(second.OpenJournal(FsyncPolicy::kNone), absl::StatusCode::kFailedPrecondition,
                "lock");
  d_.reset();
  // A torn tail (a crash mid-append) is cut off; the rest replays.
  const std::string path = dir_ + "/journal";
  const auto good_size = std::filesystem::file_size(path);
  { std::ofstream(path, std::ios::app | std::ios::binary) << std::string("\x40\x00\x00", 3); }
  Open();
  EXPECT_EQ(std::filesystem::file_size(path), good_size);
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "j"));
  EXPECT_GT(job, 0);
  d_.reset();
  // A whole, checksummed record that does not fit the state: DataLoss
  // naming it, and nothing is served.
  {
    ASSERT_OK_AND_ASSIGN(auto w, JournalWriter::Open(dir_, FsyncPolicy::kNone));
    proto::JournalRecord rec;
    rec.add_updates()->mutable_finish_task()->set_task_id(12345);
    ASSERT_OK(w->Append(rec.SerializeAsString()));
    ASSERT_OK(w->Append("not a record"));
  }
  Reset(config_);
  EXPECT_STATUS(d_->OpenJournal(FsyncPolicy::kNone), absl::StatusCode::kDataLoss,
                "task 12345 does not exist");
  DispatcherConfig no_dir = TestConfig();
  no_dir.fault_tolerant_mode = true;
  DispatcherImpl third(no_dir);
  EXPECT_STATUS(third.OpenJournal(), absl::StatusCode::kInvalidArgument, "work_dir");
}

// A long-running service: the journal is compacted to a snapshot as it
// grows, so its size stays bounded by the state, not by the history.
TEST_F(JournalTest, TheJournalIsCompactedAsItGrows) {
  config_.range_split_elements = 1;
  Open();
  d_->SetCompactionMinRecords(200);
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, Register(Dataset::Range(50).Repeat().def()));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "forever", proto::DISTRIBUTED_EPOCH));
  ASSERT_OK(Iteration(job).status());
  ASSERT_OK_AND_ASSIGN(auto hb, WorkerHb(kW1));
  const int64_t task = hb.new_tasks(0).task_id();
  const std::string path = dir_ + "/journal";
  uintmax_t largest = 0;
  int64_t epoch = 0, splits = 0;
  std::vector<int64_t> held;
  // At least 3,000 splits, and on until two compactions (written in the
  // background, so a loaded machine may need more appends) have ended.
  auto compactions = [&] {
    d_->AwaitJournalIdle();
    return d_->GetStats().journal_compactions;
  };
  while (splits < 3000 || (splits < 100000 && (splits % 500 != 0 || compactions() < 2))) {
    ASSERT_OK_AND_ASSIGN(auto r, Fetch(kW1, task, held, held, epoch));
    held.clear();
    if (r.has_split()) {
      held.push_back(r.split().split_id());
      ++splits;
    } else {
      ASSERT_TRUE(r.end_of_splits());
      ++epoch;
    }
    largest = std::max(largest, std::filesystem::file_size(path));
  }
  EXPECT_GE(d_->GetStats().journal_compactions, 2);
  // ~6000 records of history (about 600 KB); a snapshot is a handful. A
  // compaction is written in the background while appends go on, so the
  // journal may hold a few hundred records more than the threshold.
  EXPECT_LT(largest, 150000u) << "the journal was not kept small";
  const int64_t last_split = held.back();
  Restart();
  // The restarted dispatcher goes on from where it was, ids never reused.
  ASSERT_OK_AND_ASSIGN(auto r, Fetch(kW1, task, {}, held, epoch));
  ASSERT_TRUE(r.has_split() || r.end_of_splits());
  if (r.has_split()) {
    EXPECT_GT(r.split().split_id(), last_split);
  }
}

// Parked long polls (the gRPC callback server's path): no thread waits;
// a change answers the poll, so does its deadline, a cancellation (with
// Cancelled) or Shutdown, and each exactly once.
class ParkedPollTest : public DispatcherImplTest {
 protected:
  struct Answer {
    absl::Notification done;
    absl::Status status;
    int calls = 0;
  };
  internal::DispatcherImpl::PollDone Into(Answer* a) {
    return [a](absl::Status s) {
      a->status = std::move(s);
      if (++a->calls == 1) a->done.Notify();
    };
  }
};

TEST_F(ParkedPollTest, AChangeAnswersAParkedClientHeartbeatAndTheDeadlineAnotherOne) {
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(10));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  ASSERT_OK_AND_ASSIGN(auto first, ClientHb(it.iteration_client_id()));
  EXPECT_FALSE(first.tasks_delta());
  proto::ClientHeartbeatRequest req;
  req.set_iteration_client_id(it.iteration_client_id());
  req.set_known_version(first.version());
  req.set_wait_ms(10000);
  proto::ClientHeartbeatResponse resp;
  Answer a;
  d_->StartClientHeartbeat(d_->NewPollId(), req, &resp, Into(&a));
  EXPECT_FALSE(a.done.HasBeenNotified()) << "nothing changed: the poll must wait";
  ASSERT_OK(WorkerHb(kW1).status());  // a worker joins: the iteration gets a task
  ASSERT_TRUE(a.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_OK(a.status);
  EXPECT_GT(resp.version(), first.version());
  EXPECT_TRUE(resp.tasks_delta());
  EXPECT_EQ(resp.tasks_size(), 1);
  // Nothing changes now: the deadline answers, and the task list is not
  // sent again.
  req.set_known_version(resp.version());
  req.set_wait_ms(200);
  proto::ClientHeartbeatResponse again;
  Answer b;
  const absl::Time start = absl::Now();
  d_->StartClientHeartbeat(d_->NewPollId(), req, &again, Into(&b));
  ASSERT_TRUE(b.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  ASSERT_OK(b.status);
  EXPECT_TRUE(again.tasks_delta());
  EXPECT_EQ(again.tasks_size(), 0);
  EXPECT_EQ(again.version(), resp.version());
  EXPECT_EQ(a.calls, 1);
  EXPECT_EQ(b.calls, 1);
}

// A client that knows a version gets only what changed since: new tasks,
// lost ones; one that knows none (or another dispatcher's) gets them all.
TEST_F(ParkedPollTest, ClientHeartbeatsCarryOnlyTheTasksChangedSinceTheKnownVersion) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(10));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK_AND_ASSIGN(auto it, Iteration(job));
  auto hb = [&](int64_t known) {
    proto::ClientHeartbeatRequest req;
    req.set_iteration_client_id(it.iteration_client_id());
    req.set_known_version(known);
    proto::ClientHeartbeatResponse resp;
    EXPECT_OK(d_->ClientHeartbeat(req, &resp));
    return resp;
  };
  auto ids = [](const proto::ClientHeartbeatResponse& r) {
    std::set<std::string> out;
    for (const auto& t : r.tasks()) out.insert(absl::StrCat(t.worker_address(), t.lost() ? " lost" : ""));
    return out;
  };
  const proto::ClientHeartbeatResponse first = hb(-1);
  EXPECT_FALSE(first.tasks_delta());
  EXPECT_THAT(ids(first), UnorderedElementsAre(kW1));
  ASSERT_OK(WorkerHb(kW2).status());
  const proto::ClientHeartbeatResponse second = hb(first.version());
  EXPECT_TRUE(second.tasks_delta());
  EXPECT_THAT(ids(second), UnorderedElementsAre(kW2)) << "only the new worker's task";
  EXPECT_TRUE(hb(second.version()).tasks().empty()) << "nothing changed";
  // kW1 restarts without its task: it is lost.
  ASSERT_OK_AND_ASSIGN(auto w1, WorkerHb(kW1));
  (void)w1;
  ASSERT_OK(WorkerHb(kW1, {}).status());
  const proto::ClientHeartbeatResponse third = hb(second.version());
  EXPECT_TRUE(third.tasks_delta());
  EXPECT_TRUE(ids(third).count(absl::StrCat(kW1, " lost")) == 1) << third.DebugString();
  EXPECT_EQ(ids(third).count(kW2), 0u);
  // A version from the future (another dispatcher's): everything again.
  const proto::ClientHeartbeatResponse full = hb(third.version() + 1000);
  EXPECT_FALSE(full.tasks_delta());
  EXPECT_GE(full.tasks_size(), 2);
}

TEST_F(ParkedPollTest, NewTasksAnswerAParkedWorkerHeartbeat) {
  ASSERT_OK(WorkerHb(kW1).status());
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address(kW1);
  req.set_wait_ms(10000);
  proto::WorkerHeartbeatResponse resp;
  Answer a;
  d_->StartWorkerHeartbeat(d_->NewPollId(), req, &resp, Into(&a));
  EXPECT_FALSE(a.done.HasBeenNotified());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(10));
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds));
  ASSERT_OK(Iteration(job).status());
  ASSERT_TRUE(a.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_OK(a.status);
  EXPECT_EQ(resp.new_tasks_size(), 1);
}

TEST_F(ParkedPollTest, ACompletedSplitAnswersAParkedGetSplit) {
  DispatcherConfig config = TestConfig();
  config.range_split_elements = 5;
  Reset(config);
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  ASSERT_OK_AND_ASSIGN(std::string ds, RegisterRange(5));  // one split
  ASSERT_OK_AND_ASSIGN(int64_t job, Job(ds, "one-split", proto::DISTRIBUTED_EPOCH));
  ASSERT_OK(Iteration(job).status());
  ASSERT_OK_AND_ASSIGN(auto hb1, WorkerHb(kW1));
  ASSERT_OK_AND_ASSIGN(auto hb2, WorkerHb(kW2));
  const int64_t t1 = hb1.new_tasks(0).task_id(), t2 = hb2.new_tasks(0).task_id();
  proto::GetSplitRequest get;
  get.set_worker_address(kW1);
  get.set_task_id(t1);
  proto::GetSplitResponse got;
  ASSERT_OK(d_->GetSplit(get, &got));
  ASSERT_TRUE(got.has_split());
  // The other task waits: the only split is held.
  proto::GetSplitRequest wait;
  wait.set_worker_address(kW2);
  wait.set_task_id(t2);
  wait.set_wait_ms(10000);
  proto::GetSplitResponse waited;
  Answer a;
  d_->StartGetSplit(d_->NewPollId(), wait, &waited, Into(&a));
  EXPECT_FALSE(a.done.HasBeenNotified());
  proto::GetSplitRequest report;
  report.set_worker_address(kW1);
  report.set_task_id(t1);
  report.set_report_only(true);
  report.add_completed_splits(got.split().split_id());
  proto::GetSplitResponse reported;
  ASSERT_OK(d_->GetSplit(report, &reported));
  ASSERT_TRUE(a.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_OK(a.status);
  EXPECT_TRUE(waited.end_of_splits()) << waited.DebugString();
}

TEST_F(ParkedPollTest, CancelAndShutdownAnswerParkedPollsOnce) {
  ASSERT_OK(WorkerHb(kW1).status());
  ASSERT_OK(WorkerHb(kW2).status());
  proto::WorkerHeartbeatRequest r1, r2;
  r1.set_worker_address(kW1);
  r1.set_wait_ms(10000);
  r2.set_worker_address(kW2);
  r2.set_wait_ms(10000);
  proto::WorkerHeartbeatResponse p1, p2;
  Answer a, b;
  const int64_t id = d_->NewPollId();
  d_->StartWorkerHeartbeat(id, r1, &p1, Into(&a));
  d_->StartWorkerHeartbeat(d_->NewPollId(), r2, &p2, Into(&b));
  d_->CancelPoll(id);
  ASSERT_TRUE(a.done.HasBeenNotified());
  EXPECT_TRUE(absl::IsCancelled(a.status)) << a.status;
  d_->CancelPoll(id);  // again: nothing
  EXPECT_FALSE(b.done.HasBeenNotified());
  d_->Shutdown();
  ASSERT_TRUE(b.done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_OK(b.status);
  d_.reset();
  EXPECT_EQ(a.calls, 1);
  EXPECT_EQ(b.calls, 1);
}

// Group commit: a reply means durable. A child process runs a dispatcher
// under 8 concurrent callers and dies (_exit, as a kill: nothing flushed,
// no destructor) in its n-th journal write, before the write or between
// the write and its fsync; compactions run meanwhile. Every RegisterDataset
// the child saw answered must be in the journal its successor replays.
TEST_F(JournalTest, EveryAnsweredChangeSurvivesACrashAtAnyPointOfAGroupCommit) {
  d_.reset();  // releases the journal
  const std::string acks_path = dir_ + "-acks";
  int64_t total_acks = 0;
  for (auto stage : {JournalWriter::Stage::kBeforeWrite, JournalWriter::Stage::kBeforeSync}) {
    for (int crash_at : {1, 2, 3, 5, 8, 13, 21, 34, 55, 89}) {
      SCOPED_TRACE(absl::StrCat("crash in write ", crash_at, " at stage ",
                                static_cast<int>(stage)));
      std::filesystem::remove_all(dir_);
      std::filesystem::remove(acks_path);
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        // The child: no gtest assertions, only exit codes.
        DispatcherImpl d(config_);
        if (!d.OpenJournal(FsyncPolicy::kEveryRecord).ok()) _exit(2);
        d.SetCompactionMinRecords(50);
        std::atomic<int> writes{0};
        d.SetJournalFaultHookForTesting([&](JournalWriter::Stage s) {
          if (s == JournalWriter::Stage::kBeforeWrite) writes++;
          // The crash: SIGKILL, which nothing in the process (a sanitizer's
          // exit checks included) sees coming.
          if (s == stage && writes.load() == crash_at) kill(getpid(), SIGKILL);
        });
        const int acks = open(acks_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (acks < 0) _exit(2);
        std::vector<std::thread> callers;
        for (int t = 0; t < 8; ++t) {
          callers.emplace_back([&d, acks, t] {
            for (int k = 0; k < 100000; ++k) {
              proto::RegisterDatasetRequest req;
              *req.mutable_dataset() = Dataset::Range(t * 1000000 + k).def();
              req.set_dataset_id(absl::StrCat("d-", t, "-", k));
              proto::RegisterDatasetResponse resp;
              if (!d.RegisterDataset(req, &resp).ok()) continue;
              const std::string line = resp.dataset_id() + "\n";
              if (write(acks, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
                _exit(2);
              }
            }
          });
        }
        for (auto& c : callers) c.join();
        _exit(3);  // never crashed
      }
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
          << "exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
          << " (2: the child failed, 3: it never reached the crash)";
      std::vector<std::string> acked;
      std::ifstream in(acks_path);
      for (std::string line; std::getline(in, line);) acked.push_back(line);
      total_acks += static_cast<int64_t>(acked.size());
      Open();
      for (const std::string& id : acked) {
        proto::GetDatasetDefRequest req;
        req.set_dataset_id(id);
        proto::GetDatasetDefResponse resp;
        absl::Status found = d_->GetDatasetDef(req, &resp);
        EXPECT_TRUE(found.ok()) << id << " was answered, then lost: " << found;
      }
      d_.reset();
    }
  }
  std::filesystem::remove(acks_path);
  // Most crash points come after many answered calls.
  EXPECT_GT(total_acks, 100);
}

}  // namespace
}  // namespace sluice::internal
