// The data-service iterator's reading strategies on their own, driven by
// hand: what each plans to send, and what it delivers for given replies
// (client/readers_internal.h). No service, no threads.
#include <map>

#include "sluice/client/distribute.h"
#include "sluice/client/readers_internal.h"
#include "tests/test_util.h"

namespace sluice::internal {
namespace {

Element Value(int64_t v) { return Element{Tensor::Scalar<int64_t>(v)}; }

std::vector<int64_t> Drain(std::vector<Piece>* out) {
  std::vector<int64_t> v;
  for (auto& piece : *out) {
    for (auto& e : piece.elements) v.push_back(e[0].at<int64_t>(0));
  }
  out->clear();
  return v;
}

Piece Values(std::vector<int64_t> values) {
  Piece p;
  for (int64_t v : values) p.elements.push_back(Value(v));
  return p;
}

std::vector<int64_t> Take(Reader& r) {
  std::vector<int64_t> v;
  while (r.HasElement()) v.push_back(r.TakeElement()[0].at<int64_t>(0));
  return v;
}

// A reply of `values` with the worker's seq of the first, from `split`
// (indices from `index`; split -1: untracked).
ElementResult Reply(std::vector<int64_t> values, int64_t seq, int64_t split = -1,
                    int64_t index = 0) {
  ElementResult r;
  for (size_t i = 0; i < values.size(); ++i) {
    r.elements.push_back(Value(values[i]));
    r.positions.push_back(
        {split, split < 0 ? -1 : index + static_cast<int64_t>(i), std::nullopt});
  }
  r.seq = seq;
  return r;
}

ElementResult NotReady() {
  ElementResult r;
  r.not_ready = true;
  return r;
}

ElementResult End() {
  ElementResult r;
  r.end_of_sequence = true;
  return r;
}

std::map<int64_t, ClientTask> Tasks(std::initializer_list<int64_t> ids) {
  std::map<int64_t, ClientTask> tasks;
  for (int64_t id : ids) {
    ClientTask t;
    t.id = id;
    t.worker = absl::StrCat("w", id);
    tasks.emplace(id, std::move(t));
  }
  return tasks;
}

TEST(TaskOrderTest, RepliesArrivingOutOfOrderAreDeliveredInSeqOrder) {
  TaskOrder order;
  std::vector<Piece> out;
  const int64_t a = order.Sent(), b = order.Sent();
  // b's reply (seq 2..3) comes first: held until a's (seq 0..1).
  order.Done(b);
  EXPECT_EQ(order.Arrived(2, Values({2, 3}), &out), 0);
  EXPECT_TRUE(Drain(&out).empty());
  EXPECT_EQ(order.held(), 1);
  order.Done(a);
  order.Arrived(0, Values({0, 1}), &out);
  EXPECT_EQ(Drain(&out), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(order.held(), 0);
  EXPECT_EQ(order.delivered(), 4);
  EXPECT_TRUE(order.Complete(4));
  EXPECT_FALSE(order.Complete(5));
}

TEST(TaskOrderTest, AGapNoRequestInFlightCanFillIsGivenUp) {
  TaskOrder order;
  std::vector<Piece> out;
  const int64_t a = order.Sent(), b = order.Sent();
  order.Done(b);
  order.Arrived(5, Values({5}), &out);  // seq 0..4 went to request a
  EXPECT_TRUE(Drain(&out).empty());
  order.Done(a);  // a was cancelled: its elements are gone with it
  order.Release(&out);
  EXPECT_EQ(Drain(&out), std::vector<int64_t>{5});
  // An element of the given-up gap that comes late is delivered, once; one
  // delivered before is dropped; one without seq passes.
  order.Sent();
  EXPECT_EQ(order.Arrived(1, Values({1}), &out), 0);
  EXPECT_EQ(order.Arrived(1, Values({1}), &out), 1);
  EXPECT_EQ(order.Arrived(5, Values({5}), &out), 1);
  order.Arrived(-1, Values({9}), &out);
  EXPECT_EQ(Drain(&out), (std::vector<int64_t>{1, 9}));
}

// A request that failed in transit may have lost a reply the worker had
// handed out: the gap is not given up but filled by resends, and what
// arrives twice (a slow original, a resend) is delivered once.
TEST(TaskOrderTest, AFailedRequestsGapIsFilledByResendsAndDuplicatesAreDropped) {
  TaskOrder order;
  std::vector<Piece> out;
  const int64_t a = order.Sent(), b = order.Sent(), c = order.Sent();
  order.Done(b);
  order.Arrived(3, Values({3, 4}), &out);  // b: seq 3..4; a had 0..2
  order.Failed(a);
  EXPECT_TRUE(order.recovering());
  order.Release(&out);
  EXPECT_TRUE(Drain(&out).empty()) << "not given up while recovering";
  EXPECT_EQ(order.delivered(), 0);
  // The resend comes in two parts (a transport with one element per reply).
  order.Done(order.Sent());
  order.Arrived(0, Values({0}), &out);
  EXPECT_EQ(Drain(&out), std::vector<int64_t>{0});
  // The original of a's reply turns up after all: 1..2 are new, 0 is not.
  EXPECT_EQ(order.Arrived(0, Values({0, 1, 2}), &out), 1);
  EXPECT_EQ(Drain(&out), (std::vector<int64_t>{1, 2, 3, 4}));
  // A resend of what is held and delivered is dropped.
  order.Done(c);
  EXPECT_EQ(order.Arrived(3, Values({3, 4}), &out), 2);
  EXPECT_TRUE(Drain(&out).empty());
  order.EndRecovery();
  EXPECT_FALSE(order.recovering());
  EXPECT_TRUE(order.Complete(5));
}

TEST(SplitDedupTest, AnIndexOfASplitIsDeliveredOnceUntilTheSplitCompletes) {
  SplitDedup d;
  EXPECT_TRUE(d.FirstDelivery(3, 0));
  EXPECT_TRUE(d.FirstDelivery(3, 2));
  EXPECT_FALSE(d.FirstDelivery(3, 0));
  EXPECT_FALSE(d.FirstDelivery(3, 2));
  EXPECT_TRUE(d.FirstDelivery(3, 1));
  EXPECT_TRUE(d.FirstDelivery(-1, -1));  // untracked
  EXPECT_TRUE(d.FirstDelivery(-1, -1));
  // Held while a lost task's request is in flight, then forgotten.
  d.SetWatermark(4, /*hold=*/true);
  EXPECT_EQ(d.tracked_splits(), 1u);
  EXPECT_FALSE(d.FirstDelivery(3, 1));
  d.SetWatermark(4, /*hold=*/false);
  EXPECT_EQ(d.tracked_splits(), 0u);
  // A late element of a forgotten (completed) split is delivered rather
  // than dropped (it may be new).
  EXPECT_TRUE(d.FirstDelivery(3, 7));
}

ReaderOptions Opts(int64_t max_outstanding, bool distributed = false) {
  ReaderOptions o;
  o.max_outstanding = max_outstanding;
  o.distributed = distributed;
  o.client_id = 17;
  return o;
}

TEST(FcfsReaderTest, PlansUpToMaxOutstandingSpreadOverTasksAndDeliversTheReplies) {
  auto tasks = Tasks({1, 2});
  FcfsReader r(Opts(4));
  const absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  ASSERT_EQ(sent.size(), 4u);
  std::map<int64_t, int> per_task;
  for (const auto& p : sent) {
    ++per_task[p.task_id];
    EXPECT_EQ(p.request.client_id, 17);
    EXPECT_EQ(p.request.max_elements, kMaxElementsPerReply);
  }
  EXPECT_EQ(per_task[1], 2);
  EXPECT_EQ(per_task[2], 2);
  EXPECT_TRUE(r.Plan(tasks, now).empty()) << "every slot is in flight";
  EXPECT_EQ(r.in_flight(), 4);
  // Task 1's replies in reverse order: held, then delivered in order.
  std::vector<PlannedRequest> t1;
  for (const auto& p : sent) {
    if (p.task_id == 1) t1.push_back(p);
  }
  r.OnReply(tasks, t1[1], Reply({10, 11}, 2), now);
  EXPECT_FALSE(r.HasElement());
  r.OnReply(tasks, t1[0], Reply({8, 9}, 0), now);
  EXPECT_EQ(Take(r), (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(r.in_flight(), 2);
  // Two slots came free: two more requests.
  EXPECT_EQ(r.Plan(tasks, now).size(), 2u);
}

TEST(FcfsReaderTest, BufferedRepliesCountAgainstMaxOutstanding) {
  auto tasks = Tasks({1});
  FcfsReader r(Opts(2));
  const absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  ASSERT_EQ(sent.size(), 2u);
  r.OnReply(tasks, sent[0], Reply({1}, 0), now);
  r.OnReply(tasks, sent[1], Reply({2}, 1), now);
  EXPECT_TRUE(r.Plan(tasks, now).empty()) << "two replies buffered, none taken";
  r.TakeElement();
  EXPECT_EQ(r.Plan(tasks, now).size(), 1u);
}

TEST(FcfsReaderTest, AcknowledgesSplitsOnTheNextRequestAndDropsDuplicates) {
  auto tasks = Tasks({1, 2});
  FcfsReader r(Opts(1, /*distributed=*/true));
  const absl::Time now = absl::Now();
  auto first = r.Plan(tasks, now);
  ASSERT_EQ(first.size(), 1u);
  const int64_t task = first[0].task_id;
  r.OnReply(tasks, first[0], Reply({0, 1, 2}, 0, /*split=*/5), now);
  EXPECT_EQ(Take(r), (std::vector<int64_t>{0, 1, 2}));
  // The next request to that task carries the ack; it may go to the other
  // task first (round robin), so ask until it does.
  bool acked = false;
  for (int i = 0; i < 4 && !acked; ++i) {
    auto next = r.Plan(tasks, now);
    ASSERT_EQ(next.size(), 1u);
    if (next[0].task_id == task) {
      ASSERT_EQ(next[0].request.acks.size(), 1u);
      EXPECT_EQ(next[0].request.acks[0].split_id, 5);
      EXPECT_EQ(next[0].request.acks[0].count, 3);
      acked = true;
      // Split 5 was reassigned: the other task sends it again, elements 1..3.
      r.OnReply(tasks, next[0], NotReady(), now);
    } else {
      r.OnReply(tasks, next[0], NotReady(), now);
    }
  }
  ASSERT_TRUE(acked);
  auto again = r.Plan(tasks, now);
  ASSERT_EQ(again.size(), 1u);
  r.OnReply(tasks, again[0], Reply({1, 2, 3}, 0, /*split=*/5, /*index=*/1), now);
  EXPECT_EQ(Take(r), std::vector<int64_t>{3});
  EXPECT_EQ(r.counters().duplicates, 2);
}

TEST(FcfsReaderTest, TransportFailuresAreRetriedAfterABackoffAndWorkerErrorsEndIt) {
  auto tasks = Tasks({1});
  FcfsReader r(Opts(1));
  const absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  ASSERT_EQ(sent.size(), 1u);
  r.OnReply(tasks, sent[0], absl::UnavailableError("worker gone"), now);
  EXPECT_OK(r.error());
  EXPECT_TRUE(r.Plan(tasks, now).empty()) << "backing off";
  EXPECT_GT(r.NextWakeup(tasks), now);
  auto retry = r.Plan(tasks, tasks.at(1).retry_after);
  ASSERT_EQ(retry.size(), 1u);
  r.OnReply(tasks, retry[0], absl::InvalidArgumentError("the dataset failed"), now);
  EXPECT_STATUS(r.error(), absl::StatusCode::kInvalidArgument, "the dataset failed");
  EXPECT_TRUE(r.Plan(tasks, now).empty());
}

ElementResult EndAfter(int64_t total) {
  ElementResult r = End();
  r.seq = total;
  return r;
}

ElementResult Resent(ElementResult r) {
  r.resent = true;
  return r;
}

// A reply lost in transit (the request timed out after the worker handed
// its elements out): the task recovers them by resends before anything
// later is delivered, one resend request at a time, and ends only once
// everything the worker handed out arrived.
TEST(FcfsReaderTest, ALostReplyIsAskedForAgainAndTheTaskEndsOnlyWhenNothingIsMissing) {
  auto tasks = Tasks({1});
  FcfsReader r(Opts(2));
  absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].request.delivered_seq, 0);
  EXPECT_FALSE(sent[0].request.resend);
  r.OnReply(tasks, sent[1], Reply({2, 3}, 2), now);  // seq 0..1 went to sent[0]
  r.OnReply(tasks, sent[0], absl::DeadlineExceededError("no reply"), now);
  EXPECT_FALSE(r.HasElement());
  now = tasks.at(1).retry_after;
  auto resend = r.Plan(tasks, now);
  ASSERT_EQ(resend.size(), 1u) << "one resend request, whatever the free slots";
  EXPECT_TRUE(resend[0].request.resend);
  EXPECT_EQ(resend[0].request.delivered_seq, 0);
  EXPECT_TRUE(r.Plan(tasks, now).empty()) << "one at a time";
  r.OnReply(tasks, resend[0], Resent(Reply({0, 1}, 0)), now);
  EXPECT_EQ(Take(r), (std::vector<int64_t>{0, 1, 2, 3}));
  // Still recovering until the worker has nothing more to resend.
  auto more = r.Plan(tasks, now);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_TRUE(more[0].request.resend);
  EXPECT_EQ(more[0].request.delivered_seq, 4);
  r.OnReply(tasks, more[0], Reply({4}, 4), now);  // a fresh element: recovered
  EXPECT_EQ(Take(r), std::vector<int64_t>{4});
  auto normal = r.Plan(tasks, now);
  ASSERT_EQ(normal.size(), 2u);
  EXPECT_FALSE(normal[0].request.resend);
  EXPECT_EQ(normal[0].request.delivered_seq, 5);
  // end_of_sequence after 7 elements, while 5..6 are in flight: the task
  // waits for them, asking nothing meanwhile.
  r.OnReply(tasks, normal[1], EndAfter(7), now);
  EXPECT_FALSE(tasks.at(1).end_of_sequence);
  EXPECT_TRUE(r.Plan(tasks, now).empty());
  r.OnReply(tasks, normal[0], Reply({5, 6}, 5), now);
  EXPECT_TRUE(tasks.at(1).end_of_sequence);
  EXPECT_EQ(Take(r), (std::vector<int64_t>{5, 6}));
  EXPECT_OK(r.error());
  EXPECT_EQ(r.counters().duplicates, 0);
}

TEST(FcfsReaderTest, EndOfSequenceWithElementsMissingRecoversThemOrFailsWithDataLoss) {
  {
    auto tasks = Tasks({1});
    FcfsReader r(Opts(1));
    const absl::Time now = absl::Now();
    auto sent = r.Plan(tasks, now);
    r.OnReply(tasks, sent[0], EndAfter(2), now);  // two handed out, none arrived
    EXPECT_FALSE(tasks.at(1).end_of_sequence);
    auto resend = r.Plan(tasks, now);
    ASSERT_EQ(resend.size(), 1u);
    EXPECT_TRUE(resend[0].request.resend);
    r.OnReply(tasks, resend[0], Resent(Reply({0, 1}, 0)), now);
    EXPECT_EQ(Take(r), (std::vector<int64_t>{0, 1}));
    auto last = r.Plan(tasks, now);
    ASSERT_EQ(last.size(), 1u);
    r.OnReply(tasks, last[0], EndAfter(2), now);
    EXPECT_TRUE(tasks.at(1).end_of_sequence);
    EXPECT_OK(r.error());
  }
  {
    // The worker has nothing to resend, yet says it handed out more: never
    // a silent end.
    auto tasks = Tasks({1});
    FcfsReader r(Opts(1));
    const absl::Time now = absl::Now();
    auto sent = r.Plan(tasks, now);
    r.OnReply(tasks, sent[0], EndAfter(2), now);
    auto resend = r.Plan(tasks, now);
    ASSERT_EQ(resend.size(), 1u);
    r.OnReply(tasks, resend[0], EndAfter(2), now);
    EXPECT_STATUS(r.error(), absl::StatusCode::kDataLoss, "handed this consumer 2 elements");
  }
  {
    // An anonymous consumer (no client id) keeps the old behaviour: the
    // worker keeps nothing for it.
    auto tasks = Tasks({1});
    ReaderOptions o = Opts(1);
    o.client_id = 0;
    FcfsReader r(o);
    const absl::Time now = absl::Now();
    auto sent = r.Plan(tasks, now);
    EXPECT_EQ(sent[0].request.delivered_seq, -1);
    r.OnReply(tasks, sent[0], EndAfter(2), now);
    EXPECT_TRUE(tasks.at(1).end_of_sequence);
  }
}

// What the dispatcher asks of a consumer about a lost task's splits: the
// indices it received of each (none of a split it never saw), and only
// once no request to a lost task is in flight (its reply could add some).
TEST(FcfsReaderTest, ReportsWhatItReceivedOfReassignedSplitsOnceNoLostRequestIsInFlight) {
  auto tasks = Tasks({1});
  FcfsReader r(Opts(2, /*distributed=*/true));
  const absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  ASSERT_EQ(sent.size(), 2u);
  r.OnReply(tasks, sent[0], Reply({10, 11}, 0, /*split=*/5), now);
  tasks.at(1).lost = true;
  r.OnTaskLost(tasks, tasks.at(1));
  EXPECT_FALSE(r.SplitReports(tasks, {5, 6}).has_value());  // sent[1] in flight
  // The second reply arrives before its cancellation: elements 3 and 4.
  r.OnReply(tasks, sent[1], Reply({13, 14}, 2, /*split=*/5, /*index=*/3), now);
  auto reports = r.SplitReports(tasks, {5, 6});
  ASSERT_TRUE(reports.has_value());
  ASSERT_EQ(reports->size(), 2u);
  const IndexSet five((*reports)[0].delivered_prefix(), (*reports)[0].delivered_beyond());
  EXPECT_EQ((*reports)[0].split_id(), 5);
  EXPECT_EQ(five.prefix(), 2);
  EXPECT_FALSE(five.Contains(2));
  EXPECT_TRUE(five.Contains(3) && five.Contains(4));
  EXPECT_EQ((*reports)[1].split_id(), 6);
  EXPECT_EQ((*reports)[1].delivered_prefix(), 0);
  EXPECT_TRUE((*reports)[1].delivered_beyond().empty());
  // Coordinated reads have no splits: they received none.
  RoundReader rounds(Opts(1), 0);
  auto none = rounds.SplitReports(tasks, {5});
  ASSERT_TRUE(none.has_value());
  ASSERT_EQ(none->size(), 1u);
  EXPECT_EQ((*none)[0].split_id(), 5);
  EXPECT_EQ((*none)[0].delivered_prefix(), 0);
}

TEST(FcfsReaderTest, EndedAndLostTasksAreNotAsked) {
  auto tasks = Tasks({1, 2});
  FcfsReader r(Opts(4));
  const absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  for (const auto& p : sent) {
    r.OnReply(tasks, p, p.task_id == 1 ? End() : NotReady(), now);
  }
  tasks.at(2).lost = true;
  EXPECT_TRUE(r.Plan(tasks, now).empty());
  EXPECT_EQ(r.in_flight(), 0);
}

TEST(RoundReaderTest, RoundsGoToTasksInTurnAndAreDeliveredInOrder) {
  auto tasks = Tasks({1, 2});
  RoundReader r(Opts(4), 0);
  const absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  ASSERT_EQ(sent.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(sent[i].round, i);
    EXPECT_EQ(sent[i].task_id, i % 2 == 0 ? 1 : 2);
    EXPECT_EQ(sent[i].request.round, i);
  }
  r.OnReply(tasks, sent[1], Reply({101}, -1), now);
  EXPECT_FALSE(r.HasElement()) << "round 0 first";
  r.OnReply(tasks, sent[2], NotReady(), now);  // asked again
  r.OnReply(tasks, sent[0], Reply({100}, -1), now);
  EXPECT_EQ(Take(r), (std::vector<int64_t>{100, 101}));
  auto more = r.Plan(tasks, now);
  ASSERT_GE(more.size(), 1u);
  EXPECT_EQ(more[0].round, 2) << "the round that was not ready, again";
  // Round 3's task ends: every consumer skips it.
  r.OnReply(tasks, sent[3], End(), now);
  r.OnReply(tasks, more[0], Reply({102}, -1), now);
  EXPECT_EQ(Take(r), std::vector<int64_t>{102});
  EXPECT_EQ(r.counters().rounds_skipped, 1);
}

// A resumed consumer starts at its checkpoint's round; what it saves is
// the round Next() returns next: rounds received but not returned are read
// again after a restore, skipped rounds are passed.
TEST(RoundReaderTest, AResumedReaderStartsAtItsRoundAndSavesTheNextToReturn) {
  auto tasks = Tasks({1, 2});
  RoundReader r(Opts(3), 41);
  EXPECT_EQ(r.return_round(), 41);
  const absl::Time now = absl::Now();
  auto sent = r.Plan(tasks, now);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].round, 41);
  EXPECT_EQ(sent[0].task_id, 2) << "round 41 of two tasks is the second's";
  EXPECT_EQ(sent[1].task_id, 1);
  r.OnReply(tasks, sent[0], Reply({141}, -1), now);
  r.OnReply(tasks, sent[1], End(), now);  // round 42 skipped
  r.OnReply(tasks, sent[2], Reply({143}, -1), now);
  EXPECT_EQ(r.return_round(), 41) << "received, not returned";
  ASSERT_TRUE(r.HasElement());
  EXPECT_EQ(r.TakeElement()[0].at<int64_t>(0), 141);
  EXPECT_EQ(r.return_round(), 42);
  EXPECT_EQ(Take(r), std::vector<int64_t>{143});
  EXPECT_EQ(r.return_round(), 44);
}

TEST(RoundReaderTest, AJoiningRoundIsNotPassedUntilItsTaskStarts) {
  auto tasks = Tasks({1});
  RoundReader r(Opts(8), 0);
  r.SetBlock(3);
  auto sent = r.Plan(tasks, absl::Now());
  EXPECT_EQ(sent.size(), 3u) << "rounds 0, 1, 2 only";
  EXPECT_EQ(r.next_round(), 3);
}

}  // namespace
}  // namespace sluice::internal

