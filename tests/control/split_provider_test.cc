// Unit tests of sluice::internal::SplitProvider: planning splits, handing
// them out, completing, requeueing and releasing them, and its snapshot.
#include "sluice/control/split_provider.h"

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sluice/dataset/dataset.h"
#include "tests/dataset/dataset_test_util.h"
#include "tests/test_util.h"

namespace sluice::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A provider over `positions` positions, `per` to a split.
proto::CreateIterationUpdate Plan(int64_t positions, int64_t per,
                                  const std::vector<std::string>& files = {}) {
  proto::CreateIterationUpdate u;
  u.set_has_splits(true);
  u.set_positions(positions);
  u.set_split_elements(per);
  for (const std::string& f : files) u.add_files(f);
  return u;
}

class SplitProviderTest : public ::testing::Test {
 protected:
  // Plans the next split of `epoch` for `task` and applies it, as the
  // dispatcher does: the split handed out, or nullopt with resp_ saying why.
  std::optional<proto::SplitProto> Take(SplitProvider& p, int64_t task, int64_t epoch = 0) {
    resp_.Clear();
    proto::AssignSplitUpdate a;
    if (!p.Next(task, epoch, &resp_, &a)) return std::nullopt;
    if (a.created()) a.mutable_split()->set_split_id(next_id_++);
    EXPECT_OK(p.Assign(a));
    proto::SplitProto handed = a.split();
    p.NameFiles(&handed);
    return handed;
  }
  proto::GetSplitResponse resp_;
  int64_t next_id_ = 100;
};

TEST_F(SplitProviderTest, DescribesARangeSourceWithTheConfiguredSplitSize) {
  proto::CreateIterationUpdate u;
  ASSERT_OK(SplitProvider::Describe(Dataset::Range(10).def().root(), 4, 0, &u));
  EXPECT_TRUE(u.has_splits());
  EXPECT_EQ(u.positions(), 10);
  EXPECT_EQ(u.split_elements(), 4);
  proto::CreateIterationUpdate again;
  SplitProvider(u).DescribeTo(&again);
  EXPECT_EQ(again.SerializeAsString(), u.SerializeAsString());
}

TEST_F(SplitProviderTest, CutsAnEpochIntoSplitsInOrderAndEndsItOnceAllCompleted) {
  SplitProvider p(Plan(10, 4));
  auto a = Take(p, 1);
  auto b = Take(p, 2);
  auto c = Take(p, 1);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->begin(), 0);
  EXPECT_EQ(a->end(), 4);
  EXPECT_EQ(b->begin(), 4);
  EXPECT_EQ(c->begin(), 8);
  EXPECT_EQ(c->end(), 10);  // the last split is short
  EXPECT_TRUE(resp_.epoch_had_splits());
  EXPECT_THAT(p.Held(1), ElementsAre(a->split_id(), c->split_id()));
  // Nothing left to hand out, but task 2 still holds a split: not the end.
  EXPECT_FALSE(Take(p, 1));
  EXPECT_TRUE(resp_.not_ready());
  EXPECT_TRUE(p.Complete(1, a->split_id()));
  EXPECT_FALSE(p.Complete(2, c->split_id()));  // not its split: a stale report
  EXPECT_TRUE(p.Complete(1, c->split_id()));
  EXPECT_TRUE(p.Complete(2, b->split_id()));
  EXPECT_FALSE(p.Complete(2, b->split_id()));  // completed before
  EXPECT_FALSE(Take(p, 1));
  EXPECT_TRUE(resp_.end_of_splits());
  EXPECT_EQ(p.done_below(), 1);  // the epoch is forgotten
  EXPECT_THAT(p.epochs(), IsEmpty());
  EXPECT_EQ(p.LowestOpen(), std::nullopt);
}

