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

std::vector<int64_t> Drain(std::deque<std::vector<Element>>* out) {
  std::vector<int64_t> v;
  for (auto& batch : *out) {
    for (auto& e : batch) v.push_back(e[0].at<int64_t>(0));
  }
  out->clear();
  return v;
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
    r.positions.push_back({split, split < 0 ? -1 : index + static_cast<int64_t>(i)});
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
  std::deque<std::vector<Element>> out;
  const int64_t a = order.Sent(), b = order.Sent();
  // b's reply (seq 2..3) comes first: held until a's (seq 0..1).
  order.Done(b);
  order.Arrived(2, 2, {Value(2), Value(3)}, &out);
  EXPECT_TRUE(Drain(&out).empty());
  EXPECT_EQ(order.held(), 1);
  order.Done(a);
  order.Arrived(0, 2, {Value(0), Value(1)}, &out);
  EXPECT_EQ(Drain(&out), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(order.held(), 0);
}

TEST(TaskOrderTest, AGapNoRequestInFlightCanFillIsGivenUp) {
  TaskOrder order;
  std::deque<std::vector<Element>> out;
  const int64_t a = order.Sent(), b = order.Sent();
  order.Done(b);
  order.Arrived(5, 1, {Value(5)}, &out);  // seq 0..4 went to request a
  EXPECT_TRUE(Drain(&out).empty());
  order.Done(a);  // a failed: its elements are lost with it
  order.Release(&out);
  EXPECT_EQ(Drain(&out), std::vector<int64_t>{5});
  // A reply behind what was delivered, or without seq, passes at once.
  order.Sent();
  order.Arrived(1, 1, {Value(1)}, &out);
  order.Arrived(-1, 1, {Value(9)}, &out);
  EXPECT_EQ(Drain(&out), (std::vector<int64_t>{1, 9}));
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
  RoundReader r(Opts(4));
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

TEST(RoundReaderTest, AJoiningRoundIsNotPassedUntilItsTaskStarts) {
  auto tasks = Tasks({1});
  RoundReader r(Opts(8));
  r.SetBlock(3);
  auto sent = r.Plan(tasks, absl::Now());
  EXPECT_EQ(sent.size(), 3u) << "rounds 0, 1, 2 only";
  EXPECT_EQ(r.next_round(), 3);
}

}  // namespace
}  // namespace sluice::internal
