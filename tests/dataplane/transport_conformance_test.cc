// One conformance suite for every registered transfer protocol
// (dataplane/transport_registry.h): a protocol's ElementServer, fed by a
// fake element source, and its ElementTransport reading from it must
// behave the same, whatever carries the bytes. Run by ctest under
// UCX_TLS=tcp and with shared memory enabled. Protocol-specific behaviour
// (UCX arenas, backpressure, its wire version) is tested beside each
// protocol (ucx_transport_test.cc).
#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "rpc/service.grpc.pb.h"
#include "sluice/dataplane/element_server.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/transport_registry.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using internal::ElementServer;
using internal::ServedBatch;
using internal::TransportProtocol;

using sluice_test::Pattern;

// What the fake source answers, chosen by task_id.
enum Task : int64_t {
  kEndOfSequence = -1,
  kNotReady = -2,
  kInvalid = -3,        // the worker's own error, with its code
  kBlock = -4,          // waits until released (or 30 s)
  kEcho = -5,           // the request's fields, as elements
  kBatch = -6,          // up to max_elements elements, in order
  kPrecondition = -7,   // another of the worker's own errors
};

class ConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(protocol_,
                         internal::FindTransportProtocol(GetParam(), "conformance test"));
    ASSERT_OK_AND_ASSIGN(server_, StartServer(""));
    ASSERT_OK_AND_ASSIGN(transport_, Connect(server_->address(), ""));
  }
  void TearDown() override {
    Release();
    transport_.reset();
    if (server_) server_->Stop();
  }

  absl::StatusOr<std::unique_ptr<ElementServer>> StartServer(std::string token) {
    internal::ElementServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.source = [this](const ElementRequest& r) { return Serve(r); };
    o.threads = 8;
    o.auth_token = std::move(token);
    return protocol_->serve(std::move(o));
  }
  absl::StatusOr<std::unique_ptr<ElementTransport>> Connect(const std::string& address,
                                                            std::string token) {
    internal::ElementTransportOptions o;
    o.security.auth_token = std::move(token);
    return protocol_->connect(address, o);
  }

  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

  absl::StatusOr<ServedBatch> Serve(const ElementRequest& r) {
    served_++;
    ServedBatch out;
    auto add = [&](const Element& e, SplitPosition p) -> absl::Status {
      auto f = internal::EncodeServedFrame(e, server_->frame_allocator());
      if (!f.ok()) return f.status();
      f->position = p;
      // As a worker does (WorkerCore::Serve): what the request asked for.
      absl::Status compressed = internal::CompressServedFrame(r.compression, &*f);
      if (!compressed.ok()) return compressed;
      out.frames.push_back(*std::move(f));
      return absl::OkStatus();
    };
    switch (r.task_id) {
      case kEndOfSequence: out.end_of_sequence = true; return out;
      case kNotReady: out.not_ready = true; return out;
      case kInvalid: return absl::InvalidArgumentError("the dataset does not validate here");
      case kPrecondition: return absl::FailedPreconditionError("round 3 was asked twice");
      case kBlock:
        blocked_++;
        release_.WaitForNotificationWithTimeout(absl::Seconds(30));
        out.not_ready = true;
        return out;
      case kEcho: {
        std::vector<int64_t> fields = {r.consumer_index, r.round, r.client_id, r.max_outstanding,
                                       r.shared_job ? 1 : 0,
                                       absl::ToInt64Milliseconds(r.wait)};
        for (const SplitAck& a : r.acks) {
          fields.push_back(a.split_id);
          fields.push_back(a.count);
        }
        absl::Status s = add({Tensor::FromVector<int64_t>(fields)}, {41, 7, 0xfedcba9876543210ull});
        if (!s.ok()) return s;
        out.seq = 1000 + r.client_id % 1000;
        return out;
      }
      case kBatch:
        for (int64_t i = 0; i < std::min<int64_t>(r.max_elements, 5); ++i) {
          // Odd elements keyed, even ones not: a key is per element.
          std::optional<uint64_t> key;
          if (i % 2 == 1) key = 1000 + static_cast<uint64_t>(i);
          absl::Status s = add({Tensor::Scalar<int64_t>(i)}, {i, 10 * i, key});
          if (!s.ok()) return s;
        }
        out.seq = 20;
        return out;
      default: {
        absl::Status s = add(elements_.at(r.task_id), {-1, -1, std::nullopt});
        if (!s.ok()) return s;
        return out;
      }
    }
  }

  absl::StatusOr<ElementResult> Get(int64_t task) {
    ElementRequest r;
    r.task_id = task;
    r.wait = absl::ZeroDuration();
    return sluice_test::WithHangGuard([&] { return transport_->GetElement(r); });
  }

  // A request the source holds until Release(), in flight once this returns.
  std::future<absl::StatusOr<ElementResult>> GetBlocked() {
    const int before = blocked_.load();
    auto fut = std::async(std::launch::async, [&] {
      ElementRequest r;
      r.task_id = kBlock;
      r.wait = absl::Seconds(5);
      return transport_->GetElement(r);
    });
    AwaitBlocked(before + 1);
    return fut;
  }

  void AwaitBlocked(int n) {
    for (int i = 0; i < 6000 && blocked_.load() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GE(blocked_.load(), n) << "the requests never reached the source";
  }

  const TransportProtocol* protocol_ = nullptr;
  std::vector<Element> elements_;
  std::atomic<int> served_{0}, blocked_{0};
  absl::Notification release_;
  std::unique_ptr<ElementServer> server_;
  std::unique_ptr<ElementTransport> transport_;
};