TEST_F(SplitProviderTest, FileSplitsAreRunsOfFilesCarryingTheirNames) {
  SplitProvider p(Plan(5, 2, {"/d/a", "/d/b", "/d/c", "/d/d", "/d/e"}));
  auto a = Take(p, 1);
  auto b = Take(p, 1);
  auto c = Take(p, 2);
  ASSERT_TRUE(a && b && c);
  EXPECT_THAT(a->files(), ElementsAre("/d/a", "/d/b"));
  EXPECT_EQ(b->begin(), 2);
  EXPECT_EQ(b->end(), 4);
  EXPECT_THAT(b->files(), ElementsAre("/d/c", "/d/d"));
  // A split of one file names it in `file`, as before runs.
  EXPECT_EQ(c->begin(), 4);
  EXPECT_EQ(c->end(), 5);
  EXPECT_EQ(c->file(), "/d/e");
  EXPECT_THAT(c->files(), IsEmpty());
  // What is journaled and snapshotted is the positions, not the names.
  for (const auto& [id, open] : p.open()) {
    EXPECT_TRUE(open.def.file().empty()) << id;
    EXPECT_THAT(open.def.files(), IsEmpty()) << id;
  }
}

// ListFiles: runs of file_split_files files, or about 256 splits and at
// most 256 files a split when it is 0. The listing is packed (zstd), and a
// provider made from it hands out the files' names.
TEST_F(SplitProviderTest, DescribesAListFilesSourceInRunsOfFiles) {
  EXPECT_EQ(SplitProvider::AutoFileRun(10), 1);
  EXPECT_EQ(SplitProvider::AutoFileRun(600), 2);
  EXPECT_EQ(SplitProvider::AutoFileRun(60'000), 234);
  EXPECT_EQ(SplitProvider::AutoFileRun(200'000), 256);
  EXPECT_EQ(SplitProvider::AutoFileRun(1'281'167), 256);
  sluice_test::TempDir dir;
  for (int i = 0; i < 600; ++i) std::ofstream(dir.File(absl::StrCat("f", 1000 + i))) << i;
  const proto::DatasetNode source = Dataset::ListFiles(dir.path() + "/f*").def().root();
  proto::CreateIterationUpdate automatic, fixed;
  ASSERT_OK(SplitProvider::Describe(source, 4, 0, &automatic));
  EXPECT_EQ(automatic.positions(), 600);
  EXPECT_EQ(automatic.files_size(), 0);
  EXPECT_GT(automatic.packed_files().size(), 0u);
  EXPECT_LT(automatic.packed_files().size(), 600u * dir.File("f1000").size() / 4);
  EXPECT_EQ(automatic.split_elements(), 2);
  ASSERT_OK(SplitProvider::Describe(source, 4, 7, &fixed));
  EXPECT_EQ(fixed.split_elements(), 7);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SplitProvider> p, SplitProvider::Create(fixed));
  auto first = Take(*p, 1);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->files_size(), 7);
  EXPECT_EQ(first->files(0), dir.File("f1000"));
  EXPECT_EQ(first->files(6), dir.File("f1006"));
  // A snapshot writes the listing as it came, packed.
  proto::CreateIterationUpdate again;
  p->DescribeTo(&again);
  EXPECT_EQ(again.packed_files(), fixed.packed_files());
  EXPECT_EQ(again.files_size(), 0);
}

// A journal written before packing lists the files as they are.
TEST_F(SplitProviderTest, CreatesAProviderFromAListingAsItIs) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<SplitProvider> p,
                       SplitProvider::Create(Plan(3, 2, {"/d/a", "/d/b", "/d/c"})));
  auto a = Take(*p, 1);
  ASSERT_TRUE(a);
  EXPECT_THAT(a->files(), ElementsAre("/d/a", "/d/b"));
}

