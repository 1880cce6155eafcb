// Page-locking the client's UCX receive arenas for CUDA, against an
// injected CUDA runtime table (no GPU, no libcudart needed). Each test runs
// in its own process (ctest), as pinning is process-wide once on.
#include <cstring>
#include <map>

#include "absl/synchronization/mutex.h"
#include "sluice/core/status.h"
#include "sluice/dataplane/cuda_runtime.h"
#include "sluice/dataplane/element_server.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/transport_registry.h"
#include "tests/test_util.h"

namespace sluice {
namespace {

using internal::CudaRuntime;
using sluice_test::Pattern;

// The fake runtime's state (plain functions in the table reach it here).
struct Fake {
  absl::Mutex mu;
  int devices = 1;
  int device_count_error = 0;
  int register_error = 0;
  std::map<void*, size_t> registered;  // live registrations
  int registrations = 0;
  unsigned flags = 0;
  // Copies run at once (host memory stands for the device); host functions
  // wait here until the test "completes" the stream.
  std::vector<std::pair<void (*)(void*), void*>> host_funcs;
  std::vector<void*> copy_streams;
  int launch_error = 0;
  int syncs = 0;
};
Fake& F() {
  static Fake* f = new Fake();
  return *f;
}

CudaRuntime FakeRuntime() {
  CudaRuntime rt;
  rt.library = "fake-cudart";
  rt.get_device_count = [](int* count) {
    absl::MutexLock l(&F().mu);
    *count = F().devices;
    return F().device_count_error;
  };
  rt.host_register = [](void* p, size_t bytes, unsigned flags) {
    absl::MutexLock l(&F().mu);
    if (F().register_error != 0) return F().register_error;
    F().registered[p] = bytes;
    F().registrations++;
    F().flags = flags;
    return 0;
  };
  rt.host_unregister = [](void* p) {
    absl::MutexLock l(&F().mu);
    F().registered.erase(p);
    return 0;
  };
  rt.get_error_string = [](int e) { return e == 100 ? "no CUDA-capable device is detected" : "x"; };
  rt.memcpy_async = [](void* dst, const void* src, size_t bytes, int kind, void* stream) {
    absl::MutexLock l(&F().mu);
    if (kind != internal::kCudaMemcpyHostToDevice) return 21;  // cudaErrorInvalidMemcpyDirection
    std::memcpy(dst, src, bytes);
    F().copy_streams.push_back(stream);
    return 0;
  };
  rt.launch_host_func = [](void*, void (*fn)(void*), void* arg) {
    absl::MutexLock l(&F().mu);
    if (F().launch_error != 0) return F().launch_error;
    F().host_funcs.push_back({fn, arg});
    return 0;
  };
  rt.stream_synchronize = [](void*) {
    absl::MutexLock l(&F().mu);
    F().syncs++;
    return 0;
  };
  return rt;
}

// A UCX server answering task i with elements_[i], and a transport to it.
struct Loop {
  std::vector<Element> elements;
  std::unique_ptr<internal::ElementServer> server;
  std::unique_ptr<ElementTransport> transport;

  absl::Status Start() {
    SLUICE_ASSIGN_OR_RETURN(const internal::TransportProtocol* ucx,
                            internal::FindTransportProtocol("ucx", "test"));
    internal::ElementServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.source = [this](const ElementRequest& r) -> absl::StatusOr<internal::ServedBatch> {
      internal::ServedBatch out;
      auto f = internal::EncodeServedFrame(elements.at(r.task_id), server->frame_allocator());
      if (!f.ok()) return f.status();
      out.frames.push_back(*std::move(f));
      return out;
    };
    SLUICE_ASSIGN_OR_RETURN(server, ucx->serve(std::move(o)));
    SLUICE_ASSIGN_OR_RETURN(transport, ucx->connect(server->address(), {}));
    return absl::OkStatus();
  }
  absl::StatusOr<Element> Get(int64_t task) {
    ElementRequest r;
    r.task_id = task;
    SLUICE_ASSIGN_OR_RETURN(ElementResult got, transport->GetElement(r));
    if (got.elements.size() != 1) return absl::InternalError("expected one element");
    return got.elements[0];
  }
  ~Loop() {
    transport.reset();
    if (server) server->Stop();
  }
};

TEST(CudaPinningTest, EachArenaIsPinnedOnceIncludingThoseMadeBeforePinningWasAsked) {
  static const CudaRuntime rt = FakeRuntime();
  internal::SetCudaRuntimeForTesting(&rt);
  Loop loop;
  for (int i = 0; i < 6; ++i) loop.elements.push_back({Pattern(size_t{3} << 20, i)});
  ASSERT_OK(loop.Start());
  // An arena exists before pinning is asked for: it is pinned then.
  ASSERT_OK_AND_ASSIGN(Element first, loop.Get(0));
  EXPECT_EQ(F().registrations, 0);
  ASSERT_OK(PinUcxReceivePoolForCuda());
  EXPECT_GE(F().registrations, 1);
  std::vector<Element> held = {first};
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 6; ++i) {
      ASSERT_OK_AND_ASSIGN(Element e, loop.Get(i));
      EXPECT_TRUE(ElementsEqual(e, loop.elements[i]));
      held.push_back(std::move(e));
    }
    held.clear();  // arenas come back and are reused, not pinned again
  }
  const TransportStats s = GetTransportStats();
  EXPECT_GT(s.receive_pool_cuda_pinned_bytes, 0);
  EXPECT_EQ(s.receive_pool_cuda_pinned_bytes, s.receive_pool_registered_bytes);
  EXPECT_EQ(s.cuda_pin_failures, 0);
  absl::MutexLock l(&F().mu);
  size_t bytes = 0;
  for (const auto& [p, n] : F().registered) bytes += n;
  EXPECT_EQ(static_cast<int64_t>(bytes), s.receive_pool_registered_bytes);
  EXPECT_EQ(F().registrations, static_cast<int>(F().registered.size())) << "an arena pinned twice";
  EXPECT_EQ(F().flags, internal::kCudaHostRegisterPortable);
}

