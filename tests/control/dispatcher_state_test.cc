// Unit tests of sluice::internal::DispatcherState: updates applied in
// order build the state (and report their Changes); a snapshot applied to a
// fresh state rebuilds an equal one.
#include "sluice/control/dispatcher_state.h"

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/test_util.h"

namespace sluice::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

proto::JournalUpdate U(const std::string& text) {
  proto::JournalUpdate u;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &u)) << text;
  return u;
}

// The derived indexes the snapshot does not spell out, as text.
std::string Indexes(const DispatcherState& s) {
  std::string out;
  for (const auto& [id, j] : s.jobs()) {
    absl::StrAppend(&out, "job ", id, " reps=");
    for (const auto& [rep, it] : j.iteration_by_repetition) absl::StrAppend(&out, rep, ":", it, ",");
    absl::StrAppend(&out, "\n");
  }
  for (const auto& [name, id] : s.job_by_name()) absl::StrAppend(&out, "name ", name, "=", id, "\n");
  for (const auto& [id, it] : s.iterations()) {
    absl::StrAppend(&out, "iteration ", id, " tasks=", absl::StrJoin(it.tasks, ","),
                    " clients=", absl::StrJoin(it.clients, ","),
                    " pending=", absl::StrJoin(it.pending_tasks, ","), " consumers=");
    for (const auto& [c, client] : it.consumer_clients) absl::StrAppend(&out, c, ":", client, ",");
    if (it.splits != nullptr) {
      for (int64_t t : it.tasks) {
        absl::StrAppend(&out, " held(", t, ")=", absl::StrJoin(it.splits->Held(t), ","));
      }
    }
    absl::StrAppend(&out, "\n");
  }
  for (const auto& [addr, w] : s.workers()) {
    absl::StrAppend(&out, "worker ", addr, " tasks=", absl::StrJoin(w.tasks, ","), " undelivered=");
    for (int64_t id : w.undelivered) {
      proto::TaskDef d;
      absl::Status st = s.TaskDefOf(id, &d);
      absl::StrAppend(&out, id, "/", d.worker_index(), "/", d.num_shards(), "/", st.ToString(), ",");
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "claims=", absl::StrJoin(s.shard_claims().holders(), ","), "\n");
  return out;
}

class DispatcherStateTest : public ::testing::Test {
 protected:
  // Applies `text` (a JournalUpdate) to state_; the changes it made go to changes_.
  absl::Status Apply(const std::string& text) {
    changes_ = {};
    return state_.Apply(U(text), &changes_);
  }
  // Every update of state_'s snapshot applied to a fresh state.
  DispatcherState Restored(const std::vector<std::string>& worker_addresses = {}) {
    DispatcherState fresh(worker_addresses);
    for (const proto::JournalRecord& rec : state_.Snapshot()) {
      for (const proto::JournalUpdate& u : rec.updates()) {
        DispatcherState::Changes c;
        const absl::Status applied = fresh.Apply(u, &c);
        EXPECT_TRUE(applied.ok()) << applied << ": " << u.ShortDebugString();
      }
    }
    return fresh;
  }
  void ExpectRestoresEqual(const std::vector<std::string>& worker_addresses = {}) {
    DispatcherState fresh = Restored(worker_addresses);
    EXPECT_EQ(fresh.DebugString(), state_.DebugString());
    EXPECT_EQ(Indexes(fresh), Indexes(state_));
    EXPECT_EQ(fresh.next_id(), state_.next_id());
  }
  // A dataset, a parallel_epochs job 2 over it, iteration 3, workers a and b.
  void Basic(const std::string& mode = "PARALLEL_EPOCHS") {
    ASSERT_OK(Apply("register_dataset { dataset_id: 'ds' dataset { version: 1 } fingerprint: 7 }"));
    ASSERT_OK(Apply("create_job { job_id: 2 dataset_id: 'ds' job_name: 'train' processing_mode: " +
                    mode + " }"));
    ASSERT_OK(Apply("create_iteration { iteration_id: 3 job_id: 2 }"));
    ASSERT_OK(Apply("register_worker { address: 'a:1' index: 0 host_id: 'h1' }"));
    ASSERT_OK(Apply("register_worker { address: 'b:1' index: 1 host_id: 'h2' }"));
  }

  DispatcherState state_;
  DispatcherState::Changes changes_;
};

TEST_F(DispatcherStateTest, UpdatesBuildDatasetsJobsIterationsAndWorkers) {
  Basic();
  EXPECT_EQ(state_.datasets().at("ds").fingerprint, 7u);
  EXPECT_EQ(state_.jobs().at(2).name, "train");
  EXPECT_EQ(state_.job_by_name().at("train"), 2);
  EXPECT_EQ(state_.jobs().at(2).iteration_by_repetition.at(0), 3);
  EXPECT_EQ(state_.workers().at("b:1").host_id, "h2");
  EXPECT_EQ(state_.next_id(), 4);
  EXPECT_EQ(state_.next_worker_index(), 2);
  EXPECT_EQ(state_.counts().jobs, 1);
  EXPECT_EQ(state_.counts().iterations, 1);
  // Registered again (a restart): new addresses, same index.
  ASSERT_OK(Apply("register_worker { address: 'b:1' transfer_address: 'b:9' index: 5 }"));
  EXPECT_EQ(state_.workers().at("b:1").transfer_address, "b:9");
  EXPECT_EQ(state_.workers().at("b:1").index, 1);
}

TEST_F(DispatcherStateTest, ATaskIsQueuedForItsWorkerUntilDelivered) {
  Basic();
  ASSERT_OK(Apply("create_task { task_id: 4 iteration_id: 3 worker_address: 'a:1' }"));
  EXPECT_THAT(changes_.workers, ElementsAre("a:1"));
  ASSERT_EQ(changes_.visible.size(), 1u);
  EXPECT_EQ(changes_.visible[0].iteration, 3);
  EXPECT_THAT(changes_.visible[0].tasks, ElementsAre(4));
  const auto& w = state_.workers().at("a:1");
  EXPECT_THAT(w.undelivered, ElementsAre(4));
  proto::TaskDef def;
  ASSERT_OK(state_.TaskDefOf(4, &def));
  EXPECT_EQ(def.task_id(), 4);
  EXPECT_EQ(def.dataset_id(), "ds");
  EXPECT_EQ(def.iteration_id(), 3);
  EXPECT_EQ(def.dataset().SerializeAsString(), state_.datasets().at("ds").def.SerializeAsString());
  EXPECT_EQ(def.worker_index(), w.index);
  EXPECT_EQ(state_.TaskDefOf(99, &def).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.tasks, ElementsAre(4));
  EXPECT_THAT(state_.iterations().at(3).tasks, ElementsAre(4));
  ASSERT_OK(Apply("tasks_delivered { worker_address: 'a:1' task_ids: 4 }"));
  EXPECT_TRUE(state_.workers().at("a:1").undelivered.empty());
  EXPECT_TRUE(state_.tasks().at(4).delivered);
}

TEST_F(DispatcherStateTest, AnIterationFinishesWhenNoTaskRunsAndOneCompleted) {
  Basic();
  ASSERT_OK(Apply("create_task { task_id: 4 iteration_id: 3 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'b:1' }"));
  ASSERT_OK(Apply("finish_task { task_id: 4 lost: true }"));
  EXPECT_FALSE(state_.iterations().at(3).finished);
  ASSERT_OK(Apply("finish_task { task_id: 5 }"));
  EXPECT_TRUE(state_.iterations().at(3).finished);
  // The task's change, then the iteration's end: two visible changes.
  ASSERT_EQ(changes_.visible.size(), 2u);
  EXPECT_THAT(changes_.visible[0].tasks, ElementsAre(5));
  EXPECT_THAT(changes_.visible[1].tasks, IsEmpty());
  // Finishing twice changes nothing.
  ASSERT_OK(Apply("finish_task { task_id: 5 lost: true }"));
  EXPECT_FALSE(state_.tasks().at(5).lost);
  EXPECT_THAT(changes_.visible, IsEmpty());
}

TEST_F(DispatcherStateTest, ClientsComeAndGo) {
  Basic();
  ASSERT_OK(Apply("create_client { client_id: 6 iteration_id: 3 consumer_index: 1 host_id: 'h1' }"));
  EXPECT_THAT(state_.iterations().at(3).clients, ElementsAre(6));
  EXPECT_EQ(state_.iterations().at(3).consumer_clients.at(1), 6);
  ASSERT_OK(Apply("client_at_end { client_id: 6 }"));
  EXPECT_TRUE(state_.clients().at(6).at_end);
  ASSERT_OK(Apply("remove_client { client_id: 6 }"));
  EXPECT_THAT(changes_.idle, ElementsAre(3));
  ASSERT_EQ(changes_.left_consumers.size(), 1u);
  EXPECT_EQ(changes_.left_consumers[0], std::make_pair(int64_t{3}, int64_t{1}));
  EXPECT_THAT(state_.clients(), IsEmpty());
  EXPECT_THAT(state_.iterations().at(3).consumer_clients, IsEmpty());
  ASSERT_OK(Apply("remove_client { client_id: 6 }"));  // gone already: nothing
}

TEST_F(DispatcherStateTest, CollectingDeletesTasksOnWorkersAndDroppingForgetsTheJob) {
  Basic();
  ASSERT_OK(Apply("create_task { task_id: 4 iteration_id: 3 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("collect_iteration { iteration_id: 3 }"));
  ASSERT_EQ(changes_.collected_tasks.size(), 1u);
  EXPECT_EQ(changes_.collected_tasks[0], std::make_pair(std::string("a:1"), int64_t{4}));
  EXPECT_THAT(state_.tasks(), IsEmpty());
  EXPECT_THAT(state_.workers().at("a:1").tasks, IsEmpty());
  // Never delivered now (and a snapshot of this state has no such task).
  EXPECT_THAT(state_.workers().at("a:1").undelivered, IsEmpty());
  EXPECT_TRUE(state_.iterations().at(3).collected);
  EXPECT_EQ(state_.counts().collected_iterations, 1);
  ASSERT_OK(Apply("drop_job { job_id: 2 }"));
  EXPECT_THAT(changes_.dropped, ElementsAre(3));
  EXPECT_THAT(state_.jobs(), IsEmpty());
  EXPECT_THAT(state_.job_by_name(), IsEmpty());
  EXPECT_THAT(state_.iterations(), IsEmpty());
}

TEST_F(DispatcherStateTest, ARemovedWorkerLosesItsTasksAndTheirSplits) {
  Basic("DISTRIBUTED_EPOCH");
  ASSERT_OK(Apply("create_iteration { iteration_id: 10 job_id: 2 repetition: 1 has_splits: true "
                  "positions: 10 split_elements: 4 }"));
  ASSERT_OK(Apply("create_task { task_id: 11 iteration_id: 10 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("assign_split { task_id: 11 split { split_id: 12 begin: 0 end: 4 } "
                  "created: true next_position: 4 }"));
  EXPECT_EQ(state_.counts().splits_created, 1);
  EXPECT_EQ(state_.next_id(), 13);
  ASSERT_OK(Apply("remove_worker { address: 'a:1' }"));
  EXPECT_TRUE(state_.tasks().at(11).lost);
  EXPECT_FALSE(state_.workers().count("a:1"));
  EXPECT_EQ(state_.counts().lost_workers, 1);
  EXPECT_EQ(state_.counts().splits_reassigned, 1);
  ASSERT_EQ(changes_.requeued.size(), 1u);
  EXPECT_EQ(changes_.requeued[0].task, 11);
  EXPECT_EQ(changes_.requeued[0].splits, 1);
  EXPECT_THAT(changes_.splits, ElementsAre(10));
  EXPECT_THAT(changes_.workers, ElementsAre("a:1"));
  const SplitProvider& p = *state_.iterations().at(10).splits;
  EXPECT_THAT(p.epochs().at(0).queue, ElementsAre(12));
  EXPECT_EQ(p.open().at(12).holder_task, 0);
}

// A split-tracked job's lost task: its splits wait for the reports of the
// iteration's clients (a client that goes away counts as having said), the
// reports merge into what the next worker skips, and the snapshot keeps it.
TEST_F(DispatcherStateTest, ALostTasksSplitsWaitForTheClientsReports) {
  ASSERT_OK(Apply("register_dataset { dataset_id: 'ds' dataset { version: 1 } fingerprint: 7 }"));
  ASSERT_OK(Apply("create_job { job_id: 2 dataset_id: 'ds' job_name: 'train' processing_mode: "
                  "DISTRIBUTED_EPOCH split_tracked: true }"));
  ASSERT_OK(Apply("register_worker { address: 'a:1' index: 0 host_id: 'h1' }"));
  ASSERT_OK(Apply("create_iteration { iteration_id: 10 job_id: 2 has_splits: true "
                  "positions: 10 split_elements: 4 }"));
  ASSERT_OK(Apply("create_client { client_id: 20 iteration_id: 10 }"));
  ASSERT_OK(Apply("create_client { client_id: 21 iteration_id: 10 }"));
  ASSERT_OK(Apply("create_task { task_id: 11 iteration_id: 10 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("assign_split { task_id: 11 split { split_id: 12 begin: 0 end: 4 } "
                  "created: true next_position: 4 }"));
  ASSERT_OK(Apply("remove_worker { address: 'a:1' }"));
  EXPECT_THAT(state_.SplitsAwaitingReport(20), ElementsAre(12));
  EXPECT_THAT(state_.SplitsAwaitingReport(21), ElementsAre(12));
  EXPECT_THAT(state_.SplitsAwaitingReport(99), IsEmpty());  // unknown client
  ExpectRestoresEqual();
  // Client 20 received indices 0 and 1 (prefix 2).
  ASSERT_OK(Apply("splits_reported { iteration_id: 10 client_id: 20 "
                  "splits { split_id: 12 delivered_prefix: 2 } }"));
  EXPECT_THAT(changes_.splits, ElementsAre(10));
  EXPECT_THAT(state_.SplitsAwaitingReport(20), IsEmpty());
  EXPECT_EQ(state_.iterations().at(10).splits->open().at(12).def.skip_prefix(), 2);
  ASSERT_OK(Apply("splits_reported { iteration_id: 10 client_id: 20 "
                  "splits { split_id: 12 delivered_prefix: 3 } }"));
  EXPECT_THAT(changes_.splits, IsEmpty());  // said already: nothing changes
  ExpectRestoresEqual();
  ASSERT_OK(Apply("remove_client { client_id: 21 }"));
  EXPECT_THAT(changes_.splits, ElementsAre(10));
  EXPECT_THAT(state_.iterations().at(10).splits->open().at(12).awaiting, IsEmpty());
  EXPECT_STATUS(Apply("splits_reported { iteration_id: 10 client_id: 20 "
                      "splits { split_id: 12 delivered_prefix: -4 } }"),
                absl::StatusCode::kInvalidArgument, "out of bounds");
}

TEST_F(DispatcherStateTest, AnUntrackedJobsLostSplitsWaitForNoReport) {
  Basic("DISTRIBUTED_EPOCH");  // split_tracked false: elements carry no positions
  ASSERT_OK(Apply("create_iteration { iteration_id: 10 job_id: 2 repetition: 1 has_splits: true "
                  "positions: 10 split_elements: 4 }"));
  ASSERT_OK(Apply("create_client { client_id: 20 iteration_id: 10 }"));
  ASSERT_OK(Apply("create_task { task_id: 11 iteration_id: 10 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("assign_split { task_id: 11 split { split_id: 12 begin: 0 end: 4 } "
                  "created: true next_position: 4 }"));
  ASSERT_OK(Apply("remove_worker { address: 'a:1' }"));
  EXPECT_THAT(state_.SplitsAwaitingReport(20), IsEmpty());
}

TEST_F(DispatcherStateTest, PendingTasksStartTogether) {
  Basic();
  ASSERT_OK(Apply("create_task { task_id: 4 iteration_id: 3 worker_address: 'a:1' pending: true }"));
  EXPECT_THAT(changes_.joining, ElementsAre(3));
  ASSERT_OK(Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'b:1' pending: true }"));
  EXPECT_THAT(changes_.joining, IsEmpty());  // one was pending already
  EXPECT_THAT(state_.iterations().at(3).pending_tasks, ElementsAre(4, 5));
  ASSERT_OK(Apply("start_tasks { iteration_id: 3 task_ids: 4 task_ids: 5 starting_round: 20 }"));
  EXPECT_THAT(state_.iterations().at(3).pending_tasks, IsEmpty());
  EXPECT_EQ(state_.tasks().at(5).starting_round, 20);
  EXPECT_FALSE(state_.tasks().at(5).pending);
  ASSERT_EQ(changes_.visible.size(), 1u);  // one change, both tasks in it
  EXPECT_THAT(changes_.visible[0].tasks, ElementsAre(4, 5));
}

TEST_F(DispatcherStateTest, StaticShardingClaimsShardsAndWaitsForEveryShard) {
  state_ = DispatcherState({"a:1", "b:1"});
  Basic("FILE_SHARDING");
  EXPECT_EQ(state_.shard_claims().holders(), (std::vector<std::string>{"a:1", "b:1"}));
  ASSERT_OK(Apply("create_task { task_id: 4 iteration_id: 3 worker_address: 'a:1' }"));
  proto::TaskDef def;
  ASSERT_OK(state_.TaskDefOf(state_.workers().at("a:1").undelivered.at(0), &def));
  EXPECT_EQ(def.num_shards(), 2);
  EXPECT_EQ(def.worker_index(), 0);
  EXPECT_EQ(state_.tasks().at(4).shard, 0);
  ASSERT_OK(Apply("finish_task { task_id: 4 }"));
  EXPECT_FALSE(state_.iterations().at(3).finished);  // shard 1 was not read
  ASSERT_OK(Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'b:1' }"));
  ASSERT_OK(Apply("finish_task { task_id: 5 }"));
  EXPECT_TRUE(state_.iterations().at(3).finished);
  // A claim outlives its worker.
  ASSERT_OK(Apply("remove_worker { address: 'b:1' }"));
  EXPECT_EQ(state_.shard_claims().holders()[1], "b:1");
  ExpectRestoresEqual({"a:1", "b:1"});
}

TEST_F(DispatcherStateTest, UpdatesThatDoNotFitTheStateAreErrors) {
  EXPECT_STATUS(Apply("create_job { job_id: 2 dataset_id: 'nope' }"), absl::StatusCode::kNotFound,
                "dataset nope");
  Basic();
  EXPECT_STATUS(Apply("create_iteration { iteration_id: 3 job_id: 2 }"),
                absl::StatusCode::kAlreadyExists, "iteration 3");
  ASSERT_OK(Apply("create_task { task_id: 4 iteration_id: 3 worker_address: 'a:1' }"));
  EXPECT_STATUS(Apply("create_task { task_id: 4 iteration_id: 3 worker_address: 'b:1' }"),
                absl::StatusCode::kAlreadyExists, "task 4");
  EXPECT_STATUS(Apply("create_task { task_id: 5 iteration_id: 3 worker_address: 'c:1' }"),
                absl::StatusCode::kNotFound, "worker c:1");
  EXPECT_STATUS(Apply("assign_split { task_id: 4 split { split_id: 9 } created: true }"),
                absl::StatusCode::kFailedPrecondition, "no splits");
  EXPECT_STATUS(Apply(""), absl::StatusCode::kInvalidArgument, "unknown kind");
}

// Every kind of state a snapshot must carry: finished, failed and collected
// iterations, delivered, lost, pending and started tasks, a gone worker
// that tasks still name, open, queued and completed splits, clients at
// their end.
TEST_F(DispatcherStateTest, ASnapshotRestoresAnEqualState) {
  ExpectRestoresEqual();  // empty
  Basic("DISTRIBUTED_EPOCH");
  ASSERT_OK(Apply("register_worker { address: 'c:1' index: 2 host_id: 'h1' }"));
  ASSERT_OK(Apply("create_job { job_id: 20 dataset_id: 'ds' processing_mode: PARALLEL_EPOCHS "
                  "num_consumers: 2 job_name: 'coord' }"));
  // Resumed from a checkpoint at round 57.
  ASSERT_OK(Apply("create_iteration { iteration_id: 21 job_id: 20 resume { version: 1 "
                  "num_consumers: 2 round: 57 } }"));
  EXPECT_EQ(state_.iterations().at(21).first_round, 57);
  ASSERT_OK(Apply("create_task { task_id: 22 iteration_id: 21 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("create_task { task_id: 23 iteration_id: 21 worker_address: 'b:1' pending: true }"));
  ASSERT_OK(Apply("create_task { task_id: 24 iteration_id: 21 worker_address: 'c:1' pending: true }"));
  ASSERT_OK(Apply("start_tasks { iteration_id: 21 task_ids: 23 starting_round: 40 }"));
  ASSERT_OK(Apply("create_client { client_id: 25 iteration_id: 21 consumer_index: 0 }"));
  ASSERT_OK(Apply("create_client { client_id: 26 iteration_id: 21 consumer_index: 1 }"));
  ASSERT_OK(Apply("tasks_delivered { worker_address: 'a:1' task_ids: 22 }"));
  // distributed_epoch: splits open, queued and completed over two epochs.
  ASSERT_OK(Apply("create_iteration { iteration_id: 30 job_id: 2 repetition: 1 has_splits: true "
                  "positions: 10 split_elements: 4 }"));
  ASSERT_OK(Apply("create_task { task_id: 31 iteration_id: 30 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("create_task { task_id: 32 iteration_id: 30 worker_address: 'b:1' }"));
  ASSERT_OK(Apply("create_task { task_id: 38 iteration_id: 30 worker_address: 'c:1' }"));
  ASSERT_OK(Apply("assign_split { task_id: 31 split { split_id: 33 begin: 0 end: 4 } "
                  "created: true next_position: 4 }"));
  ASSERT_OK(Apply("assign_split { task_id: 32 split { split_id: 34 begin: 4 end: 8 } "
                  "created: true next_position: 8 }"));
  ASSERT_OK(Apply("assign_split { task_id: 31 split { split_id: 35 epoch: 1 begin: 0 end: 4 } "
                  "created: true next_position: 4 }"));
  ASSERT_OK(Apply("complete_splits { task_id: 31 split_ids: 33 }"));
  ASSERT_OK(Apply("requeue_splits { task_id: 32 split_ids: 34 }"));
  ASSERT_OK(Apply("assign_split { task_id: 38 split { split_id: 36 begin: 8 end: 10 } "
                  "created: true next_position: 10 }"));
  ASSERT_OK(Apply("create_client { client_id: 37 iteration_id: 30 consumer_index: -1 host_id: 'h2' }"));
  ASSERT_OK(Apply("client_at_end { client_id: 37 }"));
  ASSERT_OK(Apply("iteration_error { iteration_id: 30 error { code: 13 message: 'boom' } }"));
  // c:1 goes: its tasks are lost and still name it.
  ASSERT_OK(Apply("remove_worker { address: 'c:1' }"));
  // The first iteration finished, and was collected.
  ASSERT_OK(Apply("finish_task { task_id: 31 }"));
  ASSERT_OK(Apply("finish_task { task_id: 32 }"));
  ExpectRestoresEqual();
  EXPECT_EQ(Restored().iterations().at(21).first_round, 57);
  ASSERT_OK(Apply("create_task { task_id: 39 iteration_id: 3 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("tasks_delivered { worker_address: 'a:1' task_ids: 39 }"));
  ASSERT_OK(Apply("finish_task { task_id: 39 }"));
  ASSERT_OK(Apply("collect_iteration { iteration_id: 3 }"));
  ExpectRestoresEqual();
  const std::string text = state_.DebugString();
  EXPECT_THAT(text, HasSubstr("remove_worker { address: \"c:1\" }"));
  EXPECT_THAT(text, HasSubstr("counters { next_id: 40 next_worker_index: 3 }"));
}

// Journal compaction captures the state under the dispatcher's lock and
// builds the records after releasing it, while the state changes on.
TEST_F(DispatcherStateTest, ACaptureBuildsTheSnapshotOfItsMomentWhateverTheStateDoesAfter) {
  Basic("DISTRIBUTED_EPOCH");
  ASSERT_OK(Apply("register_worker { address: 'c:1' index: 2 host_id: 'h3' }"));
  ASSERT_OK(Apply("create_iteration { iteration_id: 30 job_id: 2 repetition: 1 has_splits: true "
                  "positions: 10 split_elements: 4 }"));
  ASSERT_OK(Apply("create_task { task_id: 33 iteration_id: 30 worker_address: 'c:1' }"));
  ASSERT_OK(Apply("create_task { task_id: 31 iteration_id: 30 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("create_task { task_id: 32 iteration_id: 30 worker_address: 'b:1' }"));
  ASSERT_OK(Apply("tasks_delivered { worker_address: 'a:1' task_ids: 31 }"));
  ASSERT_OK(Apply("assign_split { task_id: 31 split { split_id: 34 begin: 0 end: 4 } "
                  "created: true next_position: 4 }"));
  ASSERT_OK(Apply("remove_worker { address: 'c:1' }"));  // task 33 names a gone worker
  ASSERT_OK(Apply("finish_task { task_id: 32 }"));
  const std::string then = state_.DebugString();
  DispatcherState::Captured captured = state_.Capture();
  // The state moves on: tasks come and go, a worker leaves, the
  // iteration is collected.
  ASSERT_OK(Apply("create_task { task_id: 35 iteration_id: 30 worker_address: 'a:1' }"));
  ASSERT_OK(Apply("complete_splits { task_id: 31 split_ids: 34 }"));
  ASSERT_OK(Apply("finish_task { task_id: 31 }"));
  ASSERT_OK(Apply("remove_worker { address: 'b:1' }"));
  ASSERT_OK(Apply("collect_iteration { iteration_id: 30 }"));
  ASSERT_NE(state_.DebugString(), then);
  const std::string built = DispatcherState::Text(DispatcherState::Build(std::move(captured)));
  EXPECT_EQ(built, then);
  // The gone worker's stand-in, with its task's host, removed at the end.
  EXPECT_THAT(built, HasSubstr("register_worker { address: \"c:1\" host_id: \"h3\" }"));
  EXPECT_THAT(built, HasSubstr("remove_worker { address: \"c:1\" }"));
  EXPECT_THAT(built, HasSubstr("tasks_delivered { worker_address: \"a:1\" task_ids: 31 }"));
}

TEST_F(DispatcherStateTest, ALargeSnapshotIsCutIntoRecords) {
  Basic();
  for (int64_t id = 100; id < 2600; ++id) {
    ASSERT_OK(Apply(absl::StrCat("create_task { task_id: ", id,
                                 " iteration_id: 3 worker_address: 'a:1' }")));
  }
  const std::vector<proto::JournalRecord> records = state_.Snapshot();
  ASSERT_GE(records.size(), 3u);
  for (const proto::JournalRecord& rec : records) EXPECT_LE(rec.updates_size(), 1000);
  ExpectRestoresEqual();
}

}  // namespace
}  // namespace sluice::internal