TEST_F(SplitProviderTest, ABadListingIsDataLossNotACrash) {
  sluice_test::TempDir dir;
  for (int i = 0; i < 5; ++i) std::ofstream(dir.File(absl::StrCat("f", i))) << i;
  proto::CreateIterationUpdate u;
  ASSERT_OK(SplitProvider::Describe(Dataset::ListFiles(dir.path() + "/f*").def().root(), 4, 0,
                                    &u));
  // Fewer positions than files listed.
  proto::CreateIterationUpdate fewer = u;
  fewer.set_positions(4);
  EXPECT_EQ(SplitProvider::Create(fewer).status().code(), absl::StatusCode::kDataLoss);
  // Bytes that are not zstd, and a frame cut short.
  proto::CreateIterationUpdate garbage = u;
  garbage.set_packed_files("not zstd at all");
  EXPECT_EQ(SplitProvider::Create(garbage).status().code(), absl::StatusCode::kDataLoss);
  proto::CreateIterationUpdate cut = u;
  cut.set_packed_files(u.packed_files().substr(0, u.packed_files().size() - 3));
  EXPECT_EQ(SplitProvider::Create(cut).status().code(), absl::StatusCode::kDataLoss);
  // A plain listing of the wrong length.
  EXPECT_EQ(SplitProvider::Create(Plan(3, 1, {"/d/a"})).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(SplitProviderTest, ALostTasksSplitsAreHandedOutFirstInOrder) {
  SplitProvider p(Plan(12, 4));
  auto a = Take(p, 1);
  auto b = Take(p, 1);
  ASSERT_TRUE(a && b);
  int64_t completed = 0;
  EXPECT_EQ(p.Release(1, /*requeue=*/true, &completed), 2);
  EXPECT_EQ(completed, 0);
  EXPECT_THAT(p.Held(1), IsEmpty());
  EXPECT_EQ(p.LowestOpen(), a->split_id());
  auto again_a = Take(p, 2);
  auto again_b = Take(p, 2);
  auto fresh = Take(p, 2);
  ASSERT_TRUE(again_a && again_b && fresh);
  EXPECT_EQ(again_a->split_id(), a->split_id());
  EXPECT_EQ(again_b->split_id(), b->split_id());
  EXPECT_EQ(fresh->begin(), 8);
}

// Exactly once across consumers: a lost task's split waits until every
// client it awaits reported what it received; the split handed out again
// skips the union of the reports (and what a resume skipped already).
TEST_F(SplitProviderTest, ALostTasksSplitWaitsForItsClientsReportsAndSkipsWhatTheyReceived) {
  SplitProvider p(Plan(8, 4));
  auto a = Take(p, 1);
  ASSERT_TRUE(a);
  int64_t completed = 0;
  EXPECT_EQ(p.Release(1, /*requeue=*/true, &completed, /*awaiting=*/{7, 8, 9}), 1);
  EXPECT_THAT(p.AwaitingReport(7), ElementsAre(a->split_id()));
  EXPECT_THAT(p.AwaitingReport(6), IsEmpty());
  // Not handed out while it waits: the next task gets the next split, and
  // then nothing (the epoch has not ended either).
  auto fresh = Take(p, 2);
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->begin(), 4);
  EXPECT_FALSE(Take(p, 2));
  EXPECT_TRUE(resp_.not_ready());
  EXPECT_FALSE(resp_.end_of_splits());
  // A queued split that waits cannot be assigned (a journal that says so
  // does not fit the state).
  proto::AssignSplitUpdate early;
  early.set_task_id(2);
  early.mutable_split()->set_split_id(a->split_id());
  EXPECT_STATUS(p.Assign(early), absl::StatusCode::kFailedPrecondition, "reports");
  IndexSet first;  // client 7 received indices 0 and 2
  first.Insert(0);
  first.Insert(2);
  EXPECT_TRUE(p.Reported(7, a->split_id(), first));
  EXPECT_FALSE(p.Reported(7, a->split_id(), first));        // said already
  EXPECT_FALSE(p.Reported(5, a->split_id(), IndexSet()));   // not awaited
  EXPECT_FALSE(p.Reported(8, 999, IndexSet()));             // no such split
  IndexSet second;  // client 8 received index 1
  second.Insert(1);
  EXPECT_TRUE(p.Reported(8, a->split_id(), second));
  EXPECT_FALSE(Take(p, 2));  // client 9 has not said
  // Client 9 went away (released, timed out): nothing waits for it.
  EXPECT_TRUE(p.ClientGone(9));
  EXPECT_FALSE(p.ClientGone(9));
  EXPECT_THAT(p.AwaitingReport(9), IsEmpty());
  auto again = Take(p, 2);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->split_id(), a->split_id());
  const IndexSet skip(again->skip_prefix(), again->skip());
  EXPECT_EQ(skip.prefix(), 3);  // 0, 1 and 2
  EXPECT_FALSE(skip.Contains(3));
  // The waiting survives a snapshot.
  EXPECT_FALSE(Take(p, 3));  // nothing left to hand out
  EXPECT_EQ(p.Release(2, /*requeue=*/true, &completed, {4}), 2);
  proto::SplitProviderStateUpdate saved;
  p.Save(&saved);
  SplitProvider q(Plan(8, 4));
  q.Restore(saved);
  EXPECT_THAT(q.AwaitingReport(4), ElementsAre(a->split_id(), fresh->split_id()));
  EXPECT_FALSE(Take(q, 3));
  EXPECT_TRUE(q.ClientGone(4));
  auto resumed = Take(q, 3);
  ASSERT_TRUE(resumed);
  EXPECT_EQ(resumed->split_id(), a->split_id());
  EXPECT_EQ(resumed->skip_prefix(), 3);  // kept through the snapshot
}

