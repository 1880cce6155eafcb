// ElementServer: how a worker serves elements to clients, the other half of
// ElementTransport. A worker runs one for the protocol it advertises and
// always one for gRPC (the fallback every client can use); both answer
// from the same transport-agnostic ElementSource (the worker core,
// worker/worker_core.h). transport_registry.h builds them by protocol name.
//
// Served frames: a worker encodes each element once, into a FrameBuffer
// from the primary server's allocator (registered memory for UCX), and any
// server sends it from there.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/rpc/security.h"
#include "sluice/dataplane/element_transport.h"

namespace grpc {
class Service;
}  // namespace grpc

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

// Replaces `frame` with a copy compressed with `codec` (a contiguous
// frame on the heap, core/frame.h) when that saves bytes; leaves it as it
// is otherwise (incompressible elements, or kNone).
absl::Status CompressServedFrame(FrameCodec codec, FrameBuffer* frame);

// Writes `frame` as one contiguous frame of frame.frame_size() bytes at
// `out` (for transports that copy into their message anyway, like gRPC).
void WriteFrame(const FrameBuffer& frame, uint8_t* out);

// The answer to one request: frames in order, or one of the flags; `seq`
// as in ElementResult.
struct ServedBatch {
  std::vector<FrameBuffer> frames;
  int64_t seq = -1;
  bool end_of_sequence = false;
  bool not_ready = false;
  bool resent = false;  // see ElementResult::resent
};
// Produces the answer to one request; may block up to request.wait. Called
// on a server's own threads, never on a transport's event thread.
using ElementSource = std::function<absl::StatusOr<ServedBatch>(const ElementRequest&)>;

struct ElementServerOptions {
  // Where a server with its own listener listens, "host:port" (port 0
  // picks one).
  std::string listen_address;
  ElementSource source;
  // Threads that call `source` (a request may wait there up to its wait).
  int threads = 16;
  // Binds the send pool and the progress thread (UCX).
  DataPlanePlacement placement;
  // Required in every request when not empty; a request without it is
  // answered Unauthenticated and never reaches `source`.
  std::string auth_token;
  // Transports served through gRPC: when set, the server adds its service
  // here (the worker's gRPC server, before it starts) and address() is
  // empty, meaning the worker's own address. Otherwise the server runs its
  // own gRPC server on listen_address, with `tls`.
  std::function<void(grpc::Service*)> add_grpc_service;
  TlsConfig tls;
  // Names the server in errors ("worker host:port"; called when an error
  // is built, so a hosted server can name an address bound after it was
  // created); empty: "worker".
  std::function<std::string()> name;
};

// Counters of one server since it started.
struct ElementServerStats {
  // Requests `source` answered with an error (a stopped task's Cancelled
  // excluded).
  int64_t serve_errors = 0;
  // Payload bytes copied to send (0 where frames go out from where they
  // were encoded).
  int64_t bytes_copied = 0;
};

class ElementServer {
 public:
  virtual ~ElementServer() = default;
  // What it implements ("grpc", "ucx"), for logs and tests. (A worker
  // advertises the name its protocol is registered under.)
  virtual std::string protocol() const = 0;
  // The "host:port" clients read at; empty: the worker's own address (the
  // server is hosted by the worker's gRPC server).
  virtual std::string address() const = 0;
  // Where the worker encodes the frames this server sends best.
  virtual FrameAllocator frame_allocator() const { return HeapFrameAllocator(); }
  virtual ElementServerStats stats() const = 0;
  // Stops accepting and answering, and joins every thread of the server.
  // Idempotent; the destructor calls it.
  virtual void Stop() = 0;
};

}  // namespace sluice::internal
