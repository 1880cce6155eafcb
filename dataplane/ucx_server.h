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

struct ServedElement {
  std::string frame;  // an encoded element when neither flag is set
  bool end_of_sequence = false;
  bool not_ready = false;
};
// Produces the answer to one request; may block up to request.wait. Called
// on the server's own threads, never on the UCX progress thread.
using ElementSource = std::function<absl::StatusOr<ServedElement>(const ElementRequest&)>;

class UcxElementServer {
 public:
  // Listens on "host:port" (port 0 picks one).
  static absl::StatusOr<std::unique_ptr<UcxElementServer>> Start(const std::string& host_port,
                                                                 ElementSource source,
                                                                 int threads = 4);
  ~UcxElementServer();
  // The bound "host:port" clients connect to.
  std::string address() const;
  // Stops accepting, closes endpoints, joins every thread. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit UcxElementServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::internal
