// SplitClient against a real in-process dispatcher: a split-tracked split
// completes only once a client acknowledged every element of it, so a
// worker that dies with replies in flight loses no element.
#include "sluice/worker/split_client.h"

#include <memory>
#include <optional>
#include <thread>

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
      auto [id, index] = splits.Tag();
      EXPECT_EQ(id, (*split)->id);
      EXPECT_EQ(index, i - (*split)->begin);
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
    EXPECT_EQ(splits.Tag().first, -1);
  }
  auto end = splits.Next(0);
  ASSERT_OK(end.status());
  EXPECT_FALSE(end->has_value());
}

}  // namespace
}  // namespace sluice::internal