TEST(CudaPinningTest, AskingAgainIsANoOp) {
  static const CudaRuntime rt = FakeRuntime();
  internal::SetCudaRuntimeForTesting(&rt);
  ASSERT_OK(PinUcxReceivePoolForCuda());
  Loop loop;
  loop.elements.push_back({Pattern(1000, 1)});
  ASSERT_OK(loop.Start());
  ASSERT_OK(loop.Get(0).status());
  const int before = F().registrations;
  EXPECT_EQ(before, 1);
  ASSERT_OK(PinUcxReceivePoolForCuda());
  EXPECT_EQ(F().registrations, before);
}

TEST(CudaPinningTest, WithoutARuntimeOrAGpuItIsFailedPreconditionSayingWhy) {
  internal::SetCudaRuntimeForTesting(nullptr);
  EXPECT_STATUS(PinUcxReceivePoolForCuda(), absl::StatusCode::kFailedPrecondition,
                "no CUDA runtime");
  static const CudaRuntime rt = FakeRuntime();
  internal::SetCudaRuntimeForTesting(&rt);
  {
    absl::MutexLock l(&F().mu);
    F().devices = 0;
  }
  EXPECT_STATUS(PinUcxReceivePoolForCuda(), absl::StatusCode::kFailedPrecondition,
                "reports no GPU");
  {
    absl::MutexLock l(&F().mu);
    F().device_count_error = 100;
  }
  EXPECT_STATUS(PinUcxReceivePoolForCuda(), absl::StatusCode::kFailedPrecondition,
                "no CUDA-capable device is detected (cudaError 100)");
  EXPECT_EQ(GetTransportStats().receive_pool_cuda_pinned_bytes, 0);
}

TEST(CudaPinningTest, AnArenaTheRuntimeRefusesIsUsedUnpinnedAndCounted) {
  static const CudaRuntime rt = FakeRuntime();
  internal::SetCudaRuntimeForTesting(&rt);
  {
    absl::MutexLock l(&F().mu);
    F().register_error = 2;  // cudaErrorMemoryAllocation
  }
  ASSERT_OK(PinUcxReceivePoolForCuda());
  Loop loop;
  loop.elements.push_back({Pattern(5000, 3)});
  ASSERT_OK(loop.Start());
  ASSERT_OK_AND_ASSIGN(Element e, loop.Get(0));
  EXPECT_TRUE(ElementsEqual(e, loop.elements[0]));
  const TransportStats s = GetTransportStats();
  EXPECT_GE(s.cuda_pin_failures, 1);
  EXPECT_EQ(s.receive_pool_cuda_pinned_bytes, 0);
}

// The stream reaches the host functions enqueued so far.
void CompleteStream() {
  std::vector<std::pair<void (*)(void*), void*>> fns;
  {
    absl::MutexLock l(&F().mu);
    fns.swap(F().host_funcs);
  }
  for (auto& [fn, arg] : fns) fn(arg);
}

TEST(CudaCopyTest, AnElementsSlotStaysAliveUntilItsCopyCompleted) {
  static const CudaRuntime rt = FakeRuntime();
  internal::SetCudaRuntimeForTesting(&rt);
  ASSERT_OK(PinUcxReceivePoolForCuda());
  Loop loop;
  loop.elements.push_back({Pattern(size_t{1} << 20, 5)});
  ASSERT_OK(loop.Start());
  const int64_t idle = GetTransportStats().pool_buffers_in_use;
  std::vector<uint8_t> device(size_t{1} << 20);
  void* const stream = reinterpret_cast<void*>(0x5eed);
  {
    ASSERT_OK_AND_ASSIGN(Element e, loop.Get(0));
    EXPECT_EQ(GetTransportStats().pool_buffers_in_use, idle + 1);
    ASSERT_OK(CopyToDeviceAsync(e[0], device.data(), stream));
  }  // the caller dropped the element; the copy still holds its slot
  EXPECT_EQ(GetTransportStats().pool_buffers_in_use, idle + 1) << "slot released before the copy";
  EXPECT_EQ(std::memcmp(device.data(), loop.elements[0][0].data(), device.size()), 0);
  {
    absl::MutexLock l(&F().mu);
    ASSERT_EQ(F().copy_streams.size(), 1u);
    EXPECT_EQ(F().copy_streams[0], stream);
  }
  CompleteStream();
  EXPECT_EQ(GetTransportStats().pool_buffers_in_use, idle);
}

TEST(CudaCopyTest, WithoutAHostFunctionItWaitsForTheStreamAndStringsAreRefused) {
  static const CudaRuntime rt = FakeRuntime();
  internal::SetCudaRuntimeForTesting(&rt);
  {
    absl::MutexLock l(&F().mu);
    F().launch_error = 1;
  }
  Tensor t = Pattern(4096, 1);
  std::vector<uint8_t> device(4096);
  ASSERT_OK(CopyToDeviceAsync(t, device.data()));
  EXPECT_EQ(F().syncs, 1);
  EXPECT_TRUE(F().host_funcs.empty());
  EXPECT_STATUS(CopyToDeviceAsync(Tensor::Strings({"a"}), device.data()),
                absl::StatusCode::kInvalidArgument, "string tensor");
  internal::SetCudaRuntimeForTesting(nullptr);
  EXPECT_STATUS(CopyToDeviceAsync(t, device.data()), absl::StatusCode::kFailedPrecondition,
                "no CUDA runtime");
}

}  // namespace
}  // namespace sluice