// A request asking for a codec gets compressible elements compressed (fewer
// bytes on the wire) and incompressible ones as they are; either way the
// client's elements are bit-exact, split frames (large single tensors)
// included.
TEST_P(ConformanceTest, CompressedRepliesArriveBitExactInFewerBytes) {
  std::vector<int64_t> range(600000);  // 4.8 MB: served as a split frame
  for (size_t i = 0; i < range.size(); ++i) range[i] = static_cast<int64_t>(i);
  std::string text;
  while (text.size() < 200000) text += "sluice moves input pipelines off the trainer ";
  elements_.push_back({Tensor::FromVector<int64_t>(range)});
  elements_.push_back({Tensor::Strings({text, "x"}), Tensor::Scalar<int32_t>(7)});
  std::mt19937 rng(5);
  std::vector<uint8_t> noise(100000);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  elements_.push_back({Tensor::FromVector<uint8_t>(noise)});  // incompressible
  std::vector<size_t> plain_bytes;
  for (FrameCodec codec : {FrameCodec::kNone, FrameCodec::kLz4, FrameCodec::kZstd}) {
    SCOPED_TRACE(FrameCodecName(codec));
    for (size_t i = 0; i < elements_.size(); ++i) {
      SCOPED_TRACE(i);
      ElementRequest req;
      req.task_id = static_cast<int64_t>(i);
      req.wait = absl::ZeroDuration();
      req.compression = codec;
      ASSERT_OK_AND_ASSIGN(ElementResult r, sluice_test::WithHangGuard(
                                                [&] { return transport_->GetElement(req); }));
      ASSERT_EQ(r.elements.size(), 1u);
      EXPECT_TRUE(ElementsEqual(r.elements[0], elements_[i]));
      if (codec == FrameCodec::kNone) {
        plain_bytes.push_back(r.bytes);
      } else if (i < 2) {
        EXPECT_LT(r.bytes, plain_bytes[i] * 3 / 4) << "compressible, yet not compressed";
      } else {
        EXPECT_EQ(r.bytes, plain_bytes[i]) << "incompressible: sent as it is";
      }
    }
  }
}

TEST_P(ConformanceTest, TheServerAndTransportNameTheirProtocol) {
  EXPECT_EQ(server_->protocol(), GetParam());
  EXPECT_EQ(transport_->protocol(), GetParam());
  EXPECT_FALSE(server_->address().empty()) << "a server of its own has an address";
}

