// The UCX data plane on its own: a UcxElementServer fed by a fake element
// source, and UCX transports reading from it. Run by ctest under
// UCX_TLS=tcp and under shared memory, with a small receive pool so pool
// exhaustion is reachable.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "sluice/core/frame.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/ucx_protocol.h"
#include "sluice/core/event_fd.h"
#include "sluice/dataplane/ucx_runtime.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/ucx_server.h"
#include "tests/huge_pages_util.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using internal::ServedBatch;
using internal::UcxElementServer;

using sluice_test::Pattern;

// Encodes into a buffer from `alloc`, as a worker's task runner does.
absl::StatusOr<internal::FrameBuffer> Encode(const Element& e, const internal::FrameAllocator& alloc) {
  auto layout = ComputeFrameLayout(e);
  if (!layout.ok()) return layout.status();
  auto f = alloc(layout->frame_size());
  if (!f.ok()) return f.status();
  absl::Status s = EncodeFrame(e, 0, absl::Span<uint8_t>(f->data, f->size));
  if (!s.ok()) return s;
  return f;
}

// A UCX element server on a free loopback port.
absl::StatusOr<std::unique_ptr<UcxElementServer>> StartServer(internal::ElementSource source,
                                                              int threads = 4,
                                                              std::string auth_token = "") {
  internal::ElementServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.source = std::move(source);
  o.threads = threads;
  o.auth_token = std::move(auth_token);
  return UcxElementServer::Start(std::move(o));
}

// task_id selects what the fake worker answers: -5 the batch_, else
// elements_[task_id]. (What every transport must do is in
// transport_conformance_test.cc.)
class UcxTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(SetUcxReceivePoolBytes(size_t{64} << 20));
    auto server = StartServer([this](const ElementRequest& r) { return Serve(r); }, 8);
    ASSERT_OK(server);
    server_ = *std::move(server);
    // By rendezvous only (the replies' path into the pool is what most
    // tests here check); EagerReplies: EagerSmallReplies... below.
    auto t = MakeUcxElementTransport(server_->address(), "", kDefaultMaxElementBytes,
                                     EagerReplies::kNever);
    ASSERT_OK(t);
    transport_ = *std::move(t);
  }
  void TearDown() override {
    transport_.reset();
    if (server_) server_->Stop();
  }

  absl::StatusOr<ServedBatch> Serve(const ElementRequest& r) {
    ServedBatch out;
    switch (r.task_id) {
      case -5:  // every element of batch_ in one reply
        for (const Element& e : batch_) {
          auto f = Encode(e, server_->frame_allocator());
          if (!f.ok()) return f.status();
          out.frames.push_back(*std::move(f));
        }
        return out;
      default: {
        // Even tasks as a worker serves them (large single tensors as split
        // frames sent from the tensor; others in the registered send pool);
        // odd tasks: whole frames in plain heap memory.
        const Element& e = elements_.at(r.task_id);
        auto f = r.task_id % 2 == 0 ? internal::EncodeServedFrame(e, server_->frame_allocator())
                                    : Encode(e, internal::HeapFrameAllocator());
        if (!f.ok()) return f.status();
        out.frames.push_back(*std::move(f));
        return out;
      }
    }
  }

  absl::StatusOr<ElementResult> Get(int64_t task) {
    ElementRequest r;
    r.task_id = task;
    return transport_->GetElement(r);
  }

  std::vector<Element> elements_;
  std::vector<Element> batch_;
  std::unique_ptr<UcxElementServer> server_;
  std::unique_ptr<ElementTransport> transport_;
};

TEST_F(UcxTransportTest, ElementsFrom1ByteTo64MiBArriveBitExactWithoutClientCopies) {
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{64} << 10, size_t{1} << 20,
                       (size_t{4} << 20) + 3, size_t{16} << 20, size_t{64} << 20}) {
    elements_.push_back({Pattern(bytes, static_cast<uint8_t>(elements_.size()))});
  }
  elements_.push_back({Tensor::FromVector<double>({1.0, -2.5}), Tensor::Strings({"x", "", "yz"}),
                       Tensor::Scalar<int8_t>(-7), Pattern(3 << 20, 9)});
  TransportStats before = GetTransportStats();
  for (size_t i = 0; i < elements_.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(ElementResult r, Get(static_cast<int64_t>(i)));
    ASSERT_FALSE(r.end_of_sequence || r.not_ready);
    EXPECT_TRUE(ElementsEqual(r.elements.at(0), elements_[i])) << "element " << i;
  }
  TransportStats after = GetTransportStats();
  EXPECT_EQ(after.ucx_elements_received - before.ucx_elements_received,
            static_cast<int64_t>(elements_.size()));
  // Rendezvous into registered slots: the client copied no payload.
  EXPECT_EQ(after.client_payload_bytes_copied, before.client_payload_bytes_copied);
  // Which transports carried it: the messages over tcp, the data by cma
  // (shared memory) where sluice enables it (UCX_TLS, unset included,
  // allows cma, and not SLUICE_UCX_SHM=0), else tcp too. Never the posix
  // FIFO (a killed sender can wedge it: dataplane/ucx_runtime.cc).
  bool cma_enabled = false;
  for (const auto& [name, value] : internal::ucx::SluiceUcxDefaults()) {
    cma_enabled |= name == "CMA_MEMORY_INVALIDATE";
  }
  EXPECT_THAT(after.ucx_lanes, ::testing::ContainsRegex("tcp/lo\\([a-z_ ]*am "));
  EXPECT_THAT(after.ucx_lanes, ::testing::Not(::testing::HasSubstr("posix")));
  if (cma_enabled) {
    EXPECT_THAT(after.ucx_lanes, ::testing::HasSubstr("cma/memory(rma_bw"));
  } else {
    EXPECT_THAT(after.ucx_lanes, ::testing::Not(::testing::HasSubstr("cma")));
  }
  EXPECT_GT(after.ucx_bytes_received - before.ucx_bytes_received, int64_t{64} << 20);
  // Even tasks are served as a worker serves them: the single-tensor
  // elements of at least 64 KiB (2, 4, 6) straight from the tensor's memory,
  // the 1-byte one (0) encoded into the worker's registered memory.
  EXPECT_EQ(after.worker_zero_copy_payloads - before.worker_zero_copy_payloads, 3);
  EXPECT_EQ(after.worker_frames_in_registered_memory - before.worker_frames_in_registered_memory,
            1);
}

