// Unit tests of sluice::internal::TaskPolicy and Liveness: the decisions
// DispatcherImpl takes from the state (which tasks to create, which workers
// and clients expired, which iterations to collect), on states built by
// applying updates.
#include "sluice/control/task_policy.h"

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "sluice/control/liveness.h"
#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace sluice::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class TaskPolicyTest : public ::testing::Test {
 protected:
  void Apply(const std::string& text) {
    proto::JournalUpdate u;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &u)) << text;
    DispatcherState::Changes c;
    ASSERT_OK(state_.Apply(u, &c));
    liveness_.Follow(u, c, now_);
  }
  // A dataset, job 2 (`mode`, `target`), iteration 3, workers a (host h1)
  // and b (host h2).
  void Basic(const std::string& mode = "PARALLEL_EPOCHS",
             const std::string& target = "TARGET_WORKERS_AUTO", const std::string& name = "") {
    Apply("register_dataset { dataset_id: 'ds' dataset { version: 1 } }");
    Apply("create_job { job_id: 2 dataset_id: 'ds' processing_mode: " + mode +
          " target_workers: " + target + " job_name: '" + name + "' }");
    Apply("create_iteration { iteration_id: 3 job_id: 2 }");
    Apply("register_worker { address: 'a:1' index: 0 host_id: 'h1' }");
    Apply("register_worker { address: 'b:1' index: 1 host_id: 'h2' }");
  }
  // The (iteration, worker, pending) of the CreateTask updates in `rec`.
  static std::vector<std::string> Created(const proto::JournalRecord& rec) {
    std::vector<std::string> out;
    for (const auto& u : rec.updates()) {
      if (!u.has_create_task()) continue;
      out.push_back(std::to_string(u.create_task().iteration_id()) + "@" +
                    u.create_task().worker_address() + (u.create_task().pending() ? "+p" : ""));
    }
    return out;
  }

  DispatcherState state_{{}};
  int64_t next_id_ = 100;
  TaskPolicy policy_{state_, [this] { return next_id_++; }};
  absl::Time now_ = absl::FromUnixSeconds(1000);
  Liveness liveness_;
};

TEST_F(TaskPolicyTest, ANewIterationGetsATaskOnEveryWorkerOrOnTheConsumersHost) {
  Basic();
  proto::JournalRecord rec;
  policy_.ForNewIteration(3, /*local=*/false, "", &rec);
  EXPECT_THAT(Created(rec), ElementsAre("3@a:1", "3@b:1"));
  EXPECT_EQ(rec.updates(1).create_task().task_id(), 101);
  rec.Clear();
  policy_.ForNewIteration(3, /*local=*/true, "h2", &rec);
  EXPECT_THAT(Created(rec), ElementsAre("3@b:1"));
}

TEST_F(TaskPolicyTest, ALocalIterationReadsTheHostsOfItsClients) {
  Basic("PARALLEL_EPOCHS", "TARGET_WORKERS_LOCAL");
  Apply("create_client { client_id: 4 iteration_id: 3 consumer_index: -1 host_id: 'h1' }");
  const auto& it = state_.iterations().at(3);
  EXPECT_TRUE(policy_.ReadsHost(it, "h1"));
  EXPECT_FALSE(policy_.ReadsHost(it, "h2"));
  proto::JournalRecord rec;
  policy_.ForNewHost(it, "h1", &rec);  // read already
  EXPECT_THAT(Created(rec), IsEmpty());
  policy_.ForNewHost(it, "h2", &rec);
  EXPECT_THAT(Created(rec), ElementsAre("3@b:1"));
}

