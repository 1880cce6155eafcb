// The worker side of the UCX data plane: a ucp_listener that answers
// GetElement active messages with element frames. No UCX types here, so the
// worker module can use it without UCX headers.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "sluice/dataplane/element_transport.h"

namespace sluice::internal {

// One encoded element frame. When `memh` is set the bytes live in memory
// registered with UCX (an opaque ucp_mem_h), so a rendezvous send needs no
// registration and no packing copy. `owner` keeps the bytes alive.
struct FrameBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  void* memh = nullptr;
  std::shared_ptr<void> owner;
};
// Allocates a frame buffer of `size` bytes (may be called from any thread).
using FrameAllocator = std::function<absl::StatusOr<FrameBuffer>(size_t size)>;
FrameAllocator HeapFrameAllocator();

struct ServedElement {
  FrameBuffer frame;  // an encoded element when neither flag is set
  bool end_of_sequence = false;
  bool not_ready = false;
  int64_t split_id = -1, split_index = -1;  // see ElementResult
};
// Produces the answer to one request; may block up to request.wait. Called
// on the server's own threads, never on the UCX progress thread.
using ElementSource = std::function<absl::StatusOr<ServedElement>(const ElementRequest&)>;

class UcxElementServer {
 public:
  // Listens on "host:port" (port 0 picks one).
  // `placement` binds the send pool and the progress thread.
  static absl::StatusOr<std::unique_ptr<UcxElementServer>> Start(
      const std::string& host_port, ElementSource source, int threads = 4,
      DataPlanePlacement placement = {});
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
