// ElementTransport: how a client pulls elements from one worker. The gRPC
// implementation (ElementService.GetElement) is the baseline and fallback;
// the UCX implementation plugs in behind the same interface. Code above it
// (the data-service iterator) does not know which one it uses.
//
// Requests are asynchronous: GetElementAsync sends one and returns; its
// callback runs when the reply (or the failure) is in, on a transport
// thread -- a UCX pass (the progress thread, or a consumer waiting for
// replies that drives it), a gRPC callback thread -- so many
// requests can be in flight without a thread each. GetElement waits for
// one (tests, simple callers).
//
// Thread safety: any method may be called from any thread, concurrently;
// Cancel() makes in-flight and later requests complete with Cancelled
// promptly.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sluice/rpc/security.h"
#include "sluice/core/frame.h"
#include "sluice/core/tensor.h"

namespace sluice {

// A client's acknowledgement: it received `count` more elements of a split
// from the task (distributed_epoch; the worker completes a split only once
// its elements are acknowledged).
struct SplitAck {
  int64_t split_id = -1;
  int64_t count = 0;
};
inline constexpr size_t kMaxAcksPerRequest = 64;
// What one gRPC reply batches at most (ElementRequest::max_elements and
// max_bytes are clamped to these): the reply stays one modest message.
inline constexpr int64_t kMaxGrpcBatchElements = 256;
inline constexpr int64_t kMaxGrpcBatchBytes = int64_t{256} << 10;

// A reply may take a request's wait plus this long (its transfer) before the
// request fails with DeadlineExceeded, on every transport: the default of
// ElementRequest::transfer_allowance.
inline constexpr absl::Duration kReplyTransferAllowance = absl::Seconds(30);

struct ElementRequest {
  int64_t task_id = 0;
  int64_t consumer_index = -1;
  int64_t round = -1;
  // The consumer asking: its iteration client id (0: anonymous). The worker
  // numbers each consumer's elements of a task in the order it hands them
  // out (ElementResult::seq) and counts the consumers reading a task.
  int64_t client_id = 0;
  // How many requests this consumer may have in flight at once, and whether
  // other consumers may read the same task (its job has a name): together
  // they bound a batch to the consumer's fair share (worker/task_runner.h).
  int64_t max_outstanding = 1;
  bool shared_job = false;
  // How long the worker may hold the call waiting for an element.
  absl::Duration wait = absl::Milliseconds(500);
  // How much longer the reply may take (its transfer) before the request
  // fails with DeadlineExceeded.
  absl::Duration transfer_allowance = kReplyTransferAllowance;
  // Batching: the worker may answer with up to max_elements elements that
  // are ready at once, as long as their frames total at most max_bytes (the
  // first element is always sent, whatever its size). The worker never
  // waits to fill a batch. Both transports batch (gRPC within
  // kMaxGrpcBatchElements and kMaxGrpcBatchBytes).
  int64_t max_elements = 1;
  int64_t max_bytes = 0;
  // At most kMaxAcksPerRequest, for this task.
  std::vector<SplitAck> acks;
  // Redelivery (first come, first served; client_id != 0): the consumer
  // holds every element of the task below `delivered_seq` (-1: says
  // nothing), so the worker may forget those it kept for redelivery. With
  // `resend`, a reply may have been lost in transit: the worker answers
  // with the elements it handed this consumer from delivered_seq on, at
  // most to the end of the reply that first carried them (ElementResult::
  // resent), or DataLoss when it no longer holds them; with none to
  // resend it answers as usual.
  int64_t delivered_seq = -1;
  bool resend = false;
  // The consumer is going away (its iterator closed; client_id != 0): the
  // worker counts what it handed it and it never received as delivered
  // (with the acks carried, its splits can complete now rather than after
  // the ack timeout), forgets it as a reader of the task, and answers
  // not_ready.
  bool leaving = false;
  // Compress the reply's frames with this codec where it saves bytes
  // (DistributeOptions::compression; core/frame.h). The client's transport
  // decompresses them.
  FrameCodec compression = FrameCodec::kNone;
};

// Where an element came from: its split and index in the split's output
// (distributed_epoch, split-tracked pipelines; -1 otherwise) and its key
// on the worker (Iterator::ElementKey, when the pipeline keeps one), which
// the client's iterator reports, so that a random op after Distribute
// draws the same whatever worker produced the element.
struct SplitPosition {
  int64_t split_id = -1;
  int64_t index = -1;
  std::optional<uint64_t> key;
  // With split_id: the split's source range (proto::SplitProto epoch, begin,
  // end), what a service checkpoint records (docs/checkpointing.md).
  int64_t epoch = 0, begin = 0, end = 0;
};

struct ElementResult {
  bool end_of_sequence = false;
  bool not_ready = false;  // nothing yet; ask again
  // At least one element unless a flag is set, in the task's order.
  std::vector<Element> elements;
  // The consumer's sequence number (see ElementRequest::client_id) of
  // elements[0]; the others follow it (seq + 1, ...). A client delivers a
  // task's replies in seq order. With end_of_sequence: how many elements
  // the worker handed this consumer in all. -1 otherwise, or when the
  // worker keeps no order for the request (coordinated rounds).
  int64_t seq = -1;
  // The elements were handed out before, in a reply that may have been
  // lost (ElementRequest::resend).
  bool resent = false;
  size_t bytes = 0;  // frame bytes received
  // Parallel to `elements` (SplitPosition): for distributed_epoch
  // (split-tracked pipelines) the split each element came from and its
  // index in that split's output, -1 otherwise (the client drops a
  // (split_id, index) it already delivered); and each element's key.
  std::vector<SplitPosition> positions;
};

// Runs once per request with its outcome. It must not block (it may run on
// a transport's own thread, which serves every request of the process).
using ElementCallback = std::function<void(absl::StatusOr<ElementResult>)>;

class ElementTransport {
 public:
  virtual ~ElementTransport() = default;
  // Sends `request`; `done` runs exactly once with the reply or the failure:
  // Unavailable when the worker cannot be reached, DeadlineExceeded when no
  // reply came within request.wait plus a transfer allowance, Cancelled
  // after Cancel(); the worker's own errors (e.g. the dataset failed) pass
  // through with their codes. `done` may run on the calling thread before
  // this returns (a request refused at once), so a caller must not hold a
  // lock that `done` takes. Destroying the transport cancels what is in
  // flight; every callback has run when the destructor returns.
  virtual void GetElementAsync(const ElementRequest& request, ElementCallback done) = 0;
  // GetElementAsync, waiting for the outcome.
  absl::StatusOr<ElementResult> GetElement(const ElementRequest& request);
  virtual void Cancel() = 0;
  virtual std::string protocol() const = 0;
};

// A transport over the worker's gRPC WorkerService at "host:port", over TLS
// when security.tls is enabled and sending security.auth_token.
absl::StatusOr<std::unique_ptr<ElementTransport>> MakeGrpcElementTransport(
    const std::string& address, const ClientSecurity& security = {},
    int64_t max_element_bytes = kDefaultMaxElementBytes);

// Whether a UCX worker may send a small reply (at most 4 KiB of data) in
// its reply message, which the client copies once into its receive pool
// (counted in TransportStats::client_payload_bytes_copied), instead of by
// rendezvous (several messages: about twice the client's CPU per element
// when replies carry one small element each).
enum class EagerReplies {
  kNever,   // always by rendezvous, into the pool without a client copy
  // Where the rendezvous would copy anyway: once the endpoint's transports
  // are known (its first reply), if UcxRendezvousCopies (tcp: a small PUT's
  // data arrives with its header in UCX's receive buffer and UCX copies it
  // into the pool; shared memory (cma) and RDMA do not copy). The default.
  kAuto,
  kAlways,  // whatever the transports
};
// Whether a rendezvous on a UCX endpoint whose transports are `lanes` (as
// TransportStats::ucx_lanes describes them) lands its data by a copy
// anyway: every lane that carries rendezvous data (rma_bw) is tcp, or none
// does (UCX then sends the data as active-message fragments). False for
// shared memory (cma), RDMA, and unknown (empty) lanes. EagerReplies::kAuto
// asks for eager small replies where this holds.
bool UcxRendezvousCopies(absl::string_view lanes);
// "0": kNever, "1": kAlways, unset or "auto": kAuto; anything else is
// InvalidArgument naming the variable ($SLUICE_UCX_EAGER_REPLIES).
absl::StatusOr<EagerReplies> ParseEagerReplies(const char* value);

// A UCX endpoint to a worker's UCX listener at "host:port" (elements land
// in the process's preregistered receive pool). `auth_token` goes in every
// request; a worker that requires another answers Unauthenticated. UCX
// traffic is not encrypted (docs/security.md). Replies larger than 4 KiB
// always arrive by rendezvous, without a copy; smaller ones as `eager`
// says.
absl::StatusOr<std::unique_ptr<ElementTransport>> MakeUcxElementTransport(
    const std::string& address, const std::string& auth_token = "",
    int64_t max_element_bytes = kDefaultMaxElementBytes,
    EagerReplies eager = EagerReplies::kAuto);

// `primary` (UCX) until it fails with Unavailable/DeadlineExceeded before
// ever delivering a reply (it could not connect); then `fallback` (gRPC)
// for good, with a warning naming `peer`. The request that failed fails
// (the caller retries it, over the fallback): its reply may have been lost
// after the worker handed its elements out, so it is not sent again as it
// was, which would leave those elements a gap nobody asks to be resent.
// With allow_fallback = false the primary's error is returned instead.
// After a first success, errors pass through (a reset: the peer died, and
// switching paths would not help), except that two requests in a row left
// unanswered (DeadlineExceeded) switch too: the primary went silent to a
// peer that may still serve the fallback.
std::unique_ptr<ElementTransport> MakeFallbackTransport(std::unique_ptr<ElementTransport> primary,
                                                       std::unique_ptr<ElementTransport> fallback,
                                                       std::string peer, bool allow_fallback);

// Where a UCX data plane (the client's, or a worker's) puts its registered
// memory and its progress thread. Built by the client and worker modules
// from the topology policy (topology/topology.h); empty members mean "let
// UCX decide".
struct DataPlanePlacement {
  // Allocates memory to register (e.g. bound to a NUMA node, pages touched).
  std::function<absl::StatusOr<std::shared_ptr<uint8_t>>(size_t)> allocate;
  // True when [data, data+size) lives where intended (checked once per arena).
  std::function<bool(const void*, size_t)> verify;
  // Runs first on the progress thread (e.g. binds it to cpus).
  std::function<void()> on_progress_thread_start;
  std::string description;  // logged once
};

// Sets the client data plane's placement. Effective only before the first
// UCX transport of the process is created (later calls are ignored with a
// log line, since the pool already exists).
void SetClientDataPlanePlacement(DataPlanePlacement placement);

// Caps the process's UCX receive pool (registered arenas; default 1 GiB or
// $SLUICE_UCX_POOL_BYTES). At the cap, UCX requests wait until the user
// releases elements (backpressure); the replies already in flight, and
// elements too large for an arena, get dedicated buffers (counted in
// TransportStats). Takes effect for later allocations.
absl::Status SetUcxReceivePoolBytes(size_t bytes);

// Page-locks the client's UCX receive pool for CUDA: each arena is
// registered with cudaHostRegister once (those there now and those to
// come), so that copying a received element to a GPU runs at the link rate
// instead of through the driver's staging buffers. The CUDA runtime is
// loaded at run time (libcudart; $SLUICE_CUDART names it); without one, or
// with no GPU, FailedPrecondition saying which. Idempotent; process-wide.
// DistributeOptions::cuda_pinned calls it.
absl::Status PinUcxReceivePoolForCuda();

// Copies `tensor` (numeric; its bytes as they are) to `device_dst`, device
// memory of at least tensor.byte_size() bytes, on the CUDA stream `stream`
// (a cudaStream_t; null: the legacy default stream), asynchronously. The
// tensor's memory -- for a received element, its slot in a receive arena --
// stays alive, and so is not reused, until the copy has completed: a host
// function enqueued on the stream after the copy releases it. From a pinned
// arena (PinUcxReceivePoolForCuda) the copy is a direct DMA.
// FailedPrecondition without a usable CUDA runtime; InvalidArgument for a
// string tensor; Internal with CUDA's message when the copy is refused.
absl::Status CopyToDeviceAsync(const Tensor& tensor, void* device_dst, void* stream = nullptr);

// Counters of the client data plane, process-wide.
struct TransportStats {
  int64_t ucx_elements_received = 0;
  int64_t ucx_bytes_received = 0;
  // UCX endpoints the client connected (one per worker address, reused by
  // every task and iteration reading it; again after a failure).
  int64_t ucx_endpoints_connected = 0;
  // UCX passes run by consumers waiting for replies rather than by the
  // progress thread (docs/dataplane.md, "Progress"): one wake-up per reply.
  int64_t ucx_consumer_driven_passes = 0;
  // Connections closed because a request on them got no reply within its
  // wait plus its transfer_allowance (the next request reconnects).
  int64_t ucx_silent_endpoints_closed = 0;
  // Payload bytes the client copied after receipt (0 on the rendezvous path).
  int64_t client_payload_bytes_copied = 0;
  // Elements that did not fit a free pool slot and got their own buffer.
  int64_t dedicated_buffer_allocations = 0;
  int64_t pool_buffers_in_use = 0;
  int64_t pool_high_water_mark = 0;
  // Frames that workers in this process encoded straight into registered
  // (UCX send pool) memory.
  int64_t worker_frames_in_registered_memory = 0;
  // Elements whose payload workers in this process sent over UCX straight
  // from the tensor's own memory (no encoding copy: single-tensor elements
  // of at least 64 KiB), and UCX replies that carried more than one element.
  int64_t worker_zero_copy_payloads = 0;
  int64_t worker_batched_replies = 0;
  // UCX replies of workers in this process that failed to send.
  int64_t worker_ucx_send_errors = 0;
  // The client's receive pool: bytes registered, and whether it is at its
  // cap (new requests then wait for the user to release elements).
  int64_t receive_pool_registered_bytes = 0;
  bool receive_pool_over_cap = false;
  // Of those, bytes page-locked for CUDA (PinUcxReceivePoolForCuda), and
  // arenas cudaHostRegister refused (used unpinned).
  int64_t receive_pool_cuda_pinned_bytes = 0;
  int64_t cuda_pin_failures = 0;
  // The transports the client's latest UCX endpoint uses and what for,
  // from UCX's own description, e.g. "posix/memory(am am_bw keepalive)
  // cma/memory(rma_bw)": rma_bw carries rendezvous data (element
  // frames), am the messages. Empty before the first UCX reply.
  std::string ucx_lanes;
  // Arenas (client and worker pools) whose pages were verified to be on the
  // chosen NUMA node, and those found elsewhere.
  int64_t pool_arenas_verified_on_node = 0;
  int64_t pool_arenas_misplaced = 0;
};
TransportStats GetTransportStats();

}  // namespace sluice