TEST_F(SplitProviderTest, AClientReportIsRecordedAndOutOfBoundsIndicesAreInvalidArgument) {
  proto::ClientHeartbeatRequest req;
  req.set_reports_splits(true);
  proto::JournalRecord rec;
  ASSERT_OK(SplitProvider::ClientReport(3, 7, req, {42}, &rec));
  EXPECT_EQ(rec.updates_size(), 0);  // nothing reported: nothing recorded
  proto::SplitProgress* sp = req.add_reported_splits();
  sp->set_split_id(42);
  sp->set_delivered_prefix(5);
  ASSERT_OK(SplitProvider::ClientReport(3, 7, req, {42}, &rec));
  ASSERT_EQ(rec.updates_size(), 1);
  const proto::SplitsReportedUpdate& u = rec.updates(0).splits_reported();
  EXPECT_EQ(u.iteration_id(), 3);
  EXPECT_EQ(u.client_id(), 7);
  ASSERT_EQ(u.splits_size(), 1);
  EXPECT_EQ(u.splits(0).delivered_prefix(), 5);
  sp->set_delivered_prefix(-1);
  EXPECT_STATUS(SplitProvider::ClientReport(3, 7, req, {42}, &rec),
                absl::StatusCode::kInvalidArgument, "out of bounds");
  // A client of an older version does not report: taken as a report of
  // nothing for what waits for it, so that nothing waits for it forever.
  proto::ClientHeartbeatRequest old;
  rec.Clear();
  ASSERT_OK(SplitProvider::ClientReport(3, 7, old, {42, 43}, &rec));
  ASSERT_EQ(rec.updates_size(), 1);
  ASSERT_EQ(rec.updates(0).splits_reported().splits_size(), 2);
  EXPECT_EQ(rec.updates(0).splits_reported().splits(1).split_id(), 43);
  EXPECT_EQ(rec.updates(0).splits_reported().splits(1).delivered_prefix(), 0);
}

TEST_F(SplitProviderTest, ATaskThatEndsOnItsOwnCompletesWhatItHolds) {
  SplitProvider p(Plan(8, 4));
  auto a = Take(p, 1);
  ASSERT_TRUE(a);
  int64_t completed = 0;
  EXPECT_EQ(p.Release(1, /*requeue=*/false, &completed), 0);
  EXPECT_EQ(completed, 1);
  EXPECT_THAT(p.open(), IsEmpty());
}