TEST_F(TaskPolicyTest, ALateWorkerJoinsUnfinishedIterationsPendingUnderCoordinatedReads) {
  Basic();
  Apply("register_worker { address: 'c:1' index: 2 }");
  proto::JournalRecord rec;
  policy_.ForNewWorker("c:1", "", 2, [](int64_t) { return true; }, &rec);
  EXPECT_THAT(Created(rec), ElementsAre("3@c:1"));  // not coordinated: not pending
  Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'a:1' }");
  Apply("finish_task { task_id: 5 }");
  EXPECT_FALSE(policy_.AcceptsTasks(state_.iterations().at(3)));  // finished, nobody reads it
  Apply("create_client { client_id: 6 iteration_id: 3 consumer_index: -1 }");
  EXPECT_TRUE(policy_.AcceptsTasks(state_.iterations().at(3)));  // until its client read it all
  Apply("client_at_end { client_id: 6 }");
  EXPECT_FALSE(policy_.AcceptsTasks(state_.iterations().at(3)));
}

TEST_F(TaskPolicyTest, UnderStaticShardingAShardIsReadOnceAtATime) {
  state_ = DispatcherState({"a:1", "b:1"});
  Basic("FILE_SHARDING");
  Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'a:1' }");
  const auto& it = state_.iterations().at(3);
  EXPECT_FALSE(policy_.NeedsTask(it, 0));
  EXPECT_TRUE(policy_.NeedsTask(it, 1));
  Apply("finish_task { task_id: 5 lost: true }");
  EXPECT_TRUE(policy_.NeedsTask(it, 0));  // a lost shard is read again
}

// A heartbeat lists its tasks in any order, even twice.
TEST_F(TaskPolicyTest, AHeartbeatsTaskListsNeedNotBeSorted) {
  Basic();
  for (int id : {5, 6, 7, 8}) {
    Apply(absl::StrCat("create_task { task_id: ", id, " iteration_id: 3 worker_address: 'a:1' }"));
  }
  Apply("tasks_delivered { worker_address: 'a:1' task_ids: 5 task_ids: 6 task_ids: 7 "
        "task_ids: 8 }");
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address("a:1");
  for (int id : {8, 2, 6, 99, 6, 7}) req.add_current_tasks(id);
  req.add_finished_tasks(7);
  const auto& w = state_.workers().at("a:1");
  proto::JournalRecord rec;
  EXPECT_THAT(policy_.Reconcile(w, req, &rec), ElementsAre(3));
  ASSERT_EQ(rec.updates_size(), 2);
  EXPECT_EQ(rec.updates(0).finish_task().task_id(), 5);  // not held: lost
  EXPECT_TRUE(rec.updates(0).finish_task().lost());
  EXPECT_EQ(rec.updates(1).finish_task().task_id(), 7);  // held and read: done
  EXPECT_FALSE(rec.updates(1).finish_task().lost());
  EXPECT_THAT(TaskPolicy::Unknown(w, req), ElementsAre(2, 99));
}

TEST_F(TaskPolicyTest, AHeartbeatEndsReadTasksAndLosesTheDeliveredOnesTheWorkerNoLongerHolds) {
  Basic();
  Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'a:1' }");
  Apply("create_task { task_id: 6 iteration_id: 3 worker_address: 'a:1' }");
  Apply("create_task { task_id: 7 iteration_id: 3 worker_address: 'a:1' }");
  Apply("tasks_delivered { worker_address: 'a:1' task_ids: 5 task_ids: 6 }");
  proto::WorkerHeartbeatRequest req;
  req.set_worker_address("a:1");
  req.add_finished_tasks(5);
  req.add_current_tasks(99);  // not its own: deleted on it
  const auto& w = state_.workers().at("a:1");
  proto::JournalRecord rec;
  // 5 was read; 6 was delivered and is gone (the worker restarted); 7 was
  // never delivered: it is sent again, not lost.
  EXPECT_THAT(policy_.Reconcile(w, req, &rec), ElementsAre(3));
  ASSERT_EQ(rec.updates_size(), 2);
  EXPECT_EQ(rec.updates(0).finish_task().task_id(), 5);
  EXPECT_FALSE(rec.updates(0).finish_task().lost());
  EXPECT_EQ(rec.updates(1).finish_task().task_id(), 6);
  EXPECT_TRUE(rec.updates(1).finish_task().lost());
  EXPECT_THAT(TaskPolicy::Unknown(w, req), ElementsAre(99));
  for (const auto& u : rec.updates()) {
    DispatcherState::Changes c;
    ASSERT_OK(state_.Apply(u, &c));
  }
  rec.Clear();
  policy_.Again(w, {3}, &rec);
  EXPECT_THAT(Created(rec), ElementsAre("3@a:1"));
}