namespace sluice::internal {
namespace {

SplitPosition At(int64_t split, int64_t index, int64_t begin, int64_t end, int64_t epoch = 0) {
  SplitPosition p;
  p.split_id = split;
  p.index = index;
  p.epoch = epoch;
  p.begin = begin;
  p.end = end;
  return p;
}

// A consumer's checkpoint counts what Next() returned: elements received
// but still buffered are undelivered, and a split is done only below the
// dispatcher's watermark with nothing of it held back.
TEST(SplitProgressTrackerTest, SavesWhatNextReturnedAndDoneOnlyBelowTheWatermark) {
  SplitProgressTracker t;
  for (int64_t i = 0; i < 4; ++i) t.Arrived(At(5, i, 0, 4));
  for (int64_t i = 0; i < 4; ++i) t.Returned(At(5, i, 0, 4));
  for (int64_t i = 0; i < 3; ++i) t.Arrived(At(6, i, 4, 8));
  t.Returned(At(6, 0, 4, 8));
  t.Returned(At(6, 2, 4, 8));  // index 1 still buffered
  t.SetWatermark(7);            // both splits completed at the dispatcher
  const proto::ServiceCheckpoint c = t.Save(8);
  EXPECT_EQ(c.version(), 1u);
  EXPECT_EQ(c.positions(), 8);
  EXPECT_EQ(c.split_watermark(), 7);
  ASSERT_EQ(c.splits_size(), 2);
  EXPECT_TRUE(c.splits(0).done());
  EXPECT_EQ(c.splits(0).begin(), 0);
  EXPECT_EQ(c.splits(0).delivered_prefix(), 4);
  EXPECT_FALSE(c.splits(1).done());  // an element of it is buffered
  EXPECT_TRUE(c.splits(1).undelivered());
  const IndexSet delivered(c.splits(1).delivered_prefix(), c.splits(1).delivered_beyond());
  EXPECT_TRUE(delivered.Contains(0));
  EXPECT_FALSE(delivered.Contains(1));
  EXPECT_TRUE(delivered.Contains(2));
  // Below the watermark only: a split still open is never done.
  SplitProgressTracker open;
  open.Arrived(At(9, 0, 0, 1));
  open.Returned(At(9, 0, 0, 1));
  open.SetWatermark(9);
  EXPECT_FALSE(open.Save(8).splits(0).done());
  EXPECT_FALSE(open.untracked());
  open.Returned(SplitPosition{});
  EXPECT_TRUE(open.untracked());
}

// Two consumers saved at the same step: one had split 5 done by its
// (later) watermark while the other, which saved earlier, still held one
// of its elements; split 6 was split between them.
TEST(SplitProgressTrackerTest, MergingUnitesDeliveriesAndTrustsOnlyTheLowestWatermark) {
  SplitProgressTracker a, b;
  for (int64_t i : {0, 2}) {
    a.Arrived(At(5, i, 0, 4));
    a.Returned(At(5, i, 0, 4));
  }
  b.Arrived(At(5, 1, 0, 4));
  b.Returned(At(5, 1, 0, 4));
  b.Arrived(At(5, 3, 0, 4));  // buffered at b's save
  for (int64_t i : {0, 1}) {
    a.Arrived(At(6, i, 4, 8));
    a.Returned(At(6, i, 4, 8));
  }
  b.Arrived(At(6, 2, 4, 8));
  b.Returned(At(6, 2, 4, 8));
  a.SetWatermark(7);
  b.SetWatermark(6);
  ASSERT_OK_AND_ASSIGN(proto::ServiceCheckpoint m, MergeServiceCheckpoints({a.Save(8), b.Save(8)}));
  EXPECT_EQ(m.consumers(), 2);
  EXPECT_EQ(m.split_watermark(), 6);
  ASSERT_EQ(m.splits_size(), 2);
  // Split 5: below the lowest watermark, but b held index 3 back.
  EXPECT_FALSE(m.splits(0).done());
  const IndexSet five(m.splits(0).delivered_prefix(), m.splits(0).delivered_beyond());
  EXPECT_EQ(five.prefix(), 3);
  EXPECT_FALSE(five.Contains(3));
  // Split 6: not below b's watermark (b may have received more after it
  // saved), so not done, whatever a saw.
  EXPECT_FALSE(m.splits(1).done());
  const IndexSet six(m.splits(1).delivered_prefix(), m.splits(1).delivered_beyond());
  EXPECT_EQ(six.prefix(), 3);
  // Checkpoints of other sources or iterations do not merge.
  proto::ServiceCheckpoint other = b.Save(9);
  EXPECT_TRUE(absl::IsInvalidArgument(MergeServiceCheckpoints({a.Save(8), other}).status()));
  SplitProgressTracker recut;
  recut.Arrived(At(5, 0, 0, 3));
  recut.Returned(At(5, 0, 0, 3));
  EXPECT_TRUE(
      absl::IsInvalidArgument(MergeServiceCheckpoints({a.Save(8), recut.Save(8)}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MergeServiceCheckpoints({}).status()));
}

// A resumed consumer's checkpoint keeps what the checkpoint it resumed
// from carried: done ranges stay done (even with no id in this
// iteration), and a partly delivered split's earlier elements stay
// delivered beside those returned since.
TEST(SplitProgressTrackerTest, AResumedConsumersCheckpointKeepsWhatItResumedFrom) {
  proto::ServiceCheckpoint from;
  from.set_version(1);
  from.set_positions(12);
  proto::SplitProgress* done = from.add_splits();
  done->set_begin(0);
  done->set_end(4);
  done->set_done(true);
  proto::SplitProgress* part = from.add_splits();
  part->set_begin(4);
  part->set_end(8);
  part->set_delivered_prefix(2);  // indices 0 and 1
  SplitProgressTracker t;
  t.Seed(from);
  // Saved at once: the same ranges, nothing lost.
  proto::ServiceCheckpoint at_once = t.Save(12);
  ASSERT_EQ(at_once.splits_size(), 2);
  EXPECT_TRUE(at_once.splits(0).done());
  EXPECT_FALSE(at_once.splits(1).done());
  EXPECT_EQ(at_once.splits(1).delivered_prefix(), 2);
  // The partial split is read in this iteration (new id 3): index 3.
  t.Arrived(At(3, 3, 4, 8));
  t.Returned(At(3, 3, 4, 8));
  const proto::ServiceCheckpoint later = t.Save(12);
  ASSERT_EQ(later.splits_size(), 2);
  const IndexSet d(later.splits(1).delivered_prefix(), later.splits(1).delivered_beyond());
  EXPECT_TRUE(d.Contains(0) && d.Contains(1) && d.Contains(3));
  EXPECT_FALSE(d.Contains(2));
  // Merged with a consumer that never read: the carried done range stays
  // done though it has no id below any watermark.
  SplitProgressTracker other;
  ASSERT_OK_AND_ASSIGN(proto::ServiceCheckpoint m, MergeServiceCheckpoints({later, other.Save(12)}));
  ASSERT_EQ(m.splits_size(), 2);
  EXPECT_TRUE(m.splits(0).done());
  EXPECT_FALSE(m.splits(1).done());
  // A position off the wire beyond any split's size is not tracked.
  SplitProgressTracker bad;
  bad.Returned(At(3, IndexSet::kMaxIndex + 1, 4, 8));
  EXPECT_TRUE(bad.untracked());
}

}  // namespace
}  // namespace sluice::internal
