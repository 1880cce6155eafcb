// TaskRunner (worker/task_runner.h): batches per consumer in seq order, and
// redelivery of replies lost in transit.
#include "sluice/worker/task_runner.h"

#include <thread>

#include "sluice/core/frame.h"
#include "sluice/dataset/dataset.h"
#include "tests/test_util.h"

namespace sluice::internal {
namespace {

std::unique_ptr<TaskRunner> RangeTask(int64_t n) {
  proto::TaskDef def;
  def.set_task_id(7);
  *def.mutable_dataset() = Dataset::Range(n).def();
  return std::make_unique<TaskRunner>(def, /*buffer_elements=*/64, HeapFrameAllocator());
}

ElementRequest Ask(int64_t client_id, int64_t delivered_seq, bool resend = false,
                   int64_t max_elements = 3) {
  ElementRequest r;
  r.task_id = 7;
  r.client_id = client_id;
  r.max_elements = max_elements;
  r.max_bytes = 1 << 20;
  r.delivered_seq = delivered_seq;
  r.resend = resend;
  return r;
}

std::vector<int64_t> Values(const ServedBatch& b) {
  std::vector<int64_t> v;
  for (const FrameBuffer& f : b.frames) {
    std::vector<uint8_t> bytes(f.frame_size());
    WriteFrame(f, bytes.data());
    auto decoded = DecodeFrame(bytes.data(), bytes.size(), nullptr);
    EXPECT_OK(decoded.status());
    if (decoded.ok()) v.push_back(decoded->element[0].at<int64_t>(0));
  }
  return v;
}

// Waits until the runner produced everything (so batches are full).
void AwaitProduced(TaskRunner& task, int64_t n) {
  for (int i = 0; i < 2000 && task.counters().produced_elements < n; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(task.counters().produced_elements, n);
}

// The dispatcher never declares a finished task lost, so a task is not
// finished while a reply may still be in transit (kept for redelivery),
// nor once stopped (its worker going away) before the consumer was told
// its end: a consumer that then lost that reply would wait for the task
// forever instead of reading its shard again elsewhere.
TEST(TaskRunnerTest, ATaskIsFinishedOnlyOnceItsConsumerHoldsEverything) {
  const absl::Duration wait = absl::Seconds(1);
  {
    auto task = RangeTask(3);
    AwaitProduced(*task, 3);
    ASSERT_OK_AND_ASSIGN(ServedBatch all, task->GetBatch(Ask(5, 0), wait));
    EXPECT_EQ(Values(all), (std::vector<int64_t>{0, 1, 2}));
    EXPECT_FALSE(task->finished()) << "the reply may not have arrived";
    ASSERT_OK_AND_ASSIGN(ServedBatch end, task->GetBatch(Ask(5, 3), wait));
    EXPECT_TRUE(end.end_of_sequence);
    EXPECT_EQ(end.seq, 3);
    EXPECT_TRUE(task->finished());
  }
  {
    auto task = RangeTask(3);
    AwaitProduced(*task, 3);
    ASSERT_OK_AND_ASSIGN(ServedBatch all, task->GetBatch(Ask(5, 0), wait));
    task->Stop();
    // The consumer holds all three, but is told the task stopped, not its end.
    EXPECT_STATUS(task->GetBatch(Ask(5, 3), wait).status(), absl::StatusCode::kCancelled,
                  "stopped");
    EXPECT_FALSE(task->finished());
  }
}

// With several requests in flight, the one that finds the task at its end
// may have been sent before an earlier reply arrived: it is answered
// not_ready, not the end, until a request says the consumer holds every
// element (then the end, and the task is finished); a request waiting for
// that is answered as soon as another one says so.
// A consumer of a shared task that leaves (its iterator closed) no longer
// holds the task's end back: what it was handed and never received counts
// as delivered at once, where it used to take kConsumerIdle. Its requests
// still arriving after get nothing.
TEST(TaskRunnerTest, AConsumerThatLeavesNoLongerHoldsTheTaskBack) {
  const absl::Duration wait = absl::Seconds(1);
  auto task = RangeTask(6);
  AwaitProduced(*task, 6);
  ASSERT_OK_AND_ASSIGN(ServedBatch six, task->GetBatch(Ask(6, 0), wait));
  ASSERT_FALSE(six.frames.empty());
  // Consumer 5 reads the rest to its end.
  int64_t held = 0;
  bool ended = false;
  for (int i = 0; i < 10 && !ended; ++i) {
    ASSERT_OK_AND_ASSIGN(ServedBatch b, task->GetBatch(Ask(5, held), wait));
    held += static_cast<int64_t>(b.frames.size());
    ended = b.end_of_sequence;
  }
  ASSERT_TRUE(ended);
  EXPECT_EQ(held + static_cast<int64_t>(six.frames.size()), 6);
  EXPECT_FALSE(task->finished()) << "consumer 6 may still receive its reply";
  ElementRequest leave = Ask(6, 0);
  leave.leaving = true;
  ASSERT_OK_AND_ASSIGN(ServedBatch bye, task->GetBatch(leave, wait));
  EXPECT_TRUE(bye.not_ready);
  EXPECT_TRUE(bye.frames.empty());
  EXPECT_TRUE(task->finished());
  ASSERT_OK_AND_ASSIGN(ServedBatch late, task->GetBatch(Ask(6, 0, /*resend=*/true), wait));
  EXPECT_TRUE(late.not_ready);
  EXPECT_TRUE(late.frames.empty());
}

TEST(TaskRunnerTest, TheEndIsAnsweredOnlyToAConsumerThatHoldsEverything) {
  auto task = RangeTask(3);
  AwaitProduced(*task, 3);
  ASSERT_OK_AND_ASSIGN(ServedBatch all, task->GetBatch(Ask(5, 0), absl::Seconds(1)));
  ASSERT_EQ(Values(all), (std::vector<int64_t>{0, 1, 2}));
  // Sent before `all` arrived.
  ASSERT_OK_AND_ASSIGN(ServedBatch early, task->GetBatch(Ask(5, 0), absl::Milliseconds(50)));
  EXPECT_TRUE(early.not_ready);
  EXPECT_FALSE(early.end_of_sequence);
  EXPECT_FALSE(task->finished());
  // Another such request waits; the next one, sent once `all` arrived,
  // ends both.
  absl::StatusOr<ServedBatch> waiting;
  std::thread t([&] { waiting = task->GetBatch(Ask(5, 0), absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_OK_AND_ASSIGN(ServedBatch end, task->GetBatch(Ask(5, 3), absl::Seconds(1)));
  t.join();
  EXPECT_TRUE(end.end_of_sequence);
  ASSERT_OK(waiting.status());
  EXPECT_TRUE(waiting->end_of_sequence);
  EXPECT_EQ(waiting->seq, 3);
  EXPECT_TRUE(task->finished());
}

TEST(TaskRunnerTest, AReplyLostInTransitIsHandedOutAgainFromWhatTheConsumerHolds) {
  auto task = RangeTask(8);
  AwaitProduced(*task, 8);
  const absl::Duration wait = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(ServedBatch a, task->GetBatch(Ask(5, 0), wait));
  ASSERT_OK_AND_ASSIGN(ServedBatch b, task->GetBatch(Ask(5, 0), wait));
  EXPECT_EQ(a.seq, 0);
  EXPECT_EQ(Values(a), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(b.seq, 3);
  EXPECT_FALSE(a.resent);
  // a was lost: the consumer holds nothing yet and asks for a resend, one
  // element per reply (as over gRPC): 0, then 1..2 (never past a's end).
  ASSERT_OK_AND_ASSIGN(ServedBatch r0, task->GetBatch(Ask(5, 0, true, 1), wait));
  EXPECT_TRUE(r0.resent);
  EXPECT_EQ(r0.seq, 0);
  EXPECT_EQ(Values(r0), std::vector<int64_t>{0});
  ASSERT_OK_AND_ASSIGN(ServedBatch r1, task->GetBatch(Ask(5, 1, true), wait));
  EXPECT_EQ(r1.seq, 1);
  EXPECT_EQ(Values(r1), (std::vector<int64_t>{1, 2}));
  // Then b's, which the consumer may hold already (it drops it then).
  ASSERT_OK_AND_ASSIGN(ServedBatch r3, task->GetBatch(Ask(5, 3, true), wait));
  EXPECT_EQ(Values(r3), (std::vector<int64_t>{3, 4, 5}));
  // Nothing more was handed out: a resend gets fresh elements.
  ASSERT_OK_AND_ASSIGN(ServedBatch fresh, task->GetBatch(Ask(5, 6, true), wait));
  EXPECT_FALSE(fresh.resent);
  EXPECT_EQ(fresh.seq, 6);
  EXPECT_EQ(Values(fresh), (std::vector<int64_t>{6, 7}));
  // What the consumer said it holds is forgotten: asking for it again is
  // DataLoss, named.
  EXPECT_STATUS(task->GetBatch(Ask(5, 0, true), wait).status(), absl::StatusCode::kDataLoss,
                "elements 0 to 5");
  // The end says how many were handed out in all.
  ASSERT_OK_AND_ASSIGN(ServedBatch end, task->GetBatch(Ask(5, 8), wait));
  EXPECT_TRUE(end.end_of_sequence);
  EXPECT_EQ(end.seq, 8);
  EXPECT_TRUE(task->finished());
}

TEST(TaskRunnerTest, ConsumersAreNumberedAndKeptApartAndAnonymousOnesAreNotKept) {
  auto task = RangeTask(6);
  AwaitProduced(*task, 6);
  const absl::Duration wait = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(ServedBatch a, task->GetBatch(Ask(1, 0, false, 2), wait));
  ASSERT_OK_AND_ASSIGN(ServedBatch b, task->GetBatch(Ask(2, 0, false, 2), wait));
  EXPECT_EQ(a.seq, 0);
  EXPECT_EQ(b.seq, 0);
  ASSERT_OK_AND_ASSIGN(ServedBatch again, task->GetBatch(Ask(2, 0, true), wait));
  EXPECT_EQ(Values(again), Values(b));
  ASSERT_OK_AND_ASSIGN(ServedBatch anon, task->GetBatch(Ask(0, 0, false, 1), wait));
  EXPECT_EQ(anon.seq, 0);
  ASSERT_OK_AND_ASSIGN(ServedBatch anon2, task->GetBatch(Ask(0, 0, true, 1), wait));
  EXPECT_FALSE(anon2.resent) << "nothing is kept for an anonymous consumer";
  EXPECT_EQ(anon2.seq, 1);
}

// Coordinated reads: a round's reply lost in transit is asked for again
// and gets the same element (resent), until the consumer's requests say it
// holds the round; the other consumer's element of the round is its own.
TEST(TaskRunnerTest, ARoundAskedAgainGetsTheSameElementUntilTheConsumerHoldsIt) {
  proto::TaskDef def;
  def.set_task_id(7);
  def.set_num_consumers(2);
  *def.mutable_dataset() = Dataset::Range(100).def();
  TaskRunner task(def, /*buffer_elements=*/64, HeapFrameAllocator());
  AwaitProduced(task, 100);
  const absl::Duration wait = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(ServedBatch a0, task.GetRound(wait, 0, 0, 0));
  ASSERT_OK_AND_ASSIGN(ServedBatch b0, task.GetRound(wait, 1, 0, 0));
  EXPECT_EQ(Values(a0), std::vector<int64_t>{0});
  EXPECT_EQ(Values(b0), std::vector<int64_t>{1});
  EXPECT_FALSE(a0.resent);
  // Consumer 0's reply was lost: the round (now closed) comes back as it was.
  ASSERT_OK_AND_ASSIGN(ServedBatch again, task.GetRound(wait, 0, 0, 0));
  EXPECT_TRUE(again.resent);
  EXPECT_EQ(Values(again), std::vector<int64_t>{0});
  ASSERT_OK_AND_ASSIGN(ServedBatch a1, task.GetRound(wait, 0, 1, 0));
  EXPECT_EQ(Values(a1), std::vector<int64_t>{2});
  // Once it says it holds round 0 (delivered_round 1), asking for it again
  // is the old refusal; round 1, not yet held, still comes back.
  ASSERT_OK_AND_ASSIGN(ServedBatch a1again, task.GetRound(wait, 0, 1, 1));
  EXPECT_EQ(Values(a1again), std::vector<int64_t>{2});
  EXPECT_STATUS(task.GetRound(wait, 0, 0, 1).status(), absl::StatusCode::kFailedPrecondition,
                "already served to every consumer");
  // Consumer 1 takes round 1 as usual.
  ASSERT_OK_AND_ASSIGN(ServedBatch b1, task.GetRound(wait, 1, 1, 1));
  EXPECT_EQ(Values(b1), std::vector<int64_t>{3});
}

}  // namespace
}  // namespace sluice::internal