TEST_F(TaskPolicyTest, AWorkerUpdateEndsTasksAndTheFirstErrorFailsTheIteration) {
  Basic();
  Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'a:1' }");
  Apply("create_task { task_id: 6 iteration_id: 3 worker_address: 'a:1' }");
  proto::WorkerUpdateRequest req;
  req.set_worker_address("a:1");
  auto* done = req.add_updates();
  done->set_task_id(5);
  done->set_completed(true);
  for (int i = 0; i < 2; ++i) {
    auto* failed = req.add_updates();
    failed->set_task_id(6);
    failed->mutable_error()->set_code(13);
  }
  proto::JournalRecord rec;
  policy_.Report(req, &rec);
  ASSERT_EQ(rec.updates_size(), 4);
  EXPECT_EQ(rec.updates(0).finish_task().task_id(), 5);
  EXPECT_EQ(rec.updates(1).iteration_error().iteration_id(), 3);
  EXPECT_EQ(rec.updates(2).finish_task().task_id(), 6);
  EXPECT_EQ(rec.updates(3).finish_task().task_id(), 6);
}

TEST_F(TaskPolicyTest, ClientsListJoinedTasksOnTheirHost) {
  Basic("PARALLEL_EPOCHS", "TARGET_WORKERS_LOCAL");
  Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'a:1' }");
  Apply("create_task { task_id: 6 iteration_id: 3 worker_address: 'b:1' }");
  Apply("create_task { task_id: 7 iteration_id: 3 worker_address: 'a:1' pending: true }");
  proto::ClientHeartbeatResponse resp;
  const std::vector<int64_t> ids = {5, 6, 7, 8};
  policy_.ListTasks(state_.iterations().at(3), &ids, "h1", &resp);
  ASSERT_EQ(resp.tasks_size(), 1);
  EXPECT_EQ(resp.tasks(0).task_id(), 5);
  EXPECT_EQ(resp.tasks(0).worker_address(), "a:1");
  proto::ClientHeartbeatResponse all;  // no list: every task of the iteration
  policy_.ListTasks(state_.iterations().at(3), nullptr, "h2", &all);
  ASSERT_EQ(all.tasks_size(), 1);
  EXPECT_EQ(all.tasks(0).task_id(), 6);
}

TEST_F(TaskPolicyTest, LivenessExpiresSilentWorkersAndClientsAndCollectsIdleIterations) {
  Basic("PARALLEL_EPOCHS", "TARGET_WORKERS_AUTO", "named");
  Apply("create_client { client_id: 4 iteration_id: 3 consumer_index: -1 }");
  now_ += absl::Seconds(5);
  liveness_.HeardWorker("b:1", now_);
  proto::JournalRecord rec;
  std::vector<std::string> lost;
  liveness_.Expire(state_, now_, 4000, 10000, &rec, &lost);
  ASSERT_EQ(rec.updates_size(), 1);
  EXPECT_EQ(rec.updates(0).remove_worker().address(), "a:1");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0], ::testing::HasSubstr("no heartbeat for 5000 ms"));
  EXPECT_EQ(absl::ToInt64Milliseconds(liveness_.MaxWorkerSilence(now_)), 5000);
  Apply("remove_client { client_id: 4 }");  // idle from now on
  rec.Clear();
  liveness_.Collect(state_, now_ + absl::Seconds(59), 60000, &rec);
  EXPECT_EQ(rec.updates_size(), 0);  // a named, unfinished iteration waits for the gc timeout
  liveness_.Collect(state_, now_ + absl::Seconds(61), 60000, &rec);
  ASSERT_EQ(rec.updates_size(), 1);
  EXPECT_EQ(rec.updates(0).collect_iteration().iteration_id(), 3);
}

}  // namespace
}  // namespace sluice::internal
