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
      SLUICE_RETURN_IF_ERROR(internal::CompressServedFrame(r.compression, &*f));
      out.frames.push_back(*std::move(f));
      return out;
    };
    SLUICE_ASSIGN_OR_RETURN(server, ucx->serve(std::move(o)));
    SLUICE_ASSIGN_OR_RETURN(transport, ucx->connect(server->address(), {}));
    return absl::OkStatus();
  }
  // `received`: the bytes that crossed the wire.
  absl::StatusOr<Element> Get(int64_t task, FrameCodec codec = FrameCodec::kNone,
                              size_t* received = nullptr) {
    ElementRequest r;
    r.task_id = task;
    r.compression = codec;
    SLUICE_ASSIGN_OR_RETURN(ElementResult got, transport->GetElement(r));
    if (got.elements.size() != 1) return absl::InternalError("expected one element");
    if (received != nullptr) *received = got.bytes;
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

// Whether [p, p + bytes) lies in memory the fake runtime pinned.
bool Pinned(const void* p, size_t bytes) {
  absl::MutexLock l(&F().mu);
  const auto* c = static_cast<const uint8_t*>(p);
  for (const auto& [base, size] : F().registered) {
    const auto* b = static_cast<const uint8_t*>(base);
    if (c >= b && c + bytes <= b + size) return true;
  }
  return false;
}

// A compressed element decompresses into the receive pool's (pinned)
// arenas, as an uncompressed one lands there: a GPU trainer copies it to
// the device from page-locked memory either way.
TEST(CudaPinningTest, ACompressedElementDecompressesIntoAPinnedArena) {
  static const CudaRuntime rt = FakeRuntime();
  internal::SetCudaRuntimeForTesting(&rt);
  ASSERT_OK(PinUcxReceivePoolForCuda());
  Loop loop;
  std::vector<uint8_t> v(size_t{1} << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i % 16);
  loop.elements.push_back({Tensor::FromVector<uint8_t>(v)});
  ASSERT_OK(loop.Start());
  const int64_t idle = GetTransportStats().pool_buffers_in_use;
  for (FrameCodec codec : {FrameCodec::kLz4, FrameCodec::kZstd}) {
    SCOPED_TRACE(FrameCodecName(codec));
    size_t received = 0;
    ASSERT_OK_AND_ASSIGN(Element e, loop.Get(0, codec, &received));
    EXPECT_LT(received, v.size() / 8) << "not compressed on the wire";
    ASSERT_EQ(e[0].byte_size(), v.size());
    EXPECT_EQ(std::memcmp(e[0].data(), v.data(), v.size()), 0);
    EXPECT_TRUE(Pinned(e[0].data(), v.size())) << "decompressed outside the pinned arenas";
    // The element holds its arena slot (the compressed reply's went back).
    EXPECT_EQ(GetTransportStats().pool_buffers_in_use, idle + 1);
  }
  EXPECT_EQ(GetTransportStats().pool_buffers_in_use, idle);
}

// With no room in the pool within its cap, a compressed element
// decompresses on the heap: never a buffer registered for it alone.
TEST(CudaPinningTest, ACompressedElementPastThePoolsCapDecompressesOnTheHeap) {
  ASSERT_OK(SetUcxReceivePoolBytes(size_t{1} << 20));  // less than an arena
  Loop loop;
  std::vector<uint8_t> v(size_t{2} << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i % 7);
  loop.elements.push_back({Tensor::FromVector<uint8_t>(v)});
  ASSERT_OK(loop.Start());
  const int64_t dedicated = GetTransportStats().dedicated_buffer_allocations;
  ASSERT_OK_AND_ASSIGN(Element e, loop.Get(0, FrameCodec::kZstd));
  ASSERT_EQ(e[0].byte_size(), v.size());
  EXPECT_EQ(std::memcmp(e[0].data(), v.data(), v.size()), 0);
  // A dedicated buffer received the compressed reply (run alone: no arena
  // fits under the cap); none was made to decompress into.
  EXPECT_LE(GetTransportStats().dedicated_buffer_allocations, dedicated + 1);
  ASSERT_OK(SetUcxReceivePoolBytes(size_t{1} << 30));  // the default
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