TEST_P(ConformanceTest, ElementsOfEverySizeAndKindArriveBitExact) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, size_t{65535},
                       size_t{1} << 16, size_t{3} << 20, size_t{16} << 20}) {
    elements_.push_back({Pattern(bytes, static_cast<uint8_t>(bytes))});
  }
  // Several components, strings among them, and a scalar.
  elements_.push_back({Tensor::Scalar<double>(2.5),
                       Tensor::Strings({"", "a", std::string(100000, 'z')}),
                       Pattern(70000, 9)});
  for (size_t i = 0; i < elements_.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_OK_AND_ASSIGN(ElementResult r, Get(static_cast<int64_t>(i)));
    ASSERT_EQ(r.elements.size(), 1u);
    EXPECT_TRUE(ElementsEqual(r.elements[0], elements_[i]));
    ASSERT_EQ(r.positions.size(), 1u);
    EXPECT_GT(r.bytes, 0u);
    EXPECT_FALSE(r.end_of_sequence || r.not_ready);
  }
}

TEST_P(ConformanceTest, FlagsAndTheWorkersOwnErrorsPassThroughWithTheirCodes) {
  ASSERT_OK_AND_ASSIGN(ElementResult eos, Get(kEndOfSequence));
  EXPECT_TRUE(eos.end_of_sequence);
  EXPECT_TRUE(eos.elements.empty());
  EXPECT_EQ(eos.seq, -1);
  ASSERT_OK_AND_ASSIGN(ElementResult later, Get(kNotReady));
  EXPECT_TRUE(later.not_ready);
  EXPECT_TRUE(later.elements.empty());
  EXPECT_STATUS(Get(kInvalid), absl::StatusCode::kInvalidArgument,
                "the dataset does not validate here");
  EXPECT_STATUS(Get(kPrecondition), absl::StatusCode::kFailedPrecondition, "asked twice");
  // The transport still works after errors.
  EXPECT_TRUE(Get(kEndOfSequence).ok());
}

TEST_P(ConformanceTest, EveryRequestFieldReachesTheWorkerAndSeqAndPositionComeBack) {
  for (bool shared : {false, true}) {
    ElementRequest r;
    r.task_id = kEcho;
    r.consumer_index = 2;
    r.round = 77;
    r.client_id = 1234567890123;
    r.max_outstanding = 8;
    r.shared_job = shared;
    r.wait = absl::Milliseconds(250);
    for (int64_t i = 0; i < static_cast<int64_t>(kMaxAcksPerRequest); ++i) {
      r.acks.push_back({100 + i, i + 1});
    }
    ASSERT_OK_AND_ASSIGN(ElementResult got, transport_->GetElement(r));
    ASSERT_EQ(got.elements.size(), 1u);
    const Tensor& t = got.elements[0][0];
    ASSERT_EQ(t.num_elements(), 6 + 2 * static_cast<int64_t>(kMaxAcksPerRequest));
    EXPECT_EQ(t.at<int64_t>(0), 2);
    EXPECT_EQ(t.at<int64_t>(1), 77);
    EXPECT_EQ(t.at<int64_t>(2), 1234567890123);
    EXPECT_EQ(t.at<int64_t>(3), 8);
    EXPECT_EQ(t.at<int64_t>(4), shared ? 1 : 0);
    EXPECT_EQ(t.at<int64_t>(5), 250);
    for (int64_t i = 0; i < static_cast<int64_t>(kMaxAcksPerRequest); ++i) {
      EXPECT_EQ(t.at<int64_t>(6 + 2 * i), 100 + i);
      EXPECT_EQ(t.at<int64_t>(7 + 2 * i), i + 1);
    }
    EXPECT_EQ(got.seq, 1000 + 123);
    ASSERT_EQ(got.positions.size(), 1u);
    EXPECT_EQ(got.positions[0].split_id, 41);
    EXPECT_EQ(got.positions[0].index, 7);
    EXPECT_EQ(got.positions[0].key, std::optional<uint64_t>(0xfedcba9876543210ull));
  }
}

// Every transport batches: a reply carries up to max_elements elements,
// in order, with their positions and keys and the first one's seq.
TEST_P(ConformanceTest, ARepliesElementsComeInOrderWithTheirPositionsAndKeys) {
  ElementRequest r;
  r.task_id = kBatch;
  r.max_elements = 4;
  r.max_bytes = 1 << 20;
  ASSERT_OK_AND_ASSIGN(ElementResult got, transport_->GetElement(r));
  ASSERT_EQ(got.elements.size(), 4u);
  ASSERT_EQ(got.positions.size(), got.elements.size());
  for (size_t i = 0; i < got.elements.size(); ++i) {
    EXPECT_EQ(got.elements[i][0].at<int64_t>(0), static_cast<int64_t>(i));
    EXPECT_EQ(got.positions[i].split_id, static_cast<int64_t>(i));
    EXPECT_EQ(got.positions[i].index, static_cast<int64_t>(10 * i));
    EXPECT_EQ(got.positions[i].key,
              i % 2 == 1 ? std::optional<uint64_t>(1000 + i) : std::nullopt);
  }
  EXPECT_EQ(got.seq, 20);
}