TEST_F(SplitProviderTest, RequeuesOnlyTheSplitsTheTaskHolds) {
  SplitProvider p(Plan(12, 4));
  auto a = Take(p, 1);
  auto b = Take(p, 2);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(p.Requeue(1, {a->split_id(), b->split_id()}), 1);
  EXPECT_THAT(p.epochs().at(0).queue, ElementsAre(a->split_id()));
  EXPECT_THAT(p.Held(2), ElementsAre(b->split_id()));
}

TEST_F(SplitProviderTest, ReportsCompletionsAndTheSplitsAReplyNeverDelivered) {
  SplitProvider p(Plan(12, 4));
  auto a = Take(p, 1);
  auto b = Take(p, 1);
  auto c = Take(p, 1);
  ASSERT_TRUE(a && b && c);
  proto::GetSplitRequest req;
  req.add_completed_splits(a->split_id());
  req.add_completed_splits(999);  // not held: ignored
  req.add_held_splits(b->split_id());
  req.set_reports_held(true);
  proto::JournalRecord rec;
  p.Report(1, /*lost=*/false, req, &rec);
  ASSERT_EQ(rec.updates_size(), 2);
  EXPECT_THAT(rec.updates(0).complete_splits().split_ids(), ElementsAre(a->split_id()));
  EXPECT_THAT(rec.updates(1).requeue_splits().split_ids(), ElementsAre(c->split_id()));
  // A lost task, or a report_only request, requeues nothing.
  rec.Clear();
  p.Report(1, /*lost=*/true, req, &rec);
  EXPECT_EQ(rec.updates_size(), 1);
  rec.Clear();
  req.set_report_only(true);
  p.Report(1, /*lost=*/false, req, &rec);
  EXPECT_EQ(rec.updates_size(), 1);
}

TEST_F(SplitProviderTest, AssignRefusesWhatDoesNotFit) {
  SplitProvider p(Plan(12, 4));
  auto a = Take(p, 1);
  ASSERT_TRUE(a);
  proto::AssignSplitUpdate dup;
  dup.set_task_id(2);
  *dup.mutable_split() = *a;
  dup.set_created(true);
  EXPECT_STATUS(p.Assign(dup), absl::StatusCode::kAlreadyExists, "exists");
  dup.set_created(false);
  EXPECT_STATUS(p.Assign(dup), absl::StatusCode::kNotFound, "not queued");
}

TEST_F(SplitProviderTest, SaveAndRestoreKeepEveryEpochAndHolder) {
  SplitProvider p(Plan(8, 4));
  auto a = Take(p, 1);
  auto b = Take(p, 2);
  auto c = Take(p, 1, /*epoch=*/1);
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(p.Complete(1, a->split_id()));
  EXPECT_EQ(p.Requeue(2, {b->split_id()}), 1);
  proto::SplitProviderStateUpdate saved;
  p.Save(&saved);
  SplitProvider q(Plan(8, 4));
  q.Restore(saved);
  proto::SplitProviderStateUpdate again;
  q.Save(&again);
  EXPECT_EQ(again.SerializeAsString(), saved.SerializeAsString());
  EXPECT_THAT(q.Held(1), ElementsAre(c->split_id()));
  EXPECT_THAT(q.Held(2), IsEmpty());
  auto next = Take(q, 3);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->split_id(), b->split_id());
}

// A resume checkpoint over 20 positions: in epoch 0, [0, 4) and [8, 12)
// done, [4, 8) delivered up to index 2 and index 3 (index 2 not), [16, 20)
// cut as 4 splits of 1 earlier (a different split size) with [16, 17) done.
proto::ServiceCheckpoint Resume() {
  proto::ServiceCheckpoint c;
  c.set_version(1);
  c.set_positions(20);
  auto add = [&](int64_t begin, int64_t end, bool done, int64_t prefix = 0,
                 std::string beyond = "") {
    proto::SplitProgress* sp = c.add_splits();
    sp->set_begin(begin);
    sp->set_end(end);
    sp->set_done(done);
    sp->set_delivered_prefix(prefix);
    sp->set_delivered_beyond(beyond);
  };
  add(0, 4, true);
  add(4, 8, false, 2, std::string(1, '\x02'));
  add(8, 12, true);
  add(16, 17, true);
  return c;
}