// A client that asks for eager small replies gets replies of at most
// kEagerReplyBytes in the reply message, copied once (and counted); larger
// replies still arrive by rendezvous without a copy. Small and large
// elements alike arrive bit-exact.
TEST_F(UcxTransportTest, EagerSmallRepliesAreCopiedOnceAndLargeOnesNever) {
  ASSERT_OK_AND_ASSIGN(auto eager, MakeUcxElementTransport(server_->address(), "",
                                                           kDefaultMaxElementBytes,
                                                           EagerReplies::kAlways));
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{3000}, size_t{5000}, size_t{64} << 10,
                       size_t{3} << 20}) {
    elements_.push_back({Pattern(bytes, static_cast<uint8_t>(elements_.size()))});
  }
  for (size_t i = 0; i < elements_.size(); ++i) {
    SCOPED_TRACE(i);
    const TransportStats before = GetTransportStats();
    ElementRequest req;
    req.task_id = static_cast<int64_t>(i);
    ASSERT_OK_AND_ASSIGN(ElementResult r, eager->GetElement(req));
    ASSERT_EQ(r.elements.size(), 1u);
    EXPECT_TRUE(ElementsEqual(r.elements[0], elements_[i]));
    const int64_t copied = GetTransportStats().client_payload_bytes_copied -
                           before.client_payload_bytes_copied;
    if (r.bytes <= internal::ucx::kEagerReplyBytes) {
      EXPECT_EQ(copied, static_cast<int64_t>(r.bytes)) << r.bytes << "-byte reply";
    } else {
      EXPECT_EQ(copied, 0) << r.bytes << "-byte reply";
    }
  }
  // kNever never copies, whatever the size.
  const TransportStats before = GetTransportStats();
  ASSERT_OK_AND_ASSIGN(ElementResult r, Get(1));
  EXPECT_TRUE(ElementsEqual(r.elements.at(0), elements_[1]));
  EXPECT_EQ(GetTransportStats().client_payload_bytes_copied, before.client_payload_bytes_copied);
}

// The default, kAuto: small replies come eagerly (copied once) only where a
// rendezvous would copy them anyway, over tcp; over shared memory (cma
// rendezvous, one copy by the kernel straight into the pool) never. The
// first reply on a new endpoint comes by rendezvous: its transports are
// known from then on.
TEST_F(UcxTransportTest, EagerSmallRepliesByDefaultOnlyWhereTheRendezvousCopies) {
  elements_.push_back({Pattern(1000, 1)});
  ASSERT_OK_AND_ASSIGN(auto t, MakeUcxElementTransport(server_->address()));
  int64_t copied = 0;
  std::string lanes;
  for (int i = 0; i < 3; ++i) {
    const TransportStats before = GetTransportStats();
    ElementRequest req;
    req.task_id = 0;
    ASSERT_OK_AND_ASSIGN(ElementResult r, t->GetElement(req));
    EXPECT_TRUE(ElementsEqual(r.elements.at(0), elements_[0]));
    const TransportStats after = GetTransportStats();
    lanes = after.ucx_lanes;
    if (i == 0) {
      EXPECT_EQ(after.client_payload_bytes_copied, before.client_payload_bytes_copied);
    } else {
      copied += after.client_payload_bytes_copied - before.client_payload_bytes_copied;
    }
  }
  if (UcxRendezvousCopies(lanes)) {
    EXPECT_THAT(lanes, ::testing::HasSubstr("tcp/"));
    EXPECT_GE(copied, 2 * 1000) << lanes;
  } else {
    EXPECT_THAT(lanes, ::testing::HasSubstr("cma/memory(rma_bw"));
    EXPECT_EQ(copied, 0) << lanes;
  }
}

TEST(EagerRepliesTest, TheEnvironmentsValuesParseAndOthersAreRejected) {
  EXPECT_EQ(*ParseEagerReplies(nullptr), EagerReplies::kAuto);
  EXPECT_EQ(*ParseEagerReplies("auto"), EagerReplies::kAuto);
  EXPECT_EQ(*ParseEagerReplies("0"), EagerReplies::kNever);
  EXPECT_EQ(*ParseEagerReplies("1"), EagerReplies::kAlways);
  EXPECT_STATUS(ParseEagerReplies("yes"), absl::StatusCode::kInvalidArgument,
                "SLUICE_UCX_EAGER_REPLIES must be 0 (never), 1 (always) or auto");
}