// The gRPC wire: a request from before batching (no max_elements) gets one
// element in the response's own fields, as before; a batch puts the
// elements after the first in `more`.
TEST_P(ConformanceTest, AGrpcRequestWithoutBatchFieldsGetsOneElementAsBefore) {
  if (GetParam() != "grpc") GTEST_SKIP() << "the gRPC wire format";
  auto stub = proto::ElementService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  auto call = [&](int64_t max_elements, proto::GetElementResponse* resp) {
    proto::GetElementRequest req;
    req.set_task_id(kBatch);
    if (max_elements > 0) {
      req.set_max_elements(max_elements);
      req.set_max_bytes(1 << 20);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub->GetElement(&ctx, req, resp);
  };
  proto::GetElementResponse old;
  ASSERT_TRUE(call(0, &old).ok());
  EXPECT_FALSE(old.frame().empty());
  EXPECT_EQ(old.more_size(), 0);
  proto::GetElementResponse batch;
  ASSERT_TRUE(call(3, &batch).ok());
  EXPECT_FALSE(batch.frame().empty());
  ASSERT_EQ(batch.more_size(), 2);
  EXPECT_EQ(batch.more(1).split_index(), 20);
  EXPECT_TRUE(batch.more(0).has_key());
}

TEST_P(ConformanceTest, ManyAsyncRequestsInFlightAllComplete) {
  for (int i = 0; i < 16; ++i) elements_.push_back({Pattern(1000 + i * 9000, i)});
  constexpr int kRequests = 400;
  std::atomic<int> ok{0}, done{0};
  absl::Notification all;
  for (int k = 0; k < kRequests; ++k) {
    ElementRequest r;
    r.task_id = k % 16;
    r.wait = absl::ZeroDuration();
    transport_->GetElementAsync(r, [&, id = r.task_id](absl::StatusOr<ElementResult> got) {
      if (got.ok() && got->elements.size() == 1 && ElementsEqual(got->elements[0], elements_[id])) {
        ok++;
      }
      if (++done == kRequests) all.Notify();
    });
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(120))) << done.load() << " done";
  EXPECT_EQ(ok.load(), kRequests);
}

TEST_P(ConformanceTest, CancelCompletesWaitingRequestsWithCancelledPromptly) {
  auto fut = GetBlocked();
  transport_->Cancel();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "hang";
  EXPECT_STATUS(fut.get(), absl::StatusCode::kCancelled, "cancelled");
  // Later requests are refused at once.
  EXPECT_STATUS(Get(kEndOfSequence), absl::StatusCode::kCancelled, "cancelled");
}

TEST_P(ConformanceTest, DestroyingATransportRunsEveryCallbackFirst) {
  constexpr int kRequests = 6;
  std::atomic<int> callbacks{0};
  for (int i = 0; i < kRequests; ++i) {
    ElementRequest r;
    r.task_id = kBlock;
    r.wait = absl::Seconds(5);
    transport_->GetElementAsync(r, [&](absl::StatusOr<ElementResult>) { callbacks++; });
  }
  AwaitBlocked(kRequests);
  sluice_test::WithHangGuard([&] { transport_.reset(); });
  EXPECT_EQ(callbacks.load(), kRequests);
}

TEST_P(ConformanceTest, AStoppedServerFailsRequestsInsteadOfHanging) {
  auto fut = GetBlocked();
  Release();  // the source returns, so Stop can join its thread
  sluice_test::WithHangGuard([&] { server_->Stop(); });
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "hang";
  auto r = fut.get();
  // Either the reply made it out before the server closed, or the request
  // failed as a lost peer does (the client retries those elsewhere).
  if (!r.ok()) {
    EXPECT_TRUE(absl::IsUnavailable(r.status()) || absl::IsCancelled(r.status())) << r.status();
  }
  auto later = Get(kEndOfSequence);
  ASSERT_FALSE(later.ok());
  EXPECT_TRUE(absl::IsUnavailable(later.status()) || absl::IsDeadlineExceeded(later.status()))
      << later.status();
}