TEST_F(SplitProviderTest, AResumedIterationSkipsDoneRangesAndRecutsPartialOnesAsSaved) {
  proto::CreateIterationUpdate u = Plan(20, 5);
  ASSERT_OK(SplitProvider::CheckResume(Resume(), 20));
  *u.mutable_resume() = Resume();
  SplitProvider p(u);
  std::vector<std::pair<int64_t, int64_t>> cut;
  std::vector<proto::SplitProto> handed;
  while (auto s = Take(p, 1)) {
    cut.emplace_back(s->begin(), s->end());
    handed.push_back(*s);
  }
  // [4, 8) as saved, with its skips; [12, 16) in the configured size but
  // stopping at the next saved split; [17, 20) after the done one.
  EXPECT_THAT(cut, ElementsAre(std::pair<int64_t, int64_t>{4, 8},
                               std::pair<int64_t, int64_t>{12, 16},
                               std::pair<int64_t, int64_t>{17, 20}));
  EXPECT_EQ(handed[0].skip_prefix(), 2);
  EXPECT_EQ(handed[0].skip(), std::string(1, '\x02'));
  EXPECT_EQ(handed[1].skip_prefix(), 0);
  EXPECT_TRUE(resp_.not_ready());  // all handed out, none completed
  for (const auto& s : handed) EXPECT_TRUE(p.Complete(1, s.split_id()));
  EXPECT_FALSE(Take(p, 1));
  EXPECT_TRUE(resp_.end_of_splits());
  // The next epoch is whole again.
  auto next = Take(p, 1, /*epoch=*/1);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->begin(), 0);
  EXPECT_EQ(next->end(), 5);
  // The resume survives the iteration's description (snapshots).
  proto::CreateIterationUpdate again;
  p.DescribeTo(&again);
  EXPECT_TRUE(SplitProvider(again).ResumesFrom(Resume()));
  EXPECT_FALSE(SplitProvider(Plan(20, 5)).ResumesFrom(Resume()));
}

TEST_F(SplitProviderTest, AnEpochThatWasAllDeliveredEndsAtOnce) {
  proto::ServiceCheckpoint c;
  c.set_version(1);
  c.set_positions(8);
  for (int64_t b : {0, 4}) {
    proto::SplitProgress* sp = c.add_splits();
    sp->set_begin(b);
    sp->set_end(b + 4);
    sp->set_done(true);
  }
  proto::CreateIterationUpdate u = Plan(8, 4);
  *u.mutable_resume() = c;
  SplitProvider p(u);
  EXPECT_FALSE(Take(p, 1));
  EXPECT_TRUE(resp_.end_of_splits());
}

TEST_F(SplitProviderTest, AResumeCheckpointThatDoesNotFitIsInvalidArgument) {
  proto::ServiceCheckpoint other_source = Resume();
  other_source.set_positions(21);
  EXPECT_TRUE(absl::IsInvalidArgument(SplitProvider::CheckResume(other_source, 20)));
  proto::ServiceCheckpoint outside = Resume();
  outside.mutable_splits(1)->set_end(25);
  EXPECT_TRUE(absl::IsInvalidArgument(SplitProvider::CheckResume(outside, 20)));
  proto::ServiceCheckpoint overlapping = Resume();
  overlapping.mutable_splits(1)->set_begin(2);
  EXPECT_TRUE(absl::IsInvalidArgument(SplitProvider::CheckResume(overlapping, 20)));
  proto::ServiceCheckpoint empty_range = Resume();
  empty_range.mutable_splits(0)->set_end(0);
  EXPECT_TRUE(absl::IsInvalidArgument(SplitProvider::CheckResume(empty_range, 20)));
  proto::ServiceCheckpoint version = Resume();
  version.set_version(2);
  EXPECT_TRUE(absl::IsInvalidArgument(SplitProvider::CheckResume(version, 20)));
}

}  // namespace
}  // namespace sluice::internal
