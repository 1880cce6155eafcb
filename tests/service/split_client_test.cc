// SplitClient against a real in-process dispatcher: a split-tracked split
// completes only once a client acknowledged every element of it, so a
// worker that dies with replies in flight loses no element.
#include "sluice/worker/split_client.h"

#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "rpc/service.grpc.pb.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/rpc/grpc_util.h"
#include "sluice/dataset/dataset.h"
#include "tests/test_util.h"

namespace sluice::internal {
namespace {

class SplitClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DispatcherConfig c;
    c.range_split_elements = 3;
    ASSERT_OK_AND_ASSIGN(dispatcher_, DispatchServer::Start(c));
    stub_ = proto::DispatcherService::NewStub(MakeChannel(dispatcher_->address()));
    proto::RegisterDatasetRequest rd;
    *rd.mutable_dataset() = Dataset::Range(6).def();
    proto::RegisterDatasetResponse rdr;
    ASSERT_TRUE(Call(&proto::DispatcherService::Stub::RegisterDataset, rd, &rdr));
    proto::GetOrCreateJobRequest jr;
    jr.set_dataset_id(rdr.dataset_id());
    jr.set_processing_mode(proto::DISTRIBUTED_EPOCH);
    proto::GetOrCreateJobResponse jresp;
    ASSERT_TRUE(Call(&proto::DispatcherService::Stub::GetOrCreateJob, jr, &jresp));
    proto::GetOrCreateIterationRequest ir;
    ir.set_job_id(jresp.job_id());
    AddResume(&ir);
    proto::GetOrCreateIterationResponse iresp;
    ASSERT_TRUE(Call(&proto::DispatcherService::Stub::GetOrCreateIteration, ir, &iresp));
    // The dispatcher registers only workers whose address answers: the
    // stand-in worker borrows the dispatcher's own.
    worker_ = dispatcher_->address();
    proto::WorkerHeartbeatRequest hb;
    hb.set_worker_address(worker_);
    proto::WorkerHeartbeatResponse hbr;
    ASSERT_TRUE(Call(&proto::DispatcherService::Stub::WorkerHeartbeat, hb, &hbr));
    ASSERT_EQ(hbr.new_tasks_size(), 1);
    task_ = hbr.new_tasks(0).task_id();
  }

  virtual void AddResume(proto::GetOrCreateIterationRequest*) {}

  template <typename Method, typename Req, typename Resp>
  bool Call(Method m, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(10));
    grpc::Status s = ((*stub_).*m)(&ctx, req, resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok();
  }

  // Reads one split to its end: tags its elements and sends them.
  int64_t ReadAndSend(SplitClient& splits) {
    auto split = splits.Next(0);
    EXPECT_OK(split.status());
    if (!split.ok() || !split->has_value()) return -1;
    for (int64_t i = (*split)->begin; i < (*split)->end; ++i) {
      // The element's split, as the pipeline's root says (ElementSplit).
      const SplitClient::Tagged tag = splits.Tag((*split)->id);
      const int64_t id = tag.position.split_id;
      EXPECT_EQ(id, (*split)->id);
      EXPECT_EQ(tag.position.index, i - (*split)->begin);
      // The split's source range rides with each element (service checkpoints).
      EXPECT_EQ(tag.position.begin, (*split)->begin);
      EXPECT_EQ(tag.position.end, (*split)->end);
      EXPECT_FALSE(tag.skip);
      splits.Sent(id);
    }
    return (*split)->id;
  }

  std::unique_ptr<DispatchServer> dispatcher_;
  std::unique_ptr<proto::DispatcherService::Stub> stub_;
  std::string worker_;
  int64_t task_ = 0;
};

TEST_F(SplitClientTest, TrackedSplitCompletesOnlyOnceItsElementsAreAcknowledged) {
  SplitClient splits(stub_.get(), worker_, task_, /*tracked=*/true);
  ASSERT_EQ(splits.BeginEpoch(), 0);
  const int64_t a = ReadAndSend(splits);
  const int64_t b = ReadAndSend(splits);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  // Both splits were read and sent, none acknowledged: the epoch cannot end
  // (the dispatcher says not_ready while this task holds them).
  absl::Notification ended;
  std::optional<absl::StatusOr<std::optional<Split>>> last;
  std::thread reader([&] {
    last = splits.Next(0);
    ended.Notify();
  });
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(500)))
      << "the epoch ended before the client acknowledged its elements";
  splits.Acked(a, 3);
  splits.Acked(b, 2);
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "one element of split " << b << " is still unacknowledged";
  splits.Acked(b, 5);  // more than was sent counts as what was sent
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
  reader.join();
  ASSERT_TRUE(last.has_value());
  ASSERT_OK(last->status());
  EXPECT_FALSE(last->value().has_value()) << "end of the epoch";
}

TEST_F(SplitClientTest, UntrackedSplitCompletesWhenReadToTheEnd) {
  SplitClient splits(stub_.get(), worker_, task_, /*tracked=*/false);
  splits.BeginEpoch();
  for (int k = 0; k < 2; ++k) {
    auto split = splits.Next(0);
    ASSERT_OK(split.status());
    ASSERT_TRUE(split->has_value());
    EXPECT_EQ(splits.Tag((*split)->id).position.split_id, -1);
  }
  auto end = splits.Next(0);
  ASSERT_OK(end.status());
  EXPECT_FALSE(end->has_value());
}