TEST_P(ConformanceTest, NothingListeningIsUnavailable) {
  std::string address = server_->address();
  server_->Stop();
  auto t = Connect(address, "");
  if (!t.ok()) {  // refusing at connect time is fine too
    EXPECT_TRUE(absl::IsUnavailable(t.status())) << t.status();
    return;
  }
  transport_ = *std::move(t);
  auto r = Get(kEndOfSequence);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status()))
      << r.status();
}

TEST_P(ConformanceTest, AServerWithATokenServesOnlyRequestsThatCarryIt) {
  ASSERT_OK_AND_ASSIGN(auto guarded, StartServer("s3cret-token"));
  const int before = served_.load();
  for (const std::string token : {"", "wrong-token", "s3cret-toke", "s3cret-token-"}) {
    SCOPED_TRACE(token);
    ASSERT_OK_AND_ASSIGN(auto t, Connect(guarded->address(), token));
    ElementRequest r;
    r.task_id = kEndOfSequence;
    EXPECT_STATUS(t->GetElement(r), absl::StatusCode::kUnauthenticated,
                  token.empty() ? "no auth token" : "wrong auth token");
  }
  EXPECT_EQ(served_.load(), before) << "a refused request reached the source";
  ASSERT_OK_AND_ASSIGN(auto good, Connect(guarded->address(), "s3cret-token"));
  ElementRequest r;
  r.task_id = kEndOfSequence;
  ASSERT_OK_AND_ASSIGN(ElementResult got, good->GetElement(r));
  EXPECT_TRUE(got.end_of_sequence);
  // A server without a token takes any.
  ASSERT_OK_AND_ASSIGN(auto any, Connect(server_->address(), "whatever"));
  EXPECT_OK(any->GetElement(r));
  guarded->Stop();
}

TEST_P(ConformanceTest, ServerErrorsAreCounted) {
  EXPECT_EQ(server_->stats().serve_errors, 0);
  EXPECT_FALSE(Get(kInvalid).ok());
  EXPECT_FALSE(Get(kPrecondition).ok());
  EXPECT_TRUE(Get(kEndOfSequence).ok());
  EXPECT_EQ(server_->stats().serve_errors, 2);
}

INSTANTIATE_TEST_SUITE_P(Protocols, ConformanceTest,
                         ::testing::ValuesIn(internal::TransportProtocolNames()),
                         [](const auto& info) { return info.param; });

TEST(TransportRegistryTest, UnknownNamesAreRefusedNamingTheKnownOnes) {
  EXPECT_STATUS(internal::FindTransportProtocol("rdma", "Distribute"),
                absl::StatusCode::kInvalidArgument,
                "Distribute: unknown data_transfer_protocol 'rdma'; expected one of grpc, ucx");
  EXPECT_STATUS(internal::FindTransportProtocol("", "worker"), absl::StatusCode::kInvalidArgument,
                "worker: unknown data_transfer_protocol ''");
}

TEST(TransportRegistryTest, AProtocolRegistersOnceAndNeedsItsFactories) {
  TransportProtocol empty;
  empty.name = "grpc";
  EXPECT_STATUS(internal::RegisterTransportProtocol(empty), absl::StatusCode::kInvalidArgument,
                "needs a name");
  const TransportProtocol* grpc = *internal::FindTransportProtocol("grpc", "test");
  EXPECT_STATUS(internal::RegisterTransportProtocol(*grpc), absl::StatusCode::kAlreadyExists,
                "'grpc' is already registered");
  // A new protocol (here gRPC under another name) is found by its name
  // and listed.
  TransportProtocol alias = *grpc;
  alias.name = "grpc-alias";
  ASSERT_OK(internal::RegisterTransportProtocol(alias));
  ASSERT_OK_AND_ASSIGN(const TransportProtocol* found,
                       internal::FindTransportProtocol("grpc-alias", "test"));
  EXPECT_EQ(found->name, "grpc-alias");
  EXPECT_THAT(internal::TransportProtocolNames(), ::testing::Contains("grpc-alias"));
}

}  // namespace
}  // namespace sluice