TEST(UcxRendezvousCopiesTest, TcpOrFragmentsCopySharedMemoryAndRdmaDoNot) {
  EXPECT_TRUE(UcxRendezvousCopies("tcp/lo(rma_bw am am_bw wireup) tcp/eth0(rma_bw)"));
  EXPECT_TRUE(UcxRendezvousCopies("tcp/lo(am am_bw wireup)"));  // no rma lane: AM fragments
  EXPECT_TRUE(UcxRendezvousCopies("posix/memory(am am_bw keepalive)"));
  EXPECT_FALSE(UcxRendezvousCopies("posix/memory(am am_bw keepalive) cma/memory(rma_bw)"));
  EXPECT_FALSE(UcxRendezvousCopies("rc_mlx5/mlx5_0:1(rma_bw am) tcp/eth0(rma_bw)"));
  EXPECT_FALSE(UcxRendezvousCopies(""));  // unknown: stay without a copy
  EXPECT_FALSE(UcxRendezvousCopies("garbage"));
}

TEST_F(UcxTransportTest, ABatchArrivesInOrderInOneReplyWithoutClientCopies) {
  for (int i = 0; i < 300; ++i) {
    if (i % 50 == 7) {
      batch_.push_back({Tensor::Strings({absl::StrCat("s", i), ""}), Pattern(0, 0)});
    } else {
      batch_.push_back({Tensor::Scalar<int64_t>(i), Pattern(static_cast<size_t>(i * 13), 1)});
    }
  }
  TransportStats before = GetTransportStats();
  ASSERT_OK_AND_ASSIGN(ElementResult r, Get(-5));
  ASSERT_EQ(r.elements.size(), batch_.size());
  for (size_t i = 0; i < batch_.size(); ++i) {
    EXPECT_TRUE(ElementsEqual(r.elements[i], batch_[i])) << "element " << i;
  }
  TransportStats after = GetTransportStats();
  EXPECT_EQ(after.ucx_elements_received - before.ucx_elements_received, 300);
  EXPECT_EQ(after.worker_batched_replies - before.worker_batched_replies, 1);
  EXPECT_EQ(after.client_payload_bytes_copied, before.client_payload_bytes_copied);
  // The elements share the reply's buffer, which outlives the others while
  // one of them is held.
  Element kept = r.elements[299];
  r.elements.clear();
  EXPECT_TRUE(ElementsEqual(kept, batch_[299]));
}

TEST_F(UcxTransportTest, SmallElementsShareArenasInsteadOfOneRegistrationEach) {
  elements_.push_back({Tensor::Scalar<int64_t>(7)});
  TransportStats before = GetTransportStats();
  std::vector<Element> held;
  for (int i = 0; i < 2000; ++i) {
    ASSERT_OK_AND_ASSIGN(ElementResult r, Get(0));
    held.push_back(std::move(r.elements.at(0)));
  }
  TransportStats after = GetTransportStats();
  EXPECT_EQ(after.dedicated_buffer_allocations, before.dedicated_buffer_allocations);
  // 2000 small frames fit one 8 MiB arena: no new registrations beyond it.
  EXPECT_LE(after.receive_pool_registered_bytes - before.receive_pool_registered_bytes,
            int64_t{8} << 20);
  for (const Element& e : held) EXPECT_EQ(e[0].at<int64_t>(0), 7);
}

