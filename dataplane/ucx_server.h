// The worker side of the UCX data plane: a ucp_listener that answers
// GetElement active messages with element frames. No UCX types here, so the
// worker module can use it without UCX headers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/dataplane/element_server.h"

namespace sluice::internal {

class UcxElementServer final : public ElementServer {
 public:
  // Listens on options.listen_address ("host:port"; port 0 picks one).
  // options.placement binds the send pool and the progress thread. A
  // non-empty options.auth_token is required in every request
  // (ucx_protocol.h); requests without it get an Unauthenticated error
  // reply and never reach the source.
  static absl::StatusOr<std::unique_ptr<UcxElementServer>> Start(ElementServerOptions options);
  ~UcxElementServer() override;
  std::string protocol() const override { return "ucx"; }
  // The bound "host:port" clients connect to.
  std::string address() const override;
  // Allocates frames in this server's registered send pool (slots reused
  // once every reference to a frame is gone).
  FrameAllocator frame_allocator() const override;
  // bytes_copied: small frames packed into one registered blob for a
  // batched reply (single frames go out from where they were encoded).
  ElementServerStats stats() const override;
  // Stops accepting, closes endpoints, joins every thread. Idempotent.
  void Stop() override;

  struct Impl;

 private:
  explicit UcxElementServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::internal