// A read-ahead op on the workers (a Prefetch, a parallel Map): both splits
// are read to the end (the source waits for the epoch's end) while their
// elements are still inside the pipeline. A split completes only once the
// op released each of its elements (the pipeline asked for the next), and
// a client acknowledged what was tagged: acknowledging two elements of
// three must not complete it.
TEST_F(SplitClientTest, AReadAheadSplitCompletesOnlyOnceItsElementsLeftThePipeline) {
  SplitClient splits(stub_.get(), worker_, task_, /*tracked=*/true);
  ASSERT_EQ(splits.BeginEpoch(), 0);
  std::vector<int64_t> ids;
  for (int k = 0; k < 2; ++k) {
    auto split = splits.Next(0);
    ASSERT_OK(split.status());
    ASSERT_TRUE(split->has_value());
    ids.push_back((*split)->id);
    // The read-ahead op takes the split's elements.
    for (int64_t i = (*split)->begin; i < (*split)->end; ++i) splits.ReadAhead((*split)->id);
  }
  absl::Notification ended;
  std::optional<absl::StatusOr<std::optional<Split>>> last;
  std::thread reader([&] {  // the op's input thread, at the epoch's end
    last = splits.Next(0);
    ended.Notify();
  });
  // The op returns `n` elements of `split` (releasing each one before
  // when asked for the next); each is tagged and sent.
  int64_t returned = -1;
  auto emit = [&](int64_t split, int64_t first_index, int n) {
    for (int i = 0; i < n; ++i) {
      splits.Released(std::exchange(returned, split));
      const SplitClient::Tagged tag = splits.Tag(split);
      EXPECT_EQ(tag.position.split_id, split);
      EXPECT_EQ(tag.position.index, first_index + i);
      EXPECT_FALSE(tag.skip);
      splits.Sent(split);
    }
  };
  emit(ids[1], 0, 3);
  splits.Acked(ids[1], 3);
  emit(ids[0], 0, 2);
  splits.Acked(ids[0], 2);
  splits.Released(std::exchange(returned, -1));
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(500)))
      << "the epoch ended with an element of split " << ids[0] << " still read ahead";
  emit(ids[0], 2, 1);
  splits.Acked(ids[0], 1);
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the epoch ended while the op still held the last element";
  splits.Released(std::exchange(returned, -1));
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
  reader.join();
  ASSERT_TRUE(last.has_value());
  ASSERT_OK(last->status());
  EXPECT_FALSE(last->value().has_value()) << "end of the epoch";
}

// An iteration resumed from a service checkpoint: split [0, 3) was all
// delivered, [3, 6) its indices 0 and 2. The worker is handed only [3, 6),
// produces it again, and sends index 1 alone; the skipped ones count as
// delivered, so the epoch ends once index 1 is acknowledged.
class ResumedSplitClientTest : public SplitClientTest {
 protected:
  void AddResume(proto::GetOrCreateIterationRequest* ir) override {
    proto::ServiceCheckpoint* c = ir->mutable_resume();
    c->set_version(1);
    c->set_positions(6);
    proto::SplitProgress* done = c->add_splits();
    done->set_begin(0);
    done->set_end(3);
    done->set_done(true);
    proto::SplitProgress* part = c->add_splits();
    part->set_begin(3);
    part->set_end(6);
    part->set_delivered_prefix(1);
    part->set_delivered_beyond(std::string(1, '\x02'));  // index 1 + 1
  }
};

TEST_F(ResumedSplitClientTest, AResumedSplitSkipsWhatWasDeliveredAndStillCompletes) {
  SplitClient splits(stub_.get(), worker_, task_, /*tracked=*/true);
  splits.BeginEpoch();
  auto split = splits.Next(0);
  ASSERT_OK(split.status());
  ASSERT_TRUE(split->has_value());
  EXPECT_EQ((*split)->begin, 3);
  EXPECT_EQ((*split)->end, 6);
  std::vector<bool> skipped;
  for (int i = 0; i < 3; ++i) {
    const SplitClient::Tagged t = splits.Tag((*split)->id);
    EXPECT_EQ(t.position.index, i);
    skipped.push_back(t.skip);
    if (!t.skip) splits.Sent(t.position.split_id);
  }
  EXPECT_EQ(skipped, (std::vector<bool>{true, false, true}));
  absl::Notification ended;
  std::optional<absl::StatusOr<std::optional<Split>>> last;
  std::thread reader([&] {
    last = splits.Next(0);
    ended.Notify();
  });
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the epoch ended before the one element sent was acknowledged";
  splits.Acked((*split)->id, 1);
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(30)));
  reader.join();
  ASSERT_TRUE(last.has_value());
  ASSERT_OK(last->status());
  EXPECT_FALSE(last->value().has_value()) << "[0, 3) was done: the epoch ends";
}

}  // namespace
}  // namespace sluice::internal