TEST_F(UcxTransportTest, PoolAtItsCapAppliesBackpressureUntilTheConsumerReleases) {
  // A slow consumer keeps every element; the pool fills up to its cap.
  ASSERT_OK(SetUcxReceivePoolBytes(size_t{16} << 20));
  elements_.push_back({Pattern(3 << 20, 1)});
  std::vector<Element> held;
  for (int i = 0; i < 200 && !GetTransportStats().receive_pool_over_cap; ++i) {
    ASSERT_OK_AND_ASSIGN(ElementResult r, Get(0));
    ASSERT_TRUE(ElementsEqual(r.elements.at(0), elements_[0]));
    held.push_back(std::move(r.elements.at(0)));
  }
  ASSERT_TRUE(GetTransportStats().receive_pool_over_cap);
  int64_t dedicated = GetTransportStats().dedicated_buffer_allocations;
  // The next request waits: nothing is allocated behind the consumer's back.
  auto fut = std::async(std::launch::async, [&] { return Get(0); });
  EXPECT_EQ(fut.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  EXPECT_EQ(GetTransportStats().dedicated_buffer_allocations, dedicated);
  held.clear();  // the consumer catches up: buffers return, the request proceeds
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "hang";
  ASSERT_OK_AND_ASSIGN(ElementResult r, fut.get());
  EXPECT_TRUE(ElementsEqual(r.elements.at(0), elements_[0]));
  EXPECT_FALSE(GetTransportStats().receive_pool_over_cap);
}

TEST_F(UcxTransportTest, ElementLargerThanThePoolGetsADedicatedBuffer) {
  ASSERT_OK(SetUcxReceivePoolBytes(size_t{16} << 20));
  elements_.push_back({Pattern(40 << 20, 3)});
  int64_t dedicated = GetTransportStats().dedicated_buffer_allocations;
  ASSERT_OK_AND_ASSIGN(ElementResult r, Get(0));
  EXPECT_TRUE(ElementsEqual(r.elements.at(0), elements_[0]));
  EXPECT_EQ(GetTransportStats().dedicated_buffer_allocations, dedicated + 1);
}

// A transport that answers every request with one element.
class FixedTransport final : public ElementTransport {
 public:
  void GetElementAsync(const ElementRequest&, ElementCallback done) override {
    ElementResult r;
    r.elements.push_back({Tensor::Scalar<int32_t>(42)});
    done(std::move(r));
  }
  void Cancel() override {}
  std::string protocol() const override { return "grpc"; }
};

// UCX statuses keep their meaning as absl codes (a dead peer is retried,
// a timeout is a deadline, bad input is the caller's), and the message
// keeps UCX's own code.
TEST(UcxStatusTest, UcxCodesMapToTheMatchingAbslCodesAndKeepTheNativeCode) {
  using internal::ucx::UcsError;
  EXPECT_OK(UcsError(UCS_OK, "x"));
  EXPECT_EQ(UcsError(UCS_ERR_CONNECTION_RESET, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(UcsError(UCS_ERR_UNREACHABLE, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(UcsError(UCS_ERR_ENDPOINT_TIMEOUT, "x").code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(UcsError(UCS_ERR_CANCELED, "x").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(UcsError(UCS_ERR_INVALID_PARAM, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UcsError(UCS_ERR_NO_MEMORY, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(UcsError(UCS_ERR_UNSUPPORTED, "x").code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(UcsError(UCS_ERR_MESSAGE_TRUNCATED, "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(UcsError(UCS_ERR_NO_PROGRESS, "x").code(), absl::StatusCode::kInternal);
  absl::Status s = UcsError(UCS_ERR_CONNECTION_RESET, "ucx endpoint to 10.0.0.1:7000");
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("ucx endpoint to 10.0.0.1:7000"));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr(absl::StrCat("UCX status ", static_cast<int>(UCS_ERR_CONNECTION_RESET))));
}

// On a connection, a failure UCX has no better code for is the peer's: a
// client that connects to a same-host worker just killed fails with
// UCS_ERR_SHMEM_SEGMENT (its segment is gone), and must move on to other
// workers as for a reset, not end the iteration (seen in the fault suite).
TEST(UcxStatusTest, PeerFailuresWithoutABetterCodeAreUnavailable) {
  using internal::ucx::UcsPeerError;
  absl::Status shm = UcsPeerError(UCS_ERR_SHMEM_SEGMENT, "ucx endpoint to 127.0.0.1:7000");
  EXPECT_EQ(shm.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(shm.message()),
              ::testing::HasSubstr(absl::StrCat("UCX status ", static_cast<int>(UCS_ERR_SHMEM_SEGMENT))));
  EXPECT_EQ(UcsPeerError(UCS_ERR_NO_PROGRESS, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(UcsPeerError(UCS_ERR_CONNECTION_RESET, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(UcsPeerError(UCS_ERR_ENDPOINT_TIMEOUT, "x").code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(UcsPeerError(UCS_ERR_CANCELED, "x").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(UcsPeerError(UCS_ERR_MESSAGE_TRUNCATED, "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_OK(UcsPeerError(UCS_OK, "x"));
}

// A primary that answered, then leaves requests unanswered while its peer
// lives: a reset passes through (the peer died), one timeout passes
// through, two in a row switch to the fallback.
TEST(UcxFallbackTest, APrimaryThatWentSilentSwitchesAfterTwoUnansweredRequests) {
  class Scripted final : public ElementTransport {
   public:
    explicit Scripted(std::vector<absl::Status> script) : script_(std::move(script)) {}
    void GetElementAsync(const ElementRequest&, ElementCallback done) override {
      const absl::Status s = next_ < script_.size() ? script_[next_++] : absl::OkStatus();
      if (!s.ok()) return done(s);
      ElementResult r;
      r.elements.push_back({Tensor::Scalar<int32_t>(7)});
      done(std::move(r));
    }
    void Cancel() override {}
    std::string protocol() const override { return "ucx"; }

   private:
    std::vector<absl::Status> script_;
    size_t next_ = 0;
  };
  const absl::Status reset = absl::UnavailableError("reset");
  const absl::Status silent = absl::DeadlineExceededError("no reply");
  for (bool allow : {true, false}) {
    SCOPED_TRACE(allow);
    auto t = MakeFallbackTransport(
        std::make_unique<Scripted>(std::vector<absl::Status>{
            absl::OkStatus(), reset, silent, absl::OkStatus(), silent, silent}),
        std::make_unique<FixedTransport>(), "worker-under-test", allow);
    ElementRequest req;
    ASSERT_OK_AND_ASSIGN(ElementResult first, t->GetElement(req));
    EXPECT_EQ(first.elements.at(0)[0].at<int32_t>(0), 7);
    EXPECT_STATUS(t->GetElement(req), absl::StatusCode::kUnavailable, "reset");
    EXPECT_STATUS(t->GetElement(req), absl::StatusCode::kDeadlineExceeded, "no reply");
    ASSERT_OK(t->GetElement(req));  // an answer resets the count
    EXPECT_STATUS(t->GetElement(req), absl::StatusCode::kDeadlineExceeded, "no reply");
    EXPECT_STATUS(t->GetElement(req), absl::StatusCode::kDeadlineExceeded, "no reply");
    ASSERT_OK_AND_ASSIGN(ElementResult after, t->GetElement(req));
    EXPECT_EQ(t->protocol(), allow ? "grpc" : "ucx");
    EXPECT_EQ(after.elements.at(0)[0].at<int32_t>(0), allow ? 42 : 7);
  }
}

TEST(UcxFallbackTest, UnreachableUcxFallsBackOrFailsAsConfigured) {
  // Nothing listens there: start and stop a server to find a free port.
  std::string address;
  {
    auto s = StartServer([](const ElementRequest&) {
      return absl::StatusOr<ServedBatch>(ServedBatch{});
    });
    ASSERT_OK(s);
    address = (*s)->address();
  }
  for (bool allow : {true, false}) {
    ASSERT_OK_AND_ASSIGN(auto ucx, MakeUcxElementTransport(address));
    auto t = MakeFallbackTransport(std::move(ucx), std::make_unique<FixedTransport>(),
                                   "worker-under-test", allow);
    ElementRequest req;
    auto r = t->GetElement(req);
    if (allow) {
      // The request that failed fails (its reply may have been lost after
      // the worker served it: the caller asks again for what it lacks);
      // the transport has switched, and the retry goes over gRPC.
      EXPECT_STATUS(r, absl::StatusCode::kUnavailable, "");
      EXPECT_EQ(t->protocol(), "grpc");
      ASSERT_OK_AND_ASSIGN(ElementResult again, t->GetElement(req));
      EXPECT_EQ(again.elements.at(0)[0].at<int32_t>(0), 42);
    } else {
      EXPECT_STATUS(r, absl::StatusCode::kUnavailable, "fallback to grpc is disabled");
    }
  }
}

// Work posted from another thread while the progress thread sleeps wakes
// it: none of it waits for the sleep's 100 ms bound to run out.
TEST(UcxWorkerTest, PostWakesTheSleepingProgressThread) {
  namespace ucx = internal::ucx;
  ASSERT_OK_AND_ASSIGN(auto ctx, ucx::Context::Get());
  ASSERT_OK_AND_ASSIGN(auto worker, ucx::Worker::Create(ctx, /*busy_poll=*/false));
  int ran = 0;
  for (int i = 0; i < 30; ++i) {
    absl::SleepFor(absl::Milliseconds(3));  // long enough for it to go to sleep
    absl::Notification done;
    worker->Post([&] {
      ++ran;
      done.Notify();
    });
    done.WaitForNotification();
  }
  // Posts from the progress thread itself run on its next pass, unwoken.
  absl::Notification chained;
  worker->Post([&] { worker->Post([&] { chained.Notify(); }); });
  chained.WaitForNotification();
  EXPECT_EQ(ran, 30);
  EXPECT_EQ(worker->missed_wakeups(), 0);
}

// A consumer that drives the worker while it waits (Drive) sleeps on the
// worker's fds itself: work posted meanwhile runs on that consumer's
// thread, in its pass, and not on the progress thread.
TEST(UcxWorkerTest, WorkPostedWhileAConsumerDrivesRunsOnTheConsumer) {
  namespace ucx = internal::ucx;
  ASSERT_OK_AND_ASSIGN(auto ctx, ucx::Context::Get());
  ASSERT_OK_AND_ASSIGN(auto worker, ucx::Worker::Create(ctx, /*busy_poll=*/false));
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::atomic<bool> drove{false};
    std::thread::id driver, ran_on;
    absl::Notification ran;
    std::thread consumer([&] {
      driver = std::this_thread::get_id();
      // Until the post came (the progress thread may hold the worker for a
      // moment: Drive then returns false at once, without a wake fd).
      while (!ran.HasBeenNotified()) {
        if (worker->Drive(absl::Milliseconds(500))) drove = true;
      }
    });
    while (worker->driven_passes() == 0 && !drove) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(5));  // asleep in its pass, most likely
    worker->Post([&] {
      ran_on = std::this_thread::get_id();
      EXPECT_TRUE(worker->InPass());
      ran.Notify();
    });
    ran.WaitForNotification();
    consumer.join();
    if (ran_on == driver) return;  // (else the progress thread had it then; try again)
  }
  ADD_FAILURE() << "posted work never ran on the consumer driving the worker";
}

// A consumer that finds the worker taken waits on its own wake fd (its
// state changed elsewhere) or until the worker is let go; without a wake
// fd it does not wait at all.
TEST(UcxWorkerTest, DriveOnATakenWorkerWaitsForTheWakeFdOrTheRelease) {
  namespace ucx = internal::ucx;
  ASSERT_OK_AND_ASSIGN(auto ctx, ucx::Context::Get());
  ASSERT_OK_AND_ASSIGN(auto worker, ucx::Worker::Create(ctx, /*busy_poll=*/false));
  // The progress thread holds the worker until `release`.
  absl::Notification holding, release;
  worker->Post([&] {
    holding.Notify();
    release.WaitForNotification();
  });
  holding.WaitForNotification();
  const int64_t passes = worker->driven_passes();
  EXPECT_FALSE(worker->Drive(absl::Seconds(5)));  // no wake fd: returns at once
  internal::EventFd wake;
  ASSERT_GE(wake.fd(), 0);
  // (Woken, not timed out: each wait below is 60 s.)
  wake.Signal();  // the caller's state changed: no wait, no pass
  absl::Time start = absl::Now();
  EXPECT_TRUE(worker->Drive(absl::Seconds(60), wake.fd()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(worker->driven_passes(), passes);
  // Let go while it waits: it wakes, and the next Drive runs a pass.
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(20));
    release.Notify();
    // If the Drive below took the free worker instead (a slow start), it
    // sleeps in its pass: work posted ends that.
    absl::SleepFor(absl::Milliseconds(50));
    worker->Post([] {});
  });
  start = absl::Now();
  EXPECT_TRUE(worker->Drive(absl::Seconds(60), wake.fd()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  releaser.join();
  while (worker->driven_passes() == passes) {
    ASSERT_TRUE(worker->Drive(absl::Milliseconds(1), wake.fd()));
  }
}

// Registered buffers that bulk data crosses (arenas without a placement,
// dedicated buffers) are sluice's own aligned mappings advised for huge
// pages, not UCX's SysV/POSIX segments: a same-host (cma) transfer walks and
// pins every page of them.
TEST(UcxMemoryTest, LargeRegisteredBuffersAreAlignedAndAdvisedForHugePages) {
  SLUICE_SKIP_WITHOUT_HUGE_PAGES();
  namespace ucx = internal::ucx;
  ASSERT_OK_AND_ASSIGN(auto ctx, ucx::Context::Get());
  ASSERT_OK_AND_ASSIGN(auto mem, ucx::Memory::Allocate(ctx, size_t{8} << 20));
  EXPECT_TRUE(sluice_test::HugePagesAdvised(mem->data()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mem->data()) % kHugePageBytes, 0u);
}

// A request of another protocol version (here version 3, whose header was
// 64 bytes) gets an explicit error reply naming both versions; it is
// never served (nor misread as the current layout).
// Sends a request header as a bare UCX client would (in a pass of the
// endpoint's worker); `header` must outlive the send.
absl::Status SendRawRequest(ucp_ep_h ep, const void* header, size_t size) {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY;
  rp.cb.send = [](void* req, ucs_status_t, void*) { ucp_request_free(req); };
  ucs_status_ptr_t st =
      ucp_am_send_nbx(ep, internal::ucx::kGetElementAm, header, size, nullptr, 0, &rp);
  if (UCS_PTR_IS_ERR(st)) return internal::ucx::UcsError(UCS_PTR_STATUS(st), "ucp_am_send_nbx");
  return absl::OkStatus();
}

// A bare UCX client: a worker of its own (no sluice client) that keeps
// each reply's header and the bytes after it, by request id.
class BareClient {
 public:
  struct Reply {
    internal::ucx::ReplyHeader header;
    std::string text;
  };
  static absl::StatusOr<std::unique_ptr<BareClient>> Create() {
    SLUICE_ASSIGN_OR_RETURN(auto ctx, internal::ucx::Context::Get());
    SLUICE_ASSIGN_OR_RETURN(auto worker, internal::ucx::Worker::Create(ctx, /*busy_poll=*/false));
    auto client = std::unique_ptr<BareClient>(new BareClient(std::move(worker)));
    absl::Status status;
    BareClient* raw = client.get();
    raw->worker_->Run([&] {
      status = internal::ucx::SetAmHandler(raw->worker_->handle(), internal::ucx::kElementAm,
                                           &BareClient::OnReply, raw);
    });
    if (!status.ok()) return status;
    return client;
  }
  internal::ucx::Worker* worker() const { return worker_.get(); }
  // The reply to request `id`, once it came (nullopt after `timeout`).
  std::optional<Reply> Await(uint64_t id, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto came = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return replies_.count(id) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&came), timeout)) return std::nullopt;
    return replies_.at(id);
  }
  bool Got(uint64_t id) {
    absl::MutexLock l(&mu_);
    return replies_.count(id) > 0;
  }

 private:
  explicit BareClient(std::unique_ptr<internal::ucx::Worker> worker) : worker_(std::move(worker)) {}

  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void*, size_t,
                              const ucp_am_recv_param_t*) {
    auto* self = static_cast<BareClient*>(arg);
    Reply r;
    if (header_length < sizeof(r.header)) return UCS_OK;
    std::memcpy(&r.header, header, sizeof(r.header));
    r.text.assign(static_cast<const char*>(header) + sizeof(r.header),
                  header_length - sizeof(r.header));
    absl::MutexLock l(&self->mu_);
    self->replies_[r.header.request_id] = std::move(r);
    return UCS_OK;
  }

  absl::Mutex mu_;
  std::map<uint64_t, Reply> replies_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<internal::ucx::Worker> worker_;  // last: stops before the replies go
};

TEST(UcxProtocolTest, ARequestOfAnotherVersionIsRefusedNamingBothVersions) {
  std::atomic<int> served{0};
  auto server = StartServer([&](const ElementRequest&) {
    served++;
    return absl::StatusOr<ServedBatch>(ServedBatch{});
  });
  ASSERT_OK(server);
  // A bare UCX client speaking the old version.
  namespace ucx = internal::ucx;
  ASSERT_OK_AND_ASSIGN(auto client, BareClient::Create());
  ucx::Worker* worker = client->worker();
  struct OldHeader {  // version 3's request header
    uint32_t magic, version;
    uint64_t request_id;
    int64_t task_id, consumer_index, round, wait_ms;
    uint32_t max_elements, max_bytes;
    uint16_t token_len, ack_count;
    uint32_t reserved;
  } old{ucx::kRequestMagic, 3, 42, 1, -1, -1, 0, 1, 0, 0, 0, 0};
  static_assert(sizeof(OldHeader) == 64);
  ucp_ep_h ep = nullptr;
  absl::Status status;
  worker->Run([&] {
    auto connected = ucx::ConnectEndpoint(worker->handle(), (*server)->address(),
                                          [](void*, ucp_ep_h, ucs_status_t) {}, nullptr);
    if (!connected.ok()) {
      status = connected.status();
      return;
    }
    ep = *connected;
    status = SendRawRequest(ep, &old, sizeof(old));  // `old` outlives it: we wait for the reply
  });
  ASSERT_OK(status);
  std::optional<BareClient::Reply> reply = client->Await(42, absl::Seconds(30));
  ASSERT_TRUE(reply.has_value()) << "no reply to an old-version request";
  EXPECT_EQ(reply->header.magic, ucx::kReplyMagic);
  EXPECT_EQ(reply->header.request_id, 42u);
  EXPECT_TRUE(reply->header.flags & ucx::kReplyError);
  EXPECT_EQ(static_cast<absl::StatusCode>(reply->header.code),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reply->text, ::testing::HasSubstr(absl::StrCat(
                               "protocol version ", ucx::kProtocolVersion, ", the client 3")));
  EXPECT_EQ(served.load(), 0);
  worker->Run([&] { ucx::CloseEndpointForce(ep); });
}

// A reply goes out only on the connection its request came on. A client
// that disconnects while its request is served frees its endpoint on the
// worker, and UCX hands the same handle to the next connection; the reply
// must not go to that later client, whose request ids are its own (another
// process numbers its requests independently: a reply with its number would
// be taken as the answer to its own request).
TEST(UcxProtocolTest, AReplyNeverReachesALaterConnectionOnARecycledEndpoint) {
  constexpr int64_t kSlowTask = 1, kFastTask = 2;
  std::atomic<int> slow_started{0};
  // One serving thread: the slow reply is posted before the next request is
  // served, so it is sent (wherever it goes) before that request's reply.
  auto server = StartServer(
      [&](const ElementRequest& r) {
        if (r.task_id == kSlowTask) {
          slow_started++;
          absl::SleepFor(absl::Milliseconds(300));  // while its client goes away
        }
        ServedBatch b;
        b.not_ready = true;
        return absl::StatusOr<ServedBatch>(std::move(b));
      },
      /*threads=*/1);
  ASSERT_OK(server);
  namespace ucx = internal::ucx;
  ASSERT_OK_AND_ASSIGN(auto client, BareClient::Create());
  ucx::Worker* worker = client->worker();
  std::deque<ucx::RequestHeader> headers;  // outlive their sends
  // Connects and sends one request (in the worker's pass).
  auto connect_and_ask = [&](uint64_t id, int64_t task) -> absl::StatusOr<ucp_ep_h> {
    absl::StatusOr<ucp_ep_h> ep;
    worker->Run([&] {
      ep = ucx::ConnectEndpoint(worker->handle(), (*server)->address(),
                                [](void*, ucp_ep_h, ucs_status_t) {}, nullptr);
      if (!ep.ok()) return;
      ucx::RequestHeader& h = headers.emplace_back();
      h.magic = ucx::kRequestMagic;
      h.version = ucx::kProtocolVersion;
      h.request_id = id;
      h.task_id = task;
      h.consumer_index = -1;
      h.round = -1;
      h.max_elements = 1;
      h.max_outstanding = 1;
      h.delivered_seq = -1;
      absl::Status sent = SendRawRequest(*ep, &h, sizeof(h));
      if (!sent.ok()) ep = sent;
    });
    return ep;
  };
  for (int round = 0; round < 6; ++round) {
    const uint64_t first = 1000 + 2 * round, second = first + 1;
    // The first client asks for the slow task and goes away while it is
    // served.
    ASSERT_OK_AND_ASSIGN(ucp_ep_h gone, connect_and_ask(first, kSlowTask));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (slow_started.load() <= round && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_GT(slow_started.load(), round) << "the slow request never reached the worker";
    worker->Run([&] { ucx::CloseEndpointForce(gone); });
    // Time for the worker to see the disconnect, so that the next
    // connection may get the freed handle (without it the round proves less,
    // but cannot fail).
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_OK_AND_ASSIGN(ucp_ep_h next, connect_and_ask(second, kFastTask));
    EXPECT_TRUE(client->Await(second, absl::Seconds(10)).has_value()) << "round " << round;
    EXPECT_FALSE(client->Got(first))
        << "round " << round << ": the reply to a closed connection's request reached the next";
    worker->Run([&] { ucx::CloseEndpointForce(next); });
  }
}

// A worker answers every request within its wait; a connection that left
// one unanswered past the allowance (UCX may lose a peer without telling:
// seen once in CI after another same-host worker was killed) is closed, and
// the next request reconnects instead of waiting on it forever (after
// kReplyTransferAllowance, 30 s, by default; 1 s here).
TEST(UcxSilenceTest, AConnectionThatLeavesARequestUnansweredIsReplaced) {
  absl::Notification release;
  std::atomic<int> calls{0};
  auto server = StartServer([&](const ElementRequest&) {
    if (calls++ == 0) release.WaitForNotification();  // the first request: silence
    ServedBatch out;
    auto f = internal::EncodeServedFrame({Pattern(64, 3)}, internal::HeapFrameAllocator());
    if (!f.ok()) return absl::StatusOr<ServedBatch>(f.status());
    out.frames.push_back(*std::move(f));
    return absl::StatusOr<ServedBatch>(out);
  });
  ASSERT_OK(server);
  ASSERT_OK_AND_ASSIGN(auto t, MakeUcxElementTransport((*server)->address()));
  const TransportStats before = GetTransportStats();
  ElementRequest req;
  req.wait = absl::ZeroDuration();
  req.transfer_allowance = absl::Seconds(1);
  EXPECT_STATUS(t->GetElement(req), absl::StatusCode::kDeadlineExceeded, "no reply from worker");
  release.Notify();
  // The silent connection is closed; a later request gets a new one (after
  // the reconnect backoff).
  absl::StatusOr<ElementResult> r = absl::UnknownError("not tried");
  for (int i = 0; i < 50 && !r.ok(); ++i) {
    r = t->GetElement(req);
    if (!r.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_OK(r);
  ASSERT_EQ(r->elements.size(), 1u);
  const TransportStats after = GetTransportStats();
  EXPECT_EQ(after.ucx_silent_endpoints_closed - before.ucx_silent_endpoints_closed, 1);
  EXPECT_GE(after.ucx_endpoints_connected - before.ucx_endpoints_connected, 2);
}

// The shared progress thread has stopped by the time the libraries' own
// finalizers run at exit (it was still inside UCX calls there, and an
// exiting process died of SIGSEGV in libucm's finalizer now and then). A
// handler registered before the shared worker runs after sluice's.
TEST(UcxWorkerTest, TheSharedProgressThreadStopsBeforeTheLibrariesFinalize) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::atexit([] {
          if (internal::ucx::Worker::SharedLoopRunning()) std::_Exit(3);
        });
        auto server = StartServer([](const ElementRequest&) {
          ServedBatch out;
          auto f = internal::EncodeServedFrame({Pattern(1000, 3)}, internal::HeapFrameAllocator());
          if (!f.ok()) return absl::StatusOr<ServedBatch>(f.status());
          out.frames.push_back(*std::move(f));
          return absl::StatusOr<ServedBatch>(out);
        });
        if (!server.ok()) std::_Exit(4);
        auto t = MakeUcxElementTransport((*server)->address());
        if (!t.ok() || !(*t)->GetElement(ElementRequest()).ok()) std::_Exit(5);
        if (!internal::ucx::Worker::SharedLoopRunning()) std::_Exit(6);
        std::exit(0);  // the server and the endpoint still open
      },
      ::testing::ExitedWithCode(0), "");
}

// A reply announcing more than the client's max_element_bytes is refused
// before anything is allocated for it.
TEST(UcxLimitTest, OversizedReplyIsRefusedWithAClearError) {
  auto server = StartServer([](const ElementRequest&) {
    ServedBatch out;
    auto f = internal::EncodeServedFrame({Pattern(size_t{1} << 20, 7)},
                                         internal::HeapFrameAllocator());
    if (!f.ok()) return absl::StatusOr<ServedBatch>(f.status());
    out.frames.push_back(*std::move(f));
    return absl::StatusOr<ServedBatch>(out);
  });
  ASSERT_OK(server);
  ElementRequest req;
  ASSERT_OK_AND_ASSIGN(auto small,
                       MakeUcxElementTransport((*server)->address(), "", int64_t{64} << 10));
  EXPECT_STATUS(small->GetElement(req), absl::StatusCode::kResourceExhausted,
                "max_element_bytes");
  ASSERT_OK_AND_ASSIGN(auto big, MakeUcxElementTransport((*server)->address()));
  auto r = big->GetElement(req);
  ASSERT_OK(r);
  ASSERT_EQ(r->elements.size(), 1u);
  EXPECT_EQ(r->elements[0][0].byte_size(), size_t{1} << 20);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

std::set<std::string> DefaultNames(const std::string& tls) {
  std::set<std::string> names;
  for (const auto& [name, value] : internal::ucx::SluiceUcxDefaults(tls)) names.insert(name);
  return names;
}

// A transport's setting only where UCX_TLS lets UCX load that transport;
// never the mm transports' error handling, which would let a killed sender
// wedge a receiver's FIFO (dataplane/ucx_runtime.cc).
TEST(UcxSettingsTest, SharedMemorySettingsFollowUcxTls) {
  using ::testing::Contains;
  using ::testing::Not;
  EXPECT_THAT(DefaultNames("tcp"), Not(Contains("CMA_MEMORY_INVALIDATE")));
  EXPECT_THAT(DefaultNames("tcp"), Contains("ADAPTIVE_PROGRESS"));
  EXPECT_THAT(DefaultNames("tcp,posix,cma,self"), Contains("CMA_MEMORY_INVALIDATE"));
  for (const std::string tls : {"", "all", "sm,tcp", "shm", "tcp,posix,sysv,cma"}) {
    EXPECT_EQ(DefaultNames(tls).size(), 2u) << tls;
    EXPECT_THAT(DefaultNames(tls), Not(Contains("POSIX_ERROR_HANDLING"))) << tls;
    EXPECT_THAT(DefaultNames(tls), Not(Contains("SYSV_ERROR_HANDLING"))) << tls;
  }
  EXPECT_THAT(DefaultNames("^cma"), Not(Contains("CMA_MEMORY_INVALIDATE")));
  EXPECT_THAT(DefaultNames("^sysv"), Contains("CMA_MEMORY_INVALIDATE"));
  EXPECT_THAT(DefaultNames("mm,tcp"), Not(Contains("CMA_MEMORY_INVALIDATE")));
}

}  // namespace
}  // namespace sluice
