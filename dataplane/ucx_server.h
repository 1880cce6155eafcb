// The worker side of the UCX data plane: a ucp_listener that answers
// GetElement active messages with element frames. No UCX types here, so the
// worker module can use it without UCX headers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/dataplane/element_transport.h"

namespace sluice::internal {

// One encoded element frame. When `memh` is set the bytes live in memory
// registered with UCX (an opaque ucp_mem_h), so a rendezvous send needs no
// registration and no packing copy. `owner` keeps the bytes alive.
//
// A split frame (payload != nullptr) holds only the frame header (64-byte
// padded) at data/size; its payload area is elsewhere, typically a
// tensor's own memory, and is sent from there without an encoding copy.
// payload_size is the tensor's byte size: the frame's trailing alignment
// padding (< 64 bytes of zeros) is implied, not stored.
struct FrameBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  void* memh = nullptr;
  std::shared_ptr<void> owner;
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;
  SplitPosition position;  // see ElementResult::positions
  size_t frame_size() const;  // the decoded frame's size, padding included
};
// Allocates a frame buffer of `size` bytes (may be called from any thread).
using FrameAllocator = std::function<absl::StatusOr<FrameBuffer>(size_t size)>;
FrameAllocator HeapFrameAllocator();

// Elements at least this large that consist of one fixed-size tensor are
// served as split frames (their payload is never copied on the worker).
inline constexpr size_t kZeroCopyPayloadBytes = size_t{64} << 10;

// Encodes `element` into a frame: a split frame viewing the tensor when it
// qualifies (see kZeroCopyPayloadBytes), else a full frame from `alloc`.
absl::StatusOr<FrameBuffer> EncodeServedFrame(const Element& element, const FrameAllocator& alloc);

// Writes `frame` as one contiguous frame of frame.frame_size() bytes at
// `out` (for the gRPC path, which copies into its message anyway).
void WriteFrame(const FrameBuffer& frame, uint8_t* out);

// The answer to one request: frames in order, or one of the flags; `seq`
// as in ElementResult.
struct ServedBatch {
  std::vector<FrameBuffer> frames;
  int64_t seq = -1;
  bool end_of_sequence = false;
  bool not_ready = false;
};
// Produces the answer to one request; may block up to request.wait. Called
// on the server's own threads, never on the UCX progress thread.
using ElementSource = std::function<absl::StatusOr<ServedBatch>(const ElementRequest&)>;

class UcxElementServer {
 public:
  // Listens on "host:port" (port 0 picks one).
  // `placement` binds the send pool and the progress thread. A non-empty
  // `auth_token` is required in every request (ucx_protocol.h); requests
  // without it get an Unauthenticated error reply and never reach `source`.
  static absl::StatusOr<std::unique_ptr<UcxElementServer>> Start(
      const std::string& host_port, ElementSource source, int threads = 4,
      DataPlanePlacement placement = {}, std::string auth_token = "");
  ~UcxElementServer();
  // The bound "host:port" clients connect to.
  std::string address() const;
  // Allocates frames in this server's registered send pool (slots reused
  // once every reference to a frame is gone).
  FrameAllocator frame_allocator() const;
  // Stops accepting, closes endpoints, joins every thread. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit UcxElementServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::internal
